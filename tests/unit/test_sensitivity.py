"""Sensitivities of the released aggregates under add/remove of one person, on extreme neighbours.

The neighbour D' is D plus one extra person (same group indices for everybody else), or D minus
one person. Bounds come from the privacy proofs, not from the code:

- fine stage of the univariate mean: release (sum_i trunc(Y_i - c, rho), w * n), l1 <= rho + w;
  its split form (sum, w * n_within, w * n_clipped), the same bound;
- histogram: one person is in exactly one bin, l1 = 1;
- d-dim clipped sum: l2 <= radius.
"""

from __future__ import annotations

import numpy as np
import pytest

from dplib.aggregates import clipped_sum_l2_sensitivity
from dplib.aggregates import NumpyAggregates
from dplib.groups import ALL_PERSONS, GroupRange
from dplib.mean.univariate import count_weight

HASH = 2**32
# Float sums of n terms are not exactly associative: allow a relative slack far below any
# meaningful sensitivity violation.
FLOAT_SLACK = 1e-9


def _base(seed: int, n: int = 300, d: int = 1):
    rng = np.random.default_rng(seed)
    values = rng.normal(loc=2.0, scale=3.0, size=(n, d))
    values[rng.random(n) < 0.05, 0] = np.nan
    gidx = rng.integers(0, HASH, size=n)
    return values, gidx, rng


def _agg(values: np.ndarray, gidx: np.ndarray) -> NumpyAggregates:
    return NumpyAggregates({f"x{j}": values[:, j] for j in range(values.shape[1])}, gidx)


def _fine_release(agg: NumpyAggregates, c: float, rho: float, w: float, group: GroupRange) -> np.ndarray:
    s, n = agg.clipped_sum(["x0"], np.array([c]), rho, group)
    return np.array([float(s[0]), w * n])


def _neighbours(values, gidx, extra_values, extra_gidx):
    """D plus each extra person in turn, and D minus each single person."""
    for v in extra_values:
        yield np.vstack([values, np.atleast_2d(v)]), np.append(gidx, extra_gidx)
    for i in range(values.shape[0]):
        yield np.delete(values, i, axis=0), np.delete(gidx, i)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("c, rho, u", [(2.0, 1.5, 0.6), (-1e3, 10.0, 6.0), (0.3, 1e-3, 1e-4)])
def test_fine_stage_l1_sensitivity(seed, c, rho, u):
    values, gidx, rng = _base(seed)
    w = count_weight(rho, u)
    # count_weight itself must be positive and finite for the bound to mean anything.
    assert np.isfinite(w) and w > 0
    group = ALL_PERSONS
    base = _fine_release(_agg(values, gidx), c, rho, w, group)
    extras = [1e308, -1e308, c, c + rho / 2, c - rho, c + 3 * rho, np.finfo(float).max, np.nan]
    max_change = 0.0
    for vals2, gidx2 in _neighbours(values, gidx, extras, int(rng.integers(0, HASH))):
        rel = _fine_release(_agg(vals2, gidx2), c, rho, w, group)
        change = float(np.sum(np.abs(rel - base)))
        assert change <= (rho + w) * (1 + FLOAT_SLACK), change
        max_change = max(max_change, change)
    # The bound is attained (a far-away person adds exactly rho to the sum and 1 to the count).
    assert max_change >= (rho + w) * (1 - FLOAT_SLACK)


def _split_release(agg: NumpyAggregates, c: float, rho: float, w: float, group: GroupRange) -> np.ndarray:
    s, n_within, n_clipped = agg.clipped_sum_split("x0", c, rho, group)
    return np.array([s, w * n_within, w * n_clipped])


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("c, rho, u", [(2.0, 1.5, 0.6), (-1e3, 10.0, 6.0), (0.3, 1e-3, 1e-4)])
def test_split_fine_stage_l1_sensitivity(seed, c, rho, u):
    """The split count (persons within the radius, persons at or beyond it) moves by w in total
    under add/remove, whichever side the person is on: neighbours exactly at +-rho, far beyond,
    at the centre, at float max, and a missing value."""
    values, gidx, rng = _base(seed)
    w = count_weight(rho, u)
    group = ALL_PERSONS
    base = _split_release(_agg(values, gidx), c, rho, w, group)
    extras = [1e308, -1e308, c, c + rho, c - rho, c + rho / 2, c + 3 * rho, np.finfo(float).max, np.nan]
    max_change = 0.0
    for vals2, gidx2 in _neighbours(values, gidx, extras, int(rng.integers(0, HASH))):
        rel = _split_release(_agg(vals2, gidx2), c, rho, w, group)
        change = float(np.sum(np.abs(rel - base)))
        assert change <= (rho + w) * (1 + FLOAT_SLACK), change
        # exactly one of the two counts moved, by one person (or none: a missing value)
        moved = np.abs(rel[1:] - base[1:]) / w
        assert sorted(np.round(moved, 9).tolist()) in ([0.0, 1.0], [0.0, 0.0])
        max_change = max(max_change, change)
    assert max_change >= (rho + w) * (1 - FLOAT_SLACK)


@pytest.mark.parametrize("seed", range(3))
def test_fine_stage_sensitivity_outside_the_group_is_zero(seed):
    values, gidx, _ = _base(seed)
    group = GroupRange(0.25, 1.0)
    rho, u = 2.0, 1.0
    w = count_weight(rho, u)
    base = _fine_release(_agg(values, gidx), 1.0, rho, w, group)
    outside = int(0.1 * HASH)  # index in [0, 0.25): not in the fine group
    for y in (1e308, -1e308, 1.0):
        rel = _fine_release(_agg(np.vstack([values, [[y]]]), np.append(gidx, outside)), 1.0, rho, w, group)
        assert np.array_equal(rel, base)


def _hist_l1(h1: dict, h2: dict) -> int:
    keys = set(h1) | set(h2)
    return sum(abs(h1.get(k, 0) - h2.get(k, 0)) for k in keys)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("width, offset, clamp", [(4.12, 0.0, None), (0.5, -3.0, None), (1.0, -10.0, (-10.0, 9.5))])
def test_histogram_changes_one_bin_by_one(seed, width, offset, clamp):
    values, gidx, rng = _base(seed, n=200)
    base = _agg(values, gidx).histogram("x0", width, offset, ALL_PERSONS, clamp=clamp)
    extras = [1e308, -1e308, np.finfo(float).max, 0.0, offset, offset + width * 0.999, 1e15]
    for vals2, gidx2 in _neighbours(values, gidx, extras, int(rng.integers(0, HASH))):
        removed_nan = vals2.shape[0] < values.shape[0] and np.sum(np.isnan(vals2)) < np.sum(np.isnan(values))
        h = _agg(vals2, gidx2).histogram("x0", width, offset, ALL_PERSONS, clamp=clamp)
        diff_bins = [k for k in set(h) | set(base) if h.get(k, 0) != base.get(k, 0)]
        if removed_nan:
            assert h == base
            continue
        assert len(diff_bins) == 1
        assert _hist_l1(h, base) == 1


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("d, radius", [(2, 1.0), (5, 3.3), (10, 1e-3)])
def test_dd_clipped_sum_l2_sensitivity(seed, d, radius):
    values, gidx, rng = _base(seed, n=200, d=d)
    center = rng.normal(size=d)
    cols = [f"x{j}" for j in range(d)]
    s0, n0 = _agg(values, gidx).clipped_sum(cols, center, radius, ALL_PERSONS)
    extras = [
        np.full(d, 1e308),
        np.full(d, -1e308),
        np.full(d, 1e200),
        np.r_[1e200, -1e200, np.zeros(d - 2)],
        center,
        center + radius / np.sqrt(d) / 2,
        center + 10 * radius,
    ]
    worst = 0.0
    for vals2, gidx2 in _neighbours(values, gidx, extras, int(rng.integers(0, HASH))):
        s, n = _agg(vals2, gidx2).clipped_sum(cols, center, radius, ALL_PERSONS)
        assert abs(n - n0) <= 1
        change = float(np.sqrt(np.sum((s - s0) ** 2)))
        assert np.isfinite(change)
        # exact: fixed-point sums have no float rounding, so the change is one person's term
        assert change <= clipped_sum_l2_sensitivity(radius, d), change
        worst = max(worst, change)
    assert worst >= radius * (1 - 1e-9)


def test_dd_clipped_sum_l2_sensitivity_with_extreme_centre():
    # A (finite) centre far from a (finite) value: y - c overflows float64. The l2 change of the
    # clipped sum must still be <= radius; an inf would also make the noise step raise, so
    # whether the run fails would depend on one person.
    values, gidx, rng = _base(0, n=50, d=2)
    values = np.nan_to_num(values)
    center = np.array([-1e308, 0.0])
    cols = ["x0", "x1"]
    radius = 1.0
    s0, _ = _agg(values, gidx).clipped_sum(cols, center, radius, ALL_PERSONS)
    vals2 = np.vstack([values, [[1e308, 0.0]]])
    s1, _ = _agg(vals2, np.append(gidx, 7)).clipped_sum(cols, center, radius, ALL_PERSONS)
    change = float(np.sqrt(np.sum((s1 - s0) ** 2)))
    assert change <= radius * (1 + 1e-12), change
