"""Pure-DP reference mean (Agarwal et al. 2024, Algorithms 5-8): covers, Compare, exact cost,
Score against brute force, Score sensitivity, Lemma 5.1/5.3 behaviour, exponential mechanism
probabilities and the privacy plan of Algorithm 8.

Every expected value is recomputed here independently: Compare by a literal float median of
group means, cost(p, q) by searching all sets of changed persons, covers from their definitions.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from dplib.budget import Accountant, Budget, composed_cost
from dplib.errors import BudgetExceededError, InvalidParameterError
from dplib.groups import group_index
from dplib.mean.pure_reference import (
    compare,
    comparison_cost,
    global_grid,
    grid_scores,
    hash_group_labels,
    local_cover,
    plan_fine_pure,
    pure_mean,
    pure_mean_charges,
    score,
)
from dplib.mechanisms import SeededNoise

SALT = "5a" * 32


# ----- independent references ----------------------------------------------------------------
def ref_truncated(Y, p, q, rho):
    """Projected, truncated values relative to p0, the distance t = q0 - p0 (floats)."""
    diff = np.asarray(q, float) - np.asarray(p, float)
    t = math.sqrt(float(diff @ diff))
    y = (np.asarray(Y, float) - np.asarray(p, float)) @ (diff / t)
    return np.clip(y, -rho, rho), t


def ref_p_wins(z, labels, K, t):
    """Literal Algorithm 5 on truncated values: median of group means, ties to p (p0 = 0, q0 = t)."""
    means = [float(np.mean(z[labels == h])) for h in range(K)]
    med = float(np.median(means))
    return abs(med - 0.0) <= abs(med - t)


def brute_cost(Y, p, q, rho, K, labels):
    """Fewest persons to change so that p loses: search all subsets of each size, the changed
    persons moved to the most adversarial place (far along w, truncated to p0 + rho)."""
    z, t = ref_truncated(Y, p, q, rho)
    if t / 2 >= rho:
        return math.inf
    n = z.size
    for s in range(n + 1):
        combos = np.array(list(itertools.combinations(range(n), s)), dtype=np.int64).reshape(-1, max(s, 1))[:, :s]
        if s == 0:
            combos = np.zeros((1, 0), dtype=np.int64)
        zz = np.repeat(z[None, :], combos.shape[0], axis=0)
        if s:
            zz[np.arange(combos.shape[0])[:, None], combos] = rho
        means = np.stack([zz[:, labels == h].mean(axis=1) for h in range(K)], axis=1)
        med = np.median(means, axis=1)
        if np.any(np.abs(med) > np.abs(med - t)):
            return s
    return math.inf  # pragma: no cover


def ref_local_cover_1d(p, alpha, box):
    """J_p at d = 1 from its definition: p + j alpha/4, |j alpha/4| <= box, |j| alpha/4 > alpha."""
    step = alpha / 4
    reach = int(math.floor(box / step + 1e-9))
    return np.array([[p + j * step] for j in range(-reach, reach + 1) if abs(j) > 4])


def blocks(n, K):
    return np.repeat(np.arange(K), n // K)


# ----- validation ------------------------------------------------------------------------------
def test_refuses_d_above_two_and_non_finite_naming_the_parameter():
    with pytest.raises(InvalidParameterError, match="Y .*d in"):
        score(np.zeros((5, 3)), np.zeros(3), 1.0, 1.0, 3)
    bad = np.zeros((5, 1))
    bad[2, 0] = np.nan
    with pytest.raises(InvalidParameterError, match="Y must hold finite"):
        compare(bad, [0.0], [1.0], 1.0, 3)
    with pytest.raises(InvalidParameterError, match="Y_second_half"):
        pure_mean(np.zeros((4, 1)), np.full((4, 1), np.inf), 1.0, 1.0, 0.1, 1.0, 4, 1, 10.0, SeededNoise(0),
                  group_idx_first=np.zeros(4, int), group_idx_second=np.full(4, 2**31))
    with pytest.raises(InvalidParameterError, match="K"):
        compare(np.zeros((6, 1)), [0.0], [1.0], 1.0, 4)
    with pytest.raises(InvalidParameterError, match="distinct"):
        compare(np.zeros((6, 1)), [0.0], [0.0], 1.0, 3)
    with pytest.raises(InvalidParameterError, match="group_idx_first"):
        pure_mean(np.zeros((4, 1)), np.zeros((4, 1)), 1.0, 1.0, 0.1, 1.0, 4, 1, 10.0, SeededNoise(0),
                  group_idx_first=np.full(4, 2**31), group_idx_second=np.full(4, 2**31))


# ----- covers ------------------------------------------------------------------------------------
@pytest.mark.parametrize("d", [1, 2])
def test_global_grid_covers_the_box_with_radius_alpha_over_9_sqrt_d(d):
    alpha = 0.7
    grid = global_grid(alpha, d)
    assert grid.shape == ({1: 9, 2: 169}[d], d)
    assert np.all(np.abs(grid) <= alpha)
    probe = np.random.default_rng(1).uniform(-alpha, alpha, size=(4000, d))
    probe = np.vstack([probe, np.full((1, d), alpha), np.full((1, d), -alpha)])
    linf = np.max(np.abs(probe[:, None, :] - grid[None, :, :]), axis=2).min(axis=1)
    assert linf.max() <= alpha / (9 * math.sqrt(d)) * (1 + 1e-12)


def test_local_cover_matches_its_definition():
    alpha, p = 0.8, 0.3
    got = local_cover([p], alpha, box_radius=2.25 * alpha)
    want = ref_local_cover_1d(p, alpha, 2.25 * alpha)
    assert np.allclose(np.sort(got[:, 0]), np.sort(want[:, 0]))
    q2 = local_cover([0.1, -0.2], alpha)
    dist = np.linalg.norm(q2 - np.array([0.1, -0.2]), axis=1)
    assert np.all(dist > alpha * (1 - 1e-12)) and np.all(np.abs(q2 - [0.1, -0.2]) <= 2 * alpha * (1 + 1e-12))
    # count by brute force over the lattice: offsets a in [-11, 11]^2 with |a|^2 > 32
    want_count = sum(1 for a in range(-11, 12) for b in range(-11, 12) if a * a + b * b > 32)
    assert q2.shape == (want_count, 2)
    assert want_count <= (16 * math.sqrt(2) + 1) ** 2


# ----- Algorithm 5 and cost ---------------------------------------------------------------------
@pytest.mark.parametrize("d", [1, 2])
def test_compare_matches_literal_median_of_means(d):
    rng = np.random.default_rng(10 + d)
    n, K, rho = 45, 5, 0.6
    Y = rng.normal(0.0, 0.5, size=(n, d))
    labels = blocks(n, K)
    checked = 0
    for _ in range(300):
        p, q = rng.uniform(-1, 1, size=d), rng.uniform(-1, 1, size=d)
        z, t = ref_truncated(Y, p, q, rho)
        want = ref_p_wins(z, labels, K, t) if t / 2 < rho else True
        assert compare(Y, p, q, rho, K) == want
        checked += 1
    assert checked == 300


def test_compare_tie_goes_to_p():
    # every person exactly at the midpoint: median = mid, |mu - p0| = |mu - q0|, p wins
    Y = np.full((9, 1), 0.5)
    assert compare(Y, [0.0], [1.0], 2.0, 3) is True
    assert compare(Y + 1e-6, [0.0], [1.0], 2.0, 3) is False


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cost_equals_brute_force_over_changed_sets(seed):
    rng = np.random.default_rng(seed)
    n, K, rho = 12, 3, 0.9
    Y = rng.normal(0.0, 0.3, size=(n, 1))
    labels = blocks(n, K)
    for p in np.linspace(-0.6, 0.6, 7):
        for qq in (p + 0.5, p + 1.1, p - 0.7, p + 1.79, p + 2.0):
            got = comparison_cost(Y, [p], [qq], rho, K)
            assert got == brute_cost(Y, [p], [qq], rho, K, labels)


def test_cost_brute_force_in_two_dimensions():
    rng = np.random.default_rng(5)
    n, K, rho = 12, 3, 0.8
    Y = rng.normal([0.2, -0.1], 0.3, size=(n, 2))
    labels = blocks(n, K)
    for _ in range(12):
        p = rng.uniform(-0.5, 0.5, 2)
        q = p + rng.uniform(-1.0, 1.0, 2)
        assert comparison_cost(Y, p, q, rho, K) == brute_cost(Y, p, q, rho, K, labels)


def test_score_equals_brute_force_min_over_local_cover_at_d1():
    rng = np.random.default_rng(3)
    n, K, alpha, rho = 12, 3, 1.0, 0.8
    Y = rng.normal(0.1, 0.25, size=(n, 1))
    labels = blocks(n, K)
    plan = plan_fine_pure(1.0, alpha, 0.1, 1, K=K, rho=rho)
    grid, scores = grid_scores(Y, plan)
    want = []
    for p in grid[:, 0]:
        costs = [brute_cost(Y, [p], q, rho, K, labels) for q in ref_local_cover_1d(p, 8 * alpha / 9, 2 * alpha)]
        want.append(min(min(costs), n))
    assert scores.tolist() == want
    assert len(set(want)) >= 3  # a non-trivial score profile


def test_score_cap_is_n_when_no_q_can_win():
    # rho below half of the smallest ||q - p|| (> alpha): q never wins, score = n
    Y = np.random.default_rng(0).normal(size=(20, 1))
    assert score(Y, [0.0], 1.0, 0.49, 3) == 20
    assert comparison_cost(Y, [0.0], [1.2], 0.49, 3) == math.inf


# ----- sensitivity -----------------------------------------------------------------------------
def _all_scores(Y, plan, labels=None, points=None):
    grid = global_grid(plan.alpha, Y.shape[1]) if points is None else points
    return np.array([score(Y, p, plan.score_alpha, plan.rho, plan.K, labels, plan.box_radius) for p in grid])


@pytest.mark.parametrize("d", [1, 2])
def test_score_sensitivity_one_replace_one_block_groups(d):
    rng = np.random.default_rng(20 + d)
    n, K = 15, 3
    Y = rng.normal(0.05, 0.3, size=(n, d))
    plan = plan_fine_pure(1.0, 1.0, 0.1, d, K=K, rho=0.7)
    points = global_grid(1.0, d)[:: (1 if d == 1 else 6)]
    base = _all_scores(Y, plan, points=points)
    assert base.max() > 1  # something to move
    extremes = [np.full(d, 1e6), np.full(d, -1e6), np.array([1e6, -1e6][:d]), np.full(d, 1e300)]
    positions = range(n) if d == 1 else (0, 7, 14)
    for i in positions:
        for v in extremes + [Y[(i + 1) % n]]:
            Y2 = Y.copy()
            Y2[i] = v
            assert np.max(np.abs(_all_scores(Y2, plan, points=points) - base)) <= 1


def test_score_sensitivity_one_add_remove_with_hash_groups():
    rng = np.random.default_rng(31)
    n, K = 16, 3
    Y = rng.normal(0.0, 0.3, size=(n, 1))
    gidx = group_index(range(n + 1), SALT) // 2 + 2**31  # into the second half's hash range
    labels = hash_group_labels(gidx, K)
    plan = plan_fine_pure(1.0, 1.0, 0.1, 1, K=K, rho=0.7)
    base = _all_scores(Y, plan, labels[:n])
    assert base.max() > 1
    for v in (1e6, -1e6, 0.0, 0.4):  # add person n with an extreme or typical value
        Y2 = np.vstack([Y, [[v]]])
        assert np.max(np.abs(_all_scores(Y2, plan, labels) - base)) <= 1
    for i in range(n):  # remove each person
        keep = np.arange(n) != i
        assert np.max(np.abs(_all_scores(Y[keep], plan, labels[:n][keep]) - base)) <= 1


# ----- Lemma 5.1 / 5.3 behaviour ----------------------------------------------------------------
def test_point_at_mean_scores_exact_count_and_far_point_scores_zero():
    # All persons exactly at mu (d = 1): projected deviation delta = mu - p for every person.
    # Group h (size g) flips after c changes to p0 + rho when (g - c) delta + c rho > g t/2:
    # c_h = floor(g (t/2 - delta) / (rho - delta)) + 1; cost = (K+1)/2 * c_h at the nearest q.
    n, K, alpha, rho, mu = 90, 9, 1.0, 0.75, 0.0
    Y = np.full((n, 1), mu)
    g = n // K
    a_s = 8 * alpha / 9
    t_near = 5 * a_s / 4  # nearest J_p point beyond alpha' (offset 5 steps of alpha'/4)
    c_h = math.floor(g * (t_near / 2 - 0.0) / (rho - 0.0)) + 1
    assert score(Y, [mu], a_s, rho, K, box_radius=2 * alpha) == (K + 1) // 2 * c_h
    # Theta(n alpha / rho): between n alpha'/(8 rho) and n alpha'/rho
    s = score(Y, [mu], a_s, rho, K, box_radius=2 * alpha)
    assert n * a_s / (8 * rho) <= s <= n * a_s / rho
    # a far p (||p - mu|| > 9 alpha'/8 = alpha): q towards mu wins already, score 0
    assert score(Y, [mu + 1.01 * alpha], a_s, rho, K, box_radius=2 * alpha) == 0
    assert score(Y, [mu - 1.01 * alpha], a_s, rho, K, box_radius=2 * alpha) == 0


def test_gaussian_data_good_point_scores_order_n_alpha_over_rho():
    rng = np.random.default_rng(8)
    n, alpha = 2000, 1.0
    m, s = 400, 1.0
    Y = rng.normal(0.03, s / math.sqrt(m), size=(n, 2))
    plan = plan_fine_pure(1.0, alpha, 0.1, 2, m=m, scale=s)
    a_s = plan.score_alpha
    good = score(Y, [0.0, 0.0], a_s, plan.rho, plan.K, None, plan.box_radius)
    assert n * a_s / (16 * plan.rho) <= good <= n * a_s / plan.rho
    far = score(Y, [0.0, 1.1 * alpha], a_s, plan.rho, plan.K, None, plan.box_radius)
    assert far == 0


# ----- Algorithm 8: privacy plan ----------------------------------------------------------------
@pytest.mark.parametrize("d", [1, 2])
def test_pure_mean_plan_costs_exactly_epsilon_pure(d):
    eps = 0.9
    charges = pure_mean_charges(eps, d, scale=1.0, k=4, m=100, range_bound=10.0)
    got_eps, got_delta = composed_cost(charges)
    assert got_delta == 0.0
    assert math.isclose(got_eps, eps, rel_tol=1e-12)
    # independent recount: at every probe point of the hash space, the charges whose range
    # holds it sum to eps (d coordinates x eps/d on the first half; eps on the second)
    for x in np.linspace(0.0005, 0.9995, 1000):
        total = sum(c.budget.epsilon for c in charges if c.group.lo <= x < c.group.hi)
        assert math.isclose(total, eps, rel_tol=1e-12)
    Accountant(Budget(eps, 0.0)).check(charges)
    with pytest.raises(BudgetExceededError):
        Accountant(Budget(eps * (1 - 1e-9), 0.0)).check(charges)


def test_pure_mean_charges_the_accountant_and_returns_a_point():
    rng = np.random.default_rng(4)
    ids = np.arange(800)
    gi = group_index(ids, SALT)
    Y = rng.normal(1.5, 0.05, size=(800, 1))
    first, second = gi < 2**31, gi >= 2**31
    res = pure_mean(Y[first], Y[second], 1.0, 2.0, 0.1, 1.0, 4, 400, 10.0, SeededNoise(1),
                    group_idx_first=gi[first], group_idx_second=gi[second])
    assert res.delta == 0.0 and math.isclose(res.epsilon, 1.0, rel_tol=1e-12)
    assert res.estimate.shape == (1,)
    stages = [c[0] for c in res.parameters["charges"]]
    assert stages[-1] == "pure mean fine exponential mechanism" and len(stages) == 3
    # the released point is the coarse centre plus a point of the data-independent grid
    offset = res.estimate - res.coarse_center
    assert np.min(np.abs(global_grid(2.0, 1)[:, 0] - offset[0])) < 1e-12
