"""Unit tests of the scale-free multivariate mean (:mod:`dplib.mean.scale_free_multivariate`) and
of the aggregate it adds (``norm_log_histogram``).

Oracles: norms and their binary exponents computed here with Python's exact ``math.frexp`` on
hand-picked points; the plan's cost against the budget; the accountant's record against the
stages that must have run; neighbours that differ by one extreme person.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from dplib.aggregates import MIN_EXPONENT, VALUE_BOUND, NumpyAggregates
from dplib.budget import Accountant, Budget, BudgetExceededError, composed_cost
from dplib.errors import InvalidParameterError
from dplib.groups import ALL_PERSONS
from dplib.mean.multivariate import STATUS_INSUFFICIENT, STATUS_OK
from dplib.mean.scale_free_multivariate import (
    CENTRE_SHARE,
    NORM_SHARE,
    RANGE_JOINT_SHARE,
    RANGE_RETRY2_SHARE,
    RANGE_RETRY_SHARE,
    RANGE_SHARE,
    SCALES_SHARE,
    SMALL_DATA_BOOST,
    STAGE_FINAL,
    STAGE_RANGES,
    STAGE_RANGES_JOINT,
    STAGE_RANGES_RETRY,
    STAGE_RANGES_RETRY2,
    ScaleFreeMultivariatePlan,
    _interpolated_median,
    scale_free_multivariate_mean,
)
from dplib.mean.ranges import DeviationProfile
from dplib.mechanisms import SeededNoise

EPS, DELTA = 1.0, 1e-6


def _cols(d):
    return [f"x{j}" for j in range(d)]


def _backend(values, seed=0):
    gi = np.random.default_rng([7, seed]).integers(0, 2**32, values.shape[0])
    return NumpyAggregates({c: values[:, j] for j, c in enumerate(_cols(values.shape[1]))}, gi)


def _key(norm: float, n_sub: int = 2) -> int:
    """Our own log key of a positive norm with half-octave sub-edges: exact exponent by frexp."""
    if norm < 2.0**MIN_EXPONENT:
        return 0
    m, e = math.frexp(norm)  # norm = m 2^e, m in [0.5, 1)
    e -= 1  # norm = (2m) 2^e, 2m in [1, 2)
    sub = 1 if 2 * m >= 2.0**0.5 else 0
    return 1 + (e - MIN_EXPONENT) * n_sub + sub


# ------------------------------------------------------------------------------------------------
# norm_log_histogram
# ------------------------------------------------------------------------------------------------


def test_norm_log_histogram_matches_exact_exponents():
    # (3, 4) -> 5; (0, 0) -> 0; (1, 1) -> sqrt 2 (exactly on the half-octave edge, rounded norm);
    # (-8, 0) -> 8; scaled by (2, 1): (6, 4)/(2,1) = (3, 4) -> 5
    vals = np.array([[3.0, 4.0], [0.0, 0.0], [-8.0, 0.0], [6.0, 4.0], [1e300, -1e300]])
    be = _backend(vals)
    got = be.norm_log_histogram(["x0", "x1"], np.zeros(2), None, ALL_PERSONS, (2.0**0.5,))
    expect: dict[int, int] = {}
    for v in vals:
        # the same overflow-free scaled norm the backends use
        s = max(abs(v[0]), abs(v[1]))
        nrm = s * math.sqrt((v[0] / s) ** 2 + (v[1] / s) ** 2) if s > 0 else 0.0
        nrm = min(nrm, VALUE_BOUND)  # the log key clamps at the value bound, as for any value
        expect[_key(nrm)] = expect.get(_key(nrm), 0) + 1
    assert got == expect
    assert got[_key(5.0)] == 1 and got[0] == 1 and got[_key(8.0)] == 1
    scaled = be.norm_log_histogram(["x0", "x1"], np.zeros(2), np.array([2.0, 1.0]), ALL_PERSONS, (2.0**0.5,))
    # (6, 4) / (2, 1) = (3, 4) -> 5, (3, 4) / (2, 1) -> 4.27, (-8, 0) / (2, 1) -> 4: all in [4, 4 sqrt 2)
    assert scaled[_key(5.0)] == 3 and _key(4.0) == _key(5.0) == _key(4.27)


def test_norm_log_histogram_d1_is_the_absolute_deviation():
    vals = np.array([[1.0], [-3.0], [2.5]])
    got = _backend(vals).norm_log_histogram(["x0"], np.array([1.0]), None, ALL_PERSONS, (2.0**0.5,))
    assert got == {0: 1, _key(4.0): 1, _key(1.5): 1}


@pytest.mark.parametrize("extreme", [1e300, -1e300, 0.0, 5e-324])
def test_norm_log_histogram_sensitivity_one_person_one_bin(extreme):
    rng = np.random.default_rng(3)
    base = rng.normal(size=(200, 3))
    plus = np.vstack([base, [[extreme, 1.0, -2.0]]])
    c, s = np.array([0.1, 0.2, 0.3]), np.array([1.0, 2.0, 1e-300])
    a = NumpyAggregates({c_: base[:, j] for j, c_ in enumerate(_cols(3))}, np.arange(200))
    b = NumpyAggregates({c_: plus[:, j] for j, c_ in enumerate(_cols(3))}, np.arange(201))
    ha = a.norm_log_histogram(_cols(3), c, s, ALL_PERSONS, (2.0**0.5,))
    hb = b.norm_log_histogram(_cols(3), c, s, ALL_PERSONS, (2.0**0.5,))
    diff = {k: hb.get(k, 0) - ha.get(k, 0) for k in set(ha) | set(hb)}
    assert sorted(v for v in diff.values() if v) == [1]


def test_norm_log_histogram_skips_persons_missing_a_column():
    vals = np.array([[1.0, np.nan], [1.0, 1.0]])
    got = _backend(vals).norm_log_histogram(_cols(2), np.zeros(2), None, ALL_PERSONS)
    assert sum(got.values()) == 1


# ------------------------------------------------------------------------------------------------
# plan
# ------------------------------------------------------------------------------------------------


def test_plan_cost_is_the_budget_and_shares_are_the_documented_ones():
    plan = ScaleFreeMultivariatePlan(Budget(2.0, 1e-6), 4)
    cost = plan.cost()
    assert cost.epsilon == pytest.approx(2.0, rel=1e-12)
    assert cost.delta == pytest.approx(1e-6, rel=1e-12)
    eps = {c.stage: c.budget.epsilon for c in plan.charges()}
    b = SMALL_DATA_BOOST
    final = (1.0 - RANGE_SHARE - RANGE_RETRY_SHARE - RANGE_RETRY2_SHARE - RANGE_JOINT_SHARE
             - b * (CENTRE_SHARE + SCALES_SHARE + NORM_SHARE))
    assert eps[STAGE_FINAL] == pytest.approx(2.0 * final)
    assert eps[STAGE_RANGES_JOINT] == pytest.approx(2.0 * RANGE_JOINT_SHARE)
    delta = {c.stage: c.budget.delta for c in plan.charges()}
    assert (delta[STAGE_RANGES], delta[STAGE_RANGES_RETRY], delta[STAGE_RANGES_RETRY2], delta[STAGE_RANGES_JOINT],
            delta[STAGE_FINAL]) == (pytest.approx(1e-6 / 4), pytest.approx(1e-6 / 8), pytest.approx(1e-6 / 8), 0.0,
                                    pytest.approx(1e-6 / 2))
    assert eps[STAGE_RANGES] == pytest.approx(2.0 * RANGE_SHARE)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"budget": Budget(1.0, 0.0), "d": 2}, "delta"),
        ({"budget": Budget(1.0, 1e-6), "d": 0}, "d"),
        ({"budget": Budget(1.0, 1e-6), "d": True}, "d"),
        ({"budget": Budget(1.0, 1e-6), "d": 2, "k": 1.0}, "k"),
        ({"budget": Budget(1.0, 1e-6), "d": 2, "range_quantile": 1.0}, "range_quantile"),
        ({"budget": (1.0, 1e-6), "d": 2}, "budget"),
        ({"budget": Budget(1.0, 1e-6), "d": 2, "range_share": 0.0}, "range_share"),
        ({"budget": Budget(1.0, 1e-6), "d": 2, "range_retry_share": True}, "range_retry_share"),
        ({"budget": Budget(1.0, 1e-6), "d": 2, "range_share": 0.3, "range_retry_share": 0.5}, "final stage"),
        ({"budget": Budget(1.0, 1e-6), "d": 2, "range_retry2_share": -0.1}, "range_retry2_share"),
        ({"budget": Budget(1.0, 1e-6), "d": 2, "range_joint_share": 1.0}, "range_joint_share"),
        ({"budget": Budget(1.0, 1e-6), "d": 2, "range_joint_share": True}, "range_joint_share"),
    ],
)
def test_bad_plan_parameters_are_named(kwargs, name):
    with pytest.raises(InvalidParameterError, match=name):
        ScaleFreeMultivariatePlan(**kwargs)


# ------------------------------------------------------------------------------------------------
# runs
# ------------------------------------------------------------------------------------------------


def _gauss(n, d, seed, mu=5.0):
    return mu + np.random.default_rng([11, seed]).standard_normal((n, d))


def test_large_data_runs_without_retry_and_charges_exactly_the_budget():
    y = _gauss(20_000, 3, 0)
    acc = Accountant(Budget(EPS, DELTA))
    rel = scale_free_multivariate_mean(_backend(y), _cols(3), ScaleFreeMultivariatePlan(Budget(EPS, DELTA), 3), SeededNoise(1), acc)
    assert rel.status == STATUS_OK
    stages = [c.stage for c in acc.charges]
    assert STAGE_RANGES_RETRY not in stages and stages[0] == STAGE_RANGES and stages[-1] == STAGE_FINAL
    eps, delta = composed_cost(acc.charges)
    assert eps == pytest.approx(EPS, rel=1e-12)
    assert delta == pytest.approx(0.75 * DELTA, rel=1e-12)  # the retry's delta/4 is never spent
    assert (rel.epsilon, rel.delta) == pytest.approx((eps, delta))
    # an accurate answer: noise of order sqrt(d) R sigma / n with R ~ 4, sigma ~ 5 / 0.76
    err = np.linalg.norm(rel.estimate - y.mean(0))
    assert err < 0.02, err
    assert rel.error_bar.shape == (3,) and np.all(rel.error_bar > 0)
    assert rel.parameters["tail_flag"] is False


def test_small_data_retries_and_still_charges_the_budget():
    y = _gauss(300, 2, 1)
    acc = Accountant(Budget(EPS, DELTA))
    rel = scale_free_multivariate_mean(_backend(y), _cols(2), ScaleFreeMultivariatePlan(Budget(EPS, DELTA), 2), SeededNoise(2), acc)
    stages = [c.stage for c in acc.charges]
    assert STAGE_RANGES_RETRY in stages
    assert rel.status == STATUS_OK and rel.parameters["range_retried"] is True
    eps, _ = composed_cost(acc.charges)
    assert eps == pytest.approx(EPS, rel=1e-12)


class _SpyBackend:
    """NumpyAggregates that records which columns each log_histograms call read."""

    def __init__(self, inner):
        self._inner, self.log_calls = inner, []

    def log_histograms(self, columns, centres, group, *args):
        self.log_calls.append(list(columns))
        return self._inner.log_histograms(columns, centres, group, *args)

    def __getattr__(self, name):
        return getattr(self._inner, name)


def test_retry_reads_only_the_coordinates_the_first_run_left_without_a_range():
    # x0: every person at 5 (one magnitude bucket of 3,000: passes the first run's threshold,
    # ~1 + log(1 / delta_j) / eps_j ~ 1,100 at eps_j = 0.02); x1: N(0, 100) spread over ~10
    # signed buckets of < 600 each (fails it, passes the retry's ~240 at eps_j = 0.1, the
    # retry's whole share on one coordinate)
    rng = np.random.default_rng(5)
    y = np.column_stack([np.full(3_000, 5.0), 100.0 * rng.standard_normal(3_000)])
    spy = _SpyBackend(_backend(y))
    acc = Accountant(Budget(EPS, DELTA))
    plan = ScaleFreeMultivariatePlan(Budget(EPS, DELTA), 2)
    rel = scale_free_multivariate_mean(spy, _cols(2), plan, SeededNoise(4), acc)
    assert spy.log_calls[:2] == [["x0", "x1"], ["x1"]]
    assert rel.parameters["range_retried_coordinates"] == [1]
    retry = next(c for c in acc.charges if c.stage == STAGE_RANGES_RETRY)
    assert retry.budget.epsilon == pytest.approx(EPS * RANGE_RETRY_SHARE)  # charged in full, for one coordinate
    assert rel.status == STATUS_OK
    lo0, hi0 = rel.parameters["coordinate_ranges"][0]
    assert lo0 <= 5.0 <= hi0 and hi0 - lo0 <= 8.0  # x0 keeps its first-run bucket [4, 8)
    eps, _ = composed_cost(acc.charges)
    assert eps == pytest.approx(EPS, rel=1e-12)


def test_plan_range_shares_move_the_final_stage():
    plan = ScaleFreeMultivariatePlan(Budget(1.0, 1e-6), 4, range_share=0.1, range_retry_share=0.3)
    eps = {c.stage: c.budget.epsilon for c in plan.charges()}
    b = SMALL_DATA_BOOST
    assert eps[STAGE_RANGES] == pytest.approx(0.1) and eps[STAGE_RANGES_RETRY] == pytest.approx(0.3)
    assert eps[STAGE_FINAL] == pytest.approx(
        1.0 - 0.1 - 0.3 - RANGE_RETRY2_SHARE - RANGE_JOINT_SHARE - b * (CENTRE_SHARE + SCALES_SHARE + NORM_SHARE))
    assert plan.cost().epsilon == pytest.approx(1.0, rel=1e-12)
    off = ScaleFreeMultivariatePlan(Budget(1.0, 1e-6), 4, range_retry2_share=0.0, range_joint_share=0.0)
    assert not {STAGE_RANGES_RETRY2, STAGE_RANGES_JOINT} & {c.stage for c in off.charges()}
    assert {c.stage: c.budget.delta for c in off.charges()}[STAGE_RANGES_RETRY] == pytest.approx(1e-6 / 4)


def test_second_retry_reads_only_what_both_runs_missed():
    # 1,000 persons, d = 4, the covariance benchmark's coordinates: the first run (4% split four
    # ways, thresholded: ~4,700 persons in a bucket) misses all four; the retry (10% split four
    # ways, Laplace on the public exponent range's two-octave buckets, a range only if the top
    # bucket reaches ln(103 / 1e-3) = 11.5 noise scales: ~460 persons at eps_j = 0.025) keeps the
    # three narrow ones (fullest buckets of 600-1,000 persons) and misses the sd-10 one (~250);
    # the second retry (15% on that one alone: ~77) finds it. Then a release: the
    # accuracy/coverage study is in benchmarks/results/multivariate_small_n.md.
    rng = np.random.default_rng(12)
    y = 5.0 + rng.standard_normal((1_000, 4)) * np.array([1.0, 10.0, 0.1, 3.0])
    spy = _SpyBackend(_backend(y))
    acc = Accountant(Budget(EPS, DELTA))
    rel = scale_free_multivariate_mean(spy, _cols(4), ScaleFreeMultivariatePlan(Budget(EPS, DELTA), 4), SeededNoise(1), acc)
    assert spy.log_calls[:3] == [_cols(4), _cols(4), ["x1"]]
    assert rel.parameters["range_retried_twice_coordinates"] == [1]
    assert [c.stage for c in acc.charges][:3] == [STAGE_RANGES, STAGE_RANGES_RETRY, STAGE_RANGES_RETRY2]
    assert rel.status == STATUS_OK
    assert composed_cost(acc.charges)[0] == pytest.approx(EPS, rel=1e-12)


def test_too_few_persons_is_insufficient_and_keeps_only_the_range_charges():
    y = _gauss(5, 2, 2)
    acc = Accountant(Budget(EPS, DELTA))
    rel = scale_free_multivariate_mean(_backend(y), _cols(2), ScaleFreeMultivariatePlan(Budget(EPS, DELTA), 2), SeededNoise(3), acc)
    assert rel.status == STATUS_INSUFFICIENT and rel.estimate is None and rel.error_bar is None
    assert [c.stage for c in acc.charges] == [STAGE_RANGES, STAGE_RANGES_RETRY, STAGE_RANGES_RETRY2,
                                              STAGE_RANGES_JOINT]
    assert rel.epsilon == pytest.approx(EPS * (RANGE_SHARE + RANGE_RETRY_SHARE + RANGE_RETRY2_SHARE + RANGE_JOINT_SHARE))


class _Raising:
    def check_columns(self, columns):
        if "nope" in columns:
            raise InvalidParameterError("unknown column 'nope'")

    def __getattr__(self, name):
        raise AssertionError(f"data read before the checks: {name}")


@pytest.mark.parametrize("columns, match", [(["x0"], "d=2"), (["x0", "x0"], "distinct"), (["x0", "nope"], "nope")])
def test_bad_columns_are_refused_before_any_charge(columns, match):
    acc = Accountant(Budget(EPS, DELTA))
    with pytest.raises(InvalidParameterError, match=match):
        scale_free_multivariate_mean(_Raising(), columns, ScaleFreeMultivariatePlan(Budget(EPS, DELTA), 2), SeededNoise(0), acc)
    assert acc.charges == []


def test_plan_larger_than_the_accountant_is_refused_before_any_charge():
    acc = Accountant(Budget(0.5, DELTA))
    with pytest.raises(BudgetExceededError):
        scale_free_multivariate_mean(_Raising(), _cols(2), ScaleFreeMultivariatePlan(Budget(EPS, DELTA), 2), SeededNoise(0), acc)
    assert acc.charges == []


@pytest.mark.parametrize(
    "values",
    [
        np.full((3000, 2), 7.0),  # constant coordinates
        np.column_stack([np.zeros(3000), np.random.default_rng(1).normal(size=3000)]),  # one all-zero
        np.random.default_rng(2).normal(size=(3000, 2)) * 1e150 + 1e300,  # near the value bound
        np.random.default_rng(3).normal(size=(3000, 2)) * 1e-200,  # tiny
    ],
)
def test_extreme_data_gives_a_finite_release_or_insufficient(values):
    rel = scale_free_multivariate_mean(_backend(values), _cols(2), ScaleFreeMultivariatePlan(Budget(EPS, DELTA), 2), SeededNoise(5))
    assert rel.status in (STATUS_OK, STATUS_INSUFFICIENT)
    if rel.status == STATUS_OK:
        assert np.all(np.isfinite(rel.estimate))
        assert rel.error_bar is None or np.all(rel.error_bar >= 0)


def test_constant_data_is_recovered():
    y = np.full((3000, 2), 7.0)
    rel = scale_free_multivariate_mean(_backend(y), _cols(2), ScaleFreeMultivariatePlan(Budget(EPS, DELTA), 2), SeededNoise(6))
    assert rel.status == STATUS_OK
    # every person sits at the same deviation from the DP centre: the clipped mean is exact up to
    # the final noise, which the bar covers; the error is small against the DP range (width 4)
    assert np.all(np.abs(rel.estimate - 7.0) <= rel.error_bar)
    assert np.all(np.abs(rel.estimate - 7.0) < 0.2)


def test_scale_equivariance():
    """The same persons in other units (x 1e6, shifted) give the same estimate in those units
    (every bin, radius and scale is relative; the seeded noise is the same): a power-of-two
    factor is exact up to the data's own rounding."""
    y = _gauss(5000, 3, 4)
    f = 2.0**20
    r1 = scale_free_multivariate_mean(_backend(y), _cols(3), ScaleFreeMultivariatePlan(Budget(EPS, DELTA), 3), SeededNoise(8))
    r2 = scale_free_multivariate_mean(_backend(y * f), _cols(3), ScaleFreeMultivariatePlan(Budget(EPS, DELTA), 3), SeededNoise(8))
    assert np.allclose(r2.estimate / f, r1.estimate, rtol=1e-9)


def test_interpolated_median_of_a_known_profile():
    edges = np.array([0.0, 1.0, 2.0, 4.0, np.inf])
    w = np.array([10.0, 20.0, 10.0, 0.0])  # CDF 0.25, 0.75, 1.0: median inside [1, 2)
    prof = DeviationProfile(edges, w, 0.0, w)
    # half-way in CDF between 0.25 and 0.75 -> geometric midpoint of [1, 2]
    assert _interpolated_median(prof) == pytest.approx(math.sqrt(2.0))
    empty = DeviationProfile(edges, np.zeros(4), 0.0, np.zeros(4))
    assert _interpolated_median(empty) == 4.0


def test_huge_bins_keep_an_extreme_person_in_the_top_bin():
    """Review finding: a bin width near 2^997 made the default clamp infinite and a person at
    1.8e308 overflowed its bin index to the bottom bin. Now: the top bin, no warning."""
    import warnings

    vals = np.array([[1.797e308], [0.0], [-1.797e308]])
    w = 2.0**997 / 8
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (h,) = _backend(vals).histograms(["x0"], [w], [-2.0**997], ALL_PERSONS)
    top = int(np.floor((1e300 + 2.0**997) / w))
    assert h == {top: 1, int(np.floor(2.0**997 / w)): 1, int(np.floor((-1e300 + 2.0**997) / w)): 1}


def test_clip_of_tiny_norms_raises_no_warning():
    import warnings

    from dplib.aggregates import clip_deviations

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = clip_deviations(np.array([[1e-320, 0.0], [3.0, 4.0]]), np.zeros(2), 1e10)
    assert np.array_equal(out, np.array([[1e-320, 0.0], [3.0, 4.0]]))


def test_final_share_cap():
    """``final_share_max``: the final stage is listed at the cap and charged at most cap x epsilon
    (the rest stays unspent for the caller); out-of-range caps are refused."""
    rng = np.random.default_rng(2)
    y = rng.standard_normal((5000, 2)) * [1.0, 4.0] + [3.0, -20.0]
    plan = ScaleFreeMultivariatePlan(Budget(1.0, 1e-6), 2, final_share_max=0.2)
    listed = {c.stage: c.budget.epsilon for c in plan.charges()}
    assert listed[STAGE_FINAL] == pytest.approx(0.2)
    acc = Accountant(Budget(1.0, 1e-6))
    rel = scale_free_multivariate_mean(NumpyAggregates({"a": y[:, 0], "b": y[:, 1]}, rng.integers(0, 2**32, 5000)),
                                       ["a", "b"], plan, SeededNoise(3), acc)
    assert rel.status == STATUS_OK
    final = [c.budget.epsilon for c in acc.charges if c.stage == STAGE_FINAL]
    assert final == [pytest.approx(0.2)] and rel.epsilon < 1.0
    assert np.all(np.abs(rel.estimate - y.mean(0)) <= 5.0 * rel.error_bar)
    for bad in (0.0, 1.0, True, "0.2", 0.9):  # 0.9: more than the other stages leave after retries
        with pytest.raises(InvalidParameterError, match="final_share_max"):
            ScaleFreeMultivariatePlan(Budget(1.0, 1e-6), 2, final_share_max=bad)


def test_retry_range_reaching_the_top_bucket_is_no_range():
    """A retry reads the public exponent range (-40, 60): a coordinate whose persons sit beyond
    2^60 lands in the top bucket, which also holds every larger value; such a range is refused
    (INSUFFICIENT_DATA) rather than read as [2^60, 2^62) (a confidently wrong scale)."""
    rng = np.random.default_rng(3)
    y = np.column_stack([5.0 + rng.standard_normal(600), 1e25 * (1.0 + 0.1 * rng.standard_normal(600))])
    acc = Accountant(Budget(EPS, DELTA))
    rel = scale_free_multivariate_mean(_backend(y), _cols(2), ScaleFreeMultivariatePlan(Budget(EPS, DELTA), 2),
                                       SeededNoise(2), acc)
    assert rel.status == STATUS_INSUFFICIENT and rel.estimate is None
    assert rel.parameters["range_retried_coordinates"] == [0, 1] or rel.parameters["range_retried_coordinates"] == [1]
    assert rel.parameters.get("range_retried_twice_coordinates") == [1]


@pytest.mark.parametrize("exponent,kept", [(58, True), (59, True), (60, False), (61, False)])
def test_retry_top_bucket_boundary(exponent, kept):
    """The retries' top bucket starts at 2^60 (top_bucket_start, from the buckets themselves): a
    coordinate whose persons sit in [2^e, 2^(e+1)) keeps its range for e < 60, gets none from 60."""
    from dplib.mean.ranges import top_bucket_start
    from dplib.mean.scale_free_multivariate import RETRY_EXPONENT_RANGE, RETRY_OCTAVES

    assert top_bucket_start(RETRY_EXPONENT_RANGE, RETRY_OCTAVES) == 2.0**60
    y = np.column_stack([5.0 + np.random.default_rng(1).standard_normal(600),
                         np.full(600, 1.5 * 2.0**exponent)])
    acc = Accountant(Budget(EPS, DELTA))
    rel = scale_free_multivariate_mean(_backend(y), _cols(2), ScaleFreeMultivariatePlan(Budget(EPS, DELTA), 2),
                                       SeededNoise(4), acc)
    assert 1 in rel.parameters["range_retried_coordinates"]  # the first, thresholded run missed it
    if kept:
        lo, hi = rel.parameters["coordinate_ranges"][1]
        assert lo <= 1.5 * 2.0**exponent <= hi <= 2.0**60
    else:
        assert rel.status == STATUS_INSUFFICIENT


def test_retries_pass_the_confirmation(monkeypatch):
    """ranges_run hands the retries RETRY_CONFIRM_BETA (and the pure buckets); the first run none."""
    import dplib.mean.scale_free_multivariate as mv

    seen = []
    real = mv.magnitude_range_from_counts

    def spy(*a, **k):
        seen.append((a[2] if len(a) > 2 else k.get("delta"), a[7] if len(a) > 7 else k.get("confirm_beta")))
        return real(*a, **k)

    monkeypatch.setattr(mv, "magnitude_range_from_counts", spy)
    rng = np.random.default_rng(12)
    y = 5.0 + rng.standard_normal((1_000, 4)) * np.array([1.0, 10.0, 0.1, 3.0])
    scale_free_multivariate_mean(_backend(y), _cols(4), ScaleFreeMultivariatePlan(Budget(EPS, DELTA), 4), SeededNoise(1))
    first, retries = seen[:4], seen[4:]
    assert all(d > 0 and b is None for d, b in first)
    assert retries and all(d == 0.0 and b == mv.RETRY_CONFIRM_BETA for d, b in retries)


@pytest.mark.parametrize("beta", [0, -1, 1, 2, float("nan"), float("inf"), True])
def test_confirm_beta_is_checked(beta):
    from dplib.errors import InvalidParameterError
    from dplib.mean.ranges import magnitude_range_from_counts

    with pytest.raises(InvalidParameterError, match="confirm_beta"):
        magnitude_range_from_counts({}, 0.5, 0.0, SeededNoise(0), 0.9, (-40, 60), 2, beta)
    with pytest.raises(InvalidParameterError, match="confirm_beta"):
        magnitude_range_from_counts({}, 0.5, 1e-6, SeededNoise(0), 0.9, (-40, 60), 2, 1e-3)


# ------------------------------------------------------------------------------------------------
# the joint-norm range retry
# ------------------------------------------------------------------------------------------------

#: 1,000 persons, sds (1, 10, 0.1, 3) about 5: the covariance benchmark's units
_UNITS = np.array([1.0, 10.0, 0.1, 3.0])


def _units_data(n=1_000, seed=12):
    return 5.0 + np.random.default_rng(seed).standard_normal((n, 4)) * _UNITS


def _key1(norm: float) -> int:
    """Our own log key of a norm without sub-edges: exact binary exponent by frexp."""
    if norm < 2.0**MIN_EXPONENT:
        return 0
    _, e = math.frexp(norm)
    return 1 + (e - 1 - MIN_EXPONENT)


def test_joint_retry_is_one_full_share_histogram_of_the_missed_coordinates_norms(monkeypatch):
    """The joint retry hands magnitude_range_from_counts ONE exact histogram: each person's l2 norm
    over the coordinates every earlier run missed (oracle: frexp of numpy norms), one count per
    person, at the stage's whole epsilon (not split over the coordinates), pure (delta 0) and with
    the retries' confirmation; those coordinates get [-U, U] holding the range quantile of |Y_j|."""
    import dplib.mean.scale_free_multivariate as mv

    seen = []
    real = mv.magnitude_range_from_counts

    def spy(counts, epsilon, delta, *a, **k):
        seen.append((dict(counts), epsilon, delta, a, k))
        return real(counts, epsilon, delta, *a, **k)

    monkeypatch.setattr(mv, "magnitude_range_from_counts", spy)
    y = _units_data()
    eps = 0.45  # the clipped covariance's stage 1 at epsilon 0.9
    plan = ScaleFreeMultivariatePlan(Budget(eps, DELTA), 4, range_retry2_share=0.0)
    acc = Accountant(Budget(eps, DELTA))
    spy = _ChargeOrderBackend(_backend(y), acc)
    rel = scale_free_multivariate_mean(spy, _cols(4), plan, SeededNoise(5), acc)
    joint = rel.parameters["range_joint_coordinates"]
    # seeded: the first two runs leave two of the four coordinates without a range (a proper
    # subset: a norm over all d columns would not match the oracle below)
    assert 2 <= len(joint) < 4, joint
    # the joint stage is charged before its histogram is read
    (charged_before,) = [k for cols, k in spy.norm_calls if cols == [f"x{j}" for j in joint]][:1]
    assert [c.stage for c in acc.charges][charged_before - 1] == STAGE_RANGES_JOINT
    assert [c.stage for c in acc.charges][:3] == [STAGE_RANGES, STAGE_RANGES_RETRY, STAGE_RANGES_JOINT]
    counts, e, d, args, _ = seen[-1]  # the joint call is the last range call
    expect: dict[int, int] = {}
    for nrm in np.linalg.norm(y[:, joint], axis=1):
        expect[_key1(float(nrm))] = expect.get(_key1(float(nrm)), 0) + 1
    assert counts == expect and sum(counts.values()) == len(y)
    assert e == pytest.approx(eps * RANGE_JOINT_SHARE) and d == 0.0
    assert args[-1] == mv.RETRY_CONFIRM_BETA
    for j in joint:
        lo, hi = rel.parameters["coordinate_ranges"][j]
        assert lo == -hi and np.mean(np.abs(y[:, j]) <= hi) >= 0.9
    assert composed_cost(acc.charges)[0] == pytest.approx(eps, rel=1e-12)


class _ChargeOrderBackend:
    """NumpyAggregates recording, per norm_log_histogram call, its columns and how many charges
    the accountant held when it was read."""

    def __init__(self, inner, accountant):
        self._inner, self._acc, self.norm_calls = inner, accountant, []

    def norm_log_histogram(self, columns, *args, **kwargs):
        self.norm_calls.append((list(columns), len(self._acc.charges)))
        return self._inner.norm_log_histogram(columns, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._inner, name)


def test_joint_retry_releases_where_per_coordinate_retries_cannot():
    """Power: at 1,000 persons and epsilon 0.45 (d = 4) the per-coordinate runs alone release in at
    most 2 of 20 seeded runs; with the joint retry (a quarter of the persons suffice) in all 20."""
    y = _units_data()
    be = _backend(y)
    on = ScaleFreeMultivariatePlan(Budget(0.45, DELTA), 4, range_retry2_share=0.0)
    off = ScaleFreeMultivariatePlan(Budget(0.45, DELTA), 4, range_retry2_share=0.0, range_joint_share=0.0)
    with_joint = sum(scale_free_multivariate_mean(be, _cols(4), on, SeededNoise(s)).status == STATUS_OK
                     for s in range(20))
    without = sum(scale_free_multivariate_mean(be, _cols(4), off, SeededNoise(s)).status == STATUS_OK
                  for s in range(20))
    assert with_joint == 20 and without <= 2, (with_joint, without)


def test_joint_retry_refuses_a_norm_beyond_the_top_bucket():
    """As the per-coordinate retries: a joint norm range reaching 2^60 (the top bucket, which also
    holds every larger value) is no range."""
    rng = np.random.default_rng(3)
    y = np.column_stack([1e25 * (1.0 + 0.1 * rng.standard_normal(600)), 1e25 * (1.0 + 0.1 * rng.standard_normal(600))])
    acc = Accountant(Budget(EPS, DELTA))
    rel = scale_free_multivariate_mean(_backend(y), _cols(2), ScaleFreeMultivariatePlan(Budget(EPS, DELTA), 2),
                                       SeededNoise(2), acc)
    assert rel.status == STATUS_INSUFFICIENT and rel.estimate is None
    assert rel.parameters["range_joint_coordinates"] == [0, 1]
    assert [c.stage for c in acc.charges][-1] == STAGE_RANGES_JOINT


def test_scale_is_capped_by_the_range_it_was_read_in():
    """Post-processing cap: the median of |Y_j - c_j| is at most the range's width plus c_j's
    distance from it, so a noisy profile median above that (noise in empty upper bins) is cut
    there (times SCALE_CAP). Every released scale obeys it (without the cap, seed 4 of this
    small-data case reads a noisy median about 20 times the cap)."""
    from dplib.mean.scale_free_multivariate import MAD_TO_SD, SCALE_CAP

    assert SCALE_CAP == 2.0  # the documented factor, written out below (not read from the module)
    y = _units_data()
    plan = ScaleFreeMultivariatePlan(Budget(0.45, DELTA), 4, final_share_max=0.1)
    for s in range(8):
        rel = scale_free_multivariate_mean(_backend(y), _cols(4), plan, SeededNoise(s))
        p = rel.parameters
        for j, (lo, hi) in enumerate(p["coordinate_ranges"]):
            c = p["coarse_center"][j]
            assert p["scales_used"][j] <= 2.0 * (hi - lo + max(lo - c, c - hi, 0.0)) / MAD_TO_SD * (1 + 1e-12)


def _plant_range(monkeypatch, lower, upper, call=0):
    """Make the ``call``-th range call of a run return [lower, upper] (a noise bucket that passed
    a confirmation), every other call as it is."""
    import dplib.mean.scale_free_multivariate as mv
    from dplib.mean.ranges import MagnitudeRange

    real, calls = mv.magnitude_range_from_counts, []

    def planted(*a, **k):
        calls.append(1)
        out = real(*a, **k)
        return MagnitudeRange(lower, upper, out.noisy_total if out is not None else 1_000.0) \
            if len(calls) - 1 == call else out

    monkeypatch.setattr(mv, "magnitude_range_from_counts", planted)


def test_a_range_that_misses_its_persons_stops_before_the_final_stage(monkeypatch):
    """Issue 20 (confident wrong answers): a coordinate given a range from a noise bucket (here
    planted: [2^-32, 2^-30] for a coordinate of sd 1 about 5, as a retry's confirmation lets
    through about once in 2,000 coordinates) has nearly all its persons in its scale profile's
    overflow bin: INSUFFICIENT_DATA naming the column, the norm and final stages not charged."""
    y = _units_data(3_000)
    _plant_range(monkeypatch, 2.0**-32, 2.0**-30, call=0)  # the first (thresholded) run's x0
    acc = Accountant(Budget(EPS, DELTA))
    rel = scale_free_multivariate_mean(_backend(y), _cols(4), ScaleFreeMultivariatePlan(Budget(EPS, DELTA), 4),
                                       SeededNoise(1), acc)
    assert rel.status == STATUS_INSUFFICIENT and rel.estimate is None
    assert rel.parameters["range_lost_coordinates"] == [0] and "x0" in rel.error_covers
    assert [c.stage for c in acc.charges][-1] == "coordinate scales"  # no norm profile, no final stage
    assert rel.epsilon == pytest.approx(composed_cost(acc.charges)[0])


def test_without_the_stop_the_planted_range_is_a_confident_wrong_answer(monkeypatch):
    """The mutant (the stop off): the same planted range releases OK with x0's bar missing its
    error by orders of magnitude. So the test above can fail."""
    import dplib.mean.scale_free_multivariate as mv

    monkeypatch.setattr(mv, "RANGE_LOST_SHARE", math.inf)
    y = _units_data(3_000)
    _plant_range(monkeypatch, 2.0**-32, 2.0**-30, call=0)
    rel = scale_free_multivariate_mean(_backend(y), _cols(4), ScaleFreeMultivariatePlan(Budget(EPS, DELTA), 4),
                                       SeededNoise(1))
    assert rel.status == STATUS_OK
    err = abs(rel.estimate[0] - y[:, 0].mean())
    assert err > 100.0 * rel.error_bar[0], (err, rel.error_bar[0])


def test_the_lost_range_stop_is_rare_on_ordinary_small_data():
    """Size: the stop's threshold (half the noisy persons and ln(1e4) noise scales) on ordinary
    data: no stop in 120 seeded runs at 300-1,000 persons (the floored share it replaced stopped
    2.5-5% of such runs); per coordinate its false rate is below 5e-5 by the Laplace tail."""
    stops = 0
    for n in (300, 600, 1_000):
        for s in range(40):
            rng = np.random.default_rng([n, s, 9])
            y = 5.0 + rng.standard_normal((n, 4)) * _UNITS
            rel = scale_free_multivariate_mean(_backend(y, s), _cols(4), ScaleFreeMultivariatePlan(Budget(EPS, DELTA), 4),
                                               SeededNoise(s))
            stops += "range_lost_coordinates" in rel.parameters
    assert stops == 0


def test_joint_range_minimum_persons_closed_form_and_power():
    """The dry run's figure: ceil(ln(103 / 1e-3) / (eps x 0.10) / 0.75) (103 public buckets); at
    1.3 times it, with every person's norm in one two-octave bucket ([4, 16)), the joint retry
    finds a range in at least 18 of 20 seeded runs (its confirmation: a Laplace draw above -0.3
    x 11.5 scales), and at 0.5 times in none."""
    plan = ScaleFreeMultivariatePlan(Budget(0.45, DELTA), 4, range_retry2_share=0.0)
    need = plan.joint_range_minimum_persons()
    assert need == math.ceil(math.log(103 / 1e-3) / (0.45 * 0.10) / 0.75) == 342
    assert ScaleFreeMultivariatePlan(Budget(0.45, DELTA), 4, range_joint_share=0.0).joint_range_minimum_persons() is None
    for factor, lo, hi in ((1.3, 18, 20), (0.5, 0, 0)):
        n = int(factor * need * 0.75)  # persons in the bucket
        found = 0
        for s in range(20):
            rng = np.random.default_rng([s, 5])
            # norms in [4, 16): four coordinates of 3 + U(0, 1) each (norm 6-8); the per-coordinate
            # runs at 1/4 of the share each cannot confirm their buckets at these sizes
            y = 3.0 + rng.random((n, 4))
            rel = scale_free_multivariate_mean(_backend(y, s), _cols(4), plan, SeededNoise(s))
            found += bool(rel.parameters.get("range_joint_coordinates")) and all(
                r is not None for r in rel.parameters.get("coordinate_ranges", [None]))
        assert lo <= found <= hi, (factor, found)


class _CallLog:
    """NumpyAggregates recording each log_histograms / norm_log_histogram call's arguments."""

    def __init__(self, inner):
        self._inner, self.calls = inner, []

    def log_histograms(self, columns, centres, group, *args):
        self.calls.append(("log", list(columns), list(centres), args))
        return self._inner.log_histograms(columns, centres, group, *args)

    def norm_log_histogram(self, columns, center, scales, group, *args):
        self.calls.append(("norm", list(columns), list(center), args))
        return self._inner.norm_log_histogram(columns, center, scales, group, *args)

    def __getattr__(self, name):
        return getattr(self._inner, name)


def test_joint_range_coordinates_share_one_scale_from_one_norm_histogram(monkeypatch):
    """Small data (noisy persons x a coordinate's scale epsilon < 30): the coordinates of a joint
    range get one scale from ONE half-octave histogram of ||Y_J - c_J|| (each person one bin) at
    k epsilon / d, and the scale stage's per-coordinate histograms read only the other
    coordinates; with the gate at 0 every coordinate reads its own histogram."""
    import dplib.mean.scale_free_multivariate as mv

    seen = []
    real = mv.deviation_profile_from_counts

    def spy(counts, epsilon, *a, **k):
        seen.append((sum(counts.values()), epsilon))
        return real(counts, epsilon, *a, **k)

    monkeypatch.setattr(mv, "deviation_profile_from_counts", spy)
    y = _units_data()
    eps = 0.45
    plan = ScaleFreeMultivariatePlan(Budget(eps, DELTA), 4, range_retry2_share=0.0)
    be = _CallLog(_backend(y))
    rel = scale_free_multivariate_mean(be, _cols(4), plan, SeededNoise(5))
    p = rel.parameters
    joint = p["range_joint_coordinates"]
    assert p["joint_scale_coordinates"] == joint and 2 <= len(joint) < 4
    assert len({p["scales_used"][j] for j in joint}) == 1
    own = [j for j in range(4) if j not in joint]
    half = (2.0**0.5,)
    scale_calls = [c for c in be.calls if c[3] == (half,)]
    # the scale stage: own coordinates' signed histograms, then the joint coordinates' norms about
    # their coarse centres
    assert scale_calls[0][:2] == ("log", [f"x{j}" for j in own])
    assert scale_calls[1][:3] == ("norm", [f"x{j}" for j in joint], [p["coarse_center"][j] for j in joint])
    eps_scales = eps * plan.scales_share * SMALL_DATA_BOOST
    # the profiles read in the scale stage: one per own coordinate at eps / d, the joint one at k eps / d
    stage = seen[-(len(own) + 2):-1]  # the last profile read is the norm profile
    assert [e for _, e in stage] == pytest.approx([eps_scales / 4] * len(own) + [eps_scales * len(joint) / 4])
    assert stage[-1][0] == len(y)  # every person in one bin of the joint histogram

    monkeypatch.setattr(mv, "JOINT_SCALE_N_EPS", 0.0)
    off = scale_free_multivariate_mean(_backend(y), _cols(4), plan, SeededNoise(5)).parameters
    assert "joint_scale_coordinates" not in off and len(set(off["scales_used"])) == 4


# ------------------------------------------------------------------------------------------------
# a zero-inflated coordinate: a first range of only the zero bucket retries
# ------------------------------------------------------------------------------------------------


def _zero_inflated(n: int, seed: int) -> np.ndarray:
    r = np.random.default_rng([seed, 5])
    return np.column_stack([
        r.normal(5, 1, n), np.where(r.random(n) < 0.93, 0.0, r.gamma(3.0, 5.0, n)), r.normal(-3, 2, n),
    ])


def test_zero_inflated_coordinate_retries_its_range():
    """20,000 persons, coordinate 1 exactly 0 for 93% of them (the rest Gamma(3, 5)): its first
    range run releases only the zero bucket (the others sit below the per-coordinate threshold),
    which made its window ~1e-12 wide and its released mean 0 (100% off: 20 of 20 numpy runs).
    Now it retries (only it: the others keep their first ranges) and its mean comes out within
    10% and within twice its bar in 6 seeded runs (measured: median 1.2%, bars covering 19 of 20)."""
    for s in range(6):
        y = _zero_inflated(20_000, s)
        rel = scale_free_multivariate_mean(_backend(y, s), _cols(3), ScaleFreeMultivariatePlan(Budget(EPS, DELTA), 3), SeededNoise(s))
        assert rel.status == STATUS_OK
        assert rel.parameters["range_retried_coordinates"] == [1]
        exact = y[:, 1].mean()
        assert abs(rel.estimate[1] - exact) <= 0.1 * exact
        assert abs(rel.estimate[1] - exact) <= 2.0 * rel.error_bar[1]


def test_zero_atom_kept_when_its_retry_releases_nothing(monkeypatch):
    """The retries of a zero-atom coordinate (the retry, the second retry, the joint retry: all
    pure, delta 0) release nothing: the first run's zero bucket (a DP output) stands and the run is
    released (not INSUFFICIENT_DATA); each later run was charged before it read."""
    import dplib.mean.scale_free_multivariate as mv

    real = mv.magnitude_range_from_counts

    def no_retry(*a, **k):
        return None if a[2] == 0.0 else real(*a, **k)  # the retries are the pure (delta 0) runs

    monkeypatch.setattr(mv, "magnitude_range_from_counts", no_retry)
    y = _zero_inflated(20_000, 1)
    acc = Accountant(Budget(EPS, DELTA))
    rel = scale_free_multivariate_mean(_backend(y, 1), _cols(3), ScaleFreeMultivariatePlan(Budget(EPS, DELTA), 3), SeededNoise(1), acc)
    assert rel.status == STATUS_OK
    assert rel.parameters["range_retried_coordinates"] == [1]
    lo, hi = rel.parameters["coordinate_ranges"][1]
    assert -1e-11 < lo < 0 < hi < 1e-11
    stages = [c.stage for c in acc.charges]
    assert stages[:4] == [STAGE_RANGES, STAGE_RANGES_RETRY, STAGE_RANGES_RETRY2, STAGE_RANGES_JOINT]
    assert rel.parameters["range_retried_twice_coordinates"] == [1]
    # the joint run read it and released nothing: no joint scale for it
    assert rel.parameters["range_joint_coordinates"] == [1] and rel.parameters["range_joint_retry_released"] is False
    # still the zero bucket alone: no bar (its scale is the zero bucket's), flagged, and why
    assert rel.parameters["zero_atom_coordinates"] == [1]
    assert rel.error_bar is None and rel.parameters["tail_flag"] is True
    assert rel.error_covers.startswith("nothing: x1: most persons are 0 (or within ~1e-11 of it)")


def _mostly_zero(n: int, seed: int) -> np.ndarray:
    """Coordinate 1 exactly 0 for ~94% of persons, the others lognormal over several octaves
    (countymurders' `execs`: 94% of 2,197 counties at 0)."""
    r = np.random.default_rng([seed, 11])
    z = np.where(r.random(n) > 0.94, r.lognormal(-1.5, 1.5, n), 0.0)
    return np.column_stack([r.normal(5, 1, n), z, r.normal(50, 10, n), r.normal(20, 3, n)])


def test_zero_atom_coordinate_releases_no_bar():
    """2,000 persons, coordinate 1 at exactly 0 for ~94% of them: no range run sees its other
    persons at d = 4, eps 0.9, so its range stays the zero bucket and its scale ~1e-12. Before, the
    release carried a bar of that scale (~1e-12) around a mean of ~0 against an exact mean near
    0.03: 10 of 10 numpy runs missed by orders of magnitude. Now: no bar, flagged, the reason names
    the column; the other coordinates are still released. Control: the same data with that
    coordinate Gaussian keeps its bar."""
    for s in range(3):
        y = _mostly_zero(2000, s)
        rel = scale_free_multivariate_mean(_backend(y, s), _cols(4), ScaleFreeMultivariatePlan(Budget(0.9, DELTA), 4),
                                           SeededNoise(s))
        assert rel.status == STATUS_OK
        assert rel.parameters["zero_atom_coordinates"] == [1]
        assert rel.error_bar is None and rel.parameters["tail_flag"] is True
        assert "x1: most persons are 0 (or within ~1e-11 of it)" in rel.error_covers and "no honest error bar" in rel.error_covers
        # the clipped coordinate's estimate sits at the atom, far below its exact mean: why no bar
        assert abs(rel.estimate[1]) < 1e-6 < y[:, 1].mean() / 10
        assert abs(rel.estimate[2] - y[:, 2].mean()) < 2.0
    y[:, 1] = np.random.default_rng(4).normal(0.03, 0.01, y.shape[0])
    rel = scale_free_multivariate_mean(_backend(y, 4), _cols(4), ScaleFreeMultivariatePlan(Budget(0.9, DELTA), 4),
                                       SeededNoise(4))
    assert rel.parameters["zero_atom_coordinates"] == [] and rel.error_bar is not None


def test_at_zero_floor_reads_the_range_not_only_its_mark():
    """The zero bucket alone (marked), or a range holding 0 within +-2^-36 (a noise bucket beside the
    zero bucket, unmarked: seen in 3 of 300 runs of a 94%-zero column, whose bar was then 4e-13
    against an exact mean of 0.03), is at the zero floor; a range reaching 2^-28, one not holding 0,
    or an ordinary one is not."""
    from dplib.mean.ranges import MagnitudeRange
    from dplib.mean.scale_free_stages import ZERO_FLOOR_EXPONENT, at_zero_floor

    assert ZERO_FLOOR_EXPONENT == -36
    assert at_zero_floor(MagnitudeRange(-2.0**-1021, 2.0**-1021, 10.0, zero_atom=True))
    assert at_zero_floor(MagnitudeRange(-2.0**-38, 2.0**-40, 10.0))
    assert at_zero_floor(MagnitudeRange(-2.0**-36, 2.0**-36, 10.0))
    assert not at_zero_floor(MagnitudeRange(-2.0**-40, 2.0**-28, 10.0))
    assert not at_zero_floor(MagnitudeRange(2.0**-40, 2.0**-36, 10.0))
    assert not at_zero_floor(MagnitudeRange(-1.0, 1.0, 10.0)) and not at_zero_floor(None)


def test_a_noise_bucket_beside_the_zero_bucket_still_gives_no_bar(monkeypatch):
    """Planted: every range run gives coordinate 1 the zero bucket with a noise bucket beside it,
    [-2^-38, 2^-40] (not marked as the zero atom). It is at the zero floor: no bar, flagged."""
    import dplib.mean.scale_free_multivariate as mv
    from dplib.mean.ranges import MagnitudeRange

    real, calls = mv.magnitude_range_from_counts, []

    def planted(*a, **k):
        calls.append(a[2])
        out = real(*a, **k)
        return MagnitudeRange(-2.0**-38, 2.0**-40, 1e4) if a[2] > 0 and len(calls) == 2 else out

    monkeypatch.setattr(mv, "magnitude_range_from_counts", planted)
    y = _mostly_zero(2000, 1)
    rel = scale_free_multivariate_mean(_backend(y, 1), _cols(4), ScaleFreeMultivariatePlan(Budget(0.9, DELTA), 4),
                                       SeededNoise(1))
    assert rel.parameters.get("range_retried_coordinates") in (None, []) or 1 not in rel.parameters["range_retried_coordinates"]
    assert rel.parameters["coordinate_ranges"][1] == [-2.0**-38, 2.0**-40]
    assert rel.parameters["zero_atom_coordinates"] == [1] and rel.error_bar is None and rel.parameters["tail_flag"]


@pytest.mark.parametrize("retry2", [True, False])
def test_zero_atom_after_the_retry_goes_on_to_the_later_runs(monkeypatch, retry2):
    """A coordinate whose retry, too, releases only the zero bucket (RandHIE drugdol in the clipped
    covariance's stage 1: 26% of persons at 0, the others spread over 8 octaves below the retry's
    floor; its range was then "lost" and 13 of 20 covariance runs released nothing) counts as
    missed: the second retry (when the plan has one) or else the joint retry runs on it and its
    range reaches its persons. Planted: the retry's answer for coordinate 1 is the zero bucket."""
    import dplib.mean.scale_free_multivariate as mv
    from dplib.mean.ranges import MagnitudeRange

    real, calls = mv.magnitude_range_from_counts, []

    def planted(*a, **k):
        calls.append(a[2])  # delta: the first run's > 0, the retries' 0
        if a[2] > 0:  # the first run: coordinate 1 zero-only
            out = real(*a, **k)
            return MagnitudeRange(-1e-300, 1e-300, 1e4, zero_atom=True) if len(calls) == 2 else out
        if calls.count(0.0) == 1:  # the retry (coordinate 1 alone): the zero bucket again
            return MagnitudeRange(-1e-300, 1e-300, 1e4, zero_atom=True)
        return real(*a, **k)

    monkeypatch.setattr(mv, "magnitude_range_from_counts", planted)
    y = _zero_inflated(20_000, 2)
    y[:, 1] = np.random.default_rng(3).normal(50.0, 10.0, y.shape[0])  # coordinate 1: ordinary data
    plan = ScaleFreeMultivariatePlan(Budget(EPS, DELTA), 3, **({} if retry2 else {"range_retry2_share": 0.0}))
    rel = scale_free_multivariate_mean(_backend(y, 2), _cols(3), plan, SeededNoise(2))
    assert rel.status == STATUS_OK
    p = rel.parameters
    assert p["range_retried_coordinates"] == [1]
    key = "range_retried_twice_coordinates" if retry2 else "range_joint_coordinates"
    assert p[key] == [1]
    lo, hi = p["coordinate_ranges"][1]
    assert hi >= 32.0  # the later run found the persons near 50
    assert abs(rel.estimate[1] - y[:, 1].mean()) <= 2.0 * rel.error_bar[1]


def test_vector_bars_state_how_many_far_persons_they_could_miss():
    """As the univariate kinds: the multivariate mean's bar (and the clipped covariance's, from its
    stage 1) states how many persons could sit far beyond what the norm profile measured, unseen at
    this budget (parameters.unseen_persons: three noise sds of its count above the highest visible
    bin), a positive figure that grows as epsilon shrinks."""
    from dplib.covariance.clipped import ClippedCovariancePlan, clipped_covariance

    y = np.random.default_rng(3).normal(5.0, 1.0, (4000, 3))
    figures = []
    for eps in (1.0, 0.3):
        rel = scale_free_multivariate_mean(_backend(y), _cols(3), ScaleFreeMultivariatePlan(Budget(eps, DELTA), 3),
                                           SeededNoise(1))
        assert rel.status == STATUS_OK and rel.error_bar is not None
        k = rel.parameters["unseen_persons"]
        assert k > 0 and f"up to ~{k:.0f} persons" in rel.error_covers
        figures.append(k)
    assert figures[1] > figures[0]
    cov = clipped_covariance(_backend(y), _cols(3), ClippedCovariancePlan(Budget(1.0, DELTA), 3), SeededNoise(2))
    assert cov.parameters["unseen_persons"] > 0
    assert f"up to ~{cov.parameters['unseen_persons']:.0f} persons" in cov.error_covers


def test_a_release_whose_norm_profile_measured_nothing_is_flagged_uninformative():
    """Gaussian person means, d = 4, 300 persons, epsilon 1 (20 seeds): 7 releases had a norm
    profile that measured none of the tail, 6 of them 10-40 sds off, status OK and unflagged (their
    bars as wide); they are now flagged ``uninformative`` with a warning, the others not."""
    empty = 0
    for s in range(20):
        rng = np.random.default_rng([300, s, 4])
        y = 5.0 + rng.standard_normal((300, 4))
        rel = scale_free_multivariate_mean(_backend(y, s), _cols(4), ScaleFreeMultivariatePlan(Budget(1.0, DELTA), 4),
                                           SeededNoise(s))
        if rel.status != STATUS_OK:
            continue
        p = rel.parameters
        assert p["uninformative"] is p["norm_profile_empty"]
        if p["norm_profile_empty"]:
            empty += 1
            assert rel.error_bar is None or "WARNING (uninformative)" in rel.error_covers
    assert empty >= 3


def _share_and_wage(seed: int, n: int = 595) -> np.ndarray:
    """A 0/1-like share over 7 years (455 of 595 persons at 1, 90 at 0, the rest between; a new
    user's PSID married column's counts) beside a wage-like Gaussian column."""
    rng = np.random.default_rng([595, seed])
    counts = np.array([90, 4, 8, 5, 7, 12, 14, 455])
    share = rng.choice(np.arange(8) / 7.0, n, p=counts / counts.sum())
    return np.column_stack([share, rng.normal(2.0, 0.5, n)])


def _far_misses(monkeypatch, share: float) -> tuple[int, int]:
    import dplib.mean.scale_free_multivariate as mv

    monkeypatch.setattr(mv, "FAR_UNCONFIRMED_SHARE", share)
    unflagged_far_misses = fired = 0
    for s in range(30):
        y = _share_and_wage(s)
        rel = scale_free_multivariate_mean(_backend(y, s), _cols(2), ScaleFreeMultivariatePlan(Budget(EPS, DELTA), 2),
                                           SeededNoise(s))
        assert rel.status == STATUS_OK
        fired += rel.parameters["far_unconfirmed_flag"]
        if rel.error_bar is not None and not rel.parameters["tail_flag"]:
            unflagged_far_misses += bool(np.any(np.abs(rel.estimate - y.mean(axis=0)) > 3.0 * rel.error_bar))
    return unflagged_far_misses, fired


def test_a_far_cluster_read_as_noise_flags_the_release(monkeypatch):
    """595 persons, a 0/1-like share beside a wage (epsilon 1, 30 seeds): the share's scale puts its
    90 persons at 0 ~85 scaled units out, a bin the norm profile's strict floor reads as noise in a
    few runs; one release was 0.15 off under a bar of 0.0055 (27 bars), unflagged. With the far-bin
    rule no unflagged release misses by more than 3 bars; without it (share inf) that one does."""
    misses, fired = _far_misses(monkeypatch, 0.01)
    assert misses == 0 and fired >= 2, (misses, fired)
    misses_off, _ = _far_misses(monkeypatch, math.inf)
    assert misses_off >= 1, misses_off


def test_the_far_cluster_rule_is_rare_on_gaussian_means():
    """Gaussian d = 4, 1,000 persons, epsilon 1, 20 seeds: the norm profile drops no far bin
    (measured: 0 of 40 runs; at 4,000 persons 1 of 30), so the rule flags at most one run."""
    fired = 0
    for s in range(20):
        y = np.random.default_rng([595, s]).normal(5.0, 1.0, (1000, 4))
        rel = scale_free_multivariate_mean(_backend(y, s), _cols(4), ScaleFreeMultivariatePlan(Budget(EPS, DELTA), 4),
                                           SeededNoise(s))
        fired += rel.parameters["far_unconfirmed_flag"]
    assert fired <= 1, fired


def test_many_persons_possibly_unseen_flags_the_release(monkeypatch):
    """The share-and-wage pair at epsilon 0.3 (595 persons, 30 seeds): up to 70-135% of the DP count
    could sit beyond the norm profile's visible top unseen; 2 releases missed by more than 3 bars
    unflagged (7 and 24 bars). With the unseen rule (share 0.5) none; Gaussian d = 4 at 300 and
    1,000 persons, epsilon 1 (shares up to ~0.43): never fires."""
    import dplib.mean.scale_free_multivariate as mv

    def run(share: float) -> int:
        monkeypatch.setattr(mv, "UNSEEN_FLAG_SHARE_NORMS", share)
        bad = 0
        for s in range(30):
            y = _share_and_wage(s)
            rel = scale_free_multivariate_mean(_backend(y, s), _cols(2), ScaleFreeMultivariatePlan(Budget(0.3, DELTA), 2),
                                               SeededNoise(s))
            if rel.status == STATUS_OK and rel.error_bar is not None and not rel.parameters["tail_flag"]:
                bad += bool(np.any(np.abs(rel.estimate - y.mean(axis=0)) > 3.0 * rel.error_bar))
        return bad

    assert run(0.5) == 0
    assert run(math.inf) >= 2
    monkeypatch.setattr(mv, "UNSEEN_FLAG_SHARE_NORMS", 0.5)
    for n in (300, 1000):
        for s in range(10):
            y = np.random.default_rng([n, s]).normal(5.0, 1.0, (n, 4))
            rel = scale_free_multivariate_mean(_backend(y, s), _cols(4), ScaleFreeMultivariatePlan(Budget(EPS, DELTA), 4),
                                               SeededNoise(s))
            assert rel.status == STATUS_OK and rel.parameters["unseen_flag"] is False, (n, s)
