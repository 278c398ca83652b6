"""P3: exact pure-DP exponential mechanism over a simplex grid with the certified FRC score.

Kamath, Majid, Moitra, Mouzakis, Ullman, Algorithm 4.1 and the score of Definition 4.5 (with its closeness
condition, Definition 4.3), with the fractional-repair certificate (:mod:`dplib.distribution.frc`)
in place of degree-6 sum-of-squares, on a finite grid; the derivation, the premises of the score's
sensitivity and the parameters are in docs/privacy/distribution.md, "P3: robust and private".

Mechanism, on exactly ``n`` count vectors (``n = n0`` from :mod:`dplib.fixed_n`, padded with
:func:`dummy_batch`)::

    grid   G_grid = {i / G : i in Z^k_{>=0}, sum i = G}       (public, data-independent)
    S0(nu) = n * d*(nu)        d* the FRC's minimal discard at nu with public tau_cov (frc.py)
    S_up   = n * upper         the verified bracket's upper end (:meth:`FRC.certify`), with
                               n * (upper - lower) <= g for every grid point, else abort
    S_r(nu)= min{S_up(nu') : nu' in grid, ||nu' - nu||_1 <= r}   r = closeness_radius (public;
                               default 0: S_r = S_up, no minimum)
    output nu with probability prop. to exp(-epsilon * S_r(nu) / (2 (1 + g)))

Privacy (replace-one on the n count vectors; docs/privacy/distribution.md): the exact ``S0`` has sensitivity <= 1
**only** because (i) the covariance is the full measure's, normalised by n with the repair point
(never the kept mass), (ii) the weights are fractional, (iii) ``tau_cov``, m, the grid and
the closeness radius are public and fixed before the data is read, (iv) the mechanism sees certified scores
with the gap in batch units. Then ``S0 <= S_up <= S0 + g``, so ``S_up`` has sensitivity
``<= 1 + g``; the minimum over a data-independent neighbourhood keeps it (any radius,
including 0, where the neighbourhood is the point itself); the exponential
mechanism at ``epsilon / (2 (1 + g))`` per unit is epsilon-DP (McSherry-Talwar). It is sampled
exactly by report-noisy-max with Gumbel noise (OpenDP ``make_noisy_max`` on a secure source,
:class:`dplib.mechanisms.exponential.ExponentialMechanism`), which :func:`p3_mechanism` builds
from public inputs before any charge. A solver failure, or a bracket wider than g, aborts the
release (:class:`~dplib.distribution.robust.SolverError`); it is never mapped to a score.

The number of persons scored is ``n = min(n0, MAX_PERSONS)``: a fixed total map of the DP
output n0 (post-processing). The certified bracket's width in batch units grows like ``n``
(about 1.2e-7 n at k = 3: the solver's relative accuracy), so above ~8e4 persons no grid point
can be certified within g and every run would abort after its charges; with the cap the
mechanism is the same one on the ``n`` persons of smallest keyed-hash rank (conditioned on
``n``, add/remove is still one substitution, :mod:`dplib.fixed_n`).

The closeness radius r is separate from the grid and from the accuracy target ``alpha`` (which
sets ``G = ceil(2k/alpha)`` and ``eta_priv``). The paper's r = alpha (its closeness
condition, Definition 4.3, needed for its continuous volume argument) makes ``S_r`` flat on an
l1 ball of radius alpha around the best point, so the output is close to uniform on it (TV about
alpha/2); on a finite grid the exponential mechanism's utility bound holds for any r, and r = 0
was the most accurate in ``benchmarks/p3_vs_p0.py`` (measurements in ``benchmarks/README.md``).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from dplib.distribution.frc import FRC, tau_cov
from dplib.errors import InvalidParameterError
from dplib.fixed_n import pad_histogram, release_lower_bound
from dplib.mechanisms import ExponentialMechanism, NoiseSource, exponential_mechanism_probabilities, inflate

#: P3's stages (charge names): the DP person count n0, then the exponential mechanism. The plan
#: (:class:`dplib.distribution.private.DistributionPlan`) names its stages with these.
STAGE_COUNT = "person count (n0)"
STAGE_P3 = "P3 exponential mechanism"

#: Largest k P3 accepts (the grid and its certified solves stay feasible for k <= 4-5).
MAX_K = 5
#: Largest number of grid points (each is one certified SDP solve, ~10 ms).
MAX_GRID_POINTS = 20_000
#: Sandwich gap g in batch units.
SANDWICH_GAP = 0.01
#: Largest eta_priv and the constant of its rule (Algorithm 4.1 step 6 leaves both open; ours).
ETA_PRIV_MAX = 0.05
ETA_PRIV_CONSTANT = 1.5
#: Default closeness radius (l1) of the score's neighbourhood minimum: 0, none (the plan's
#: default too). The paper's radius alpha flattens the score on an alpha-ball (output ~uniform on
#: it, TV ~alpha/2 = 0.03 at k = 3); radius 0 was the most accurate in benchmarks/p3_vs_p0.py
#: (benchmarks/README.md).
DEFAULT_CLOSENESS_RADIUS = 0.0
#: Largest number of persons P3 scores (``n = min(n0, MAX_PERSONS)``, public). The certified
#: bracket's width in batch units is about 1.2e-7 n (k = 3, m = 10; measured up to n = 5e4), so
#: g = 0.01 fails for every grid point from ~8e4 persons on; 2e4 keeps a 4x margin. Far below
#: the cap P3's error is floored by the grid step 1/G, not by the persons scored.
MAX_PERSONS = 20_000
#: The release is flagged (``uninformative``) when the exponential mechanism's 90% utility bound
#: (:func:`em_score_bound`, in batches) reaches this share of the persons scored: the draw may
#: then land on a grid point that needs that share of the batches discarded, which says little
#: about the data (a new user's P3 at 74 persons, epsilon 0.27: total variation 0.375, status OK,
#: nothing said).
UNINFORMATIVE_SHARE = 0.25


def em_score_bound(epsilon: float, grid_points: int, gap: float = SANDWICH_GAP, level: float = 0.9) -> float:
    """The exponential mechanism's utility bound at ``level``: with probability at least ``level``
    the drawn grid point's score is within ``2 (1 + g) (ln |grid| + ln(1 / (1 - level))) / epsilon``
    batches of the best (McSherry & Talwar 2007; public inputs only)."""
    return 2.0 * (1.0 + gap) * (math.log(grid_points) + math.log(1.0 / (1.0 - level))) / epsilon


def check_alpha(alpha) -> float:
    """P3's accuracy target alpha (l1), in ``(0, 2]`` (the one declaration), else
    :class:`InvalidParameterError`."""
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 < alpha <= 2.0:
        raise InvalidParameterError(f"alpha must be in (0, 2], got {alpha!r}")
    return float(alpha)


def check_grid_resolution(G) -> int:
    """P3's grid resolution G (grid points ``i / G``): an integer >= 1, else
    :class:`InvalidParameterError`. (The number of grid points it gives at k is capped by
    :data:`MAX_GRID_POINTS` in :func:`p3_setup`.)"""
    if isinstance(G, bool) or not isinstance(G, int) or G < 1:
        raise InvalidParameterError(f"grid_resolution must be an integer >= 1, got {G!r}")
    return G


def check_closeness_radius(r) -> float:
    """P3's closeness radius (l1), a finite number in ``[0, 2]`` (0 = no neighbourhood
    minimum), else :class:`InvalidParameterError`."""
    if isinstance(r, bool) or not isinstance(r, (int, float)) or not (math.isfinite(r) and 0.0 <= r <= 2.0):
        raise InvalidParameterError(f"closeness_radius must be a number in [0, 2] (l1; 0 = no minimum), got {r!r}")
    return float(r)


def grid_resolution(k: int, alpha: float) -> int:
    """Default grid resolution ``G = ceil(2k / alpha)``."""
    return int(math.ceil(2.0 * k / alpha - 1e-9))


def grid_size(k: int, G: int) -> int:
    """Number of grid points ``C(G + k - 1, k - 1)``."""
    return math.comb(G + k - 1, k - 1)


def simplex_grid(k: int, G: int) -> np.ndarray:
    """All integer vectors of ``k`` non-negative entries summing to ``G``, shape (N, k) int64,
    in lexicographic order (stars and bars). The grid points are ``rows / G``."""
    rows = []
    for bars in itertools.combinations(range(G + k - 1), k - 1):
        edges = (-1,) + bars + (G + k - 1,)
        rows.append([edges[j + 1] - edges[j] - 1 for j in range(k)])
    return np.array(rows, dtype=np.int64).reshape(-1, k)


def eta_priv(alpha: float, m: int) -> float:
    """The internal trimming level (Algorithm 4.1 step 6, constants ours): the largest ``eta <= 0.05`` with
    ``1.5 eta sqrt(ln(1/eta) / m) <= alpha / 4`` (``eta sqrt(ln(1/eta))`` increases on (0, 0.05],
    so bisection finds it)."""
    f = lambda e: ETA_PRIV_CONSTANT * e * math.sqrt(math.log(1.0 / e) / m)  # noqa: E731
    if f(ETA_PRIV_MAX) <= alpha / 4.0:
        return ETA_PRIV_MAX
    lo, hi = 1e-12, ETA_PRIV_MAX
    for _ in range(200):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if f(mid) <= alpha / 4.0 else (lo, mid)
    return lo


def dummy_batch(k: int, m: int) -> tuple[int, ...]:
    """The fixed public padding batch: all ``m`` draws in OTHER (index ``k - 1``), i.e. the
    point mass ``m e_OTHER``. Chosen before any data is read; a point mass is the batch the FRC
    discards most cheaply when it is an outlier, and OTHER carries no named category (docs/privacy/distribution.md;
    padding happens with probability <= beta and acts as corruption of at most ``n0 - n``
    batches)."""
    return tuple([0] * (k - 1) + [int(m)])


def neighbourhood_offsets(k: int, radius: int) -> np.ndarray:
    """Integer offsets ``delta`` (sum 0, ``sum |delta| <= radius``), shape (q, k): the grid's
    l1 ball of radius ``radius / G`` (data-independent)."""
    half = radius // 2  # sum |delta| = 2 * (positive part) for sum delta = 0
    out = []
    for pos in itertools.product(range(half + 1), repeat=k):
        p = sum(pos)
        if p > half:
            continue
        for neg in itertools.product(range(half + 1), repeat=k):
            if sum(neg) == p and all(a == 0 or b == 0 for a, b in zip(pos, neg)):
                out.append([a - b for a, b in zip(pos, neg)])
    return np.array(out, dtype=np.int64).reshape(-1, k)


def neighbourhood_min(grid: np.ndarray, scores: np.ndarray, G: int, radius: float) -> np.ndarray:
    """``S_r(nu) = min{S(nu') : nu' in grid, ||nu' - nu||_1 <= r}``, ``r = radius``: the closeness
    relaxation of Definition 4.3 on the grid.

    ``grid`` (N, k) integer rows summing to ``G``; ``scores`` (N,). The neighbourhoods depend on
    ``(k, G, radius)`` only, so a minimum of sensitivity-``s`` functions has sensitivity ``s``.
    Two grid points differ by at least ``2 / G`` in l1, so ``radius < 2 / G`` (e.g. 0) returns
    the scores unchanged."""
    n_pts, k = grid.shape
    radius = int(math.floor(radius * G * (1.0 + 1e-12)))
    base = G + 1
    code = lambda rows: rows[:, : k - 1] @ (base ** np.arange(k - 1, dtype=np.int64))  # noqa: E731
    lookup = np.full(base ** (k - 1), -1, dtype=np.int64)
    lookup[code(grid)] = np.arange(n_pts)
    out = np.asarray(scores, dtype=np.float64).copy()
    for delta in neighbourhood_offsets(k, radius):
        nb = grid + delta[None, :]
        ok = np.all((nb >= 0) & (nb <= G), axis=1)
        idx = np.full(n_pts, -1, dtype=np.int64)
        idx[ok] = lookup[code(nb[ok])]
        has = idx >= 0
        out[has] = np.minimum(out[has], scores[idx[has]])
    return out


@dataclass(frozen=True)
class P3Scores:
    """Certified scores of every grid point (non-private; inside the mechanism only).

    Attributes
    ----------
    grid : ndarray (N, k) int64
        Integer grid rows (points are rows / G).
    upper, lower : ndarray (N,)
        ``n * upper``, ``n * lower`` of the verified brackets (batch units).
    alpha_scores : ndarray (N,)
        ``S_r`` from ``upper`` (the neighbourhood minimum at the closeness radius; ``upper``
        itself at radius 0).
    n : int
    tau : float
    """

    grid: np.ndarray
    upper: np.ndarray
    lower: np.ndarray
    alpha_scores: np.ndarray
    n: int
    tau: float


def p3_scores(
    hist: Mapping[tuple[int, ...], int], m: int, G: int, radius: float, tau: float, gap: float = SANDWICH_GAP
) -> P3Scores:
    """Certified FRC scores on the grid and their alpha-neighbourhood minimum.

    Parameters
    ----------
    hist : mapping {tuple of k int: int}
        Histogram of exactly n count vectors (after selection and padding).
    m : int
    G : int
        Grid resolution.
    radius : float
        Closeness radius (l1) of the neighbourhood minimum; 0 = none.
    tau : float
        Public ``tau_cov`` (trace units).
    gap : float
        Largest bracket width in batch units.

    Raises
    ------
    SolverError
        Some grid point could not be certified within ``gap`` by any solver (abort: no release).
    """
    frc = FRC(hist, m, tau)
    k = frc.k
    grid = simplex_grid(k, G)
    upper = np.empty(grid.shape[0])
    lower = np.empty(grid.shape[0])
    for i, row in enumerate(grid):
        cert = frc.certify(row / float(G), max_gap=gap)
        upper[i], lower[i] = frc.n * cert.upper, frc.n * cert.lower
    return P3Scores(grid, upper, lower, neighbourhood_min(grid, upper, G, radius), frc.n, tau)


def p3_probabilities(alpha_scores: np.ndarray, epsilon: float, gap: float = SANDWICH_GAP) -> np.ndarray:
    """Exact output distribution over the grid: ``prop. exp(-epsilon S_a / (2 (1 + g)(1 + 2^-20)))``
    (log domain; the factor 1 + 2^-20 covers float rounding of the scores, as every mechanism
    here). Shape (N,)."""
    return exponential_mechanism_probabilities(-np.asarray(alpha_scores), epsilon, sensitivity=inflate(1.0 + gap))


def p3_exponential_mechanism(epsilon: float, noise: NoiseSource, gap: float = SANDWICH_GAP) -> ExponentialMechanism:
    """P3's exponential mechanism at ``epsilon`` with sensitivity ``(1 + g)(1 + 2^-20)``, from
    public inputs only (build it before any charge; OpenDP ``make_noisy_max`` on a secure
    source). It is sampled with ``-S_r`` (float scores: the lowest score is the likeliest).

    Raises
    ------
    InvalidParameterError
        Bad epsilon or gap, or a noise source that is neither secure nor seeded.
    """
    return ExponentialMechanism(epsilon, noise, sensitivity=inflate(1.0 + gap), integer_scores=False)


def p3_mechanism(plan, noise: NoiseSource) -> ExponentialMechanism:
    """:func:`p3_exponential_mechanism` at the plan's mechanism budget and :data:`SANDWICH_GAP`
    (what :func:`p3_release` draws with); a pure function of the public plan."""
    return p3_exponential_mechanism(plan.stage_budgets[STAGE_P3].epsilon, noise, SANDWICH_GAP)


def p3_sample(alpha_scores: np.ndarray, epsilon: float, noise: NoiseSource, gap: float = SANDWICH_GAP) -> int:
    """Draw a grid index from :func:`p3_probabilities` by Gumbel report-noisy-max (OpenDP
    ``make_noisy_max`` on a secure noise source; seeded Gumbel in tests)."""
    return p3_exponential_mechanism(epsilon, noise, gap).sample(-np.asarray(alpha_scores, dtype=np.float64))


@dataclass(frozen=True)
class P3Setup:
    """Public parameters of one P3 run (from the plan and ``n``, before the data is read)."""

    k: int
    m: int
    n: int
    G: int
    alpha: float
    eta: float
    omega: float
    beta: float
    tau: float
    gap: float
    closeness_radius: float = DEFAULT_CLOSENESS_RADIUS

    def describe(self) -> dict:
        return {
            "grid_resolution": self.G,
            "grid_points": grid_size(self.k, self.G),
            "alpha": self.alpha,
            "closeness_radius": self.closeness_radius,
            "eta_priv": self.eta,
            "omega": self.omega,
            "tau_cov": self.tau,
            "sandwich_gap_batches": self.gap,
            "dummy_batch": "all m draws in OTHER",
        }


def p3_setup(k: int, m: int, n: int, alpha: float, G: int | None, eta: float | None, omega: float | None,
             beta: float, gap: float = SANDWICH_GAP, closeness_radius: float = DEFAULT_CLOSENESS_RADIUS) -> P3Setup:
    """Public parameters: ``G`` (default ``ceil(2k/alpha)``), ``eta_priv`` (default
    :func:`eta_priv`), ``tau_cov`` at ``eta_priv`` with ``n`` and ``omega``, and
    the closeness radius (l1, in [0, 2]; 0 = no neighbourhood minimum).

    Raises
    ------
    InvalidParameterError
        k > 5, too many grid points, bad alpha / G / eta / omega / closeness_radius.
    """
    if not 2 <= k <= MAX_K:
        raise InvalidParameterError(f"P3 needs k <= {MAX_K} categories (incl. OTHER), got k = {k}")
    check_alpha(alpha)
    G = check_grid_resolution(grid_resolution(k, alpha) if G is None else G)
    if grid_size(k, G) > MAX_GRID_POINTS:
        raise InvalidParameterError(
            f"grid_resolution {G} at k = {k} gives {grid_size(k, G)} grid points, more than {MAX_GRID_POINTS}: "
            "raise alpha or lower grid_resolution"
        )
    r = check_closeness_radius(closeness_radius)
    e = eta_priv(alpha, m) if eta is None else eta
    w = 0.0 if omega is None else omega
    return P3Setup(k, m, int(n), G, float(alpha), float(e), float(w), float(beta), tau_cov(k, n, m, e, w, beta), gap, r)


def p3_histogram(backend, plan, noise: NoiseSource, charge) -> tuple[dict, int, dict]:
    """The exactly-``n`` histogram P3 scores, and the DP values released about it (first half of
    :func:`p3_release`, separate so that benchmarks reuse the same selection).

    ``p3_n_mode = "dp_lower_bound"``: charge the count, release ``n0``
    (:func:`dplib.fixed_n.release_lower_bound`, l1 sensitivity 1, ``plan``'s count share of
    epsilon); ``n = min(n0, MAX_PERSONS)`` (post-processing); charge the mechanism; the
    histogram of the ``n`` persons of smallest keyed-hash rank (``ranked_histogram``), padded
    with :func:`dummy_batch` to ``n`` (:func:`dplib.fixed_n.pad_histogram`).
    ``public_as_in_paper``: charge the mechanism; every person of the group, ``n`` = their
    number (benchmarks only).

    Returns
    -------
    (histogram {count vector: persons} summing to n (non-private, for the mechanism only), n
    (DP or, in the benchmark mode, the exact count), release parameters (DP values only))
    """
    k, m, group = plan.k, plan.m, plan.group
    params: dict = {"p3_n_mode": plan.p3_n_mode}
    if plan.p3_n_mode == "public_as_in_paper":
        charge(STAGE_P3)
        hist = backend.histogram(group)
        n = sum(hist.values())
        if n < 1:
            raise InvalidParameterError("P3 with n public needs at least one person")
        params["neighbouring"] = "replace one person, n public (as in the paper; benchmark only, not add/remove)"
        params["n_public_as_in_paper"] = n
        return hist, n, params
    charge(STAGE_COUNT)
    n_exact, _ = backend.sums(group)
    fixed = release_lower_bound(n_exact, plan.stage_budgets[STAGE_COUNT].epsilon, plan.beta, noise)
    del n_exact
    n = min(fixed.n0, MAX_PERSONS)  # post-processing of n0: a fixed, total map into [1, MAX_PERSONS]
    params.update({"n0": fixed.n0, "persons_scored": n, "persons_scored_cap": MAX_PERSONS,
                   "noisy_person_count": round(fixed.noisy_count, 1), "count_laplace_scale": fixed.laplace_scale})
    charge(STAGE_P3)
    return pad_histogram(backend.ranked_histogram(group, n), n, dummy_batch(k, m)), n, params


def p3_release(backend, plan, noise: NoiseSource, charge,
               mechanism: ExponentialMechanism | None = None) -> tuple[np.ndarray, dict]:
    """Run P3 for :func:`dplib.distribution.private.private_distribution` (which validates the
    backend and the whole plan against the accountant first). ``charge(stage)`` records a
    stage's charge before it reads any data. ``mechanism``: :func:`p3_mechanism` of the plan,
    built before the run's reservation (built here, before the first charge, when None).

    Steps: :func:`p3_histogram` (``n0``, ``n = min(n0, MAX_PERSONS)``, selection, padding; or n
    public in the benchmark mode); certified scores with ``tau_cov`` at ``n``; their minimum
    over the public closeness neighbourhood (none by default); one exponential-mechanism draw.

    Returns
    -------
    (estimate (k,) on the simplex, release parameters: public setup and DP values only)

    Raises
    ------
    InvalidParameterError
        A prepared ``mechanism`` that is not the plan's (before any charge).
    SolverError
        Certification failed for some grid point: abort after the charges, nothing released.

    Privacy
    -------
    Add/remove one person: ``(epsilon_count + epsilon_em, 0)``. Conditioned on ``n`` the
    selected multiset changes by one substitution (:mod:`dplib.fixed_n`), and the mechanism is
    epsilon_em-DP under substitution with n fixed (module docstring).
    """
    if mechanism is None:
        mechanism = p3_mechanism(plan, noise)
    elif (mechanism.epsilon, mechanism.sensitivity, mechanism.noise) != (
        plan.stage_budgets[STAGE_P3].epsilon, inflate(1.0 + SANDWICH_GAP), noise
    ):
        raise InvalidParameterError("the prepared P3 mechanism does not match the plan's budget, gap or noise source")
    hist, n, params = p3_histogram(backend, plan, noise, charge)
    setup = p3_setup(plan.k, plan.m, n, plan.alpha, plan.grid_resolution, plan.eta, plan.omega, plan.beta,
                     gap=SANDWICH_GAP, closeness_radius=plan.closeness_radius)
    scores = p3_scores(hist, plan.m, setup.G, setup.closeness_radius, setup.tau, setup.gap)
    del hist
    index = mechanism.sample(-scores.alpha_scores)
    estimate = scores.grid[index].astype(np.float64) / setup.G
    del scores
    params.update(setup.describe())
    return estimate, params
