"""Public parameter formulas of the person-level mean (Agarwal et al. 2024).

Everything here is a function of public inputs only (scale s, moment order k, records per
person m, epsilon, a DP estimate of the number of persons). These constants shape accuracy,
never privacy (``../shared/specs/person_level_mean.md`` §0).
"""

from __future__ import annotations

import math

from dplib.errors import InvalidParameterError


def check_moment_order(k: float) -> float:
    """Validate the moment order ``k`` (real, >= 2, or ``math.inf``)."""
    k = float(k)
    if math.isnan(k) or k < 2.0:
        raise InvalidParameterError(f"moment order k must be >= 2 (or inf), got {k!r}")
    return k


def bin_width_constant(k: float) -> float:
    """``c_r(k) = min over 2 <= k' <= k of (32 (k'-1)^(k'/2))^(1/k')`` (spec P1, PROPOSAL).

    With Rio's moment constant, Markov's inequality then puts at most 1/32 of the person means
    outside ``mu +- r``. A k-th moment bound implies every lower one, hence the minimum over
    integer ``k' <= k`` (and ``k`` itself when it is not an integer). Values: 5.66 (k=2),
    4.49 (3), 4.12 (4), 4.00 (5), 3.98 (k >= 6).
    """
    k = check_moment_order(k)
    upper = 60 if math.isinf(k) else int(math.floor(k))
    candidates = list(range(2, upper + 1))
    values = [(32.0 * (kp - 1) ** (kp / 2.0)) ** (1.0 / kp) for kp in candidates]
    if not math.isinf(k) and k != int(k):
        values.append((32.0 * (k - 1) ** (k / 2.0)) ** (1.0 / k))
    return min(values)


def coarse_bin_width(scale: float, k: float, m: int) -> float:
    """Bin width ``r = c_r(k) * s / sqrt(m)`` of the coarse RangeEstimator (spec P1), data units."""
    if not (math.isfinite(scale) and scale > 0):
        raise InvalidParameterError(f"scale must be finite and > 0, got {scale!r}")
    if int(m) < 1:
        raise InvalidParameterError(f"m (records per person used in the formulas) must be >= 1, got {m!r}")
    return bin_width_constant(k) * scale / math.sqrt(int(m))


def fine_radius(scale: float, k: float, m: int, u: float, n_eps: float, c_f: float = 1.0) -> float:
    """Truncation radius of the univariate fine stage (spec §2.3 step 4, P6), data units.

    ``rho = u + s * max(c_f * sqrt(max(1, (k-1) ln m) / m), (n eps)^(1/k) / m^(1-1/k))``

    The first branch keeps ``rho - u`` above the Berry-Esseen threshold; the second balances the
    clipping bias ``1/(m^(k-1) rho^(k-1))`` against the noise ``rho/(n eps)``. ``n_eps`` is a
    *DP estimate* of the fine group's size times its epsilon (never an exact count).
    """
    k = check_moment_order(k)
    m = int(m)
    floor_term = c_f * math.sqrt(max(1.0, (k - 1.0) * math.log(m)) / m) if m > 1 else c_f
    n_eps = max(float(n_eps), 1.0)
    if math.isinf(k):
        balance = 1.0 / m
    else:
        balance = n_eps ** (1.0 / k) / m ** (1.0 - 1.0 / k)
    return u + scale * max(floor_term, balance)
