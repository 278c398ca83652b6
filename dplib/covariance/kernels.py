"""Partition-independent arithmetic shared by every BHS23 backend (numpy and Spark).

The Spark backend must reproduce the numpy backend's subsets, weights and scores *exactly*
(an inconsistent driver-side vs executor-side score computation would break it). Two things
normally make results depend on how rows are split into batches or partitions:

1. **Sums** (Gram matrices, per-level vector sums): float addition is not associative, so a
   tree aggregation and a numpy ``y.T @ y`` give different last bits. :class:`ExactSum` sums
   float64 values *exactly* (an integer superaccumulator, one bin per binary exponent) and
   rounds once at the end (correctly rounded, round-half-even). The result is the correctly
   rounded exact sum of the same multiset of float64 terms, whatever the order, batching or
   partitioning. The terms themselves (products ``y_a * y_b``, differences ``x - shift``)
   are single elementwise IEEE operations, so they are identical everywhere.
2. **Per-row values** (Mahalanobis scores, whitened distances): BLAS kernels (``trsm``,
   ``gemm``) may round a row differently depending on its position in a block. The kernels
   here use only elementwise numpy ufuncs (``+ - * /``, each correctly rounded, no fused
   multiply-add) in a fixed order, so a row's value depends on the row alone.
   :func:`core_levels` uses one GEMM as a *certified filter*: a row whose largest GEMM distance
   is below ``2 Lambda_0`` by more than a rigorous rounding-error bound has entry level 0 under
   the elementwise distances too; every other row is recomputed elementwise.

Nothing here is private or released; it is the arithmetic of the non-private building blocks.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

_MANT_BITS = 53
_LO_BITS = 26
_LO_MASK = (1 << _LO_BITS) - 1
#: Relative slack of the GEMM filter in :func:`core_levels`. The difference between the
#: expansion ``|t|^2 - 2 t.r + |r|^2`` (any summation order) and the elementwise
#: ``sum_l (t_l - r_l)^2`` is at most ``(4d + 8) u (|t|^2 + |r|^2 + |D|)`` with
#: ``u = 2^-53``; 1e-10 covers it for d up to about 2e5.
FILTER_SLACK = 1e-10


class ExactSum:
    """Exact sum of float64 vectors of length ``E`` (order-independent; mergeable).

    Each term ``v = f 2^e`` (``np.frexp``) is the integer ``f 2^53`` times ``2^(e-53)``; the
    integer is split into a high and a low part (27 and 26 bits) and summed per exponent in
    int64 (exact for up to 2^36 terms per bin). :meth:`value` combines the bins as Python
    integers and rounds once.
    """

    __slots__ = ("size", "bins")

    def __init__(self, size: int) -> None:
        self.size = int(size)
        self.bins: dict[int, np.ndarray] = {}  # exponent -> (2, E) int64 (hi, lo)

    def add(self, values: np.ndarray) -> "ExactSum":
        """Add the rows of ``values`` (shape ``(b, E)``, float64, finite)."""
        v = np.asarray(values, dtype=np.float64).reshape(-1, self.size)
        if v.shape[0] == 0:
            return self
        f, e = np.frexp(v)
        mant = (f * float(1 << _MANT_BITS)).astype(np.int64)
        lo = (mant & _LO_MASK).astype(np.float64)
        hi = (mant >> _LO_BITS).astype(np.float64)
        emin = int(e.min())
        span = int(e.max()) - emin + 1
        key = (e - emin) * self.size + np.arange(self.size)[None, :]
        key = key.ravel()
        # float64 bincount of integers below 2^43 per batch of <= 2^16 rows is exact
        for start in range(0, key.size, self.size << 16):
            sl = slice(start, start + (self.size << 16))
            h = np.bincount(key[sl], weights=hi.ravel()[sl], minlength=span * self.size).reshape(span, self.size)
            lw = np.bincount(key[sl], weights=lo.ravel()[sl], minlength=span * self.size).reshape(span, self.size)
            for j in np.flatnonzero(np.any(h != 0, axis=1) | np.any(lw != 0, axis=1)):
                acc = self.bins.get(emin + int(j))
                part = np.stack([h[j], lw[j]]).astype(np.int64)
                self.bins[emin + int(j)] = part if acc is None else acc + part
        return self

    def merge(self, other: "ExactSum") -> "ExactSum":
        """Add another accumulator of the same size into this one (in place; returns self)."""
        if other.size != self.size:
            raise ValueError("ExactSum sizes differ")
        for ex, part in other.bins.items():
            acc = self.bins.get(ex)
            self.bins[ex] = part.copy() if acc is None else acc + part
        return self

    def value(self) -> np.ndarray:
        """The correctly rounded exact sums, shape ``(E,)``."""
        out = np.zeros(self.size)
        if not self.bins:
            return out
        emin = min(self.bins)
        totals = [0] * self.size
        for ex, part in self.bins.items():
            sh = ex - emin
            for i in range(self.size):
                h, lo = int(part[0, i]), int(part[1, i])
                if h or lo:
                    totals[i] += ((h << _LO_BITS) + lo) << sh
        scale = emin - _MANT_BITS
        for i, t in enumerate(totals):
            out[i] = float(t << scale) if scale >= 0 else t / (1 << -scale)
        return out


def gram_terms(y: np.ndarray) -> np.ndarray:
    """Products ``y_a y_b`` of the upper triangle (a <= b), shape ``(b, d(d+1)/2)``."""
    iu, ju = np.triu_indices(y.shape[1])
    return y[:, iu] * y[:, ju]


def gram_from_sum(acc: ExactSum, d: int) -> np.ndarray:
    """The symmetric ``(d, d)`` Gram matrix from an :class:`ExactSum` of :func:`gram_terms`."""
    iu, ju = np.triu_indices(d)
    g = np.zeros((d, d))
    v = acc.value()
    g[iu, ju] = v
    g[ju, iu] = v
    return g


def exact_gram(y: np.ndarray, batch: int = 65536) -> ExactSum:
    """:class:`ExactSum` of the Gram terms of the rows of ``y`` (shape ``(b, d)``)."""
    d = y.shape[1]
    acc = ExactSum(d * (d + 1) // 2)
    for start in range(0, y.shape[0], batch):
        acc.add(gram_terms(y[start : start + batch]))
    return acc


def whiten_rows(factor: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``factor^{-1} r`` for every row ``r`` (forward substitution, elementwise ufuncs only).

    Parameters
    ----------
    factor : ndarray (d, d), lower triangular, positive diagonal
    rows : ndarray (b, d)

    Returns
    -------
    ndarray (b, d); row i depends only on row i (no BLAS blocking).
    """
    L = np.asarray(factor, dtype=np.float64)
    r = np.asarray(rows, dtype=np.float64)
    b, d = r.shape
    t = np.empty((d, b))
    tmp = np.empty(b)
    for j in range(d):
        acc = r[:, j].copy()
        for ell in range(j):
            np.multiply(t[ell], L[j, ell], out=tmp)
            acc -= tmp
        np.divide(acc, L[j, j], out=t[j])
    return t.T


def row_sq_norms(t: np.ndarray) -> np.ndarray:
    """``sum_j t_ij^2`` accumulated in column order, shape ``(b,)``."""
    s = t[:, 0] * t[:, 0]
    for j in range(1, t.shape[1]):
        s += t[:, j] * t[:, j]
    return s


def sq_distances(t: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """``D_ij = sum_l (t_il - ref_jl)^2`` accumulated in coordinate order, shape ``(b, M)``."""
    b, M = t.shape[0], ref.shape[0]
    dist = np.zeros((b, M))
    diff = np.empty((b, M))
    for ell in range(t.shape[1]):
        np.subtract.outer(t[:, ell], ref[:, ell], out=diff)
        np.multiply(diff, diff, out=diff)
        dist += diff
    return dist


def entry_levels(dist: np.ndarray, Lambda: Sequence[float], k: int) -> np.ndarray:
    """Entry level ``e_i = min{l <= 2k : D_(M-l) <= 2 Lambda_l}`` (``2k + 1`` if none) of each
    row of a distance block ``(b, M)``, ``D_(r)`` the r-th smallest entry of the row."""
    b, M = dist.shape
    lam2 = 2.0 * np.asarray(Lambda, dtype=np.float64)
    e = np.zeros(b, dtype=np.int64)
    bad = np.flatnonzero((dist > lam2[0]).any(axis=1))
    if bad.size:
        top = np.sort(np.partition(dist[bad], M - 2 * k - 1, axis=1)[:, M - 2 * k - 1 :], axis=1)
        # top[:, j] is the (M - 2k + j)-th smallest distance; level l needs D_(M-l) <= 2 Lambda_l
        cond = top[:, ::-1] <= lam2[None, :]
        e[bad] = np.where(cond.any(axis=1), cond.argmax(axis=1), 2 * k + 1)
    return e


def core_levels(t: np.ndarray, ref: np.ndarray, Lambda: Sequence[float], k: int) -> np.ndarray:
    """Entry levels (see :func:`entry_levels`) of whitened rows ``t`` (b, d) against whitened
    reference rows ``ref`` (M, d), as if every distance were computed by :func:`sq_distances`.

    A GEMM distance filters the rows certainly at level 0 (all distances below ``2 Lambda_0``
    with a margin larger than :data:`FILTER_SLACK` times their magnitude); the others are
    recomputed elementwise. Row i's level depends on row i and ``ref`` alone.
    """
    sq_t = row_sq_norms(t)
    sq_r = row_sq_norms(ref)
    approx = t @ ref.T
    approx *= -2.0
    approx += sq_t[:, None]
    approx += sq_r[None, :]
    hi = approx.max(axis=1)
    mag = np.maximum(np.abs(hi), np.abs(approx.min(axis=1)))
    slack = FILTER_SLACK * (sq_t + sq_r.max() + mag)
    e = np.zeros(t.shape[0], dtype=np.int64)
    unsure = np.flatnonzero(~(hi + slack < 2.0 * float(Lambda[0])))
    if unsure.size:
        e[unsure] = entry_levels(sq_distances(t[unsure], ref), Lambda, k)
    return e
