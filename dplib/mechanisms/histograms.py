"""Private histograms under add/remove-one-person neighbouring.

Each person contributes to exactly one bin, so adding or removing a person changes one count
by one: l1 sensitivity 1.

References: the pure and stability ("thresholded") histograms of Lemma 2.8 in Agarwal, Kamath,
Majid, Mouzakis, Silver, Ullman 2024 (after Korolova et al. 2009, Bun, Nissim, Stemmer 2016);
add/remove constants: one bucket changes by one, so Laplace(1/epsilon), and a bucket that appears
(count 0 -> 1) is released with probability ``exp(-epsilon (tau - 1)) / 2``, hence the threshold
``tau = 1 + ln(1/(2 delta)) / epsilon``.
"""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from dplib.budget import Budget
from dplib.errors import InvalidParameterError
from dplib.mechanisms.noise import NoiseSource


def pure_dp_histogram(counts: np.ndarray, epsilon: float, noise: NoiseSource) -> tuple[np.ndarray, float]:
    """Laplace noise on **every** bin of a fixed, data-independent bin set, empty bins too.

    Parameters
    ----------
    counts : ndarray, shape (J,)
        Exact counts of all J bins (densified: zeros for empty bins).
    epsilon : float
    noise : NoiseSource

    Returns
    -------
    (noisy counts, shape (J,); Laplace scale 1/epsilon)

    Privacy
    -------
    epsilon-DP under add/remove (l1 sensitivity 1).
    """
    eps = Budget(epsilon).epsilon
    arr = np.asarray(counts, dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0:
        raise InvalidParameterError("counts must be a non-empty 1-D array of all bins")
    scale = 1.0 / eps
    return noise.add_laplace(arr, scale), scale


def stability_threshold(epsilon: float, delta: float) -> float:
    """Release threshold ``tau = 1 + ln(1 / (2 delta)) / epsilon`` of the thresholded histogram.

    A bin that exists only because of the added person has count 1; it is released only if
    ``1 + Lap(1/epsilon) > tau``, which has probability ``exp(-epsilon (tau - 1)) / 2 = delta``.
    """
    budget = Budget(epsilon, delta)
    if budget.delta <= 0:
        raise InvalidParameterError("the thresholded histogram needs delta > 0, got 0")
    return 1.0 + math.log(1.0 / (2.0 * budget.delta)) / budget.epsilon


def thresholded_histogram(
    counts: Mapping[int, int], epsilon: float, delta: float, noise: NoiseSource
) -> tuple[dict[int, float], float, float]:
    """Stability histogram over an unbounded bin set: noise on non-empty bins, then a threshold.

    Parameters
    ----------
    counts : mapping bin -> exact count (> 0)
        Only non-empty bins; the bin set may be infinite (an integer lattice).
    epsilon, delta : float
        Budget; delta must be > 0.
    noise : NoiseSource

    Returns
    -------
    (released bins: {bin: noisy count > tau}; Laplace scale 1/epsilon; threshold tau)
        Bins below the threshold are not returned; neither are the exact counts.

    Privacy
    -------
    (epsilon, delta)-DP under add/remove: bins present in both neighbours differ by one in one
    bin (Laplace, epsilon); a bin present in one only has count 1 and crosses tau with
    probability delta.
    """
    tau = stability_threshold(epsilon, delta)
    scale = 1.0 / epsilon
    if not counts:
        return {}, scale, tau
    keys = sorted(counts)
    exact = np.asarray([counts[k] for k in keys], dtype=np.float64)
    if np.any(exact <= 0):
        raise InvalidParameterError("thresholded_histogram takes only non-empty bins")
    noisy = noise.add_laplace(exact, scale)
    released = {k: float(v) for k, v in zip(keys, noisy) if v > tau}
    return released, scale, tau
