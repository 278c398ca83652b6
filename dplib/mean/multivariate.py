"""Multivariate person-level mean: CoarseEstimate, Threaded Clip-and-Noise, final ClipAndNoise.

Agarwal, Kamath, Majid, Mouzakis, Silver, Ullman 2024, Algorithm 4 (Theorem 4.3): on disjoint
groups of persons, a coarse per-coordinate estimate (Appendix A.5, Theorem 4.19), ``T`` layers of
clip-and-noise that contract the centre (Algorithm 3, Theorem 4.15), and a final clip-and-noise
(Algorithm 2, Lemma 4.20), Section 4.2-4.3 and Appendices A.4-A.5 (the algorithm boxes are
images in our copy of the paper; they are rebuilt from its text), with a planner fixing ``T`` and
every radius from public (or earlier DP) inputs before the layers read any person
(docs/privacy/multivariate_mean.md).

All radii are in *normalised units*: coordinate ``j`` of a person mean is divided by a scale
``s_j`` (a diagonal preconditioner). The scales are declared in the config (public) or found
privately on their own persons (stages "coordinate ranges" and "coordinate scales"); the user
gives no bounds.

Stages (each on its own fixed hash range of the statistic's persons in the default parallel mode;
all on all persons in sequential mode):

=====================  ==========================================================================
stage                  mechanism
=====================  ==========================================================================
person count           Laplace count (only without a public ``expected_persons``) -> n^
coordinate ranges      per coordinate, thresholded histogram of signed binary magnitudes -> [L, U]
                       (only without declared scales)
coarse estimate        per coordinate, thresholded histogram (RangeEstimator, approximate DP) of
                       bin width ``c_r s_j / sqrt(m)`` (declared) or ``(U - L) / 2`` -> u0
TCN layer t, t=1..T    Gaussian on (sum of l2-clipped deviations around u_{t-1}, w n); without
                       declared scales the coarse bin widths are the (rough) scales
coordinate scales      per coordinate, Laplace histogram of ``|Y_j - u_T,j|`` on quarter octaves
                       -> s_j = its DP 0.9-quantile (only without declared scales)
final clip-and-noise   Gaussian on (sum of l2-clipped deviations around u_T, w n) -> estimate
=====================  ==========================================================================

Budget modes: ``parallel`` (default: each stage on its own fixed hash range gets the whole
(epsilon, delta), the T layers on disjoint sub-ranges) and ``sequential`` (every stage reads all
persons, (epsilon, delta) split by the stage fractions, 60% or more to the final stage, the T
layers sharing the TCN share equally). Measured (benchmarks/anchors, issue 18): sequential is a
little more accurate on Gaussian data with 10^4 persons (d = 4 / 10: 4.9x / 2.9x the d x MEAN
anchor against 5.9x / 3.2x), but its per-coordinate range and coarse histograms, at a few percent
of epsilon split d ways, fail more often on real panels of ~4,000-6,000 persons (INSUFFICIENT_DATA
in 20/20 runs on flights d = 4 against 8/10 parallel, as before issue 18; RandHIE d = 4: 11/20
against 0/10). The job uses this estimator only with declared ``scales`` or ``records_iid``; the
default of ``kind: multivariate_mean`` is :mod:`dplib.mean.scale_free_multivariate` (every stage on
all persons; 1.1-1.4x the best anchor where this one was 5-6x). Within a
stage the ``d`` per-coordinate histograms compose by the better of basic and (optimal) advanced
composition (Kairouz-Oh-Viswanath through ``dp_accounting``).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Literal, Sequence

import numpy as np
from scipy.stats import chi2

from dplib.aggregates import MIN_EXPONENT, check_scales, clipped_sum_l2_sensitivity
from dplib.budget import Accountant, Budget, Charge, composed_cost
from dplib.errors import InvalidParameterError
from dplib.groups import ALL_PERSONS, GroupRange
from dplib.mean.params import bin_width_constant, check_moment_order, check_records_per_person
from dplib.mean.ranges import FLOOR_BETA, magnitude_range_from_counts
from dplib.mechanisms import NoiseSource, clamp_exact, gaussian_mechanism, gaussian_sigma, inflate, laplace_mechanism
from dplib.mechanisms.histograms import pure_dp_histogram, thresholded_histogram
from dplib.seam import Aggregates

ALGORITHM = "agarwal2024-multivariate-person-mean"
ALGORITHM_VERSION = "2"  # 2: a coarse range of only the zero bucket is widened to the released non-zero buckets (ranges.magnitude_range_from_counts)
STATUS_OK = "OK"
STATUS_INSUFFICIENT = "INSUFFICIENT_DATA"
ERROR_LEVEL = 0.9

#: Weight of the count released beside the clipped sum: ``(S, w n)`` with ``w = rho / 4``
#: (the sum's noise grows by about 3%; docs/privacy/multivariate_mean.md).
COUNT_WEIGHT = 0.25
#: Planner constants (ours: the paper hides them in O(.)).
C_BIAS = 1.0
C_FLOOR = 1.5
#: Bins of the coarse histogram per private range width (private-scale path).
BINS_PER_RANGE = 2
#: The scale s_j is half the DP interquartile range of Y_j around the TCN centre times this factor,
#: so that it equals the 0.9-quantile of |Y_j - mu_j| for normal person means.
IQR_TO_SCALE = 1.6448536269514722 / 0.6744897501960817
#: Fraction of persons the private coordinate range must hold.
RANGE_QUANTILE = 0.9
#: Octaves per bucket of the coordinate-range histogram (fuller buckets pass the threshold with
#: fewer persons; the coarse range only seeds the TCN, which contracts it).
RANGE_OCTAVES = 1
#: Deviation profile span around the coarse bin width.
PROFILE_OCTAVES_BELOW = 8
PROFILE_OCTAVES_ABOVE = 4

STAGE_COUNT = "person count"
STAGE_RANGES = "coordinate ranges"
STAGE_COARSE = "coarse estimate"
STAGE_SCALES = "coordinate scales"
STAGE_TCN = "TCN"
STAGE_FINAL = "final clip-and-noise"


# ---------------------------------------------------------------------------------------------
# Public-input helpers
# ---------------------------------------------------------------------------------------------


def coordinate_budget(epsilon: float, delta: float, d: int) -> tuple[float, float]:
    """Per-coordinate budget of ``d`` mechanisms on the same persons that compose to (epsilon, delta).

    The larger of basic composition ``(epsilon/d, delta/d)`` and the optimal advanced
    composition of Kairouz, Oh, Viswanath (2015, Theorem 3.3; ``dp_accounting``) with per-step
    ``delta' = delta / (2d)``. ``delta == 0`` gives basic composition (pure DP).

    Returns
    -------
    (epsilon', delta') : per coordinate.
    """
    b = Budget(epsilon, delta)
    if isinstance(d, bool) or not isinstance(d, int) or d < 1:
        raise InvalidParameterError(f"d must be an integer >= 1, got {d!r}")
    basic = (b.epsilon / d, b.delta / d)
    if d == 1 or b.delta == 0.0:
        return basic
    from dp_accounting.pld import accountant, common  # lazy: a ~2 s import; pure-DP paths never need it

    per_delta = b.delta / (2 * d)
    try:
        eps_adv = accountant.get_smallest_epsilon_from_advanced_composition(
            common.DifferentialPrivacyParameters(b.epsilon, b.delta), d, delta=per_delta
        )
    except (OverflowError, ValueError):
        # dp_accounting's KOV sum overflows for large d (e.g. (1 + e^eps)^d): basic composition,
        # valid and conservative
        return basic
    if eps_adv is None or eps_adv <= basic[0]:
        return basic
    # check the composed guarantee (round toward a smaller per-step epsilon if the search overshot)
    for _ in range(100):
        try:
            total = accountant.advanced_composition(common.DifferentialPrivacyParameters(eps_adv, per_delta), d, b.delta)
        except (OverflowError, ValueError):
            return basic
        if total is not None and total <= b.epsilon:
            return (float(eps_adv), per_delta) if eps_adv > basic[0] else basic
        eps_adv *= 1.0 - 1e-6
    return basic  # pragma: no cover


@functools.lru_cache(maxsize=256)
def _unit_sigma(epsilon: float, delta: float) -> float:
    """Analytic-Gaussian sigma of the joint ``(S, w n)`` release per unit radius."""
    return gaussian_sigma(math.sqrt(1.0 + COUNT_WEIGHT**2), epsilon, delta)


def floor_radius(d: int, m: int) -> float:
    """``rho_floor = c_fl (sqrt(d) + sqrt(2 ln max(m, 3))) / sqrt(m)``, normalised units (t_1 of
    Theorem 4.2; constants ours)."""
    return C_FLOOR * (math.sqrt(d) + math.sqrt(2.0 * math.log(max(m, 3)))) / math.sqrt(m)


def coarse_error_bound(bin_widths_normalised: Sequence[float]) -> float:
    """A-priori l2 error of the coarse centre: ``1.5 r'_j`` per coordinate (Theorem 4.19's bound,
    constant ours), normalised."""
    return float(math.sqrt(sum((1.5 * w) ** 2 for w in bin_widths_normalised)))


@dataclass(frozen=True)
class ErrorModel:
    """The planner's model of one clip-and-noise stage (Algorithm 3), normalised units.

    ``noise(rho)``: Laurent-Massart bound on the l2 norm of the Gaussian noise on the mean;
    ``sampling``: Chebyshev bound on the sampling error; ``bias(rho, gamma)``: Theorem 4.2's
    clipping bias with constant ``C_BIAS``. Each fails with probability <= 0.05 / T.
    """

    n: float
    d: int
    m: int
    k: float
    epsilon: float
    delta: float
    threads: int = 1

    @property
    def sigma_per_radius(self) -> float:
        # sigma of the mean per unit radius: analytic Gaussian of the joint (sum, w n) release
        return _unit_sigma(self.epsilon, self.delta) / max(self.n, 1.0)

    def noise(self, rho: float) -> float:
        s = math.log(20.0 * self.threads)
        return self.sigma_per_radius * rho * math.sqrt(self.d + 2.0 * math.sqrt(self.d * s) + 2.0 * s)

    @property
    def sampling(self) -> float:
        return math.sqrt(20.0 * self.threads * self.d / (self.m * max(self.n, 1.0)))

    def bias(self, rho: float, gamma: float) -> float:
        if math.isinf(self.k):
            return 0.0
        k, d, m = self.k, self.d, self.m
        return C_BIAS * (d ** ((k - 1) / 2) / (m ** (k - 1) * rho ** (k - 1)) + gamma * d ** (k / 2) / (m ** (k - 1) * rho**k))

    def balanced_radius(self, gamma: float, floor: float) -> float:
        """``max(root of bias(rho, gamma) = noise(rho), gamma + floor)``."""
        lo_bound = gamma + floor
        if math.isinf(self.k) or self.bias(lo_bound, gamma) <= self.noise(lo_bound):
            return lo_bound
        lo, hi = math.log(lo_bound), math.log(lo_bound) + 1.0
        while self.bias(math.exp(hi), gamma) > self.noise(math.exp(hi)):
            hi += 1.0
            if hi > 700:  # pragma: no cover - absurd inputs
                break
        for _ in range(100):
            mid = 0.5 * (lo + hi)
            if self.bias(math.exp(mid), gamma) > self.noise(math.exp(mid)):
                lo = mid
            else:
                hi = mid
        return math.exp(hi)

    def bound(self, rho: float, gamma: float) -> float:
        return self.noise(rho) + self.sampling + self.bias(rho, gamma)


@dataclass(frozen=True)
class ThreadSchedule:
    """Output of :func:`plan_threads`: public; fixes T and every radius (normalised units)."""

    threads: int
    radii: tuple[float, ...]
    bounds: tuple[float, ...]
    final_radius: float
    final_bound: float
    candidates: tuple[tuple[int, float], ...]  # (T, r_T) tried

    def describe(self) -> dict:
        return {
            "threads": self.threads,
            "layer_radii": list(self.radii),
            "layer_bounds": list(self.bounds),
            "final_radius": self.final_radius,
            "final_model_bound": self.final_bound,
            "candidates": [list(c) for c in self.candidates],
        }


def max_threads(d: int, k: float) -> int:
    """``T_max = 1 + ceil(log_{k+1}(max(2, log2 d)))`` (Algorithm 3's layers; constants ours)."""
    if math.isinf(k):
        return 1
    return 1 + math.ceil(math.log(max(2.0, math.log2(max(d, 2)))) / math.log(k + 1.0))


def plan_threads(
    n_tcn: float,
    n_final: float,
    d: int,
    m: int,
    k: float,
    tcn_budget: Budget,
    final_budget: Budget,
    r0: float,
    budget_mode: Literal["parallel", "sequential"],
) -> ThreadSchedule:
    """The TCN planner (Algorithm 3; the schedule is ours): choose T and the radii from public inputs only.

    Parameters
    ----------
    n_tcn, n_final : float
        Public (or DP) person counts of the TCN group and of the final group.
    d, m, k : int, int, float
        Dimension, records per person in the formulas (1 in summary mode), moment order.
    tcn_budget, final_budget : Budget
        Budget of the whole TCN stage and of the final stage.
    r0 : float
        A-priori l2 bound on the coarse centre's error, normalised units.
    budget_mode : "parallel" or "sequential"
        Parallel: each layer gets ``tcn_budget`` (disjoint persons); sequential: ``tcn_budget / T``.

    Returns
    -------
    ThreadSchedule
        The T (1..T_max) with the smallest predicted bound ``r_T`` (ties: smaller T), its radii
        ``rho_t = max(balanced root, r_{t-1} + rho_floor)`` and the final radius, the root of
        bias = noise for the final stage floored at ``r_T + rho_floor``.

    Privacy
    -------
    Pure arithmetic on its arguments: it reads no data. Deterministic.
    """
    k = check_moment_order(k)
    m = check_records_per_person(m)
    if not (math.isfinite(r0) and r0 >= 0):
        raise InvalidParameterError(f"r0 must be finite and >= 0, got {r0!r}")
    floor = floor_radius(d, m)
    best = None
    candidates = []
    for T in range(1, max_threads(d, k) + 1):
        n_t = math.floor(n_tcn / T)
        b_t = tcn_budget if budget_mode == "parallel" else tcn_budget.scaled(1.0 / T)
        model = ErrorModel(n_t, d, m, k, b_t.epsilon, b_t.delta, T)
        r = r0
        radii, bounds = [], []
        for _ in range(T):
            rho = model.balanced_radius(r, floor)
            r = model.bound(rho, r)
            radii.append(rho)
            bounds.append(r)
        candidates.append((T, r))
        if best is None or r < best[1] * (1.0 - 1e-12):
            best = (T, r, tuple(radii), tuple(bounds))
    T, r_T, radii, bounds = best  # type: ignore[misc,assignment]  # the loop runs at least once
    final = ErrorModel(n_final, d, m, k, final_budget.epsilon, final_budget.delta, 1)
    rho_star = final.balanced_radius(r_T, floor)
    return ThreadSchedule(T, radii, bounds, rho_star, final.bound(rho_star, r_T), tuple(candidates))  # type: ignore[arg-type]  # tuples (line above)


# ---------------------------------------------------------------------------------------------
# Plan
# ---------------------------------------------------------------------------------------------

DEFAULT_FRACTIONS_DECLARED = {STAGE_COARSE: 0.15, STAGE_TCN: 0.20, STAGE_FINAL: 0.65}
DEFAULT_FRACTIONS_PRIVATE = {
    STAGE_RANGES: 0.07, STAGE_COARSE: 0.08, STAGE_TCN: 0.15, STAGE_SCALES: 0.08, STAGE_FINAL: 0.62,
}
COUNT_FRACTION = 0.02


@dataclass(frozen=True)
class MultivariateMeanPlan:
    """Public plan of the multivariate person-level mean, fixed before any data is read.

    Parameters
    ----------
    budget : Budget
        The statistic's (epsilon, delta); delta > 0 is required (approximate DP estimator).
    d : int
        Number of value columns.
    k : float, default 4
        Moment order of the model (>= 2, or inf).
    mode : "summary" or "iid"
        ``summary`` (default): each person's mean is one item (m = 1 in every
        formula); ``iid``: records within a person are i.i.d. and ``m`` (the public minimum
        records per person) enters the radii (m = m_min, persons weighted equally; docs/privacy/multivariate_mean.md).
    m : int, default 1
        Records per person used in the formulas in ``iid`` mode.
    scales : tuple of d floats, optional
        Public diagonal preconditioner in data units: in ``summary`` mode a bound on the spread
        (k-th moment scale) of person means per coordinate, in ``iid`` mode of single records.
        Without it the scales are found privately.
    expected_persons : float, optional
        A public number of persons of the statistic (e.g. from metadata). Without it a DP count
        on 2% of the persons is released first.
    budget_mode : "parallel" or "sequential"
    fractions : mapping stage -> share of the hash range, optional
    group : GroupRange
        The persons this statistic may read.

    Raises
    ------
    InvalidParameterError
    """

    budget: Budget
    d: int
    k: float = 4.0
    mode: Literal["summary", "iid"] = "summary"
    m: int = 1
    scales: tuple[float, ...] | None = None
    expected_persons: float | None = None
    budget_mode: Literal["parallel", "sequential"] = "parallel"
    fractions: tuple[tuple[str, float], ...] | None = None
    group: GroupRange = ALL_PERSONS

    def __post_init__(self) -> None:
        if not isinstance(self.budget, Budget):
            raise InvalidParameterError("budget must be a dplib.budget.Budget")
        if self.budget.delta <= 0.0:
            raise InvalidParameterError(
                "the multivariate mean is an approximate-DP estimator: delta must be > 0 "
                "(the pure-DP reference of dplib.mean.pure_reference is for d <= 2 only)"
            )
        if isinstance(self.d, bool) or not isinstance(self.d, int) or self.d < 1:
            raise InvalidParameterError(f"d must be an integer >= 1, got {self.d!r}")
        object.__setattr__(self, "k", check_moment_order(self.k))
        if self.mode not in ("summary", "iid"):
            raise InvalidParameterError(f"mode must be 'summary' or 'iid', got {self.mode!r}")
        object.__setattr__(self, "m", check_records_per_person(self.m))
        if self.mode == "summary" and self.m != 1:
            raise InvalidParameterError("m is only used in mode 'iid' (summary mode uses m = 1)")
        if self.budget_mode not in ("parallel", "sequential"):
            raise InvalidParameterError(f"budget_mode must be 'parallel' or 'sequential', got {self.budget_mode!r}")
        if self.scales is not None:
            object.__setattr__(self, "scales", tuple(float(s) for s in check_scales(self.scales, self.d)))  # type: ignore[union-attr]  # check_scales returns an array for a given list
        if self.expected_persons is not None:
            n = self.expected_persons
            if isinstance(n, bool) or not isinstance(n, (int, float)) or not (math.isfinite(n) and n >= 1):
                raise InvalidParameterError(f"expected_persons must be a number >= 1, got {n!r}")
        fr = dict(self.fractions) if self.fractions is not None else dict(self._default_fractions())
        needed = set(self._stage_names())
        if set(fr) != needed:
            raise InvalidParameterError(f"fractions must name exactly the stages {sorted(needed)}, got {sorted(fr)}")
        if any(not (isinstance(v, (int, float)) and v > 0) for v in fr.values()) or abs(sum(fr.values()) - 1.0) > 1e-9:
            raise InvalidParameterError(f"fractions must be positive and sum to 1, got {fr!r}")
        object.__setattr__(self, "fractions", tuple((s, float(fr[s])) for s in self._stage_names()))

    # -- structure ------------------------------------------------------------------------

    @property
    def private_scales(self) -> bool:
        return self.scales is None

    @property
    def m_model(self) -> int:
        return self.m if self.mode == "iid" else 1

    def _stage_names(self) -> list[str]:
        names = [] if self.expected_persons is not None else [STAGE_COUNT]
        if self.private_scales:
            return names + [STAGE_RANGES, STAGE_COARSE, STAGE_TCN, STAGE_SCALES, STAGE_FINAL]
        return names + [STAGE_COARSE, STAGE_TCN, STAGE_FINAL]

    def _default_fractions(self) -> dict[str, float]:
        base = dict(DEFAULT_FRACTIONS_PRIVATE if self.private_scales else DEFAULT_FRACTIONS_DECLARED)
        if self.expected_persons is None:
            base = {s: v * (1.0 - COUNT_FRACTION) for s, v in base.items()}
            base = {STAGE_COUNT: COUNT_FRACTION, **base}
        return base

    @property
    def stage_names(self) -> list[str]:
        return self._stage_names()

    @property
    def groups(self) -> dict[str, GroupRange]:
        """Persons each stage reads: all of ``group`` (sequential) or its hash range (parallel)."""
        names = self._stage_names()
        if self.budget_mode == "sequential":
            return {s: self.group for s in names}
        parts = self.group.split([f for _, f in self.fractions])  # type: ignore[union-attr]  # fractions set in __post_init__
        return dict(zip(names, parts))

    @property
    def stage_budgets(self) -> dict[str, Budget]:
        eps, delta = self.budget.epsilon, self.budget.delta
        names = self._stage_names()
        if self.budget_mode == "parallel":
            # the count is a Laplace release: it needs no delta
            return {s: Budget(eps, 0.0 if s == STAGE_COUNT else delta) for s in names}
        # sequential (default): every stage reads all persons; epsilon and delta split by the
        # stage fractions (most to the final stage); the count needs no delta, the coarse
        # stage takes its delta share
        fr = dict(self.fractions)  # type: ignore[arg-type]  # fractions set in __post_init__
        out = {s: Budget(eps * fr[s], 0.0 if s == STAGE_COUNT else delta * fr[s]) for s in names}
        if STAGE_COUNT in fr:
            out[STAGE_COARSE] = Budget(out[STAGE_COARSE].epsilon, out[STAGE_COARSE].delta + delta * fr[STAGE_COUNT])
        return out

    def charges(self, prefix: str = "") -> list[Charge]:
        """Stage charges in order (the TCN stage as one charge on its whole group); the privacy
        cost before any data is read. At run time the TCN charge is made per layer on disjoint
        sub-ranges (parallel) or as equal shares (sequential): the same composed cost."""
        groups, budgets = self.groups, self.stage_budgets
        return [
            Charge(f"{prefix}{s}", budgets[s], groups[s] if self.budget_mode == "parallel" else self.group)
            for s in self._stage_names()
        ]

    def cost(self) -> Budget:
        eps, delta = composed_cost(self.charges())
        return Budget(eps, delta)

    def describe(self) -> dict:
        groups, budgets = self.groups, self.stage_budgets
        return {
            "budget_mode": self.budget_mode,
            "mode": self.mode,
            "m": self.m_model,
            "k": self.k,
            "d": self.d,
            "scales": list(self.scales) if self.scales is not None else "private",
            "expected_persons": self.expected_persons,
            "stages": [
                {
                    "stage": s,
                    "persons": [groups[s].lo, groups[s].hi],
                    "epsilon": budgets[s].epsilon,
                    "delta": budgets[s].delta,
                }
                for s in self._stage_names()
            ],
        }


# ---------------------------------------------------------------------------------------------
# Mechanisms
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClipRelease:
    """DP output of :func:`clip_and_noise` (post-processing of one Gaussian release)."""

    center: np.ndarray  # new centre, data units, shape (d,)
    sigma: float  # Gaussian sigma of the released sum, normalised units
    n_noisy: float
    denom: float


def clip_and_noise(
    backend: Aggregates,
    columns: Sequence[str],
    center: np.ndarray,
    radius: float,
    scales: np.ndarray,
    group: GroupRange,
    budget: Budget,
    noise: NoiseSource,
) -> ClipRelease:
    """ClipAndNoise (Algorithm 2, with the add/remove count of docs/privacy/multivariate_mean.md): one Gaussian
    release of ``(S, w n)``.

    ``S = sum_i clip_{radius}((Y_i - center) / scales)`` (l2 ball, normalised units, fixed point)
    and ``w = radius / 4``. The new centre is ``center + scales * S~ / max(N~, 1)``.

    The caller must have charged ``budget`` on ``group``; ``center``, ``radius``, ``scales``
    must be public (DP outputs or constants).

    Privacy
    -------
    (epsilon, delta)-DP under add/remove: the l2 sensitivity of ``(S, w n)`` is
    ``sqrt(rho_q^2 + w^2)`` with ``rho_q`` the fixed-point bound of
    :func:`dplib.aggregates.clipped_sum_l2_sensitivity`, inflated for float rounding; the exact
    vector is clamped to +-1e306 (1-Lipschitz); analytic Gaussian (Balle & Wang 2018).
    """
    d = len(columns)
    w = COUNT_WEIGHT * radius
    exact_sum, exact_count = backend.clipped_sum(columns, center, radius, group, scales=scales)
    exact = clamp_exact(np.concatenate([np.asarray(exact_sum, dtype=np.float64), [w * exact_count]]))
    sens = inflate(math.hypot(clipped_sum_l2_sensitivity(radius, d), w))
    noisy, sigma = gaussian_mechanism(exact, sens, budget.epsilon, budget.delta, noise)
    del exact_sum, exact_count, exact
    n_noisy = float(noisy[-1]) / w
    denom = max(n_noisy, 1.0)
    new_center = np.asarray(center, dtype=np.float64) + scales * (noisy[:-1] / denom)
    return ClipRelease(new_center, float(sigma), n_noisy, denom)


def coarse_estimate(
    backend: Aggregates,
    columns: Sequence[str],
    group: GroupRange,
    budget: Budget,
    noise: NoiseSource,
    bin_widths: Sequence[float],
    offsets: Sequence[float],
) -> np.ndarray | None:
    """CoarseEstimate (Appendix A.5, Theorem 4.19): d thresholded histograms on one group.

    One backend pass returns the d exact histograms; each gets the stability histogram
    (Laplace(1/epsilon'), threshold ``1 + ln(1/(2 delta'))/epsilon'``) with the per-coordinate
    budget of :func:`coordinate_budget`; the centre is the midpoint of each noisy argmax bin.

    Returns
    -------
    u0 of shape (d,) in data units, or None (some
    coordinate released no bin: the paper's bottom).

    Privacy
    -------
    (epsilon, delta)-DP under add/remove by the composition of :func:`coordinate_budget`.
    """
    eps_j, delta_j = coordinate_budget(budget.epsilon, budget.delta, len(columns))
    exact = backend.histograms(columns, bin_widths, offsets, group)
    u0 = np.empty(len(columns))
    for j, (counts, w, off) in enumerate(zip(exact, bin_widths, offsets)):
        released, _, _ = thresholded_histogram(counts, eps_j, delta_j, noise)
        if not released:
            return None
        j_star = max(released, key=lambda b: (released[b], -b))
        u0[j] = off + (j_star + 0.5) * w
    del exact
    return u0



@dataclass(frozen=True)
class SignedProfile:
    """Noisy histogram of ``x = Y_j - center`` on signed quarter-octave bins (DP or public)."""

    lower: np.ndarray  # real-line lower edge of each bin, ascending
    upper: np.ndarray
    weights: np.ndarray  # noisy counts, zeroed below the noise floor

    def quantile(self, q: float) -> tuple[float, float]:
        """``[lo, hi]`` edges of the bin where the noisy CDF first reaches ``q`` (post-processing)."""
        total = float(np.sum(self.weights))
        if total <= 0:
            return float(self.lower[0]), float(self.upper[-1])
        cdf = np.cumsum(self.weights) / total
        i = int(min(np.searchsorted(cdf, q, side="left"), len(cdf) - 1))  # type: ignore[call-overload]  # min of two ints
        return float(self.lower[i]), float(self.upper[i])


#: Sub-octave edges of the signed scale profile: half octaves (fuller bins than quarter octaves, so
#: fewer are lost under the noise floor; the scale is resolved to a factor sqrt(2)).
HALF_OCTAVE = (2.0**0.5,)


def signed_profile(
    counts: dict[int, int],
    epsilon: float,
    noise: NoiseSource,
    low: float,
    high: float,
    sub_edges=HALF_OCTAVE,
    floor_beta: float = FLOOR_BETA,
) -> SignedProfile:
    """Laplace(1/epsilon) on every signed quarter-octave bin of ``x = Y_j - center`` from ``low``
    to ``high`` (public; rounded out to powers of two), with one centre bin ``|x| < low`` and one
    overflow bin per side (per-person transforms of the exact counts of
    ``Aggregates.log_histograms(..., sub_edges)``).

    Privacy
    -------
    epsilon-DP under add/remove: a fixed public bin set, each person in exactly one bin.
    """
    if not (0 < low < high and math.isfinite(high)):
        raise InvalidParameterError(f"need 0 < low < high < inf, got {low!r}, {high!r}")
    e_lo = max(int(math.floor(math.log2(low))), MIN_EXPONENT + 1)
    e_hi = min(int(math.ceil(math.log2(high))), 996)
    n_sub = len(sub_edges) + 1
    n_inner = (e_hi - e_lo) * n_sub
    mags = [math.ldexp(edge, e) for e in range(e_lo, e_hi) for edge in (1.0,) + tuple(sub_edges)]
    mags.append(math.ldexp(1.0, e_hi))  # n_inner + 1 magnitude edges
    # bins along the line: [-inf, -top), negative inner (descending magnitude), centre, positive
    # inner (ascending), [top, inf)
    dense = np.zeros(2 * n_inner + 3)
    centre = n_inner + 1
    for key, c in counts.items():
        if key == 0:
            dense[centre] += c
            continue
        idx = abs(key) - 1
        e = MIN_EXPONENT + idx // n_sub
        pos = (e - e_lo) * n_sub + idx % n_sub  # inner index by magnitude; < 0 below low
        if pos < 0:
            dense[centre] += c
        elif pos >= n_inner:
            dense[0 if key < 0 else 2 * n_inner + 2] += c
        else:
            dense[centre - 1 - pos if key < 0 else centre + 1 + pos] += c
    noisy, scale = pure_dp_histogram(dense, epsilon, noise)
    # noise floor: with probability 1 - floor_beta no empty bin's noise exceeds it
    floor = scale * math.log(len(dense) / floor_beta)
    top = mags[-1]
    neg_lo = [-mags[i + 1] for i in reversed(range(n_inner))]
    neg_hi = [-mags[i] for i in reversed(range(n_inner))]
    lower = np.array([-2.0 * top] + neg_lo + [-mags[0]] + mags[:-1] + [top])
    upper = np.array([-top] + neg_hi + [mags[0]] + mags[1:] + [2.0 * top])
    return SignedProfile(lower, upper, np.where(noisy > floor, noisy, 0.0))

# ---------------------------------------------------------------------------------------------
# The estimator
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class VectorMeanRelease:
    """What the multivariate estimator releases; every number is DP or public.

    Attributes
    ----------
    status : "OK" or "INSUFFICIENT_DATA"
    estimate : ndarray (d,) or None, data units
    error_bar : ndarray (d,) or None
        Per-coordinate half-width of a 90% interval for the Gaussian noise of the final stage
        (data units); ``parameters["model_error_bound_l2"]`` holds the model-based l2 bound.
    noise_scale : ndarray (d,) or None
        Standard deviation of the final noise on each coordinate of the estimate (data units).
    epsilon, delta : float
        Composed cost charged.
    parameters : dict
        Public plan and DP by-products (scales, coarse centre, schedule, radii, noisy count).
    """

    status: str
    estimate: np.ndarray | None
    error_bar: np.ndarray | None
    error_level: float
    error_covers: str
    noise_scale: np.ndarray | None
    epsilon: float
    delta: float
    parameters: dict = field(default_factory=dict)
    #: The scale-free estimator's norm model (:class:`dplib.mean.scale_free_multivariate.NormModel`,
    #: DP post-processing), for a later stage that clips at a radius of its own; None otherwise.
    #: Not written to any table.
    norm_model: object = field(default=None, repr=False, compare=False)


def multivariate_person_mean(
    backend: Aggregates,
    columns: Sequence[str],
    plan: MultivariateMeanPlan,
    noise: NoiseSource,
    accountant: Accountant | None = None,
    stage_prefix: str = "",
) -> VectorMeanRelease:
    """Private mean over persons of each person's mean vector of ``columns``.

    Parameters
    ----------
    backend : Aggregates
        Exact aggregates over person summaries (numpy or Spark); persons missing any of
        ``columns`` are left out.
    columns : sequence of d str
    plan : MultivariateMeanPlan
    noise : NoiseSource
    accountant : Accountant, optional
        Charged before each stage reads its persons; default: limited to ``plan.budget``.

    Returns
    -------
    VectorMeanRelease
        Estimate of shape (d,) in data units, or ``INSUFFICIENT_DATA`` when a histogram stage
        releases nothing (budget spent so far stays spent).

    Raises
    ------
    InvalidParameterError
        If ``len(columns) != plan.d`` or columns repeat.
    BudgetExceededError
        Before any stage runs, if the plan does not fit the accountant.

    Privacy
    -------
    Add/remove one person. Each stage is (epsilon_s, delta_s)-DP on its persons (see the module
    table); every radius, centre, scale and the schedule are post-processing of earlier DP
    outputs and public inputs. Parallel mode: (epsilon, delta) overall (disjoint fixed hash
    ranges); sequential: the paper's epsilon/2 + epsilon/4 + epsilon/4.

    References
    ----------
    Agarwal et al. 2024, Algorithms 2-4, Theorems 4.3, 4.15, 4.19; Appendix A.5;
    docs/privacy/multivariate_mean.md.
    """
    columns = list(columns)
    if len(columns) != plan.d:
        raise InvalidParameterError(f"the plan is for d={plan.d} columns, got {len(columns)}: {columns}")
    if len(set(columns)) != len(columns):
        raise InvalidParameterError(f"columns must be distinct, got {columns}")
    check = getattr(backend, "check_columns", None)
    if check is not None:
        check(columns)  # an unknown column is refused before anything is charged
    accountant = accountant if accountant is not None else Accountant(plan.budget)
    charges = {c.stage[len(stage_prefix):]: c for c in plan.charges(stage_prefix)}
    accountant.check(list(charges.values()))
    start = len(accountant.charges)
    params = plan.describe()
    groups, budgets = plan.groups, plan.stage_budgets
    d, m, k = plan.d, plan.m_model, plan.k
    sqrt_m = math.sqrt(m)

    def charge(stage: str) -> None:
        c = charges[stage]
        accountant.charge(c.stage, c.budget, c.group)

    def insufficient(reason: str) -> VectorMeanRelease:
        eps, delta = composed_cost(accountant.charges[start:])
        return VectorMeanRelease(
            STATUS_INSUFFICIENT, None, None, ERROR_LEVEL, f"none: {reason}", None, eps, delta, params
        )

    # 0. persons (public or DP)
    if plan.expected_persons is not None:
        n_hat = float(plan.expected_persons)
    else:
        charge(STAGE_COUNT)
        g = groups[STAGE_COUNT]
        exact = clamp_exact(np.array([float(backend.count(columns, g))]))
        noisy, _ = laplace_mechanism(exact, inflate(1.0), budgets[STAGE_COUNT].epsilon, noise)
        del exact
        n_hat = max(float(noisy[0]), 1.0) * plan.group.fraction / g.fraction
        params["noisy_person_count"] = round(n_hat, 1)

    def persons(stage: str) -> float:
        return n_hat * groups[stage].fraction / plan.group.fraction

    # 1-2. coarse centre (and, without declared scales, a rough scale for the TCN)
    if not plan.private_scales:
        scales = np.array(plan.scales)
        widths = bin_width_constant(k) * scales / sqrt_m
        charge(STAGE_COARSE)
        out = coarse_estimate(backend, columns, groups[STAGE_COARSE], budgets[STAGE_COARSE], noise, widths, [0.0] * d)  # type: ignore[arg-type]  # an array of floats
        if out is None:
            return insufficient(
                "a coarse histogram released no bin (too few persons for this budget and d, or the "
                "declared scales are far too small)"
            )
        u0 = out
        r0 = coarse_error_bound(widths / scales)
    else:
        charge(STAGE_RANGES)
        b = budgets[STAGE_RANGES]
        eps_j, delta_j = coordinate_budget(b.epsilon, b.delta, d)
        exact_logs = backend.log_histograms(columns, [0.0] * d, groups[STAGE_RANGES])
        ranges = [
            magnitude_range_from_counts(h, eps_j, delta_j, noise, RANGE_QUANTILE, octaves=RANGE_OCTAVES) for h in exact_logs
        ]
        del exact_logs
        if any(r is None for r in ranges):
            return insufficient(
                "a coordinate's magnitude histogram released no bucket (too few persons for the "
                "private scales at this budget and d; or declare options.scales)"
            )
        lowers = np.array([r.lower for r in ranges])  # type: ignore[union-attr]  # None ranges returned above
        widths = np.array([max(r.upper - r.lower, 0.0) for r in ranges]) / BINS_PER_RANGE  # type: ignore[union-attr]  # None ranges returned above
        widths = np.where(widths > 0, widths, 1.0)  # a degenerate (zero-width) range: unit bins
        params["coordinate_ranges"] = [[float(r.lower), float(r.upper)] for r in ranges]  # type: ignore[union-attr]  # None ranges returned above
        charge(STAGE_COARSE)
        out = coarse_estimate(backend, columns, groups[STAGE_COARSE], budgets[STAGE_COARSE], noise, widths, lowers)  # type: ignore[arg-type]  # arrays of floats
        if out is None:
            return insufficient("a coarse histogram released no bin (too few persons for this budget and d)")
        u0 = out
        # rough scales for the TCN: the coarse bin widths (person-mean units; x sqrt(m) in iid mode)
        scales = widths * sqrt_m
        r0 = coarse_error_bound(widths / scales)  # type: ignore[arg-type]  # an array of floats
    params["coarse_center"] = [float(x) for x in u0]
    params["coarse_error_bound"] = r0

    # 3. plan the threads (public / DP inputs only), then the layers on disjoint sub-ranges
    schedule = plan_threads(
        persons(STAGE_TCN), persons(STAGE_FINAL), d, m, k, budgets[STAGE_TCN], budgets[STAGE_FINAL], r0, plan.budget_mode
    )
    params["schedule"] = schedule.describe()
    T = schedule.threads
    layer_groups = groups[STAGE_TCN].split([1.0 / T] * T) if plan.budget_mode == "parallel" else [plan.group] * T
    tcn_charge = charges[STAGE_TCN]
    layer_budget = budgets[STAGE_TCN] if plan.budget_mode == "parallel" else budgets[STAGE_TCN].scaled(1.0 / T)
    center = u0
    layers = []
    for t, (g_t, rho_t) in enumerate(zip(layer_groups, schedule.radii), start=1):
        accountant.charge(
            f"{tcn_charge.stage} layer {t}/{T}", layer_budget, g_t if plan.budget_mode == "parallel" else plan.group
        )
        rel = clip_and_noise(backend, columns, center, rho_t, scales, g_t, layer_budget, noise)
        center = rel.center
        layers.append({"radius": rho_t, "center": [float(x) for x in center]})
    params["tcn_layers"] = layers
    rho_star, model_bound = schedule.final_radius, schedule.final_bound

    # 4. without declared scales: per-coordinate scales around the contracted centre
    if plan.private_scales:
        charge(STAGE_SCALES)
        b = budgets[STAGE_SCALES]
        eps_j, _ = coordinate_budget(b.epsilon, b.delta, d)
        exact_dev = backend.log_histograms(columns, list(center), groups[STAGE_SCALES], HALF_OCTAVE)
        sc, offsets = [], []
        for h, w in zip(exact_dev, widths):
            profile = signed_profile(
                h, eps_j, noise, w * 2.0**-PROFILE_OCTAVES_BELOW, w * 2.0**PROFILE_OCTAVES_ABOVE
            )
            # the interquartile range, robust to an offset of the TCN centre and to a noise spike
            # in a far bin; scaled to the 0.9-quantile of |Y - mu| of a normal (1.645 / 0.6745)
            lo, _ = profile.quantile(0.25)
            _, hi = profile.quantile(0.75)
            sc.append(max(hi - lo, 0.0) / 2.0 * IQR_TO_SCALE)
            # the bin holding the median of Y_j - u_T,j bounds the centre's offset (up to the
            # mean-median gap, at most one standard deviation)
            lo_m, hi_m = profile.quantile(0.5)
            offsets.append(max(abs(lo_m), abs(hi_m)))
        del exact_dev
        # the profile's resolution is its lowest edge: a constant coordinate gets that scale
        refined = np.maximum(np.array(sc), widths * 2.0**-PROFILE_OCTAVES_BELOW) * sqrt_m
        # A-priori bound on the TCN centre's error in the refined units, read off the same DP
        # profiles: the median's bin edge plus one standard deviation (sd = scale / 1.645 for
        # normal person means) per coordinate. Post-processing of DP outputs.
        person_scale = refined / sqrt_m
        r_T = float(np.linalg.norm(np.array(offsets) / person_scale / sqrt_m + 1.0 / 1.6448536269514722 / sqrt_m))
        final = ErrorModel(persons(STAGE_FINAL), d, m, k, budgets[STAGE_FINAL].epsilon, budgets[STAGE_FINAL].delta, 1)
        rho_star = final.balanced_radius(r_T, floor_radius(d, m))
        model_bound = final.bound(rho_star, r_T)
        params["tcn_scales"] = [float(x) for x in scales]
        scales = refined
    params["scales_used"] = [float(s) for s in scales]

    # 5. final clip-and-noise
    charge(STAGE_FINAL)
    fin = clip_and_noise(backend, columns, center, rho_star, scales, groups[STAGE_FINAL], budgets[STAGE_FINAL], noise)
    noise_sd = fin.sigma / fin.denom * scales  # data units, per coordinate
    z = float(np.sqrt(chi2.ppf(ERROR_LEVEL, df=1)))
    error_bar = z * noise_sd
    eps, delta = composed_cost(accountant.charges[start:])
    params.update(
        {
            "final_radius": rho_star,
            "count_weight": COUNT_WEIGHT * rho_star,
            "final_noisy_person_count": round(fin.n_noisy, 1),
            "noise_sd": [float(x) for x in noise_sd],
            "model_error_bound_l2": model_bound,
            "model_error_bound_units": "normalised (divide each coordinate by scales_used)",
            "radius_units": "normalised (l2 ball after dividing coordinate j by scales_used[j])",
        }
    )
    covers = (
        "the Gaussian noise of the final stage only, per coordinate, at 90%; not the clipping bias "
        "nor the sampling of persons into the final group (parameters.model_error_bound_l2 is a "
        "model-based l2 bound in normalised units, valid only under the k-th moment assumption)"
    )
    return VectorMeanRelease(STATUS_OK, fin.center, error_bar, ERROR_LEVEL, covers, noise_sd, eps, delta, params)
