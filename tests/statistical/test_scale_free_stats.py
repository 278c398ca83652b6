"""Statistical tests of the scale-free univariate person mean (seeded, numpy backend).

1. Scale invariance: the same persons in other units (times 1e6) give the same relative error.
   Power: an estimator with a fixed public scale (dplib.mean.univariate, scale = 2) fails the
   same check.
2. Error bar: on Gaussian person means its 90% bar covers the exact dataset statistic at least
   as often as a binomial lower quantile of the nominal level allows, and it is not much wider
   than the errors it covers. Power: a halved bar fails the first check, a tripled bar the second.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binom

from dplib.aggregates import NumpyAggregates
from dplib.budget import Budget
from dplib.mean.scale_free import ScaleFreeMeanPlan, scale_free_person_mean
from dplib.mean.univariate import STATUS_OK, UnivariateMeanPlan, univariate_person_mean
from dplib.mechanisms import SeededNoise

N_PERSONS = 4000
MEAN, SD = 3.0, 2.0
BUDGET = Budget(1.0, 1e-6)
SCALE = 1e6
INVARIANCE_REPS = 60
INVARIANCE_FACTOR = 1.5
COVERAGE_REPS = 100
NOMINAL = 0.9
#: Bars no wider than this multiple of the empirical 90th percentile of the absolute error.
MAX_BAR_OVER_Q90 = 2.5


def _persons(seed):
    rng = np.random.default_rng([2024, seed])
    y = rng.normal(MEAN, SD, size=N_PERSONS)
    gi = rng.integers(0, 2**32, size=N_PERSONS)
    return y, gi


def _scale_free(y, gi, seed):
    return scale_free_person_mean(NumpyAggregates({"v": y}, gi), "v", ScaleFreeMeanPlan(BUDGET), SeededNoise([99, seed]))


def _fixed_scale(y, gi, seed):
    plan = UnivariateMeanPlan(BUDGET, scale=2.0)
    return univariate_person_mean(NumpyAggregates({"v": y}, gi), "v", plan, SeededNoise([99, seed]))


def _relative_errors(estimator, factor):
    """|estimate - exact| / factor over the repetitions; a failed release counts as inf."""
    errs = []
    for rep in range(INVARIANCE_REPS):
        y, gi = _persons(rep)
        ys = y * factor
        rel = estimator(ys, gi, rep)
        exact = float(np.mean(ys))
        errs.append(abs(rel.estimate - exact) / factor if rel.status == STATUS_OK else math.inf)
    return np.array(errs)


def _invariant(errs_1, errs_scaled) -> bool:
    m1, m2 = float(np.median(errs_1)), float(np.median(errs_scaled))
    if not (math.isfinite(m1) and math.isfinite(m2)) or m1 <= 0 or m2 <= 0:
        return False
    return max(m1 / m2, m2 / m1) <= INVARIANCE_FACTOR


@pytest.mark.slow
def test_scale_invariance_of_relative_error():
    e1 = _relative_errors(_scale_free, 1.0)
    e2 = _relative_errors(_scale_free, SCALE)
    assert np.all(np.isfinite(e1)) and np.all(np.isfinite(e2))
    # every stage reads all persons: the error is the Laplace noise of the fine stage, of the
    # order of radius / (epsilon n) ~ 4 sd * 1.15 / (0.82 * 4000) * ln 2 ~ 0.002, in both units
    assert 0.0003 < np.median(e1) < 0.02
    assert _invariant(e1, e2), (np.median(e1), np.median(e2))


def test_scale_invariance_power_fixed_scale_estimator_fails():
    e1 = _relative_errors(_fixed_scale, 1.0)
    e2 = _relative_errors(_fixed_scale, SCALE)
    # at its own scale the fixed-scale estimator is fine ...
    assert np.median(e1) < 0.2
    # ... but it does not carry over to other units
    assert not _invariant(e1, e2), (np.median(e1), np.median(e2))


def _coverage_run():
    errs, bars = [], []
    for rep in range(COVERAGE_REPS):
        y, gi = _persons(1000 + rep)
        rel = _scale_free(y, gi, 1000 + rep)
        assert rel.status == STATUS_OK
        errs.append(abs(rel.estimate - float(np.mean(y))))
        bars.append(math.inf if rel.error_bar is None else rel.error_bar)
    return np.array(errs), np.array(bars)


@pytest.fixture(scope="module")
def coverage_run():
    return _coverage_run()


#: Fewest covering repetitions accepted: the 5% lower quantile of Binomial(100, 0.9), i.e. 85.
MIN_COVERED = int(binom.ppf(0.05, COVERAGE_REPS, NOMINAL))


def _coverage_ok(errs, bars) -> bool:
    return int(np.sum(errs <= bars)) >= MIN_COVERED


def _width_ok(errs, bars) -> bool:
    return float(np.median(bars)) <= MAX_BAR_OVER_Q90 * float(np.quantile(errs, 0.9))


def test_min_covered_is_85():
    assert MIN_COVERED == 85


@pytest.mark.slow
def test_error_bar_coverage(coverage_run):
    errs, bars = coverage_run
    assert _coverage_ok(errs, bars), int(np.sum(errs <= bars))


@pytest.mark.slow
def test_error_bar_not_too_wide(coverage_run):
    errs, bars = coverage_run
    assert _width_ok(errs, bars), (float(np.median(bars)), float(np.quantile(errs, 0.9)))


@pytest.mark.slow
def test_error_bar_checks_have_power(coverage_run):
    errs, bars = coverage_run
    assert not _coverage_ok(errs, bars / 2.0)
    # a 90% bar near the 90th percentile of the error: four times it is too wide
    assert not _width_ok(errs, bars * 4.0)


# ------------------------------------------------------------------------------------------------
# accuracy against the pinned anchor (issue 18): PipelineDP's MEAN construction with the data's
# own non-private 1st/99th percentiles as bounds, simulated here with numpy Laplace noise
# ------------------------------------------------------------------------------------------------

ANCHOR_N = 10_000
ANCHOR_REPS = 40
#: issue 18's target on light-tailed data with n >= 10^3 is 1.5x; with 40 seeds the ratio of two
#: medians has a relative sd of about 0.2, so the test allows 1.5x + 2 sd. The pre-issue-18
#: defaults measured 8-17x on such cells (benchmarks/anchors), far outside it.
ANCHOR_MAX_RATIO = 2.1
#: Ours cannot be much better than clamping at the data's own 1st/99th percentiles on a
#: Gaussian (its noise is at least radius / (eps n) with a radius near the extremes): a ratio
#: below this means the oracle or the comparison is broken.
ANCHOR_MIN_RATIO = 0.3


def _anchor_error(y, rng, eps):
    lo, hi = np.percentile(y, [1, 99])
    mid, half = (lo + hi) / 2.0, (hi - lo) / 2.0
    s = np.sum(np.clip(y, lo, hi) - mid) + rng.laplace(0.0, half / (eps / 2.0))
    c = y.size + rng.laplace(0.0, 1.0 / (eps / 2.0))
    return abs(mid + s / max(c, 1.0) - float(np.mean(y)))


@pytest.mark.slow
def test_gaussian_accuracy_against_the_pinned_anchor():
    ours, anchor = [], []
    for rep in range(ANCHOR_REPS):
        rng = np.random.default_rng([18, rep])
        y = 5.0 + rng.standard_normal(ANCHOR_N)
        gi = rng.integers(0, 2**32, size=ANCHOR_N)
        rel = scale_free_person_mean(NumpyAggregates({"v": y}, gi), "v", ScaleFreeMeanPlan(BUDGET), SeededNoise([18, rep]))
        assert rel.status == STATUS_OK
        ours.append(abs(rel.estimate - float(np.mean(y))))
        anchor.extend(_anchor_error(y, rng, BUDGET.epsilon) for _ in range(5))
    ratio = float(np.median(ours)) / float(np.median(anchor))
    assert ANCHOR_MIN_RATIO <= ratio <= ANCHOR_MAX_RATIO, ratio
