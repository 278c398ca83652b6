"""Robust building blocks for discrete distributions from batches (trusted analysis only).

Kamath, Majid, Moitra, Mouzakis, Ullman: the constraint system of Algorithm 3.1 (Section 3.1), the
diagonal majorizer and its SDP dual (Corollary 2.16), the subset-variance bound (Lemma 3.7) and the
heterogeneity allowance (Corollary 3.11); the majorizer check on weighted sets and the
subset-direction soft filter are ours (docs/privacy/distribution.md, "Robust building blocks").

**Nothing here is differentially private.** The filter's estimate, its kept weights, the
certificate value and the discard fraction are functions of the exact data. They are library
functions for trusted, in-house analysis (and building blocks of later estimators); the job never
releases them, and no job statistic calls them (docs/privacy/distribution.md, "Robust building blocks").

Notation (the paper's): a batch is a count vector ``c`` of ``k`` integers summing to ``m``; its
distribution ``y = c / m`` lies on the simplex. ``Sigma(nu) = (diag(nu) - nu nu^T) / m`` is the
covariance of one clean batch average when the truth is ``nu`` (on ``y``, not on counts).
For weights ``W_g >= 0`` on points ``y_g``: ``mu_w = sum W_g y_g / sum W_g``,
``C_w = sum W_g (y_g - mu_w)(y_g - mu_w)^T / sum W_g`` and the covariance gap
``Delta_w = C_w - Sigma(mu_w)``; ``Delta_w 1 = 0`` because every ``y_g`` sums to 1.

Units: every threshold and certificate value of this module is in **subset
units**, ``max_{s in {0,1}^k} s^T Delta s``: the largest excess, over the multinomial variance
``V(mu_w, s)``, of the variance of the fraction of a batch in a subset. The majorizer trace
(``min sum(lambda)`` with ``Diag(lambda) >= Delta``) is in **trace units**, about 4x
larger (Lemma 2.11: ``sigma^T Delta sigma = 4 s^T Delta s`` for ``sigma = 2s - 1`` when
``Delta 1 = 0``); :func:`min_trace_majorizer` returns it, labelled as such.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final, Literal, Mapping

import numpy as np

from dplib.distribution.batches import check_batch_size
from dplib.distribution.simplex import project_to_simplex
from dplib.errors import DPError, InvalidParameterError

#: Largest k for which :func:`max_subset_quadratic` enumerates all 2^k subsets.
EXACT_MAX_K = 20
#: Subset values evaluated per block of the enumeration (float64: 2 MiB per block).
_BLOCK = 2**18
#: Random hyperplanes of the Goemans-Williamson rounding (k > EXACT_MAX_K).
_ROUNDINGS = 64
#: Filter statuses.
STATUS_OK: Final = "OK"
STATUS_OVERTRIM: Final = "OVERTRIM"


class SolverError(DPError, RuntimeError):
    """The SDP solver returned no usable solution (status named in the message)."""


# ----------------------------------------------------------------------------------------------
# max over subsets of s^T Delta s


@dataclass(frozen=True)
class SubsetMax:
    """Result of :func:`max_subset_quadratic`.

    Attributes
    ----------
    value : float
        Exact ``max_s s^T Delta s`` when ``exact``; otherwise a certified **upper bound** on it
        (the SDP relaxation, made feasible by an eigenvalue shift).
    subset : ndarray (k,) bool
        A maximising subset (``exact``) or the best rounded subset (``not exact``).
    subset_value : float
        ``s^T Delta s`` of ``subset``: equals ``value`` when exact, a lower bound otherwise.
    exact : bool
        True for enumeration (``k <= exact_max_k``), False for the SDP bound.
    """

    value: float
    subset: np.ndarray
    subset_value: float
    exact: bool


def _check_symmetric(delta: np.ndarray, name: str = "delta_matrix") -> np.ndarray:
    d = np.asarray(delta, dtype=np.float64)
    if d.ndim != 2 or d.shape[0] != d.shape[1] or d.shape[0] < 1:
        raise InvalidParameterError(f"{name} must be a square (k, k) matrix, got shape {d.shape}")
    if not np.all(np.isfinite(d)):
        raise InvalidParameterError(f"{name} must be finite")
    scale = max(1.0, float(np.max(np.abs(d))))
    if np.max(np.abs(d - d.T)) > 1e-9 * scale:
        raise InvalidParameterError(f"{name} must be symmetric")
    return (d + d.T) / 2.0


def _bits(b: int) -> np.ndarray:
    """All ``2**b`` subsets of ``b`` items as rows of 0/1 floats; row ``i`` is the binary of i."""
    idx = np.arange(2**b, dtype=np.int64)
    return ((idx[:, None] >> np.arange(b, dtype=np.int64)) & 1).astype(np.float64)


def _enumerate_max(d: np.ndarray) -> tuple[float, np.ndarray]:
    """Exact max of s^T d s over s in {0,1}^k, by blocks (meet in the middle, vectorised).

    Split the coordinates into a low half L and a high half H. For s = (s_L, s_H),
    ``s^T d s = q_L(s_L) + 2 s_H^T d_HL s_L + q_H(s_H)``; the cross terms of a block of high
    halves against all low halves are one matrix product, so the 2^k values are evaluated in
    blocks of ``_BLOCK`` with O(2^k * k/2) flops and O(_BLOCK) memory (a chunked einsum).
    """
    k = d.shape[0]
    k_lo = k // 2
    lo, hi = np.arange(k_lo), np.arange(k_lo, k)
    s_lo, s_hi = _bits(k_lo), _bits(k - k_lo)
    q_lo = np.einsum("ai,ij,aj->a", s_lo, d[np.ix_(lo, lo)], s_lo)
    q_hi = np.einsum("ai,ij,aj->a", s_hi, d[np.ix_(hi, hi)], s_hi)
    cross = s_hi @ d[np.ix_(hi, lo)]  # (2^|H|, |L|)
    rows = max(1, _BLOCK // s_lo.shape[0])
    best, best_idx = -np.inf, (0, 0)
    for start in range(0, s_hi.shape[0], rows):
        block = q_hi[start : start + rows, None] + 2.0 * (cross[start : start + rows] @ s_lo.T) + q_lo[None, :]
        flat = int(np.argmax(block))
        h, l = divmod(flat, block.shape[1])
        if block[h, l] > best:
            best, best_idx = float(block[h, l]), (start + h, l)
    subset = np.concatenate([s_lo[best_idx[1]], s_hi[best_idx[0]]]).astype(bool)
    s = subset.astype(np.float64)
    return float(s @ d @ s), subset


def _elliptope_sdp(mat: np.ndarray) -> tuple[float, np.ndarray]:
    """``min sum(lambda) s.t. Diag(lambda) - mat >= 0`` (= ``max <mat, X>`` over the elliptope,
    Corollary 2.16) through cvxpy. Returns a **certified** upper bound on
    ``max_{x in {+-1}^p} x^T mat x`` and the dual matrix X (for rounding).

    The solver's lambda is made exactly feasible by adding ``max(0, -eig_min)`` (plus a margin for
    the eigenvalue computation's own rounding) to every entry, so the bound does not rely on the
    solver's tolerance: ``x^T mat x <= x^T Diag(lambda) x = sum(lambda)`` for every sign vector.
    """
    import cvxpy as cp  # lazy: a ~2 s import that only the solves need

    p = mat.shape[0]
    lam = cp.Variable(p)
    psd = cp.diag(lam) - mat >> 0
    prob = cp.Problem(cp.Minimize(cp.sum(lam)), [psd])
    solver = "CLARABEL" if "CLARABEL" in cp.installed_solvers() else None
    try:
        prob.solve(solver=solver)
    except cp.error.SolverError as exc:
        raise SolverError(f"majorizer SDP (size {p}) failed in the solver") from exc
    if lam.value is None or prob.status not in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE):
        raise SolverError(f"majorizer SDP (size {p}) returned status {prob.status!r}")
    lam_v = np.asarray(lam.value, dtype=np.float64)
    eig_min = float(np.linalg.eigvalsh(np.diag(lam_v) - mat).min())
    margin = 64.0 * np.finfo(np.float64).eps * p * max(1.0, float(np.abs(mat).max()), float(np.abs(lam_v).max()))
    lam_v = lam_v + max(0.0, -eig_min) + margin
    x_dual = psd.dual_value
    x_mat = np.asarray(x_dual, dtype=np.float64) if x_dual is not None else np.eye(p)
    return float(np.sum(lam_v)), (x_mat + x_mat.T) / 2.0


def _round_hyperplane(d: np.ndarray, x_mat: np.ndarray, rng: np.random.Generator) -> tuple[float, np.ndarray]:
    """Goemans-Williamson rounding of the homogenised elliptope solution X ((k+1) x (k+1)) to a
    subset, then a one-flip local search. Returns ``(s^T d s, s)`` of the best subset found."""
    w, v = np.linalg.eigh(x_mat)
    factor = v * np.sqrt(np.maximum(w, 0.0))[None, :]  # X ~ F F^T
    signs = np.sign(factor @ rng.standard_normal((x_mat.shape[0], _ROUNDINGS)))
    signs[signs == 0] = 1.0
    subsets = (signs[1:, :] == signs[0:1, :]).T.astype(np.float64)  # s_j = [x_j == x_0]
    vals = np.einsum("ai,ij,aj->a", subsets, d, subsets)
    s = subsets[int(np.argmax(vals))].copy()
    best = float(s @ d @ s)
    improved = True
    while improved:  # one-flip ascent: gain of flipping j is (1-2 s_j)(2 (d s)_j + (1-2 s_j) d_jj)
        sign = 1.0 - 2.0 * s
        gain = sign * (2.0 * (d @ s)) + np.diag(d)
        j = int(np.argmax(gain))
        improved = gain[j] > 1e-15 * max(1.0, abs(best))
        if improved:
            s[j] = 1.0 - s[j]
            best = float(s @ d @ s)
    return best, s.astype(bool)


def max_subset_quadratic(
    delta_matrix: np.ndarray, *, exact_max_k: int = EXACT_MAX_K, rng: np.random.Generator | None = None
) -> SubsetMax:
    """``max_{s in {0,1}^k} s^T Delta s`` and a maximising subset.

    Parameters
    ----------
    delta_matrix : ndarray (k, k)
        Symmetric (e.g. a covariance gap ``Delta_w``, subset units).
    exact_max_k : int, default 20
        Enumerate all ``2**k`` subsets when ``k <= exact_max_k`` (exact; vectorised in blocks,
        about 0.05 s at k = 20). Above, solve the SDP relaxation.
    rng : numpy Generator, optional
        Randomness of the hyperplane rounding (SDP path only). Default: a generator seeded with 0,
        so the rounded subset is reproducible; the upper bound does not depend on it.

    Returns
    -------
    SubsetMax
        ``value`` is exact when ``exact``; on the SDP path it is an **upper bound** on the
        maximum (certified: the solver's majorizer is shifted to exact feasibility), ``subset``
        the best hyperplane-rounded subset and ``subset_value`` its value (a lower bound).

    Notes
    -----
    SDP path: with ``s = (1 + x_0 x) / 2`` for ``(x_0, x) in {+-1}^(k+1)``,
    ``s^T Delta s = x~^T M x~ / 4`` with ``M = [[1^T Delta 1, (Delta 1)^T], [Delta 1, Delta]]``,
    so ``max_s s^T Delta s <= SDP(M) / 4`` for **any** symmetric Delta. When ``Delta 1 = 0`` (every
    gap built from simplex points) the first row and column of M vanish and SDP(M) is exactly the
    k x k elliptope SDP (Corollary 2.16), ``min{sum(lambda) : Diag(lambda) >= Delta}`` (the majorizer trace,
    trace units), divided by 4 by Lemma 2.11. The relaxation is loose by a factor between 1 and
    sinh(pi/2) ~ 2.3 (<= 1.17 measured on random instances). The extra coordinate keeps the
    bound valid for inputs that are not exactly centred.

    Raises
    ------
    InvalidParameterError
        ``delta_matrix`` not square, symmetric and finite; ``exact_max_k`` not in [0, 24].
    SolverError
        The SDP solver failed (SDP path only).
    """
    d = _check_symmetric(delta_matrix)
    if isinstance(exact_max_k, bool) or not isinstance(exact_max_k, int) or not 0 <= exact_max_k <= 24:
        raise InvalidParameterError(f"exact_max_k must be an integer in [0, 24], got {exact_max_k!r}")
    k = d.shape[0]
    if k <= exact_max_k:
        value, subset = _enumerate_max(d)
        return SubsetMax(value, subset, value, True)
    ones = np.ones(k)
    col = d @ ones
    mat = np.block([[np.array([[ones @ col]]), col[None, :]], [col[:, None], d]])
    bound, x_mat = _elliptope_sdp(mat)
    sub_val, subset = _round_hyperplane(d, x_mat, rng if rng is not None else np.random.default_rng(0))
    # the empty subset gives 0, so the maximum is >= max(0, sub_val); keep the bound consistent
    return SubsetMax(max(bound / 4.0, sub_val, 0.0), subset, sub_val, False)


def min_trace_majorizer(delta_matrix: np.ndarray) -> float:
    """Certified minimal majorizer trace ``min{sum(lambda) : Diag(lambda) >= Delta}`` (Corollary 2.16),
    in **trace units** (about 4x the subset value; at most 4 sinh(pi/2) x when Delta 1 = 0).

    The value is an upper bound on the exact optimum up to the solver's tolerance only in the
    direction of safety: the solver's lambda is shifted to exact feasibility before summing.

    Raises
    ------
    InvalidParameterError, SolverError
    """
    return _elliptope_sdp(_check_symmetric(delta_matrix))[0]


# ----------------------------------------------------------------------------------------------
# weighted covariance gap and the majorizer check


def sigma_matrix(nu: np.ndarray, m: int) -> np.ndarray:
    """``Sigma(nu) = (diag(nu) - nu nu^T) / m``: covariance of one clean batch average."""
    nu = np.asarray(nu, dtype=np.float64)
    return (np.diag(nu) - np.outer(nu, nu)) / float(m)


def weighted_gap(y: np.ndarray, weight: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """``(mu_w, Delta_w = C_w - Sigma(mu_w))`` for points ``y`` (D, k) and weights (D,).

    ``C_w`` is normalised by the kept mass ``sum(weight)`` (the filter's form; the FRC of
    :mod:`dplib.distribution.frc` normalises by n with a repair point instead)."""
    total = float(np.sum(weight))
    mu = (weight @ y) / total
    z = y - mu[None, :]
    cov = (z * weight[:, None]).T @ z / total
    return mu, cov - sigma_matrix(mu, m)


@dataclass(frozen=True)
class MajorizerCheck:
    """Result of :func:`majorizer_check` (non-private: never released).

    Attributes
    ----------
    certified : bool
        ``value <= threshold``. On the SDP path ``value`` is an upper bound, so certification is
        conservative (never wrongly certified; may fail to certify).
    value : float
        ``max_s s^T Delta_w s`` (subset units): exact, or an upper bound when not ``exact``.
    threshold : float
        The threshold compared against (subset units).
    subset : ndarray (k,) bool
        The maximising (or best rounded) subset: the filter's direction.
    exact : bool
    mean : ndarray (k,)
        ``mu_w``.
    gap : ndarray (k, k)
        ``Delta_w``.
    trace : float or None
        Certified minimal majorizer trace of ``Delta_w`` (trace units) when requested.
    """

    certified: bool
    value: float
    threshold: float
    subset: np.ndarray
    exact: bool
    mean: np.ndarray
    gap: np.ndarray
    trace: float | None = None


def _check_points(y: np.ndarray, weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    y = np.asarray(y, dtype=np.float64)
    w = np.asarray(weight, dtype=np.float64)
    if y.ndim != 2 or y.shape[0] < 1 or y.shape[1] < 2 or not np.all(np.isfinite(y)):
        raise InvalidParameterError(f"y must be a finite (D, k >= 2) array of simplex points, got shape {y.shape}")
    if np.any(y < 0) or np.max(np.abs(y.sum(axis=1) - 1.0)) > 1e-9:
        raise InvalidParameterError("y must hold points of the simplex (non-negative rows summing to 1)")
    if w.shape != (y.shape[0],) or not np.all(np.isfinite(w)) or np.any(w < 0) or not np.sum(w) > 0:
        raise InvalidParameterError(
            f"weight must be {y.shape[0]} finite non-negative numbers with a positive sum, got shape {w.shape}"
        )
    return y, w


def majorizer_check(
    y: np.ndarray,
    weight: np.ndarray,
    m: int,
    threshold: float,
    *,
    exact_max_k: int = EXACT_MAX_K,
    trace: bool = False,
    rng: np.random.Generator | None = None,
) -> MajorizerCheck:
    """Majorizer check of a weighted set of groups: is ``Delta_w`` certified below
    ``threshold`` in every subset direction?

    Parameters
    ----------
    y : ndarray (D, k)
        Group points ``y_g = c_g / m`` on the simplex (one row per distinct count vector).
    weight : ndarray (D,)
        Non-negative weights ``W_g`` (for the filter: kept fraction times multiplicity).
    m : int
        Draws per batch.
    threshold : float
        In subset units (:func:`filter_threshold`).
    exact_max_k : int, default 20
        Enumeration up to this k, SDP upper bound above (:func:`max_subset_quadratic`).
    trace : bool, default False
        Also compute the certified minimal majorizer trace (trace units; one k x k SDP).
    rng : numpy Generator, optional
        Rounding randomness of the SDP path.

    Returns
    -------
    MajorizerCheck

    Notes
    -----
    Certification rule (ours, docs/privacy/distribution.md): put mass ``W_g / n`` at ``y_g`` and the discarded
    mass ``d`` at the repair point ``mu_w``; that measure's covariance is ``(1 - d) C_w <= C_w``
    with the same ``Sigma(mu_w)``, so a majorizer of ``Delta_w`` is a fractional-repair
    certificate of ``mu_w`` with discard ``d``. **Not private**: the result is never released.

    Raises
    ------
    InvalidParameterError
        ``y`` not on the simplex, bad weights, ``m`` or ``threshold``.
    SolverError
        SDP path only.
    """
    y, w = _check_points(y, weight)
    m = check_batch_size(m)
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not math.isfinite(threshold):
        raise InvalidParameterError(f"threshold must be a finite number (subset units), got {threshold!r}")
    mu, gap = weighted_gap(y, w, m)
    best = max_subset_quadratic(gap, exact_max_k=exact_max_k, rng=rng)
    tr = min_trace_majorizer(gap) if trace else None
    return MajorizerCheck(
        certified=bool(best.value <= threshold),
        value=best.value,
        threshold=float(threshold),
        subset=best.subset,
        exact=best.exact,
        mean=mu,
        gap=gap,
        trace=tr,
    )


# ----------------------------------------------------------------------------------------------
# the subset-direction soft filter


def filter_threshold(
    k: int, n: float, m: int, eta: float, omega: float = 0.0, beta: float = 0.05, C_var: float = 2.0, C_het: float = 1.0
) -> float:
    """Stopping threshold of the filter in **subset units**:
    ``C_var eta ln(1/eta) / m + C_het (omega / m + omega^2) + 0.5 sqrt((k + ln(1/beta)) / n) / m``.

    The last term is the null (sampling) term of clean data; ``C_het`` = 1 in subset units
    (4 in trace units). ``n`` is the number of batches (exact; not private)."""
    return (
        C_var * eta * math.log(1.0 / eta) / m
        + C_het * (omega / m + omega**2)
        + 0.5 * math.sqrt((k + math.log(1.0 / beta)) / n) / m
    )


def tail_offset(eta: float, m: int) -> float:
    """``T0 = ln(2/eta) / (2m)``: per-batch Hoeffding tail offset of the filter;
    a clean batch has ``E (z^2 - T0)_+ <= eta / (2m)`` in every subset direction."""
    return math.log(2.0 / eta) / (2.0 * m)


def filter_update(y: np.ndarray, weight: np.ndarray, mean: np.ndarray, subset: np.ndarray, t0: float) -> np.ndarray:
    """One soft-filter weight update: returns the new weights.

    ``z_g = <y_g - mean, s>``, ``f_g = max(z_g^2 - T0, 0)``, ``f_max = max over W_g > 0 of f_g``,
    ``W_g <- W_g (1 - f_g / f_max)``. The update is linear in ``W``, so it applies equally to
    per-batch kept fractions and to group weights ``keep_g n_g`` (grouping is exact: the program is
    symmetric within a group).

    If ``f_max = 0`` (every kept point within ``sqrt(T0)`` of the mean in direction ``s``, yet the
    excess variance is above threshold: e.g. unbudgeted heterogeneity) the offset is dropped,
    ``f_g = z_g^2`` (the plain CLM soft filter); ``f_max > 0`` then, since the direction has
    positive variance. (The textbook update divides by zero in this case.)
    """
    z = (y - mean[None, :]) @ subset.astype(np.float64)
    kept = weight > 0
    f = np.maximum(z * z - t0, 0.0)
    f_max = float(np.max(f[kept])) if np.any(kept) else 0.0
    if not f_max > 0.0:
        f = z * z
        f_max = float(np.max(f[kept]))
    if not f_max > 0.0:  # only if all kept points coincide with the mean: nothing to filter
        return weight.copy()
    return np.where(kept, weight * np.maximum(1.0 - f / f_max, 0.0), 0.0)


@dataclass(frozen=True)
class FilterResult:
    """Output of :func:`subset_filter`. **Every field is a non-private function of the data; the
    job never releases any of them** (docs/privacy/distribution.md).

    Attributes
    ----------
    estimate : ndarray (k,)
        ``mu_w`` on the simplex (clip-and-renormalise of float rounding only).
    status : {"OK", "OVERTRIM"}
        OK: the majorizer check certified ``mu_w``. OVERTRIM: the next update would have
        discarded more than ``3 eta`` of the batches (eta underestimated or heterogeneity not
        budgeted, Corollary 3.11); the fields describe the last state before that update, which
        is **not** certified.
    counts : ndarray (D, k) int64
        The distinct count vectors (sorted lexicographically).
    multiplicity : ndarray (D,) int64
        Batches per distinct vector.
    keep : ndarray (D,) float
        Kept fraction of each distinct vector, in [0, 1].
    value : float
        Last certificate value ``max_s s^T Delta_w s`` (subset units; an upper bound if not exact).
    threshold : float
        The threshold (subset units, :func:`filter_threshold`).
    discard : float
        ``1 - sum(keep * multiplicity) / n``.
    iterations : int
        Weight updates performed.
    subset : ndarray (k,) bool
        Last direction.
    exact : bool
        Whether the certificate value came from exact enumeration.
    """

    estimate: np.ndarray
    status: Literal["OK", "OVERTRIM"]
    counts: np.ndarray
    multiplicity: np.ndarray
    keep: np.ndarray
    value: float
    threshold: float
    discard: float
    iterations: int
    subset: np.ndarray
    exact: bool


def histogram_arrays(hist: Mapping[tuple[int, ...], int], m: int) -> tuple[np.ndarray, np.ndarray]:
    """``(counts (D, k) int64, multiplicity (D,) int64)`` from a histogram of distinct count
    vectors (``BatchAggregates.histogram``), rows sorted lexicographically.

    Raises
    ------
    InvalidParameterError
        Empty histogram, rows of different lengths or k < 2, negative entries, a row not summing
        to ``m``, a multiplicity that is not a positive integer.
    """
    if not isinstance(hist, Mapping) or len(hist) == 0:
        raise InvalidParameterError("hist must be a non-empty mapping {count vector: number of persons}")
    keys = sorted(hist)
    try:
        counts = np.array(keys, dtype=np.int64)
    except (ValueError, TypeError) as exc:
        raise InvalidParameterError("hist keys must be tuples of integers of one length k") from exc
    if counts.ndim != 2 or counts.shape[1] < 2:
        raise InvalidParameterError(f"hist keys must be tuples of k >= 2 integers, got shape {counts.shape}")
    if np.any(counts < 0) or np.any(counts.sum(axis=1) != m):
        raise InvalidParameterError(f"hist keys must be non-negative count vectors summing to m = {m}")
    mult = [hist[key] for key in keys]
    if any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1 for v in mult):
        raise InvalidParameterError("hist values (persons per count vector) must be integers >= 1")
    return counts, np.array(mult, dtype=np.int64)


def _check_rate(value: object, name: str, lo: float, hi: float, lo_open: bool) -> float:
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
          and (lo < value if lo_open else lo <= value) and value <= hi)
    if not ok or not isinstance(value, (int, float)):
        bracket = "(" if lo_open else "["
        raise InvalidParameterError(f"{name} must be a number in {bracket}{lo}, {hi}], got {value!r}")
    return float(value)


def subset_filter(
    hist: Mapping[tuple[int, ...], int],
    m: int,
    eta: float,
    omega: float = 0.0,
    beta: float = 0.05,
    C_var: float = 2.0,
    C_het: float = 1.0,
    *,
    exact_max_k: int = EXACT_MAX_K,
    rng: np.random.Generator | None = None,
) -> FilterResult:
    """Subset-direction soft filter over the histogram of distinct count vectors.

    One kept fraction per distinct count vector (exact: the filter treats identical batches
    identically). Loop: weights ``W_g = keep_g n_g``; majorizer check of ``Delta_w``
    (:func:`majorizer_check`; the first pass, ``keep = 1``, is the pre-check); if
    certified, return ``mu_w`` with status OK; else down-weight along the maximising subset
    (:func:`filter_update`); if more than ``3 eta`` of the batches would then be discarded, return
    status OVERTRIM. Terminates after at most D updates (each zeroes the group with the largest
    score).

    Parameters
    ----------
    hist : mapping {tuple of k int: int}
        Persons per distinct count vector (each vector sums to ``m``).
    m : int
        Draws per batch.
    eta : float in (0, 0.1]
        Upper bound on the corrupted fraction (at most 0.1).
    omega : float in [0, 1], default 0
        Heterogeneity radius (Corollary 3.11): honest batches drawn from ``mu_i`` with
        ``||mu_i - mu||_TV <= omega``. Adds ``C_het (omega/m + omega^2)`` to the threshold.
    beta : float in (0, 1), default 0.05
        Failure probability (null term of the threshold only).
    C_var : float, default 2
        Threshold constant (subset units; 2 keeps worst-case TV ~1.2-1.4 x the rate).
    C_het : float, default 1
        Heterogeneity constant in subset units.
    exact_max_k : int, default 20
        Enumeration up to this k; above, the SDP bound (so certification is conservative) and
        the hyperplane-rounded direction.
    rng : numpy Generator, optional
        Rounding randomness (SDP path only).

    Returns
    -------
    FilterResult
        Estimate on the simplex, kept fractions, certificate value, threshold, discard fraction,
        status. **Non-private**: the job never releases any of it.

    Privacy
    -------
    None. This is a robust estimator for trusted analysis; it is not differentially private and
    consumes no budget. Its output must not be written to a release table.

    Accuracy
    --------
    At termination with status OK, ``(mu_w, keep)`` is a fractional-repair certificate (ours,
    docs/privacy/distribution.md); on eta-good data with at most ``eta n`` corrupted batches the TV error is
    O(eta sqrt(ln(1/eta)/m)) (+ O(omega) under heterogeneity). Measured constant about
    1.2-1.4 (benchmarks/distribution_robustness.py).

    Raises
    ------
    InvalidParameterError
        Bad histogram, m, eta, omega, beta or constants.
    SolverError
        SDP path only.

    References
    ----------
    Soft filtering after Jain-Orlitsky (JO20b) and Chen-Li-Moitra; Kamath, Majid, Moitra,
    Mouzakis, Ullman, Corollary 2.16 (the majorizer SDP), Corollary 3.11 (heterogeneity),
    Lemma 2.11 (subset vs sign directions).
    """
    m = check_batch_size(m)
    eta = _check_rate(eta, "eta", 0.0, 0.1, lo_open=True)
    omega = _check_rate(omega, "omega", 0.0, 1.0, lo_open=False)
    beta = _check_rate(beta, "beta", 0.0, 1.0, lo_open=True)
    if beta >= 1.0:
        raise InvalidParameterError(f"beta must be in (0, 1), got {beta!r}")
    C_var = _check_rate(C_var, "C_var", 0.0, 1e6, lo_open=True)
    C_het = _check_rate(C_het, "C_het", 0.0, 1e6, lo_open=False)
    counts, mult = histogram_arrays(hist, m)
    y = counts.astype(np.float64) / float(m)
    k, n = counts.shape[1], int(mult.sum())
    thr = filter_threshold(k, n, m, eta, omega, beta, C_var, C_het)
    t0 = tail_offset(eta, m)
    weight = mult.astype(np.float64)
    iterations = 0
    while True:
        check = majorizer_check(y, weight, m, thr, exact_max_k=exact_max_k, rng=rng)
        discard = 1.0 - float(weight.sum()) / n
        state = dict(
            estimate=project_to_simplex(check.mean),
            counts=counts,
            multiplicity=mult,
            keep=weight / mult,
            value=check.value,
            threshold=thr,
            discard=max(0.0, discard),
            iterations=iterations,
            subset=check.subset,
            exact=check.exact,
        )
        if check.certified:
            return FilterResult(status=STATUS_OK, **state)
        new_weight = filter_update(y, weight, check.mean, check.subset, t0)
        if np.array_equal(new_weight, weight):  # SDP path only: a rounded direction with no spread
            raise SolverError("the filter cannot progress: the SDP bound is above the threshold but the rounded "
                              "direction has zero spread; use exact enumeration (k <= 20)")
        if 1.0 - float(new_weight.sum()) / n > 3.0 * eta or not np.any(new_weight > 0):
            return FilterResult(status=STATUS_OVERTRIM, **state)
        weight = new_weight
        iterations += 1
