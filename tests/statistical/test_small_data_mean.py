"""The scale-free mean on small data (~100 persons at epsilon 1: stage 1 needs its retry), seeded,
numpy backend, one person mean per person (Gaussian records, m = 10: person means N(5, 0.1)).

Before the small-data path (scale-free mean version 6), the deviation profile (half-octave bins
at epsilon 0.2) showed no bin above its noise floor in 38 of 60 such runs; the radius then came
from a fallback tail (0.125 against a spread of 0.32) and bars covered 58% of the releases, many
unflagged (a release 0.52 off with a bar of 0.021); the median error was 0.085, ~10x a clamp at
the non-private [p1, p99]. The bars, error and visibility assertions below fail on that version
(measured: visible 22/60, unflagged misses 21/60, ratio ~11.7); the release count does not.
"""

from __future__ import annotations

import numpy as np

from dplib.aggregates import NumpyAggregates
from dplib.budget import Accountant, Budget
from dplib.mean.scale_free import ScaleFreeMeanPlan, scale_free_person_mean
from dplib.mean import scale_free_stages as S
from dplib.mean.univariate import STATUS_OK
from dplib.mechanisms import SeededNoise

N = 100
SEEDS = 60
BUDGET = Budget(1.0, 1e-6)


def _means(seed: int) -> np.ndarray:
    return np.random.default_rng([31, seed]).normal(5.0, 1.0, (N, 10)).mean(axis=1)


def _backend(y: np.ndarray, seed: int) -> NumpyAggregates:
    return NumpyAggregates({"v": y}, np.random.default_rng([32, seed]).integers(0, 2**32, size=y.size))


def _clamp_anchor(y: np.ndarray, rng: np.random.Generator) -> float:
    """|error| of the anchors' construction (PipelineDP MEAN): [p1, p99] of the person means given
    for free, epsilon/2 on the count and epsilon/2 on the sum centred at the midpoint, Laplace."""
    lo, hi = np.quantile(y, [0.01, 0.99])
    mid, half = (lo + hi) / 2, (hi - lo) / 2
    eps = BUDGET.epsilon / 2
    s = np.sum(np.clip(y, lo, hi) - mid) + rng.laplace(0.0, half / eps)
    c = max(y.size + rng.laplace(0.0, 1.0 / eps), 1.0)
    return abs(mid + s / c - y.mean())


def _runs():
    out = []
    for seed in range(SEEDS):
        y = _means(seed)
        rel = scale_free_person_mean(_backend(y, seed), "v", ScaleFreeMeanPlan(budget=BUDGET), SeededNoise(seed),
                                     Accountant(BUDGET))
        out.append((y, rel))
    return out


RUNS = None


def _cached():
    global RUNS
    if RUNS is None:
        RUNS = _runs()
    return RUNS


def test_small_data_releases_with_honest_bars():
    runs = _cached()
    ok = [(y, r) for y, r in runs if r.status == STATUS_OK]
    # releases: a Poisson-ish count of range failures (measured 2/80): >= 55/60 fails with p < 1%
    # only if the failure rate is above ~4x that
    assert len(ok) >= 55, len(ok)
    assert all(r.parameters["range_retried"] for _, r in runs)  # the small-data path ran
    misses = [(y, r) for y, r in ok if r.error_bar is None or abs(r.estimate - y.mean()) > r.error_bar]
    unflagged = [r for _, r in misses if not r.parameters["tail_flag"]]
    # measured 0/78 unflagged misses (version 6: 19/60); a flagged release says its bar may miss
    assert len(unflagged) <= 3, [(r.estimate, r.error_bar) for r in unflagged]
    # a flagged release with a bar says so, and why (here mostly: too few persons to confirm a light tail)
    flagged = [r for _, r in ok if r.parameters["tail_flag"] and r.error_bar is not None]
    assert flagged and all("WARNING (tail_flag)" in r.error_covers for r in flagged)
    assert any("few persons" in r.error_covers for r in flagged)


def test_small_data_error_against_a_clamp_given_free_bounds():
    runs = _cached()
    worst = max(float(np.ptp(y)) for y, _ in runs)  # a release that is not OK counts as worse than any
    ours = [abs(r.estimate - y.mean()) if r.status == STATUS_OK else worst for y, r in runs]
    rng = np.random.default_rng(33)
    anchor = [np.median([_clamp_anchor(y, rng) for _ in range(5)]) for y, _ in runs]
    ratio = float(np.median(ours) / np.median(anchor))
    # measured ~3x (version 6: ~10x; the target 2x is not met at 100 persons); the median
    # of 60 Laplace-like errors has a relative sd of ~15%, so 5x is > 3 sds above 3x and < 10x / 2
    assert ratio <= 5.0, ratio
    assert float(np.median(ours)) <= 0.05  # spread of person means 0.32: version 6 was at 0.085


def test_small_data_profile_sees_the_persons():
    """Octave bins at epsilon 0.2 hold the bulk above the floor: version 6's half octaves cleared it in
    22 of 60 runs."""
    seen = 0
    for seed in range(SEEDS):
        y = _means(seed)
        plan = ScaleFreeMeanPlan(budget=BUDGET)
        acc = Accountant(BUDGET)
        charges = {c.stage: c for c in plan.charges("")}
        setup = S.scale_free_stages(_backend(y, seed), "v", plan, S.DEFAULT_SHARES, S.stage_charger(acc, charges),
                                    SeededNoise(seed), {})
        if setup is not None:
            assert setup.retried
            assert len(setup.profile.edges) - 2 <= 13  # octave bins from W 2^-6 to W 2^5, under/overflow
            seen += bool(np.any(setup.profile.weights > 0))
    assert seen >= 54, seen  # measured 59/60
