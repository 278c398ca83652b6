"""Laplace and Gaussian mechanisms with their calibrations.

Neighbouring relation: add/remove one person. Sensitivities are passed in by the caller, who
derives them from that relation (and tests them against extreme neighbours).
"""

from __future__ import annotations

import math

import numpy as np
from scipy.stats import norm

from dplib.budget import Budget
from dplib.errors import InvalidParameterError
from dplib.mechanisms.noise import NoiseSource


#: Exact values handed to a mechanism are clamped to +-EXACT_BOUND: a 1-Lipschitz map, so the
#: sensitivity is unchanged, and an overflowing exact sum cannot raise a data-dependent error.
EXACT_BOUND = 1e306
#: Relative margin added to declared sensitivities: float products such as ``w * n`` and the
#: conversion of fixed-point sums to data units round by ~1e-15..1e-9 relative; rounding that
#: touches privacy must go toward more noise.
SENSITIVITY_MARGIN = 2.0**-20


def inflate(sensitivity: float) -> float:
    """``sensitivity * (1 + SENSITIVITY_MARGIN)``: covers float rounding of the released values."""
    return float(sensitivity) * (1.0 + SENSITIVITY_MARGIN)


def clamp_exact(values: np.ndarray) -> np.ndarray:
    """Clamp exact query answers to ``+-EXACT_BOUND`` (and map +-inf there) before noise."""
    return np.clip(np.nan_to_num(np.asarray(values, dtype=np.float64), nan=0.0, posinf=EXACT_BOUND, neginf=-EXACT_BOUND), -EXACT_BOUND, EXACT_BOUND)


def laplace_scale(l1_sensitivity: float, epsilon: float) -> float:
    """Scale ``b = l1_sensitivity / epsilon`` of the Laplace mechanism (pure epsilon-DP).

    Raises
    ------
    InvalidParameterError
        If the sensitivity or epsilon is not finite and positive.
    """
    if not (math.isfinite(l1_sensitivity) and l1_sensitivity > 0):
        raise InvalidParameterError(f"l1_sensitivity must be finite and > 0, got {l1_sensitivity!r}")
    eps = Budget(epsilon).epsilon
    return float(l1_sensitivity) / eps


def laplace_mechanism(
    values: np.ndarray, l1_sensitivity: float, epsilon: float, noise: NoiseSource
) -> tuple[np.ndarray, float]:
    """Release ``values + Laplace(l1_sensitivity / epsilon)`` per entry.

    Parameters
    ----------
    values : ndarray, shape (q,)
        Exact query answers, finite.
    l1_sensitivity : float
        Max over add/remove neighbours of ``||f(D) - f(D')||_1``.
    epsilon : float
        Budget of this release (pure DP).
    noise : NoiseSource

    Returns
    -------
    (noisy values of shape (q,), Laplace scale)

    Privacy
    -------
    epsilon-DP (Dwork, McSherry, Nissim, Smith 2006).
    """
    scale = laplace_scale(l1_sensitivity, epsilon)
    return noise.add_laplace(np.asarray(values, dtype=np.float64), scale), scale


def analytic_gaussian_delta(sigma: float, l2_sensitivity: float, epsilon: float) -> float:
    """delta(epsilon) of the Gaussian mechanism ``N(0, sigma^2)`` with the given sensitivity.

    Balle & Wang 2018, Theorem 8: ``Phi(D/(2s) - e s/D) - exp(e) Phi(-D/(2s) - e s/D)``.
    """
    a = l2_sensitivity / (2.0 * sigma)
    b = epsilon * sigma / l2_sensitivity
    # exp(e) * Phi(x) computed in log space so that large epsilon does not overflow.
    second = math.exp(epsilon + norm.logcdf(-a - b))
    return float(norm.cdf(a - b) - second)


def gaussian_sigma(l2_sensitivity: float, epsilon: float, delta: float) -> float:
    """Smallest sigma for which the Gaussian mechanism is (epsilon, delta)-DP.

    The analytic Gaussian mechanism (Balle & Wang 2018), valid for every epsilon > 0 (the
    classic ``sqrt(2 ln(1.25/delta))/epsilon`` is not valid for epsilon >= 1). The value comes
    from Google's ``dp_accounting`` (``pld.accountant.get_smallest_gaussian_noise``) and is then
    checked against the closed form of Balle & Wang; if the check fails sigma is raised until it
    passes (rounding toward more noise).

    Raises
    ------
    InvalidParameterError
        If delta is not in (0, 1) or the sensitivity / epsilon is not positive and finite.
    """
    budget = Budget(epsilon, delta)
    if budget.delta <= 0.0:
        raise InvalidParameterError("the Gaussian mechanism needs delta > 0, got 0")
    if not (math.isfinite(l2_sensitivity) and l2_sensitivity > 0):
        raise InvalidParameterError(f"l2_sensitivity must be finite and > 0, got {l2_sensitivity!r}")
    from dp_accounting.pld import accountant, common  # lazy: a ~2 s import; pure-DP paths never need it

    sigma = float(
        accountant.get_smallest_gaussian_noise(
            common.DifferentialPrivacyParameters(budget.epsilon, budget.delta),
            num_queries=1,
            sensitivity=float(l2_sensitivity),
        )
    )
    for _ in range(200):
        if analytic_gaussian_delta(sigma, l2_sensitivity, budget.epsilon) <= budget.delta:
            return sigma
        sigma *= 1.0 + 1e-9
    raise InvalidParameterError("could not calibrate the Gaussian mechanism")  # pragma: no cover


def gaussian_mechanism(
    values: np.ndarray, l2_sensitivity: float, epsilon: float, delta: float, noise: NoiseSource
) -> tuple[np.ndarray, float]:
    """Release ``values + N(0, sigma^2 I)`` with the analytic-Gaussian sigma.

    Parameters
    ----------
    values : ndarray, shape (q,)
    l2_sensitivity : float
        Max over add/remove neighbours of ``||f(D) - f(D')||_2``.
    epsilon, delta : float
        Budget of this release.
    noise : NoiseSource

    Returns
    -------
    (noisy values of shape (q,), sigma)

    Privacy
    -------
    (epsilon, delta)-DP (Balle & Wang 2018, Theorem 8).
    """
    sigma = gaussian_sigma(l2_sensitivity, epsilon, delta)
    return noise.add_gaussian(np.asarray(values, dtype=np.float64), sigma), sigma
