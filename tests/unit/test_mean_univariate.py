"""The univariate person-level mean: plan, accounting order, stage inputs and accuracy.

Stage inputs are recomputed here by brute force from the persons and from the noisy outputs that
a recording noise source saw (post-processing), never read from the library's internals.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from dplib.aggregates import NumpyAggregates
from dplib.budget import Accountant, Budget, composed_cost
from dplib.errors import BudgetExceededError, InvalidParameterError
from dplib.groups import ALL_PERSONS, GroupRange
from dplib.mean.error_bars import noise_and_sampling_quantile
from dplib.mean.univariate import (
    STATUS_INSUFFICIENT,
    STATUS_OK,
    UnivariateMeanPlan,
    univariate_person_mean,
)
from dplib.mechanisms import SeededNoise

HASH = 2**32
C_R4 = 288.0 ** 0.25  # (32 * 3^2)^(1/4): bin width constant for k = 4


class RecordingNoise:
    """Wraps a noise source; records the accountant's charge count and the inputs of each call."""

    def __init__(self, inner, accountant: Accountant | None = None):
        self.inner = inner
        self.accountant = accountant
        self.name = "recording"
        self.secure = False
        self.calls: list[dict] = []

    def _record(self, kind, values, scale):
        arr = np.array(values, dtype=np.float64, copy=True)
        self.calls.append(
            {
                "kind": kind,
                "n_charges": None if self.accountant is None else len(self.accountant.charges),
                "stages": None if self.accountant is None else [c.stage for c in self.accountant.charges],
                "values": arr,
                "scale": float(scale),
            }
        )

    def add_laplace(self, values, scale):
        self._record("laplace", values, scale)
        out = self.inner.add_laplace(values, scale)
        self.calls[-1]["noisy"] = np.array(out, copy=True)
        return out

    def add_gaussian(self, values, sigma):
        self._record("gaussian", values, sigma)
        out = self.inner.add_gaussian(values, sigma)
        self.calls[-1]["noisy"] = np.array(out, copy=True)
        return out


def _gaussian_persons(seed: int, n: int, mean: float = 3.0, sd: float = 1.0):
    rng = np.random.default_rng(seed)
    y = rng.normal(mean, sd, size=n)
    gidx = rng.integers(0, HASH, size=n)
    return y, gidx


def _in(gidx, group: GroupRange):
    lo, hi = math.floor(group.lo * HASH), math.floor(group.hi * HASH)
    return (gidx >= lo) & (gidx < hi)


def _brute_composed(charges):
    """Max over a fine grid of the hash space of the summed (epsilon, delta) covering each point."""
    grid = np.linspace(0, 1, 4001)[:-1] + 1 / 8000
    best_e, best_d = 0.0, 0.0
    for x in grid:
        e = sum(c.budget.epsilon for c in charges if c.group.lo <= x < c.group.hi)
        d = sum(c.budget.delta for c in charges if c.group.lo <= x < c.group.hi)
        best_e, best_d = max(best_e, e), max(best_d, d)
    return best_e, best_d


# --------------------------------------------------------------------------------------------
# Plan: charges and cost
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("eps, delta", [(1.0, 1e-6), (0.05, 1e-9), (3.0, 0.0)])
def test_parallel_plan_charges_and_cost(eps, delta):
    plan = UnivariateMeanPlan(Budget(eps, delta), scale=1.0, range_bound=10.0 if delta == 0 else None, budget_mode="parallel")
    ch = plan.charges()
    assert len(ch) == 2
    assert (ch[0].budget.epsilon, ch[0].budget.delta) == (eps, delta)
    assert (ch[1].budget.epsilon, ch[1].budget.delta) == (eps, 0.0)
    assert (ch[0].group.lo, ch[0].group.hi) == (0.0, 0.25)
    assert (ch[1].group.lo, ch[1].group.hi) == (0.25, 1.0)
    assert _brute_composed(ch) == pytest.approx((eps, delta), rel=1e-12)
    cost = plan.cost()
    assert (cost.epsilon, cost.delta) == pytest.approx((eps, delta), rel=1e-12)


@pytest.mark.parametrize("eps, delta", [(1.0, 1e-6), (0.2, 1e-8)])
def test_sequential_plan_charges_and_cost_match_brute_force(eps, delta):
    plan = UnivariateMeanPlan(Budget(eps, delta), scale=1.0, budget_mode="sequential")
    ch = plan.charges()
    assert (ch[0].budget.epsilon, ch[0].budget.delta) == (eps / 2, delta)
    assert (ch[1].budget.epsilon, ch[1].budget.delta) == (eps / 2, 0.0)
    cost = plan.cost()
    assert (cost.epsilon, cost.delta) == pytest.approx(_brute_composed(ch), rel=1e-12)


@pytest.mark.parametrize("mode", ["parallel", "sequential"])
def test_plan_cost_equals_budget(mode):
    # UnivariateMeanPlan.cost() documents "equals budget in both modes".
    plan = UnivariateMeanPlan(Budget(1.0, 1e-6), scale=1.0, budget_mode=mode)
    assert _brute_composed(plan.charges()) == pytest.approx((1.0, 1e-6), rel=1e-12)
    cost = plan.cost()
    assert (cost.epsilon, cost.delta) == pytest.approx((1.0, 1e-6), rel=1e-12)


def test_plan_on_a_sub_range_splits_inside_it():
    g = GroupRange(0.5, 0.9)
    plan = UnivariateMeanPlan(Budget(1.0, 1e-6), scale=1.0, group=g, coarse_fraction=0.5, budget_mode="parallel")
    a, b = plan.coarse_group, plan.fine_group
    assert a.lo == 0.5 and b.hi == 0.9 and a.hi == b.lo
    assert a.hi == pytest.approx(0.7, rel=1e-12)


# --------------------------------------------------------------------------------------------
# Plan validation
# --------------------------------------------------------------------------------------------


def test_pure_dp_without_range_bound_refused():
    with pytest.raises(InvalidParameterError, match="range_bound"):
        UnivariateMeanPlan(Budget(1.0, 0.0), scale=1.0)


@pytest.mark.parametrize("rb", [0.0, -1.0, math.inf, math.nan, 1e9])
def test_pure_dp_bad_range_bound_refused(rb):
    with pytest.raises(InvalidParameterError, match="range_bound"):
        UnivariateMeanPlan(Budget(1.0, 0.0), scale=1.0, range_bound=rb)


@pytest.mark.parametrize("scale", [0, 0.0, -1.0, math.nan, math.inf, "1.0", None])
def test_bad_scale_refused(scale):
    with pytest.raises(InvalidParameterError, match="scale"):
        UnivariateMeanPlan(Budget(1.0, 1e-6), scale=scale)


@pytest.mark.parametrize("m", [0, -1, 1.5, True, "2"])
def test_bad_m_refused(m):
    with pytest.raises(InvalidParameterError, match="m "):
        UnivariateMeanPlan(Budget(1.0, 1e-6), scale=1.0, m=m)


@pytest.mark.parametrize("m", [math.nan, math.inf])
def test_non_finite_m_refused_with_invalid_parameter_error(m):
    with pytest.raises(InvalidParameterError, match="m "):
        UnivariateMeanPlan(Budget(1.0, 1e-6), scale=1.0, m=m)


@pytest.mark.parametrize("mode", ["", "Parallel", "both", None])
def test_bad_budget_mode_refused(mode):
    with pytest.raises(InvalidParameterError, match="budget_mode"):
        UnivariateMeanPlan(Budget(1.0, 1e-6), scale=1.0, budget_mode=mode)


@pytest.mark.parametrize("cf", [0.0, 0.049, 0.951, 1.0, math.nan])
def test_bad_coarse_fraction_refused(cf):
    with pytest.raises(InvalidParameterError, match="coarse_fraction"):
        UnivariateMeanPlan(Budget(1.0, 1e-6), scale=1.0, coarse_fraction=cf)


@pytest.mark.parametrize("k", [1.5, math.nan])
def test_bad_k_refused(k):
    with pytest.raises(InvalidParameterError, match="k"):
        UnivariateMeanPlan(Budget(1.0, 1e-6), scale=1.0, k=k)


def test_budget_must_be_a_budget():
    with pytest.raises(InvalidParameterError, match="budget"):
        UnivariateMeanPlan((1.0, 1e-6), scale=1.0)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# Accounting order
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["parallel", "sequential"])
def test_budget_is_charged_before_noise_is_drawn(mode):
    y, gidx = _gaussian_persons(1, 5000)
    plan = UnivariateMeanPlan(Budget(1.0, 1e-6), scale=1.0, budget_mode=mode)
    acc = Accountant(Budget(2.0, 2e-6))
    acc.charge("earlier statistic", Budget(0.5, 5e-7), ALL_PERSONS)
    noise = RecordingNoise(SeededNoise(3), acc)
    rel = univariate_person_mean(NumpyAggregates({"v": y}, gidx), "v", plan, noise, acc, stage_prefix="x: ")
    assert rel.status == STATUS_OK
    assert len(noise.calls) == 2
    assert noise.calls[0]["n_charges"] == 2
    assert noise.calls[0]["stages"][-1] == "x: coarse range estimator"
    assert noise.calls[1]["n_charges"] == 3
    assert noise.calls[1]["stages"][-1] == "x: fine clip-and-noise"
    assert len(acc.charges) == 3
    # The release reports the statistic's whole budget in both modes.
    assert (rel.epsilon, rel.delta) == pytest.approx((1.0, 1e-6), rel=1e-12)


def test_refused_budget_raises_before_any_noise():
    y, gidx = _gaussian_persons(2, 2000)
    plan = UnivariateMeanPlan(Budget(1.0, 1e-6), scale=1.0, budget_mode="parallel")
    acc = Accountant(Budget(1.0 * (1 - 1e-9), 1e-6))
    noise = RecordingNoise(SeededNoise(0), acc)
    with pytest.raises(BudgetExceededError):
        univariate_person_mean(NumpyAggregates({"v": y}, gidx), "v", plan, noise, acc)
    assert noise.calls == []
    assert acc.charges == []


def test_fine_stage_unaffordable_refuses_before_the_coarse_noise():
    # Enough for the coarse stage, not for the fine one: nothing may be spent or drawn.
    y, gidx = _gaussian_persons(3, 2000)
    plan = UnivariateMeanPlan(Budget(1.0, 1e-6), scale=1.0, budget_mode="parallel")
    acc = Accountant(Budget(1.0, 1e-6))
    acc.charge("other", Budget(0.5, 0.0), GroupRange(0.6, 1.0))
    noise = RecordingNoise(SeededNoise(0), acc)
    with pytest.raises(BudgetExceededError):
        univariate_person_mean(NumpyAggregates({"v": y}, gidx), "v", plan, noise, acc)
    assert noise.calls == []
    assert [c.stage for c in acc.charges] == ["other"]


def test_k_inf_with_m_above_one_runs_or_refuses_before_spending():
    # k = inf and m > 1 are both accepted by the plan. The run must either release, or refuse
    # before charging/drawing anything; it must not spend the coarse budget and then fail.
    y, gidx = _gaussian_persons(4, 4000)
    plan = UnivariateMeanPlan(Budget(1.0, 1e-6), scale=1.0, k=math.inf, m=4, budget_mode="parallel")
    acc = Accountant(plan.budget)
    noise = RecordingNoise(SeededNoise(0), acc)
    try:
        rel = univariate_person_mean(NumpyAggregates({"v": y}, gidx), "v", plan, noise, acc)
    except InvalidParameterError:
        assert acc.charges == [] and noise.calls == [], "failed after spending budget / drawing noise"
    else:
        assert rel.status in (STATUS_OK, STATUS_INSUFFICIENT)
        assert rel.estimate is None or math.isfinite(rel.estimate)


# --------------------------------------------------------------------------------------------
# Too little data
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("where", [0.1, 0.6])  # coarse group / fine group
def test_single_person_gives_insufficient_data(seed, where):
    agg = NumpyAggregates({"v": np.array([3.0])}, np.array([int(where * HASH)]))
    plan = UnivariateMeanPlan(Budget(1.0, 1e-6), scale=1.0, budget_mode="parallel")
    acc = Accountant(plan.budget)
    rel = univariate_person_mean(agg, "v", plan, SeededNoise(seed), acc)
    assert rel.status == STATUS_INSUFFICIENT
    assert rel.estimate is None and rel.error_bar is None and rel.noise_scale is None
    # Only the coarse stage was charged.
    assert [c.stage for c in acc.charges] == ["coarse range estimator"]
    assert (rel.epsilon, rel.delta) == (1.0, 1e-6)


def test_empty_data_gives_insufficient_data():
    agg = NumpyAggregates({"v": np.array([])}, np.array([], dtype=np.int64))
    plan = UnivariateMeanPlan(Budget(1.0, 1e-6), scale=1.0, budget_mode="parallel")
    noise = RecordingNoise(SeededNoise(0))
    rel = univariate_person_mean(agg, "v", plan, noise)
    assert rel.status == STATUS_INSUFFICIENT and rel.estimate is None


def test_all_nan_persons_give_insufficient_data():
    agg = NumpyAggregates({"v": np.full(500, np.nan)}, np.arange(500) * (HASH // 500))
    plan = UnivariateMeanPlan(Budget(1.0, 1e-6), scale=1.0, budget_mode="parallel")
    rel = univariate_person_mean(agg, "v", plan, SeededNoise(0))
    assert rel.status == STATUS_INSUFFICIENT and rel.estimate is None


# --------------------------------------------------------------------------------------------
# Stage inputs recomputed by brute force; accuracy on Gaussian data
# --------------------------------------------------------------------------------------------


def _fine_radius_k4(u, n_eps):
    return u + max(1.0, max(n_eps, 1.0) ** 0.25)


def _count_weight(rho, u):
    return max((u * u * rho) ** (1 / 3), rho / 8)


@pytest.mark.parametrize("seed", range(3))
def test_approximate_dp_stage_inputs_and_estimate(seed):
    eps, delta = 1.0, 1e-6
    y, gidx = _gaussian_persons(100 + seed, 20000)
    plan = UnivariateMeanPlan(Budget(eps, delta), scale=1.0, k=4, budget_mode="parallel")
    noise = RecordingNoise(SeededNoise(seed))
    rel = univariate_person_mean(NumpyAggregates({"v": y}, gidx), "v", plan, noise)
    assert rel.status == STATUS_OK
    assert len(noise.calls) == 2
    r = C_R4
    in_a = _in(gidx, GroupRange(0.0, 0.25))
    in_b = _in(gidx, GroupRange(0.25, 1.0))

    # Coarse stage: the exact counts of the non-empty bins of floor(y / r), sorted by bin.
    hist: dict[int, int] = {}
    for v in y[in_a]:
        j = math.floor(v / r)
        hist[j] = hist.get(j, 0) + 1
    keys = sorted(hist)
    call0 = noise.calls[0]
    np.testing.assert_array_equal(call0["values"], [hist[k] for k in keys])
    assert call0["scale"] == pytest.approx(1.0 / eps, rel=1e-15)
    tau = 1.0 + math.log(1.0 / (2.0 * delta)) / eps
    released = {k: v for k, v in zip(keys, call0["noisy"]) if v > tau}
    assert released
    best = max(released.values())
    j_star = min(k for k, v in released.items() if v == best)
    mu_c = (j_star + 0.5) * r
    assert rel.parameters["coarse_center"] == pytest.approx(mu_c, rel=1e-12)
    assert abs(mu_c - 3.0) <= 1.5 * r

    # Fine stage: radius from the released noisy counts (post-processing), then (S, c n).
    u = 1.5 * r
    n_hat_a = sum(max(v, 0.0) for v in released.values())
    rho = _fine_radius_k4(u, n_hat_a * 3.0 * eps)
    c = _count_weight(rho, u)
    s_exact = math.fsum(min(max(v - mu_c, -rho), rho) for v in y[in_b])
    n_b = int(np.sum(in_b))
    call1 = noise.calls[1]
    np.testing.assert_allclose(call1["values"], [s_exact, c * n_b], rtol=1e-10)
    assert call1["scale"] == pytest.approx((rho + c) * (1 + 2.0**-20) / eps, rel=1e-12)  # sensitivity margin for float rounding
    assert rel.noise_scale == pytest.approx((rho + c) * (1 + 2.0**-20) / eps, rel=1e-12)
    s_noisy, n_noisy = call1["noisy"][0], call1["noisy"][1] / c
    assert rel.estimate == pytest.approx(mu_c + s_noisy / max(n_noisy, 1.0), rel=1e-12)

    # Accuracy with a tolerance derived from the released noise scale and count:
    #   est - 3 = (mean_B trunc - 3) + (e_S - d e_N) / N~,  |d| <= rho,
    # sampling <= 5 sd / sqrt(n_B) (n_B >= N~ - 15 b/c), noise <= 15 b (1 + rho / c) / N~
    # (each Laplace exceeds 15 scales with probability 3e-7), clipping bias below 1e-9 here
    # (rho - |mu_c - 3| > 10 sd).
    b = rel.noise_scale
    n_tilde = rel.parameters["noisy_person_count"]
    n_low = n_tilde - 15 * b / c
    assert rho - abs(mu_c - 3.0) > 10.0
    tol = 5.0 / math.sqrt(n_low) + 15 * b * (1 + rho / c) / n_tilde + 1e-9
    assert abs(rel.estimate - 3.0) <= tol
    # The tolerance is meaningful: well below the coarse bin width and the centre's error bound.
    assert tol < 0.2
    # The error bar covers the noise part with the stated level; it is of the order b / N~.
    assert 0 < rel.error_bar < 5 * b * (1 + rho / c) / n_tilde
    assert (rel.epsilon, rel.delta) == (eps, delta)


@pytest.mark.parametrize("seed", range(2))
def test_pure_dp_path_noises_every_bin(seed):
    eps, R = 1.0, 10.0
    rng = np.random.default_rng(200 + seed)
    y = rng.normal(3.0, 1.0, size=8000)
    gidx = rng.integers(0, HASH, size=y.size)
    # Extreme persons in the coarse group must land in the edge bins.
    y = np.r_[y, 1e308, -1e308, 50.0]
    gidx = np.r_[gidx, 5, 6, 7]
    plan = UnivariateMeanPlan(Budget(eps, 0.0), scale=1.0, range_bound=R, budget_mode="parallel")
    noise = RecordingNoise(SeededNoise(seed))
    rel = univariate_person_mean(NumpyAggregates({"v": y}, gidx), "v", plan, noise)
    r = C_R4
    n_bins = math.ceil((2 * R + 4 * r) / r)
    assert plan.n_pure_bins == n_bins
    assert len(noise.calls) == 2
    call0 = noise.calls[0]
    assert call0["values"].shape == (n_bins,)
    assert call0["scale"] == pytest.approx(1.0 / eps, rel=1e-15)
    offset = -R - 2 * r
    dense = np.zeros(n_bins)
    in_a = _in(gidx, GroupRange(0.0, 0.25))
    for v in y[in_a]:
        j = math.floor((v - offset) / r)
        dense[min(max(j, 0), n_bins - 1)] += 1
    np.testing.assert_array_equal(call0["values"], dense)
    assert call0["values"][0] >= 1 and call0["values"][-1] >= 2  # -1e308 / 1e308 and 50
    assert rel.status == STATUS_OK
    assert (rel.epsilon, rel.delta) == (eps, 0.0)
    j_star = int(np.argmax(call0["noisy"]))
    assert rel.parameters["coarse_center"] == pytest.approx(offset + (j_star + 0.5) * r, rel=1e-12)
    assert abs(rel.estimate - 3.0) < 0.2


# --------------------------------------------------------------------------------------------
# Quantile of |X - Y| for independent Laplace X, Y
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("a, b", [(1.0, 0.3), (0.5, 3.0), (2.0, 2.0), (1.0, 1.0 + 1e-12), (1.0, 1.0 + 1e-6), (1.5, 0.0)])
@pytest.mark.parametrize("level", [0.5, 0.9, 0.99])
def test_diff_of_laplace_quantile_matches_monte_carlo(a, b, level):
    rng = np.random.default_rng(7)
    n = 200_000
    x = rng.laplace(0.0, a, size=n)
    z = np.abs(x - (rng.laplace(0.0, b, size=n) if b > 0 else 0.0))
    t = noise_and_sampling_quantile(a, b, 0.0, level)
    half_width = 5.0 * math.sqrt(level * (1 - level) / n)  # 5-sigma binomial band
    assert abs(np.mean(z <= t) - level) <= half_width
    # Power: a quantile 30% off is outside the band.
    assert abs(np.mean(z <= 1.3 * t) - level) > half_width
    assert abs(np.mean(z <= t / 1.3) - level) > half_width


def test_diff_of_laplace_quantile_closed_forms():
    # One scale zero: quantile of |Lap(a)| is -a ln(1 - level).
    assert noise_and_sampling_quantile(2.0, 0.0, 0.0, 0.9) == pytest.approx(2.0 * math.log(10.0), rel=1e-12)
    assert noise_and_sampling_quantile(0.0, 3.0, 0.0, 0.5) == pytest.approx(3.0 * math.log(2.0), rel=1e-12)
    # Equal scales: P(|Z| > t) = e^{-t/a} (1 + t/(2a)).
    t = noise_and_sampling_quantile(1.0, 1.0, 0.0, 0.9)
    assert math.exp(-t) * (1 + t / 2) == pytest.approx(0.1, rel=1e-9)
    # Symmetric in its two scales.
    assert noise_and_sampling_quantile(1.0, 0.3, 0.0, 0.9) == pytest.approx(noise_and_sampling_quantile(0.3, 1.0, 0.0, 0.9), rel=1e-9)


def test_sequential_default_reads_all_persons_in_both_stages():
    """The default (sequential) plan: both stages read the statistic's whole group, epsilon/2
    each; the fine stage's noise no longer sits on a hash range of the persons."""
    plan = UnivariateMeanPlan(Budget(1.0, 1e-6), scale=1.0)
    assert plan.budget_mode == "sequential"
    assert plan.coarse_group == ALL_PERSONS and plan.fine_group == ALL_PERSONS
    ch = plan.charges()
    assert [(c.budget.epsilon, c.group) for c in ch] == [(0.5, ALL_PERSONS), (0.5, ALL_PERSONS)]
    assert composed_cost(ch) == pytest.approx((1.0, 1e-6))
