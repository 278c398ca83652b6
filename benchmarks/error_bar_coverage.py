"""Error-bar coverage and width of the scale-free person-level mean (not part of `make test`).

For each dataset, runs the estimator R times with seeded noise and a fresh random split of
persons into hash ranges (what a fresh salt does), on the numpy backend (the Spark backend
answers the same aggregates identically: tests/spark/test_backend_contract.py), and compares
each release with the exact dataset statistic (the mean over all persons of the person means).

    .venv/bin/python benchmarks/error_bar_coverage.py [--reps 200] [--epsilon 0.5]

Columns: coverage of the nominal 90% bar; median bar / empirical 90th-percentile error (the
issue's target: coverage >= 0.90 and ratio <= 2); median and p90 absolute error; share of runs
with status OK. Rows "x1e6" scale the same data by 10^6 (errors reported divided by 10^6);
the "+1e9" row shifts it by 10^9 (a known weak spot: see docs/privacy/person_level_mean.md).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from dplib.aggregates import NumpyAggregates
from dplib.budget import Budget
from dplib.mean.scale_free import ScaleFreeMeanPlan, scale_free_person_mean
from dplib.mechanisms import SeededNoise


def flights(column: str) -> np.ndarray:
    from dplib.mean.api import person_means
    from spark_jobs.datasets import load_flights

    df = load_flights()
    df = df[~df.tailnum.isin(["NA", ""])]
    return person_means(df[column].to_numpy(), df.tailnum.tolist())[1]


def datasets(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "gaussian N(3, 2^2), n=5000": rng.normal(3.0, 2.0, 5000),
        "lomax shape 3 (heavy tail), n=5000": rng.pareto(3.0, 5000) * 4.0,
        "mixture 70% N(0,1) + 30% N(40,5^2), n=5000": np.r_[rng.normal(0, 1, 3500), rng.normal(40, 5, 1500)],
        "flights arr_delay, 4037 aircraft": flights("arr_delay"),
        "flights dep_delay, 4037 aircraft": flights("dep_delay"),
    }


def run(values: np.ndarray, reps: int, epsilon: float, delta: float, seed0: int = 1000):
    """Coverage over ALL runs: a run that releases nothing, or releases no error bar (the tail
    model gives no finite bias bound), does not cover."""
    exact = float(np.mean(values))
    errs, bars, ok, covered, nobar = [], [], 0, 0, 0
    for rep in range(reps):
        rng = np.random.default_rng(seed0 + rep)
        backend = NumpyAggregates({"v": values}, rng.integers(0, 2**32, size=values.size))
        rel = scale_free_person_mean(backend, "v", ScaleFreeMeanPlan(Budget(epsilon, delta)), SeededNoise(rng))
        if rel.status != "OK":
            continue
        ok += 1
        err = abs(rel.estimate - exact)
        errs.append(err)
        if rel.error_bar is None:
            nobar += 1
            continue
        bars.append(rel.error_bar)
        covered += int(err <= rel.error_bar)
    errs_a, bars_a = np.array(errs), np.array(bars)
    p90 = float(np.percentile(errs_a, 90)) if errs_a.size else float("nan")
    return {
        "coverage": covered / reps,
        "ratio": float(np.median(bars_a) / p90) if bars_a.size else float("nan"),
        "median_err": float(np.median(errs_a)) if errs_a.size else float("nan"),
        "p90_err": p90,
        "median_bar": float(np.median(bars_a)) if bars_a.size else float("nan"),
        "ok": ok / reps,
        "nobar": nobar / reps,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--epsilon", type=float, default=0.5)
    ap.add_argument("--delta", type=float, default=5e-7)
    args = ap.parse_args()
    t0 = time.time()
    print(f"scale-free person-level mean, epsilon={args.epsilon}, delta={args.delta}, {args.reps} runs per row")
    print(f"{'dataset':<46}{'transform':>10}{'coverage':>10}{'bar/p90':>9}{'median err':>12}{'p90 err':>10}{'median bar':>12}{'OK':>6}{'no bar':>8}")
    for name, values in datasets().items():
        transforms = [("x1", 1.0, 0.0), ("x1e6", 1e6, 0.0)]
        if name.startswith("gaussian"):
            transforms.append(("+1e9", 1.0, 1e9))
        for label, mult, shift in transforms:
            r = run(values * mult + shift, args.reps, args.epsilon, args.delta)
            unit = mult
            print(
                f"{name:<46}{label:>10}{r['coverage']:>10.3f}{r['ratio']:>9.2f}{r['median_err'] / unit:>12.4g}"
                f"{r['p90_err'] / unit:>10.4g}{r['median_bar'] / unit:>12.4g}{r['ok']:>6.0%}{r['nobar']:>8.0%}"
            )
    print(f"({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
