"""Literal forms of BHS23's definitions: loops over thresholds, everything recomputed.

These follow the paper's boxes line by line (LargestGoodSubset, StableCovariance, LargestCore,
StableMean) on in-memory arrays, with no shortcut: each of the 2k + 1 thresholds runs its own
removal loop from the full set, and each core is computed from the full distance matrix by
direct differences. They are the brute-force oracle that the fast forms of
:mod:`dplib.covariance.stable` must match exactly (same subsets, weights and scores), and are
meant for small inputs (tests). Non-private; never release their outputs.

The only shared piece is the singularity rule :func:`dplib.covariance.stable.factor_or_none`
(the paper's "singular => every point is an outlier"), so both agree on what singular means.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dplib.covariance.params import core_thresholds, thresholds
from dplib.covariance.stable import factor_or_none


def largest_good_subset(y: np.ndarray, lam: float) -> np.ndarray:
    """The largest lambda-good subset of the rows of ``y`` (m, d), sorted positions (Def. 23, L796).

    Batch removal of every ``i in S`` with ``y_i^T Sigma_S^{-1} y_i > lam`` (strict), where
    ``Sigma_S = (1/m) sum_{j in S} y_j y_j^T`` (normalised by all m rows), until none is left;
    singular ``Sigma_S`` (or S empty) gives the empty set.
    """
    m = y.shape[0]
    S = np.arange(m)
    while S.size:
        sigma = y[S].T @ y[S] / m
        if factor_or_none(sigma) is None:
            return S[:0]
        sol = np.linalg.solve(sigma, y[S].T)
        s = np.einsum("ij,ji->i", y[S], sol)
        out = s > lam
        if not out.any():
            return S
        S = S[~out]
    return S


@dataclass
class LiteralCovariance:
    """Output of :func:`stable_covariance_literal` (test oracle only, BHS23 Algorithm "3")."""

    subsets: list[np.ndarray]
    score: int
    weights: np.ndarray
    sigma_hat: np.ndarray


def stable_covariance_literal(y: np.ndarray, lambda0: float, k: int) -> LiteralCovariance:
    """StableCovariance (Algorithm "3", L765) literally: 2k + 1 independent LargestGoodSubset runs."""
    m = y.shape[0]
    subsets = [largest_good_subset(y, lam) for lam in thresholds(lambda0, k)]
    score = min([k] + [m - subsets[ell].size + ell for ell in range(k + 1)])
    c = np.zeros(m)
    for ell in range(k + 1, 2 * k + 1):
        c[subsets[ell]] += 1
    w = c / (k * m)
    sigma = (y * w[:, None]).T @ y
    return LiteralCovariance(subsets, int(score), w, sigma)


def largest_core(x: np.ndarray, sigma: np.ndarray, lam: float, tau: int, R: np.ndarray) -> np.ndarray:
    """LargestCore(x, Sigma, lam, tau, R) (L1045): ``{i : #{j in R : ||x_i - x_j||^2_Sigma <= 2 lam} >= tau}``."""
    if factor_or_none(sigma) is None:
        return np.zeros(0, dtype=np.int64)
    keep = []
    xr = x[R]
    for i in range(x.shape[0]):
        diff = x[i] - xr
        dist = np.einsum("ij,ji->i", diff, np.linalg.solve(sigma, diff.T))
        if int((dist <= 2.0 * lam).sum()) >= tau:
            keep.append(i)
    return np.array(keep, dtype=np.int64)


@dataclass
class LiteralMean:
    """Output of :func:`stable_mean_literal` (test oracle only, BHS23 Algorithm "4")."""

    subsets: list[np.ndarray]
    score: int
    weights: np.ndarray
    mu_hat: np.ndarray | None


def stable_mean_literal(x: np.ndarray, sigma: np.ndarray, lambda0: float, gamma: float, k: int, R: np.ndarray) -> LiteralMean:
    """StableMean (Algorithm "4", L1030) literally: 2k + 1 LargestCore runs, degree M - l at Lambda_l."""
    n, M = x.shape[0], len(R)
    subsets = [largest_core(x, sigma, lam, M - ell, R) for ell, lam in enumerate(core_thresholds(lambda0, gamma, k))]
    score = min([k] + [n - subsets[ell].size + ell for ell in range(k + 1)])
    c = np.zeros(n)
    for ell in range(k + 1, 2 * k + 1):
        c[subsets[ell]] += 1
    z = c.sum()
    w = c / z if z > 0 else c
    mu = (w[:, None] * x).sum(axis=0) if z > 0 else None
    return LiteralMean(subsets, int(score), w, mu)
