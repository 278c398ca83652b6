"""Quantiles of the error distributions behind the released error bars (post-processing only).

The error of a released mean is a sum of independent pieces with known distributions: the
Laplace noise of the centred sum, the Laplace noise of the count (times the released deviation),
and, for the scale-free estimator, a normal approximation of the sampling of persons into the fine
group. These functions give two-sided quantiles of such sums; both mean estimators use them.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.integrate import trapezoid  # np.trapezoid is NumPy >= 2 only; pyproject allows 1.26
from scipy.optimize import brentq
from scipy.special import roots_hermitenorm
from scipy.stats import norm

from dplib.errors import InvalidParameterError

ERROR_LEVEL = 0.90


def laplace_pair_tail(t: float, a: float, b: float) -> float:
    """P(|X + Y| > t) for independent X ~ Lap(a), Y ~ Lap(b), t >= 0."""
    if b <= 0 or a <= 0:
        s = max(a, b)
        return math.exp(-t / s)
    if abs(a - b) <= 1e-9 * max(a, b):
        return math.exp(-t / a) * (1.0 + t / (2.0 * a))
    return (a * a * math.exp(-t / a) - b * b * math.exp(-t / b)) / (a * a - b * b)


def laplace_pair_density(z: float, a: float, b: float) -> float:
    """Density of X + Y, X ~ Lap(a), Y ~ Lap(b) independent."""
    z = abs(z)
    if b <= 0 or a <= 0:
        s_ = max(a, b)
        return math.exp(-z / s_) / (2.0 * s_)
    if abs(a - b) <= 1e-9 * max(a, b):
        return (1.0 + z / a) * math.exp(-z / a) / (4.0 * a)
    return (a * math.exp(-z / a) - b * math.exp(-z / b)) / (2.0 * (a * a - b * b))


def noise_and_sampling_quantile(a: float, b: float, sigma: float, level: float = ERROR_LEVEL) -> float:
    """``t`` with ``P(|X + Y + G| <= t) = level``; X ~ Lap(a), Y ~ Lap(b), G ~ N(0, sigma^2).

    Solved in units of ``a + b + sigma`` (so the answer scales exactly with the data). The tail
    is integrated over whichever variable is smoother on the other's scale: over ``Z = X + Y``
    on a fine grid (closed-form density) when ``sigma >= a + b``, else over ``G`` by 60-node
    Gauss-Hermite quadrature of the closed-form tail of ``Z``.
    """
    unit = a + b + sigma
    if not (math.isfinite(unit) and unit > 0):
        raise InvalidParameterError(f"noise scales must be finite, not all zero: {a!r}, {b!r}, {sigma!r}")
    a, b, sigma = a / unit, b / unit, sigma / unit
    lap = a + b
    if sigma <= 1e-12:
        t = brentq(lambda t: laplace_pair_tail(t, a, b) - (1 - level), 0.0, 60.0 * lap, xtol=1e-12)
        return float(t) * unit
    if lap <= 1e-12:
        return float(norm.ppf(0.5 + level / 2.0)) * sigma * unit
    if sigma >= lap:
        z = np.linspace(-40.0 * lap, 40.0 * lap, 8001)
        w = np.vectorize(laplace_pair_density)(z, a, b)
        w = w / trapezoid(w, z)

        def tail(t: float) -> float:
            return float(trapezoid(w * (norm.sf((t - z) / sigma) + norm.cdf((-t - z) / sigma)), z))
    else:
        nodes, weights = _HERMITE
        g = nodes * sigma

        def tail(t: float) -> float:
            total = 0.0
            for y1, y2, wt in zip(t - g, t + g, weights):
                for y in (y1, y2):
                    half = 0.5 * laplace_pair_tail(abs(y), a, b)
                    total += wt * (half if y >= 0 else 1.0 - half)
            return total

    t = brentq(lambda t: tail(t) - (1 - level), 0.0, 60.0 * lap + 10.0 * sigma, xtol=1e-10)
    return float(t) * unit


_HERMITE = (lambda r: (r[0], r[1] / r[1].sum()))(roots_hermitenorm(60))


#: Laplace scales closer than this ratio are raised apart before :func:`laplace_sum_tail` (its
#: partial-fraction coefficients grow like ``1 / (1 - ratio^-2)``); raising a scale only widens
#: the law of ``|sum|`` (Anderson's theorem), so the quantile stays conservative.
LAPLACE_SPREAD = 1.05
#: Scales below this fraction of the largest are left out of the sum and covered by a margin.
NEGLIGIBLE_SCALE = 1e-9


def laplace_sum_tail(t: float, scales) -> float:
    """``P(|X_1 + ... + X_k| > t)`` for independent ``X_j ~ Lap(b_j)`` with *distinct* scales.

    The characteristic function ``prod_j 1 / (1 + b_j^2 s^2)`` splits into partial fractions
    ``sum_j c_j / (1 + b_j^2 s^2)``, ``c_j = prod_{i != j} b_j^2 / (b_j^2 - b_i^2)``, so the law is
    a signed mixture of Laplace laws and the tail is ``sum_j c_j exp(-t / b_j)`` (for k = 2 this
    is :func:`laplace_pair_tail`).
    """
    b = [float(x) for x in scales]
    total = 0.0
    for j, bj in enumerate(b):
        c = 1.0
        for i, bi in enumerate(b):
            if i != j:
                c *= bj * bj / (bj * bj - bi * bi)
        total += c * math.exp(-t / bj)
    return min(max(total, 0.0), 1.0)


def laplace_sum_quantile(scales, level: float = ERROR_LEVEL) -> float:
    """``t`` with ``P(|X_1 + ... + X_k| <= t) >= level`` for independent ``X_j ~ Lap(b_j)``.

    Exact when the positive scales are at least :data:`LAPLACE_SPREAD` apart; closer scales are
    first raised (each to ``LAPLACE_SPREAD`` times the next smaller one), which can only widen the
    law of ``|sum|`` (Anderson 1955: for symmetric unimodal independent terms, ``P(|X + cY| <= t)``
    does not increase with ``|c|``), so the result is then conservative. Scales below
    :data:`NEGLIGIBLE_SCALE` times the largest are covered by ``60 b_j`` each (probability
    ``e^-60``). Post-processing only.

    Raises
    ------
    InvalidParameterError
        A scale that is negative or not finite, no positive scale, or ``level`` outside (0, 1).
    """
    b = np.asarray(scales, dtype=np.float64).ravel()
    if b.size == 0 or not np.all(np.isfinite(b)) or np.any(b < 0) or not np.any(b > 0):
        raise InvalidParameterError(f"Laplace scales must be finite, >= 0 and not all 0, got {b.tolist()!r}")
    if not (0.0 < level < 1.0):
        raise InvalidParameterError(f"level must be in (0, 1), got {level!r}")
    unit = float(b.max())
    b = b / unit
    margin = 60.0 * float(b[b < NEGLIGIBLE_SCALE].sum())
    spread: list[float] = []
    for x in np.sort(b[b >= NEGLIGIBLE_SCALE]):
        spread.append(float(x) if not spread else max(float(x), LAPLACE_SPREAD * spread[-1]))
    hi = 60.0 * sum(spread)
    t = brentq(lambda t: laplace_sum_tail(t, spread) - (1.0 - level), 0.0, hi, xtol=1e-12)
    return (float(t) + margin) * unit


def laplace_iid_sum_upper(k: int, scale: float, level: float) -> float:
    """``t`` with ``P(X_1 + ... + X_k > t) <= 1 - level`` for i.i.d. ``X_j ~ Lap(scale)``: the
    Chernoff bound ``inf_lambda exp(-lambda t) (1 - lambda^2 scale^2)^-k`` (the Laplace moment
    generating function), solved for ``t``. Conservative; post-processing only.

    Raises
    ------
    InvalidParameterError
        ``k < 1``, a scale that is not finite and > 0, or ``level`` outside (0, 1).
    """
    if not (isinstance(k, (int, np.integer)) and k >= 1) or not (math.isfinite(scale) and scale > 0):
        raise InvalidParameterError(f"need k >= 1 and a finite scale > 0, got {k!r}, {scale!r}")
    if not (0.0 < level < 1.0):
        raise InvalidParameterError(f"level must be in (0, 1), got {level!r}")
    target = math.log(1.0 / (1.0 - level))

    def log_bound(t: float) -> float:  # in units of scale; the optimal lambda of the Chernoff bound
        lam = (math.sqrt(k * k + t * t) - k) / t
        return -lam * t - k * math.log1p(-lam * lam) + target

    hi = 1.0
    while log_bound(hi) > 0:
        hi *= 2.0
    return float(brentq(log_bound, 1e-12, hi, xtol=1e-12)) * scale
