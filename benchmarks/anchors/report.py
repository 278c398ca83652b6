"""Statistics, tables, targets and the JSON lines of the anchors benchmark."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import numpy as np

from benchmarks.anchors.data import Cell


@dataclass
class Run:
    """One release of one method on one seed."""

    seed: int
    status: str  # "OK" or the method's other status
    estimate: np.ndarray | None
    error: float  # |released - exact| (d = 1) or l2 norm (d > 1); nan when not OK
    bar: np.ndarray | None = None  # ours only
    flagged: bool = False
    seconds: float = 0.0
    extra: dict = field(default_factory=dict)


#: An anchor counts as a cell's best only with at least this many runs (or as many as ours, if
#: fewer). The median of k draws of |Laplace| has a relative standard deviation of about
#: 1.44 / sqrt(k) for large k (simulated: 72% at k = 3, PipelineDP on the largest cells, whose row
#: budget allows 3 seeds; 26% at 30); the minimum over anchors then picks the lucky one. In the grid of 2026-12-07 (30
#: seeds), Gaussian 10^5 m = 100 read 3.70x against a 3-seed PipelineDP median and 0.80x against
#: the 30-seed OpenDP median of the same construction (uniform 10^5 m = 1: 2.10x / 1.05x; m = 100:
#: 1.56x / 0.54x). Such anchors are still printed, in every table.
QUALIFY_RUNS = 30


@dataclass
class CellResult:
    cell: Cell
    exact: dict = field(default_factory=dict)  # seed -> (d,) exact statistic
    worst_floor: float = 0.0  # max over seeds of ||exact|| + ||max - min of person means||
    runs: dict = field(default_factory=dict)  # method -> list[Run]
    bounds: dict = field(default_factory=dict)  # (seed, kind) -> [lo, hi] or [center, radius]
    info: dict = field(default_factory=dict)
    seconds: float = 0.0

    def add(self, method: str, run: Run) -> None:
        self.runs.setdefault(method, []).append(run)

    @property
    def worst(self) -> float:
        """Error charged to a release that is not OK: the largest finite error of any method in
        the cell, or ||exact|| + ||range of the person means||, whichever is larger."""
        errs = [r.error for rs in self.runs.values() for r in rs if r.status == "OK" and math.isfinite(r.error)]
        return max([self.worst_floor] + errs)

    def errors(self, method: str) -> np.ndarray:
        w = self.worst
        return np.array([r.error if r.status == "OK" and math.isfinite(r.error) else w for r in self.runs.get(method, [])])

    def rel_errors(self, method: str) -> np.ndarray:
        e = self.errors(method)
        norms = np.array([float(np.linalg.norm(self.exact[r.seed])) for r in self.runs.get(method, [])])
        return e / np.maximum(norms, 1e-300)

    def stats(self, method: str) -> dict:
        rs = self.runs.get(method, [])
        if not rs:
            return {}
        e = self.errors(method)
        ok = np.array([r.status == "OK" and math.isfinite(r.error) for r in rs])
        out = {
            "runs": len(rs),
            "median": float(np.median(e)),
            "p90": float(np.percentile(e, 90)),
            "failure_rate": float(1.0 - ok.mean()),
            "median_relative": float(np.median(self.rel_errors(method))),
            "seconds": float(sum(r.seconds for r in rs)),
        }
        if method == "ours":
            out.update(bar_stats(self, rs, ok))
        return out

    def anchors(self, kind: str) -> list[str]:
        return [m for m in self.runs if m != "ours" and m.endswith(kind)]

    def qualifying_runs(self) -> int:
        """Runs an anchor needs to count as the cell's best: as many as ours, at most QUALIFY_RUNS."""
        return min(len(self.runs.get("ours", [])), QUALIFY_RUNS)

    def qualified(self, kind: str) -> list[str]:
        """The anchors of ``kind`` run on at least :meth:`qualifying_runs` seeds (all when none is)."""
        need = self.qualifying_runs()
        ok = [m for m in self.anchors(kind) if len(self.runs[m]) >= need]
        return ok or self.anchors(kind)

    def best_anchor(self, kind: str) -> tuple[str | None, float]:
        best, val = None, math.inf
        for m in self.qualified(kind):
            v = self.stats(m)["median"]
            if v < val:
                best, val = m, v
        return best, val

    def ratio(self, kind: str) -> float:
        _, b = self.best_anchor(kind)
        if "ours" not in self.runs or not (b > 0) or math.isinf(b):
            return math.nan
        return self.stats("ours")["median"] / b


def bar_stats(res: CellResult, rs: list[Run], ok: np.ndarray) -> dict:
    """Coverage of the exact statistic by ours' error bar, bar / empirical p90 error, flagged share.

    d = 1: coverage = share of OK releases with |est - exact| <= bar; ratio = median bar / p90 of
    |error| over OK releases. d > 1 (per-coordinate bars): both computed per coordinate, coverage
    averaged and ratio's median taken over coordinates."""
    flagged = float(np.mean([r.flagged for r in rs])) if rs else math.nan
    good = [r for r, k in zip(rs, ok) if k and r.bar is not None]
    if not good:
        return {"coverage": math.nan, "bar_over_p90": math.nan, "flagged_share": flagged}
    diff = np.array([np.abs(np.atleast_1d(r.estimate) - res.exact[r.seed]) for r in good])  # (k, d)
    bars = np.array([np.atleast_1d(r.bar) for r in good])
    cover = float(np.mean(diff <= bars))
    p90 = np.percentile(diff, 90, axis=0)
    ratios = np.median(bars, axis=0) / np.maximum(p90, 1e-300)
    return {"coverage": cover, "bar_over_p90": float(np.median(ratios)), "flagged_share": flagged}


# ---------------------------------------------------------------------------------------------
# Printing
# ---------------------------------------------------------------------------------------------


def fmt(x, spec: str = ".3g") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    return format(x, spec)


def print_tables(results: list[CellResult]) -> None:
    print("\n== errors per (cell, method): |released - exact| (d = 1) or l2 norm (d > 1); not-OK = worst ==")
    print(f"{'cell':<30}{'method':<18}{'runs':>5}{'median':>11}{'p90':>11}{'fail':>6}{'med rel':>10}{'sec':>7}")
    for r in results:
        for m in r.runs:
            s = r.stats(m)
            print(f"{r.cell.name:<30}{m:<18}{s['runs']:>5}{fmt(s['median']):>11}{fmt(s['p90']):>11}"
                  f"{fmt(s['failure_rate'], '.2f'):>6}{fmt(s['median_relative']):>10}{s['seconds']:>7.1f}")
    print("\n== ours vs the best anchor (smallest median error among anchors run on >= min(ours' runs, "
          f"{QUALIFY_RUNS}) seeds) per bound choice; ours' error bar ==")
    print(f"{'cell':<30}{'n':>7}{'ours med':>10}{'best p1/p99':>24}{'ratio':>7}{'best 10x':>21}{'ratio':>7}"
          f"{'fail':>6}{'cover':>7}{'bar/p90':>8}{'flag':>6}{'sec':>6}")
    for r in results:
        if "ours" not in r.runs:
            continue
        s = r.stats("ours")
        b1, v1 = r.best_anchor("p1/p99")
        b2, v2 = r.best_anchor("10x")
        n = r.info.get("n", r.cell.n)
        print(f"{r.cell.name:<30}{n:>7}{fmt(s['median']):>10}{(b1 or '-') + ' ' + fmt(v1):>24}{fmt(r.ratio('p1/p99'), '.2f'):>7}"
              f"{(b2 or '-') + ' ' + fmt(v2):>21}{fmt(r.ratio('10x'), '.2f'):>7}{fmt(s['failure_rate'], '.2f'):>6}"
              f"{fmt(s['coverage'], '.2f'):>7}{fmt(s['bar_over_p90'], '.2f'):>8}{fmt(s['flagged_share'], '.2f'):>6}{r.seconds:>6.0f}")


def targets(results: list[CellResult]) -> list[tuple[str, str, list[str]]]:
    """[(target, PASS | FAIL | N/A, detail lines)]."""
    out = []

    def check(name: str, cells: list[CellResult], ok_fn, detail_fn) -> None:
        if not cells:
            out.append((name, "N/A", ["no such cell in this run"]))
            return
        lines, good = [], True
        for r in cells:
            ok = ok_fn(r)
            good &= ok
            lines.append(f"{'ok  ' if ok else 'MISS'} {r.cell.name}: {detail_fn(r)}")
        out.append((name, "PASS" if good else "FAIL", lines))

    uni = [r for r in results if r.cell.d == 1 and "ours" in r.runs]
    mv = [r for r in results if r.cell.d > 1 and "ours" in r.runs]
    n_of = lambda r: r.info.get("n", r.cell.n)  # noqa: E731
    ratio_txt = lambda k: (lambda r: f"ours/best {k} = {fmt(r.ratio(k), '.2f')} ({r.best_anchor(k)[0]})")  # noqa: E731
    check("univariate light-tailed, n >= 1e3: ours median <= 1.5x best anchor (p1/p99)",
          [r for r in uni if r.cell.light_tailed and n_of(r) >= 1000],
          lambda r: r.ratio("p1/p99") <= 1.5, ratio_txt("p1/p99"))
    check("univariate, all cells: ours median <= 1.0x best anchor (10x wide)",
          uni, lambda r: r.ratio("10x") <= 1.0, ratio_txt("10x"))
    check("univariate Lomax, n >= 1e4: ours median <= 0.5x best anchor (p1/p99)",
          [r for r in uni if r.cell.dist.startswith("lomax") and n_of(r) >= 10**4],
          lambda r: r.ratio("p1/p99") <= 0.5, ratio_txt("p1/p99"))
    check("multivariate Gaussian d = 4, 10, n >= 1e4: ours median <= 1.5x best multivariate anchor (p1/p99)",
          [r for r in mv if r.cell.dist == "gaussian" and r.cell.d in (4, 10) and n_of(r) >= 10**4],
          lambda r: r.ratio("p1/p99") <= 1.5, ratio_txt("p1/p99"))
    check("multivariate Lomax d = 10, n = 1e4: ours never fails",
          [r for r in mv if r.cell.dist.startswith("lomax") and r.cell.d == 10 and n_of(r) == 10**4],
          lambda r: r.stats("ours")["failure_rate"] == 0.0,
          lambda r: f"failure rate {fmt(r.stats('ours')['failure_rate'], '.2f')} over {r.stats('ours')['runs']} runs")

    def small_ok(r: CellResult) -> bool:
        s = r.stats("ours")
        a = [r.stats(m)["median_relative"] for m in r.qualified("p1/p99")]
        return (1.0 - s["failure_rate"]) >= 0.95 and s["median_relative"] <= 2.0 * min(a)

    def small_txt(r: CellResult) -> str:
        s = r.stats("ours")
        a = {m: r.stats(m)["median_relative"] for m in r.qualified("p1/p99")}
        best = min(a, key=a.get)
        return (f"released {fmt(1.0 - s['failure_rate'], '.2f')} of {s['runs']} runs; median relative error "
                f"{fmt(s['median_relative'])} vs {best} {fmt(a[best])} ({fmt(s['median_relative'] / a[best], '.2f')}x)")

    check("n = 100 (Gaussian, m = 10): ours releases in >= 95% of runs, median relative error <= 2x the p1/p99 anchor's",
          [r for r in uni if r.cell.dist == "gaussian" and r.cell.n == 100 and r.cell.m == 10], small_ok, small_txt)
    return out


def print_targets(results: list[CellResult]) -> None:
    print("\n== targets ==")
    for name, verdict, lines in targets(results):
        print(f"[{verdict}] {name}")
        for ln in lines:
            print(f"        {ln}")


# ---------------------------------------------------------------------------------------------
# JSON lines
# ---------------------------------------------------------------------------------------------


def _num(x):
    if x is None:
        return None
    if isinstance(x, np.ndarray):
        return [_num(v) for v in x.tolist()]
    if isinstance(x, (list, tuple)):
        return [_num(v) for v in x]
    if isinstance(x, dict):
        return {str(k): _num(v) for k, v in x.items()}
    if isinstance(x, (np.floating, float)):
        return None if not math.isfinite(float(x)) else float(x)
    if isinstance(x, (np.integer,)):
        return int(x)
    return x


def write_json(path: str, results: list[CellResult], run_meta: dict) -> None:
    with open(path, "w") as f:
        for r in results:
            c = r.cell
            for m, rs in r.runs.items():
                line = {
                    "cell": c.name, "kind": c.kind, "dist": c.dist, "n": r.info.get("n", c.n), "m": c.m, "d": c.d,
                    "columns": list(c.columns), "method": m, "worst": r.worst,
                    "stats": r.stats(m),
                    "seeds": [x.seed for x in rs],
                    "status": [x.status for x in rs],
                    "error": [x.error for x in rs],
                    "estimate": [x.estimate for x in rs],
                    "exact": [r.exact[x.seed] for x in rs],
                    "seconds": [x.seconds for x in rs],
                    "cell_info": r.info,
                    "run": run_meta,
                }
                if m == "ours":
                    line.update({
                        "ratio_best_p1p99": r.ratio("p1/p99"), "best_p1p99": r.best_anchor("p1/p99")[0],
                        "ratio_best_10x": r.ratio("10x"), "best_10x": r.best_anchor("10x")[0],
                        "error_bar": [x.bar for x in rs], "flagged": [x.flagged for x in rs],
                        "params": [x.extra.get("params") for x in rs],
                    })
                else:
                    line["bounds"] = [x.extra.get("bounds") for x in rs]
                f.write(json.dumps(_num(line), default=str) + "\n")
