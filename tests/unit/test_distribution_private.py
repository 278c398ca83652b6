"""Unit tests of the batch distribution: sampling rule, sensitivities on extreme neighbours,
the simplex projection against a linear program, plans and their costs, input errors before any
charge, and outputs always on the simplex."""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest
from scipy.optimize import linprog

from dplib.budget import Accountant, Budget
from dplib.distribution.batches import (
    NumpyBatches,
    category_index,
    check_categories,
    clipped_sum_l1_sensitivity,
    clipped_sum_l2_sensitivity,
    record_keys,
)
from dplib.distribution.private import (
    DistributionPlan,
    p1_radius,
    p2_radius,
    private_distribution,
)
from dplib.distribution.simplex import project_to_simplex
from dplib.errors import BudgetExceededError, InvalidParameterError
from dplib.groups import ALL_PERSONS
from dplib.mechanisms import SeededNoise

SALT = "0f" * 32
CATS = ("A", "B", "C")  # k = 4 with OTHER


def random_counts(rng, n, k, m):
    p = rng.dirichlet(np.ones(k), size=n)
    return np.array([rng.multinomial(m, pi) for pi in p], dtype=np.int64)


def extremes(k, m):
    """Point masses on every category, the uniform-ish split and a two-category split."""
    out = [np.eye(k, dtype=np.int64)[j] * m for j in range(k)]
    u = np.full(k, m // k, dtype=np.int64)
    u[0] += m - u.sum()
    two = np.zeros(k, dtype=np.int64)
    two[0], two[-1] = m // 2, m - m // 2
    return out + [u, two]


# ---------------------------------------------------------------------------------------------
# sampling rule and category list


def test_record_key_is_sha256_of_the_documented_string():
    keys = record_keys(["p1", "p1"], ["x", "x"], SALT)
    lh = hashlib.sha256(b"x").hexdigest()
    for j in range(2):
        d = hashlib.sha256(f"{SALT}p1\x1f{lh}:{j}".encode()).hexdigest()
        assert keys[j].tolist() == [int(d[:15], 16), int(d[15:30], 16)]
    assert keys[0].tolist() != keys[1].tolist()  # identical records get distinct keys


def test_twin_keeps_m_smallest_keys_and_drops_short_persons():
    pids = ["a"] * 5 + ["b"] * 2
    vals = ["A", "B", "C", "zzz", None, "A", "A"]
    labels = [f"r{i}" for i in range(7)]
    tw = NumpyBatches(pids, vals, labels, CATS, 3, SALT)
    keys = record_keys(pids, labels, SALT)
    idx = category_index(vals, CATS)
    order = sorted(range(5), key=lambda r: (keys[r, 0], keys[r, 1], idx[r]))[:3]
    want = np.bincount(idx[order], minlength=4)
    got = tw.per_person()
    assert list(got) == ["a"] and got["a"].tolist() == want.tolist()  # b has 2 < m records
    assert category_index(["A", "zzz", None, float("nan"), "C"], CATS).tolist() == [0, 3, 3, 3, 2]


def test_sampling_is_uniform_over_salts_on_a_tiny_person():
    """One person {A, A, B, C}, m = 2: the kept pair is uniform over the 6 pairs of records, so
    P[c = (2,0,0)] = 1/6, P[(1,1,0)] = P[(1,0,1)] = 2/6, P[(0,1,1)] = 1/6 (hypergeometric)."""
    rng = np.random.default_rng(3)
    seen = {}
    trials = 1200
    for _ in range(trials):
        salt = rng.bytes(32).hex()
        tw = NumpyBatches(["p"] * 4, ["A", "A", "B", "C"], ["a", "a", "b", "c"], CATS, 2, salt)
        key = tuple(tw.counts[0][:3].tolist())
        seen[key] = seen.get(key, 0) + 1
    want = {(2, 0, 0): 1 / 6, (1, 1, 0): 2 / 6, (1, 0, 1): 2 / 6, (0, 1, 1): 1 / 6}
    assert set(seen) == set(want)
    for key, p in want.items():
        sd = math.sqrt(trials * p * (1 - p))
        assert abs(seen[key] - trials * p) < 4 * sd, (key, seen[key], trials * p)


@pytest.mark.parametrize(
    "bad, word",
    [([], "at least one"), (["A", "A"], "repeated"), (["A", "OTHER"], "reserved"), ("AB", "list"), (["A", ""], "non-empty")],
)
def test_bad_categories(bad, word):
    with pytest.raises(InvalidParameterError, match="categories") as e:
        check_categories(bad)
    assert word in str(e.value)


# ---------------------------------------------------------------------------------------------
# sensitivities on random and extreme neighbours


def test_p0_sum_sensitivity_add_remove_and_replace_one():
    rng = np.random.default_rng(0)
    k, m = 4, 7
    for trial in range(200):
        n = int(rng.integers(1, 30))
        c = random_counts(rng, n, k, m)
        extra = extremes(k, m)[trial % (k + 2)] if trial % 2 else random_counts(rng, 1, k, m)[0]
        y = c / m
        # add/remove: sum_i y_i moves by exactly ||y_new||_1 = 1
        assert np.abs((y.sum(axis=0) + extra / m) - y.sum(axis=0)).sum() == pytest.approx(1.0)
        # replace-one (n fixed): ||ybar - ybar'||_1 <= 2/n, attained by point masses apart
        c2 = c.copy()
        c2[0] = extra
        assert np.abs(y.mean(axis=0) - (c2 / m).mean(axis=0)).sum() <= 2.0 / n + 1e-12
    c = np.tile(extremes(k, m)[0], (5, 1))
    c2 = c.copy()
    c2[0] = extremes(k, m)[1]
    assert np.abs((c / m).mean(axis=0) - (c2 / m).mean(axis=0)).sum() == pytest.approx(2.0 / 5)


@pytest.mark.parametrize("norm", ["l1", "l2"])
def test_clipped_sum_sensitivity_on_neighbours(norm):
    """Adding one person (random, point mass, extreme) moves the fixed-point clipped sum by at
    most the declared sensitivity, in the declared norm; the count moves by exactly 1."""
    rng = np.random.default_rng(1)
    k, m = 4, 9
    worst = 0.0
    for trial in range(300):
        n = int(rng.integers(1, 20))
        c = random_counts(rng, n, k, m)
        extra = extremes(k, m)[trial % (k + 2)] if trial % 3 else random_counts(rng, 1, k, m)[0]
        center = project_to_simplex(rng.dirichlet(np.ones(k)))
        radius = float(rng.choice([0.05, 0.3, 1.0, 2.5]))
        g = np.zeros(n, dtype=np.int64)
        s1, n1 = NumpyBatches.from_counts(c, g, m).clipped_sum(center, radius, norm, ALL_PERSONS)
        s2, n2 = NumpyBatches.from_counts(np.vstack([c, extra]), np.zeros(n + 1, dtype=np.int64), m).clipped_sum(
            center, radius, norm, ALL_PERSONS
        )
        assert n2 - n1 == 1
        d = s2 - s1
        size = np.abs(d).sum() if norm == "l1" else np.sqrt((d * d).sum())
        bound = (clipped_sum_l1_sensitivity if norm == "l1" else clipped_sum_l2_sensitivity)(radius, k)
        assert size <= bound * (1 + 2.0**-20), (size, bound)
        worst = max(worst, size / radius)
    assert worst > 0.99  # the bound is attained (point masses far from the centre are clipped)


# ---------------------------------------------------------------------------------------------
# projection


def test_projection_is_l1_nearest_by_linear_program():
    rng = np.random.default_rng(2)
    for _ in range(40):
        k = int(rng.integers(2, 7))
        v = rng.normal(0.2, 0.5, size=k) * rng.choice([1.0, 10.0])
        p = project_to_simplex(v)
        assert np.all(p >= 0) and math.fsum(p) == pytest.approx(1.0, abs=1e-12)
        # LP: min sum t s.t. -t <= q - v <= t, q >= 0, sum q = 1
        cost = np.r_[np.zeros(k), np.ones(k)]
        eye = np.eye(k)
        a_ub = np.block([[eye, -eye], [-eye, -eye]])
        b_ub = np.r_[v, -v]
        a_eq = np.r_[np.ones(k), np.zeros(k)][None, :]
        lp = linprog(cost, A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=[1.0], bounds=[(0, None)] * (2 * k))
        assert np.abs(p - v).sum() == pytest.approx(lp.fun, abs=1e-9)
    assert project_to_simplex(np.array([-1.0, -2.0, 0.0])).tolist() == pytest.approx([1 / 3] * 3)


# ---------------------------------------------------------------------------------------------
# plans, costs, errors


def test_plan_costs_and_boundary():
    for est, delta in (("P0", 0.0), ("P1", 0.0), ("P2", 1e-6)):
        for mode in ("parallel", "sequential"):
            plan = DistributionPlan(Budget(0.8, 1e-6), CATS, 5, est, budget_mode=mode)
            cost = plan.cost()
            assert (cost.epsilon, cost.delta) == (pytest.approx(0.8), pytest.approx(delta))
            Accountant(Budget(0.8, 1e-6)).check(plan.charges())  # exact budget accepted
            with pytest.raises(BudgetExceededError):
                Accountant(Budget(0.8 * (1 - 1e-9), 1e-6)).check(plan.charges())
    seq = DistributionPlan(Budget(1.0), CATS, 5, "P1", budget_mode="sequential").stage_budgets
    assert [b.epsilon for b in seq.values()] == [0.25, 0.75]
    par = DistributionPlan(Budget(1.0), CATS, 5, "P1").groups
    a, b = par.values()
    assert a.hi == b.lo and a.lo == 0.0 and b.hi == 1.0  # disjoint hash ranges


@pytest.mark.parametrize(
    "kwargs, word",
    [
        ({"categories": ()}, "categories"),
        ({"categories": ("A", "A")}, "categories"),
        ({"m": 0}, "m "),
        ({"m": 2.5}, "m "),
        ({"estimator": "P4"}, "estimator"),
        ({"estimator": "P2"}, "delta"),
        ({"eta": 0.7}, "eta"),
        ({"omega": -0.1}, "omega"),
        ({"beta": 0.0}, "beta"),
    ],
)
def test_plan_errors_name_the_parameter(kwargs, word):
    args = {"budget": Budget(1.0), "categories": CATS, "m": 5, **kwargs}
    with pytest.raises(InvalidParameterError, match=word):
        DistributionPlan(**args)


def test_epsilon_must_be_positive():
    for eps in (0.0, -1.0, float("nan")):
        with pytest.raises(InvalidParameterError, match="epsilon"):
            DistributionPlan(Budget(eps), CATS, 5)


def test_mismatched_backend_refused_before_any_charge():
    tw = NumpyBatches.from_counts(np.array([[5, 0, 0, 0]]), np.array([0]), 5)
    acc = Accountant(Budget(1.0))
    with pytest.raises(InvalidParameterError, match="m=5"):
        private_distribution(tw, DistributionPlan(Budget(1.0), CATS, 6), SeededNoise(0), acc)
    with pytest.raises(InvalidParameterError, match="k=3"):
        private_distribution(tw, DistributionPlan(Budget(1.0), ("A", "B"), 5), SeededNoise(0), acc)
    with pytest.raises(BudgetExceededError):
        private_distribution(tw, DistributionPlan(Budget(2.0), CATS, 5), SeededNoise(0), acc)
    assert acc.charges == []


# ---------------------------------------------------------------------------------------------
# outputs


@pytest.mark.parametrize("est", ["P0", "P1", "P2"])
def test_output_always_on_the_simplex(est):
    rng = np.random.default_rng(5)
    for trial in range(60 if est != "P2" else 16):  # P2's analytic-Gaussian calibration is slower
        n = int(rng.choice([1, 2, 10, 300]))
        m = int(rng.choice([1, 3, 40]))
        c = random_counts(rng, n, 4, m) if trial % 2 else np.tile(extremes(4, m)[trial % 4], (n, 1))
        tw = NumpyBatches.from_counts(c, rng.integers(0, 2**32, size=n), m)
        eps = float(rng.choice([0.01, 1.0, 50.0]))
        plan = DistributionPlan(Budget(eps, 1e-6), CATS, m, est, budget_mode=rng.choice(["parallel", "sequential"]))
        rel = private_distribution(tw, plan, SeededNoise(trial))
        assert rel.estimate.shape == (4,) and np.all(rel.estimate >= 0)
        assert math.fsum(rel.estimate) == pytest.approx(1.0, abs=1e-12)
        assert rel.categories == ["A", "B", "C", "OTHER"]
        assert rel.epsilon == pytest.approx(eps) and rel.delta == (1e-6 if est == "P2" else 0.0)


def test_radii_closed_forms():
    assert p1_radius(4, 100, 1000, 0.05, 0.1) == pytest.approx(
        math.sqrt(2 * (4 * math.log(2) + math.log(2 * 1000 / 0.05)) / 100) + 0.1
    )
    assert p1_radius(20, 5, 1e6, 0.05, 0.3) == 2.0
    assert p2_radius(100, 0.1) == pytest.approx(0.4)
    assert p2_radius(1, 0.5) == pytest.approx(math.sqrt(2))


def test_batch_bars_cover_the_exact_statistic_with_power():
    """Issue 19: the P0 bar (m = 1 draw per person) covers the exact statistic of the persons it
    reads (each one's shares over ALL of their records) in >= 80% of 50 seeded runs x 3 categories
    (nominal 90%; the benchmark benchmarks/distribution_bars.py measures 0.89-1.0 at 200 seeds); the
    noise-only bar it replaced (Laplace quantile / n) covers far less (the power check: < 60%)."""
    from dplib.distribution.private import batch_error_bar

    rng = np.random.default_rng(21)
    cats = ["A", "B"]
    m_i = rng.integers(1, 21, 1500)
    prefs = rng.dirichlet([1.0, 1.0, 1.0], 1500)
    ids, vals = [], []
    for i in range(1500):
        ids += [f"p{i}"] * int(m_i[i])
        vals += [["A", "B", "Z"][j] for j in rng.choice(3, int(m_i[i]), p=prefs[i])]
    counts = np.zeros((1500, 3))
    for p, v in zip(ids, vals):
        counts[int(p[1:]), {"A": 0, "B": 1}.get(v, 2)] += 1
    truth = (counts / counts.sum(1, keepdims=True)).mean(0)
    labels = [str(i) for i in range(len(ids))]
    hits, old_hits = 0, 0
    for s in range(50):
        tw = NumpyBatches(ids, vals, labels, cats, 1, f"{s + 3:064x}")
        rel = private_distribution(tw, DistributionPlan(Budget(1.0), cats, 1, "P0"), SeededNoise([31, s]))
        err = np.abs(rel.estimate - truth)
        hits += int(np.sum(err <= rel.error_bar))
        old = rel.parameters["laplace_scale_of_sum"] * math.log(10.0) / rel.parameters["noisy_person_count"]
        old_hits += int(np.sum(err <= old))
    assert hits / 150 >= 0.8, hits
    assert old_hits / 150 < 0.6, old_hits
    # closed form: no noise, p = 1/2 everywhere, m = 1, n = 400, every person read: 1.645 sqrt(1/4 / 400)
    np.testing.assert_allclose(batch_error_bar(np.full(2, 0.5), 0.0, 400.0, 1, 1.0), 1.6448536269514722 * 0.025)
    # total on extreme DP outputs: capped at 1
    assert np.all(batch_error_bar(np.array([np.nan, 1.0]), 1e300, 1.0, 1, 0.5) == 1.0)
