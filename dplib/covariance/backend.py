"""The seam between the BHS23 estimators and the data (docs/privacy/stable_covariance.md, "Spark backend").

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
from typing import Sequence

import numpy as np

from dplib.covariance.kernels import (
    ExactSum,
    core_levels,
    exact_gram,
    gram_from_sum,
    gram_terms,
    row_sq_norms,
    whiten_rows,
)
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
    """One Mahalanobis scan of the active pair rows (StableCovariance): ``counts_above``
    (L,) rows with score above each threshold; ``bucket_grams`` the Gram (d, d) of the rows per score
    bucket; the top-T rows by score (positions (T,), scores (T,), rows (T, d)). Exact aggregates of
    the data: never released, never logged (the algorithm's private output is derived from them)."""

    counts_above: np.ndarray  # (L,) int64
    bucket_grams: dict[int, np.ndarray]  # bucket b in 0..L -> (d, d)
    top_positions: np.ndarray  # (T,) int64
    top_scores: np.ndarray  # (T,)
    top_rows: np.ndarray  # (T, d)
    bucket_sums: dict[int, ExactSum] | None = None  # exact accumulators behind bucket_grams

    @property
    def max_score(self) -> float:
        return float(self.top_scores[0]) if self.top_scores.size else -np.inf

    def gram_below(self, level: int) -> np.ndarray:
        """Gram of the active rows with ``s <= thresholds[level]`` (buckets 0..level); the exact
        sum of their products when the backend kept its accumulators (both backends do)."""
        d = self.top_rows.shape[1]
        if self.bucket_sums is not None:
            acc = ExactSum(d * (d + 1) // 2)
            for b in sorted(self.bucket_sums):
                if b <= level:
                    acc.merge(self.bucket_sums[b])
            return gram_from_sum(acc, d)
        g = np.zeros((d, d))
        for b in sorted(self.bucket_grams):
            if b <= level:
                g = g + self.bucket_grams[b]
        return g


@dataclass(frozen=True)
class CoreScan:
    """One StableMean core pass (its fast form): rows per entry level and the per-level sums
    of (x_i - shift), shapes (2k+2,) and (2k+1, d). Exact aggregates; never released or logged."""

    counts: np.ndarray  # (2k + 2,) int64, rows per entry level 0..2k+1
    sums: np.ndarray  # (2k + 1, d), sum of (x_i - shift) per entry level 0..2k


@dataclass
class ScanPartial:
    """Mergeable part of a Mahalanobis scan (one batch or partition); see :func:`scan_block`."""

    counts: np.ndarray  # (L + 1,) rows per bucket
    sums: dict[int, ExactSum]  # bucket -> exact Gram terms
    top_positions: np.ndarray
    top_scores: np.ndarray
    top_rows: np.ndarray


def _top(pos: np.ndarray, scores: np.ndarray, rows: np.ndarray, top_t: int):
    """The ``top_t`` entries of largest score, ties by smaller position (a total order)."""
    order = np.lexsort((pos, -scores))[:top_t]
    return pos[order], scores[order], rows[order]


def scan_block(factor: np.ndarray, y: np.ndarray, pos: np.ndarray, thresholds: np.ndarray, top_t: int) -> ScanPartial:
    """Scores ``s_i = ||factor^{-1} y_i||^2`` of active rows ``y`` (b, d) at positions ``pos``,
    bucketed by ``b_i = #{l : thresholds[l] < s_i}``: counts, exact Gram terms per bucket, top rows."""
    thr = np.asarray(thresholds, dtype=np.float64)
    d = y.shape[1]
    counts = np.zeros(thr.size + 1, dtype=np.int64)
    sums: dict[int, ExactSum] = {}
    if y.shape[0] == 0:
        return ScanPartial(counts, sums, np.zeros(0, dtype=np.int64), np.zeros(0), np.zeros((0, d)))
    scores = row_sq_norms(whiten_rows(factor, y))
    buckets = np.searchsorted(thr, scores, side="left")
    counts += np.bincount(buckets, minlength=thr.size + 1)
    terms = gram_terms(y)
    for b in np.unique(buckets):
        sums[int(b)] = ExactSum(terms.shape[1]).add(terms[buckets == b])
    return ScanPartial(counts, sums, *_top(np.asarray(pos, dtype=np.int64), scores, y, top_t))


def merge_scan(a: ScanPartial, b: ScanPartial, top_t: int) -> ScanPartial:
    """Combine two partial scans (associative and commutative up to identical results)."""
    sums = {key: ExactSum(v.size).merge(v) for key, v in a.sums.items()}
    for key, v in b.sums.items():
        if key in sums:
            sums[key].merge(v)
        else:
            sums[key] = ExactSum(v.size).merge(v)
    top = _top(
        np.concatenate([a.top_positions, b.top_positions]),
        np.concatenate([a.top_scores, b.top_scores]),
        np.concatenate([a.top_rows, b.top_rows]),
        top_t,
    )
    return ScanPartial(a.counts + b.counts, sums, *top)


def finish_scan(p: ScanPartial, d: int) -> ScanResult:
    """The :class:`ScanResult` of a merged scan."""
    counts_above = np.cumsum(p.counts[::-1])[::-1][1:].astype(np.int64)  # #{b > l}
    grams = {b: gram_from_sum(acc, d) for b, acc in p.sums.items()}
    return ScanResult(counts_above, grams, p.top_positions, p.top_scores, p.top_rows.reshape(-1, d), p.sums)


@dataclass
class CorePartial:
    """Mergeable part of a core scan: rows per entry level and exact sums of ``x - shift``."""

    counts: np.ndarray  # (2k + 2,)
    sums: dict[int, ExactSum]  # level 0..2k -> (d,)


def core_block(factor, shift, ref_white, x: np.ndarray, Lambda, k: int) -> CorePartial:
    """Entry levels of mean rows ``x`` (b, d) against the whitened reference rows ``ref_white``."""
    counts = np.zeros(2 * k + 2, dtype=np.int64)
    sums: dict[int, ExactSum] = {}
    if x.shape[0] == 0:
        return CorePartial(counts, sums)
    xc = x - shift
    e = core_levels(whiten_rows(factor, xc), ref_white, Lambda, k)
    counts += np.bincount(e, minlength=2 * k + 2)
    for level in np.unique(e):
        if level <= 2 * k:
            sums[int(level)] = ExactSum(x.shape[1]).add(xc[e == level])
    return CorePartial(counts, sums)


def merge_core(a: CorePartial, b: CorePartial) -> CorePartial:
    """Merge two partitions' core partials exactly (order-independent: integer accumulators)."""
    sums = {key: ExactSum(v.size).merge(v) for key, v in a.sums.items()}
    for key, v in b.sums.items():
        if key in sums:
            sums[key].merge(v)
        else:
            sums[key] = ExactSum(v.size).merge(v)
    return CorePartial(a.counts + b.counts, sums)


def finish_core(p: CorePartial, k: int, d: int) -> CoreScan:
    """Round the merged exact sums once into a :class:`CoreScan` (sums shape (2k+1, d))."""
    sums = np.zeros((2 * k + 1, d))
    for level, acc in p.sums.items():
        sums[level] = acc.value()
    return CoreScan(p.counts, sums)


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
    """``rows @ factor^{-T}`` (each row solved against the lower-triangular factor); see
    :func:`dplib.covariance.kernels.whiten_rows` (row-wise deterministic)."""
    return whiten_rows(factor, rows)


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
        return gram_from_sum(exact_gram(self._y[self._active(exclude)]), self.d)

    def mahalanobis_scan(self, factor, exclude, thresholds, top_t) -> ScanResult:
        self.passes += 1
        thr = np.asarray(thresholds, dtype=np.float64)
        pos = np.flatnonzero(self._active(exclude))
        part = scan_block(factor, self._y[pos[:0]], pos[:0], thr, top_t)
        for start in range(0, pos.size, SCAN_BATCH):
            blk = pos[start : start + SCAN_BATCH]
            part = merge_scan(part, scan_block(factor, self._y[blk], blk, thr, top_t), top_t)
        return finish_scan(part, self.d)

    def fetch_rows(self, positions: np.ndarray) -> np.ndarray:
        if self._x is None:
            raise InputDataError("this backend holds no mean rows (Algorithm 5.1 backend)")
        return self._x[np.asarray(positions, dtype=np.int64)].copy()

    def core_scan(self, factor, shift, ref_rows, Lambda, k) -> CoreScan:
        if self._x is None:
            raise InputDataError("this backend holds no mean rows (Algorithm 5.1 backend)")
        self.passes += 1
        tr = whiten_rows(factor, ref_rows - shift)
        part = core_block(factor, shift, tr, self._x[:0], Lambda, k)
        for start in range(0, self.n, CORE_BATCH):
            part = merge_core(part, core_block(factor, shift, tr, self._x[start : start + CORE_BATCH], Lambda, k))
        return finish_core(part, k, self.d)

    def reference_positions(self, M: int) -> np.ndarray:
        return reference_positions(self.n, M, self._salt)  # type: ignore[arg-type]  # a None salt is refused there
