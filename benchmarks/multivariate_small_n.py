"""Scale-free multivariate mean at small n (d = 4): releases, error and bar coverage, beside a
clamped Laplace baseline given the non-private per-column [p1, p99] (PipelineDP's one ``MEAN`` per
column under ``NaiveBudgetAccountant``, written out: 2d Laplace mechanisms at epsilon / (2d), one
record per person, sums of deviations from the interval's midpoint).

    .venv/bin/python -m benchmarks.multivariate_small_n --seeds 40

Data: person means 5 + N(0, 1) x units, units (1, 10, 0.1, 3) per column (one column spread over
many octaves: the case the range stage's retries exist for); epsilon 1, delta 1e-6; fresh data and
noise per seed. Error: l2 distance to the exact mean of person means, each column divided by its
unit; coverage: share of (seed, column) whose 90% bar covers the exact column mean. Not part of
``make test``.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from dplib.aggregates import NumpyAggregates
from dplib.budget import Budget
from dplib.mean.scale_free_multivariate import ScaleFreeMultivariatePlan, scale_free_multivariate_mean
from dplib.mechanisms import SeededNoise

UNITS = np.array([1.0, 10.0, 0.1, 3.0])
EPS, DELTA = 1.0, 1e-6


def baseline(y: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Clamp each column to its non-private [p1, p99]; per column a noisy sum of deviations from
    the interval's midpoint (sensitivity (hi - lo) / 2, as PipelineDP's and Tumult's means) and a
    noisy count, each Laplace at epsilon / (2d); midpoint + sum / count, clamped to the interval."""
    d = y.shape[1]
    e = EPS / (2 * d)
    lo, hi = np.percentile(y, 1, axis=0), np.percentile(y, 99, axis=0)
    mid = (lo + hi) / 2.0
    s = (np.clip(y, lo, hi) - mid).sum(0) + rng.laplace(0.0, (hi - lo) / 2.0 / e)
    n = y.shape[0] + rng.laplace(0.0, 1.0 / e, d)
    return np.clip(mid + s / np.maximum(n, 1.0), lo, hi)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=40)
    ap.add_argument("--sizes", default="700,1000,1500,2000,5000")
    args = ap.parse_args(argv)
    print(f"scale-free multivariate mean, d = 4, epsilon {EPS}, delta {DELTA}, {args.seeds} seeds")
    print(f"{'n':>6} {'released':>9} {'2 retries':>9} {'ours med':>9} {'ours p90':>9} {'coverage':>9} "
          f"{'base med':>9} {'base p90':>9} {'ours/base':>9} {'sec':>5}")
    for n in (int(x) for x in args.sizes.split(",")):
        t0 = time.time()
        ours, base, cov, twice, nobar = [], [], [], 0, 0
        for s in range(args.seeds):
            rng = np.random.default_rng([n, s, 9])
            y = 5.0 + rng.standard_normal((n, 4)) * UNITS
            exact = y.mean(0)
            cols = [f"y{j}" for j in range(4)]
            be = NumpyAggregates({c: y[:, j] for j, c in enumerate(cols)}, rng.integers(0, 2**32, n))
            rel = scale_free_multivariate_mean(be, cols, ScaleFreeMultivariatePlan(Budget(EPS, DELTA), 4),
                                               SeededNoise(s))
            base.append(np.linalg.norm((baseline(y, rng) - exact) / UNITS))
            if rel.status != "OK":
                ours.append(np.inf)
                continue
            twice += "range_retried_twice_coordinates" in rel.parameters
            err = np.abs(np.asarray(rel.estimate) - exact)
            if rel.error_bar is None:  # no honest bar: counted as a miss on every column
                nobar += 1
                cov += [False] * len(err)
            else:
                cov += list(err <= np.asarray(rel.error_bar))
            ours.append(np.linalg.norm(err / UNITS))
        o, b = np.array(ours), np.array(base)
        rel_ok = int(np.isfinite(o).sum())
        om = np.median(o)
        print(f"{n:>6} {rel_ok:>5}/{args.seeds:<3} {twice:>9} {om:>9.3g} {np.quantile(o, 0.9):>9.3g} "
              f"{(np.mean(cov) if cov else float('nan')):>9.3f} {np.median(b):>9.3g} {np.quantile(b, 0.9):>9.3g} "
              f"{om / np.median(b):>9.2f} {time.time() - t0:>5.0f}" + (f"  ({nobar} without a bar)" if nobar else ""),
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
