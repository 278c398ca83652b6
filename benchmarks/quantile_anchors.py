"""Quantiles of the person means: ours (``kind: quantile``, no range) against OpenDP's
``make_private_quantile`` (Smith 2011's exponential mechanism over 1,024 candidates) and
PipelineDP's ``PERCENTILE`` (a quantile tree), both given the generous non-private bounds
[p1, p99] of the person means (what the grouped-statistics issue pins for the anchors).

Same person means, same epsilon, one record per person for the anchors (the person's mean: the
person is the privacy unit). Error against the exact dataset quantile
(``numpy.quantile(method="inverted_cdf")``), in value and in rank (|F_n(estimate) - q|); median
and 90th percentile over seeds; failures (no release) counted.

    python -m benchmarks.quantile_anchors --seeds 30 [--eps 1.0] [--q 0.5,0.9]

Not part of ``make test`` (needs ``pip install -e '.[bench]'``).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from benchmarks.anchors.data import Cell, MissingPanel, person_means
from dplib.aggregates import NumpyAggregates
from dplib.budget import Budget
from dplib.mechanisms import SeededNoise
from dplib.quantile import QuantilePlan, exact_quantile, person_quantile

CELLS = [
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
N_CANDIDATES = 1024
_OPENDP: dict = {}


def ours(x: np.ndarray, q: float, eps: float, seed: int) -> float | None:
    agg = NumpyAggregates({"v": x}, np.arange(x.size, dtype=np.int64))
    rel = person_quantile(agg, "v", QuantilePlan(Budget(eps), q=q), SeededNoise([17, seed]))
    return None if rel.estimate is None else float(rel.estimate[0])


def opendp_quantile(x: np.ndarray, q: float, eps: float, lo: float, hi: float) -> float:
    import opendp.prelude as dp

    dp.enable_features("contrib")
    key = (q, eps, lo, hi)
    if key not in _OPENDP:
        cands = np.linspace(lo, hi, N_CANDIDATES).tolist()
        space = dp.vector_domain(dp.atom_domain(T=float, nan=False)), dp.symmetric_distance()

        def make(scale):
            return dp.m.make_private_quantile(*space, dp.max_divergence(), candidates=cands, alpha=q, scale=scale)

        scale = dp.binary_search_param(make, d_in=1, d_out=eps)
        meas = make(scale)
        assert meas.map(1) <= eps * (1 + 1e-9)
        _OPENDP[key] = meas
    return float(_OPENDP[key](np.clip(x, lo, hi).tolist()))


def pipelinedp_quantile(x: np.ndarray, q: float, eps: float, lo: float, hi: float) -> float:
    import pipeline_dp as pdp

    acc = pdp.NaiveBudgetAccountant(total_epsilon=eps, total_delta=0.0)
    engine = pdp.DPEngine(acc, pdp.LocalBackend())
    params = pdp.AggregateParams(metrics=[pdp.Metrics.PERCENTILE(round(q * 100))], noise_kind=pdp.NoiseKind.LAPLACE,
                                 max_partitions_contributed=1, max_contributions_per_partition=1,
                                 min_value=float(lo), max_value=float(hi))
    ex = pdp.DataExtractors(privacy_id_extractor=lambda r: r[0], partition_extractor=lambda r: 0,
                            value_extractor=lambda r: r[1])
    res = engine.aggregate(list(enumerate(x.tolist())), params, ex, public_partitions=[0])
    acc.compute_budgets()
    (_, out), = list(res)
    return float(getattr(out, f"percentile_{round(q * 100)}"))


def rank_error(x_sorted: np.ndarray, est: float, q: float) -> float:
    return abs(np.searchsorted(x_sorted, est, side="right") / x_sorted.size - q)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=30)
    ap.add_argument("--eps", type=float, default=1.0)
    ap.add_argument("--q", default="0.5,0.9")
    ap.add_argument("--no-tumult", action="store_true")
    args = ap.parse_args()
    qs = [float(v) for v in args.q.split(",")]
    from benchmarks.anchors import tumult

    use_tumult, msg = (False, "disabled") if args.no_tumult else tumult.available()
    print(f"epsilon = {args.eps}, {args.seeds} seeds; Tumult: {msg}")
    t0 = time.time()
    methods = ["ours", "opendp", "pipelinedp"] + (["tumult"] if use_tumult else [])
    results: dict = {}  # (cell name, q) -> {method: [(value error, rank error)]}
    sizes, fails = {}, {}
    jobs = {q: tumult.TumultJobs(args.eps, quantile=q) for q in qs}
    truths = {}
    for cell in CELLS:
        try:
            for q in qs:
                key = (cell.name, q)
                results[key] = {m: [] for m in methods}
                fails[key] = 0
                for s in range(args.seeds):
                    x = person_means(cell, s)[:, 0]
                    sizes[cell.name] = x.size
                    truth = exact_quantile(x, q)
                    xs = np.sort(x)
                    truths[(cell.name, q, s)] = (truth, xs)
                    lo, hi = np.percentile(x, [1.0, 99.0])
                    outs = {"ours": ours(x, q, args.eps, s), "opendp": opendp_quantile(x, q, args.eps, lo, hi),
                            "pipelinedp": pipelinedp_quantile(x, q, args.eps, lo, hi)}
                    if use_tumult:
                        jobs[q].add((cell.name, q, s), x, lo, hi)
                    for name, est in outs.items():
                        if est is None:
                            fails[key] += 1
                            continue
                        results[key][name].append((abs(est - truth), rank_error(xs, est, q)))
        except MissingPanel as e:
            print(f"skipped {cell.name}: {e}")
    if use_tumult:
        for q in qs:
            est, info = jobs[q].run()
            print(f"Tumult q={q:g}: {info.get('jobs')} releases in one evaluate, {info.get('wall_seconds', 0):.0f} s")
            for (name, qq, s), e in est.items():
                if e is not None:
                    truth, xs = truths[(name, qq, s)]
                    results[(name, qq)]["tumult"].append((abs(e - truth), rank_error(xs, e, qq)))
    anchors = [m for m in methods if m != "ours"]
    print("\n|error| in value: median / p90 over seeds; rank error |F_n(estimate) - q|: median; "
          "ratio = ours / anchor (median value error)\n")
    head = " | ".join(f"{m} [p1,p99]" for m in anchors)
    print(f"| cell | n | q | ours | {head} | ours rank | " + " | ".join(f"{m} rank" for m in anchors)
          + " | ours / best | ours / Tumult | ours fails |")
    print("|---|---|---|---|" + "---|" * (2 * len(anchors) + 4))
    for (name, q), res in results.items():
        med = {m: float(np.median([v for v, _ in res[m]])) if res[m] else float("nan") for m in methods}
        p90 = {m: float(np.percentile([v for v, _ in res[m]], 90)) if res[m] else float("nan") for m in methods}
        rk = {m: float(np.median([r for _, r in res[m]])) if res[m] else float("nan") for m in methods}
        best = min(anchors, key=lambda m: med[m])
        tum = f"{med['ours'] / med['tumult']:.2f}" if "tumult" in med else "-"
        cells = " | ".join(f"{med[m]:.4g} / {p90[m]:.4g}" for m in anchors)
        ranks = " | ".join(f"{rk[m]:.4f}" for m in anchors)
        print(f"| {name} | {sizes.get(name, '?')} | {q:g} | {med['ours']:.4g} / {p90['ours']:.4g} | {cells} | "
              f"{rk['ours']:.4f} | {ranks} | {med['ours'] / med[best]:.2f} | {tum} | {fails[(name, q)]}/{args.seeds} |")
    print(f"\n({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
