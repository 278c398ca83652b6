"""Unit and statistical tests of the count-chosen multivariate mean (:mod:`dplib.mean.auto_multivariate`, a library estimator):
a DP person count picks d univariate scale-free means (small data) or the joint estimator.

Oracles: the plan's charges against the budget (closed form); numpy means of the complete cases;
the joint estimator run directly on the same data as the power check of the accuracy bound.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from dplib.aggregates import NumpyAggregates
from dplib.budget import Accountant, Budget, BudgetExceededError, composed_cost
from dplib.errors import InvalidParameterError
from dplib.groups import ALL_PERSONS
from dplib.mean.auto_multivariate import (
    CHOSEN_COORDINATES,
    CHOSEN_JOINT,
    COORDINATE_N_EPS,
    COUNT_SHARE,
    STAGE_COUNT,
    AutoMultivariateMeanPlan,
    auto_multivariate_mean,
)
from dplib.mean.scale_free_multivariate import scale_free_multivariate_mean
from dplib.mechanisms import SeededNoise

EPS, DELTA = 1.0, 1e-6


def _cols(d):
    return [f"x{j}" for j in range(d)]


def _backend(values, seed=0):
    gi = np.random.default_rng([11, seed]).integers(0, 2**32, values.shape[0])
    return NumpyAggregates({c: values[:, j] for j, c in enumerate(_cols(values.shape[1]))}, gi)


def test_both_branches_spend_exactly_the_budget_after_the_count():
    plan = AutoMultivariateMeanPlan(Budget(EPS, DELTA), 4)
    assert plan.cost() == Budget(EPS, DELTA)
    assert plan.count_budget == Budget(EPS * COUNT_SHARE, 0.0)
    joint = plan.joint_plan().cost()
    assert math.isclose(joint.epsilon + plan.count_budget.epsilon, EPS) and math.isclose(joint.delta, DELTA)
    coord = plan.coordinate_plan().cost()
    assert math.isclose(4 * coord.epsilon + plan.count_budget.epsilon, EPS)
    assert math.isclose(4 * coord.delta, DELTA)
    with pytest.raises(InvalidParameterError):
        AutoMultivariateMeanPlan(Budget(EPS, 0.0), 4)  # approximate DP only


def test_the_choice_is_a_threshold_on_the_dp_count_only():
    plan = AutoMultivariateMeanPlan(Budget(EPS, DELTA), 10)
    edge = COORDINATE_N_EPS * 10 / plan.rest_budget.epsilon
    assert plan.coordinate_wise(edge * 0.99) and not plan.coordinate_wise(edge * 1.01)
    assert not AutoMultivariateMeanPlan(Budget(EPS, DELTA), 1).coordinate_wise(1.0)  # d = 1: the joint path


def test_small_data_runs_coordinate_wise_and_beats_the_joint_estimator():
    """d = 10, 1,000 Gaussian persons at epsilon 1: the joint estimator's releases are useless
    (measured median l2 error ~8 where the mean's norm is ~16); coordinate-wise ~0.65. The bound
    2.0 is the test; the joint run on the same data is its power check (it fails the bound)."""
    d, n, seeds = 10, 1000, 5
    ours, joint, flags = [], [], 0
    for s in range(seeds):
        x = 5.0 + np.random.default_rng([3, s]).standard_normal((n, d))
        exact = x.mean(axis=0)
        rel = auto_multivariate_mean(_backend(x, s), _cols(d), AutoMultivariateMeanPlan(Budget(EPS, DELTA), d),
                                     SeededNoise(100 + s))
        assert rel.parameters["estimator_choice"]["chosen"] == CHOSEN_COORDINATES
        assert rel.epsilon <= EPS * (1 + 1e-12) and rel.delta <= DELTA * (1 + 1e-12)
        ours.append(np.linalg.norm(rel.estimate - exact) if rel.status == "OK" else math.inf)
        flags += bool(rel.parameters["tail_flag"])
        jplan = AutoMultivariateMeanPlan(Budget(EPS, DELTA), d).joint_plan()
        jrel = scale_free_multivariate_mean(_backend(x, s), _cols(d), jplan, SeededNoise(100 + s))
        joint.append(np.linalg.norm(jrel.estimate - exact) if jrel.status == "OK" else math.inf)
    assert np.median(ours) <= 2.0, ours
    assert np.median(joint) > 2.0, joint  # power: the former default fails the same bound
    assert flags == seeds  # ~100 persons x epsilon per column: every univariate release says so


def test_large_data_runs_the_joint_estimator():
    d, n = 4, 20_000
    x = 5.0 + np.random.default_rng(9).standard_normal((n, d))
    rel = auto_multivariate_mean(_backend(x), _cols(d), AutoMultivariateMeanPlan(Budget(EPS, DELTA), d), SeededNoise(1))
    assert rel.status == "OK"
    assert rel.parameters["estimator_choice"]["chosen"] == CHOSEN_JOINT
    assert np.linalg.norm(rel.estimate - x.mean(axis=0)) < 0.05
    assert rel.parameters["stages"][0]["stage"] == STAGE_COUNT
    assert math.isclose(rel.epsilon, EPS) and rel.delta <= DELTA * (1 + 1e-12)


def test_coordinates_read_only_persons_with_every_column():
    """30% of persons lack x1 and sit at x0 ~ 105: the estimand (persons with a value of every
    column) has x0 ~ 5; a coordinate read over all persons with an x0 would give ~35."""
    rng = np.random.default_rng(5)
    n = 380  # count x epsilon / d ~ 186: coordinate-wise
    x = 5.0 + rng.standard_normal((n, 2))
    gone = rng.random(n) < 0.3
    x[gone, 0] += 100.0
    x[gone, 1] = np.nan
    exact = x[~gone].mean(axis=0)
    rel = auto_multivariate_mean(_backend(x), _cols(2), AutoMultivariateMeanPlan(Budget(EPS, DELTA), 2), SeededNoise(4))
    assert rel.parameters["estimator_choice"]["chosen"] == CHOSEN_COORDINATES
    assert rel.status == "OK"
    assert abs(rel.estimate[0] - exact[0]) < 3.0 and abs(rel.estimate[1] - exact[1]) < 3.0, (rel.estimate, exact)
    view = _backend(x).complete_cases(_cols(2))
    assert view.count(["x0"], ALL_PERSONS) == int((~gone).sum())
    assert _backend(x).count(["x0"], ALL_PERSONS) == n  # the unrestricted backend: every person with an x0


def test_every_stage_is_charged_before_noise_and_an_overdrawn_accountant_reads_nothing():
    acc = Accountant(Budget(EPS, DELTA))
    seen = []

    class ChargedFirst(SeededNoise):
        def add_laplace(self, values, scale):
            assert acc.charges, "noise drawn before any charge"
            seen.append(len(acc.charges))
            return super().add_laplace(values, scale)

        def add_gaussian(self, values, sigma):
            assert len(acc.charges) >= 2, "the final Gaussian before its charge"
            return super().add_gaussian(values, sigma)

    x = 5.0 + np.random.default_rng(2).standard_normal((400, 3))
    rel = auto_multivariate_mean(_backend(x), _cols(3), AutoMultivariateMeanPlan(Budget(EPS, DELTA), 3), ChargedFirst(0), acc)
    assert acc.charges[0].stage == STAGE_COUNT and seen[0] == 1  # the count's noise after its charge only
    assert seen == sorted(seen)
    eps, delta = composed_cost(acc.charges)
    assert (rel.epsilon, rel.delta) == (eps, delta) and eps <= EPS * (1 + 1e-12)

    class Exploding:
        def check_columns(self, columns):
            pass

        def complete_cases(self, columns):
            return self

        def count(self, *a, **k):
            raise AssertionError("read before the budget check")

    with pytest.raises(BudgetExceededError):
        auto_multivariate_mean(Exploding(), _cols(3), AutoMultivariateMeanPlan(Budget(EPS, DELTA), 3), SeededNoise(0),
                               Accountant(Budget(0.5, DELTA)))
    with pytest.raises(InvalidParameterError):
        auto_multivariate_mean(_backend(x), ["x0", "x0", "x1"], AutoMultivariateMeanPlan(Budget(EPS, DELTA), 3),
                               SeededNoise(0))

    class NoView:  # e.g. a grouped proxy: no complete-case view -> refused before any charge
        def check_columns(self, columns):
            pass

        def count(self, *a, **k):
            raise AssertionError("read before the refusal")

    acc2 = Accountant(Budget(EPS, DELTA))
    with pytest.raises(InvalidParameterError, match="complete_cases"):
        auto_multivariate_mean(NoView(), _cols(3), AutoMultivariateMeanPlan(Budget(EPS, DELTA), 3), SeededNoise(0), acc2)
    assert acc2.charges == []


class ShiftedCount(SeededNoise):
    """Seeded noise whose first Laplace draw (the person count) is moved by ``shift``: the branch
    must follow the NOISY count, not the exact one."""

    def __init__(self, seed, shift):
        super().__init__(seed)
        self.shift, self.first = shift, True

    def add_laplace(self, values, scale):
        out = super().add_laplace(values, scale)
        if self.first:
            self.first = False
            return out + self.shift
        return out


@pytest.mark.parametrize("n,shift,chosen", [(20_000, -19_500.0, CHOSEN_COORDINATES), (300, 30_000.0, CHOSEN_JOINT)])
def test_the_branch_follows_the_noisy_count_not_the_exact_one(n, shift, chosen):
    x = 5.0 + np.random.default_rng(8).standard_normal((n, 3))
    rel = auto_multivariate_mean(_backend(x), _cols(3), AutoMultivariateMeanPlan(Budget(EPS, DELTA), 3),
                                 ShiftedCount(3, shift))
    assert rel.parameters["estimator_choice"]["chosen"] == chosen


def test_a_coordinate_that_releases_nothing_stops_the_vector_and_the_rest_is_not_charged():
    """Three columns, the first at 0 for every person but a handful spread over 30 octaves (no
    magnitude bucket passes at 40 persons): INSUFFICIENT_DATA, only the first column's stages and
    the count charged."""
    rng = np.random.default_rng(4)
    n = 40
    x = 5.0 + rng.standard_normal((n, 3))
    x[:, 0] = 2.0 ** rng.uniform(-15, 15, n)
    acc = Accountant(Budget(EPS, DELTA))
    rel = auto_multivariate_mean(_backend(x), _cols(3), AutoMultivariateMeanPlan(Budget(EPS, DELTA), 3), SeededNoise(2), acc)
    assert rel.status == "INSUFFICIENT_DATA" and "x0" in rel.error_covers
    assert not any(c.stage.startswith(("x1: ", "x2: ")) for c in acc.charges)
    assert rel.epsilon < EPS / 3 + EPS * COUNT_SHARE
