"""COMPUTATIONALLY INEFFICIENT reference: the pure epsilon-DP multivariate person-level mean.

Agarwal, Kamath, Majid, Mouzakis, Silver, Ullman 2024, *Private Mean Estimation with
Person-Level Differential Privacy*, Section 5: Algorithms 5 (Compare), 6 (Score), 7 (FinePure)
and 8 (PureMean), Lemmas 5.1-5.8, Theorem 5.9 (the algorithm boxes are images in our copy of the
paper and are rebuilt from its text; the global grid's covering radius ``alpha / (9 sqrt d)`` is
the one under which the proof of Lemma 5.7 goes through).

**COMPUTATIONALLY INEFFICIENT: time n * d^O(d).** Every grid point ``p`` is compared with every
point ``q`` of its local cover, each comparison reading every person. This module is a reference
implementation for ``d <= 2`` on small ``n`` (``d > 2`` is refused). It is **not a Spark job**
and **not one of the job's statistic kinds**: it works on an in-memory array of person means.

Conventions (all documented where they are used):

* Inputs are person means ``Y``, shape ``(n_persons, d)``, data units; every ``Y`` is clamped to
  ``+-1e300`` (:data:`dplib.aggregates.VALUE_BOUND`) so projections cannot overflow.
* Alg 5's K groups: integer labels in ``[0, K)`` per person. Default: K contiguous blocks of the
  **given row order**; callers must pass persons in an order that cannot depend on their values
  (e.g. sorted by a keyed hash of the id). Blocks give Score sensitivity 1 under replace-one
  neighbouring (fixed n, fixed positions). Under add/remove, blocks are not enough (one removed
  person shifts others between blocks); pass labels from fixed keyed-hash ranges instead
  (:func:`hash_group_labels`), as :func:`pure_mean` does.
* Compare works in fixed point: truncated deviations ``Z_i - p0`` in units of ``rho / 2**30``
  (rounded to integers) and the midpoint ``(q0 - p0) / 2`` likewise, so group sums are exact and
  the comparison and its exact cost agree bit for bit (the tie rule then is exact too).
* An empty group (n < K, or hash labels) counts as a vote for q whenever q can win at all
  (``mid < p0 + rho``); when it cannot, p wins whatever the data. This keeps Score's
  sensitivity 1 under add/remove as well as replace-one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from dplib.aggregates import VALUE_BOUND, NumpyAggregates
from dplib.budget import Accountant, Budget, Charge
from dplib.errors import InvalidParameterError
from dplib.groups import HASH_SPACE, GroupRange
from dplib.mechanisms.exponential import sample_exponential_mechanism
from dplib.mean.params import bin_width_constant, check_moment_order, check_positive, check_records_per_person
from dplib.mean.univariate import STATUS_OK, UnivariateMeanPlan, univariate_person_mean

ALGORITHM = "agarwal2024-pure-mean-reference (COMPUTATIONALLY INEFFICIENT)"
#: Fixed-point resolution of Compare: ``rho`` is ``2**QUANT_BITS`` units.
QUANT_BITS = 30
_Q = 1 << QUANT_BITS
#: Largest dimension accepted (time grows as n * d^O(d)).
MAX_DIMENSION = 2
#: The two halves of Algorithm 8, as fixed ranges of the keyed hash.
FIRST_HALF = GroupRange(0.0, 0.5)
SECOND_HALF = GroupRange(0.5, 1.0)
_CHUNK = 32  # directions per vectorised batch in score() (small: early exit at 0)


# ----- validation ---------------------------------------------------------------------------
def _check_persons(Y, name: str = "Y") -> np.ndarray:
    arr = np.asarray(Y, dtype=np.float64)
    if arr.ndim == 1:
        arr = arr[:, None]
    if arr.ndim != 2:
        raise InvalidParameterError(f"{name} must have shape (n_persons, d), got {arr.ndim} dimensions")
    if not (1 <= arr.shape[1] <= MAX_DIMENSION):
        raise InvalidParameterError(
            f"{name} must have d in {{1, 2}} columns (the pure reference is n * d^O(d) time), got d = {arr.shape[1]}"
        )
    if not np.all(np.isfinite(arr)):
        raise InvalidParameterError(f"{name} must hold finite person means only; drop non-finite persons first")
    if arr.shape[0] >= 2**31:
        raise InvalidParameterError(f"{name} has too many persons for the exact fixed-point sums (max 2**31 - 1)")
    return np.clip(arr, -VALUE_BOUND, VALUE_BOUND)


def _check_point(p, d: int, name: str) -> np.ndarray:
    arr = np.asarray(p, dtype=np.float64).reshape(-1)
    if arr.shape != (d,) or not np.all(np.isfinite(arr)) or np.any(np.abs(arr) > VALUE_BOUND):
        raise InvalidParameterError(f"{name} must be a finite point of shape ({d},) with |entries| <= 1e300")
    return arr


def _check_k_groups(K) -> int:
    if isinstance(K, bool) or not isinstance(K, (int, np.integer)) or K < 1 or K % 2 == 0:
        raise InvalidParameterError(f"K (number of groups of Algorithm 5) must be an odd integer >= 1, got {K!r}")
    return int(K)


def _check_probability(beta, name: str = "beta") -> float:
    if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not (0.0 < float(beta) < 1.0):
        raise InvalidParameterError(f"{name} must be in (0, 1), got {beta!r}")
    return float(beta)


def block_groups(n: int, K: int) -> np.ndarray:
    """Default Alg 5 groups: K contiguous blocks of the row order, sizes differing by <= 1.

    Returns labels, shape ``(n,)``, ``label_i = floor(i K / n)``. Valid for replace-one
    neighbouring only (fixed positions); see the module docstring.
    """
    K = _check_k_groups(K)
    return (np.arange(n, dtype=np.int64) * K) // max(n, 1)


def hash_group_labels(group_idx, K: int, group: GroupRange = SECOND_HALF) -> np.ndarray:
    """Alg 5 groups from fixed keyed-hash ranges: K equal sub-ranges of ``group``.

    Parameters
    ----------
    group_idx : ndarray of shape (n_persons,), int
        Group indices from :func:`dplib.groups.group_index`; all must fall in ``group``.
    K : int
        Odd number of groups.

    Returns
    -------
    ndarray of shape (n_persons,), int64, values in ``[0, K)``. A person's label depends only on
    its own hash, so adding or removing a person moves nobody else (add/remove neighbouring).

    Raises
    ------
    InvalidParameterError
        If an index falls outside ``group``.
    """
    K = _check_k_groups(K)
    gi = np.asarray(group_idx, dtype=np.int64).reshape(-1)
    lo, hi = group.bounds
    if gi.size and (gi.min() < lo or gi.max() >= hi):
        raise InvalidParameterError(f"group_idx values must lie in the hash range {group} of this stage")
    return ((gi - lo) * K) // (hi - lo)


def _check_groups(groups, n: int, K: int) -> np.ndarray:
    if groups is None:
        return block_groups(n, K)
    g = np.asarray(groups)
    if g.shape != (n,) or not np.issubdtype(g.dtype, np.integer) or (n and (g.min() < 0 or g.max() >= K)):
        raise InvalidParameterError(f"groups must be integer labels in [0, K) of shape ({n},)")
    return g.astype(np.int64)


# ----- public parameters ---------------------------------------------------------------------
def default_truncation_radius(alpha: float, k: float = 4.0, m: int = 1, scale: float = 1.0) -> float:
    """Alg 5 truncation radius rho (our constant), data units.

    ``rho = s * (a/8 + max(16 c_r(k)/sqrt(m), sqrt((k-1) ln m / m), (16/a)^(1/(k-1)) / m))`` with
    ``a = alpha / s`` (normalised target). For ``k = inf`` the middle term uses ``2 ln m`` and the
    last ``1/m``. Public inputs only: never affects privacy.
    """
    alpha = check_positive(alpha, "alpha")
    scale = check_positive(scale, "scale")
    k = check_moment_order(k)
    m = check_records_per_person(m)
    a = alpha / scale
    spread = 16.0 * bin_width_constant(k) / math.sqrt(m)
    tail = math.sqrt((2.0 if math.isinf(k) else k - 1.0) * math.log(m) / m)
    bias = 1.0 / m if math.isinf(k) else (16.0 / a) ** (1.0 / (k - 1.0)) / m
    return scale * (a / 8.0 + max(spread, tail, bias))


def default_number_of_groups(beta_c: float) -> int:
    """Alg 5 number of groups K: the smallest odd integer >= ceil(8 ln(1/beta_c)) (the paper's
    ``K = Theta(log(1/beta))``; the constant 8 is ours)."""
    beta_c = _check_probability(beta_c, "beta_c")
    K = max(1, math.ceil(8.0 * math.log(1.0 / beta_c)))
    return K if K % 2 == 1 else K + 1


def _per_axis(factor: float, d: int) -> float:
    return factor * math.sqrt(d)


def global_grid(alpha: float, d: int) -> np.ndarray:
    """Alg 7's cover J of ``[-alpha, alpha]^d`` (covering radius ``alpha / (9 sqrt d)``, Lemma 5.7).

    An l-infinity grid with step ``2 alpha / (9 sqrt d)`` (covering radius ``alpha / (9 sqrt d)``),
    ``N = ceil(9 sqrt d)`` points per axis centred on 0: 9 points (d = 1), 169 (d = 2).

    Returns
    -------
    ndarray of shape (N**d, d), data units; rows in lexicographic order of the integer offsets.
    """
    alpha = check_positive(alpha, "alpha")
    if d not in (1, 2):
        raise InvalidParameterError(f"d must be 1 or 2, got {d!r}")
    n_axis = math.ceil(9.0 * math.sqrt(d) - 1e-9)
    step = 2.0 * alpha / (9.0 * math.sqrt(d))
    axis = (np.arange(n_axis) - (n_axis - 1) / 2.0) * step
    mesh = np.meshgrid(*([axis] * d), indexing="ij")
    return np.stack([g.ravel() for g in mesh], axis=1)


def _local_cover_offsets(d: int, alpha: float, box_radius: float) -> tuple[np.ndarray, float]:
    """Integer offsets ``a`` of J_p (q = p + a * step) and the step ``alpha / (4 sqrt d)``.

    Kept: ``|a_j| * step <= box_radius`` for every axis and ``||a * step||_2 > alpha``, i.e.
    ``sum a_j^2 > 16 d`` (exact integer test, no float boundary). Sorted by ``||a||`` then
    lexicographically (data-independent order).
    """
    step = alpha / (4.0 * math.sqrt(d))
    reach = int(math.floor(box_radius / step * (1.0 + 1e-12)))
    axis = np.arange(-reach, reach + 1, dtype=np.int64)
    mesh = np.meshgrid(*([axis] * d), indexing="ij")
    offs = np.stack([g.ravel() for g in mesh], axis=1)
    sq = np.sum(offs * offs, axis=1)
    offs, sq = offs[sq > 16 * d], sq[sq > 16 * d]
    order = np.lexsort(tuple(offs[:, j] for j in reversed(range(d))) + (sq,))
    return offs[order], step


def local_cover(p, alpha: float, box_radius: float | None = None) -> np.ndarray:
    """Alg 6's local cover J_p, shape ``(|J_p|, d)``, data units.

    Grid with step ``alpha / (4 sqrt d)`` anchored at p, inside ``p + [-box_radius, box_radius]^d``
    (default ``2 alpha``), minus the points with ``||q - p||_2 <= alpha``.
    """
    p = np.asarray(p, dtype=np.float64).reshape(-1)
    alpha = check_positive(alpha, "alpha")
    box = 2.0 * alpha if box_radius is None else check_positive(box_radius, "box_radius")
    offs, step = _local_cover_offsets(p.size, alpha, box)
    return p[None, :] + offs * step


# ----- Algorithm 5 and the exact cost ---------------------------------------------------------
def _quantized_deviations(Y: np.ndarray, p: np.ndarray, W: np.ndarray, rho: float) -> np.ndarray:
    """``rint(clip(<Y_i - p, w>, -rho, rho) / rho * 2**30)``, shape ``(n, n_directions)``, int64."""
    y = (Y - p[None, :]) @ W.T
    return np.rint(np.clip(y, -rho, rho) / rho * _Q).astype(np.int64)


def _quantized_mid(dist: np.ndarray, rho: float) -> np.ndarray:
    """Midpoint ``(q0 - p0) / 2 = ||q - p|| / 2`` in the units of :func:`_quantized_deviations`.

    Values ``>= 2**30`` mean ``mid >= p0 + rho``: q cannot win whatever the data."""
    x = np.asarray(dist, dtype=np.float64) / (2.0 * rho) * _Q
    return np.rint(np.minimum(x, 4.0 * _Q)).astype(np.int64)


def _costs(zq: np.ndarray, labels: np.ndarray, K: int, mid_q: np.ndarray) -> np.ndarray:
    """Exact cost (Alg 6 step 3) for each column of ``zq``; every ``mid_q < 2**30``.

    Group h needs ``c_h`` changes: 0 if empty or already ``sum_h > n_h mid``; else the fewest of
    its smallest values raised to the top ``2**30`` (= p0 + rho) until ``sum_h > n_h mid``.
    cost = sum of the (K+1)/2 smallest ``c_h``.
    """
    n, D = zq.shape
    counts = np.bincount(labels, minlength=K).astype(np.int64)
    L = max(int(counts.max()) if n else 0, 1)
    order = np.argsort(labels, kind="stable")
    sorted_labels = labels[order]
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    pos = np.arange(n) - starts[sorted_labels]
    padded = np.full((K, L, D), _Q, dtype=np.int64)  # padding at the top value: gain 0
    padded[sorted_labels, pos] = zq[order]
    sums = padded.sum(axis=1) - ((L - counts) * _Q)[:, None]
    padded.sort(axis=1)
    cum = np.cumsum(_Q - padded, axis=1)
    thr = counts[:, None] * mid_q[None, :]
    need = thr - sums
    c = 1 + np.sum(cum <= need[:, None, :], axis=1)
    c = np.where((sums > thr) | (counts[:, None] == 0), 0, c)
    half = (K + 1) // 2
    return np.partition(c, half - 1, axis=0)[:half].sum(axis=0)


def _direction(p: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, float]:
    diff = q - p
    dist = float(np.linalg.norm(diff))
    if not dist > 0.0 or not math.isfinite(dist):
        raise InvalidParameterError("p and q must be distinct finite points")
    return diff / dist, dist


def _comparison_setup(Y, p, q, rho, K, groups):
    """Validated inputs shared by :func:`compare` and :func:`comparison_cost`: the persons, p,
    rho, K, the group labels, the unit direction p -> q and the quantised midpoint."""
    Y = _check_persons(Y)
    n, d = Y.shape
    p, q = _check_point(p, d, "p"), _check_point(q, d, "q")
    rho = check_positive(rho, "rho")
    K = _check_k_groups(K)
    labels = _check_groups(groups, n, K)
    w, dist = _direction(p, q)
    return Y, p, rho, K, labels, w, _quantized_mid(np.array([dist]), rho)


def compare(Y, p, q, rho: float, K: int, groups=None) -> bool:
    """Algorithm 5, ``Compare(X; p, q, rho, K)``: True iff p wins.

    COMPUTATIONALLY INEFFICIENT reference (one O(n) pass per pair; Alg 6 calls it for every pair).

    Steps: ``w = (q - p)/||q - p||``; ``Z_i = Trunc_{p0 - rho, p0 + rho}(<Y_i, w>)``; group means
    ``M_1..M_K`` over the K groups; ``mu_bar = median(M)`` (K odd); p wins iff
    ``|mu_bar - p0| <= |mu_bar - q0|`` (ties go to p), i.e. iff fewer than (K+1)/2 groups have
    ``M_h > mid = (p0 + q0)/2``. Computed in fixed point (module docstring).

    Parameters
    ----------
    Y : ndarray of shape (n_persons, d), d in {1, 2}
        Person means, data units, in a data-independent order.
    p, q : ndarray of shape (d,)
        Distinct candidate points, data units.
    rho : float
        Truncation radius, data units (> 0).
    K : int
        Odd number of groups.
    groups : ndarray of shape (n_persons,), int, optional
        Group labels in ``[0, K)``; default :func:`block_groups` (contiguous row blocks).

    Returns
    -------
    bool

    Raises
    ------
    InvalidParameterError
        On d > 2, non-finite data, p == q, K even, bad groups.

    References
    ----------
    Agarwal et al. 2024, Algorithm 5, Lemmas 5.1-5.4.
    """
    Y, p, rho, K, labels, w, mid_q = _comparison_setup(Y, p, q, rho, K, groups)
    if mid_q[0] >= _Q:
        return True  # q's midpoint is beyond p0 + rho: no group mean can pass it
    zq = _quantized_deviations(Y, p, w[None, :], rho)[:, 0]
    counts = np.bincount(labels, minlength=K)
    sums = np.zeros(K, dtype=np.int64)
    np.add.at(sums, labels, zq)
    votes_q = int(np.sum((counts == 0) | (sums > counts * mid_q[0])))
    return votes_q < (K + 1) // 2


def comparison_cost(Y, p, q, rho: float, K: int, groups=None) -> float:
    """Exact ``cost(p, q)``: fewest persons whose data must change so that Compare returns False.

    Algorithm 6 step 3 (greedy per group: raise the smallest truncated values to
    ``p0 + rho``; sum of the (K+1)/2 cheapest groups). Changing a person to the top value is the
    most adversarial change because Compare is monotone in every ``Z_i``.

    Parameters and Raises as :func:`compare`.

    Returns
    -------
    float
        A non-negative integer value, or ``math.inf`` when q cannot win whatever the data
        (``||q - p|| / 2 >= rho``).
    """
    Y, p, rho, K, labels, w, mid_q = _comparison_setup(Y, p, q, rho, K, groups)
    if mid_q[0] >= _Q:
        return math.inf
    zq = _quantized_deviations(Y, p, w[None, :], rho)
    return float(_costs(zq, labels, K, mid_q)[0])


# ----- Algorithm 6 -------------------------------------------------------------------------
def score(Y, p, alpha: float, rho: float, K: int, groups=None, box_radius: float | None = None) -> int:
    """Algorithm 6, ``Score(X; p, alpha)``: ``min over q in J_p of cost(p, q)``, capped at n.

    COMPUTATIONALLY INEFFICIENT: O(n |J_p| log n) per point, ``|J_p| <= (16 sqrt d + 1)^d`` (more
    with a larger box).

    Parameters
    ----------
    Y : ndarray of shape (n_persons, d), d in {1, 2}
        Person means, data units, in a data-independent order.
    p : ndarray of shape (d,)
        Candidate, data units.
    alpha : float
        Target of the score (Alg 7 passes ``8 alpha / 9``): J_p's step is ``alpha / (4 sqrt d)``
        and it excludes ``||q - p|| <= alpha``.
    rho, K, groups
        As :func:`compare`.
    box_radius : float, optional
        l-infinity radius of J_p; default ``2 alpha`` (Alg 7 passes 2 x its own alpha; our
        choice).

    Returns
    -------
    int
        In ``[0, n]``. When no q of J_p can win whatever the data, the cap ``n`` (the paper's
        cap is not legible in our copy; we use n; under add/remove it moves by 1 with n).

    Raises
    ------
    InvalidParameterError
        As :func:`compare`.

    Privacy
    -------
    Not a release. Sensitivity 1 (Lemma 5.6 / KSU20): changing one person changes every
    ``cost(p, q)`` by at most 1 (replace-one with block or hash groups; add/remove with hash
    groups, where empty groups vote for q).

    References
    ----------
    Agarwal et al. 2024, Algorithm 6, Definition 5.5, Lemmas 5.6-5.7.
    """
    Y = _check_persons(Y)
    n, d = Y.shape
    p = _check_point(p, d, "p")
    alpha = check_positive(alpha, "alpha")
    rho = check_positive(rho, "rho")
    K = _check_k_groups(K)
    labels = _check_groups(groups, n, K)
    box = 2.0 * alpha if box_radius is None else check_positive(box_radius, "box_radius")
    return _score_checked(Y, p, alpha, rho, K, labels, box)


def _score_checked(Y, p, alpha, rho, K, labels, box) -> int:
    n, d = Y.shape
    offs, step = _local_cover_offsets(d, alpha, box)
    norms = np.sqrt(np.sum(offs * offs, axis=1).astype(np.float64))
    mid_q = _quantized_mid(norms * step, rho)
    winnable = mid_q < _Q
    if not np.any(winnable):
        return n
    W = offs[winnable] / norms[winnable, None]
    mids = mid_q[winnable]
    best = n
    for start in range(0, W.shape[0], _CHUNK):  # nearest q first; stop early at 0 (same result)
        zq = _quantized_deviations(Y, p, W[start : start + _CHUNK], rho)
        best = min(best, int(_costs(zq, labels, K, mids[start : start + _CHUNK]).min()))
        if best == 0:
            break
    return best


# ----- Algorithm 7 -------------------------------------------------------------------------
@dataclass(frozen=True)
class FinePurePlan:
    """Public parameters of Algorithm 7 (no data). All lengths in data units."""

    alpha: float
    beta: float
    epsilon: float
    d: int
    rho: float
    K: int
    n_grid: int
    n_local: int

    @property
    def score_alpha(self) -> float:
        """Target passed to Score: ``8 alpha / 9`` (Alg 7 step 2)."""
        return 8.0 * self.alpha / 9.0

    @property
    def box_radius(self) -> float:
        """l-infinity radius of J_p: ``2 alpha`` with Alg 7's alpha (our choice)."""
        return 2.0 * self.alpha

    def describe(self) -> dict:
        return {
            "algorithm": "FinePure (Algorithm 7), COMPUTATIONALLY INEFFICIENT",
            "alpha": self.alpha,
            "beta": self.beta,
            "epsilon": self.epsilon,
            "d": self.d,
            "truncation_radius": self.rho,
            "groups_K": self.K,
            "grid_points": self.n_grid,
            "local_cover_points": self.n_local,
            "grid_step": 2.0 * self.alpha / (9.0 * math.sqrt(self.d)),
            "score_cap": "n (number of persons)",
            "sampler": "exponential mechanism, Gumbel-max (OpenDP make_noisy_max when secure)",
        }


def plan_fine_pure(
    epsilon: float, alpha: float, beta: float, d: int, *, scale: float = 1.0, k: float = 4.0, m: int = 1,
    K: int | None = None, rho: float | None = None,
) -> FinePurePlan:
    """Public parameters of :func:`fine_pure`: K (P23, with ``beta_c = beta / (2 |J| |J_p|)``)
    and rho (P24 at the score's target ``8 alpha / 9``), unless given."""
    eps = Budget(epsilon).epsilon
    alpha = check_positive(alpha, "alpha")
    beta = _check_probability(beta)
    if d not in (1, 2):
        raise InvalidParameterError(f"d must be 1 or 2, got {d!r}")
    n_grid = math.ceil(9.0 * math.sqrt(d) - 1e-9) ** d
    n_local = _local_cover_offsets(d, 8.0 * alpha / 9.0, 2.0 * alpha)[0].shape[0]
    K = default_number_of_groups(beta / (2.0 * n_grid * n_local)) if K is None else _check_k_groups(K)
    rho = default_truncation_radius(8.0 * alpha / 9.0, k, m, scale) if rho is None else check_positive(rho, "rho")
    return FinePurePlan(alpha, beta, eps, d, rho, K, n_grid, n_local)


def grid_scores(Y, plan: FinePurePlan, groups=None) -> tuple[np.ndarray, np.ndarray]:
    """Exact scores of every point of Alg 7's grid. NOT a release (exact, data-dependent).

    COMPUTATIONALLY INEFFICIENT: ``|J|`` calls of :func:`score`.

    Returns
    -------
    (grid, scores): shapes ``(|J|, d)`` and ``(|J|,)`` int64.
    """
    Y = _check_persons(Y)
    n, d = Y.shape
    if d != plan.d:
        raise InvalidParameterError(f"Y has d = {d} columns but the plan is for d = {plan.d}")
    labels = _check_groups(groups, n, plan.K)
    grid = global_grid(plan.alpha, d)
    scores = np.array(
        [_score_checked(Y, p, plan.score_alpha, plan.rho, plan.K, labels, plan.box_radius) for p in grid],
        dtype=np.int64,
    )
    return grid, scores


def fine_pure(
    Y, epsilon: float, alpha: float, beta: float, noise, *, scale: float = 1.0, k: float = 4.0, m: int = 1,
    K: int | None = None, rho: float | None = None, groups=None,
) -> tuple[np.ndarray, FinePurePlan]:
    """Algorithm 7, ``FinePure(X; epsilon, alpha, beta)`` (precondition ``||mu||_inf <= alpha``).

    COMPUTATIONALLY INEFFICIENT (time n * d^O(d)); reference for d <= 2, not a Spark job.

    Scores every point of :func:`global_grid` with ``Score(X; p, 8 alpha / 9)`` and samples one by
    the exponential mechanism with sensitivity 1.

    Parameters
    ----------
    Y : ndarray of shape (n_persons, d), d in {1, 2}
        Centred person means, data units, in a data-independent order (or with hash ``groups``).
    epsilon : float
        Privacy budget of this call.
    alpha, beta : float
        Target l2 error (data units) and failure probability.
    noise : NoiseSource
        ``SecureNoise`` for releases, ``SeededNoise`` in tests.
    scale, k, m
        Moment scale (data units), order and records per person for the default rho (P24).
    K, rho : optional
        Overrides of P23 / P24 (public values only).
    groups : ndarray of shape (n_persons,), optional
        Alg 5 group labels; default contiguous row blocks (replace-one only).

    Returns
    -------
    (point, plan): the released grid point, shape ``(d,)``, data units; the public plan.

    Raises
    ------
    InvalidParameterError
        On invalid parameters or data.

    Privacy
    -------
    epsilon-DP (pure): exponential mechanism over a data-independent grid with a score of
    sensitivity 1 (integer counts of persons). Replace-one neighbouring with row-block groups
    (fixed public n and positions); add/remove with hash-range groups (:func:`hash_group_labels`).

    References
    ----------
    Agarwal et al. 2024, Algorithm 7, Lemmas 2.9, 5.7, 5.8.
    """
    Y = _check_persons(Y)
    plan = plan_fine_pure(epsilon, alpha, beta, Y.shape[1], scale=scale, k=k, m=m, K=K, rho=rho)
    grid, scores = grid_scores(Y, plan, groups)
    index = sample_exponential_mechanism(scores, plan.epsilon, noise, sensitivity=1.0)
    del scores
    return grid[index].copy(), plan


# ----- Algorithm 8 -------------------------------------------------------------------------
@dataclass(frozen=True)
class PureMeanResult:
    """What :func:`pure_mean` releases (every number DP or public).

    Attributes
    ----------
    estimate : ndarray of shape (d,)
        The private mean, data units.
    coarse_center : ndarray of shape (d,)
        The per-coordinate univariate estimates of the first half (DP).
    epsilon, delta : float
        Composed cost charged (delta is 0: pure DP).
    parameters : dict
        Public plan.
    """

    estimate: np.ndarray
    coarse_center: np.ndarray
    epsilon: float
    delta: float
    parameters: dict = field(default_factory=dict)


def pure_mean_charges(epsilon: float, d: int, scale: float, k: float, m: int, range_bound: float) -> list[Charge]:
    """Privacy cost of :func:`pure_mean` before any data is read (Theorem 5.9's accounting).

    d univariate pure-DP means with ``epsilon / d`` each on the first hash half (basic
    composition), then the exponential mechanism with ``epsilon`` on the second half (parallel
    composition across the disjoint halves): composed cost ``(epsilon, 0)``.
    """
    eps = Budget(epsilon).epsilon
    out: list[Charge] = []
    for j in range(d):
        plan = UnivariateMeanPlan(
            budget=Budget(eps / d, 0.0), scale=scale, k=k, m=m, range_bound=range_bound, group=FIRST_HALF
        )
        out.extend(plan.charges(prefix=f"pure mean coordinate {j}: "))
    out.append(Charge("pure mean fine exponential mechanism", Budget(eps, 0.0), SECOND_HALF))
    return out


def pure_mean(
    Y_first_half, Y_second_half, epsilon: float, alpha: float, beta: float, scale: float, k: float, m: int,
    range_bound: float, noise, *, group_idx_first, group_idx_second, K: int | None = None,
    rho: float | None = None,
) -> PureMeanResult:
    """Algorithm 8, ``PureMean(X; epsilon, alpha, beta, R)``: pure epsilon-DP mean, d in {1, 2}.

    COMPUTATIONALLY INEFFICIENT (time n * d^O(d)); a reference, not a Spark job, not a statistic
    kind of the job.

    1. For each coordinate j: ``mu_c[j] <- UnivariateMean`` (pure, ``epsilon / d``) on the first
       half, via :func:`dplib.mean.univariate.univariate_person_mean` over a
       :class:`~dplib.aggregates.NumpyAggregates` of the half.
    2. Subtract ``mu_c`` from the second half (post-processing).
    3. ``mu~ <- FinePure(second half; epsilon, alpha, beta/2)`` with Alg 5 groups from K fixed
       hash sub-ranges of the second half.
    4. Return ``mu~ + mu_c``.

    Parameters
    ----------
    Y_first_half, Y_second_half : ndarray of shape (n_1, d) and (n_2, d), d in {1, 2}
        Person means, data units. The halves must be the persons whose keyed hash falls in
        ``[0, 2**31)`` and ``[2**31, 2**32)`` respectively.
    epsilon : float
        Total privacy budget.
    alpha : float
        Target l2 error of FinePure, data units (its precondition: ``||mu - mu_c||_inf <= alpha``).
    beta : float
        Failure probability (FinePure gets ``beta / 2``; the univariate stage sets its own radius
        from a DP count and does not take a failure probability).
    scale, k, m
        Public moment scale (data units), moment order, records per person.
    range_bound : float
        Public R with ``|mu_j| <= R`` for every coordinate (pure-DP coarse histograms).
    noise : NoiseSource
        ``SecureNoise`` for releases, ``SeededNoise`` in tests.
    group_idx_first, group_idx_second : ndarray of shape (n_1,) and (n_2,), int
        Keyed-hash group indices (:func:`dplib.groups.group_index`) of the persons of each half.
    K, rho : optional
        Public overrides of P23 / P24 for FinePure.

    Returns
    -------
    PureMeanResult

    Raises
    ------
    InvalidParameterError
        On d > 2, non-finite data, mismatched dimensions, group indices outside their half.
    BudgetExceededError
        Never with consistent parameters (the plan is checked against (epsilon, 0) first).

    Privacy
    -------
    Pure epsilon-DP under add/remove neighbouring (one person's summary added or removed). First
    half: d univariate pure means, each epsilon/d-DP under add/remove (Laplace histogram on all
    bins, Laplace on a centred sum), basic composition -> epsilon. Second half: exponential
    mechanism with a sensitivity-1 score (hash-range groups, empty groups vote for q) ->
    epsilon. The halves are fixed hash ranges, so parallel composition gives epsilon overall;
    the accountant checks this with :func:`pure_mean_charges` before any data is read. A
    replace-one statement follows as 2 epsilon (a replacement is a removal and an addition).

    References
    ----------
    Agarwal et al. 2024, Algorithm 8, Theorem 5.9.
    """
    Y1 = _check_persons(Y_first_half, "Y_first_half")
    Y2 = _check_persons(Y_second_half, "Y_second_half")
    if Y1.shape[1] != Y2.shape[1]:
        raise InvalidParameterError("Y_first_half and Y_second_half must have the same number of columns d")
    d = Y2.shape[1]
    g1 = np.asarray(group_idx_first, dtype=np.int64).reshape(-1)
    g2 = np.asarray(group_idx_second, dtype=np.int64).reshape(-1)
    if g1.shape != (Y1.shape[0],) or (g1.size and (g1.min() < 0 or g1.max() >= HASH_SPACE // 2)):
        raise InvalidParameterError("group_idx_first must give each first-half person a hash index in [0, 2**31)")
    if g2.shape != (Y2.shape[0],) or (g2.size and (g2.min() < HASH_SPACE // 2 or g2.max() >= HASH_SPACE)):
        raise InvalidParameterError("group_idx_second must give each second-half person a hash index in [2**31, 2**32)")
    beta = _check_probability(beta)
    fine_plan = plan_fine_pure(epsilon, alpha, beta / 2.0, d, scale=scale, k=k, m=m, K=K, rho=rho)
    charges = pure_mean_charges(epsilon, d, scale, k, m, range_bound)
    accountant = Accountant(Budget(fine_plan.epsilon, 0.0))
    accountant.check(charges)  # verify the whole plan before touching data
    labels = hash_group_labels(g2, fine_plan.K, SECOND_HALF)

    centre = np.zeros(d)
    uni_params = []
    for j in range(d):
        plan = UnivariateMeanPlan(
            budget=Budget(fine_plan.epsilon / d, 0.0), scale=scale, k=k, m=m, range_bound=range_bound, group=FIRST_HALF
        )
        backend = NumpyAggregates({"y": Y1[:, j]}, g1)
        release = univariate_person_mean(backend, "y", plan, noise, accountant, stage_prefix=f"pure mean coordinate {j}: ")
        if release.status != STATUS_OK or release.estimate is None:  # pragma: no cover - pure DP always finds a bin
            raise InvalidParameterError("the univariate pure-DP stage returned no estimate")
        centre[j] = release.estimate
        uni_params.append(plan.describe())

    fine_charge = charges[-1]
    accountant.charge(fine_charge.stage, fine_charge.budget, fine_charge.group)
    grid, scores = grid_scores(Y2 - centre[None, :], fine_plan, labels)
    index = sample_exponential_mechanism(scores, fine_plan.epsilon, noise, sensitivity=1.0)
    del scores
    estimate = grid[index] + centre
    eps_spent, delta_spent = accountant.cost()
    params = {
        "algorithm": ALGORITHM,
        "neighbouring": "add/remove one person; halves and Alg 5 groups are fixed keyed-hash ranges",
        "coarse": uni_params,
        "fine": fine_plan.describe(),
        "charges": [(c.stage, c.budget.epsilon, c.budget.delta, str(c.group)) for c in accountant.charges],
    }
    return PureMeanResult(estimate, centre.copy(), eps_spent, delta_spent, params)
