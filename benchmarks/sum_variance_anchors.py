"""Person-level variance, standard deviation and sum: ours (``kind: variance / stddev / sum``, no
bounds) against OpenDP 0.16 and PipelineDP 0.3.1, both given the generous NON-private bounds
[p1, p99] of the person-level values (one row per person, contribution bound 1).

* variance / stddev of the person means (population variance, divide by n): PipelineDP
  ``Metrics.VARIANCE`` (Laplace; it splits epsilon in three: count, centred clamped sum, centred
  clamped sum of squares); OpenDP: the same construction from its constructors (``then_count``,
  and two centred clamped sums on an i64 grid, each ``then_laplace`` at epsilon/3); the stddev
  of an anchor is ``sqrt(max(variance, 0))``.
* sum of the persons' totals: PipelineDP ``Metrics.SUM`` (Laplace, clamp to [p1, p99] of the
  totals); OpenDP ``then_clamp >> then_sum >> then_laplace`` on an i64 grid (sensitivity
  max(|p1|, |p99|), its own privacy map).

Error = |released - exact dataset statistic|; median and 90th percentile over seeds; a run that
releases nothing (ours: INSUFFICIENT_DATA) counts in the release rate, not in the errors. Ours
also reports the coverage of its 90% error bar (runs with a bar) and how often it had one.
Tumult Analytics 0.21 when ``benchmarks/anchors/.tumult-venv`` exists: ``variance`` / ``stdev``
on the values mapped affinely to [0, 1] and ``sum`` on the clamped values scaled by
max(|p1|, |p99|) into [-1, 1] (``benchmarks/anchors/tumult_worker.py``; Laplace; all releases of a
statistic in one grouped evaluate, one row per person and ID).

    python -m benchmarks.sum_variance_anchors --seeds 30 [--eps 1.0] [--stats variance,stddev,sum] [--cells REGEX]

Not part of ``make test`` (needs ``pip install -e '.[bench]'``).
"""

from __future__ import annotations

import argparse
import math
import re
import time
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from benchmarks.anchors.data import Cell, MissingPanel, person_means
from dplib.aggregates import NumpyAggregates
from dplib.budget import Budget
from dplib.mechanisms import SeededNoise
from dplib.sums import ScaleFreeSumPlan, person_sum
from dplib.variance import ScaleFreeVariancePlan, person_variance, stddev_from_variance

GRID = 2**20
DELTA = 1e-6

VARIANCE_CELLS = [
    Cell("synthetic", "gaussian", 1, 10**3, 10),
    Cell("synthetic", "gaussian", 1, 10**4, 10),
    Cell("synthetic", "uniform", 1, 10**4, 1),
    Cell("synthetic", "lomax2.5", 1, 10**4, 1),
    Cell("synthetic", "lomax1.5", 1, 10**4, 10),
    Cell("real", "flights", 1, columns=("arr_delay",)),
    Cell("real", "flights", 1, columns=("dep_delay",)),
    Cell("real", "nlswork", 1, columns=("ln_wage",)),
    Cell("real", "randhie", 1, columns=("meddol",)),
    Cell("real", "wagepan", 1, columns=("lwage",)),
]


@dataclass(frozen=True)
class SumCell:
    """Persons' totals: synthetic records (MU + a draw per record, 1 + Poisson(9) records per
    person, fresh every seed) or a real panel's column (all of a person's non-missing records)."""

    kind: str  # "synthetic" | "real"
    dist: str  # "gaussian" | "lomax2.5" | "lomax1.5", or a panel
    n: int = 0
    column: str = ""

    @property
    def name(self) -> str:
        if self.kind == "real":
            return f"{self.dist} {self.column} (totals)"
        return f"{self.dist} records, m~1+Poi(9), n=1e{round(math.log10(self.n))} (totals)"


SUM_CELLS = [
    SumCell("synthetic", "gaussian", 10**3),
    SumCell("synthetic", "gaussian", 10**4),
    SumCell("synthetic", "lomax2.5", 10**4),
    SumCell("synthetic", "lomax1.5", 10**4),
    SumCell("real", "flights", column="arr_delay"),
    SumCell("real", "flights", column="distance"),
    SumCell("real", "nlswork", column="hours"),
    SumCell("real", "randhie", column="meddol"),
    SumCell("real", "wagepan", column="hours"),
]


@lru_cache(maxsize=None)
def panel_totals(name: str, column: str) -> np.ndarray:
    """Each person's total of ``column`` over their records with a value (the job's summary with
    m_min = 1: mean x records used)."""
    from benchmarks.anchors.data import PANELS, _panel_frame  # the panels' loader (optional extras)

    person = PANELS[name][1]
    df = _panel_frame(name)[[person, column]].dropna()
    return df.groupby(person, sort=True)[column].sum().to_numpy(dtype=np.float64)


def sum_values(cell: SumCell, seed: int) -> np.ndarray:
    if cell.kind == "real":
        return panel_totals(cell.dist, cell.column)
    rng = np.random.default_rng([2027, sum(map(ord, cell.name)), seed])
    m = 1 + rng.poisson(9.0, cell.n)
    shape = float(cell.dist[len("lomax"):]) if cell.dist.startswith("lomax") else None
    draws = 5.0 + (rng.standard_normal(int(m.sum())) if shape is None else rng.pareto(shape, int(m.sum())))
    return np.add.reduceat(draws, np.concatenate([[0], np.cumsum(m)[:-1]]))


# ---------------------------------------------------------------------------------------------
# ours
# ---------------------------------------------------------------------------------------------


def _backend(x: np.ndarray, seed: int) -> NumpyAggregates:
    return NumpyAggregates({"v": x}, np.random.default_rng([31, seed]).integers(0, 2**32, x.size))


def ours(stat: str, x: np.ndarray, eps: float, seed: int):
    """(estimate or None, error bar or None) of our estimator on per-person values x."""
    noise = SeededNoise([17, seed])
    if stat == "sum":
        rel = person_sum(_backend(x, seed), "v", ScaleFreeSumPlan(Budget(eps, DELTA)), noise)
    else:
        rel = person_variance(_backend(x, seed), "v", ScaleFreeVariancePlan(Budget(eps, DELTA)), noise)
        if stat == "stddev":
            rel = stddev_from_variance(rel)
    return rel.estimate, rel.error_bar


# ---------------------------------------------------------------------------------------------
# anchors
# ---------------------------------------------------------------------------------------------


def pipelinedp(stat: str, x: np.ndarray, eps: float, lo: float, hi: float) -> float:
    import pipeline_dp as pdp

    metric = pdp.Metrics.SUM if stat == "sum" else pdp.Metrics.VARIANCE
    acc = pdp.NaiveBudgetAccountant(total_epsilon=eps, total_delta=0.0)
    engine = pdp.DPEngine(acc, pdp.LocalBackend())
    params = pdp.AggregateParams(metrics=[metric], noise_kind=pdp.NoiseKind.LAPLACE, max_partitions_contributed=1,
                                 max_contributions_per_partition=1, min_value=float(lo), max_value=float(hi))
    ex = pdp.DataExtractors(privacy_id_extractor=lambda r: r[0], partition_extractor=lambda r: 0,
                            value_extractor=lambda r: r[1])
    res = engine.aggregate(list(enumerate(x.tolist())), params, ex, public_partitions=[0])
    acc.compute_budgets()
    (_, out), = list(res)
    if stat == "sum":
        return float(out.sum)
    var = float(out.variance)
    return math.sqrt(max(var, 0.0)) if stat == "stddev" else var


_OPENDP: dict = {}


def _opendp(kind: str, eps: float, bounds: tuple[int, int] | None = None):
    import opendp.prelude as dp

    dp.enable_features("contrib")
    key = (kind, eps, bounds)
    if key not in _OPENDP:
        floats = dp.vector_domain(dp.atom_domain(T=float, nan=False)), dp.symmetric_distance()
        ints = dp.vector_domain(dp.atom_domain(T="i64")), dp.symmetric_distance()
        if kind == "count":
            meas = floats >> dp.t.then_count() >> dp.m.then_laplace(scale=3.0 / eps)
            budget = eps / 3.0
        elif kind == "centred":  # a centred clamped sum on [-GRID, GRID]: sensitivity GRID
            meas = ints >> dp.t.then_clamp((-GRID, GRID)) >> dp.t.then_sum() >> dp.m.then_laplace(scale=3.0 * GRID / eps)
            budget = eps / 3.0
        else:  # "sum": clamp to the given integer bounds, OpenDP's own sensitivity
            assert bounds is not None
            base = ints >> dp.t.then_clamp(bounds) >> dp.t.then_sum()
            meas = dp.binary_search_chain(lambda s: base >> dp.m.then_laplace(scale=s), d_in=1, d_out=eps)
            budget = eps
        assert meas.map(1) <= budget * (1 + 1e-9), (kind, meas.map(1))
        _OPENDP[key] = meas
    return _OPENDP[key]


def opendp(stat: str, x: np.ndarray, eps: float, lo: float, hi: float) -> float:
    x = np.ascontiguousarray(x, dtype=np.float64)
    if stat == "sum":
        g = max(abs(lo), abs(hi), 1e-300) / GRID
        ql, qh = int(math.floor(lo / g)), int(math.ceil(hi / g))
        q = np.clip(np.rint(x / g), ql, qh).astype(np.int64)
        return float(_opendp("sum", eps, (ql, qh))(q)) * g
    # variance: count, centred sum and centred sum of squares, eps/3 each (PipelineDP's construction)
    mid, half = (lo + hi) / 2.0, (hi - lo) / 2.0
    c = np.clip(x, lo, hi) - mid
    g1 = half / GRID
    g2 = (half * half / 2.0) / GRID
    q1 = np.clip(np.rint(c / g1), -GRID, GRID).astype(np.int64)
    q2 = np.clip(np.rint((c * c - half * half / 2.0) / g2), -GRID, GRID).astype(np.int64)
    n = max(float(_opendp("count", eps)(x)), 1.0)
    mean = float(_opendp("centred", eps)(q1)) * g1 / n
    mean_sq = float(_opendp("centred", eps)(q2)) * g2 / n + half * half / 2.0
    var = mean_sq - mean * mean
    return math.sqrt(max(var, 0.0)) if stat == "stddev" else var


# ---------------------------------------------------------------------------------------------
# run
# ---------------------------------------------------------------------------------------------


def truth(stat: str, x: np.ndarray) -> float:
    if stat == "sum":
        return float(np.sum(x))
    return float(np.std(x)) if stat == "stddev" else float(np.var(x))


def run_cell(stat: str, name: str, values, seeds: int, eps: float, anchors: bool, tumult_jobs=None,
             truths: dict | None = None) -> dict:
    res: dict = {"ours": [], "opendp": [], "pipelinedp": [], "tumult": []}
    fails = {m: 0 for m in res}
    covered, bars, n = 0, 0, 0
    for s in range(seeds):
        x = values(s)
        n = x.size
        t = truth(stat, x)
        est, bar = ours(stat, x, eps, s)
        if est is None:
            fails["ours"] += 1
        else:
            res["ours"].append(abs(est - t))
            if bar is not None:
                bars += 1
                covered += abs(est - t) <= bar
        if anchors:
            lo, hi = np.percentile(x, [1.0, 99.0])
            res["opendp"].append(abs(opendp(stat, x, eps, lo, hi) - t))
            res["pipelinedp"].append(abs(pipelinedp(stat, x, eps, lo, hi) - t))
            if tumult_jobs is not None:
                tumult_jobs.add((name, s), x, lo, hi)
                truths[(name, s)] = t
    return {"name": name, "n": n, "errors": res, "fails": fails, "bars": bars, "covered": covered,
            "truth": truth(stat, values(0))}


def fmt(errs: list[float]) -> str:
    if not errs:
        return "-"
    return f"{np.median(errs):.4g} / {np.percentile(errs, 90):.4g}"


def report(stat: str, rows: list[dict], seeds: int, anchors: bool, tumult: bool) -> None:
    methods = ["ours"] + (["opendp", "pipelinedp"] if anchors else []) + (["tumult"] if tumult else [])
    print(f"\n### {stat}\n")
    print("| cell | n | exact (seed 0) | " + " | ".join(f"{m} med / p90" for m in methods)
          + " | ours / best anchor (median) | ours released | ours bar: given / covers |")
    print("|---|---|---|" + "---|" * len(methods) + "---|---|---|")
    for r in rows:
        e = r["errors"]
        med = {m: float(np.median(e[m])) if e[m] else float("nan") for m in methods}
        ratio = "-"
        if anchors:
            best = min(med[m] for m in methods[1:])
            ratio = f"{med['ours'] / best:.2f}" if best > 0 else "-"
        rel = seeds - r["fails"]["ours"]
        cov = f"{r['bars']}/{rel} / {r['covered'] / r['bars']:.2f}" if r["bars"] else f"0/{rel} / -"
        print(f"| {r['name']} | {r['n']} | {r['truth']:.5g} | " + " | ".join(fmt(e[m]) for m in methods)
              + f" | {ratio} | {rel}/{seeds} | {cov} |")


def cell_values(stat: str, cell):
    """seed -> the cell's per-person values (totals for the sum, means otherwise)."""
    if stat == "sum":
        return lambda seed: sum_values(cell, seed)
    return lambda seed: person_means(cell, seed)[:, 0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=30)
    ap.add_argument("--eps", type=float, default=1.0)
    ap.add_argument("--stats", default="variance,stddev,sum")
    ap.add_argument("--cells", default="")
    ap.add_argument("--no-anchors", action="store_true", help="ours only (tuning)")
    ap.add_argument("--no-tumult", action="store_true")
    args = ap.parse_args()
    from benchmarks.anchors import tumult

    use_tumult, msg = tumult.available()
    use_tumult = use_tumult and not args.no_anchors and not args.no_tumult
    print(f"epsilon = {args.eps} (ours: delta = {DELTA:g}; anchors: pure), {args.seeds} seeds; "
          f"Tumult: {msg if use_tumult else 'skipped (' + msg + ')'}")
    t0 = time.time()
    rx = re.compile(args.cells) if args.cells else None
    anchors = not args.no_anchors
    for stat in args.stats.split(","):
        rows = []
        cells = SUM_CELLS if stat == "sum" else VARIANCE_CELLS
        jobs = tumult.TumultJobs(args.eps, statistic={"stddev": "stdev"}.get(stat, stat)) if use_tumult else None
        truths: dict = {}
        for cell in cells:
            if rx and not rx.search(cell.name):
                continue
            try:
                rows.append(run_cell(stat, cell.name, cell_values(stat, cell), args.seeds, args.eps, anchors, jobs,
                                     truths))
            except MissingPanel as e:
                print(f"skipped {cell.name}: {e}")
        if jobs is not None:
            est, info = jobs.run()
            print(f"Tumult {stat}: {info.get('jobs')} releases in one evaluate, {info.get('wall_seconds', 0):.0f} s")
            by_name = {r["name"]: r for r in rows}
            for (name, s), e in est.items():
                if e is None:
                    by_name[name]["tumult_fails"] = by_name[name].get("tumult_fails", 0) + 1
                else:
                    by_name[name]["errors"]["tumult"].append(abs(e - truths[(name, s)]))
        report(stat, rows, args.seeds, anchors, jobs is not None)
    print(f"\n({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
