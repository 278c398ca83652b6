"""Wall time of BHS23 Algorithm 1 on the numpy backend (d = 10, Gaussian data), and the gate.

Not part of `make test`. Usage: .venv/bin/python benchmarks/bhs23_timing.py [--reps 3]
Reports medians over reps of: keyed ordering + pairing (hashing n ids), and the algorithm
(StableCovariance + StableMean + PTR + draw), with the pass count (debug output, not a release).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from dplib.budget import Budget
from dplib.covariance import PrivateMeanPlan, minimum_rows_private_mean, numpy_backend, private_mean
from dplib.groups import new_salt
from dplib.mechanisms import SeededNoise


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    eps, delta, d = 0.5, 1e-6, 10
    n_min = minimum_rows_private_mean(eps, delta, d)
    lam = PrivateMeanPlan(Budget(eps, delta), n_min, d).lambda0
    print(f"gate at eps={eps}, delta={delta}, d={d}, default lambda0: n_min={n_min} (lambda0={lam:.2f})")
    print(f"gate with lambda0=50: {minimum_rows_private_mean(eps, delta, d, 50.0)}")
    rng = np.random.default_rng(0)
    for n in (100_000, 1_000_000):
        a = rng.normal(size=(d, d))
        x = rng.normal(size=(n, d)) @ a.T + 100.0
        plan = PrivateMeanPlan(Budget(0.999, 1e-6), n, d, 50.0)  # the gate at eps=0.5 exceeds 1e5
        t_order, t_alg = [], []
        for r in range(args.reps):
            t0 = time.perf_counter()
            b = numpy_backend(x, new_salt())
            t1 = time.perf_counter()
            out = private_mean(b, plan, SeededNoise(r))
            t2 = time.perf_counter()
            t_order.append(t1 - t0)
            t_alg.append(t2 - t1)
        print(f"n={n} d={d} eps=0.999 delta=1e-6 lambda0=50: order+pair {statistics.median(t_order):.2f}s, "
              f"algorithm {statistics.median(t_alg):.2f}s (median of {args.reps}); status {out.release.status}, "
              f"passes {out.diagnostics.passes}")


if __name__ == "__main__":
    main()
