"""Budget validation, the accountant and parallel/sequential composition over hash ranges.

Expected composed costs are computed here by brute force (sum of the charges covering each point
of a grid of the hash space, then the maximum), never read from dplib.budget.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from dplib.budget import Accountant, Budget, Charge, composed_cost
from dplib.errors import BudgetExceededError, InvalidParameterError
from dplib.groups import ALL_PERSONS, GroupRange

# --------------------------------------------------------------------------------------------
# Budget validation
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("eps", [0, 0.0, -1.0, -1e-300, math.nan, math.inf, -math.inf, True, False, "1.0", None])
def test_budget_rejects_bad_epsilon(eps):
    with pytest.raises(InvalidParameterError, match="epsilon"):
        Budget(eps, 1e-6)


@pytest.mark.parametrize("delta", [-1e-12, -1.0, 1.0, 1.5, math.nan, math.inf, True, "0.1", None])
def test_budget_rejects_bad_delta(delta):
    with pytest.raises(InvalidParameterError, match="delta"):
        Budget(1.0, delta)


@pytest.mark.parametrize("eps, delta", [(1e-300, 0.0), (1, 0), (0.5, 1e-12), (1e6, 0.999999)])
def test_budget_accepts_valid_values(eps, delta):
    b = Budget(eps, delta)
    assert b.epsilon == float(eps) and isinstance(b.epsilon, float)
    assert b.delta == float(delta) and isinstance(b.delta, float)


def test_budget_default_delta_is_pure_dp():
    assert Budget(2.0).delta == 0.0


def test_budget_is_immutable():
    b = Budget(1.0, 1e-6)
    with pytest.raises(Exception):
        b.epsilon = 5.0  # type: ignore[misc]


# --------------------------------------------------------------------------------------------
# Accountant: the limit is inclusive, compared as a pair, and refusals record nothing
# --------------------------------------------------------------------------------------------


def test_charging_exactly_the_limit_is_accepted():
    acc = Accountant(Budget(1.0, 1e-6))
    acc.charge("all", Budget(1.0, 1e-6))
    assert len(acc.charges) == 1
    assert acc.cost() == (1.0, 1e-6)


def test_three_thirds_fit_exactly():
    acc = Accountant(Budget(1.0, 3e-6))
    for i in range(3):
        acc.charge(f"third {i}", Budget(1.0 / 3.0, 1e-6))
    assert len(acc.charges) == 3


def test_limit_smaller_by_1e_9_relative_refuses_epsilon():
    acc = Accountant(Budget(1.0 * (1 - 1e-9), 1e-6))
    with pytest.raises(BudgetExceededError):
        acc.charge("all", Budget(1.0, 1e-6))
    assert acc.charges == []


def test_limit_smaller_by_1e_9_relative_refuses_delta():
    acc = Accountant(Budget(1.0, 1e-6 * (1 - 1e-9)))
    with pytest.raises(BudgetExceededError):
        acc.charge("all", Budget(1.0, 1e-6))
    assert acc.charges == []


def test_epsilon_fitting_but_delta_over_is_refused():
    acc = Accountant(Budget(1.0, 1e-6))
    with pytest.raises(BudgetExceededError):
        acc.charge("stage", Budget(0.1, 2e-6))
    assert acc.charges == []


def test_any_delta_is_refused_by_a_pure_dp_limit():
    acc = Accountant(Budget(1.0, 0.0))
    with pytest.raises(BudgetExceededError):
        acc.charge("stage", Budget(0.5, 1e-300))


def test_refused_charge_records_nothing_and_cost_is_unchanged():
    acc = Accountant(Budget(1.0, 1e-6))
    acc.charge("a", Budget(0.6, 5e-7))
    before_charges = list(acc.charges)
    before_cost = acc.cost()
    with pytest.raises(BudgetExceededError):
        acc.charge("b", Budget(0.5, 1e-7))  # epsilon would reach 1.1
    with pytest.raises(BudgetExceededError):
        acc.charge("c", Budget(0.1, 6e-7))  # delta would reach 1.1e-6
    assert acc.charges == before_charges
    assert acc.cost() == before_cost
    # ... and the remaining budget can still be spent.
    acc.charge("d", Budget(0.4, 5e-7))
    assert acc.cost() == pytest.approx((1.0, 1e-6), rel=1e-12)


def test_sequential_charges_on_the_same_persons_add_up():
    acc = Accountant(Budget(1.0, 1e-6))
    acc.charge("a", Budget(0.5, 0.0))
    acc.charge("b", Budget(0.5, 0.0))
    with pytest.raises(BudgetExceededError):
        acc.charge("c", Budget(1e-6, 0.0))


# --------------------------------------------------------------------------------------------
# Parallel composition across disjoint hash ranges
# --------------------------------------------------------------------------------------------


def test_full_budget_on_two_disjoint_halves_composes_to_the_budget():
    limit = Budget(1.0, 1e-6)
    acc = Accountant(limit)
    a, b = ALL_PERSONS.split([1, 1])
    acc.charge("half A", limit, a)
    acc.charge("half B", limit, b)
    assert acc.cost() == (1.0, 1e-6)
    # The whole space is now spent: anything on any range is refused.
    with pytest.raises(BudgetExceededError):
        acc.charge("more", Budget(1e-3, 0.0), GroupRange(0.1, 0.2))


def test_two_full_charges_on_overlapping_ranges_are_refused():
    limit = Budget(1.0, 1e-6)
    acc = Accountant(limit)
    acc.charge("first", limit, GroupRange(0.0, 0.6))
    with pytest.raises(BudgetExceededError):
        acc.charge("second", limit, GroupRange(0.4, 1.0))
    assert len(acc.charges) == 1


def test_tiny_overlap_is_still_refused():
    limit = Budget(1.0, 0.0)
    acc = Accountant(limit)
    acc.charge("first", limit, GroupRange(0.0, 0.5))
    with pytest.raises(BudgetExceededError):
        acc.charge("second", limit, GroupRange(0.5 - 1e-9, 1.0))


def test_empty_charge_list_costs_nothing():
    assert composed_cost([]) == (0.0, 0.0)


GRID = 64  # range endpoints are multiples of 1/GRID, so cell midpoints decide coverage exactly


def _brute_force_cost(intervals, budgets):
    eps_best = 0.0
    delta_best = 0.0
    for cell in range(GRID):
        x = (cell + 0.5) / GRID
        eps = 0.0
        delta = 0.0
        for (lo, hi), (e, d) in zip(intervals, budgets):
            if lo <= x < hi:
                eps += e
                delta += d
        eps_best = max(eps_best, eps)
        delta_best = max(delta_best, delta)
    return eps_best, delta_best


@pytest.mark.parametrize("seed", range(25))
def test_composed_cost_matches_brute_force_on_random_intervals(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 9))
    intervals, budgets, charges = [], [], []
    for i in range(n):
        a, b = sorted(rng.choice(GRID + 1, size=2, replace=False))
        lo, hi = a / GRID, b / GRID
        e = float(rng.uniform(0.01, 1.0))
        d = float(rng.choice([0.0, rng.uniform(1e-9, 1e-6)]))
        intervals.append((lo, hi))
        budgets.append((e, d))
        charges.append(Charge(f"s{i}", Budget(e, d), GroupRange(lo, hi)))
    eps, delta = composed_cost(charges)
    exp_eps, exp_delta = _brute_force_cost(intervals, budgets)
    assert eps == pytest.approx(exp_eps, rel=1e-12, abs=0)
    assert delta == pytest.approx(exp_delta, rel=1e-12, abs=1e-300)

    # The accountant agrees with the brute-force cost on accept/refuse decisions.
    limit_eps = exp_eps * float(rng.choice([0.9, 1.0, 1.1]))
    limit_delta = max(exp_delta, 1e-6) * float(rng.choice([1.0, 1.1]))
    acc = Accountant(Budget(limit_eps, limit_delta))
    refused = False
    for ch in charges:
        try:
            acc.charge(ch.stage, ch.budget, ch.group)
        except BudgetExceededError:
            refused = True
            break
    # Charges are only added, so refusal happens iff the full set overspends (prefix costs are
    # monotone); with limit_eps = 0.9 * exp_eps the full set must overspend.
    should_refuse = exp_eps > limit_eps * (1 + 1e-12) or exp_delta > limit_delta * (1 + 1e-12)
    assert refused == should_refuse


def test_composed_cost_one_range_fast_path_equals_the_segment_scan():
    """The one-range shortcut of ``composed_cost`` (every charge on one hash range: an ungrouped
    statistic, or one group) gives what the segment scan gives, and a second range still goes
    through the scan (parallel composition: the max over segments, not the sum)."""
    from dplib.budget import Charge, composed_cost
    from dplib.groups import ALL_PERSONS, GroupRange

    rng = np.random.default_rng(2)
    for _ in range(200):
        charges = [Charge(f"s{i}", Budget(float(e), float(d)), ALL_PERSONS)
                   for i, (e, d) in enumerate(zip(rng.uniform(0, 1, 5), rng.uniform(0, 1e-6, 5)))]
        eps, delta = composed_cost(charges)
        assert eps == math.fsum(c.budget.epsilon for c in charges) and delta == math.fsum(c.budget.delta for c in charges)
    half_a, half_b = GroupRange(0.0, 0.5), GroupRange(0.5, 1.0)
    two = [Charge("a", Budget(0.3, 0.0), half_a), Charge("b", Budget(0.5, 1e-7), half_b), Charge("c", Budget(0.1, 0.0), half_a)]
    assert composed_cost(two) == (pytest.approx(0.5), pytest.approx(1e-7))
    same = [Charge("a", Budget(0.3, 0.0), GroupRange(0.0, 0.5)), Charge("b", Budget(0.2, 0.0), GroupRange(0.0, 0.5))]
    assert composed_cost(same) == (pytest.approx(0.5), 0.0)
