"""dplib.count: the person count (Laplace, sensitivity 1) — exact mechanism against a seeded
oracle, sensitivity on extreme neighbours, charge before noise, and the error bar's coverage
with a power check."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from dplib.aggregates import NumpyAggregates
from dplib.budget import Accountant, Budget
from dplib.count import ERROR_LEVEL, PersonCountPlan, laplace_error_bar, person_count
from dplib.errors import BudgetExceededError, InvalidParameterError
from dplib.mechanisms import SeededNoise
from dplib.mechanisms.basic import SENSITIVITY_MARGIN


def backend(x, y=None):
    cols = {"x": np.asarray(x, dtype=float)}
    if y is not None:
        cols["y"] = np.asarray(y, dtype=float)
    return NumpyAggregates(cols, np.arange(len(x), dtype=np.int64))


def test_release_is_rounded_laplace_of_the_exact_count():
    x = np.r_[np.ones(500), np.full(20, np.nan)]  # 20 persons without a value do not count
    plan = PersonCountPlan(Budget(0.5))
    rel = person_count(backend(x), ["x"], plan, SeededNoise(3))
    b = (1.0 + SENSITIVITY_MARGIN) / 0.5
    oracle = SeededNoise(3).add_laplace(np.array([500.0]), b)
    assert rel.estimate[0] == max(0.0, float(np.rint(oracle[0])))
    assert rel.noise_scale == pytest.approx(b)
    assert rel.error_bar[0] == pytest.approx(b * math.log(10) + 0.5)
    assert (rel.epsilon, rel.delta) == (0.5, 0.0)


def test_every_column_must_be_present():
    x = np.ones(10)
    y = np.r_[np.ones(4), np.full(6, np.nan)]
    acc = Accountant(Budget(1e9))  # noise negligible: b ~ 1e-9
    rel = person_count(backend(x, y), ["x", "y"], PersonCountPlan(Budget(1e9)), SeededNoise(0), acc)
    assert rel.estimate[0] == 4.0


@pytest.mark.parametrize("extreme", [1e300, -1e300, 0.0, np.nan])
def test_sensitivity_on_extreme_neighbours(extreme):
    """Adding one person (any value, or none) changes the exact count by at most 1."""
    x = np.random.default_rng(0).normal(size=200)
    counts = []
    for data in (x, np.r_[x, extreme]):
        counts.append(backend(data).count(["x"], PersonCountPlan(Budget(1.0)).group))
    assert abs(counts[1] - counts[0]) <= 1


class _Recording(SeededNoise):
    def __init__(self):
        super().__init__(0)
        self.calls = 0

    def add_laplace(self, values, scale):
        self.calls += 1
        return super().add_laplace(values, scale)


def test_budget_checked_and_charged_before_noise():
    noise = _Recording()
    acc = Accountant(Budget(0.4))
    with pytest.raises(BudgetExceededError):
        person_count(backend(np.ones(5)), ["x"], PersonCountPlan(Budget(0.5)), noise, acc)
    assert noise.calls == 0 and acc.charges == []
    acc = Accountant(Budget(1.0))
    person_count(backend(np.ones(5)), ["x"], PersonCountPlan(Budget(0.5)), noise, acc, "n: ")
    assert noise.calls == 1 and [c.stage for c in acc.charges] == ["n: count"]


def test_bad_plan():
    with pytest.raises(InvalidParameterError, match="budget"):
        PersonCountPlan((1.0, 0.0))


def test_error_bar_coverage_and_power():
    """Over 4,000 seeded releases the bar covers the exact count with the closed-form probability
    ``P(|rint(L)| <= floor(bar)) = 1 - exp(-(floor(bar) + 0.5) / b)`` (>= 0.90: the rounding
    margin is conservative; binomial sd ~0.0045, band +-4 sd). Power: the same releases judged with a bar half as wide cover at ~0.74, and
    the noise's spread matches Laplace(b) by a KS test that rejects Laplace(b / 1.5)."""
    n, eps, reps = 1000, 0.3, 4000
    b = (1.0 + SENSITIVITY_MARGIN) / eps
    agg = backend(np.ones(n))
    err = np.array([person_count(agg, ["x"], PersonCountPlan(Budget(eps)), SeededNoise([7, r])).estimate[0] - n
                    for r in range(reps)])
    bar = laplace_error_bar(b, ERROR_LEVEL) + 0.5
    cover = np.mean(np.abs(err) <= bar)
    expect = 1.0 - math.exp(-(math.floor(bar) + 0.5) / b)
    assert expect >= ERROR_LEVEL
    assert abs(cover - expect) <= 4 * math.sqrt(expect * (1 - expect) / reps)
    assert np.mean(np.abs(err) <= bar / 2) < 0.80  # power: a half-width bar is visibly short (~0.74)
    jitter = np.random.default_rng(1).uniform(-0.5, 0.5, reps)  # undo the rounding in law
    assert stats.kstest(err + jitter, stats.laplace(scale=b).cdf).pvalue > 1e-3
    assert stats.kstest(err + jitter, stats.laplace(scale=b / 1.5).cdf).pvalue < 1e-6
