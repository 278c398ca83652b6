"""StableCovariance and StableMean of BHS23, the exact fast forms, written against a backend.

Nothing here is private by itself: these are the non-private building blocks whose outputs
(Sigma_hat, mu_hat, the scores) stay inside Algorithms 1 / 5.1 (:mod:`dplib.covariance.private`).
Never log or release a result of this module.

StableCovariance (the "fast equivalent" of Algorithm "3"): thresholds are processed in decreasing
order; one score pass settles every threshold whose test passes; each removal round removes
every row with ``s_i > lambda_l`` (strict) at the current level; the Gram matrix of the next
round is the exact sum of the scan's bucket Grams (no subtraction); the run stops early once
k rows are removed. At most k removal rounds, so at most k + 1 scans plus one Gram pass; the
number of passes is never capped below that (docs/privacy/stable_covariance.md, "Passes").

StableMean (Algorithm "4"): one core pass gives every row's entry level from the 2k + 1 largest
whitened distances to the reference set R.

Numerically singular Gram matrices: a Gram matrix counts as singular when the
Cholesky factorisation fails or the reciprocal condition number of its correlation-scaled form
``D^-1/2 G D^-1/2`` is at most :data:`RCOND_SINGULAR` (exactly singular in exact arithmetic for
a constant or duplicated column). Singular means every point is an outlier, the paper's rule,
so such data end in FAIL; no pseudo-inverse or ridge is used.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from dplib.seam import CovarianceBackend


#: Reciprocal condition number (of the correlation-scaled Gram) at or below which a Gram matrix
#: is treated as singular. Float64 Gram-based scores are reliable up to condition ~1e10.
RCOND_SINGULAR = 1e-10


def factor_or_none(matrix: np.ndarray) -> np.ndarray | None:
    """Lower Cholesky factor of a symmetric matrix, or None if it is (numerically) singular."""
    if matrix is None:
        return None
    g = np.asarray(matrix, dtype=np.float64)
    diag = np.diag(g)
    if not np.all(np.isfinite(g)) or np.any(diag <= 0.0):
        return None
    s = 1.0 / np.sqrt(diag)
    w = np.linalg.eigvalsh(g * s[:, None] * s[None, :])
    if not (w[0] > RCOND_SINGULAR * w[-1]):
        return None
    try:
        return np.linalg.cholesky(g)
    except np.linalg.LinAlgError:
        return None


def weight_count(e: np.ndarray | int, k: int) -> np.ndarray:
    """``c = #{l in k+1..2k : e <= l} = 2k - max(e, k+1) + 1`` for ``e <= 2k``, else 0."""
    e = np.asarray(e)
    return np.where(e <= 2 * k, 2 * k - np.maximum(e, k + 1) + 1, 0)


def capped_score(sizes: dict[int, int], total: int, k: int) -> int:
    """``min(k, min_{l <= k} (total - |S_l| + l))`` over the known levels (others count as >= k)."""
    terms = [total - size + ell for ell, size in sizes.items() if ell <= k]
    return int(min([k] + terms))


@dataclass
class StableCovarianceResult:
    """Output of :func:`stable_covariance`. Non-private; never log or release it.

    ``removed_level[i] = l`` for each row removed at level l (entry level l + 1);
    ``singular_level`` is the level at which the Gram became singular (every then-active row
    removed there), or None; ``sizes[l] = |S_l|`` for every level the run settled;
    ``sigma_hat`` is None when ``score == k`` (the PTR then fails with probability 1).
    """

    m: int
    k: int
    score: int
    sigma_hat: np.ndarray | None
    removed_level: dict[int, int]
    singular_level: int | None
    sizes: dict[int, int]
    complete: bool
    passes: int
    removed_rows: dict[int, np.ndarray] = field(default_factory=dict, repr=False)

    def entry_levels(self) -> np.ndarray:
        """Dense entry levels ``e_i`` (shape ``(m,)``); exact on every settled level."""
        e = np.zeros(self.m, dtype=np.int64)
        if self.singular_level is not None:
            e[:] = self.singular_level + 1
        for i, ell in self.removed_level.items():
            e[i] = ell + 1
        return e

    def subset(self, ell: int) -> np.ndarray:
        """``S_l`` (sorted positions) for a settled level."""
        if ell not in self.sizes:
            raise KeyError(f"level {ell} was not settled (early stop)")
        return np.flatnonzero(self.entry_levels() <= ell)

    def weights(self) -> np.ndarray:
        """``w_i = c_i / (k m)`` (shape ``(m,)``); meaningful when ``score < k``."""
        return weight_count(self.entry_levels(), self.k) / (self.k * self.m)


def stable_covariance(backend: CovarianceBackend, thresholds: tuple[float, ...], k: int) -> StableCovarianceResult:
    """StableCovariance(y, lambda0, k) on the backend's covariance rows (BHS23 Algorithm "3").

    Parameters
    ----------
    backend : CovarianceBackend
        Its covariance rows ``y`` (m, d): pairs (Algorithm 1) or mean-zero rows (Algorithm 5.1).
    thresholds : tuple of 2k + 1 floats
        ``lambda_l``, ascending (:func:`dplib.covariance.params.thresholds`).
    k : int

    Returns
    -------
    StableCovarianceResult
        ``score`` in 0..k; ``sigma_hat = sum_i w_i y_i y_i^T`` with ``w_i = c_i/(k m)`` (weights
        sum to at most 1, not renormalised); the exact largest good subsets on settled levels.

    Privacy
    -------
    None by itself. The score is 2-sensitive under substitution when m >= 10 k lambda0
    (Lemma 32); Sigma_hat is gamma-stable when both scores are < k (Lemmas 24-26).

    References
    ----------
    BHS23 Algorithm "3" (L765), LargestGoodSubset (L796), Lemmas 25-28, 32.
    """
    m = backend.m
    thr = tuple(float(t) for t in thresholds)
    if len(thr) != 2 * k + 1:
        raise ValueError("thresholds must have 2k + 1 entries")
    removed: dict[int, int] = {}
    removed_rows: dict[int, np.ndarray] = {}
    sizes: dict[int, int] = {}
    gram_k1 = None
    singular_level = None
    complete = False
    passes_before = getattr(backend, "passes", 0)
    passes = 1
    gram = backend.gram(np.zeros(0, dtype=np.int64))
    ell = 2 * k
    while True:
        factor = factor_or_none(gram / m)
        if factor is None:
            singular_level = ell  # every active row is an outlier at this level
            break
        exclude = np.array(sorted(removed), dtype=np.int64)
        scan = backend.mahalanobis_scan(factor, exclude, thr[: ell + 1], k + 1)
        passes += 1
        active = m - len(removed)
        while ell >= 0 and scan.max_score <= thr[ell]:
            sizes[ell] = active
            if ell == k + 1:
                gram_k1 = gram
            ell -= 1
        if ell < 0:
            complete = True
            break
        out = int(scan.counts_above[ell])
        if len(removed) + out >= k:
            break  # early stop: every unsettled S_l has at most m - k rows
        sel = scan.top_scores > thr[ell]
        if int(sel.sum()) != out:  # pragma: no cover - backend contract
            raise RuntimeError("backend scan returned inconsistent counts")
        for pos, row in zip(scan.top_positions[sel], scan.top_rows[sel]):
            removed[int(pos)] = ell
            removed_rows[int(pos)] = row
        gram = scan.gram_below(ell)
    score = capped_score(sizes, m, k)
    sigma_hat = None
    if score < k:
        # Sigma_hat = (1/m) [G(S_{k+1}) + sum over rows entering at k+2..2k of (c_i/k) y y^T]
        acc = gram_k1.copy()  # type: ignore[union-attr]  # set when score < k
        for pos, ell_r in removed.items():
            c = int(weight_count(ell_r + 1, k))
            if 0 < c < k:
                y = removed_rows[pos]
                acc += (c / k) * np.outer(y, y)
        sigma_hat = acc / m
    if hasattr(backend, "passes"):
        passes = backend.passes - passes_before
    return StableCovarianceResult(m, k, score, sigma_hat, removed, singular_level, sizes, complete, passes, removed_rows)


@dataclass
class StableMeanResult:
    """Output of :func:`stable_mean`. Non-private; never log or release it."""

    n: int
    k: int
    score: int
    mu_hat: np.ndarray | None
    level_counts: np.ndarray  # rows per entry level 0..2k+1
    passes: int


def stable_mean(
    backend: CovarianceBackend, sigma_hat: np.ndarray, Lambda: tuple[float, ...], k: int, M: int
) -> StableMeanResult:
    """StableMean(x, Sigma_hat, lambda0, k, R) on the backend's mean rows (BHS23 Algorithm "4").

    Parameters
    ----------
    backend : CovarianceBackend
        Mean rows x (n, d) in random order; R = ``backend.reference_positions(M)``.
    sigma_hat : ndarray (d, d)
        From :func:`stable_covariance`.
    Lambda : tuple of 2k + 1 floats
        ``Lambda_l = lambda0 (1 - gamma)^(-l)``, ascending.
    k, M : int
        ``M > 6k`` reference rows.

    Returns
    -------
    StableMeanResult
        ``S_l = {i : |N_i(2 Lambda_l)| >= M - l}`` (largest cores), ``score = min(k, min_{l<=k}
        (n - |S_l| + l))``, ``mu_hat = sum_i c_i x_i / Z`` (weights sum to 1), None if Z = 0.

    Privacy
    -------
    None by itself; the score is 2-sensitive for fixed R under gamma-close covariances
    (Lemma 42) and the weights are stable (Lemma 39).

    References
    ----------
    BHS23 Algorithm "4" (L1030), LargestCore (L1045), Def. 35, Lemmas 38-42.
    """
    n = backend.n
    if M <= 6 * k:
        raise ValueError("StableMean needs M > 6k reference rows")
    passes_before = getattr(backend, "passes", 0)
    positions = backend.reference_positions(M)
    ref = backend.fetch_rows(positions)
    shift = ref[0].copy()
    factor = factor_or_none(sigma_hat)
    if factor is None:
        counts = np.zeros(2 * k + 2, dtype=np.int64)
        counts[-1] = n
        sums = np.zeros((2 * k + 1, ref.shape[1]))
        passes = 0
    else:
        cs = backend.core_scan(factor, shift, ref, Lambda, k)
        counts, sums = cs.counts, cs.sums
        passes = 1
    cum = np.cumsum(counts)
    score = capped_score({ell: int(cum[ell]) for ell in range(k + 1)}, n, k)
    c = weight_count(np.arange(2 * k + 1), k)
    z = float(np.dot(c, counts[: 2 * k + 1]))
    mu_hat = None if z == 0.0 else shift + (c[:, None] * sums).sum(axis=0) / z
    if hasattr(backend, "passes"):
        passes = backend.passes - passes_before
    return StableMeanResult(n, k, score, mu_hat, counts, passes)
