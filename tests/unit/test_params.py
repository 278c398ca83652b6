"""Public parameter formulas of the person-level mean (bin-width constant, fine radius)."""

from __future__ import annotations

import math

import pytest

from dplib.errors import InvalidParameterError
from dplib.mean.params import bin_width_constant, coarse_bin_width, fine_radius


def _c_r(k: float) -> float:
    """min over 2 <= k' <= k of (32 (k'-1)^(k'/2))^(1/k'), over integer k' and k itself."""
    if math.isinf(k):
        kps = list(range(2, 200))
    else:
        kps = list(range(2, int(k) + 1)) + ([k] if k != int(k) else [])
    return min(math.exp((math.log(32.0) + (kp / 2.0) * math.log(kp - 1.0)) / kp) for kp in kps)


@pytest.mark.parametrize(
    "k, rounded",
    [(2, 5.66), (3, 4.49), (4, 4.12), (5, 4.00), (6, 3.98), (7, 3.98), (10, 3.98), (40, 3.98), (math.inf, 3.98)],
)
def test_bin_width_constant_table(k, rounded):
    expected = _c_r(k)
    assert round(expected, 2) == pytest.approx(rounded)  # c_r(k) rounded to 2 decimals (a hand-checked table)
    assert bin_width_constant(k) == pytest.approx(expected, rel=1e-12)


def test_bin_width_constant_closed_forms():
    assert bin_width_constant(2) == pytest.approx(math.sqrt(32.0), rel=1e-14)
    assert bin_width_constant(5) == pytest.approx(4.0, rel=1e-14)  # (32 * 4^2.5)^(1/5) = 1024^(1/5)
    assert bin_width_constant(6) == pytest.approx(4000.0 ** (1 / 6), rel=1e-14)  # 32 * 5^3


@pytest.mark.parametrize("k", [2.5, 3.7, 4.5, 5.9])
def test_bin_width_constant_non_integer_k(k):
    assert bin_width_constant(k) == pytest.approx(_c_r(k), rel=1e-12)


def test_bin_width_constant_is_non_increasing_in_k():
    ks = [2, 2.2, 2.5, 3, 3.5, 4, 5, 6, 8, 12, math.inf]
    vals = [bin_width_constant(k) for k in ks]
    assert all(a >= b for a, b in zip(vals, vals[1:]))


@pytest.mark.parametrize("k", [1.999, 1, 0, -3, math.nan, -math.inf])
def test_bad_k_refused(k):
    with pytest.raises(InvalidParameterError, match="k"):
        bin_width_constant(k)
    with pytest.raises(InvalidParameterError, match="k"):
        fine_radius(1.0, k, 1, 1.0, 100.0)


def test_coarse_bin_width():
    assert coarse_bin_width(2.0, 4, 1) == pytest.approx(2.0 * 288.0 ** 0.25, rel=1e-14)
    assert coarse_bin_width(1.0, 2, 4) == pytest.approx(math.sqrt(32.0) / 2.0, rel=1e-14)
    for bad_scale in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(InvalidParameterError, match="scale"):
            coarse_bin_width(bad_scale, 4, 1)
    with pytest.raises(InvalidParameterError, match="m"):
        coarse_bin_width(1.0, 4, 0)


# rho = u + s * max(c_f * sqrt(max(1, (k-1) ln m) / m), (n eps)^(1/k) / m^(1-1/k))  (m > 1)
# with the floor term c_f for m = 1 and n eps floored at 1.
@pytest.mark.parametrize(
    "scale, k, m, u, n_eps, expected",
    [
        # m = 1, k = 4, n eps = 10^4: balance 10, floor 1 -> u + 10 s
        (1.0, 4, 1, 2.0, 1e4, 12.0),
        (3.0, 4, 1, 2.0, 1e4, 2.0 + 30.0),
        # n eps below 1 is floored at 1: balance 1 == floor 1
        (1.0, 4, 1, 0.5, 0.01, 1.5),
        (1.0, 4, 1, 0.5, 0.0, 1.5),
        # m = 1, k = 2, n eps = 16: balance 4
        (0.5, 2, 1, 1.0, 16.0, 1.0 + 0.5 * 4.0),
        # m = 100, k = 4, n eps = 16: floor sqrt(3 ln 100 / 100) = 0.37169; balance 2 / 100^0.75 = 0.0632
        (1.0, 4, 100, 1.0, 16.0, 1.0 + math.sqrt(3 * math.log(100) / 100)),
        # m = 100, k = 4, n eps = 1e8: balance 100 / 31.6228 = 3.16228 dominates
        (1.0, 4, 100, 1.0, 1e8, 1.0 + 100.0 / 100 ** 0.75),
        # m = 2, k = 2: (k-1) ln 2 < 1, floor sqrt(1/2); n eps = 1: balance 1/sqrt(2) too
        (1.0, 2, 2, 0.0 + 1e-9, 1.0, 1e-9 + math.sqrt(0.5)),
        # k = inf, m = 1: balance (n eps)^0 / m = 1
        (2.0, math.inf, 1, 1.0, 1e6, 1.0 + 2.0),
    ],
)
def test_fine_radius_hand_cases(scale, k, m, u, n_eps, expected):
    assert fine_radius(scale, k, m, u, n_eps) == pytest.approx(expected, rel=1e-12)


def test_fine_radius_c_f():
    # m = 1: floor term c_f; with n eps = 1 the balance is 1, so c_f = 3 wins.
    assert fine_radius(1.0, 4, 1, 0.0 + 2.0, 1.0, c_f=3.0) == pytest.approx(5.0)


def test_fine_radius_grows_like_n_eps_to_the_1_over_k():
    r1 = fine_radius(1.0, 4, 1, 0.0 + 1e-12, 1e4) - 1e-12
    r2 = fine_radius(1.0, 4, 1, 0.0 + 1e-12, 16e4) - 1e-12
    assert r2 / r1 == pytest.approx(2.0, rel=1e-9)


@pytest.mark.parametrize("m", [2, 4, 30])
def test_fine_radius_is_finite_for_k_inf_and_m_above_one(m):
    # k = inf is accepted ("sub-Gaussian-like": rho -> rho_floor). A finite radius is
    # needed: the fine stage uses it as the Laplace sensitivity.
    rho = fine_radius(1.0, math.inf, m, 1.0, 1e4)
    assert math.isfinite(rho)
