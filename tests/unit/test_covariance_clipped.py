"""Clip-and-noise covariance (issue 19, covariance at a few thousand persons): the exact
second-moment aggregate against a numpy oracle, its sensitivity on extreme neighbours, the
estimator's charges, failure path and accuracy against the exact covariance of person means."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dplib.aggregates import QUANT_SCALE, NumpyAggregates, clip_deviations, outer_sum_l2_sensitivity, upper_pairs
from dplib.budget import Accountant, Budget, composed_cost
from dplib.covariance.clipped import (
    MEAN_SHARE,
    STAGE_SECOND,
    STATUS_INSUFFICIENT,
    ClippedCovariancePlan,
    clipped_covariance,
    second_moment_vector,
)
from dplib.errors import BudgetExceededError, InvalidParameterError
from dplib.groups import ALL_PERSONS
from dplib.mechanisms import SeededNoise

COV = np.array([[1.0, 0.5, 0.0, 0.0], [0.5, 1.0, 0.3, 0.0], [0.0, 0.3, 2.0, 0.8], [0.0, 0.0, 0.8, 1.5]])
UNITS = np.array([1.0, 10.0, 0.1, 3.0])


def _data(n, seed, heavy=False):
    rng = np.random.default_rng(seed)
    z = rng.standard_t(5, (n, 4)) if heavy else rng.standard_normal((n, 4))
    y = 5.0 + (z @ np.linalg.cholesky(COV).T) * UNITS
    cols = [f"y{j}" for j in range(4)]
    return y, cols, NumpyAggregates({c: y[:, j] for j, c in enumerate(cols)}, rng.integers(0, 2**32, n))


@pytest.mark.parametrize("scales", [None, np.array([1.0, 10.0, 0.1, 3.0])])
def test_outer_sum_matches_numpy_oracle(scales):
    y, cols, be = _data(2000, 1)
    center, radius = np.full(4, 5.0), 2.5
    got, n = be.clipped_outer_sum(cols, center, radius, ALL_PERSONS, scales)
    u = clip_deviations(y, center, radius, scales)
    jj, kk = upper_pairs(4)
    oracle = np.sum(u[:, jj] * u[:, kk], axis=0)
    assert n == 2000
    # fixed point: at most half a unit (radius^2 / 2^31) per person and entry
    assert np.all(np.abs(got - oracle) <= n * radius**2 / (2 * QUANT_SCALE))
    assert np.max(np.linalg.norm(u, axis=1)) <= radius * (1 + 1e-12)


@pytest.mark.parametrize("extra", [[1e300, -1e300, 0.0, 1.0], [5.0, 5.0, 5.0, 5.0], [7.5, 5.0, 2.5, 5.0],
                                   [np.nan, 1.0, 1.0, 1.0]])
def test_outer_sum_sensitivity_on_extreme_neighbours(extra):
    """Adding one person (extreme, at the centre, on the radius, or missing a column) moves the
    released vector by at most the declared l2 sensitivity."""
    y, cols, _ = _data(500, 2)
    center, radius, scales = np.full(4, 5.0), 2.5, np.ones(4)
    gi = np.arange(501)
    a = NumpyAggregates({c: y[:, j] for j, c in enumerate(cols)}, gi[:500])
    b = NumpyAggregates({c: np.append(y[:, j], extra[j]) for j, c in enumerate(cols)}, gi)
    sa, _ = a.clipped_outer_sum(cols, center, radius, ALL_PERSONS, scales)
    sb, _ = b.clipped_outer_sum(cols, center, radius, ALL_PERSONS, scales)
    assert np.linalg.norm(sb - sa) <= outer_sum_l2_sensitivity(radius, 4)
    if extra[0] == 1e300:  # the extreme person sits on the ball's surface: near the bound
        assert np.linalg.norm(sb - sa) >= 0.5 * radius**2
    # the released vector of stage 2 (outer sum and the weighted count) on the same neighbours
    va, sens, w = second_moment_vector(a, cols, center, radius, ALL_PERSONS, scales)
    vb, sens_b, _ = second_moment_vector(b, cols, center, radius, ALL_PERSONS, scales)
    assert sens == sens_b and w == pytest.approx(radius**2 / 4.0)
    counted = not np.isnan(extra).any()  # a person missing a column is left out, count too
    assert vb[-1] - va[-1] == pytest.approx(w if counted else 0.0) and va[-1] == pytest.approx(500 * w)
    assert np.linalg.norm(vb - va) <= sens
    if extra[0] == 1e300:
        assert np.linalg.norm(vb - va) >= 0.5 * math.hypot(radius**2, w)


def test_charges_and_cost_equal_the_budget():
    plan = ClippedCovariancePlan(Budget(1.0, 1e-6), 4)
    eps, delta = composed_cost(plan.charges())
    assert eps == pytest.approx(1.0) and delta == pytest.approx(1e-6)
    assert plan.charges()[-1].stage == STAGE_SECOND
    assert plan.charges()[-1].budget.epsilon == pytest.approx(1.0 - MEAN_SHARE)


def test_accuracy_at_4700_persons_d4():
    """The issue's cell: d = 4, 4,700 persons, light-tailed, eps = 1: a release every run and
    median relative Frobenius error <= 0.25 against the exact covariance of person means
    (measured 0.035 Gaussian, 0.10 t5 over 20 seeds; asserted on 6 seeds with margin)."""
    errs = []
    for s in range(6):
        y, cols, be = _data(4700, 100 + s, heavy=(s % 2 == 1))
        acc = Accountant(Budget(1.0, 1e-6))
        rel = clipped_covariance(be, cols, ClippedCovariancePlan(Budget(1.0, 1e-6), 4), SeededNoise(s), acc)
        assert rel.status == "OK"
        assert rel.epsilon == pytest.approx(1.0) and rel.delta <= 1e-6 + 1e-18
        assert np.all(np.linalg.eigvalsh(rel.covariance) >= -1e-9 * np.abs(rel.covariance).max())
        true = np.cov(y.T, bias=True)
        errs.append(np.linalg.norm(rel.covariance - true) / np.linalg.norm(true))
    assert np.median(errs) <= 0.25
    # and it is not a constant: the estimate tracks the data's units (1 vs 100 on the diagonal)
    assert rel.covariance[1, 1] > 20 * rel.covariance[0, 0]


def test_too_few_persons_is_insufficient_and_charges_only_stage_one():
    y, cols, be = _data(60, 3)
    acc = Accountant(Budget(1.0, 1e-6))
    rel = clipped_covariance(be, cols, ClippedCovariancePlan(Budget(1.0, 1e-6), 4), SeededNoise(1), acc)
    assert rel.status == STATUS_INSUFFICIENT and rel.covariance is None
    assert all(not c.stage.endswith(STAGE_SECOND) for c in acc.charges)
    assert rel.epsilon <= MEAN_SHARE + 1e-12


def test_bad_inputs_refused_before_any_charge():
    _, cols, be = _data(100, 4)
    acc = Accountant(Budget(1.0, 1e-6))
    with pytest.raises(InvalidParameterError, match="distinct columns"):
        clipped_covariance(be, cols[:3], ClippedCovariancePlan(Budget(1.0, 1e-6), 4), SeededNoise(1), acc)
    with pytest.raises(InvalidParameterError, match="delta > 0"):
        ClippedCovariancePlan(Budget(1.0, 0.0), 4)
    with pytest.raises(InvalidParameterError, match="d must be"):
        ClippedCovariancePlan(Budget(1.0, 1e-6), 1)
    small = Accountant(Budget(0.5, 1e-6))
    with pytest.raises(BudgetExceededError):
        clipped_covariance(be, cols, ClippedCovariancePlan(Budget(1.0, 1e-6), 4), SeededNoise(1), small)
    assert acc.charges == [] and small.charges == []


def test_outer_radius_range_and_sensitivity_at_the_smallest_radius():
    """Below 1e-6 the clip factor R/||x|| of a 1e300 person could fall into subnormal floats (a
    review found ||u|| = 1.96 R at R = 1e-120): such radii are refused; at the smallest allowed
    radius an extreme neighbour stays within the declared sensitivity."""
    _, cols, be = _data(50, 5)
    with pytest.raises(InvalidParameterError, match="radius must be in"):
        be.clipped_outer_sum(cols, np.full(4, 5.0), 1e-7, ALL_PERSONS)
    with pytest.raises(InvalidParameterError, match="radius must be in"):
        be.clipped_outer_sum(cols, np.full(4, 5.0), 1e151, ALL_PERSONS)
    base = np.zeros((1, 4))
    a = NumpyAggregates({f"c{j}": base[:, j] for j in range(4)}, np.array([0]))
    for extra in ([3.97e203, 0.0, 0.0, 0.0], [1e300, -1e300, 1e300, 1e-300]):
        b = NumpyAggregates({f"c{j}": np.append(base[:, j], extra[j]) for j in range(4)}, np.array([0, 1]))
        sa, _ = a.clipped_outer_sum([f"c{j}" for j in range(4)], np.zeros(4), 1e-6, ALL_PERSONS)
        sb, _ = b.clipped_outer_sum([f"c{j}" for j in range(4)], np.zeros(4), 1e-6, ALL_PERSONS)
        assert np.linalg.norm(sb - sa) <= outer_sum_l2_sensitivity(1e-6, 4)


def test_gaussian_calibration_happens_before_any_charge(monkeypatch):
    import dplib.covariance.clipped as mod

    def broken(*args, **kwargs):
        raise InvalidParameterError("could not calibrate the Gaussian mechanism")

    monkeypatch.setattr(mod, "gaussian_sigma", broken)
    _, cols, be = _data(100, 6)
    acc = Accountant(Budget(1.0, 1e-6))
    with pytest.raises(InvalidParameterError, match="calibrate"):
        clipped_covariance(be, cols, ClippedCovariancePlan(Budget(1.0, 1e-6), 4), SeededNoise(1), acc)
    assert acc.charges == []


def test_heavy_tails_flag_the_release():
    """Person vectors with Pareto(1.5) tails (infinite variance): stage 1 reads them as heavy-tailed
    in every one of 5 seeded runs, and the release carries the flag (the releases table's `flagged`
    column reads parameters.tail_flag) and a WARNING in what its estimate covers (clipping biases
    it downwards: a new user found about half the exact values on flight delays, unflagged before)."""
    for s in range(5):
        rng = np.random.default_rng(s)
        y = rng.pareto(1.5, (6000, 2)) * [1.0, 3.0]
        be = NumpyAggregates({"a": y[:, 0], "b": y[:, 1]}, rng.integers(0, 2**32, 6000))
        rel = clipped_covariance(be, ["a", "b"], ClippedCovariancePlan(Budget(1.0, 1e-6), 2), SeededNoise(s))
        assert rel.status == "OK"
        assert rel.parameters["tail_flag"] is True and rel.parameters["stage1_tail_flag"] is True
        assert "WARNING (tail_flag)" in rel.error_covers


@pytest.mark.parametrize("seed", [26, 173])
def test_a_false_hidden_mass_alarm_does_not_set_the_radius(seed):
    """Regression (a CI run of the Spark job test): on 12,000 light-tailed persons the norm
    profile's noisy far bins summed past HIDDEN_SD sds in ~2% of runs; read as survival they put
    the clipping radius at the top of the profile (181 scaled units) and the release 11x off
    (its noise grows as R^2). These noise seeds raised that alarm: the radius now comes from the
    visible bins and the release is within 25% of the exact covariance of person means."""
    rng = np.random.default_rng(8)
    n = 12000
    a = np.array([[2.0, 0.0], [1.5, 0.5]])
    y = (rng.standard_normal((n, 2, 2)) @ a.T + [100.0, -7.0]).mean(1)
    exact = np.cov(y.T, bias=True)
    be = NumpyAggregates({"u": y[:, 0], "v": y[:, 1]}, np.random.default_rng(seed + 1000).integers(0, 2**32, n))
    rel = clipped_covariance(be, ["u", "v"], ClippedCovariancePlan(Budget(0.9, 3.6e-4), 2), SeededNoise(seed))
    assert rel.parameters["clipping_radius_scaled"] < 20.0
    assert np.linalg.norm(rel.covariance - exact) / np.linalg.norm(exact) < 0.25
