"""Coverage of the batch estimators' 90% error bars (P0, P1, P2; issue 19).

Each bar claims to cover, per category, the exact statistic over the persons the batch
estimators read (persons with at least m records: the mean over them of each one's category
shares over ALL of their records), by a normal approximation of the noise, the normalisation, the
m draws per person and (P1, P2 in the default parallel mode) the hash range of persons a stage
reads (`dplib.distribution.private.batch_error_bar`). This script measures it: fixed synthetic
data per cell (k = 5 categories, 3,000 persons with 1-40 records, preferences that differ by
person), every seed a fresh salt (so fresh draws and hash ranges) and fresh noise; per cell the
coverage over seeds x categories with a Clopper-Pearson 95% interval, the median bar over the
empirical 90th percentile of |error|, and the coverage of the all-persons statistic beside it.

Run: `.venv/bin/python -m benchmarks.distribution_bars [--seeds 200] [--epsilon 1]`.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from scipy.stats import beta as beta_dist

from dplib.budget import Budget
from dplib.distribution.batches import NumpyBatches
from dplib.distribution.private import DistributionPlan, private_distribution
from dplib.mechanisms import SeededNoise

K = 5
CATS = [f"c{j}" for j in range(K - 1)]  # + OTHER


def data(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    m = rng.integers(1, 41, n)
    prefs = rng.dirichlet(np.full(K, 0.8), n)
    ids, vals = [], []
    for i in range(n):
        draws = rng.choice(K, size=int(m[i]), p=prefs[i])
        ids.extend([f"p{i}"] * int(m[i]))
        vals.extend(CATS[j] if j < K - 1 else "zz" for j in draws)
    return ids, vals, m


def exact(ids, vals, m_min: int) -> tuple[np.ndarray, np.ndarray]:
    """(statistic over persons with >= m_min records, statistic over all persons), shape (K,)."""
    idx = {c: j for j, c in enumerate(CATS)}
    per: dict = {}
    for p, v in zip(ids, vals):
        per.setdefault(p, np.zeros(K))[idx.get(v, K - 1)] += 1
    c = np.array(list(per.values()))
    shares = c / c.sum(1, keepdims=True)
    return shares[c.sum(1) >= m_min].mean(0), shares.mean(0)


def cp(k: int, n: int) -> tuple[float, float]:
    lo = 0.0 if k == 0 else float(beta_dist.ppf(0.025, k, n - k + 1))
    hi = 1.0 if k == n else float(beta_dist.ppf(0.975, k + 1, n - k))
    return lo, hi


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=200)
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--persons", type=int, default=3000)
    args = ap.parse_args(argv)
    ids, vals, _ = data(args.persons)
    labels = [str(i) for i in range(len(ids))]  # every record distinct
    print(f"batch estimators' 90% bars: k = {K}, {args.persons} persons (1-40 records), epsilon {args.epsilon}, "
          f"delta 1e-6 (P2), {args.seeds} seeds (fresh salt and noise)\n")
    print("| estimator | m | coverage (CP 95%) | bar / p90 abs error | median bar | median abs error | coverage of the "
          "all-persons statistic |")
    print("|---|---|---|---|---|---|---|")
    for est in ("P0", "P1", "P2"):
        for m in (1, 5, 10):
            t0 = time.time()
            truth, truth_all = exact(ids, vals, m)
            errs, bars, errs_all = [], [], []
            for s in range(args.seeds):
                salt = f"{s + 1:064x}"
                tw = NumpyBatches(ids, vals, labels, CATS, m, salt)
                delta = 1e-6 if est == "P2" else 0.0
                rel = private_distribution(tw, DistributionPlan(Budget(args.epsilon, delta), CATS, m, est),
                                           SeededNoise([7, m, s, len(est)]))
                errs.append(np.abs(rel.estimate - truth))
                errs_all.append(np.abs(rel.estimate - truth_all))
                bars.append(np.asarray(rel.error_bar))
            e, b, ea = np.array(errs), np.array(bars), np.array(errs_all)
            hit = int(np.sum(e <= b))
            lo, hi = cp(hit, e.size)
            print(f"| {est} | {m} | {hit / e.size:.3f} ({lo:.3f}-{hi:.3f}) | {np.median(b) / np.quantile(e, 0.9):.2f} | "
                  f"{np.median(b):.4g} | {np.median(e):.4g} | {np.mean(ea <= b):.3f} |  ({time.time() - t0:.0f} s)",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
