"""Unit tests of the multivariate person-level mean (:mod:`dplib.mean.multivariate`) and of the
new aggregates it uses (``histograms``, ``log_histograms``, ``clipped_sum(..., scales=)``).

What is checked, and against what independent oracle:

1. Planner with T >= 2 (public inputs found by a deterministic search; extra layers pay off
   with parallel composition, or near the n ~ d/eps frontier), then a full run:
   T charges of the whole TCN budget on disjoint sub-ranges whose union is the TCN range, and
   each layer's ``clipped_sum`` reads exactly the persons of its sub-range (recording proxy,
   persons counted from the group indices with our own integer bounds).
2. The planner reads no data: different data, same public inputs -> the same schedule; the plan
   and ``plan_threads`` never touch a backend that raises on any call; ``plan_threads`` is pure.
3. ``plan.cost()`` equals ``composed_cost`` of what the accountant recorded, and both equal the
   (max over disjoint groups | sum) of the stage budgets computed here from the documented split
   (docs/privacy/multivariate_mean.md).
4. Sensitivities on extreme neighbours (one person at +-1e300, 0, a bin edge, NaN):
   scaled clipped sum (l2 <= clipped_sum_l2_sensitivity, finite), the joint ``(S, w n)`` vector
   released by ``clip_and_noise`` (the sigma it draws is large enough, by our own Balle-Wang
   delta), histograms / log-histograms (one bin of each coordinate moves by exactly 1), count (1).
5. ``coordinate_budget`` against our own exact homogeneous-composition privacy profile (Kairouz-
   Oh-Viswanath / Murtagh-Vadhan) and the Dwork-Rothblum-Vadhan bound.
6. Bad inputs raise InvalidParameterError naming the parameter, before any charge.
7. INSUFFICIENT_DATA: the charged budget stays charged, no estimate, no Gaussian noise drawn.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import gammaln, logsumexp
from scipy.stats import norm

from dplib.aggregates import (
    MAX_BINS_FROM_OFFSET,
    MIN_EXPONENT,
    NumpyAggregates,
    clipped_sum_l2_sensitivity,
)
from dplib.budget import Accountant, Budget, composed_cost
from dplib.errors import InvalidParameterError
from dplib.groups import GroupRange
from dplib.mean.multivariate import (
    COUNT_WEIGHT,
    STAGE_COARSE,
    STAGE_COUNT,
    STAGE_FINAL,
    STAGE_RANGES,
    STAGE_TCN,
    STATUS_INSUFFICIENT,
    STATUS_OK,
    MultivariateMeanPlan,
    clip_and_noise,
    coarse_error_bound,
    coordinate_budget,
    max_threads,
    multivariate_person_mean,
    plan_threads,
)
from dplib.mean.params import bin_width_constant
from dplib.mechanisms import SeededNoise

HASH = 2**32
EPS, DELTA = 1.0, 1e-6


# ------------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------------


def _cols(d: int) -> list[str]:
    return [f"x{j}" for j in range(d)]


def _backend(values: np.ndarray, gi: np.ndarray) -> NumpyAggregates:
    return NumpyAggregates({c: values[:, j] for j, c in enumerate(_cols(values.shape[1]))}, gi)


def _int_bounds(group: GroupRange) -> tuple[int, int]:
    """Our own integer bounds of a range (floor(lo * 2**32), floor(hi * 2**32))."""
    return math.floor(group.lo * HASH), math.floor(group.hi * HASH)


def _in(gi: np.ndarray, group: GroupRange) -> np.ndarray:
    lo, hi = _int_bounds(group)
    return (gi >= lo) & (gi < hi)


class RecordingBackend:
    """Proxy: forwards to a backend and records (method, group, extra args, result size)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.calls: list[dict] = []

    def count(self, columns, group):
        out = self.inner.count(columns, group)
        self.calls.append({"method": "count", "group": group})
        return out

    def histograms(self, columns, bin_widths, offsets, group):
        out = self.inner.histograms(columns, bin_widths, offsets, group)
        self.calls.append({"method": "histograms", "group": group, "persons": sum(out[0].values())})
        return out

    def log_histograms(self, columns, centers, group, sub_edges=()):
        out = self.inner.log_histograms(columns, centers, group, sub_edges)
        self.calls.append({"method": "log_histograms", "group": group, "persons": sum(out[0].values())})
        return out

    def clipped_sum(self, columns, center, radius, group, scales=None):
        s, n = self.inner.clipped_sum(columns, center, radius, group, scales=scales)
        self.calls.append({"method": "clipped_sum", "group": group, "radius": radius, "persons": n})
        return s, n


class RaisingBackend:
    """A backend that fails the test if anything asks it for data (the schema check
    ``check_columns`` reads no data and is allowed)."""

    def check_columns(self, columns):
        return None

    def __getattr__(self, name):
        def boom(*args, **kwargs):
            raise AssertionError(f"backend.{name} was called")

        return boom


class RecordingNoise:
    """SeededNoise that keeps the exact vectors and scales it was given (tests only)."""

    name = "recording"
    secure = False

    def __init__(self, seed) -> None:
        self.inner = SeededNoise(seed)
        self.gaussian: list[tuple[np.ndarray, float]] = []
        self.laplace: list[tuple[np.ndarray, float]] = []

    def add_laplace(self, values, scale):
        self.laplace.append((np.array(values, dtype=float), float(scale)))
        return self.inner.add_laplace(values, scale)

    def add_gaussian(self, values, sigma):
        self.gaussian.append((np.array(values, dtype=float), float(sigma)))
        return self.inner.add_gaussian(values, sigma)


def _balle_wang_delta(sigma: float, sens: float, eps: float) -> float:
    """delta(eps) of N(0, sigma^2) with l2 sensitivity ``sens`` (Balle & Wang 2018, Thm 8)."""
    a, b = sens / (2 * sigma), eps * sigma / sens
    return float(norm.cdf(a - b) - math.exp(eps + norm.logcdf(-a - b)))


# Public inputs of a run where the planner picks T >= 2 (parallel composition, large
# d, n_TCN * eps near the d / eps frontier) and the coarse stage still has enough persons.
# Found by the deterministic grid below (iid mode with large m keeps the bins tight).
_T2_GRID = [
    # (d, m, n, k, eps, fractions coarse/TCN/final)
    (100, 64, 20000, 3.0, 0.5, (0.5, 0.3, 0.2)),
    (200, 64, 20000, 4.0, 0.5, (0.5, 0.3, 0.2)),
    (50, 16, 10000, 4.0, 0.3, (0.15, 0.6, 0.25)),
]


def _t2_plan(d, m, n, k, eps, fr, mode="parallel"):
    return MultivariateMeanPlan(
        Budget(eps, DELTA), d, k=k, mode="iid", m=m, scales=(1.0,) * d, expected_persons=float(n),
        budget_mode=mode,
        fractions=((STAGE_COARSE, fr[0]), (STAGE_TCN, fr[1]), (STAGE_FINAL, fr[2])),
    )


def _schedule_of(plan: MultivariateMeanPlan):
    """The schedule the estimator must use, from public inputs only (declared scales)."""
    n = plan.expected_persons
    g, b = plan.groups, plan.stage_budgets
    r0 = coarse_error_bound([bin_width_constant(plan.k) / math.sqrt(plan.m_model)] * plan.d)
    return plan_threads(
        n * g[STAGE_TCN].fraction, n * g[STAGE_FINAL].fraction, plan.d, plan.m_model, plan.k,
        b[STAGE_TCN], b[STAGE_FINAL], r0, plan.budget_mode,
    )


@pytest.fixture(scope="module")
def t2_inputs():
    for cfg in _T2_GRID:
        plan = _t2_plan(*cfg)
        if _schedule_of(plan).threads >= 2:
            return cfg
    pytest.fail("no public input of the grid makes the planner choose T >= 2")  # pragma: no cover


def _iid_persons(seed: int, n: int, d: int, m: int, mu_scale: float = 3.0):
    rng = np.random.default_rng(seed)
    mu = rng.uniform(-mu_scale, mu_scale, size=d)
    y = mu + rng.normal(size=(n, d)) / math.sqrt(m)  # person means of m unit-variance records
    gi = rng.integers(0, HASH, size=n)
    return y, gi, mu


# ------------------------------------------------------------------------------------------------
# 1. T >= 2: a full run with T disjoint layer groups
# ------------------------------------------------------------------------------------------------


def test_planner_chooses_several_threads_and_layers_run_on_disjoint_subranges(t2_inputs):
    d, m, n, k, eps, fr = t2_inputs
    plan = _t2_plan(*t2_inputs)
    schedule = _schedule_of(plan)
    T = schedule.threads
    assert 2 <= T <= max_threads(d, k)
    # the chosen T has the smallest predicted bound among the candidates
    assert dict(schedule.candidates)[T] == min(r for _, r in schedule.candidates)

    y, gi, mu = _iid_persons(5, n, d, m)
    rec = RecordingBackend(_backend(y, gi))
    acc = Accountant(plan.budget)
    out = multivariate_person_mean(rec, _cols(d), plan, SeededNoise(17), acc)
    assert out.status == STATUS_OK
    assert out.parameters["schedule"]["threads"] == T
    assert out.parameters["schedule"]["layer_radii"] == list(schedule.radii)

    # accountant: coarse, T layers with the whole TCN budget each, final
    tcn_lo, tcn_hi = fr[0], fr[0] + fr[1]
    stages = [c.stage for c in acc.charges]
    assert stages == [STAGE_COARSE] + [f"{STAGE_TCN} layer {t}/{T}" for t in range(1, T + 1)] + [STAGE_FINAL]
    layers = acc.charges[1 : 1 + T]
    for c in layers:
        assert (c.budget.epsilon, c.budget.delta) == (eps, DELTA)  # parallel: full budget per layer
    # disjoint consecutive sub-ranges of equal size covering exactly the TCN range
    assert layers[0].group.lo == pytest.approx(tcn_lo, abs=1e-15)
    assert layers[-1].group.hi == pytest.approx(tcn_hi, abs=1e-15)
    for a, b in zip(layers, layers[1:]):
        assert a.group.hi == b.group.lo
    for c in layers:
        assert c.group.fraction == pytest.approx(fr[1] / T, rel=1e-12)

    # each layer's clipped_sum read exactly the persons of its sub-range
    sums = [c for c in rec.calls if c["method"] == "clipped_sum"]
    assert len(sums) == T + 1
    for call, charge, rho in zip(sums[:T], layers, schedule.radii):
        assert call["group"] == charge.group
        assert call["radius"] == rho
        assert call["persons"] == int(np.sum(_in(gi, charge.group)))
    assert sums[-1]["persons"] == int(np.sum(_in(gi, GroupRange(tcn_hi, 1.0))))
    # the layer sub-ranges hold disjoint persons that together are the TCN group's persons
    masks = [_in(gi, c.group) for c in layers]
    assert np.all(sum(mk.astype(int) for mk in masks) <= 1)
    assert np.array_equal(np.any(masks, axis=0), _in(gi, GroupRange(tcn_lo, tcn_hi)))
    # and the run is accurate (sanity, not the point of the test): within 10x the model bound
    err = np.linalg.norm(out.estimate - mu)
    assert err < 10 * out.parameters["model_error_bound_l2"]


# ------------------------------------------------------------------------------------------------
# 2. the planner never reads data
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scales", [(1.0, 2.0, 0.5), None], ids=["declared", "private"])
def test_schedule_does_not_depend_on_data(scales):
    d = 3
    plan = MultivariateMeanPlan(Budget(EPS, DELTA), d, scales=scales, expected_persons=6000.0)
    rng = np.random.default_rng(0)
    sc = np.array(scales if scales is not None else (1.0, 1.0, 1.0))
    # three populations with other means, shapes and numbers of persons (spreads within the
    # declared scales, so that every run gets past the coarse stage)
    datasets = [
        (rng.normal(0.0, 1.0, size=(6000, d)) * sc, rng.integers(0, HASH, 6000)),
        (rng.uniform(-1.5, 1.5, size=(9000, d)) * sc + 1e4, rng.integers(0, HASH, 9000)),
        (rng.standard_t(5, size=(4000, d)) * sc * 0.7 - 300.0, rng.integers(0, HASH, 4000)),
    ]
    schedules = []
    for i, (y, gi) in enumerate(datasets):
        out = multivariate_person_mean(_backend(y, gi), _cols(d), plan, SeededNoise(i))
        assert out.status == STATUS_OK
        schedules.append(out.parameters["schedule"])
        # r0 is public: 1.5 r'_j per coordinate in normalised units (Theorem 4.19), with
        # r'_j = c_r(k) (declared scales) or one bin of the rough scale (private scales)
        per_coord = bin_width_constant(plan.k) if scales is not None else 1.0
        assert out.parameters["coarse_error_bound"] == pytest.approx(1.5 * per_coord * math.sqrt(d), rel=1e-12)
    assert schedules[0] == schedules[1] == schedules[2]
    if scales is not None:
        assert schedules[0] == _schedule_of(plan).describe()


def test_plan_and_planner_never_touch_a_backend(t2_inputs):
    _ = RaisingBackend()  # exists, is never handed to the planner; any call would fail
    plan = _t2_plan(*t2_inputs)
    first = (plan.cost(), plan.describe(), plan.charges(), _schedule_of(plan))
    again = (plan.cost(), plan.describe(), plan.charges(), _schedule_of(plan))
    assert first == again  # pure: same inputs, same outputs, every time
    # a plan that does not fit the accountant is refused before the backend is asked anything
    from dplib.errors import BudgetExceededError

    acc = Accountant(Budget(plan.budget.epsilon * 0.999, plan.budget.delta))
    with pytest.raises(BudgetExceededError):
        multivariate_person_mean(RaisingBackend(), _cols(plan.d), plan, SeededNoise(0), acc)
    assert acc.charges == []


def test_plan_threads_is_a_pure_function_of_its_arguments():
    args = (4000.0, 12000.0, 50, 4, 4.0, Budget(1.0, 1e-6), Budget(1.0, 1e-6), 60.0, "parallel")
    a, b = plan_threads(*args), plan_threads(*args)
    assert a == b
    assert a.threads >= 2  # r0 far above sqrt(d/m): contraction pays off
    # monotone sanity of the model: more persons never give a larger predicted bound
    c = plan_threads(40000.0, 120000.0, *args[2:])
    assert c.final_bound < a.final_bound


# ------------------------------------------------------------------------------------------------
# 3. cost before the run == what the accountant records
# ------------------------------------------------------------------------------------------------


def _expected_cost(plan: MultivariateMeanPlan) -> tuple[float, float]:
    """Parallel: every stage on disjoint persons -> max of the stage budgets; sequential: sum."""
    b = plan.stage_budgets
    if plan.budget_mode == "parallel":
        return max(x.epsilon for x in b.values()), max(x.delta for x in b.values())
    return math.fsum(x.epsilon for x in b.values()), math.fsum(x.delta for x in b.values())


@pytest.mark.parametrize("budget_mode", ["parallel", "sequential"])
@pytest.mark.parametrize("scales", [(1.0, 1.0), None], ids=["declared", "private"])
@pytest.mark.parametrize("expected_persons", [8000.0, None], ids=["public-n", "dp-n"])
def test_cost_before_run_equals_accountant(budget_mode, scales, expected_persons):
    plan = MultivariateMeanPlan(
        Budget(EPS, DELTA), 2, scales=scales, expected_persons=expected_persons, budget_mode=budget_mode
    )
    before = plan.cost()
    y = np.random.default_rng(1).normal(4.0, 2.0, size=(8000, 2))
    gi = np.random.default_rng(2).integers(0, HASH, 8000)
    acc = Accountant(plan.budget)
    out = multivariate_person_mean(_backend(y, gi), _cols(2), plan, SeededNoise(3), acc)
    assert out.status == STATUS_OK
    recorded = composed_cost(acc.charges)
    assert (before.epsilon, before.delta) == pytest.approx(recorded, rel=1e-12)
    assert (out.epsilon, out.delta) == pytest.approx(recorded, rel=1e-12)
    exp = _expected_cost(plan)
    assert recorded == pytest.approx(exp, rel=1e-12)
    # both modes spend exactly the configured (epsilon, delta), as a pair
    assert recorded == pytest.approx((EPS, DELTA), rel=1e-12)
    b = plan.stage_budgets
    if budget_mode == "sequential":  # shares of (eps, delta) = the stage fractions (most to the final stage)
        fr = dict(plan.fractions)
        assert b[STAGE_TCN] == Budget(EPS * fr[STAGE_TCN], DELTA * fr[STAGE_TCN])
        assert b[STAGE_FINAL] == Budget(EPS * fr[STAGE_FINAL], DELTA * fr[STAGE_FINAL])
        assert fr[STAGE_FINAL] >= 0.6
        for c in acc.charges:  # sequential charges are on every person, and so are the reads
            assert c.group == plan.group
        assert all(g == plan.group for g in plan.groups.values())
    else:
        for c in acc.charges:
            assert c.budget.epsilon == EPS
    if expected_persons is None:
        assert acc.charges[0].stage == STAGE_COUNT and acc.charges[0].budget.delta == 0.0


def test_cost_with_several_threads_equals_accountant(t2_inputs):
    plan = _t2_plan(*t2_inputs)
    d, m, n = t2_inputs[0], t2_inputs[1], t2_inputs[2]
    y, gi, _ = _iid_persons(8, n, d, m)
    acc = Accountant(plan.budget)
    out = multivariate_person_mean(_backend(y, gi), _cols(d), plan, SeededNoise(4), acc)
    assert out.status == STATUS_OK and out.parameters["schedule"]["threads"] >= 2
    assert (plan.cost().epsilon, plan.cost().delta) == pytest.approx(composed_cost(acc.charges), rel=1e-12)
    assert composed_cost(acc.charges) == pytest.approx((t2_inputs[4], DELTA), rel=1e-12)


# ------------------------------------------------------------------------------------------------
# 4. sensitivities on extreme neighbours
# ------------------------------------------------------------------------------------------------

EXTREME_PERSONS = [
    [1e300, -1e300, 0.0],
    [-1e300, -1e300, -1e300],
    [1e300, 1e300, 1e300],
    [0.0, 0.0, 0.0],
    [2.0, -1.0, 0.5],  # exactly the centre below
    [1e-300, 5e299, -7.0],
]
CENTER = np.array([2.0, -1.0, 0.5])


def _l2(a, b) -> float:
    diff = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    assert np.all(np.isfinite(diff))
    # scaled norm: no overflow in the check itself
    s = np.max(np.abs(diff))
    return 0.0 if s == 0 else float(s * np.sqrt(np.sum((diff / s) ** 2)))


def _small_base(seed: int, n: int = 80, d: int = 3):
    rng = np.random.default_rng(seed)
    y = rng.normal(1.0, 3.0, size=(n, d))
    y[rng.random(n) < 0.05, d - 1] = np.nan
    return y, rng.integers(0, HASH, n)


@pytest.mark.parametrize(
    "scales",
    [(1.0, 1.0, 1.0), (0.5, 2.0, 1e-3), (1e-12, 1.0, 1e6)],
    ids=["unit", "mixed", "tiny-huge"],
)
@pytest.mark.parametrize("radius", [0.3, 5.0])
def test_scaled_clipped_sum_sensitivity_extreme_neighbours(scales, radius):
    """Add one extreme person (scaled units) and remove each person: the clipped sum moves by at
    most ``clipped_sum_l2_sensitivity(radius, d)`` in l2, and stays finite."""
    y, gi = _small_base(0)
    sc = np.array(scales)
    bound = clipped_sum_l2_sensitivity(radius, 3)
    base, n0 = _backend(y, gi).clipped_sum(_cols(3), CENTER, radius, GroupRange(0.0, 1.0), scales=sc)
    assert np.all(np.isfinite(base))
    for p in EXTREME_PERSONS:
        s1, n1 = _backend(np.vstack([y, p]), np.append(gi, 12345)).clipped_sum(
            _cols(3), CENTER, radius, GroupRange(0.0, 1.0), scales=sc
        )
        assert n1 == n0 + 1
        assert np.all(np.isfinite(s1)), f"person {p}: non-finite sum"
        assert _l2(s1, base) <= bound, f"person {p}: l2 change {_l2(s1, base)} > {bound}"
    for i in range(0, y.shape[0], 7):
        s1, _ = _backend(np.delete(y, i, 0), np.delete(gi, i)).clipped_sum(
            _cols(3), CENTER, radius, GroupRange(0.0, 1.0), scales=sc
        )
        assert _l2(s1, base) <= bound


@pytest.mark.parametrize("radius", [0.7, 40.0])
def test_clip_and_noise_joint_release_sensitivity(radius):
    """The exact (S, w n) handed to the Gaussian moves by at most sqrt(rho^2 + (rho/4)^2)
    (docs/privacy/multivariate_mean.md) between extreme neighbours, and the sigma drawn is
    (eps, delta)-DP for the largest move observed, by our own Balle-Wang delta."""
    y, gi = _small_base(1)
    sc = np.array([0.5, 2.0, 1e-3])
    group = GroupRange(0.0, 1.0)

    def exact_vec(values, gidx):
        noise = RecordingNoise(0)
        clip_and_noise(_backend(values, gidx), _cols(3), CENTER, radius, sc, group, Budget(EPS, DELTA), noise)
        (vec, sigma), = noise.gaussian
        return vec, sigma

    base, sigma = exact_vec(y, gi)
    assert base.shape == (4,)
    n0 = int(np.sum(~np.any(np.isnan(y), axis=1)))
    assert base[-1] == pytest.approx(COUNT_WEIGHT * radius * n0, rel=1e-15)
    worst = 0.0
    for p in EXTREME_PERSONS:
        v1, s1 = exact_vec(np.vstack([y, p]), np.append(gi, 999))
        assert s1 == sigma  # sigma is a function of public inputs only
        worst = max(worst, _l2(v1, base))
    declared = math.hypot(radius, radius / 4)
    assert worst <= declared * (1 + 1e-9)
    assert worst >= 0.99 * declared  # the extreme persons really reach the bound
    assert _balle_wang_delta(sigma, declared, EPS) <= DELTA


@pytest.mark.parametrize("d", [1, 3])
def test_histograms_one_bin_per_coordinate(d):
    y, gi = _small_base(2, d=d)
    widths = [0.5, 2.0, 1e-3][:d]
    offsets = [0.25, -1.0, 0.0][:d]
    base = _backend(y, gi).histograms(_cols(d), widths, offsets, GroupRange(0.0, 1.0))
    extra = [[1e300] * d, [-1e300] * d, [0.0] * d, [offsets[j] + 3 * widths[j] for j in range(d)]]
    for p in extra:
        h1 = _backend(np.vstack([y, p]), np.append(gi, 7)).histograms(_cols(d), widths, offsets, GroupRange(0.0, 1.0))
        for j in range(d):
            keys = set(base[j]) | set(h1[j])
            diff = {k: h1[j].get(k, 0) - base[j].get(k, 0) for k in keys}
            changed = {k: v for k, v in diff.items() if v}
            # independent bin: floor((clamp(y) - off) / w), clamp at off +- 2**40 w
            span = MAX_BINS_FROM_OFFSET * widths[j]
            yj = min(max(p[j], offsets[j] - span), offsets[j] + span)
            assert changed == {math.floor((yj - offsets[j]) / widths[j]): 1}
    # extremes land in the edge bins; a value on an edge opens the bin to its right
    h = _backend(np.array([[1e300] * d, [-1e300] * d, [offsets[j] + 3 * widths[j] for j in range(d)]]),
                 np.array([1, 2, 3])).histograms(_cols(d), widths, offsets, GroupRange(0.0, 1.0))
    for j in range(d):
        assert h[j] == {2**40: 1, -(2**40): 1, 3: 1}
    # a person missing one coordinate is in no histogram; a person outside the group in none
    miss = [np.nan] + [5.0] * (d - 1)
    h2 = _backend(np.vstack([y, miss]), np.append(gi, 7)).histograms(_cols(d), widths, offsets, GroupRange(0.0, 1.0))
    assert h2 == base
    g = GroupRange(0.0, 0.5)
    h3 = _backend(np.vstack([y, [1.0] * d]), np.append(gi, HASH - 1)).histograms(_cols(d), widths, offsets, g)
    assert h3 == _backend(y, gi).histograms(_cols(d), widths, offsets, g)


def _log_key(x: float, n_sub: int = 1, edges=()) -> int:
    """Independent log-bin key from math.frexp: |x| = f 2**e', f in [0.5, 1) -> floor(log2) = e' - 1."""
    a = abs(x)
    if a < 2.0**MIN_EXPONENT:
        return 0
    f, e = math.frexp(a)
    e -= 1
    frac = a / 2.0**e
    sub = sum(frac >= t for t in edges)
    return int(math.copysign(1, x)) * (1 + (e - MIN_EXPONENT) * n_sub + sub)


@pytest.mark.parametrize("edges", [(), (2**0.25, 2**0.5, 2**0.75)], ids=["octave", "quarter"])
def test_log_histograms_one_bin_per_coordinate(edges):
    d = 3
    y, gi = _small_base(3, d=d)
    centers = [0.0, 1.0, -2.5]
    base = _backend(y, gi).log_histograms(_cols(d), centers, GroupRange(0.0, 1.0), edges)
    extra = [[1e300, -1e300, 0.0], [0.0, 1.0, -2.5], [0.125, 1.0 + 2**-3, -2.5 - 2**0.5], [-1e300, 5e-324, 1e300]]
    for p in extra:
        h1 = _backend(np.vstack([y, p]), np.append(gi, 11)).log_histograms(_cols(d), centers, GroupRange(0.0, 1.0), edges)
        for j in range(d):
            keys = set(base[j]) | set(h1[j])
            changed = {k: h1[j].get(k, 0) - base[j].get(k, 0) for k in keys if h1[j].get(k, 0) != base[j].get(k, 0)}
            x = min(max(p[j], -1e300), 1e300) - centers[j]
            assert changed == {_log_key(x, len(edges) + 1, edges): 1}, (p, j)


def test_count_stage_sensitivity_one():
    y, gi = _small_base(4)
    b0 = _backend(y, gi).count(_cols(3), GroupRange(0.0, 1.0))
    for p in EXTREME_PERSONS:
        assert _backend(np.vstack([y, p]), np.append(gi, 3)).count(_cols(3), GroupRange(0.0, 1.0)) == b0 + 1
    assert _backend(np.vstack([y, [1.0, np.nan, 1.0]]), np.append(gi, 3)).count(_cols(3), GroupRange(0.0, 1.0)) == b0
    # the count stage's Laplace scale is >= 1 / epsilon (l1 sensitivity 1)
    plan = MultivariateMeanPlan(Budget(EPS, DELTA), 3, scales=(1.0, 1.0, 1.0))
    noise = RecordingNoise(0)
    yy = np.random.default_rng(0).normal(size=(6000, 3))
    multivariate_person_mean(_backend(yy, np.random.default_rng(1).integers(0, HASH, 6000)), _cols(3), plan, noise)
    (vec, scale) = noise.laplace[0]
    assert vec.shape == (1,) and scale >= 1.0 / EPS


# ------------------------------------------------------------------------------------------------
# 5. coordinate_budget
# ------------------------------------------------------------------------------------------------


def _log_binom(k: int, l: np.ndarray) -> np.ndarray:
    return gammaln(k + 1) - gammaln(l + 1) - gammaln(k - l + 1)


def _exact_composed_delta(eps0: float, delta0: float, k: int, eps: float) -> float:
    """Exact delta(eps) of the k-fold composition of (eps0, delta0)-DP mechanisms (Kairouz, Oh,
    Viswanath 2015, Thm 3.3 / Murtagh-Vadhan): 1 - (1 - delta0)^k (1 - delta_RR(eps)) with
    delta_RR(eps) = sum_l C(k,l) max(0, e^{(k-l) eps0} - e^{eps + l eps0}) / (1 + e^{eps0})^k."""
    l = np.arange(k + 1)
    a = (k - l) * eps0
    b = eps + l * eps0
    pos = a > b
    if not np.any(pos):
        rr = 0.0
    else:
        # log(e^a - e^b) = a + log1p(-e^{b-a})
        terms = _log_binom(k, l[pos]) + a[pos] + np.log1p(-np.exp(b[pos] - a[pos])) - k * np.logaddexp(0, eps0)
        rr = float(np.exp(logsumexp(terms)))
    return 1.0 - (1.0 - delta0) ** k * (1.0 - rr)


def _drv_eps(eps0: float, k: int, delta_slack: float) -> float:
    return eps0 * math.sqrt(2 * k * math.log(1 / delta_slack)) + k * eps0 * math.expm1(eps0)


@pytest.mark.parametrize("eps,delta,d", [(1.0, 1e-6, 2), (1.0, 1e-6, 5), (0.5, 1e-6, 30), (1.0, 1e-6, 50),
                                          (1.0, 1e-6, 100), (0.3, 1e-9, 64), (4.0, 1e-6, 20), (1.0, 1e-3, 10)])
def test_coordinate_budget_composes_within_budget(eps, delta, d):
    e1, d1 = coordinate_budget(eps, delta, d)
    basic = (eps / d, delta / d)
    # our own largest DRV per-step epsilon with delta0 = delta / 2, delta' = delta / (2d)
    lo, hi = 0.0, eps
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _drv_eps(mid, d, delta / 2) <= eps else (lo, mid)
    drv = lo
    if (e1, d1) == basic:
        # basic chosen: composes to exactly (eps, delta); advanced could not have done better
        assert d * e1 == pytest.approx(eps, rel=1e-12) and d * d1 == pytest.approx(delta, rel=1e-12)
        assert drv <= basic[0] * (1 + 1e-9)
    else:
        assert d1 == pytest.approx(delta / (2 * d), rel=1e-12)
        assert e1 > basic[0]
        # KOV with the returned per-step budget really gives (eps, delta)
        assert _exact_composed_delta(e1, d1, d, eps) <= delta * (1 + 1e-9)
        # ... and by dp_accounting's own KOV (Theorem 3.3 lattice form)
        from dp_accounting.pld import accountant, common

        total = accountant.advanced_composition(common.DifferentialPrivacyParameters(e1, d1), d, delta)
        assert total is not None and total <= eps * (1 + 1e-12)
        # KOV is at least as good as DRV (DRV upper-bounds KOV's epsilon)
        assert e1 >= drv * (1 - 1e-6)


@pytest.mark.parametrize("d", [30, 50, 100])
def test_advanced_composition_wins_for_large_d(d):
    e1, d1 = coordinate_budget(1.0, 1e-6, d)
    assert e1 > 1.0 / d * 1.1 and d1 == pytest.approx(1e-6 / (2 * d))


def test_coordinate_budget_small_d_and_pure():
    assert coordinate_budget(1.0, 1e-6, 1) == (1.0, 1e-6)
    assert coordinate_budget(1.0, 1e-6, 2) == (0.5, 5e-7)
    assert coordinate_budget(1.0, 0.0, 100) == (0.01, 0.0)


@pytest.mark.parametrize("d", [1000, 2000])
def test_coordinate_budget_large_d_does_not_crash(d):
    """A pre-flight example of the design uses d = 1000. coordinate_budget must return a
    valid per-coordinate budget (at least basic composition), not raise OverflowError."""
    e1, d1 = coordinate_budget(1.0, 1e-6, d)
    assert e1 >= 1.0 / d and d1 > 0
    if (e1, d1) != (1.0 / d, 1e-6 / d):
        assert _exact_composed_delta(e1, d1, d, 1.0) <= 1e-6 * (1 + 1e-9)


# ------------------------------------------------------------------------------------------------
# 6. bad input: refused before any charge
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,name",
    [
        ({"budget": Budget(1.0, 0.0)}, "delta"),
        ({"fractions": ((STAGE_COARSE, 0.5), (STAGE_TCN, 0.5))}, "fractions"),
        ({"fractions": ((STAGE_COARSE, 0.2), (STAGE_TCN, 0.2), (STAGE_FINAL, 0.5))}, "fractions"),
        ({"fractions": ((STAGE_COARSE, -0.2), (STAGE_TCN, 0.6), (STAGE_FINAL, 0.6))}, "fractions"),
        ({"fractions": ((STAGE_COARSE, 0.0), (STAGE_TCN, 0.5), (STAGE_FINAL, 0.5))}, "fractions"),
        ({"fractions": ((STAGE_COARSE, math.nan), (STAGE_TCN, 0.5), (STAGE_FINAL, 0.5))}, "fractions"),
        ({"fractions": ((STAGE_COARSE, 0.2), (STAGE_TCN, 0.3), ("final", 0.5))}, "fractions"),
        ({"scales": (1.0, 0.0)}, "scales"),
        ({"scales": (1.0, -2.0)}, "scales"),
        ({"scales": (1.0, math.nan)}, "scales"),
        ({"scales": (1.0, math.inf)}, "scales"),
        ({"scales": (1.0,)}, "scales"),
        ({"scales": (1.0, 1.0, 1.0)}, "scales"),
        ({"mode": "summary", "m": 4}, "m"),
        ({"mode": "iid", "m": 0}, "m"),
        ({"mode": "mean"}, "mode"),
        ({"budget_mode": "basic"}, "budget_mode"),
        ({"d": 0}, "d"),
        ({"k": 1.5}, "k"),
        ({"expected_persons": 0.5}, "expected_persons"),
        ({"expected_persons": math.nan}, "expected_persons"),
    ],
)
def test_bad_plan_refused_naming_parameter(kwargs, name):
    args = {"budget": Budget(EPS, DELTA), "d": 2, "scales": (1.0, 1.0), "expected_persons": 1000.0}
    if "fractions" in kwargs:
        args["expected_persons"] = 1000.0
    args.update(kwargs)
    with pytest.raises(InvalidParameterError, match=rf"\b{name}\b"):
        MultivariateMeanPlan(**args)


@pytest.mark.parametrize(
    "columns,match",
    [(["x0"], r"d=2"), (["x0", "x1", "x0"], r"d=2"), (["x0", "x0"], r"distinct")],
)
def test_bad_columns_refused_before_any_charge(columns, match):
    plan = MultivariateMeanPlan(Budget(EPS, DELTA), 2, scales=(1.0, 1.0))
    acc = Accountant(plan.budget)
    with pytest.raises(InvalidParameterError, match=match):
        multivariate_person_mean(RaisingBackend(), columns, plan, SeededNoise(0), acc)
    assert acc.charges == []


def test_unknown_column_refused_before_any_charge():
    """Verify, then charge (STYLE.md): a column the summaries do not hold is an input error that
    must be found before the ledger is touched, not after the first stage has been charged."""
    y = np.random.default_rng(0).normal(size=(500, 2))
    backend = _backend(y, np.random.default_rng(1).integers(0, HASH, 500))
    plan = MultivariateMeanPlan(Budget(EPS, DELTA), 2, scales=(1.0, 1.0))
    acc = Accountant(plan.budget)
    with pytest.raises(InvalidParameterError, match="nope"):
        multivariate_person_mean(backend, ["x0", "nope"], plan, SeededNoise(0), acc)
    assert acc.charges == []


@pytest.mark.parametrize("scales", [[1.0, 0.0], [1.0, -1.0], [math.nan, 1.0], [1.0], [1.0, 1.0, 1.0], [math.inf, 1.0]])
def test_backend_refuses_bad_scales(scales):
    y = np.ones((5, 2))
    with pytest.raises(InvalidParameterError, match="scales"):
        _backend(y, np.arange(5)).clipped_sum(_cols(2), np.zeros(2), 1.0, GroupRange(0.0, 1.0), scales=np.array(scales))


# ------------------------------------------------------------------------------------------------
# 7. INSUFFICIENT_DATA
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scales", [(1.0, 1.0, 1.0), None], ids=["declared", "private"])
@pytest.mark.parametrize("budget_mode", ["parallel", "sequential"])
def test_too_few_persons_insufficient_data_keeps_charges(scales, budget_mode):
    d = 3
    plan = MultivariateMeanPlan(Budget(EPS, DELTA), d, scales=scales, budget_mode=budget_mode)
    y = np.random.default_rng(0).normal(size=(60, d))
    rec = RecordingBackend(_backend(y, np.random.default_rng(1).integers(0, HASH, 60)))
    acc = Accountant(plan.budget)
    noise = RecordingNoise(2)
    out = multivariate_person_mean(rec, _cols(d), plan, noise, acc)
    assert out.status == STATUS_INSUFFICIENT
    assert out.estimate is None and out.error_bar is None and out.noise_scale is None
    stages = [c.stage for c in acc.charges]
    expected_stages = [STAGE_COUNT, STAGE_COARSE] if scales is not None else [STAGE_COUNT, STAGE_RANGES]
    assert stages == expected_stages
    # the charges stay; the release reports their composed cost, computed here independently
    b = plan.stage_budgets
    if budget_mode == "parallel":
        exp = (max(b[s].epsilon for s in stages), max(b[s].delta for s in stages))
    else:
        exp = (sum(b[s].epsilon for s in stages), sum(b[s].delta for s in stages))
    assert (out.epsilon, out.delta) == pytest.approx(exp, rel=1e-12)
    assert composed_cost(acc.charges) == pytest.approx(exp, rel=1e-12)
    assert exp[0] > 0 and exp[1] > 0
    # nothing after the failed stage ran: no clipped sum, no Gaussian noise
    assert all(c["method"] != "clipped_sum" for c in rec.calls)
    assert noise.gaussian == []
    assert "estimate" not in out.parameters and "coarse_center" not in out.parameters
