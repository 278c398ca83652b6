"""The automatic covariance estimator (issue 19: covariance at realistic sizes, BHS23 still used
above its gate): the choice follows the DP lower bound n0 and BHS23's public gate only; the charges
are the count then the chosen branch's, composing to the budget; accuracy of each branch against
the exact covariance of person means; refusals before any charge."""

from __future__ import annotations

import numpy as np
import pytest

from dplib.aggregates import NumpyAggregates
from dplib.budget import Accountant, Budget
from dplib.covariance.auto import CHOSEN_BHS, CHOSEN_CLIPPED, CLIPPED_ASKED, STAGE_REST_CLIPPED, AutoCovariancePlan, auto_covariance
from dplib.covariance.clipped import ALGORITHM as CLIPPED
from dplib.covariance.person import COUNT_EPSILON_SHARE, STAGE_COUNT, NumpyPersonVectors
from dplib.errors import BudgetExceededError, InvalidParameterError
from dplib.mechanisms import SeededNoise

COV = np.array([[1.0, 0.6, 0.0], [0.6, 2.0, -0.4], [0.0, -0.4, 0.5]])


def _data(n, seed, d=3):
    rng = np.random.default_rng(seed)
    y = 3.0 + rng.standard_normal((n, d)) @ np.linalg.cholesky(COV[:d, :d]).T
    cols = [f"y{j}" for j in range(d)]
    ids = rng.integers(0, 2**32, n)
    return y, cols, NumpyAggregates({c: y[:, j] for j, c in enumerate(cols)}, ids), NumpyPersonVectors(ids, y, "ab" * 32)


def _rel_frob(est, y):
    true = np.cov(y.T, bias=True)
    return np.linalg.norm(est - true) / np.linalg.norm(true)


def test_below_the_gate_runs_the_clipped_estimator():
    """3,000 persons at d = 3 (BHS23's gate at this budget: ~46,000): the clipped branch, a release
    close to the exact covariance, the count charged first and everything composing to the budget."""
    y, cols, agg, vec = _data(3000, 1)
    plan = AutoCovariancePlan(Budget(0.9, 1e-6), 3)
    acc = Accountant(Budget(0.9, 1e-6))
    rel = auto_covariance(agg, vec, cols, plan, SeededNoise(2), acc, "c: ")
    choice = rel.parameters["estimator_choice"]
    assert choice["chosen"] == CHOSEN_CLIPPED and rel.algorithm == CLIPPED
    assert choice["n0"] < choice["bhs23_minimum_persons"] == plan.bhs_minimum_persons()
    assert "below BHS23's gate" in choice["reason"]
    assert acc.charges[0].stage == f"c: {STAGE_COUNT}"
    assert acc.charges[0].budget.epsilon == pytest.approx(0.9 * COUNT_EPSILON_SHARE)
    assert rel.status == "OK" and rel.epsilon == pytest.approx(0.9) and rel.delta <= 1e-6 * (1 + 1e-12)
    assert _rel_frob(rel.covariance, y) < 0.35  # one seeded run; the clipped estimator's own tests measure it


def test_above_the_gate_runs_bhs23():
    """lambda0 = 3 puts BHS23's gate at 4,200 persons: with 6,000 persons the DP n0 passes it and
    BHS23 runs on exactly n0 persons (its own count stage is the one the choice read)."""
    y, cols, agg, vec = _data(6000, 3, d=2)
    plan = AutoCovariancePlan(Budget(0.9, 1e-6), 2, lambda0=3.0)
    assert plan.bhs_minimum_persons() == 4200
    acc = Accountant(Budget(0.9, 1e-6))
    rel = auto_covariance(agg, vec, cols, plan, SeededNoise(4), acc)
    choice = rel.parameters["estimator_choice"]
    assert choice["chosen"] == CHOSEN_BHS and choice["n0"] >= 4200
    assert rel.parameters["n0"] == choice["n0"]  # one count, read by both the choice and BHS23
    assert [c.stage for c in acc.charges].count(STAGE_COUNT) == 1
    assert rel.epsilon == pytest.approx(0.9) and rel.delta == pytest.approx(1e-6)
    assert rel.status in {"OK", "FAIL"}
    if rel.status == "OK":
        assert _rel_frob(rel.covariance, y) < 0.5
    else:
        assert "propose-test-release" in rel.parameters["fail_reason"]


def test_choice_is_a_function_of_n0_only():
    """Across seeds near the gate, BHS23 runs exactly when the released n0 reaches the public gate."""
    y, cols, agg, vec = _data(4300, 5, d=2)
    plan = AutoCovariancePlan(Budget(0.5, 1e-6), 2, lambda0=3.0)
    need = plan.bhs_minimum_persons()
    seen = set()
    for s in range(12):
        rel = auto_covariance(agg, vec, cols, plan, SeededNoise([6, s]))
        ch = rel.parameters["estimator_choice"]
        assert (ch["chosen"] == CHOSEN_BHS) == (ch["n0"] >= need)
        seen.add(ch["chosen"])
    assert seen == {CHOSEN_BHS, CHOSEN_CLIPPED} or need > 4300  # the gate sits inside n0's spread here


def test_epsilon_outside_bhs23s_range_always_clips():
    y, cols, agg, vec = _data(2500, 7)
    plan = AutoCovariancePlan(Budget(2.0, 1e-6), 3)
    assert plan.bhs_minimum_persons() is None and "epsilon must be in" in plan.bhs_unavailable()
    rel = auto_covariance(agg, vec, cols, plan, SeededNoise(8))
    assert rel.parameters["estimator_choice"]["chosen"] == CHOSEN_CLIPPED
    assert "epsilon must be in" in rel.parameters["estimator_choice"]["reason"]


def test_refusals_before_any_charge():
    with pytest.raises(InvalidParameterError, match="delta"):
        AutoCovariancePlan(Budget(0.5, 0.0), 3)
    with pytest.raises(InvalidParameterError, match="d must be"):
        AutoCovariancePlan(Budget(0.5, 1e-6), 1)
    y, cols, agg, vec = _data(100, 9)
    acc = Accountant(Budget(0.4, 1e-6))
    with pytest.raises(BudgetExceededError):
        auto_covariance(agg, vec, cols, AutoCovariancePlan(Budget(0.5, 1e-6), 3), SeededNoise(1), acc)
    assert acc.charges == []


def test_the_clipped_branch_lists_the_count_among_its_stages():
    """A new user found the auto release's ``parameters.stages`` adding up to 0.98 of a release
    charged 1.0: the count that chose the branch is now listed first, and the list adds up to the
    release's epsilon."""
    y = 5.0 + np.random.default_rng(1).standard_normal((3_000, 3))
    ids = np.arange(3_000)
    be = NumpyAggregates({c: y[:, j] for j, c in enumerate("abc")}, ids)
    rel = auto_covariance(be, NumpyPersonVectors(ids, y, "ab" * 32), list("abc"),
                          AutoCovariancePlan(Budget(1.0, 1e-6), 3), SeededNoise(1))
    assert rel.parameters["estimator_choice"]["chosen"] == CHOSEN_CLIPPED
    stages = rel.parameters["stages"]
    assert stages[0] == {"stage": STAGE_COUNT, "epsilon": pytest.approx(COUNT_EPSILON_SHARE), "delta": 0.0}
    assert sum(s["epsilon"] for s in stages) == pytest.approx(rel.epsilon) == pytest.approx(1.0)


def test_explicit_clipped_counts_from_the_aggregates_and_never_runs_bhs23():
    """``estimator: clipped`` (``bhs=False``): with 6,000 persons and lambda0 = 3 BHS23's gate
    (4,200) would pass, but the clipped estimator runs; the count comes from the aggregates seam
    (no person vectors) and picks the layout: at epsilon 0.9 and 1,000 persons the small-data
    layout, at 6,000 the large one (count x 0.98 epsilon against SMALL_DATA_N_EPS = 3,000)."""
    y, cols, agg, _ = _data(6000, 3, d=2)
    plan = AutoCovariancePlan(Budget(0.9, 1e-6), 2, lambda0=3.0, bhs=False)
    assert plan.bhs_minimum_persons() is None and plan.bhs_unavailable() == CLIPPED_ASKED
    acc = Accountant(Budget(0.9, 1e-6))
    rel = auto_covariance(agg, None, cols, plan, SeededNoise(4), acc)
    choice = rel.parameters["estimator_choice"]
    assert choice["chosen"] == CHOSEN_CLIPPED and choice["reason"] == CLIPPED_ASKED
    # the count's Laplace scale is 1 / (0.02 x 0.9) = 56 persons: within 9 of them (P ~ 1e-4)
    assert choice["small_data_layout"] is False and abs(choice["noisy_person_count"] - 6000) < 9 / (0.02 * 0.9)
    assert acc.charges[0].stage == STAGE_COUNT and rel.epsilon == pytest.approx(0.9)
    assert [c.stage for c in plan.charges()] == [STAGE_COUNT, STAGE_REST_CLIPPED]  # the plan names no BHS23
    assert rel.status == "OK" and _rel_frob(rel.covariance, y) < 0.25
    y, cols, agg, _ = _data(1000, 5, d=2)
    rel = auto_covariance(agg, None, cols, AutoCovariancePlan(Budget(0.9, 1e-6), 2, bhs=False), SeededNoise(6))
    assert rel.parameters["estimator_choice"]["small_data_layout"] is True
    assert rel.parameters["small_data_layout"] is True and rel.epsilon == pytest.approx(0.9)


def test_explicit_clipped_refusals_before_any_charge():
    y, cols, agg, vec = _data(100, 9)
    with pytest.raises(InvalidParameterError, match="bhs must be a bool"):
        AutoCovariancePlan(Budget(0.5, 1e-6), 3, bhs="no")
    acc = Accountant(Budget(0.5, 1e-6))
    with pytest.raises(InvalidParameterError, match="person vectors"):
        auto_covariance(agg, None, cols, AutoCovariancePlan(Budget(0.5, 1e-6), 3), SeededNoise(1), acc)
    assert acc.charges == []
