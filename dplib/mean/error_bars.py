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
