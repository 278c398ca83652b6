"""Unit tests of the scale-free range finding: log-magnitude histograms (numpy backend) and the
building blocks of :mod:`dplib.mean.ranges`.

Every expected value is computed independently of the code under test: log bins with
``math.frexp`` (exact binary exponent), windows by brute force over all runs, quantiles from the
sorted data, integrals in closed form and with ``scipy.integrate.quad``. Tests that need the
noise out of the way run at epsilon = 1e6 (Laplace scale 1e-6 on counts of persons), with data
placed away from every decision boundary by more than that.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import integrate

from dplib.aggregates import MIN_EXPONENT, VALUE_BOUND, NumpyAggregates, log_bin_bounds
from dplib.errors import InvalidParameterError
from dplib.groups import ALL_PERSONS, GroupRange
from dplib.mean.ranges import (
    FLOOR_BETA,
    PROFILE_STRICT_BETA,
    QUARTER_OCTAVE,
    DeviationProfile,
    TailModel,
    choose_radius,
    confirm_isolated_bins,
    deviation_profile,
    hidden_mass,
    magnitude_range,
    profile_quantile,
    smallest_window,
    visible_only,
    window_center,
)
from dplib.mechanisms import SeededNoise

HUGE_EPS = 1e6


class RecordingNoise:
    """SeededNoise that records the size (number of noised values) of each add_laplace call."""

    name = "recording"
    secure = False

    def __init__(self, seed: int) -> None:
        self.inner = SeededNoise(seed)
        self.sizes: list[int] = []

    def add_laplace(self, values, scale):
        self.sizes.append(int(np.asarray(values).size))
        return self.inner.add_laplace(values, scale)

    def add_gaussian(self, values, sigma):  # pragma: no cover - never used here
        raise AssertionError("no Gaussian noise expected in range finding")


def _backend(values, group_idx=None) -> NumpyAggregates:
    v = np.asarray(values, dtype=np.float64)
    gi = np.zeros(v.size, dtype=np.int64) if group_idx is None else np.asarray(group_idx)
    return NumpyAggregates({"v": v}, gi)


# ------------------------------------------------------------------------------------------------
# brute-force log bin
# ------------------------------------------------------------------------------------------------


def brute_log_key(y: float, center: float, sub_edges: tuple[float, ...]) -> int:
    """The documented bin of one person, computed with math.frexp (exact binary exponent)."""
    yc = min(max(float(y), -VALUE_BOUND), VALUE_BOUND)
    c = min(max(float(center), -VALUE_BOUND), VALUE_BOUND)
    x = yc - c
    a = abs(x)
    if a < math.ldexp(1.0, MIN_EXPONENT):
        return 0
    m, e2 = math.frexp(a)  # a = m * 2**e2 with 0.5 <= m < 1, so floor(log2 a) = e2 - 1 exactly
    e = e2 - 1
    frac = 2.0 * m  # a / 2**e, exact
    assert 1.0 <= frac < 2.0
    sub = sum(1 for edge in sub_edges if frac >= edge)
    n_sub = len(sub_edges) + 1
    sign = 1 if x > 0 else -1
    return sign * (1 + (e - MIN_EXPONENT) * n_sub + sub)


def brute_log_histogram(values, center, sub_edges) -> dict[int, int]:
    out: dict[int, int] = {}
    for y in values:
        if math.isnan(y):
            continue
        k = brute_log_key(y, center, sub_edges)
        out[k] = out.get(k, 0) + 1
    return out


def _special_values() -> np.ndarray:
    vals = [0.0, -0.0, 5e-324, -5e-324, 2.0**-1022, 2.0**-1021, -(2.0**-1021), 1e300, -1e300, 1e308, -1e308,
            1.7976931348623157e308, -1.7976931348623157e308, 3.0, -3.0, 1.0, -1.0]
    for k in range(-1074, 1024, 3):
        p = math.ldexp(1.0, k)
        vals += [p, -p]
        if -1021 <= k <= 1022:
            vals += [p * (1 + 2.0**-52), p * (1 - 2.0**-53), -p * (1 + 2.0**-52), -p * (1 - 2.0**-53)]
    # exactly on and just below the quarter-octave edges
    for k in (-1021, -500, -3, 0, 1, 7, 100, 900):
        for edge in QUARTER_OCTAVE:
            v = math.ldexp(edge, k)
            vals += [v, math.nextafter(v, 0.0), math.nextafter(v, math.inf), -v]
    # just around the zero-bin boundary
    b = math.ldexp(1.0, MIN_EXPONENT)
    vals += [math.nextafter(b, 0.0), math.nextafter(b, 1.0), -math.nextafter(b, 0.0)]
    return np.array(vals, dtype=np.float64)


def _random_values(rng: np.random.Generator, n: int) -> np.ndarray:
    mags = 10.0 ** rng.uniform(-320, 308, size=n)
    signs = rng.choice([-1.0, 1.0], size=n)
    return np.concatenate([mags * signs, rng.normal(3.0, 2.0, size=n), rng.standard_cauchy(size=n)])


CENTERS = [0.0, 3.0, -2.5, 1e-310, 2.0**20, -1e300, 1e305]
SUB_EDGES = [(), QUARTER_OCTAVE, (1.1, 1.5, 1.9999)]


@pytest.mark.parametrize("sub_edges", SUB_EDGES, ids=["octaves", "quarter", "irregular"])
@pytest.mark.parametrize("center", CENTERS, ids=str)
def test_log_histogram_matches_brute_force(center, sub_edges):
    rng = np.random.default_rng(101)
    values = np.concatenate([_special_values(), _random_values(rng, 1500)])
    got = _backend(values).log_histogram("v", center, ALL_PERSONS, sub_edges)
    want = brute_log_histogram(values, center, sub_edges)
    assert got == want
    assert sum(got.values()) == values.size
    assert all(c > 0 for c in got.values())


@pytest.mark.parametrize("sub_edges", [(), QUARTER_OCTAVE], ids=["octaves", "quarter"])
@pytest.mark.parametrize("center", [0.0, 3.0, -1e300], ids=str)
def test_log_bin_bounds_contain_each_person(center, sub_edges):
    rng = np.random.default_rng(7)
    values = np.concatenate([_special_values(), _random_values(rng, 500)])
    c = min(max(center, -VALUE_BOUND), VALUE_BOUND)
    for y in values:
        key = brute_log_key(y, center, sub_edges)
        a = abs(min(max(float(y), -VALUE_BOUND), VALUE_BOUND) - c)
        lo, hi = log_bin_bounds(key, sub_edges)
        assert lo <= a < hi, (y, key, lo, hi)
        if key == 0:
            assert (lo, hi) == (0.0, math.ldexp(1.0, MIN_EXPONENT))


def test_log_histogram_missing_values_and_groups():
    rng = np.random.default_rng(3)
    values = rng.normal(0.0, 10.0, size=400)
    values[::7] = np.nan
    gi = rng.integers(0, 2**32, size=values.size)
    b = _backend(values, gi)
    group = GroupRange(0.25, 0.6)
    lo, hi = int(0.25 * 2**32), int(0.6 * 2**32)
    inside = [y for y, g in zip(values, gi) if lo <= g < hi]
    got = b.log_histogram("v", 1.5, group, QUARTER_OCTAVE)
    assert got == brute_log_histogram(inside, 1.5, QUARTER_OCTAVE)
    assert sum(got.values()) == sum(1 for y in inside if not math.isnan(y))


@pytest.mark.parametrize("bad", [(1.0,), (2.0,), (1.5, 1.2), (1.3, 1.3), (0.5,), (math.nan,)])
def test_log_histogram_rejects_bad_sub_edges(bad):
    with pytest.raises(InvalidParameterError):
        _backend([1.0, 2.0]).log_histogram("v", 0.0, ALL_PERSONS, bad)


@pytest.mark.parametrize("extra", [1e308, -1e308, 0.0, -0.0, 5e-324, 2.0**-1021, 3.0, -7.25, 1e300, 2.0**996])
@pytest.mark.parametrize("sub_edges", [(), QUARTER_OCTAVE], ids=["octaves", "quarter"])
@pytest.mark.parametrize("center", [0.0, 3.0], ids=str)
def test_log_histogram_add_one_person_changes_one_bin_by_one(extra, sub_edges, center):
    rng = np.random.default_rng(17)
    base = np.concatenate([_random_values(rng, 200), _special_values()[:50]])
    gi = rng.integers(0, 2**32, size=base.size)
    h0 = _backend(base, gi).log_histogram("v", center, ALL_PERSONS, sub_edges)
    h1 = _backend(np.append(base, extra), np.append(gi, 12345)).log_histogram("v", center, ALL_PERSONS, sub_edges)
    keys = set(h0) | set(h1)
    diffs = {k: h1.get(k, 0) - h0.get(k, 0) for k in keys}
    changed = {k: d for k, d in diffs.items() if d != 0}
    assert changed == {brute_log_key(extra, center, sub_edges): 1}
    # the same person outside the group read changes nothing
    group = GroupRange(0.5, 1.0)
    g0 = _backend(base, gi).log_histogram("v", center, group, sub_edges)
    g1 = _backend(np.append(base, extra), np.append(gi, 12345)).log_histogram("v", center, group, sub_edges)
    assert g0 == g1


# ------------------------------------------------------------------------------------------------
# smallest_window
# ------------------------------------------------------------------------------------------------


def _brute_window_width(intervals, weights, q):
    order = sorted(range(len(intervals)), key=lambda i: intervals[i][0])
    iv = [intervals[i] for i in order]
    w = [max(weights[i], 0.0) for i in order]
    need = q * sum(w)
    best = math.inf
    for i, j in itertools.combinations_with_replacement(range(len(iv)), 2):
        if sum(w[i : j + 1]) >= need:
            best = min(best, iv[j][1] - iv[i][0])
    return best, iv, w, need


@pytest.mark.parametrize("seed", range(40))
def test_smallest_window_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    m = int(rng.integers(1, 9))
    # disjoint intervals with random gaps, passed in shuffled order
    cuts = np.cumsum(rng.uniform(0.1, 3.0, size=2 * m)) - 5.0
    intervals = [(float(cuts[2 * i]), float(cuts[2 * i + 1])) for i in range(m)]
    weights = [float(x) for x in rng.integers(-3, 12, size=m)]  # integers: exact sums
    perm = rng.permutation(m)
    intervals = [intervals[i] for i in perm]
    weights = [weights[i] for i in perm]
    q = float(rng.uniform(0.5, 0.99))
    lo, hi = smallest_window(intervals, weights, q)
    best, iv, w, need = _brute_window_width(intervals, weights, q)
    assert hi - lo == best
    # the returned window is a run of consecutive intervals holding enough weight
    starts = [a for a, _ in iv]
    ends = [b for _, b in iv]
    i, j = starts.index(lo), ends.index(hi)
    assert i <= j and sum(w[i : j + 1]) >= need


def test_smallest_window_hand_cases():
    iv = [(-4.0, -2.0), (2.0, 4.0), (4.0, 8.0), (64.0, 128.0)]
    assert smallest_window(iv, [1.0, 5.0, 89.0, 5.0], 0.9) == (2.0, 8.0)
    assert smallest_window(iv, [1.0, 0.0, 95.0, 4.0], 0.9) == (4.0, 8.0)
    assert smallest_window(iv, [50.0, 0.0, 0.0, 50.0], 0.9) == (-4.0, 128.0)
    # negative noisy weights count as zero
    assert smallest_window(iv, [-30.0, 2.0, 8.0, -5.0], 0.9) == (2.0, 8.0)


# ------------------------------------------------------------------------------------------------
# magnitude_range
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(10))
def test_magnitude_range_concentrated_data(seed):
    rng = np.random.default_rng([21, seed])
    y = rng.uniform(3.0, 7.0, size=2000)
    out = magnitude_range(_backend(y), "v", ALL_PERSONS, 1.0, 1e-6, SeededNoise(seed), q=0.9)
    assert out is not None
    # within a factor 2 of [2, 8] on each side
    assert 1.0 <= out.lower <= 4.0 and 4.0 <= out.upper <= 16.0
    inside = np.mean((y >= out.lower) & (y <= out.upper))
    assert inside >= 0.85
    # noisy total of the released buckets: n plus Laplace(1) noise on 2 buckets
    assert abs(out.noisy_total - y.size) < 30


def _exact_range(values, delta=1e-6, exponent_range=(-40, 60), q=0.9):
    return magnitude_range(_backend(values), "v", ALL_PERSONS, HUGE_EPS, delta, SeededNoise(0), q, exponent_range)


@pytest.mark.parametrize("delta", [1e-6, 0.0], ids=["thresholded", "pure"])
def test_magnitude_range_exact_answers(delta):
    er = (-10, 10)
    # 950 of 1000 persons in [4, 8): that bucket alone holds 90%
    r = _exact_range([1.5] * 50 + [5.0] * 950, delta, er)
    assert (r.lower, r.upper) == (4.0, 8.0)
    assert r.noisy_total == pytest.approx(1000.0, abs=1e-3)
    # 850 in [4, 8) and 150 in [2, 4): both buckets are needed
    r = _exact_range([3.0] * 150 + [5.0] * 850, delta, er)
    assert (r.lower, r.upper) == (2.0, 8.0)
    # symmetric around zero: [-4, -2) and [2, 4)
    r = _exact_range([-3.0] * 500 + [3.0] * 500, delta, er)
    assert (r.lower, r.upper) == (-4.0, 4.0)
    # negative values only
    r = _exact_range([-0.3] * 1000, delta, er)
    assert (r.lower, r.upper) == (-0.5, -0.25)


def test_magnitude_range_thresholded_hand_cases():
    # all persons at zero: the zero bucket [-2**MIN_EXPONENT, 2**MIN_EXPONENT]
    z = math.ldexp(1.0, MIN_EXPONENT)
    r = _exact_range([0.0] * 500)
    assert (r.lower, r.upper) == (-z, z)
    # 100 persons alone in their buckets (count 1 < threshold) are not released: only [4, 8)
    r = _exact_range([5.0] * 900 + [math.ldexp(1.5, 10 + i) for i in range(100)])
    assert (r.lower, r.upper) == (4.0, 8.0)
    assert r.noisy_total == pytest.approx(900.0, abs=1e-3)
    # extreme magnitudes are fine without any bound
    r = _exact_range([1e308] * 500)
    e = math.frexp(VALUE_BOUND)[1] - 1  # 1e308 is clamped to VALUE_BOUND first
    assert (r.lower, r.upper) == (math.ldexp(1.0, e), math.ldexp(1.0, e + 1))


def test_magnitude_range_pure_edge_buckets():
    # pure DP: persons beyond the public exponent range are counted in its edge buckets
    r = _exact_range([1e10] * 1000, 0.0, (-5, 5))
    assert (r.lower, r.upper) == (32.0, 64.0)
    r = _exact_range([-1e10] * 1000, 0.0, (-5, 5))
    assert (r.lower, r.upper) == (-64.0, -32.0)
    r = _exact_range([1e-10] * 1000, 0.0, (-5, 5))
    assert (r.lower, r.upper) == (-(2.0**-5), 2.0**-5)


def test_magnitude_range_one_person_is_none():
    # one person alone in a bucket passes the threshold with probability delta only
    for seed in range(20):
        b = _backend([5.0])
        assert magnitude_range(b, "v", ALL_PERSONS, 1.0, 1e-6, SeededNoise(seed)) is None
    assert magnitude_range(_backend([]), "v", ALL_PERSONS, 1.0, 1e-6, SeededNoise(0)) is None


@pytest.mark.parametrize("er", [(-40, 60), (-5, 5), (0, 1), (-900, 990)])
def test_magnitude_range_pure_noises_every_bucket(er):
    lo, hi = er
    noise = RecordingNoise(1)
    magnitude_range(_backend([5.0] * 30), "v", ALL_PERSONS, 1.0, 0.0, noise, 0.9, er)
    assert noise.sizes == [2 * (hi - lo + 1) + 1]
    # the count does not depend on the data
    noise2 = RecordingNoise(1)
    magnitude_range(_backend([]), "v", ALL_PERSONS, 1.0, 0.0, noise2, 0.9, er)
    assert noise2.sizes == [2 * (hi - lo + 1) + 1]


def test_magnitude_range_thresholded_noises_only_nonempty_buckets():
    noise = RecordingNoise(1)
    magnitude_range(_backend([5.0] * 30 + [-300.0] * 3 + [0.0]), "v", ALL_PERSONS, 1.0, 1e-6, noise)
    assert noise.sizes == [3]


@pytest.mark.parametrize("q", [0.49, 1.0, 1.5])
def test_magnitude_range_rejects_bad_q(q):
    with pytest.raises(InvalidParameterError, match="q"):
        magnitude_range(_backend([1.0] * 10), "v", ALL_PERSONS, 1.0, 1e-6, SeededNoise(0), q=q)


@pytest.mark.parametrize("er", [(5, 5), (6, 5), (-1021, 0), (0, 997)])
def test_magnitude_range_rejects_bad_exponent_range(er):
    with pytest.raises(InvalidParameterError, match="exponent_range"):
        magnitude_range(_backend([1.0] * 10), "v", ALL_PERSONS, 1.0, 0.0, SeededNoise(0), 0.9, er)


def test_magnitude_range_pure_accuracy_moderate_n():
    """Pure DP with the default exponent range (203 buckets) on 300 persons in [3, 7] at
    epsilon = 1: the range should still be within a factor 2 of [2, 8] most of the time (the
    thresholded variant needs only ~14 persons per bucket). Noise of Laplace(1) on 202 empty
    buckets must not dominate the q = 0.9 window."""
    ok = 0
    for seed in range(10):
        rng = np.random.default_rng([31, seed])
        y = rng.uniform(3.0, 7.0, size=300)
        r = magnitude_range(_backend(y), "v", ALL_PERSONS, 1.0, 0.0, SeededNoise(seed), 0.9)
        ok += r is not None and 1.0 <= r.lower <= 4.0 and 4.0 <= r.upper <= 16.0
    assert ok >= 8


def test_keep_confident_runs_hand_cases():
    """Runs of line-adjacent non-empty buckets: the run of the noisy maximum stays, a far run
    stays only above the strict floor; the zero bucket joins the runs on both sides of it."""
    from dplib.mean.ranges import _key, _keep_confident_runs

    keys = [0] + [_key(e, s) for s in (-1, 1) for e in range(-3, 4)]
    ix = {k: i for i, k in enumerate(keys)}
    w = np.zeros(len(keys))
    w[ix[_key(2, 1)]] = 500.0  # [4, 8): the data
    w[ix[_key(1, 1)]] = 50.0   # [2, 4): adjacent, kept
    w[ix[_key(-2, 1)]] = 30.0  # [0.25, 0.5): far, below strict
    w[ix[_key(3, -1)]] = 40.0  # [-16, -8): far, below strict
    out = _keep_confident_runs(keys, list(w), w, strict=100.0)
    kept = {keys[i] for i, v in enumerate(out) if v > 0}
    assert kept == {_key(2, 1), _key(1, 1)}
    # a far run above the strict floor is real data: kept
    w[ix[_key(3, -1)]] = 150.0
    out = _keep_confident_runs(keys, list(w), w, strict=100.0)
    assert {keys[i] for i, v in enumerate(out) if v > 0} == {_key(2, 1), _key(1, 1), _key(3, -1)}
    # -[0.125, 0.25), zero, +[0.125, 0.25) form one run with the maximum in it
    w = np.zeros(len(keys))
    w[ix[_key(-3, -1)]], w[ix[0]], w[ix[_key(-3, 1)]] = 20.0, 300.0, 20.0
    out = _keep_confident_runs(keys, list(w), w, strict=100.0)
    assert {keys[i] for i, v in enumerate(out) if v > 0} == {_key(-3, -1), 0, _key(-3, 1)}


def test_magnitude_range_pure_no_spurious_far_bucket():
    """Regression (production run, stop 27): at 1,000 persons and a range epsilon of 0.035, one
    empty bucket of the 201 passes the noise floor in ~5% of runs; far from the data it held
    the 10% the q = 0.9 window may leave out, and the window grew to 2^50 (the mean was off by
    up to 1e15). Now no window leaves [1, 16) in 2,000 seeds, where the floor alone lets one
    through a window beyond 2^20 in ~1% (power: the old rule is measured here too)."""
    from dplib.mean import ranges

    rng = np.random.default_rng(11)
    y = rng.normal(5.0, 2.0, size=1000)
    exact = _backend(y).log_histogram("v", 0.0, ALL_PERSONS)
    wide = sum(
        1 for seed in range(2000)
        if (r := ranges.magnitude_range_from_counts(exact, 0.035, 0.0, SeededNoise(seed))) is None
        or r.lower < -1.0 or r.upper > 16.0
    )
    assert wide == 0
    keep = ranges._keep_confident_runs
    try:
        ranges._keep_confident_runs = lambda keys, weights, noisy, strict: weights
        old = sum(
            1 for seed in range(2000)
            if (r := ranges.magnitude_range_from_counts(exact, 0.035, 0.0, SeededNoise(seed))) is not None
            and r.upper > 2.0**20
        )
    finally:
        ranges._keep_confident_runs = keep
    assert old >= 10  # 19 measured; a binomial(2000, 0.0095) is below 10 with probability < 1%


# ------------------------------------------------------------------------------------------------
# window_center
# ------------------------------------------------------------------------------------------------


def _brute_window_center(values, lower, upper, bins_per_range):
    width = upper - lower
    r = width / bins_per_range
    start = lower - width
    n_bins = 3 * bins_per_range
    counts = [0] * n_bins
    for y in values:
        j = None
        for b in range(n_bins):
            if start + b * r <= y < start + (b + 1) * r:
                j = b
                break
        if j is None:
            j = 0 if y < start else n_bins - 1  # clamped into the window
        counts[j] += 1
    # the end bins hold every value beyond the window (not densities): the fullest inner bin
    inner = range(1, n_bins - 1)
    j_star = max(inner, key=lambda b: counts[b])
    assert [counts[b] for b in inner].count(counts[j_star]) == 1, "test data must have a unique fullest inner bin"
    return start + (j_star + 0.5) * r, r


@pytest.mark.parametrize(
    "values,lower,upper,bpr",
    [
        ([3.3] * 300 + [7.7] * 200 + [-100.0] * 100, 2.0, 10.0, 8),
        ([3.3] * 100 + [1000.0] * 400, 2.0, 10.0, 8),
        ([-1e308] * 400 + [3.3] * 100, 2.0, 10.0, 8),
        ([-0.3] * 50 + [0.1] * 60, -1.0, 1.0, 4),
        (list(np.random.default_rng(4).normal(5.0, 1.0, size=3000)), 2.0, 8.0, 8),
        (list(np.random.default_rng(5).normal(-1e6, 3e5, size=3000)), -2**21, -2**19, 16),
    ],
)
def test_window_center_exact(values, lower, upper, bpr):
    center, r = window_center(_backend(values), "v", ALL_PERSONS, HUGE_EPS, SeededNoise(0), lower, upper, bpr)
    want_center, want_r = _brute_window_center(values, lower, upper, bpr)
    assert r == want_r
    assert center == pytest.approx(want_center, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("bpr", [8, 5, 13])
def test_window_center_noises_every_bin(bpr):
    for values in ([5.0] * 10, [], [1e300, -1e300]):
        noise = RecordingNoise(2)
        window_center(_backend(values), "v", ALL_PERSONS, 1.0, noise, 2.0, 10.0, bpr)
        assert noise.sizes == [3 * bpr]


@pytest.mark.parametrize("lower,upper", [(1.0, 1.0), (2.0, 1.0), (-1e308, 1e308), (0.0, math.inf), (math.nan, 1.0)])
def test_window_center_rejects_bad_range(lower, upper):
    with pytest.raises(InvalidParameterError):
        window_center(_backend([1.0]), "v", ALL_PERSONS, 1.0, SeededNoise(0), lower, upper)


# ------------------------------------------------------------------------------------------------
# deviation_profile, profile_quantile, choose_radius
# ------------------------------------------------------------------------------------------------


def _expected_edges(low, high):
    e_lo, e_hi = math.floor(math.log2(low)), math.ceil(math.log2(high))
    inner = [2.0 ** (e + j / 4.0) for e in range(e_lo, e_hi) for j in range(4)]
    return np.array([0.0] + inner + [2.0**e_hi, math.inf])


def _brute_profile_counts(values, center, edges):
    counts = np.zeros(len(edges) - 1)
    for y in values:
        a = abs(y - center)
        if a < edges[1]:
            counts[0] += 1
        elif a >= edges[-2]:
            counts[-1] += 1
        else:
            i = int(np.searchsorted(edges, a, side="right")) - 1
            assert edges[i] <= a < edges[i + 1]
            counts[i] += 1
    return counts


PROFILE_DATA = np.concatenate([
    np.random.default_rng(8).normal(10.0, 3.0, size=4999),
    [10.3] * 7,  # exactly at the centre: underflow bin
    [10.3 + 1e-9] * 5,  # below low: underflow bin
    [1e6, -1e6, 1e300],  # beyond high: overflow bin
])


@pytest.mark.parametrize("low,high", [(2.0**-8 * 1.3, 40.0), (0.01, 2.0**7), (1e-3, 1e3)])
def test_deviation_profile_counts_and_edges(low, high):
    center = 10.3
    prof = deviation_profile(_backend(PROFILE_DATA), "v", ALL_PERSONS, HUGE_EPS, SeededNoise(0), center, low, high)
    edges = _expected_edges(low, high)
    np.testing.assert_allclose(prof.edges, edges, rtol=1e-15)
    want = _brute_profile_counts(PROFILE_DATA, center, edges)
    np.testing.assert_array_equal(np.rint(prof.raw_weights), want)
    np.testing.assert_allclose(prof.raw_weights, want, atol=1e-3)
    assert prof.total == pytest.approx(PROFILE_DATA.size, abs=1e-3)


@pytest.mark.parametrize("q", [0.5, 0.9, 0.98, 0.3])
def test_profile_quantile_matches_empirical_quantile(q):
    rng = np.random.default_rng(9)
    y = rng.standard_t(4, size=4999) * 2.0 + 3.0
    center = 3.4
    prof = deviation_profile(_backend(y), "v", ALL_PERSONS, HUGE_EPS, SeededNoise(1), center, 1e-3, 1e3)
    dev = np.sort(np.abs(y - center))
    emp = float(dev[math.ceil(q * y.size) - 1])  # smallest v with F_n(v) >= q
    got = profile_quantile(prof, q)
    # upper edge of the quarter-octave bin holding the empirical quantile
    assert emp < got <= emp * 2.0**0.25 * (1 + 1e-12)


def _hand_profile(raw, edges):
    raw = np.asarray(raw, dtype=float)
    return DeviationProfile(np.asarray(edges, dtype=float), raw.copy(), 0.0, raw)


def test_profile_quantile_hand_cases():
    p = _hand_profile([10, 20, 60, 5, 5], [0.0, 1.0, 2.0, 4.0, 8.0, math.inf])
    assert profile_quantile(p, 0.05) == 1.0
    assert profile_quantile(p, 0.25) == 2.0
    assert profile_quantile(p, 0.85) == 4.0
    assert profile_quantile(p, 0.93) == 8.0
    # in the overflow bin: twice its lower edge (the same assumption as the bias bound)
    assert profile_quantile(p, 0.99) == 16.0
    # negative noisy counts: the CDF is made non-decreasing
    p = _hand_profile([10, -5, 25, 60, 10], [0.0, 1.0, 2.0, 4.0, 8.0, math.inf])
    assert profile_quantile(p, 0.15) == 4.0


@pytest.mark.parametrize(
    "n_eps,k,factor",
    [(1e8, 4.0, 100.0), (1.0, 4.0, 2.0), (0.25, 4.0, 2.0), (65536.0, 4.0, 16.0), (100.0, 2.0, 10.0), (1e12, math.inf, 2.0), (3.0, 2.0, 2.0)],
)
def test_choose_radius_formula(n_eps, k, factor):
    p = _hand_profile([10, 20, 60, 5, 5], [0.0, 1.0, 2.0, 4.0, 8.0, math.inf])
    # Q_0.85 = 4 (hand case above); rho = Q * max(2, (n eps)^(1/k))
    assert choose_radius(p, n_eps, k, 0.85) == pytest.approx(4.0 * factor, rel=1e-12)
    assert choose_radius(p, n_eps, k, 0.25) == pytest.approx(2.0 * factor, rel=1e-12)


def test_choose_radius_on_private_profile():
    rng = np.random.default_rng(10)
    y = rng.normal(0.0, 1.0, size=3001)
    prof = deviation_profile(_backend(y), "v", ALL_PERSONS, HUGE_EPS, SeededNoise(3), 0.0, 1e-3, 100.0)
    emp = float(np.sort(np.abs(y))[math.ceil(0.9 * y.size) - 1])
    rho = choose_radius(prof, 1e4, 4.0, 0.9)
    assert emp * 10.0 < rho <= emp * 10.0 * 2.0**0.25 * (1 + 1e-12)


# ------------------------------------------------------------------------------------------------
# TailModel.bias
# ------------------------------------------------------------------------------------------------


def _survival(x, xs, ss, alpha):
    x_star, s_star = xs[-1], ss[-1]
    if x >= x_star:
        return 0.0 if math.isinf(alpha) else s_star * (x / x_star) ** (-alpha)
    j = max(i for i in range(len(xs)) if xs[i] <= x)
    return ss[j]


def _quad_bias(radius, xs, ss, alpha):
    pts = [radius] + [x for x in xs if x > radius]
    total = 0.0
    for a, b in zip(pts[:-1], pts[1:]):
        total += integrate.quad(lambda x: _survival(x, xs, ss, alpha), a, b)[0]
    start = max(radius, xs[-1])
    if not math.isinf(alpha):
        total += integrate.quad(lambda x: _survival(x, xs, ss, alpha), start, math.inf)[0]
    return total


XS = [0.0, 1.0, 2.0, 4.0]
SS = [1.0, 0.5, 0.2, 0.1]


@pytest.mark.parametrize("radius", [0.0, 0.5, 1.5, 3.0, 4.0, 8.0, 100.0])
@pytest.mark.parametrize("alpha", [3.0, 1.5, 2.25])
def test_tail_bias_closed_form(radius, alpha):
    model = TailModel(np.array(XS), np.array(SS), alpha)
    # step part by hand: sum over steps of S_j * length of [x_j, x_{j+1}) beyond the radius
    step = sum(s * max(0.0, b - max(a, radius)) for a, b, s in zip(XS[:-1], XS[1:], SS[:-1]))
    start = max(radius, 4.0)
    tail = 0.1 * 4.0 * (start / 4.0) ** (1.0 - alpha) / (alpha - 1.0)
    assert model.bias(radius) == pytest.approx(step + tail, rel=1e-12)
    assert model.bias(radius) == pytest.approx(_quad_bias(radius, XS, SS, alpha), rel=1e-7)


def test_tail_bias_hand_values():
    m = TailModel(np.array(XS), np.array(SS), 3.0)
    assert m.bias(1.5) == pytest.approx(0.5 * 0.5 + 0.2 * 2.0 + 0.1 * 4.0 / 2.0)
    assert m.bias(8.0) == pytest.approx(0.1 * 4.0 * 0.25 / 2.0)
    assert m.bias(0.0) == pytest.approx(1.0 + 0.5 + 0.4 + 0.2)


def test_tail_bias_special_tails():
    # alpha = inf: nothing beyond the last measured edge
    m = TailModel(np.array(XS), np.array(SS), math.inf)
    assert m.bias(1.5) == pytest.approx(0.25 + 0.4)
    assert m.bias(4.0) == 0.0
    assert m.bias(1.5) == pytest.approx(_quad_bias(1.5, XS, SS, math.inf), rel=1e-9)
    # alpha <= 1: not integrable
    assert math.isinf(TailModel(np.array(XS), np.array(SS), 1.0).bias(2.0))
    assert math.isinf(TailModel(np.array(XS), np.array(SS), 0.7).bias(100.0))
    # S(x*) = 0: the step part only, whatever alpha
    m = TailModel(np.array(XS), np.array([1.0, 0.5, 0.2, 0.0]), 0.7)
    assert m.bias(1.5) == pytest.approx(0.25 + 0.4)
    # monotone non-increasing in the radius
    m = TailModel(np.array(XS), np.array(SS), 2.0)
    radii = np.linspace(0.0, 50.0, 201)
    b = [m.bias(r) for r in radii]
    assert all(x >= y for x, y in zip(b, b[1:]))


def _quad_second_moment(radius, xs, ss, alpha):
    pts = [0.0] + [x for x in xs if 0.0 < x < radius] + [radius]
    return sum(
        integrate.quad(lambda x: 2.0 * x * _survival(x, xs, ss, alpha), a, b, limit=200)[0]
        for a, b in zip(pts[:-1], pts[1:])
    )


@pytest.mark.parametrize("radius", [0.5, 1.0, 3.0, 4.0, 10.0, 1000.0])
@pytest.mark.parametrize("alpha", [3.0, 2.0, 1.75, math.inf])
def test_tail_second_moment_is_integral_of_2x_survival(radius, alpha):
    """E[min(|Y - c|, radius)^2] = integral_0^radius 2 x S(x) dx for the model's S."""
    model = TailModel(np.array(XS), np.array(SS), alpha)
    assert model.second_moment(radius) == pytest.approx(_quad_second_moment(radius, XS, SS, alpha), rel=1e-7)


def test_tail_second_moment_hand_value():
    m = TailModel(np.array(XS), np.array(SS), 3.0)
    # steps: 1*(1-0) + 0.5*(4-1) + 0.2*(16-4); tail: int_4^8 2x 0.1 (x/4)^-3 dx = 0.2*64*(1/4-1/8)
    assert m.second_moment(8.0) == pytest.approx(1.0 + 1.5 + 2.4 + 1.6, rel=1e-12)
    assert m.second_moment(1.5) == pytest.approx(1.0 + 0.5 * (2.25 - 1.0), rel=1e-12)


def _floored_profile(raw, floor=10.0):
    raw = np.asarray(raw, float)
    edges = np.array([0.0] + [2.0**k for k in range(raw.size - 1)] + [math.inf])
    return DeviationProfile(edges, np.where(raw > floor, raw, 0.0), floor, raw)


def test_confirm_isolated_bins_hand_cases():
    """A visible bin far above the data's run needs the strict floor (PROFILE_STRICT_BETA); bins in
    the run, or one below-floor bin away from it, keep the ordinary floor."""
    n = 12
    scale = 10.0 / math.log(n / FLOOR_BETA)
    strict = scale * math.log(n / PROFILE_STRICT_BETA)
    assert strict > 11.0
    body = [0, 50, 400, 300, 12, 3, 0]
    # an isolated bin just above the floor, four bins above the run: read as empty (raw too)
    p = confirm_isolated_bins(_floored_profile(body + [1, 0, 0, 11.0, 2]))
    assert p.weights[10] == 0.0 and p.raw_weights[10] == 0.0
    assert list(p.weights[:7]) == [0, 50, 400, 300, 12, 0, 0] and p.raw_weights[11] == 2
    # the same bin above the strict floor is kept
    p = confirm_isolated_bins(_floored_profile(body + [1, 0, 0, strict + 0.5, 2]))
    assert p.weights[10] == strict + 0.5
    # one below-floor bin between it and the run: part of the run, kept at the ordinary floor
    p = confirm_isolated_bins(_floored_profile([0, 50, 400, 300, 12, 3, 11.0, 0, 0, 0, 0, 0]))
    assert p.weights[6] == 11.0
    # two below-floor bins: isolated
    p = confirm_isolated_bins(_floored_profile([0, 50, 400, 300, 12, 3, 0, 11.0, 0, 0, 0, 0]))
    assert p.weights[7] == 0.0
    # nothing visible: unchanged
    q = _floored_profile([1.0] * n)
    assert confirm_isolated_bins(q) is q
    # the overflow bin (last) isolated and under the strict floor: its weight is dropped, its raw
    # count kept (the tail flag's overflow test reads it; dropped, 80 persons there went unflagged)
    p = confirm_isolated_bins(_floored_profile(body + [1, 0, 0, 0, 11.0]))
    assert p.weights[11] == 0.0 and p.raw_weights[11] == 11.0


def test_visible_only_zeroes_raw_counts_above_the_highest_visible_bin():
    p = visible_only(_floored_profile([0, 50, 400, 300, 12, 3, -4, 9, 2]))
    assert list(p.raw_weights) == [0, 50, 400, 300, 12, 0, 0, 0, 0]
    assert hidden_mass(p, 1.0)[0] == 0.0


def test_window_bins_small_data_pad():
    """Small data: the centre window is the range and pad_bins bins each side (public inputs only)."""
    from dplib.mean.ranges import window_bins

    assert window_bins(4.0, 8.0, 8) == (0.5, 0.0, 24)
    assert window_bins(4.0, 8.0, 8, 1) == (0.5, 3.5, 10)
    r, offset, n_bins = window_bins(-3.0, 5.0, 8, 2)
    assert (r, offset, n_bins) == (1.0, -5.0, 12)
    assert offset + n_bins * r == 7.0  # [L - 2r, U + 2r]


def test_profile_with_no_visible_bin_flags_the_release():
    """A profile in which no bin clears its floor cannot say where the persons are: the tail flag is
    set whatever the fallback tail says (version 6 released such bars unflagged)."""
    import dplib.mean.scale_free_stages as S
    from dplib.budget import Accountant, Budget
    from dplib.mean.scale_free import ScaleFreeMeanPlan

    y = np.random.default_rng(5).normal(5.0, 0.32, 100)
    plan = ScaleFreeMeanPlan(budget=Budget(1.0, 1e-6))
    charges = {c.stage: c for c in plan.charges("")}
    shares = S.StageShares(profile=1e-4)  # a profile at a tiny share: nothing clears the floor
    setup = S.scale_free_stages(
        NumpyAggregates({"v": y}, np.arange(100)), "v", plan, shares,
        S.stage_charger(Accountant(plan.budget), charges), SeededNoise(3), {},
    )
    assert setup is not None and not np.any(setup.profile.weights > 0)
    assert setup.tail_flag
    assert "cleared its noise floor" in setup.flag_reason()


def test_profile_quantile_floored_ignores_the_far_bins_noise():
    """``floored=True`` reads the counts above the noise floor (``weights``): noise left in far
    bins (raw counts) moves the raw median outwards, not the floored one. Hand-computed edges."""
    from dplib.mean.ranges import DeviationProfile, profile_quantile

    edges = np.array([0.0, 1.0, 2.0, 4.0, 8.0, 16.0, np.inf])
    raw = np.array([40.0, 50.0, 10.0, 30.0, 30.0, 25.0])  # 30 / 30 / 25: noise in the far bins
    weights = np.array([40.0, 50.0, 10.0, 0.0, 0.0, 0.0])  # those are below the floor
    prof = DeviationProfile(edges, weights, 35.0, raw)
    assert profile_quantile(prof, 0.5) == 4.0  # raw CDF: 40, 90, 100 of 185 -> the third bin [2, 4)
    assert profile_quantile(prof, 0.5, floored=True) == 2.0  # 40, 90 of 100 -> the second bin [1, 2)
    empty = DeviationProfile(edges, np.zeros(6), 35.0, raw)
    assert profile_quantile(empty, 0.5, floored=True) == 16.0  # nothing above the floor: the top edge


def test_pure_bucket_count_is_what_the_pure_path_noises(monkeypatch):
    """pure_bucket_count (the dry run's confirmation arithmetic) equals the length of the vector
    magnitude_range_from_counts puts Laplace noise on, for the retries' layout and the default."""
    import dplib.mean.ranges as rg
    from dplib.mechanisms import SeededNoise

    seen = []
    real = rg.pure_dp_histogram
    monkeypatch.setattr(rg, "pure_dp_histogram", lambda dense, eps, noise: seen.append(len(dense)) or real(dense, eps, noise))
    for er, oct_ in (((-40, 60), 2), (rg.DEFAULT_EXPONENT_RANGE, 1), ((-3, 4), 3)):
        rg.magnitude_range_from_counts({}, 1.0, 0.0, SeededNoise(0), 0.9, er, oct_)
        assert seen[-1] == rg.pure_bucket_count(er, oct_)
    assert rg.pure_bucket_count((-40, 60), 2) == 103


# ------------------------------------------------------------------------------------------------
# a zero atom: the window beyond the zero bucket
# ------------------------------------------------------------------------------------------------

from dplib.mean.ranges import _key, magnitude_range_from_counts  # noqa: E402


@pytest.mark.parametrize("delta", [1e-6, 0.0])
def test_zero_atom_window_widens_to_the_other_persons(delta):
    """1,200 persons at exactly 0 and 70 in [4, 8), 60 in [8, 16) (noise-free limit): the 0.9 window
    is the zero bucket alone; it is widened to hold 0.9 of the other mass, [4, 16) (the
    smallest run of the non-zero buckets holding 0.9 x 130), joined with the zero bucket."""
    exact = {0: 1200, _key(2, 1): 70, _key(3, 1): 60}
    r = magnitude_range_from_counts(exact, HUGE_EPS, delta, SeededNoise(0), 0.9)
    zero_hi = r.lower * -1.0
    assert zero_hi < 1e-11
    assert r.upper == 16.0
    assert r.zero_atom is False


@pytest.mark.parametrize("delta", [1e-6, 0.0])
def test_zero_atom_alone_is_reported(delta):
    """Everyone at 0: the zero bucket, flagged as an atom (the estimators' retry reads it)."""
    r = magnitude_range_from_counts({0: 1000}, HUGE_EPS, delta, SeededNoise(0), 0.9)
    assert r.upper == -r.lower and r.upper < 1e-11
    assert r.zero_atom is True


def test_window_with_a_nonzero_bucket_is_unchanged_by_the_atom_rule():
    """The zero bucket holds less than q: the window already spans non-zero buckets; the rule does
    not touch it (the same window as smallest_window over every bucket)."""
    exact = {0: 500, _key(2, 1): 400, _key(3, 1): 100}
    r = magnitude_range_from_counts(exact, HUGE_EPS, 1e-6, SeededNoise(0), 0.9)
    assert r.upper == 8.0 and r.lower < 0 < -r.lower < 1e-11
    assert r.zero_atom is False


def test_merged_octaves_keep_the_lowest_exponents_positive_and_the_zero_bucket_symmetric():
    """Buckets of 3 octaves with delta > 0 (merged from exponent 0): values at 2^-1021 (the
    lowest exponent) stay a positive bucket (they merged to exponent -1023, below the key range,
    and came back as a negative bucket); the zero bucket is not grown by the merge."""
    from dplib.aggregates import MIN_EXPONENT

    r = magnitude_range_from_counts({_key(MIN_EXPONENT, 1): 1000}, HUGE_EPS, 1e-6, SeededNoise(0), 0.9, octaves=3)
    assert r.lower > 0
    r = magnitude_range_from_counts({0: 1000}, HUGE_EPS, 1e-6, SeededNoise(0), 0.9, octaves=3)
    assert r.lower == -r.upper and r.zero_atom is True
