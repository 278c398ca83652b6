"""Post-processing shared by the distribution estimators: total maps of DP vectors and counts
into finite ranges, and the l1 projection onto the probability simplex.

Every function here is a fixed, total map applied to values that are already DP (or public), so
it costs no budget and never refuses a value after a charge. It sits below
:mod:`dplib.distribution.private` (P0-P2 and the P3 dispatcher), :mod:`~dplib.distribution.shares`,
:mod:`~dplib.distribution.robust` and :mod:`~dplib.distribution.frc`, which all import it.
"""

from __future__ import annotations

import math

import numpy as np

from dplib.errors import InvalidParameterError
from dplib.mechanisms import EXACT_BOUND

#: Bound (persons units) on each coordinate summed into a DP person count (post-processing; any
#: real count is far below it, and up to 10^8 clamped coordinates cannot overflow a float).
COUNT_BOUND = 1e300


def floored_count(noisy_count: float) -> float:
    """A DP person count as a denominator: clamped into ``[1, COUNT_BOUND]`` (NaN to 1), a
    fixed total map (post-processing)."""
    return float(np.clip(np.nan_to_num(float(noisy_count), nan=1.0, posinf=COUNT_BOUND, neginf=1.0), 1.0, COUNT_BOUND))


def bounded(values: np.ndarray) -> np.ndarray:
    """DP values clamped into ``[-COUNT_BOUND, COUNT_BOUND]`` (NaN to 0; post-processing)."""
    v = np.nan_to_num(np.asarray(values, dtype=np.float64), nan=0.0, posinf=COUNT_BOUND, neginf=-COUNT_BOUND)
    return np.clip(v, -COUNT_BOUND, COUNT_BOUND)


def project_to_simplex(values: np.ndarray) -> np.ndarray:
    """l1-nearest point of the probability simplex: ``max(v, 0) / sum(max(v, 0))``.

    Parameters
    ----------
    values : ndarray (k,)
        Any float vector (e.g. a noisy sum of per-person distributions; the map is scale-free).

    Returns
    -------
    ndarray (k,), non-negative, summing to 1 (uniform when no entry is positive).

    Raises
    ------
    InvalidParameterError
        ``values`` is not a non-empty vector (its shape is public; its values never refused).

    Notes
    -----
    Total on every float vector, so that no DP output can make a release fail after its
    charge: NaN counts as 0, +inf as ``EXACT_BOUND`` (every +inf entry then shares the mass
    equally), and the positive part is divided by its largest entry before it is summed
    (no overflow). When no coordinate is positive every simplex point is at the same l1
    distance, and the uniform distribution is returned (the paper returns ``e_1``).

    References
    ----------
    Kamath, Majid, Moitra, Mouzakis, Ullman, the projection Pi of Lemma 4.4 (clip and
    renormalise: an l1-nearest simplex point, so ``||Pi(v) - mu||_1 <= 2 ||v - mu||_1``).
    """
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 1 or v.size < 1:
        raise InvalidParameterError("values must be a non-empty vector")
    p = np.maximum(np.nan_to_num(v, nan=0.0, posinf=EXACT_BOUND, neginf=0.0), 0.0)
    top = float(p.max())
    if not top > 0.0:
        return np.full(v.size, 1.0 / v.size)
    p = p / top
    p = p / math.fsum(p)
    return p / math.fsum(p)  # one more pass: the sum is 1 to within an ulp or two
