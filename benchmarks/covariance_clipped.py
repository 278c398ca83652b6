"""The clipped covariance (`kind: covariance`, `options.estimator: clipped`) on real and synthetic
person panels (issue 19: "covariance of person means, d = 4, ~4,700 persons, light-tailed").

Estimand: the exact covariance of person means (population normalisation). Error: relative
Frobenius norm ||Sigma~ - Sigma||_F / ||Sigma||_F; medians and 90th percentiles over seeds; the
release rate. Numpy twin of the Spark plan (bit-identical aggregates), SeededNoise.
Run: `.venv/bin/python -m benchmarks.covariance_clipped [--seeds 20] [--epsilon 1] [--estimator auto|large-layout]
[--anchors] [--cells 4700,nlswork]` (`--anchors`: PipelineDP constructions given non-private bounds)
(needs the bench extra for the real panels; `auto`: the default of `kind: covariance`, a DP count
then BHS23 above its gate or the clipped estimator).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from dplib.aggregates import NumpyAggregates
from dplib.budget import Budget
from dplib.covariance.clipped import ClippedCovariancePlan, clipped_covariance
from dplib.mechanisms import SeededNoise

COV = np.array([[1.0, 0.5, 0.0, 0.0], [0.5, 1.0, 0.3, 0.0], [0.0, 0.3, 2.0, 0.8], [0.0, 0.0, 0.8, 1.5]])
UNITS = np.array([1.0, 10.0, 0.1, 3.0])


def synthetic(n: int, heavy: bool, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    z = rng.standard_t(5, (n, 4)) if heavy else rng.standard_normal((n, 4))
    return 5.0 + (z @ np.linalg.cholesky(COV).T) * UNITS


def run(y: np.ndarray, eps: float, seed: int, estimator: str = "clipped"):
    """Relative Frobenius error of one release, or None when nothing was released."""
    out = run_with_bars(y, eps, seed, estimator)
    return None if out is None else out[0]


def worst_log_variance_ratio(est: np.ndarray, true: np.ndarray) -> float:
    """max over columns of |ln(released variance / exact variance)| (the released variance floored
    at 1e-12 of the exact one): a per-column view that the relative Frobenius error, dominated by
    the largest column, hides."""
    t = np.diag(true)
    return float(np.max(np.abs(np.log(np.maximum(np.diag(est), 1e-12 * t) / t))))


def correlation_scale_error(est: np.ndarray, true: np.ndarray) -> float:
    """||D^-1/2 (Sigma~ - Sigma) D^-1/2||_F / ||D^-1/2 Sigma D^-1/2||_F with D the exact variances:
    the relative Frobenius error after putting every column in its own standard deviations (unit
    free: a column in small units weighs as much as one in large units)."""
    sd = np.sqrt(np.diag(true))
    outer = np.outer(sd, sd)
    return float(np.linalg.norm((est - true) / outer) / np.linalg.norm(true / outer))


def run_with_bars(y: np.ndarray, eps: float, seed: int, estimator: str = "clipped"):
    """``(relative Frobenius error, per-entry |error| (upper triangle), per-entry bar or None,
    worst |log variance ratio|, correlation-scale error)``, or None when nothing was released."""
    d = y.shape[1]
    cols = [f"y{j}" for j in range(d)]
    rng = np.random.default_rng(10_000 + seed)
    ids = rng.integers(0, 2**32, y.shape[0])
    be = NumpyAggregates({c: y[:, j] for j, c in enumerate(cols)}, ids)
    if estimator == "auto":
        from dplib.covariance.auto import AutoCovariancePlan, auto_covariance
        from dplib.covariance.person import NumpyPersonVectors

        vec = NumpyPersonVectors(ids, y, f"{seed + 1:064x}")
        rel = auto_covariance(be, vec, cols, AutoCovariancePlan(Budget(eps, 1e-6), d), SeededNoise(seed))
    elif estimator == "clipped":  # what `estimator: clipped` runs: a DP count picks the layout
        from dplib.covariance.auto import AutoCovariancePlan, auto_covariance

        rel = auto_covariance(be, None, cols, AutoCovariancePlan(Budget(eps, 1e-6), d, bhs=False), SeededNoise(seed))
    else:  # "large-layout": the clipped estimator's large-data layout at any size (before version 12)
        rel = clipped_covariance(be, cols, ClippedCovariancePlan(Budget(eps, 1e-6), d), SeededNoise(seed))
    if rel.status != "OK":
        return None
    true = np.cov(y.T, bias=True)
    iu = np.triu_indices(d)
    err = np.abs(rel.covariance - true)[iu]
    bar = None if rel.error_bar is None else np.asarray(rel.error_bar)[iu]
    return (float(np.linalg.norm(rel.covariance - true) / np.linalg.norm(true)), err, bar,
            worst_log_variance_ratio(rel.covariance, true), correlation_scale_error(rel.covariance, true))


def _vech(z: np.ndarray) -> np.ndarray:
    """Rows ``vech(z_i z_i^T)`` (upper triangle, row-major) of z (n, d)."""
    jj, kk = np.triu_indices(z.shape[1])
    return z[:, jj] * z[:, kk]


def _from_moments(first: np.ndarray, second: np.ndarray, d: int) -> np.ndarray:
    jj, kk = np.triu_indices(d)
    m = np.zeros((d, d))
    m[jj, kk] = second
    m[kk, jj] = second
    return m - np.outer(first, first)


def anchor_vector(y: np.ndarray, eps: float) -> np.ndarray:
    """PipelineDP, given sensible bounds: COUNT (Laplace) + VECTOR_SUM (L2 clip, Gaussian) of each
    person's ``(z, vech(z z^T))``, ``z = y - median`` (non-private), clipped at the non-private 99th
    percentile of that vector's norm; covariance ``E[z z^T] - E[z] E[z]^T``, projected to PSD."""
    from benchmarks.anchors.anchors import pipelinedp_vector

    d = y.shape[1]
    med = np.median(y, axis=0)
    z = y - med
    v = np.hstack([z, _vech(z)])
    radius = float(np.percentile(np.linalg.norm(v, axis=1), 99.0))
    mean_v = pipelinedp_vector(v, np.zeros(v.shape[1]), radius, eps, 1e-6)
    return _psd(_from_moments(mean_v[:d], mean_v[d:], d))


def anchor_means(y: np.ndarray, eps: float) -> np.ndarray:
    """PipelineDP MEAN of each coordinate and each product ``z_j z_k`` (``z = y - median``), each with
    its non-private 1st/99th percentiles as bounds, eps split evenly (d + d (d + 1) / 2 means): what
    a Tumult or PipelineDP user builds from per-column means; projected to PSD."""
    from benchmarks.anchors.anchors import bounds, pipelinedp_mean

    d = y.shape[1]
    z = y - np.median(y, axis=0)
    v = np.hstack([z, _vech(z)])
    lo, hi = bounds(v, "p1/p99")
    mean_v = pipelinedp_mean(v, lo, hi, eps)
    return _psd(_from_moments(mean_v[:d], mean_v[d:], d))


def _psd(m: np.ndarray) -> np.ndarray:
    w, v = np.linalg.eigh((m + m.T) / 2.0)
    return (v * np.clip(w, 0.0, None)) @ v.T


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--estimator", choices=["clipped", "auto", "large-layout"], default="clipped",
                    help="clipped: `estimator: clipped` (a DP count picks the layout); large-layout: the "
                         "large-data layout at every size (the explicit estimator before version 12)")
    ap.add_argument("--anchors", action="store_true",
                    help="also run two PipelineDP constructions given non-private bounds (bench extra)")
    ap.add_argument("--cells", default="", help="comma-separated substrings selecting cells")
    args = ap.parse_args(argv)
    cells = [(f"gaussian d=4 n={n}", lambda s, n=n: synthetic(n, False, s))
             for n in (500, 700, 1000, 1500, 2000, 3000, 4700, 20000)]
    cells += [("t5 d=4 n=4700", lambda s: synthetic(4700, True, s))]
    try:
        from benchmarks.anchors.data import panel_person_means

        nls, info = panel_person_means("nlswork", ("ln_wage", "hours", "tenure", "ttl_exp"))
        cells.append((f"nlswork ln_wage/hours/tenure/ttl_exp ({info['persons']} persons)", lambda s: nls))
        cells.append(("nlswork, its first 800 persons by idcode", lambda s: nls[:800]))
        wp, info = panel_person_means("wagepan", ("lwage", "hours", "exper", "educ"))
        cells.append((f"wagepan lwage/hours/exper/educ ({info['persons']} persons)", lambda s: wp))
        rh, info = panel_person_means("randhie", ("meddol", "outpdol", "drugdol", "mdvis"))
        cells.append((f"randhie meddol/outpdol/drugdol/mdvis ({info['persons']} persons)", lambda s: rh))
    except Exception as err:  # the bench extra is not installed
        print(f"nlswork: SKIPPED ({type(err).__name__}: {err})")
    print(f"covariance, estimator {args.estimator}: eps = {args.epsilon}, delta = 1e-6, {args.seeds} seeds")
    print("error: relative Frobenius; bars: share of entries (upper triangle) whose 90% bar covers the exact "
          "entry, and the median over entries of (median bar / p90 |error|)")
    print("logvar: median over runs of the worst column's |ln(released variance / exact variance)|")
    print("corrF: median over runs of the correlation-scale error (relative Frobenius after dividing entry (j, k) "
          "by the exact sd_j sd_k: unit free)")
    print(f"{'cell':<58}{'released':>9}{'median':>9}{'p90':>9}{'max':>9}{'covered':>9}{'bar/p90':>9}{'logvar':>8}"
          f"{'corrF':>8}{'sec':>6}")
    if args.cells:
        cells = [c for c in cells if any(k in c[0] for k in args.cells.split(","))]
    anchor_rows = []
    for name, make in cells:
        t0 = time.time()
        if args.anchors:
            for label, fn in (("PipelineDP VECTOR_SUM (z, vech zz^T), p99 norm", anchor_vector),
                              ("PipelineDP MEAN per entry, p1/p99 bounds", anchor_means)):
                errs, logv, corr = [], [], []
                for s in range(args.seeds):
                    y = make(s)
                    true = np.cov(y.T, bias=True)
                    est = fn(y, args.epsilon)
                    errs.append(float(np.linalg.norm(est - true) / np.linalg.norm(true)))
                    logv.append(worst_log_variance_ratio(est, true))
                    corr.append(correlation_scale_error(est, true))
                anchor_rows.append((name, label, np.median(errs), np.quantile(errs, 0.9), np.median(logv),
                                    np.median(corr)))
        runs = [run_with_bars(make(s), args.epsilon, s, args.estimator) for s in range(args.seeds)]
        ok = [r for r in runs if r is not None]
        rel_err = [r[0] for r in ok]
        logv = f"{np.median([r[3] for r in ok]):.2f}" if ok else "-"
        corrf = f"{np.median([r[4] for r in ok]):.3f}" if ok else "-"
        med = f"{np.median(rel_err):.3f}" if ok else "-"
        p90 = f"{np.quantile(rel_err, 0.9):.3f}" if ok else "-"
        worst = f"{np.max(rel_err):.3f}" if ok else "-"
        barred = [r for r in ok if r[2] is not None]
        if barred:
            errs = np.array([r[1] for r in barred])
            bars = np.array([r[2] for r in barred])
            covered = f"{np.mean(errs <= bars):.3f}"
            ratio = f"{np.median(np.median(bars, 0) / np.maximum(np.quantile(errs, 0.9, 0), 1e-300)):.2f}"
        else:
            covered = ratio = "-"
        print(f"{name:<58}{len(ok):>5}/{len(runs):<3}{med:>9}{p90:>9}{worst:>9}{covered:>9}{ratio:>9}{logv:>8}"
              f"{corrf:>8}{time.time() - t0:>6.0f}", flush=True)
    if anchor_rows:
        print("\nanchors (same data and epsilon, delta 1e-6, error against the exact covariance of person means)")
        print(f"{'cell':<58}{'anchor':<50}{'median':>9}{'p90':>9}{'logvar':>8}{'corrF':>8}")
        for name, label, med, p90, lv, cf in anchor_rows:
            print(f"{name:<58}{label:<50}{med:>9.3f}{p90:>9.3f}{lv:>8.2f}{cf:>8.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
