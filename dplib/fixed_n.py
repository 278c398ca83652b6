"""Exactly n0 persons: a DP lower bound on the person count, selection by keyed-hash rank, padding.

Some estimators are proved under *replace-one* neighbouring with the number of persons ``n``
public and fixed (P3 of the batch estimators, after Kamath, Majid, Moitra, Mouzakis, Ullman's
batch-level DP; BHS23's covariance estimator). The project's privacy model is add/remove with
``n`` private. The bridge (docs/privacy/distribution.md, "n0 and padding"; docs/privacy/
stable_covariance.md, "Person level: exactly n0 person vectors"):

1. **n0** (:func:`release_lower_bound`): release the person count with the Laplace mechanism
   (l1 sensitivity 1 under add/remove, its own charge) and turn it into a lower confidence
   bound ``n0 = max(n_min, floor(noisy - b ln(1 / (2 beta))))`` (:func:`lower_bound`):
   ``P[n0 > n] <= beta`` when ``n >= n_min`` (Laplace tail ``P[L > t] = exp(-t/b) / 2``).
2. **Selection**: take exactly the ``n0`` persons of smallest key, the key being a keyed hash of
   the person id (the run's secret salt) with ties broken by the person's own summary, so the
   selected *multiset* of summaries is a function of the data alone.
3. **Padding** (:func:`pad_histogram`): when fewer than ``n0`` persons exist, add fixed public
   dummy summaries up to ``n0``; never a refusal that branches on the exact count.

Why this transfers the proofs: conditioned on the released ``n0`` (a DP output, adaptive
composition), adding or removing one person changes the selected multiset of ``n0`` summaries
by **one substitution**: an added person either falls among the ``n0`` smallest keys (and evicts
the ``n0``-th person, or a dummy when padding) or changes nothing; removal is symmetric. So a
mechanism that is epsilon-DP under substitution on ``n0`` fixed summaries is epsilon-DP under
add/remove on the persons, and the total is ``epsilon_count + epsilon``.

Cost of the bridge: with probability <= beta the set is padded (dummies act as corruption, which
the robust estimators tolerate up to their trimming level); otherwise ``n - n0`` persons
(about ``b ln(1/(2 beta))``) are left out, which only costs sample size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Hashable, Mapping

import numpy as np

from dplib.errors import InvalidParameterError
from dplib.mechanisms import NoiseSource, inflate, laplace_mechanism

#: Smallest n0 ever used (n0 = 0 would leave nothing to estimate from; padding fills the rest).
N_MIN = 1
#: Largest n0 (and the clamp of the noisy count): fits an int64.
N_MAX = 2**62


def check_beta(beta: float) -> float:
    """The failure probability of the lower bound, in ``(0, 0.5)`` (the one declaration: every
    estimator that releases ``n0`` checks its ``beta`` here), else :class:`InvalidParameterError`."""
    if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not 0.0 < beta < 0.5:
        raise InvalidParameterError(f"beta (failure probability of the lower bound) must be in (0, 0.5), got {beta!r}")
    return float(beta)


def lower_bound(noisy_count: float, laplace_scale: float, beta: float, n_min: int = N_MIN) -> int:
    """``n0 = max(n_min, floor(noisy_count - laplace_scale * ln(1 / (2 beta))))``.

    Parameters
    ----------
    noisy_count : float
        A Laplace release of the person count (persons units).
    laplace_scale : float
        Its Laplace scale ``b`` (> 0).
    beta : float in (0, 0.5)
        Failure probability: ``P[n0 > n] <= beta`` for every true count ``n >= n_min``.
    n_min : int, default 1

    Returns
    -------
    int in ``[n_min, 2**62]``
        Post-processing of the noisy count: as private as it. The map is total: the noisy count
        is first clamped to ``+-2**62`` (NaN to ``-2**62``), so an extreme DP output gives
        ``n_min`` or ``2**62``, never an error.

    Raises
    ------
    InvalidParameterError
        A count that is not a real number, scale <= 0, beta outside (0, 0.5), n_min < 1.
    """
    beta = check_beta(beta)
    if isinstance(noisy_count, bool) or not isinstance(noisy_count, (int, float, np.floating, np.integer)):
        raise InvalidParameterError(f"noisy_count must be a real number, got {noisy_count!r}")
    noisy_count = float(np.clip(np.nan_to_num(float(noisy_count), nan=-N_MAX, posinf=N_MAX, neginf=-N_MAX), -N_MAX, N_MAX))
    if not (isinstance(laplace_scale, (int, float)) and math.isfinite(laplace_scale) and laplace_scale > 0):
        raise InvalidParameterError(f"laplace_scale must be finite and > 0, got {laplace_scale!r}")
    if isinstance(n_min, bool) or not isinstance(n_min, int) or n_min < 1:
        raise InvalidParameterError(f"n_min must be an integer >= 1, got {n_min!r}")
    bound = math.floor(float(noisy_count) - float(laplace_scale) * math.log(1.0 / (2.0 * beta)))
    return int(max(n_min, min(bound, N_MAX)))


@dataclass(frozen=True)
class FixedN:
    """Result of :func:`release_lower_bound`: ``n0`` and the DP count it came from (both DP)."""

    n0: int
    noisy_count: float
    laplace_scale: float
    beta: float


def release_lower_bound(exact_count: int, epsilon: float, beta: float, noise: NoiseSource, n_min: int = N_MIN) -> FixedN:
    """Release a DP lower confidence bound ``n0`` on a person count.

    The caller must have charged ``(epsilon, 0)`` on the persons counted.

    Parameters
    ----------
    exact_count : int
        The exact number of persons (never logged or returned).
    epsilon : float
    beta : float in (0, 0.5)
        ``P[n0 > exact_count] <= beta``.
    noise : NoiseSource
    n_min : int, default 1

    Returns
    -------
    FixedN

    Privacy
    -------
    epsilon-DP under add/remove one person: the count has l1 sensitivity 1; Laplace with scale
    ``(1 + 2^-20) / epsilon`` (the margin covers float rounding); ``n0`` is post-processing.
    """
    if isinstance(exact_count, bool) or not isinstance(exact_count, (int, np.integer)) or exact_count < 0:
        raise InvalidParameterError("exact_count must be a non-negative integer")
    beta = check_beta(beta)
    noisy, scale = laplace_mechanism(np.array([float(exact_count)]), inflate(1.0), epsilon, noise)
    del exact_count
    value = float(noisy[0])
    return FixedN(lower_bound(value, scale, beta, n_min), value, float(scale), beta)


def pad_histogram(hist: Mapping[Hashable, int], n0: int, dummy: Hashable) -> dict:
    """The histogram of exactly ``n0`` summaries: ``hist`` plus ``n0 - sum(hist)`` dummies.

    Parameters
    ----------
    hist : mapping {summary: multiplicity}
        Histogram of the selected persons' summaries (at most ``n0`` persons: the ``n0`` of
        smallest key, or all of them when fewer exist).
    n0 : int
        The public (DP) number of summaries.
    dummy : hashable
        The fixed public dummy summary (chosen before any data is read; for count vectors see
        :func:`dplib.distribution.p3.dummy_batch`).

    Returns
    -------
    dict
        A new histogram with multiplicities summing to ``n0``.

    Raises
    ------
    InvalidParameterError
        ``n0 < 1``, or ``hist`` holds more than ``n0`` summaries (the selection is broken; the
        message carries no count).
    """
    if isinstance(n0, bool) or not isinstance(n0, (int, np.integer)) or n0 < 1:
        raise InvalidParameterError(f"n0 must be an integer >= 1, got {n0!r}")
    out = {key: int(v) for key, v in hist.items() if int(v) > 0}
    total = sum(out.values())
    if total > n0:
        raise InvalidParameterError("the selected histogram holds more summaries than n0: the selection must take at most n0")
    if total < n0:
        out[dummy] = out.get(dummy, 0) + int(n0) - total
    return out
