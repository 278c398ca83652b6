"""NumpyAggregates against brute-force loops over persons."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dplib.aggregates import MAX_BINS_FROM_OFFSET, NumpyAggregates
from dplib.errors import InvalidParameterError
from dplib.groups import ALL_PERSONS, GroupRange

HASH = 2**32


def _random_data(seed: int, n: int = 400, d: int = 3, nan_rate: float = 0.1):
    rng = np.random.default_rng(seed)
    cols = {}
    for j in range(d):
        v = rng.normal(loc=rng.uniform(-5, 5), scale=rng.uniform(0.5, 4), size=n)
        v[rng.random(n) < nan_rate] = np.nan
        cols[f"c{j}"] = v
    gidx = rng.integers(0, HASH, size=n)
    return cols, gidx, rng


def _members(gidx, group: GroupRange):
    lo, hi = math.floor(group.lo * HASH), math.floor(group.hi * HASH)
    return [i for i in range(len(gidx)) if lo <= int(gidx[i]) < hi]


GROUPS = [ALL_PERSONS, GroupRange(0.0, 0.25), GroupRange(0.25, 1.0), GroupRange(0.4, 0.45)]


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("group", GROUPS)
def test_count_matches_brute_force(seed, group):
    cols, gidx, _ = _random_data(seed)
    agg = NumpyAggregates(cols, gidx)
    for columns in (["c0"], ["c1", "c2"], ["c0", "c1", "c2"]):
        expected = 0
        for i in _members(gidx, group):
            if all(not math.isnan(cols[c][i]) for c in columns):
                expected += 1
        assert agg.count(columns, group) == expected


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("group", GROUPS)
def test_histogram_matches_brute_force(seed, group):
    cols, gidx, rng = _random_data(seed)
    agg = NumpyAggregates(cols, gidx)
    width = float(rng.uniform(0.3, 3.0))
    offset = float(rng.uniform(-2, 2))
    expected: dict[int, int] = {}
    for i in _members(gidx, group):
        y = cols["c0"][i]
        if math.isnan(y):
            continue
        b = math.floor((y - offset) / width)
        expected[b] = expected.get(b, 0) + 1
    got = agg.histogram("c0", width, offset, group)
    assert got == expected
    assert all(isinstance(k, int) and isinstance(v, int) for k, v in got.items())


def test_histogram_with_explicit_clamp_matches_brute_force():
    cols, gidx, _ = _random_data(11)
    agg = NumpyAggregates(cols, gidx)
    lo, hi = -1.0, 2.5
    width, offset = 0.5, -1.0
    expected: dict[int, int] = {}
    for i in range(len(gidx)):
        y = cols["c1"][i]
        if math.isnan(y):
            continue
        y = min(max(y, lo), hi)
        b = math.floor((y - offset) / width)
        expected[b] = expected.get(b, 0) + 1
    got = agg.histogram("c1", width, offset, ALL_PERSONS, clamp=(lo, hi))
    assert got == expected
    assert min(got) == 0 and max(got) == 7  # (2.5 - (-1)) / 0.5


@pytest.mark.parametrize("width, offset", [(1.0, 0.0), (4.12, 0.0), (0.37, 5.5), (1e-3, -2.0), (1e6, 1.0)])
def test_extreme_values_land_in_the_clamp_edge_bins(width, offset):
    vals = np.array([1e308, -1e308, np.finfo(float).max, -np.finfo(float).max, offset + 0.5 * width])
    agg = NumpyAggregates({"y": vals}, np.zeros(vals.size, dtype=np.int64))
    got = agg.histogram("y", width, offset, ALL_PERSONS)
    # The default clamp is offset +- 2**40 widths; the edge bins are those of the clamp ends.
    span = 2.0**40 * width
    top = math.floor(((offset + span) - offset) / width)
    bottom = math.floor(((offset - span) - offset) / width)
    assert abs(top - 2**40) <= 1 and abs(bottom + 2**40) <= 1
    assert got == {top: 2, bottom: 2, 0: 1}
    assert all(abs(k) < 2**62 for k in got)
    assert MAX_BINS_FROM_OFFSET == 2.0**40


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("group", GROUPS)
def test_clipped_sum_1d_matches_truncation(seed, group):
    cols, gidx, rng = _random_data(seed)
    agg = NumpyAggregates(cols, gidx)
    c = float(rng.uniform(-3, 3))
    r = float(rng.uniform(0.2, 5))
    total = 0.0
    n = 0
    for i in _members(gidx, group):
        y = cols["c2"][i]
        if math.isnan(y):
            continue
        total += min(max(y - c, -r), r)
        n += 1
    s, count = agg.clipped_sum(["c2"], np.array([c]), r, group)
    assert s.shape == (1,)
    assert count == n
    # fixed-point sum: each person's term is rounded to r / 2**30, so at most half a unit each
    assert abs(s[0] - total) <= n * r / 2**31 + 1e-12 * abs(total)


@pytest.mark.parametrize("seed", range(5))
def test_clipped_sum_dd_matches_brute_force(seed):
    cols, gidx, rng = _random_data(seed, d=3)
    agg = NumpyAggregates(cols, gidx)
    columns = ["c0", "c1", "c2"]
    center = rng.normal(size=3)
    radius = float(rng.uniform(0.5, 6))
    group = GroupRange(0.1, 0.9)
    total = np.zeros(3)
    n = 0
    for i in _members(gidx, group):
        y = [cols[c][i] for c in columns]
        if any(math.isnan(v) for v in y):
            continue
        diff = [y[j] - center[j] for j in range(3)]
        norm = math.sqrt(sum(x * x for x in diff))
        f = min(1.0, radius / norm) if norm > 0 else 1.0
        total += np.array([x * f for x in diff])
        n += 1
    s, count = agg.clipped_sum(columns, center, radius, group)
    assert count == n
    # fixed point: at most half a unit (radius / 2**31) of rounding per person and coordinate
    np.testing.assert_allclose(s, total, rtol=1e-12, atol=n * radius / 2**31)


def _deviations_dd(values: np.ndarray, center: np.ndarray, radius: float) -> np.ndarray:
    """One clipped deviation per person, each through the backend with a single person."""
    out = []
    for row in values:
        agg = NumpyAggregates({f"x{j}": np.array([row[j]]) for j in range(values.shape[1])}, np.zeros(1, np.int64))
        s, cnt = agg.clipped_sum([f"x{j}" for j in range(values.shape[1])], center, radius, ALL_PERSONS)
        assert cnt == 1
        out.append(s)
    return np.array(out)


def test_clipped_deviation_norms_bounded_and_finite_for_huge_values():
    rng = np.random.default_rng(5)
    d = 4
    rows = np.vstack(
        [
            rng.normal(size=(50, d)),
            rng.normal(size=(20, d)) * 1e200,
            np.full((1, d), 1e200),
            np.full((1, d), -1e200),
            np.array([[1e200, 1e-200, 0.0, -1e200]]),
            np.array([[1e308, 0.0, 0.0, 0.0]]),
            np.zeros((1, d)),  # exactly at the centre
        ]
    )
    center = np.zeros(d)
    for radius in (1e-3, 1.0, 7.5):
        dev = _deviations_dd(rows, center, radius)
        assert np.all(np.isfinite(dev))
        norms = np.array([math.sqrt(sum(float(x) ** 2 for x in r)) for r in dev])
        # fixed point: each coordinate rounded to radius / 2**30 (half a unit at most)
        half_unit = radius / 2**31
        assert np.all(norms <= radius + math.sqrt(d) * half_unit)
        # Huge rows are clipped onto the sphere, in their own direction.
        huge = np.max(np.abs(rows), axis=1) > 1e100
        assert np.allclose(norms[huge], radius, rtol=0, atol=math.sqrt(d) * half_unit)
        for row, dv in zip(rows[huge], dev[huge]):
            unit = row / np.max(np.abs(row))
            unit = unit / np.linalg.norm(unit)
            np.testing.assert_allclose(dv, radius * unit, rtol=0, atol=half_unit * (1 + 1e-9))
    # And the sum over many huge persons is finite too.
    agg = NumpyAggregates({f"x{j}": rows[:, j] for j in range(d)}, np.zeros(rows.shape[0], np.int64))
    s, _ = agg.clipped_sum([f"x{j}" for j in range(d)], center, 2.0, ALL_PERSONS)
    assert np.all(np.isfinite(s))


def test_clipped_deviation_on_the_sphere_when_the_norm_overflows():
    # ||y - c|| = 2e308 is not representable although every coordinate is. clip(y) - c must
    # still be radius * (y - c) / ||y - c|| = radius * (0.5, 0.5, -0.5, 0.5), not 0.
    row = np.array([[1e308, 1e308, -1e308, 1e308]])
    dev = _deviations_dd(row, np.zeros(4), 1.0)[0]
    np.testing.assert_allclose(dev, [0.5, 0.5, -0.5, 0.5], rtol=1e-12)


def test_clipped_sum_dd_finite_when_value_minus_centre_overflows():
    # y - c = 1e308 - (-1e308) overflows to inf in float64; both inputs are accepted as finite.
    # The clipped deviation must still have norm <= radius (sensitivity), not be inf/nan.
    vals = {"a": np.array([1e308]), "b": np.array([0.0])}
    agg = NumpyAggregates(vals, np.zeros(1, np.int64))
    s, n = agg.clipped_sum(["a", "b"], np.array([-1e308, 0.0]), 1.0, ALL_PERSONS)
    assert n == 1
    assert np.all(np.isfinite(s)), f"clipped deviation is {s}"
    assert np.linalg.norm(s) <= 1.0 * (1 + 1e-12)


def test_clipped_sum_1d_finite_when_value_minus_centre_overflows():
    agg = NumpyAggregates({"a": np.array([1e308, -1e308])}, np.zeros(2, np.int64))
    s, n = agg.clipped_sum(["a"], np.array([-1e308]), 2.0, ALL_PERSONS)
    assert n == 2
    # +2 for the first person (clipped), -1e308 - (-1e308) = 0 for the second.
    assert s[0] == 2.0


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("group", GROUPS)
def test_clipped_sum_split_matches_brute_force(seed, group):
    """The split clipped sum: its sum is clipped_sum's bit for bit; its counts are the persons
    with |y - c| < r and |y - c| >= r, by a loop (values placed exactly at c +- r included)."""
    cols, gidx, rng = _random_data(seed)
    c = float(rng.uniform(-3, 3))
    r = float(rng.uniform(0.2, 5))
    y = cols["c2"].copy()
    y[:3] = [c + r, c - r, c + 2 * r]  # on the radius counts as clipped
    agg = NumpyAggregates({**cols, "c2": y}, gidx)
    within = clipped = 0
    for i in _members(gidx, group):
        if math.isnan(y[i]):
            continue
        if abs(y[i] - c) >= r:
            clipped += 1
        else:
            within += 1
    got = agg.clipped_sum_split("c2", c, r, group)
    s, n = agg.clipped_sum(["c2"], np.array([c]), r, group)
    assert got == (float(s[0]), within, clipped)
    assert within + clipped == n


def test_clipped_sum_split_of_empty_group_and_bad_radius():
    agg = NumpyAggregates({"a": np.array([1.0, 2.0])}, np.array([0, 1], dtype=np.int64))
    assert agg.clipped_sum_split("a", 0.0, 1.0, GroupRange(0.5, 1.0)) == (0.0, 0, 0)
    with pytest.raises(InvalidParameterError, match="radius"):
        agg.clipped_sum_split("a", 0.0, 0.0, ALL_PERSONS)


def test_clipped_sum_of_empty_group():
    agg = NumpyAggregates({"a": np.array([1.0, 2.0])}, np.array([0, 1], dtype=np.int64))
    s, n = agg.clipped_sum(["a"], np.array([0.0]), 1.0, GroupRange(0.5, 1.0))
    assert n == 0 and s.shape == (1,) and s[0] == 0.0


def test_all_nan_persons_are_excluded_everywhere():
    agg = NumpyAggregates({"a": np.array([np.nan, np.nan]), "b": np.array([1.0, np.nan])}, np.array([0, 5]))
    assert agg.count(["a"], ALL_PERSONS) == 0
    assert agg.count(["b"], ALL_PERSONS) == 1
    assert agg.histogram("a", 1.0, 0.0, ALL_PERSONS) == {}
    s, n = agg.clipped_sum(["a", "b"], np.zeros(2), 1.0, ALL_PERSONS)
    assert n == 0 and np.all(s == 0)


# --------------------------------------------------------------------------------------------
# Input validation
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [np.inf, -np.inf])
def test_constructor_rejects_infinite_values(bad):
    with pytest.raises(InvalidParameterError, match="inf"):
        NumpyAggregates({"a": np.array([1.0, bad])}, np.array([0, 1]))


def test_constructor_rejects_mismatched_lengths():
    with pytest.raises(InvalidParameterError, match="same length"):
        NumpyAggregates({"a": np.array([1.0, 2.0, 3.0])}, np.array([0, 1]))


@pytest.mark.parametrize("gidx", [np.array([-1, 0]), np.array([0, 2**32]), np.zeros((2, 1), dtype=np.int64)])
def test_constructor_rejects_bad_group_indices(gidx):
    with pytest.raises(InvalidParameterError, match="group_idx"):
        NumpyAggregates({"a": np.zeros(gidx.shape[0])}, gidx)


def test_unknown_column_is_refused():
    agg = NumpyAggregates({"a": np.array([1.0])}, np.array([0]))
    with pytest.raises(InvalidParameterError, match="zzz"):
        agg.count(["zzz"], ALL_PERSONS)


@pytest.mark.parametrize("radius", [0.0, -1.0, np.nan, np.inf])
def test_clipped_sum_rejects_bad_radius(radius):
    agg = NumpyAggregates({"a": np.array([1.0]), "b": np.array([2.0])}, np.array([0]))
    with pytest.raises(InvalidParameterError, match="radius"):
        agg.clipped_sum(["a"], np.array([0.0]), radius, ALL_PERSONS)


@pytest.mark.parametrize("center", [np.zeros(3), np.zeros(1), np.zeros((2, 2)), np.array([0.0, np.nan]), np.array([np.inf, 0.0])])
def test_clipped_sum_rejects_wrong_centre(center):
    agg = NumpyAggregates({"a": np.array([1.0]), "b": np.array([2.0])}, np.array([0]))
    with pytest.raises(InvalidParameterError, match="center"):
        agg.clipped_sum(["a", "b"], center, 1.0, ALL_PERSONS)


@pytest.mark.parametrize("width", [0.0, -1.0, np.nan, np.inf])
def test_histogram_rejects_bad_width(width):
    agg = NumpyAggregates({"a": np.array([1.0])}, np.array([0]))
    with pytest.raises(InvalidParameterError, match="bin_width"):
        agg.histogram("a", width, 0.0, ALL_PERSONS)


@pytest.mark.parametrize("clamp", [(1.0, 0.0), (np.nan, 1.0), (0.0, np.inf)])
def test_histogram_rejects_bad_clamp(clamp):
    agg = NumpyAggregates({"a": np.array([1.0])}, np.array([0]))
    with pytest.raises(InvalidParameterError, match="clamp"):
        agg.histogram("a", 1.0, 0.0, ALL_PERSONS, clamp=clamp)


def test_wide_explicit_clamp_does_not_overflow_bin_index():
    # histogram_clamp accepts any finite clamp. With clamp (-1e300, 1e300) and width 1, the bin
    # index 1e300 does not fit in int64: the backend must refuse the clamp, or keep the two
    # extreme persons in two different (correctly ordered) bins; it must not merge them.
    agg = NumpyAggregates({"v": np.array([1e300, -1e300, 5.0])}, np.zeros(3, dtype=np.int64))
    try:
        got = agg.histogram("v", 1.0, 0.0, ALL_PERSONS, clamp=(-1e300, 1e300))
    except InvalidParameterError:
        return
    assert len(got) == 3 and sum(got.values()) == 3
    lo_bin, mid_bin, hi_bin = sorted(got)
    assert mid_bin == 5 and lo_bin < 5 < hi_bin
