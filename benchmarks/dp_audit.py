"""The empirical DP audits of tests/statistical/test_dp_audit.py at a larger size (not in CI).

Each mechanism runs on two neighbouring datasets ``--runs`` times per side with seeded noise; the
lower confidence bound on epsilon (Clopper-Pearson, threshold events chosen on a first half) is
printed for the honest mechanism and for its planted bug, beside the claimed epsilon and the CI
test's own size. More runs tighten the bound: the honest one must stay at or below the claim, the
buggy one above it.

    .venv/bin/python -m benchmarks.dp_audit --runs 200000            # every mechanism
    .venv/bin/python -m benchmarks.dp_audit --runs 100000 --only ptr # one (regex on the name)
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "statistical"))
import test_dp_audit as A  # noqa: E402  (the audits' mechanisms and bound, shared with CI)

from dplib.covariance import sampling as S  # noqa: E402
from dplib.mechanisms import SeededNoise  # noqa: E402


def _bound(run, noise_cls, seed: int, runs: int, delta: float) -> float:
    A.RUNS = runs
    d, dp = A._outputs(run, noise_cls, seed)
    return A.eps_lower_bound(d, dp, delta)


def _ptr(seed: int, runs: int, buggy: bool) -> float:
    real = S.ptr_pass_probability
    if buggy:
        S.ptr_pass_probability = lambda z, e, dl: real(z, 2.0 * e, dl)
    try:
        A.RUNS = runs
        d, dp = A._ptr_outputs(seed)
        return A.eps_lower_bound(d, dp, A.PTR_DELTA, alpha=1e-3)
    finally:
        S.ptr_pass_probability = real


def audits():
    """name -> (claimed epsilon, honest(seed, runs), buggy(seed, runs), planted bug)."""
    out = {}
    for name, (run, delta, _) in A.MECHANISMS.items():
        out[name] = (A.EPS, (lambda s, n, r=run, d=delta: _bound(r, SeededNoise, s, n, d)),
                     (lambda s, n, r=run, d=delta: _bound(r, A.HalvedNoise, s, n, d)), "noise halved")
    out["quantile exponential mechanism (median)"] = (
        A.EPS, lambda s, n: _bound(A._quantile_final_run, SeededNoise, s, n, 0.0),
        lambda s, n: _bound(lambda e, nz: A._quantile_final_run(e, nz, sensitivity=0.25), SeededNoise, s, n, 0.0),
        "sensitivity declared 0.25")
    out["bhs23 ptr coin"] = (A.PTR_EPS, lambda s, n: _ptr(s, n, False), lambda s, n: _ptr(s, n, True),
                             "coin for a 1-sensitive score")
    return out


def _cache_gaussian_calibration() -> None:
    """As the CI audits' fixture: the analytic-Gaussian calibration (a pure function of public
    values, ~0.1 s per call) cached; speed only."""
    import functools

    from dplib.mechanisms import basic as B

    B.gaussian_sigma = functools.lru_cache(maxsize=64)(B.gaussian_sigma)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=200_000, help="runs per side (CI uses %d)" % A.RUNS)
    ap.add_argument("--only", default=".", help="regex on the mechanism's name")
    ap.add_argument("--seed", type=int, default=101)
    args = ap.parse_args(argv)
    _cache_gaussian_calibration()
    ci_runs = A.RUNS
    print(f"runs per side: {args.runs:,} (CI: {ci_runs:,}); seed {args.seed}; numpy {np.__version__}")
    print("| mechanism | claimed epsilon | honest lower bound | planted bug | buggy lower bound | seconds |")
    print("|---|---|---|---|---|---|")
    worst = 0
    for name, (claim, honest, buggy, bug) in audits().items():
        if not re.search(args.only, name):
            continue
        t0 = time.monotonic()
        h, b = honest(args.seed, args.runs), buggy(args.seed + 1, args.runs)
        ok = h <= claim < b
        worst |= not ok
        print(f"| {name} | {claim:g} | {h:.3f} | {bug} | {b:.3f} | {time.monotonic() - t0:.0f} |" + ("" if ok else " **FAILED**"))
    return int(worst)


if __name__ == "__main__":
    raise SystemExit(main())
