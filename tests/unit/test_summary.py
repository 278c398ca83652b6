"""dplib.summary, the exact fixed-point person sum, against Python integers and fractions.

Oracles: ``q(v) = sign(v) * floor(|v| * 2**150)`` computed with ``fractions.Fraction`` (exact
rationals), limb sums rebuilt with Python's unbounded integers, and ``math.fsum`` for the
correctly rounded sum of values inside the window.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from dplib.summary import (
    CLAMP, LIMB_BITS, LIMBS, SHIFT, canonical_digits, limbs, person_mean, person_sums, total_from_limb_sums,
    totals_from_limb_sums,
)


def _q(v: float) -> int:
    c = min(max(v, -CLAMP), CLAMP)
    mag = math.floor(abs(Fraction(c)) * 2**SHIFT)
    return -mag if c < 0 else mag


def _values(seed=3):
    rng = np.random.default_rng(seed)
    vals = [0.0, -0.0, 5e-324, -5e-324, 1e-310, 2.0**-150, 2.0**-151, 3 * 2.0**-151, 0.1, -1 / 3, 1e300, -1e308, CLAMP, -CLAMP]
    for k in range(-155, 100, 3):
        vals += [math.ldexp(1.0, k) * (1 + d * 2**-52) for d in (-1, 0, 1)]
    vals += list(rng.standard_normal(300) * 10.0 ** rng.uniform(-45, 35, 300))
    return np.array(vals)


def test_limbs_rebuild_the_exact_fixed_point_integer():
    v = _values()
    lim = limbs(v)
    assert lim.shape == (v.size, LIMBS)
    assert np.all(np.abs(lim) < 2**LIMB_BITS)
    for x, row in zip(v, lim):
        assert sum(int(s) << (LIMB_BITS * i) for i, s in enumerate(row)) == _q(float(x))
        assert np.all(row * np.sign(x) >= 0)  # every limb carries the value's sign


def test_total_is_the_high_digit_first_double_sum_and_close_to_exact():
    v = _values(4)
    inv = np.arange(v.size) % 7
    got = person_sums(v, inv, 8)
    for p in range(7):
        qs = [_q(float(x)) for x in v[inv == p]]
        s = sum(qs)
        # limb sums rebuilt from the exact integer: S_i of sum of signed limbs
        lim = limbs(v[inv == p]).sum(axis=0)
        assert sum(int(a) << (LIMB_BITS * i) for i, a in enumerate(lim)) == s
        # the canonical digits of the exact integer s, added high first
        digits = [(s >> (LIMB_BITS * i)) & ((1 << LIMB_BITS) - 1) for i in range(LIMBS)] + [s >> (LIMB_BITS * LIMBS)]
        want = 0.0
        for i in range(LIMBS, -1, -1):
            want = want + float(digits[i]) * math.ldexp(1.0, LIMB_BITS * i - SHIFT)
        assert got[p] == want == total_from_limb_sums(lim)
        assert got[p] == pytest.approx(float(Fraction(s, 2**SHIFT)), rel=1e-14, abs=2.0**-140)
    assert got[7] == 0.0  # a person without values


def test_totals_depend_on_the_exact_sum_only():
    """Two limb-sum vectors of the same integer (a carry moved between limbs) give the same
    total; the vectorised carry chain equals the Python-int one, with mixed signs and at the
    extremes (limb sums near 2**31 * 2**32)."""
    rng = np.random.default_rng(11)
    sums = rng.integers(-(2**62), 2**62, size=(400, LIMBS), dtype=np.int64)
    sums[:50] = rng.integers(-(2**31), 2**31, size=(50, LIMBS))
    sums[50:60] = 0
    sums[60, :] = 2**62
    sums[61, :] = -(2**62)
    moved = sums.copy()
    moved[:, 3] += 1 << LIMB_BITS  # + 2**(31*4) ...
    moved[:, 4] -= 1  # ... - 2**(31*4): the same integer
    want = [total_from_limb_sums(r) for r in sums]
    assert list(totals_from_limb_sums(sums)) == want == [total_from_limb_sums(r) for r in moved]
    assert list(totals_from_limb_sums(moved)) == want
    assert canonical_digits(sums[60])[-1] == sum(2**62 << (LIMB_BITS * i) for i in range(LIMBS)) >> (LIMB_BITS * LIMBS)


def test_inside_the_window_the_sum_is_exact():
    rng = np.random.default_rng(5)
    v = rng.standard_normal(10_000) * 10.0 ** rng.uniform(-20, 20, 10_000)
    inv = rng.integers(0, 50, v.size)
    got = person_sums(v, inv, 50)
    for p in range(50):
        assert got[p] == pytest.approx(math.fsum(v[inv == p]), rel=4e-16, abs=0.0)


def test_order_and_grouping_do_not_matter():
    v = _values(6)
    perm = np.random.default_rng(7).permutation(v.size)
    assert person_mean(v) == person_mean(v[perm]) == person_mean(list(v[perm][::-1]))


def test_clamp_truncation_and_bad_input():
    assert person_mean([1e300]) == CLAMP and person_mean([-1e300, -1e300]) == -CLAMP
    assert person_mean([2.5 * 2.0**-150]) == 2 * 2.0**-150 and person_mean([-(2.0**-151)]) == 0.0
    assert math.isnan(person_mean([])) and math.isnan(person_mean([math.nan, math.inf]))
    assert person_mean([1.0, math.nan, 3.0]) == 2.0  # non-finite values dropped
    with pytest.raises(ValueError, match="finite"):
        limbs(np.array([1.0, math.nan]))
    with pytest.raises(ValueError, match="inverse"):
        person_sums(np.array([1.0, 2.0]), np.array([0, 3]), 2)
