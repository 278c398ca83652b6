"""Private estimators of a discrete distribution from per-person batches: P0, P1, P2.

Kamath, Majid, Moitra, Mouzakis, Ullman, Algorithm 4.1 step 1 (the pooled Laplace baseline) and the
projection Pi of Lemma 4.4; the tiers P1-P3 and their radii are ours (docs/privacy/distribution.md,
"Estimators").
Each person contributes one count vector ``c_i`` (``k`` categories incl. OTHER, ``sum c_i = m``)
and its distribution ``y_i = c_i / m`` on the simplex. The estimand is the mean over persons of
``y_i`` (persons with at least ``m`` records, weighted equally).

Neighbouring relation: add/remove one person (docs/privacy/distribution.md); the number of persons
is **not** public. The paper's baseline is written for replace-one with n public; the add/remove
forms are:

======  =====================================================================================
tier    release (each stage on its own fixed hash range in parallel mode)
======  =====================================================================================
P0      ``nu = sum_i y_i + Lap(1/epsilon)^k`` (l1 sensitivity 1: ``||y_i||_1 = 1``); estimate
        ``Pi(nu)``. ``Pi`` is scale-free, so ``Pi(nu) = Pi(nu / n)`` and no count is needed.
P1      centre ``c = Pi(nu_c)`` by P0 on the centre range; then on the rest
        ``(S, w n)`` with ``S = sum_i (clip1(y_i) - c)``, ``clip1`` the l1 ball of radius rho_1
        around c; Laplace((rho_1 + w)/epsilon) on all k + 1 entries (l1 sensitivity rho_1 + w);
        estimate ``Pi(c + S~ / max(N~, 1))`` with ``N~ = (w n)~ / w``.
P2      as P1 with the l2 ball of radius rho_2 and the analytic Gaussian mechanism on
        ``(S, w n)`` (l2 sensitivity ``sqrt(rho_2^2 + w^2)``): (epsilon, delta).
======  =====================================================================================

Normalisation of P1/P2: the centred sum's coordinates sum to 0 (both ``clip(y_i)`` and ``c``
lie on the simplex), so it carries no count; the count is released jointly as ``w n`` with
``w = rho / 4`` (as ``dplib.mean.multivariate.clip_and_noise``), and the count's relative error
only multiplies the small correction ``S / n ~ ybar - c``. The un-centred ``sum clip(y_i)`` would
carry n for free but has sensitivity 1, i.e. P0's.

``Pi(v) = max(v, 0) / sum(max(v, 0))`` is an l1-nearest simplex point (the paper's Pi of Lemma 4.4); when no
coordinate is positive every simplex point is at the same l1 distance and the uniform
distribution is returned (post-processing either way).

Radii (ours; docs/privacy/distribution.md, "Estimators"), from public inputs and earlier DP
outputs only: with n^ the P0 centre's noisy count scaled to the statistic's persons,
``r_c = min(2, 2 (sqrt(2 (k ln 2 + ln(4/beta)) / (n_c m)) + G_k(1 - beta/2) b_c / n_c))`` (a
bound on ``||c - mu||_1``: sampling of ``n_c m`` draws, plus the l1 norm of the k Laplace
noises, a Gamma(k, b_c) quantile, doubled by the projection), ``rho_1 = min(2, sqrt(2 (k ln 2 +
ln(2 n^/beta)) / m) + r_c)``, ``rho_2 = min(sqrt 2, 3 / sqrt(m) + r_c)``. They shape accuracy
only; privacy holds for any public value.

``eta`` and ``omega`` are unused by P0-P2 (which have no robustness beyond the trivial bias
<= eta in TV). P3 (robust and private: the exponential mechanism over a simplex grid with the
certified FRC score, :mod:`dplib.distribution.p3`) uses them in its public ``tau_cov``; it runs
on exactly ``n0`` persons (a DP lower bound on the count, its own charge, then selection by
keyed-hash rank and padding, :mod:`dplib.fixed_n`), so that its replace-one proof applies.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from scipy.stats import gamma

from dplib.budget import Accountant, Budget, Charge, composed_cost
from dplib.distribution.batches import (
    category_names,
    check_batch_size,
    check_categories,
    clipped_sum_l1_sensitivity,
    clipped_sum_l2_sensitivity,
)
from dplib.distribution.frc import check_rate
from dplib.distribution.p3 import (
    DEFAULT_CLOSENESS_RADIUS,
    STAGE_COUNT,
    STAGE_P3,
    UNINFORMATIVE_SHARE,
    em_score_bound,
    p3_mechanism,
    p3_release,
    p3_setup,
)
from dplib.distribution.simplex import bounded, floored_count, project_to_simplex
from dplib.errors import InvalidParameterError
from dplib.fixed_n import check_beta
from dplib.groups import ALL_PERSONS, GroupRange
from dplib.mechanisms import NoiseSource, clamp_exact, gaussian_sigma, inflate, laplace_mechanism
from dplib.seam import BatchAggregates

#: The analytic-Gaussian calibration (dp_accounting, ~0.1 s) is a pure function of public
#: values: cache it.
_gaussian_sigma = functools.lru_cache(maxsize=256)(gaussian_sigma)

ALGORITHM = "batch-distribution"
ALGORITHM_VERSION = "1"
ESTIMATORS = ("P0", "P1", "P2", "P3")
ESTIMATOR_NAMES = {
    "P0": "pooled Laplace (pure epsilon)",
    "P1": "l1-clipped Laplace around a private centre (pure epsilon)",
    "P2": "l2-clipped Gaussian around a private centre (approximate DP)",
    "P3": "exponential mechanism on a simplex grid with the certified FRC score (robust, pure epsilon)",
}
#: P3's ways of making n public: a DP lower bound n0 with selection and padding (the default and
#: the only one the job uses), or the paper's assumption that n is public (benchmarks only: it
#: is DP under replace-one with n public, **not** under add/remove).
P3_N_MODES = ("dp_lower_bound", "public_as_in_paper")
#: P3's default budget share of the person count n0 (sequential on the same persons), and its
#: range ``[P3_COUNT_SHARE_LIMITS[0], P3_COUNT_SHARE_LIMITS[1])``.
P3_COUNT_EPSILON_SHARE = 0.1
P3_COUNT_SHARE_LIMITS = (1e-9, 1.0)
#: The plan's ``beta`` (radii; P3 also :func:`dplib.fixed_n.check_beta`) lies in
#: ``[BETA_LIMITS[0], BETA_LIMITS[1])``.
BETA_LIMITS = (1e-12, 1.0)
#: P3's default accuracy target alpha (l1): G = ceil(2k / alpha) (k = 3: G = 100) and
#: eta_priv (:func:`dplib.distribution.p3.eta_priv`).
P3_DEFAULT_ALPHA = 0.06
STATUS_OK = "OK"
ERROR_LEVEL = 0.9
#: What the batch estimators' (P0-P2) 90% bars cover.
BATCH_COVERS = (
    "the exact dataset statistic over the persons with at least m records (the persons the batch estimators "
    "read: the mean over them of each one's category shares over all of their records), per category, at 90% "
    "by a normal approximation: the noise of the sum and of the "
    "denominator (the normalisation), the sampling of m draws per person and, when the stage reads a hash "
    "range, of the persons"
)
_Z90 = 1.6448536269514722


def batch_error_bar(estimate: np.ndarray, noise_var: float, denom: float, m: int, persons_fraction: float,
                    extra_var: np.ndarray | float = 0.0) -> np.ndarray:
    """90% half-widths, shape ``(k,)``, of a batch estimator's estimate ``p~`` (on the simplex)
    around the exact dataset statistic ``p`` (the mean over persons of their shares over all
    records). Normal approximation of three independent terms, per category ``j``:

    * noise and normalisation: ``p~_j = (S_j + e_j) / (n + sum_l e_l)`` moves by
      ``(e_j - p_j sum_l e_l) / n`` to first order, variance
      ``noise_var ((1 - p_j)^2 + p_j^2 (k - 1)) / n^2`` (``noise_var``: each entry's noise variance);
    * the draws: each person's m draws estimate their shares without bias, variance at most
      ``P_ij (1 - P_ij) / m`` per person, and the mean over persons of ``P (1 - P)`` is at most
      ``p_j (1 - p_j)`` (concavity): ``p_j (1 - p_j) / (m n)``;
    * the persons, when the stage reads a hash range of fraction ``f`` of them: ``(1 - f) p_j (1 - p_j) / n``;

    with ``n`` the stage's DP person count ``denom`` and ``p_j`` replaced by the value closest to
    1/2 within the noise term's own 90% bar around ``p~_j`` (conservative for ``p (1 - p)``);
    ``extra_var`` adds further variance (P1, P2: the count's noise times the deviation from the
    centre). Post-processing of DP outputs and public constants; total on any float inputs (a
    share's error is at most 1: the half-widths are capped there, NaN read as 1)."""
    p = np.nan_to_num(np.asarray(estimate, dtype=float), nan=0.5)
    k = p.size
    n = np.float64(max(float(np.nan_to_num(denom, nan=1.0)), 1.0))
    with np.errstate(over="ignore", invalid="ignore"):
        v_noise = np.float64(noise_var) * ((1.0 - p) ** 2 + p**2 * (k - 1)) / n**2
        b = _Z90 * np.sqrt(v_noise)
        p_star = np.clip(0.5, np.clip(p - b, 0.0, 1.0), np.clip(p + b, 0.0, 1.0))
        f = min(max(float(persons_fraction), 0.0), 1.0)
        v_sample = p_star * (1.0 - p_star) * (1.0 / m + (1.0 - f)) / n
        bar = _Z90 * np.sqrt(v_noise + v_sample + np.asarray(extra_var, dtype=float))
    return np.minimum(np.nan_to_num(bar, nan=1.0, posinf=1.0), 1.0)
#: Weight of the count released beside the clipped sum: ``(S, w n)``, ``w = COUNT_WEIGHT * rho``.
COUNT_WEIGHT = 0.25
#: Share of the statistic's persons read by the centre stage (parallel mode).
CENTER_FRACTION = 0.25
#: Budget share of the centre in sequential mode (epsilon_1 = epsilon / 4).
CENTER_EPSILON_SHARE = 0.25
#: Constant of the P2 radius (rho_2 = 3 / sqrt(m) + r_c).
P2_RADIUS_CONSTANT = 3.0

STAGE_POOLED = "pooled laplace"
STAGE_CENTER = "centre (pooled laplace)"
STAGE_CLIP_L1 = "l1-clipped sum"
STAGE_CLIP_L2 = "l2-clipped sum"


def _check_unit_interval(value: object, name: str, lo: float, hi: float, allow_none: bool = True) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (lo <= float(value) < hi):
        raise InvalidParameterError(f"{name} must be a number in [{lo}, {hi}), got {value!r}")
    return float(value)


@dataclass(frozen=True)
class DistributionPlan:
    """Public plan of a private batch distribution, fixed before any data is read.

    Parameters
    ----------
    budget : Budget
        The statistic's (epsilon, delta). P0 and P1 spend no delta; P2 needs delta > 0.
    categories : sequence of str
        Public category list; ``k = len(categories) + 1`` (OTHER appended).
    m : int
        Draws per person (>= 1).
    estimator : "P0", "P1", "P2" or "P3"
    beta : float, default 0.05
        Failure probability in the radii (accuracy only); for P3 also the failure probability
        of the lower bound n0 (``P[n0 > n] <= beta``) and of tau_cov's null term.
    eta, omega : float, optional
        Corruption bound and heterogeneity radius: unused by P0-P2; P3's trimming level
        ``eta_priv`` (default from alpha and m, :func:`~dplib.distribution.p3.eta_priv`) and
        heterogeneity allowance in tau_cov.
    alpha : float, default 0.06
        P3: accuracy target (l1): sets the grid ``G = ceil(2k / alpha)`` and the default
        ``eta_priv``. (It no longer sets the closeness radius.)
    grid_resolution : int, optional
        P3: G (grid points ``i / G``); default ``ceil(2k / alpha)``.
    closeness_radius : float in [0, 2], default 0
        P3: l1 radius of the score's neighbourhood minimum ``S_r(nu) = min{S(nu') :
        ||nu' - nu||_1 <= r}`` over the grid (the paper's closeness condition, Definition 4.3,
        uses r = alpha). Any public value keeps sensitivity 1 (the neighbourhoods are
        data-independent; r = 0 is the score itself).
    p3_count_share : float in (0, 1), default 0.1
        P3 (``dp_lower_bound``): share of epsilon spent on the count n0; the mechanism gets the
        rest. Public; see docs/privacy/distribution.md for the trade-off.
    p3_n_mode : "dp_lower_bound" (default) or "public_as_in_paper"
        P3: see :data:`P3_N_MODES`. ``public_as_in_paper`` is for benchmarks only (its guarantee
        is replace-one with n public, and it records the exact n in the release's parameters) and
        is never set by the job.
    budget_mode : "parallel" or "sequential"
        P1/P2: the centre reads its own fixed hash range (``CENTER_FRACTION`` of the persons)
        and every stage gets the whole budget (parallel), or both stages read every person with
        epsilon/4 and 3 epsilon/4 (sequential).
    group : GroupRange
        The persons this statistic may read.

    Raises
    ------
    InvalidParameterError
        Naming the parameter: empty/repeated categories, m < 1, unknown estimator, P2 with
        delta = 0, beta / eta / omega out of range. (epsilon <= 0 is refused by ``Budget``.)
    """

    budget: Budget
    categories: tuple[str, ...]
    m: int
    estimator: Literal["P0", "P1", "P2", "P3"] = "P0"
    beta: float = 0.05
    eta: float | None = None
    omega: float | None = None
    budget_mode: Literal["parallel", "sequential"] = "parallel"
    group: GroupRange = ALL_PERSONS
    alpha: float = P3_DEFAULT_ALPHA
    grid_resolution: int | None = None
    p3_n_mode: Literal["dp_lower_bound", "public_as_in_paper"] = "dp_lower_bound"
    closeness_radius: float = DEFAULT_CLOSENESS_RADIUS
    p3_count_share: float = P3_COUNT_EPSILON_SHARE

    def __post_init__(self) -> None:
        if not isinstance(self.budget, Budget):
            raise InvalidParameterError("budget must be a dplib.budget.Budget (epsilon > 0, delta in [0, 1))")
        object.__setattr__(self, "categories", check_categories(self.categories))
        object.__setattr__(self, "m", check_batch_size(self.m))
        if self.estimator not in ESTIMATORS:
            raise InvalidParameterError(f"estimator must be one of {ESTIMATORS}, got {self.estimator!r}")
        if self.estimator == "P2" and self.budget.delta <= 0.0:
            raise InvalidParameterError("estimator P2 (Gaussian) needs delta > 0; use P0 or P1 for pure epsilon")
        object.__setattr__(self, "beta", _check_unit_interval(self.beta, "beta", *BETA_LIMITS, allow_none=False))
        for rate in ("eta", "omega"):  # P3's tau_cov rates (unused by P0-P2), checked as tau_cov checks them
            if getattr(self, rate) is not None:
                check_rate(rate, getattr(self, rate))
        if self.budget_mode not in ("parallel", "sequential"):
            raise InvalidParameterError(f"budget_mode must be 'parallel' or 'sequential', got {self.budget_mode!r}")
        if self.p3_n_mode not in P3_N_MODES:
            raise InvalidParameterError(f"p3_n_mode must be one of {P3_N_MODES}, got {self.p3_n_mode!r}")
        if self.estimator == "P3":
            check_beta(self.beta)  # also the failure probability of the lower bound n0
            object.__setattr__(
                self, "p3_count_share", _check_unit_interval(self.p3_count_share, "p3_count_share", *P3_COUNT_SHARE_LIMITS, False)
            )
            p3_setup(self.k, self.m, 1, self.alpha, self.grid_resolution, self.eta, self.omega, self.beta,
                     closeness_radius=self.closeness_radius)

    @property
    def k(self) -> int:
        return len(self.categories) + 1

    @property
    def stage_names(self) -> list[str]:
        if self.estimator == "P0":
            return [STAGE_POOLED]
        if self.estimator == "P3":
            return [STAGE_P3] if self.p3_n_mode == "public_as_in_paper" else [STAGE_COUNT, STAGE_P3]
        return [STAGE_CENTER, STAGE_CLIP_L1 if self.estimator == "P1" else STAGE_CLIP_L2]

    @property
    def groups(self) -> dict[str, GroupRange]:
        names = self.stage_names
        if len(names) == 1 or self.budget_mode == "sequential" or self.estimator == "P3":
            return {s: self.group for s in names}
        parts = self.group.split([CENTER_FRACTION, 1.0 - CENTER_FRACTION])
        return dict(zip(names, parts))

    @property
    def stage_budgets(self) -> dict[str, Budget]:
        eps, delta = self.budget.epsilon, self.budget.delta
        if self.estimator == "P0":
            return {STAGE_POOLED: Budget(eps, 0.0)}
        if self.estimator == "P3":  # n0 then the mechanism, sequential on the same persons
            if self.p3_n_mode == "public_as_in_paper":
                return {STAGE_P3: Budget(eps, 0.0)}
            share = self.p3_count_share
            return {STAGE_COUNT: Budget(eps * share, 0.0), STAGE_P3: Budget(eps * (1.0 - share), 0.0)}
        center, final = self.stage_names
        final_delta = delta if self.estimator == "P2" else 0.0
        if self.budget_mode == "parallel":
            return {center: Budget(eps, 0.0), final: Budget(eps, final_delta)}
        return {
            center: Budget(eps * CENTER_EPSILON_SHARE, 0.0),
            final: Budget(eps * (1.0 - CENTER_EPSILON_SHARE), final_delta),
        }

    def prepare(self, noise: NoiseSource) -> dict:
        """The mechanisms of this plan whose parameters are public, built and checked now: a job
        calls this before its ledger reservation, so a mechanism that cannot be built fails
        before any budget is spent.

        Returns
        -------
        dict {stage name: mechanism}
            P3: its exponential mechanism (:func:`dplib.distribution.p3.p3_mechanism`, OpenDP
            ``make_noisy_max`` on a secure source). P0-P2: empty (their Laplace / Gaussian draws
            are built per call by the noise source, with scales from public inputs or, for the
            clipped stage, from the DP centre).

        Raises
        ------
        InvalidParameterError
            The noise source cannot run a mechanism of the plan.
        """
        if self.estimator == "P3":
            return {STAGE_P3: p3_mechanism(self, noise)}
        return {}

    def charges(self, prefix: str = "") -> list[Charge]:
        """Stage charges in order: the privacy cost before any data is read."""
        groups, budgets = self.groups, self.stage_budgets
        return [Charge(f"{prefix}{s}", budgets[s], groups[s]) for s in self.stage_names]

    def cost(self) -> Budget:
        """Composed cost (add/remove one person) of :meth:`charges`."""
        eps, delta = composed_cost(self.charges())
        return Budget(eps, delta)

    def describe(self) -> dict:
        groups, budgets = self.groups, self.stage_budgets
        return {
            "estimator": self.estimator,
            "estimator_name": ESTIMATOR_NAMES[self.estimator],
            "categories": category_names(self.categories),
            "k": self.k,
            "m": self.m,
            "beta": self.beta,
            "eta": self.eta,
            "omega": self.omega,
            "eta_omega_use": "P3: trimming level and heterogeneity allowance in tau_cov"
            if self.estimator == "P3" else "unused by P0-P2",
            "short_persons": "dropped (fewer than m records)",
            "budget_mode": self.budget_mode,
            "stages": [
                {"stage": s, "persons": [groups[s].lo, groups[s].hi], "epsilon": budgets[s].epsilon, "delta": budgets[s].delta}
                for s in self.stage_names
            ],
        }


@dataclass(frozen=True)
class PooledRelease:
    """DP output of :func:`pooled_laplace`: ``noisy_sum`` (k,) estimates ``sum_i y_i``."""

    noisy_sum: np.ndarray
    scale: float  # Laplace scale per coordinate of noisy_sum (persons units)

    @property
    def noisy_count(self) -> float:
        """``sum_j noisy_sum_j``: a DP estimate of the persons (post-processing). Total: each
        entry is first clamped to ``+-COUNT_BOUND`` (NaN to 0), so the sum never overflows."""
        return float(math.fsum(bounded(self.noisy_sum)))


def pooled_laplace(backend: BatchAggregates, group: GroupRange, epsilon: float, noise: NoiseSource) -> PooledRelease:
    """P0's mechanism: ``sum_i c_i / m + Lap(1/epsilon)^k`` over the persons of ``group``.

    The caller must have charged ``(epsilon, 0)`` on ``group``.

    Privacy
    -------
    epsilon-DP under add/remove: ``sum_i c_i`` (exact integers) changes by one count vector,
    l1 norm exactly m; Laplace(m (1 + 2^-20) / epsilon) on it (integer sums below 2^53 convert
    to floats exactly; the margin is for the released float), then division by m
    (post-processing). Kamath et al., Algorithm 4.1 step 1 (the add/remove analogue of its
    2/(n epsilon) under replace-one).
    """
    m = backend.m
    _, exact_sum = backend.sums(group)
    exact = clamp_exact(np.array([float(x) for x in exact_sum]))
    noisy, scale = laplace_mechanism(exact, inflate(float(m)), epsilon, noise)
    del exact, exact_sum
    return PooledRelease(noisy / m, scale / m)


@dataclass(frozen=True)
class ClipStageRelease:
    """DP output of :func:`clipped_release`: noisy centred sum (k,), noisy count, noise scale
    (Laplace scale or Gaussian sigma of every entry of ``(S, w n)``), and the count weight."""

    noisy_sum: np.ndarray
    noisy_count: float
    scale: float
    count_weight: float


def clipped_release(
    backend: BatchAggregates,
    center: np.ndarray,
    radius: float,
    norm: Literal["l1", "l2"],
    group: GroupRange,
    budget: Budget,
    noise: NoiseSource,
) -> ClipStageRelease:
    """One release of ``(S, w n)``: ``S = sum_i (clip(y_i) - center)`` in the l1 (P1, Laplace)
    or l2 (P2, analytic Gaussian) ball of ``radius`` around the public ``center``; ``w = radius/4``.

    The caller must have charged ``budget`` on ``group``; ``center`` and ``radius`` must be public.

    Privacy
    -------
    Add/remove one person moves S by that person's fixed-point term (l1 norm <= radius (1 +
    k/2^31), l2 <= radius (1 + sqrt(k)/2^31), :mod:`dplib.distribution.batches`) and w n by w:
    l1 sensitivity ``radius (1 + k/2^31) + w`` (Laplace, pure epsilon) or l2 sensitivity
    ``hypot(radius (1 + sqrt(k)/2^31), w)`` (analytic Gaussian, Balle & Wang 2018), each
    inflated by 2^-20 for float rounding. docs/privacy/distribution.md, "Estimators".
    """
    k = backend.k
    w = COUNT_WEIGHT * radius
    exact_sum, exact_n = backend.clipped_sum(center, radius, norm, group)
    exact = clamp_exact(np.concatenate([np.asarray(exact_sum, dtype=np.float64), [w * exact_n]]))
    if norm == "l1":
        sens = inflate(clipped_sum_l1_sensitivity(radius, k) + w)
        noisy, scale = laplace_mechanism(exact, sens, budget.epsilon, noise)
    else:
        sens = inflate(math.hypot(clipped_sum_l2_sensitivity(radius, k), w))
        scale = _gaussian_sigma(sens, budget.epsilon, budget.delta)  # = gaussian_mechanism's sigma
        noisy = noise.add_gaussian(exact, scale)
    del exact_sum, exact_n, exact
    return ClipStageRelease(noisy[:-1], float(noisy[-1]) / w, float(scale), w)


def center_error_bound(n_center: float, k: int, m: int, laplace_scale: float, beta: float) -> float:
    """Public bound r_c on ``||c - mu||_1`` for the P0 centre (docs/privacy/distribution.md).

    ``2 (sqrt(2 (k ln 2 + ln(4/beta)) / (n_c m)) + G_k(1 - beta/2) b / n_c)``, capped at 2:
    the l1 deviation of ``n_c m`` pooled draws (Bretagnolle-Huber-Carol; homogeneous persons),
    plus the l1 norm of k Laplace(b) noises (a Gamma(k, b) quantile) over n_c, doubled by the
    projection (Lemma 4.4's Pi). ``n_c`` is a DP count (floored at 1): accuracy only.
    """
    n_c = max(float(n_center), 1.0)
    sampling = math.sqrt(2.0 * (k * math.log(2.0) + math.log(4.0 / beta)) / (n_c * m))
    noise_l1 = float(gamma.ppf(1.0 - beta / 2.0, a=k, scale=laplace_scale)) / n_c
    return min(2.0, 2.0 * (sampling + noise_l1))


def p1_radius(k: int, m: int, n_hat: float, beta: float, r_c: float) -> float:
    """rho_1 = min(2, sqrt(2 (k ln 2 + ln(2 n^/beta)) / m) + r_c)."""
    n = max(float(n_hat), 1.0)
    return min(2.0, math.sqrt(2.0 * (k * math.log(2.0) + math.log(2.0 * n / beta)) / m) + r_c)


def p2_radius(m: int, r_c: float) -> float:
    """rho_2 = min(sqrt 2, 3 / sqrt(m) + r_c) (r_c bounds the l2 error too)."""
    return min(math.sqrt(2.0), P2_RADIUS_CONSTANT / math.sqrt(m) + r_c)


@dataclass(frozen=True)
class DistributionRelease:
    """What a private batch distribution releases; every number is DP or public.

    Attributes
    ----------
    status : "OK"
    estimate : ndarray (k,)
        Probabilities over ``categories`` (non-negative, sum 1).
    categories : list of k str
        The public categories, then OTHER.
    error_bar : ndarray (k,) or None
        Half-width of a 90% interval for the final stage's noise alone, per coordinate, divided
        by the DP person count (not projection, sampling or clipping bias). None for P3 (the
        exponential mechanism has no per-coordinate noise scale).
    noise_scale : float or None
        Laplace scale / Gaussian sigma of the final stage's noisy sum, in persons units (None
        for P3).
    epsilon, delta : float
        Composed cost charged.
    parameters : dict
        The public plan and DP by-products (centre, radii, count weight, noisy counts).
    """

    status: str
    estimate: np.ndarray
    categories: list[str]
    error_bar: np.ndarray | None
    error_level: float
    error_covers: str
    noise_scale: float | None
    epsilon: float
    delta: float
    parameters: dict = field(default_factory=dict)


def private_distribution(
    backend: BatchAggregates,
    plan: DistributionPlan,
    noise: NoiseSource,
    accountant: Accountant | None = None,
    stage_prefix: str = "",
    prepared: dict | None = None,
) -> DistributionRelease:
    """Private mean over persons of their batch distributions ``y_i = c_i / m`` (P0, P1 or P2).

    Parameters
    ----------
    backend : BatchAggregates
        Exact aggregates over per-person count vectors (numpy twin or Spark), with the plan's
        ``k`` and ``m``.
    plan : DistributionPlan
    noise : NoiseSource
    accountant : Accountant, optional
        Checked against the whole plan first, then charged before each stage reads its persons;
        default: limited to ``plan.budget``.
    prepared : dict, optional
        ``plan.prepare(noise)``, built by the caller before its ledger reservation; built here,
        before the first charge, when None.

    Returns
    -------
    DistributionRelease
        Estimate of shape (k,) on the simplex.

    Raises
    ------
    InvalidParameterError
        If the backend's k or m differ from the plan's (before any charge).
    BudgetExceededError
        Before any stage runs, if the plan does not fit the accountant.

    Privacy
    -------
    Add/remove one person. P0: epsilon-DP (one Laplace release, l1 sensitivity 1 on sum y_i).
    P1: the centre (epsilon_c, 0) and the l1-clipped stage (epsilon_f, 0); P2: the centre
    (epsilon_c, 0) and the l2-clipped Gaussian stage (epsilon_f, delta). Parallel mode: the
    stages read disjoint fixed hash ranges, (epsilon, delta) overall; sequential: epsilon/4 +
    3 epsilon/4. Radii and centre are post-processing of the centre stage and public inputs;
    the projection is post-processing. P3: the count n0 (``p3_count_share`` of epsilon, default
    epsilon/10, Laplace) then the exponential mechanism (the rest) on the n0 selected and padded
    persons, with the certified score's neighbourhood minimum at the public
    ``closeness_radius`` (default 0: none; any public radius keeps sensitivity 1), sequential on
    the same persons; (epsilon, 0) overall (:func:`dplib.distribution.p3.p3_release`). With
    ``p3_n_mode = "public_as_in_paper"``: epsilon-DP under replace-one with n public only.

    Raises (P3)
    -----------
    SolverError
        A grid point's score could not be certified: the release is aborted after the charges
        (the budget stays spent; nothing is released).

    References
    ----------
    Kamath et al., Algorithm 4.1 (step 1: P0), Definition 4.5 (P3's score), Lemma 4.4 (the
    projection); docs/privacy/distribution.md (the tiers P1-P3, radii, n0).
    """
    if backend.k != plan.k or backend.m != plan.m:
        raise InvalidParameterError(
            f"the plan is for k={plan.k} categories and m={plan.m} draws; the batches have k={backend.k}, m={backend.m}"
        )
    prepared = plan.prepare(noise) if prepared is None else prepared
    accountant = accountant if accountant is not None else Accountant(plan.budget)
    charges = {c.stage[len(stage_prefix):]: c for c in plan.charges(stage_prefix)}
    accountant.check(list(charges.values()))
    start = len(accountant.charges)
    params = plan.describe()
    groups, budgets = plan.groups, plan.stage_budgets
    k, m = plan.k, plan.m
    names = category_names(plan.categories)

    def charge(stage: str) -> None:
        c = charges[stage]
        accountant.charge(c.stage, c.budget, c.group)

    if plan.estimator == "P3":
        estimate, p3_params = p3_release(backend, plan, noise, charge, prepared.get(STAGE_P3))
        params.update(p3_params)
        eps, delta = composed_cost(accountant.charges[start:])
        covers = ("no error bar: the exponential mechanism has no per-coordinate noise scale (the output is a "
                  "grid point; grid step 1/G and the closeness radius alpha bound its resolution)")
        # how far from the best grid point the draw may land (public inputs and the DP n: post-processing)
        n_scored = int(params.get("persons_scored", params.get("n_public_as_in_paper", 1)))
        bound = em_score_bound(budgets[STAGE_P3].epsilon, int(params["grid_points"]), float(params["sandwich_gap_batches"]))
        uninformative = bound >= UNINFORMATIVE_SHARE * n_scored
        params.update({"em_score_bound_90_batches": round(bound, 1), "uninformative": uninformative})
        if uninformative:
            covers += (f"; WARNING (uninformative): with {n_scored} persons scored at epsilon {budgets[STAGE_P3].epsilon:.3g}, "
                       f"the mechanism's 90% guarantee allows a grid point that needs {bound:.0f} batches "
                       f"({min(bound / max(n_scored, 1), 1.0):.0%} of them) discarded: the output may be far from the "
                       "data; more persons or epsilon, or estimator shares / P0, give an informative release")
        return DistributionRelease(STATUS_OK, estimate, names, None, ERROR_LEVEL, covers, None, eps, delta, params)
    if plan.estimator == "P0":
        charge(STAGE_POOLED)
        rel = pooled_laplace(backend, groups[STAGE_POOLED], budgets[STAGE_POOLED].epsilon, noise)
        estimate = project_to_simplex(rel.noisy_sum)
        n_hat = floored_count(rel.noisy_count)
        scale = rel.scale
        error_bar = batch_error_bar(estimate, 2.0 * min(scale, 1e150) ** 2, n_hat, m, persons_fraction=1.0)
        params.update({"noisy_person_count": round(rel.noisy_count, 1), "laplace_scale_of_sum": scale})
        covers = BATCH_COVERS
    else:
        center_stage, final_stage = plan.stage_names
        charge(center_stage)
        c_rel = pooled_laplace(backend, groups[center_stage], budgets[center_stage].epsilon, noise)
        center = project_to_simplex(c_rel.noisy_sum)
        n_c = floored_count(c_rel.noisy_count)
        n_hat = n_c * plan.group.fraction / groups[center_stage].fraction
        r_c = center_error_bound(n_c, k, m, c_rel.scale, plan.beta)
        norm: Literal["l1", "l2"]
        if plan.estimator == "P1":
            radius, norm = p1_radius(k, m, n_hat, plan.beta, r_c), "l1"
        else:
            radius, norm = p2_radius(m, r_c), "l2"
        charge(final_stage)
        f_rel = clipped_release(backend, center, radius, norm, groups[final_stage], budgets[final_stage], noise)
        denom = floored_count(f_rel.noisy_count)
        estimate = project_to_simplex(center + bounded(f_rel.noisy_sum) / denom)
        scale = f_rel.scale
        var_entry = (2.0 if norm == "l1" else 1.0) * min(scale, 1e150) ** 2
        # the count's noise times each coordinate's deviation from the centre (the ratio's second term)
        with np.errstate(over="ignore", invalid="ignore"):
            dev = np.clip(bounded(f_rel.noisy_sum) / denom, -1.0, 1.0)
            count_var = dev**2 * (np.float64(var_entry) / np.float64(f_rel.count_weight) ** 2 / np.float64(denom) ** 2)
        fraction = groups[final_stage].fraction / plan.group.fraction
        error_bar = batch_error_bar(estimate, var_entry, denom, m, persons_fraction=fraction, extra_var=count_var)
        params.update(
            {
                "center": [float(x) for x in center],
                "center_noisy_person_count": round(c_rel.noisy_count, 1),
                "center_error_bound_l1": r_c,
                "radius": radius,
                "radius_norm": norm,
                "count_weight": f_rel.count_weight,
                "noisy_person_count": round(f_rel.noisy_count, 1),
                ("laplace_scale_of_sum" if norm == "l1" else "gaussian_sigma_of_sum"): scale,
            }
        )
        covers = BATCH_COVERS + "; not the clipping bias of the persons outside the ball (none when its radius holds every draw)"
    eps, delta = composed_cost(accountant.charges[start:])
    return DistributionRelease(STATUS_OK, estimate, names, error_bar, ERROR_LEVEL, covers, scale, eps, delta, params)
