"""Unit tests of the person-level sum (:mod:`dplib.sums`) and of the derived per-person columns it
reads in the job (:mod:`dplib.derived`).

Oracles: ``numpy.sum`` of the persons' totals (built from records with ``numpy.add.reduceat``),
the plan's public shares, the seam's exact answers on neighbouring data sets, and seeded Monte
Carlo for the person-count bound.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from dplib.aggregates import NumpyAggregates
from dplib.budget import Accountant, Budget
from dplib.derived import check_derived, derive_columns, total_column
from dplib.errors import BudgetExceededError, InvalidParameterError
from dplib.groups import ALL_PERSONS
from dplib.mean.scale_free_stages import STAGE_CENTRE, STAGE_OVERFLOW, STAGE_PROFILE, STAGE_RANGE, STAGE_RANGE_RETRY, STAGE_RANGE_RETRY2, scale_free_stages
from dplib.mean.univariate import STATUS_INSUFFICIENT, STATUS_OK
from dplib.mechanisms import SeededNoise
from dplib.mechanisms.basic import SENSITIVITY_MARGIN
from dplib.sums import STAGE_SUM, ScaleFreeSumPlan, clipped_total, person_sum, persons_upper

BUDGET = Budget(1.0, 1e-6)


class RecordingNoise(SeededNoise):
    def __init__(self, seed, accountant: Accountant | None = None):
        super().__init__(seed)
        self.accountant = accountant
        self.exact: list[np.ndarray] = []
        self.scales: list[float] = []
        self.charges_at_call: list[int] = []

    def add_laplace(self, values, scale):
        self.exact.append(np.array(values, dtype=float, copy=True))
        self.scales.append(float(scale))
        self.charges_at_call.append(len(self.accountant.charges) if self.accountant is not None else -1)
        return super().add_laplace(values, scale)


def backend(t: np.ndarray, seed: int = 0) -> NumpyAggregates:
    return NumpyAggregates({"t": t}, np.random.default_rng(seed).integers(0, 2**32, t.size))


def person_totals(rng, n: int, draw) -> tuple[np.ndarray, np.ndarray]:
    """(totals, record counts) of n persons with 1 + Poisson(9) records each."""
    m = 1 + rng.poisson(9.0, n)
    records = draw(int(m.sum()))
    return np.add.reduceat(records, np.concatenate([[0], np.cumsum(m)[:-1]])), m


# ------------------------------------------------------------------------------------------------
# derived columns (numpy twin)
# ------------------------------------------------------------------------------------------------


def test_derived_total_is_mean_times_records():
    rng = np.random.default_rng(1)
    totals, m = person_totals(rng, 300, lambda k: rng.normal(2.0, 1.0, k))
    means = totals / m
    means[:5] = np.nan  # persons without a value of the column
    out = derive_columns({"x": means}, {"x": m}, {total_column("x"): ("x", "total")})
    got = out[total_column("x")]
    assert np.all(np.isnan(got[:5]))
    assert np.allclose(got[5:], totals[5:], rtol=1e-12)
    assert np.array_equal(got[5:], means[5:] * m[5:].astype(float))  # the product the Spark twin computes


@pytest.mark.parametrize("spec", [{"t": ("x", "mean")}, {"x": ("x", "total")}, {"": ("x", "total")}, {"t": "x"}])
def test_bad_derived_specs_are_refused(spec):
    with pytest.raises(InvalidParameterError):
        check_derived(spec)


def test_derived_column_needs_its_source():
    with pytest.raises(InvalidParameterError, match="no mean and count"):
        derive_columns({"x": np.ones(3)}, {}, {"t": ("x", "total")})


# ------------------------------------------------------------------------------------------------
# plan and charges
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("budget", [Budget(1.0, 1e-6), Budget(2.0, 0.0)], ids=["approx", "pure"])
def test_plan_cost_is_the_budget(budget):
    plan = ScaleFreeSumPlan(budget)
    assert [c.stage for c in plan.charges()] == [
        STAGE_RANGE, STAGE_RANGE_RETRY, STAGE_RANGE_RETRY2, STAGE_CENTRE, STAGE_PROFILE, STAGE_OVERFLOW, STAGE_SUM]
    assert [c.budget.epsilon / budget.epsilon for c in plan.charges()] == pytest.approx([0.04, 0.2, 0.15, 0.12, 0.2, 0.15, 0.14])
    assert (plan.cost().epsilon, plan.cost().delta) == pytest.approx((budget.epsilon, budget.delta))
    Accountant(budget).check(plan.charges())
    with pytest.raises(BudgetExceededError):
        Accountant(Budget(budget.epsilon, budget.delta * (1 - 1e-9) if budget.delta else 0.0)).check(
            ScaleFreeSumPlan(Budget(budget.epsilon * (1 + 1e-9), budget.delta)).charges())


def test_stages_charged_before_noise_and_insufficient_data_charges_only_the_range():
    t = np.random.default_rng(2).normal(50.0, 10.0, 20_000)
    acc = Accountant(BUDGET)
    noise = RecordingNoise(1, acc)
    rel = person_sum(backend(t), "t", ScaleFreeSumPlan(BUDGET), noise, acc, "s: ")
    assert rel.status == STATUS_OK
    assert [c.stage for c in acc.charges] == ["s: " + s for s in (STAGE_RANGE, STAGE_CENTRE, STAGE_PROFILE, STAGE_SUM)]
    assert noise.charges_at_call == [1, 2, 3, 4] and noise.exact[-1].shape == (1,)
    assert rel.epsilon == pytest.approx(1.0, rel=1e-12)

    acc2 = Accountant(BUDGET)
    small = person_sum(backend(t[:20]), "t", ScaleFreeSumPlan(BUDGET), SeededNoise(1), acc2)
    assert small.status == STATUS_INSUFFICIENT and small.estimate is None
    assert [c.stage for c in acc2.charges] == [STAGE_RANGE, STAGE_RANGE_RETRY, STAGE_RANGE_RETRY2]
    assert (small.epsilon, small.delta) == pytest.approx((0.39, 1e-6))


# ------------------------------------------------------------------------------------------------
# accuracy against numpy
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("dist", ["gaussian", "lomax2.5", "signed"])
def test_accuracy_against_numpy_sum(seed, dist):
    rng = np.random.default_rng([seed, len(dist)])
    draw = {"gaussian": lambda k: rng.normal(5.0, 1.0, k), "lomax2.5": lambda k: 5.0 + rng.pareto(2.5, k),
            "signed": lambda k: rng.normal(-0.5, 3.0, k)}[dist]
    totals, _ = person_totals(rng, 10_000, draw)
    truth = float(np.sum(totals))
    rel = person_sum(backend(totals, seed), "t", ScaleFreeSumPlan(BUDGET), SeededNoise(seed))
    assert rel.status == STATUS_OK
    # the noise alone: Laplace of scale (|c| + rho)/eps_final, a few hundred at most here
    spread = float(np.max(np.abs(totals)))
    assert abs(rel.estimate - truth) <= 20.0 * spread
    if rel.error_bar is not None:
        assert rel.error_bar >= rel.parameters["noise_quantile"]


# ------------------------------------------------------------------------------------------------
# sensitivity of the final stage; the person-count bound
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("extreme", [1e300, -1e300, 4e39, 50.0, 0.0])
@pytest.mark.parametrize("center,radius", [(50.0, 20.0), (-3e5, 1e-3), (0.0, 7e8)])
def test_final_stage_sensitivity_on_extreme_neighbours(extreme, center, radius):
    """Adding one person, whatever their total, moves the exact released sum by at most
    ``radius + |center|`` (the declared sensitivity, before its float margin)."""
    t = np.random.default_rng(3).normal(50.0, 10.0, 400)
    exact = []
    for data in (t, np.r_[t, extreme]):
        noise = RecordingNoise(0)
        clipped_total(backend(data), "t", center, radius, ALL_PERSONS, 1.0, noise)
        exact.append(float(noise.exact[0][0]))
        declared = noise.scales[0]
    assert abs(exact[1] - exact[0]) <= (radius + abs(center)) * (1 + 1e-12)
    assert declared == pytest.approx((radius + abs(center)) * (1 + SENSITIVITY_MARGIN), rel=1e-15)
    # and the exact value is numpy's sum of the clipped totals
    assert exact[0] == pytest.approx(float(np.sum(np.clip(t, center - radius, center + radius))), rel=1e-9,
                                     abs=1e-6 * (radius + abs(center)))


@pytest.mark.slow
def test_persons_upper_bounds_the_count():
    """The 0.99 bound from the profile's noisy total is at least the number of persons in at
    least 99% of runs (here: in all of 12), and not far above it."""
    rng = np.random.default_rng(4)
    n = 3000
    t = rng.normal(10.0, 2.0, n)
    misses, gaps = 0, []
    for seed in range(12):
        plan = ScaleFreeSumPlan(BUDGET)
        _, charge, _, params = plan.begin(None, "")
        setup = scale_free_stages(backend(t, seed), "t", plan, plan.shares, charge, SeededNoise([5, seed]), params)
        up = persons_upper(setup)
        misses += up < n
        gaps.append(up - n)
    assert misses == 0
    assert np.median(gaps) < 1000  # about 28 bins of Laplace(10): sd ~75; the Chernoff margin ~4 sd


def test_negative_totals_and_a_negative_centre():
    rng = np.random.default_rng(7)
    t = -1000.0 + rng.normal(0.0, 50.0, 8000)
    rel = person_sum(backend(t), "t", ScaleFreeSumPlan(BUDGET), SeededNoise(3))
    assert rel.status == STATUS_OK
    assert rel.parameters["coarse_center"] < 0
    assert abs(rel.estimate - float(np.sum(t))) <= 0.002 * abs(float(np.sum(t)))
    assert math.isfinite(rel.error_bar)
