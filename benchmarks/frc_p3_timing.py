"""Wall time of the FRC per candidate mean and of one P3 release (numpy backend, driver only).

    .venv/bin/python benchmarks/frc_p3_timing.py

FRC: ~100 distinct count vectors (clean multinomial batches, m = 400), one FRC compiled once,
then the median wall time of a raw solve and of a certified bracket (two-sided sandwich) over
20 random candidate means, at k = 3 and k = 5. P3: k = 3, m = 400, n = 200, epsilon = 0.5, the
default grid (alpha = 0.06, G = 100, 5,151 points), n0 from a DP count; median of --reps runs.
Medians of wall times; compare ratios within one run (the machine is shared).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from dplib.budget import Budget
from dplib.distribution.batches import NumpyBatches
from dplib.distribution.frc import FRC, tau_cov
from dplib.distribution.private import DistributionPlan, private_distribution
from dplib.mechanisms import SeededNoise


def hist_of(counts):
    c, mult = np.unique(counts, axis=0, return_counts=True)
    return {tuple(int(v) for v in r): int(w) for r, w in zip(c, mult)}


def frc_times(k: int, rng) -> tuple[int, float, float]:
    mu = rng.dirichlet(np.full(k, 5.0))
    counts = rng.multinomial(400, mu, size=100)
    hist = hist_of(counts)
    frc = FRC(hist, 400, tau_cov(k, 100, 400, 0.05))
    frc.certify(mu)  # compile
    cands = rng.dirichlet(40 * mu, size=20)
    raw, cert = [], []
    for nu in cands:
        t = time.perf_counter()
        frc.solve(nu)
        raw.append(time.perf_counter() - t)
        t = time.perf_counter()
        frc.certify(nu)
        cert.append(time.perf_counter() - t)
    return len(hist), statistics.median(raw), statistics.median(cert)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=1)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    for k in (3, 5):
        d, raw, cert = frc_times(k, rng)
        print(f"FRC k={k}: D={d} distinct count vectors, median raw solve {raw * 1e3:.1f} ms, certified bracket {cert * 1e3:.1f} ms")
    times = []
    for rep in range(args.reps):
        counts = rng.multinomial(400, [0.5, 0.3, 0.2], size=200)
        backend = NumpyBatches.from_counts(counts, rng.integers(0, 2**32, size=200), 400)
        plan = DistributionPlan(Budget(0.5), ("a", "b"), 400, "P3")
        t = time.perf_counter()
        rel = private_distribution(backend, plan, SeededNoise(rep))
        times.append(time.perf_counter() - t)
        tv = 0.5 * np.abs(rel.estimate - [0.5, 0.3, 0.2]).sum()
        print(f"P3 k=3 m=400 n=200 eps=0.5 G={rel.parameters['grid_resolution']} ({rel.parameters['grid_points']} points): "
              f"{times[-1]:.1f} s, n0={rel.parameters['n0']}, TV={tv:.3f}")
    print(f"P3 median wall time over {len(times)} run(s): {statistics.median(times):.1f} s")


if __name__ == "__main__":
    main()
