"""The seam between the BHS23 estimators and the data (spec §5.2).

The estimators in :mod:`dplib.covariance.stable` never hold the n rows. They ask a backend for
exact aggregates over two row sets that the backend fixed once, in the keyed random order of
:mod:`dplib.covariance.order`:

- *covariance rows* ``y`` (shape ``(m, d)``): the pairs ``(x_{2i} - x_{2i+1})/sqrt(2)`` for
  Algorithm 1, or the given mean-zero rows for Algorithm 5.1;
- *mean rows* ``x`` (shape ``(n, d)``): the ordered raw rows (Algorithm 1's StableMean).

Calls (positions index the ordered rows; ``exclude`` is a sorted int array of removed positions):

``gram(exclude)``
    ``sum_{i not in exclude} y_i y_i^T``, ``(d, d)``.
``mahalanobis_scan(factor, exclude, thresholds, top_t)``
    With ``s_i = ||factor^{-1} y_i||^2`` for the active rows and ``b_i = #{l : thresholds[l] < s_i}``
    (thresholds ascending): ``counts_above[l] = #{i : s_i > thresholds[l]}``, the Gram matrix of
    each non-empty bucket ``b``, and the ``top_t`` active rows of largest ``s`` (ties: smaller
    position first) with their positions, scores and ``y`` rows. Driver memory
    O(#buckets d^2 + top_t d).
``fetch_rows(positions)``
    The mean rows at these positions, ``(len, d)`` (the M reference rows).
``core_scan(factor, shift, ref_rows, Lambda, k)``
    For every mean row, with ``t = factor^{-1}(x - shift)`` and the whitened reference rows, its
    entry level ``e_i = min{l <= 2k : #{j : D_ij > 2 Lambda_l} <= l}`` (``2k + 1`` if none), where
    ``D_ij = ||t_i - t_{R_j}||^2``; returns the count of rows per entry level (``2k + 2``) and the
    sum of ``x_i - shift`` per entry level ``0..2k`` (``(2k + 1, d)``).
``reference_positions(M)``
    The salted reference set (positions), see :func:`dplib.covariance.order.reference_positions`.

:class:`NumpyCovarianceBackend` answers from arrays in memory; it is the oracle of the Spark
backend. Nothing a backend returns is released: it stays inside the estimator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np
from scipy.linalg import solve_triangular

from dplib.covariance.order import pair, random_order, reference_positions
from dplib.errors import InputDataError

#: Person vectors are clamped to [-VALUE_BOUND, VALUE_BOUND] per coordinate (a per-person map,
#: so privacy is unchanged) so that Gram sums of up to ~1e9 rows stay finite in float64.
VALUE_BOUND = 1e100
#: Rows per batch of the numpy scans.
SCAN_BATCH = 65536
CORE_BATCH = 4096


@dataclass(frozen=True)
class ScanResult:
    counts_above: np.ndarray  # (L,) int64
    bucket_grams: dict[int, np.ndarray]  # bucket b in 0..L -> (d, d)
    top_positions: np.ndarray  # (T,) int64
    top_scores: np.ndarray  # (T,)
    top_rows: np.ndarray  # (T, d)

    @property
    def max_score(self) -> float:
        return float(self.top_scores[0]) if self.top_scores.size else -np.inf

    def gram_below(self, level: int) -> np.ndarray:
        """Gram of the active rows with ``s <= thresholds[level]`` (buckets 0..level)."""
        d = self.top_rows.shape[1]
        g = np.zeros((d, d))
        for b in sorted(self.bucket_grams):
            if b <= level:
                g = g + self.bucket_grams[b]
        return g


@dataclass(frozen=True)
class CoreScan:
    counts: np.ndarray  # (2k + 2,) int64, rows per entry level 0..2k+1
    sums: np.ndarray  # (2k + 1, d), sum of (x_i - shift) per entry level 0..2k


class CovarianceBackend(Protocol):
    """Exact aggregates for BHS23 (see the module docstring). Attributes ``n``, ``m``, ``d``."""

    n: int
    m: int
    d: int

    def gram(self, exclude: np.ndarray) -> np.ndarray: ...

    def mahalanobis_scan(
        self, factor: np.ndarray, exclude: np.ndarray, thresholds: Sequence[float], top_t: int
    ) -> ScanResult: ...

    def fetch_rows(self, positions: np.ndarray) -> np.ndarray: ...

    def core_scan(
        self, factor: np.ndarray, shift: np.ndarray, ref_rows: np.ndarray, Lambda: Sequence[float], k: int
    ) -> CoreScan: ...

    def reference_positions(self, M: int) -> np.ndarray: ...


def check_rows(x: object, name: str = "x") -> np.ndarray:
    """Validate person vectors: a finite float 2-D array ``(n, d)``; clamp to +-VALUE_BOUND.

    Raises
    ------
    InputDataError
        Not 2-D numeric, empty, or any NaN/inf (before any budget is spent).
    """
    try:
        arr = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InputDataError(f"{name} must be a numeric array of shape (n, d)") from exc
    if arr.ndim != 2 or arr.shape[0] == 0 or arr.shape[1] == 0:
        raise InputDataError(f"{name} must have shape (n, d) with n, d >= 1, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise InputDataError(f"{name} contains NaN or infinite values; every person vector must be finite")
    return np.clip(arr, -VALUE_BOUND, VALUE_BOUND)


def whiten(factor: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``rows @ factor^{-T}``: each row solved against the lower-triangular factor."""
    return solve_triangular(factor, rows.T, lower=True, check_finite=False).T


def entry_levels(dist: np.ndarray, Lambda: Sequence[float], k: int) -> np.ndarray:
    """Entry level of each row of a distance block ``(b, M)`` (see ``core_scan``)."""
    b, M = dist.shape
    lam2 = 2.0 * np.asarray(Lambda, dtype=np.float64)
    e = np.zeros(b, dtype=np.int64)
    bad = np.flatnonzero((dist > lam2[0]).any(axis=1))
    if bad.size:
        top = np.sort(np.partition(dist[bad], M - 2 * k - 1, axis=1)[:, M - 2 * k - 1 :], axis=1)
        # top[:, j] is the (M - 2k + j)-th smallest distance; level l needs D_(M-l) <= 2 Lambda_l
        cond = top[:, ::-1] <= lam2[None, :]
        first = np.where(cond.any(axis=1), cond.argmax(axis=1), 2 * k + 1)
        e[bad] = first
    return e


class NumpyCovarianceBackend:
    """In-memory backend; the oracle for the Spark backend.

    Parameters
    ----------
    cov_rows : ndarray (m, d)
        Covariance rows in random order (pairs, or mean-zero rows for Algorithm 5.1).
    mean_rows : ndarray (n, d), optional
        Raw rows in the same random order (Algorithm 1); without them ``core_scan`` and
        ``fetch_rows`` are unavailable.
    salt_hex : str, optional
        The run's salt (for ``reference_positions``).

    Use :meth:`from_data` to build one from unordered person vectors.
    """

    def __init__(self, cov_rows: np.ndarray, mean_rows: np.ndarray | None = None, salt_hex: str | None = None):
        self._y = np.ascontiguousarray(cov_rows, dtype=np.float64)
        self._x = None if mean_rows is None else np.ascontiguousarray(mean_rows, dtype=np.float64)
        self._salt = salt_hex
        self.m, self.d = self._y.shape
        self.n = self._x.shape[0] if self._x is not None else self.m
        self.passes = 0

    @classmethod
    def from_data(cls, x: object, salt_hex: str, ids: Sequence[object] | None = None, paired: bool = True):
        """Validate, put in keyed random order and (``paired=True``, Algorithm 1/5.2) pair the rows.

        ``paired=False`` (Algorithm 5.1 on given mean-zero rows): covariance rows are the rows.

        Raises
        ------
        InputDataError
            Non-finite or malformed rows.
        """
        arr = check_rows(x)
        order = random_order(arr.shape[0], salt_hex, ids)
        xo = arr[order]
        if paired:
            return cls(pair(xo), xo, salt_hex)
        return cls(xo, None, salt_hex)

    def _active(self, exclude: np.ndarray) -> np.ndarray:
        mask = np.ones(self.m, dtype=bool)
        mask[np.asarray(exclude, dtype=np.int64)] = False
        return mask

    def gram(self, exclude: np.ndarray) -> np.ndarray:
        self.passes += 1
        y = self._y[self._active(exclude)]
        return y.T @ y

    def mahalanobis_scan(self, factor, exclude, thresholds, top_t) -> ScanResult:
        self.passes += 1
        thr = np.asarray(thresholds, dtype=np.float64)
        pos = np.flatnonzero(self._active(exclude))
        scores = np.empty(pos.size)
        for start in range(0, pos.size, SCAN_BATCH):
            blk = pos[start : start + SCAN_BATCH]
            t = whiten(factor, self._y[blk])
            scores[start : start + SCAN_BATCH] = np.einsum("ij,ij->i", t, t)
        buckets = np.searchsorted(thr, scores, side="left")
        counts_above = np.array([(buckets > ell).sum() for ell in range(thr.size)], dtype=np.int64)
        grams = {}
        for b in np.unique(buckets):
            y = self._y[pos[buckets == b]]
            grams[int(b)] = y.T @ y
        t_eff = min(top_t, pos.size)
        if t_eff:
            cand = np.argpartition(-scores, t_eff - 1)[:t_eff] if t_eff < pos.size else np.arange(pos.size)
            # include every row tied with the T-th score so the tie rule (smaller position) is exact
            cut = scores[cand].min()
            cand = np.flatnonzero(scores >= cut)
            order = np.lexsort((pos[cand], -scores[cand]))[:t_eff]
            cand = cand[order]
        else:
            cand = np.zeros(0, dtype=np.int64)
        return ScanResult(counts_above, grams, pos[cand], scores[cand], self._y[pos[cand]])

    def fetch_rows(self, positions: np.ndarray) -> np.ndarray:
        if self._x is None:
            raise InputDataError("this backend holds no mean rows (Algorithm 5.1 backend)")
        return self._x[np.asarray(positions, dtype=np.int64)].copy()

    def core_scan(self, factor, shift, ref_rows, Lambda, k) -> CoreScan:
        if self._x is None:
            raise InputDataError("this backend holds no mean rows (Algorithm 5.1 backend)")
        self.passes += 1
        tr = whiten(factor, ref_rows - shift)
        tr_sq = np.einsum("ij,ij->i", tr, tr)
        counts = np.zeros(2 * k + 2, dtype=np.int64)
        sums = np.zeros((2 * k + 1, self.d))
        xc_all = self._x - shift
        t_all = whiten(factor, xc_all)
        sq_all = np.einsum("ij,ij->i", t_all, t_all)
        for start in range(0, self.n, CORE_BATCH):
            stop = min(start + CORE_BATCH, self.n)
            dist = t_all[start:stop] @ tr.T
            dist *= -2.0
            dist += sq_all[start:stop, None]
            dist += tr_sq[None, :]
            e = entry_levels(dist, Lambda, k)
            counts += np.bincount(e, minlength=2 * k + 2)
            for level in np.unique(e):
                if level <= 2 * k:
                    sums[level] += xc_all[start:stop][e == level].sum(axis=0)
        return CoreScan(counts, sums)

    def reference_positions(self, M: int) -> np.ndarray:
        return reference_positions(self.n, M, self._salt)
