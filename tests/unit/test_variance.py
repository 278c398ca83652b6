"""Unit tests of the person-level variance and standard deviation (:mod:`dplib.variance`) and the
pieces they add: the tail model's second-moment excess, the quantile of a sum of Laplace terms.

Oracles are independent of the code under test: ``numpy.var`` of the person means, numerical
integration (scipy ``quad``) for the closed forms, seeded Monte Carlo for the quantiles, the
plan's public shares for the costs, and the seam's exact aggregates on neighbouring data sets
(one person added or removed) for the sensitivities.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, stats

from dplib.aggregates import NumpyAggregates
from dplib.budget import Accountant, Budget, Charge
from dplib.errors import BudgetExceededError, InvalidParameterError
from dplib.groups import ALL_PERSONS
from dplib.mean.error_bars import laplace_iid_sum_upper, laplace_sum_quantile
from dplib.mean.scale_free_stages import (STAGE_BALANCE, STAGE_CENTRE, STAGE_OVERFLOW, STAGE_PROFILE, STAGE_RANGE, STAGE_RANGE_RETRY,
                                         STAGE_RANGE_RETRY2)
from dplib.mean.tails import StudentTail, t_abs_second_excess
from dplib.mean.univariate import STATUS_INSUFFICIENT, STATUS_OK
from dplib.mechanisms import SeededNoise
from dplib.mechanisms.basic import SENSITIVITY_MARGIN
from dplib.variance import (
    SECOND_MOMENT_SENSITIVITY,
    STAGE_MOMENTS,
    ScaleFreeVariancePlan,
    clipped_moments,
    person_variance,
    stddev_from_variance,
    variance_bias_bound,
)

BUDGET = Budget(1.0, 1e-6)


class RecordingNoise(SeededNoise):
    """SeededNoise that records each Laplace call: the exact values handed in, the scale, and how
    many charges the accountant held at that moment."""

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


def backend(y: np.ndarray, seed: int = 0) -> NumpyAggregates:
    return NumpyAggregates({"v": y}, np.random.default_rng(seed).integers(0, 2**32, y.size))


# ------------------------------------------------------------------------------------------------
# closed forms and quantiles
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("nu", [2.3, 3.0, 5.0, 30.0])
@pytest.mark.parametrize("u", [0.0, 0.7, 3.0, 20.0])
def test_t_second_excess_matches_numerical_integration(nu, u):
    expected, _ = integrate.quad(lambda x: 2.0 * x * 2.0 * stats.t.sf(x, nu), u, math.inf, limit=400)
    assert t_abs_second_excess(u, nu) == pytest.approx(expected, rel=1e-6, abs=1e-12)


def test_t_second_excess_is_infinite_at_or_below_two():
    assert math.isinf(t_abs_second_excess(1.0, 2.0)) and math.isinf(t_abs_second_excess(1.0, 1.5))


def _survival(model: StudentTail, x: float) -> float:
    """The model's survival S(x) written out: steps up to x*, the scaled t tail beyond."""
    xs, ss = model.edges, model.survival
    if x < xs[-1]:
        j = int(np.searchsorted(xs, x, side="right")) - 1
        return float(ss[j])
    base = 2.0 * stats.t.sf(xs[-1] / model.scale, model.nu_lower)
    return float(ss[-1] * 2.0 * stats.t.sf(x / model.scale, model.nu_lower) / base)


@pytest.mark.parametrize("radius", [0.3, 1.5, 2.5, 7.0])
def test_second_moment_excess_is_the_integral_of_2x_survival(radius):
    model = StudentTail(np.array([0.0, 1.0, 2.0, 3.0]), np.array([1.0, 0.4, 0.1, 0.02]), 1.2, 6.0, 4.0, True)
    pieces = [radius] + [e for e in (1.0, 2.0, 3.0) if e > radius]
    expected = sum(integrate.quad(lambda x: 2 * x * _survival(model, x), a, b)[0] for a, b in zip(pieces, pieces[1:]))
    expected += integrate.quad(lambda x: 2 * x * _survival(model, x), max(radius, 3.0), math.inf)[0]
    assert model.second_moment_excess(radius) == pytest.approx(expected, rel=1e-6)
    # and the first-moment excess the mean uses is the integral of the survival
    e1 = sum(integrate.quad(lambda x: _survival(model, x), a, b)[0] for a, b in zip(pieces, pieces[1:]))
    e1 += integrate.quad(lambda x: _survival(model, x), max(radius, 3.0), math.inf)[0]
    assert model.bias(radius) == pytest.approx(e1, rel=1e-6)


def test_variance_bias_bound_covers_the_exact_clipping_bias():
    """On data whose survival the model over-states, the bound is at least the exact drop of the
    variance under truncation (which is >= 0: truncation is 1-Lipschitz)."""
    rng = np.random.default_rng(3)
    y = rng.standard_t(5, 20_000)
    c, rho = 0.1, 2.0
    x = np.abs(y - c)
    edges = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0])
    surv = np.array([(x >= e).mean() for e in edges])
    model = StudentTail(edges, surv * 1.1, 1.0, 5.0, 4.0, True)  # 10% more mass: an upper envelope
    t = np.clip(y, c - rho, c + rho)
    drop = y.var() - t.var()
    assert drop >= 0
    assert variance_bias_bound(model, rho, abs(t.mean() - c)) >= drop


@pytest.mark.parametrize("scales", [[1.0], [1.0, 0.3], [2.0, 0.7, 0.1], [1.0, 0.5, 0.25, 0.05]])
def test_laplace_sum_quantile_matches_monte_carlo(scales):
    rng = np.random.default_rng(7)
    n = 200_000
    x = sum(rng.laplace(0.0, s, n) for s in scales)
    q = laplace_sum_quantile(scales, 0.9)
    inside = int(np.sum(np.abs(x) <= q))
    tol = 4.0 * math.sqrt(0.9 * 0.1 / n)
    assert abs(inside / n - 0.9) <= tol
    # power: the quantile of scales 30% too small covers clearly less than 90%
    q_small = laplace_sum_quantile([0.7 * s for s in scales], 0.9)
    assert np.mean(np.abs(x) <= q_small) < 0.9 - 5 * tol


def test_laplace_sum_quantile_is_conservative_for_equal_scales_and_refuses_bad_input():
    rng = np.random.default_rng(8)
    x = sum(rng.laplace(0.0, 1.0, 200_000) for _ in range(3))
    q = laplace_sum_quantile([1.0, 1.0, 1.0], 0.9)
    assert 0.9 <= np.mean(np.abs(x) <= q) <= 0.93
    for bad in ([], [0.0, 0.0], [1.0, -1.0], [math.inf]):
        with pytest.raises(InvalidParameterError):
            laplace_sum_quantile(bad)


@pytest.mark.parametrize("k", [1, 4, 28])
def test_laplace_iid_sum_upper_bounds_the_tail(k):
    rng = np.random.default_rng(k)
    x = rng.laplace(0.0, 2.0, (100_000, k)).sum(axis=1)
    t = laplace_iid_sum_upper(k, 2.0, 0.99)
    assert np.mean(x > t) <= 0.01
    assert t <= 2.0 * float(np.quantile(x, 0.99))  # conservative, not absurd


# ------------------------------------------------------------------------------------------------
# plan, charges, refusal
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("budget", [Budget(1.0, 1e-6), Budget(0.5, 0.0)], ids=["approx", "pure"])
def test_plan_cost_is_the_budget_with_the_balance_stage(budget):
    plan = ScaleFreeVariancePlan(budget)
    names = [c.stage for c in plan.charges("v: ")]
    assert names == ["v: " + s for s in (
        STAGE_RANGE, STAGE_RANGE_RETRY, STAGE_RANGE_RETRY2, STAGE_CENTRE, STAGE_PROFILE, STAGE_BALANCE, STAGE_OVERFLOW,
        STAGE_MOMENTS)]
    # public shares: 0.04 + 0.20 + 0.15 (pooled retry) + 3 x 0.04 + 2 x 0.10 (after a retry) + 0.05 + 0.15 (overflow
    # check) + the rest
    eps = [c.budget.epsilon / budget.epsilon for c in plan.charges()]
    assert eps == pytest.approx([0.04, 0.20, 0.15, 0.12, 0.20, 0.05, 0.15, 0.09])
    assert (plan.cost().epsilon, plan.cost().delta) == pytest.approx((budget.epsilon, budget.delta))
    # the exact budget is accepted, a hair less refused, before anything is charged
    Accountant(budget).check(plan.charges())
    with pytest.raises(BudgetExceededError):
        Accountant(Budget(budget.epsilon * (1 - 1e-9), budget.delta)).check(plan.charges())


@pytest.mark.parametrize("kwargs", [{"k": 1.0}, {"range_quantile": 0.3}, {"exponent_range": (3, 3)}, {"range_octaves": 0}])
def test_plan_refuses_bad_parameters(kwargs):
    with pytest.raises(InvalidParameterError):
        ScaleFreeVariancePlan(BUDGET, **kwargs)


def test_each_stage_is_charged_before_its_noise_and_the_total_is_the_budget():
    y = np.random.default_rng(1).normal(3.0, 2.0, 20_000)
    acc = Accountant(BUDGET)
    noise = RecordingNoise(5, acc)
    rel = person_variance(backend(y), "v", ScaleFreeVariancePlan(BUDGET), noise, acc, "v: ")
    assert rel.status == STATUS_OK
    assert [c.stage for c in acc.charges] == ["v: " + s for s in (
        STAGE_RANGE, STAGE_CENTRE, STAGE_PROFILE, STAGE_BALANCE, STAGE_MOMENTS)]
    assert noise.charges_at_call == [1, 2, 3, 4, 5]  # every draw after its own stage's charge
    # (sum u^2, w1 sum u, w0 n_within, w0 n_clipped) in one release: 20,000 persons run the split count
    assert noise.exact[-1].shape == (4,)
    assert noise.exact[-1][2] + noise.exact[-1][3] == pytest.approx(rel.parameters["moment_weights"][1] * y.size)
    assert rel.epsilon == pytest.approx(1.0, rel=1e-12) and rel.delta == pytest.approx(5e-7)


def test_one_long_tail_gives_no_bar_and_a_flag_while_light_tails_keep_theirs():
    """Flights dep_delay per aircraft (4,037 aircraft; the tail balance reads the right tail heavier,
    ~1% of aircraft far out hold ~58% of the variance, invisible to the profile): beyond the profile
    the tail is taken no lighter than x^-2 (as the mean takes it), so the variance has no bar and is
    flagged. Version 6 released bars that missed the exact variance, unflagged, in 33 of 200 numpy
    runs (4 of these 24 seeds). Gaussian person means keep their bars, and they cover."""
    from spark_jobs.datasets import load_flights

    df = load_flights()[["tailnum", "dep_delay"]].dropna()
    y = df[df.tailnum != "NA"].groupby("tailnum").dep_delay.mean().to_numpy(float)
    exact = float(y.var())
    one_sided = 0
    for s in range(24):
        ids = np.random.default_rng(s).integers(0, 2**32, y.size)
        rel = person_variance(NumpyAggregates({"v": y}, ids), "v", ScaleFreeVariancePlan(BUDGET), SeededNoise(s))
        assert rel.status == STATUS_OK
        if rel.parameters["tail_one_sided"]:
            one_sided += 1
            assert rel.error_bar is None and rel.parameters["interval_90"] is None
            assert rel.parameters["tail_flag"] and "one long tail" in rel.error_covers
        if rel.error_bar is not None and not rel.parameters["tail_flag"]:  # no unflagged bar that misses
            lo, hi = rel.parameters["interval_90"]
            assert lo <= exact <= hi, (s, rel.estimate, lo, hi, exact)
    assert one_sided >= 3
    covered, barred = 0, 0
    for s in range(12):
        g = np.random.default_rng(100 + s).normal(10.0, 5.0, 4000)
        rel = person_variance(backend(g), "v", ScaleFreeVariancePlan(BUDGET), SeededNoise(100 + s))
        assert not rel.parameters["tail_one_sided"]
        if rel.error_bar is not None:
            barred += 1
            covered += rel.parameters["interval_90"][0] <= g.var() <= rel.parameters["interval_90"][1]
    assert barred >= 10 and covered >= barred - 2


def test_too_small_accountant_refuses_before_any_noise():
    y = np.random.default_rng(2).normal(size=5000)
    acc = Accountant(Budget(1.0, 1e-6), [Charge("other", Budget(0.2), ALL_PERSONS)])
    noise = RecordingNoise(0, acc)
    with pytest.raises(BudgetExceededError):
        person_variance(backend(y), "v", ScaleFreeVariancePlan(BUDGET), noise, acc)
    assert noise.exact == [] and len(acc.charges) == 1


def test_insufficient_data_charges_only_the_range_stages():
    y = np.random.default_rng(3).normal(size=20)
    acc = Accountant(BUDGET)
    rel = person_variance(backend(y), "v", ScaleFreeVariancePlan(BUDGET), SeededNoise(1), acc)
    assert rel.status == STATUS_INSUFFICIENT and rel.estimate is None and rel.error_bar is None
    assert [c.stage for c in acc.charges] == [STAGE_RANGE, STAGE_RANGE_RETRY, STAGE_RANGE_RETRY2]
    assert (rel.epsilon, rel.delta) == pytest.approx((0.39, 1e-6))
    assert stddev_from_variance(rel) is rel


# ------------------------------------------------------------------------------------------------
# accuracy against numpy
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("dist", ["gaussian", "t5", "lognormal"])
def test_accuracy_against_numpy_var(seed, dist):
    rng = np.random.default_rng([seed, len(dist)])
    n = 20_000
    y = {"gaussian": lambda: rng.normal(40.0, 3.0, n), "t5": lambda: rng.standard_t(5, n) * 2.0 - 7.0,
         "lognormal": lambda: rng.lognormal(0.0, 0.5, n)}[dist]()
    truth = float(np.var(y))
    rel = person_variance(backend(y, seed), "v", ScaleFreeVariancePlan(BUDGET), SeededNoise(seed))
    assert rel.status == STATUS_OK
    assert abs(rel.estimate - truth) <= 0.1 * truth
    sd = stddev_from_variance(rel)
    assert sd.estimate == pytest.approx(math.sqrt(rel.estimate))
    assert abs(sd.estimate - math.sqrt(truth)) <= 0.05 * math.sqrt(truth)
    if rel.error_bar is not None:  # the bar's interval maps through the square root
        lo, hi = rel.parameters["interval_90"]
        assert sd.parameters["interval_90"] == pytest.approx([math.sqrt(lo), math.sqrt(hi)])
        assert sd.error_bar == pytest.approx(max(sd.estimate - math.sqrt(lo), math.sqrt(hi) - sd.estimate))
        assert sd.noise_scale is None and sd.parameters["variance_noise_scale"] == rel.noise_scale


@pytest.mark.parametrize("value", [0.0, 17.5, -3e5])
def test_constant_data_gives_a_small_nonnegative_variance(value):
    y = np.full(5000, value)
    rel = person_variance(backend(y), "v", ScaleFreeVariancePlan(BUDGET), SeededNoise(4))
    assert rel.status == STATUS_OK and 0.0 <= rel.estimate
    scale = max(abs(value), 1.0)
    # the exact variance is 0: the release is its Laplace noise clamped at 0 (P(Laplace > 6
    # scales) = exp(-6) / 2), the noise scale small against the value (the radius a few bins
    # of the centre's histogram). Seed 4 drew a positive noise (0.03 at 17.5, 1.4 noise scales)
    # once the overflow check drew before it; the old bound (1e-3 x value)^2 held only for
    # draws that clamp at 0 (seeds 1 and 5 failed it too)
    assert rel.noise_scale <= (2e-2 * scale) ** 2
    assert rel.estimate <= max((1e-3 * scale) ** 2, 6.0 * rel.noise_scale)


# ------------------------------------------------------------------------------------------------
# sensitivity of the final stage on extreme neighbours
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("extreme", [1e300, -1e300, 3.2e29, 5.01, -1e-300])
@pytest.mark.parametrize("radius", [1e-9, 0.8, 3e4])
def test_final_stage_sensitivity_on_extreme_neighbours(extreme, radius):
    """Adding (or removing) one person, whatever their value, moves the exact released vector
    ``(sum u^2, w1 sum u, w0 n)`` by at most its declared l1 sensitivity, and each coordinate by
    at most its own bound."""
    y = np.random.default_rng(5).normal(5.0, 1.0, 500)
    w1, w0 = 0.3, 0.2
    exact = []
    for data in (y, np.r_[y, extreme]):
        noise = RecordingNoise(0)
        clipped_moments(backend(data), "v", 5.0, radius, w1, w0, ALL_PERSONS, 1.0, noise)
        exact.append(noise.exact[0])
        declared = noise.scales[0] * 1.0  # scale x epsilon = the declared l1 sensitivity
    diff = np.abs(exact[1] - exact[0])
    assert diff[0] <= SECOND_MOMENT_SENSITIVITY and diff[1] <= w1 * (1 + 1e-12) and diff[2] == pytest.approx(w0)
    assert diff.sum() <= declared
    assert declared == pytest.approx((SECOND_MOMENT_SENSITIVITY + w1 + w0) * (1 + SENSITIVITY_MARGIN), rel=1e-15)
    # the extreme person sits on the clip: their u^2 is (within rounding) 1 when far from the centre
    if abs(extreme - 5.0) > radius:
        assert diff[0] == pytest.approx(1.0, abs=2**-29)


def test_final_stage_moments_match_numpy():
    """With negligible noise, the released moments are numpy's of the truncated deviations."""
    rng = np.random.default_rng(6)
    y = rng.standard_t(4, 3000)
    c, rho = 0.2, 2.5
    u = np.clip((y - c) / rho, -1.0, 1.0)
    out = clipped_moments(backend(y), "v", c, rho, 0.5, 0.5, ALL_PERSONS, 1e12, SeededNoise(0))
    assert out.second == pytest.approx(np.sum(u * u), rel=1e-8)
    assert out.first == pytest.approx(np.sum(u), rel=1e-8, abs=1e-6)
    assert out.n_noisy == pytest.approx(3000, abs=1e-6)


def test_a_release_without_a_bar_is_flagged():
    """1,000 Gaussian persons (sd 0.3), epsilon 1, 30 seeds: in 9 runs the profile gives no finite
    bound on a second moment's clipping bias and the variance has no bar. Each of those is flagged
    now (a new user read a released variance of 0.0, no bar, `flagged` false, as valid)."""
    from dplib.aggregates import NumpyAggregates
    from dplib.budget import Budget
    from dplib.mechanisms import SeededNoise
    from dplib.variance import ScaleFreeVariancePlan, person_variance

    y = np.random.default_rng(1).normal(5.0, 0.3, 1000)
    no_bar = 0
    for s in range(30):
        be = NumpyAggregates({"v": y}, np.random.default_rng(s).integers(0, 2**32, 1000))
        rel = person_variance(be, "v", ScaleFreeVariancePlan(Budget(1.0, 1e-6)), SeededNoise(s))
        if rel.error_bar is None:
            no_bar += 1
            assert rel.parameters["tail_flag"] is True and rel.error_covers.startswith("nothing")
    assert no_bar >= 3


def test_a_release_without_a_bar_still_states_its_noise():
    """Released 0.0 with no bar (a heavy fitted tail): the text says how wide the noise alone is
    and that the data cannot tell the variance from 0 (a new user read four 0.0 releases, noise
    quantile 12x the exact variance, as measured zeros: that figure was only in the parameters)."""
    seen, near_zero = 0, 0
    for s in range(20):
        y = np.random.default_rng(300 + s).lognormal(0.0, 1.0, 2000)
        rel = person_variance(backend(y), "v", ScaleFreeVariancePlan(Budget(0.5, 1e-6)), SeededNoise(s))
        if rel.status != STATUS_OK or rel.error_bar is not None:
            continue
        seen += 1
        q = rel.parameters["noise_quantile"]
        assert f"+-{q:.3g}" in rel.error_covers
        assert ("cannot tell this variance from 0" in rel.error_covers) == (q >= rel.estimate)
        near_zero += q >= rel.estimate
    assert seen >= 15 and near_zero >= 1


def test_an_atom_or_an_unmeasured_tail_gives_no_bar(monkeypatch):
    """Most persons at one value with a far minority (94% of 2,200 persons at 5, the others spread
    up to ~100x the centre's bin away): version 7's bars missed the exact variance unflagged in a
    quarter of the runs on such columns (countymurders execs 48 and airfare passen 55 of 200,
    benchmarks/variance_bars.py). Now no bar, flagged, saying why (an atom, or over 30% of the
    persons beyond everything the profile measured); Gaussian person means keep theirs."""
    import dplib.variance as var

    rng = np.random.default_rng(9)
    atom = np.where(rng.random(2200) < 0.94, 5.0, 5.0 + rng.lognormal(-2.0, 1.5, 2200))
    caught = 0
    for s in range(20):
        rel = person_variance(backend(atom), "v", ScaleFreeVariancePlan(BUDGET), SeededNoise(s))
        p = rel.parameters
        if rel.error_bar is not None and not p["tail_flag"]:
            lo, hi = p["interval_90"]
            assert lo <= atom.var() <= hi, (s, rel.estimate, atom.var())
        if p["profile_atom"] is not None or p["profile_unmeasured_share"] > var.UNMEASURED_SURVIVAL:
            caught += 1
            assert rel.error_bar is None and p["tail_flag"]
            assert ("most persons' means sit at one value" in rel.error_covers
                    or "of the persons lie beyond everything the deviation profile measured" in rel.error_covers)
    assert caught >= 15, caught
    g = np.random.default_rng(3).normal(10.0, 5.0, 4000)
    for s in range(10):
        rel = person_variance(backend(g), "v", ScaleFreeVariancePlan(BUDGET), SeededNoise(200 + s))
        assert rel.parameters["profile_atom"] is None and rel.parameters["profile_unmeasured_share"] < var.UNMEASURED_SURVIVAL
        assert rel.error_bar is not None or rel.parameters["tail_one_sided"]
    # each rule alone, on the same Gaussian profile (the reads are post-processing of the profile)
    monkeypatch.setattr(var, "profile_reads", lambda profile, eps: (None, 0.4))
    rel = person_variance(backend(g), "v", ScaleFreeVariancePlan(BUDGET), SeededNoise(200))
    assert rel.error_bar is None and rel.parameters["tail_flag"] and "about 40% of the persons lie beyond" in rel.error_covers
    monkeypatch.setattr(var, "profile_reads", lambda profile, eps: (0.25, 0.0))
    rel = person_variance(backend(g), "v", ScaleFreeVariancePlan(BUDGET), SeededNoise(200))
    assert rel.error_bar is None and "near 0.25 from the centre" in rel.error_covers
    # the atom's read: a drop of half the persons within one octave, to at most a quarter, with persons beyond
    assert var._atom(np.array([0.0, 1.0, 1.414, 2.0, 2.83]), np.array([1.0, 0.95, 0.9, 0.1, 0.05])) == 1.0
    assert var._atom(np.array([0.0, 1.0, 2.0, 4.0]), np.array([1.0, 0.62, 0.32, 0.05])) is None  # a Gaussian's fall
    assert var._atom(np.array([0.0, 1.0, 2.0]), np.array([1.0, 0.2, 0.1])) == 0.0  # at the centre
