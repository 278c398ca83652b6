"""Public parameter formulas of the person-level mean (Agarwal et al. 2024).

Everything here is a function of public inputs only (scale s, moment order k, records per
person m, epsilon, a DP estimate of the number of persons). These constants shape accuracy,
never privacy (docs/privacy/person_level_mean.md, "Public constants").
"""

from __future__ import annotations

import math

from dplib.errors import InvalidParameterError


def check_moment_order(k: float) -> float:
    """Validate the moment order ``k`` (real, >= 2, or ``math.inf``)."""
    if isinstance(k, bool) or not isinstance(k, (int, float)):
        raise InvalidParameterError(f"moment order k must be a real number >= 2 (or inf), got {k!r}")
    k = float(k)
    if math.isnan(k) or k < 2.0:
        raise InvalidParameterError(f"moment order k must be >= 2 (or inf), got {k!r}")
    return k


def check_records_per_person(m) -> int:
    """Validate ``m`` (records per person used in the formulas): an integer >= 1."""
    if isinstance(m, bool) or not isinstance(m, (int, float)) or not math.isfinite(m) or m != int(m) or m < 1:
        raise InvalidParameterError(f"m (records per person used in the formulas) must be an integer >= 1, got {m!r}")
    return int(m)


def check_positive(value, name: str) -> float:
    """Validate a finite, positive real parameter (bools and strings refused)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise InvalidParameterError(f"{name} must be a finite real number > 0, got {value!r}")
    return float(value)


def bin_width_constant(k: float) -> float:
    """``c_r(k) = min over 2 <= k' <= k of (32 (k'-1)^(k'/2))^(1/k')`` (our constant; Theorem 3.14
    uses about ``16^(1/k)``).

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
    """Bin width ``r = c_r(k) * s / sqrt(m)`` of the coarse RangeEstimator (Algorithm 1), data units."""
    scale = check_positive(scale, "scale")
    m = check_records_per_person(m)
    return bin_width_constant(k) * scale / math.sqrt(m)


def fine_radius(scale: float, k: float, m: int, u: float, n_eps: float, c_f: float = 1.0) -> float:
    """Truncation radius of the univariate fine stage (Lemma 3.12, Theorem 3.14; constants ours), data units.

    ``rho = u + s * max(c_f * sqrt(max(1, (k-1) ln m) / m), (n eps)^(1/k) / m^(1-1/k))``

    The first branch keeps ``rho - u`` above the Berry-Esseen threshold; the second balances the
    clipping bias ``1/(m^(k-1) rho^(k-1))`` against the noise ``rho/(n eps)``. ``n_eps`` is a
    *DP estimate* of the fine group's size times its epsilon (never an exact count).
    """
    k = check_moment_order(k)
    m = check_records_per_person(m)
    if m == 1:
        floor_term = c_f
    elif math.isinf(k):
        # k = inf (sub-Gaussian-like): the Berry-Esseen threshold sqrt((k-1) ln m / m) has no
        # finite limit; use the Gaussian tail level sqrt(2 ln m / m) instead (PROPOSAL).
        floor_term = c_f * math.sqrt(max(1.0, 2.0 * math.log(m)) / m)
    else:
        floor_term = c_f * math.sqrt(max(1.0, (k - 1.0) * math.log(m)) / m)
    n_eps = max(float(n_eps), 1.0)
    if math.isinf(k):
        balance = 1.0 / m
    else:
        balance = n_eps ** (1.0 / k) / m ** (1.0 - 1.0 / k)
    return u + scale * max(floor_term, balance)
