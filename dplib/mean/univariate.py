"""Univariate person-level mean: coarse RangeEstimator, then centred clip-and-noise.

Agarwal, Kamath, Majid, Mouzakis, Silver, Ullman 2024, *Private Mean Estimation with
Person-Level Differential Privacy*: Algorithm 1 (RangeEstimator, Theorem 3.10), the fine
estimate of Lemma 3.12 and their assembly in Theorem 3.14 (Sections 3.3-3.4; the algorithm box
is an image in our copy of the paper and is rebuilt from its text), with the add/remove
adaptations of docs/privacy/person_level_mean.md.

Steps (names follow the paper):

1. Split the statistic's persons into two fixed hash ranges: A (coarse) and B (fine).
2. ``mu_c <- RangeEstimator(A)``: a private histogram of person means with bin width
   ``r = c_r(k) s / sqrt(m)``; the midpoint of the noisy argmax bin. Approximate DP (delta > 0):
   thresholded histogram over the infinite lattice; pure DP: Laplace on every bin of
   ``[-R - 2r, R + 2r]``. No bin above the threshold -> status ``INSUFFICIENT_DATA``.
3. ``u = 1.5 r``; ``rho = u + s * max(1-ish floor, (n_B eps_B)^(1/k) / m^(1-1/k))`` with a DP
   estimate of ``n_B`` read off the coarse histogram's noisy counts (post-processing).
4. Release ``(sum_{i in B} (trunc(Y_i) - mu_c), c * n_B)`` with Laplace noise of scale
   ``(rho + c) / eps_B`` (l1 sensitivity ``rho + c`` under add/remove; ``c`` from
   :func:`count_weight`), and
   return ``mu_c + S~ / max(N~, 1)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from dplib.budget import Accountant, Budget, Charge, composed_cost
from dplib.errors import InvalidParameterError
from dplib.groups import ALL_PERSONS, GroupRange
from dplib.mean.error_bars import ERROR_LEVEL, laplace_sum_quantile, noise_and_sampling_quantile
from dplib.mean.params import (
    check_moment_order,
    check_positive,
    check_records_per_person,
    coarse_bin_width,
    fine_radius,
)
from dplib.mechanisms import NoiseSource, clamp_exact, inflate, laplace_mechanism, pure_dp_histogram, thresholded_histogram
from dplib.seam import Aggregates

ALGORITHM = "agarwal2024-univariate-person-mean"
ALGORITHM_VERSION = "1"
STATUS_OK = "OK"
STATUS_INSUFFICIENT = "INSUFFICIENT_DATA"
#: Largest number of bins of the pure-DP coarse histogram (``(2R + 4r) / r``).
MAX_PURE_BINS = 1_000_000
#: ``coarse_fraction`` (the coarse stage's share) lies in ``[COARSE_FRACTION_LIMITS[0], COARSE_FRACTION_LIMITS[1]]``.
COARSE_FRACTION_LIMITS = (0.05, 0.95)


@dataclass(frozen=True)
class UnivariateMeanPlan:
    """The public plan of one univariate person-level mean: groups, budgets, bin width.

    Built from public inputs only, before any data is read; :meth:`charges` is the privacy cost.

    Parameters
    ----------
    budget : Budget
        The statistic's budget (epsilon, delta). delta > 0 selects the thresholded (approximate
        DP) coarse histogram; delta == 0 the pure one, which needs ``range_bound``.
    scale : float
        Public scale ``s`` in data units: a bound on ``(E|Y - mu|^k)^(1/k)`` for person means
        (summary mode, m = 1) or for single records (``m > 1``, records i.i.d. within persons).
    k : float, default 4
        Moment order (>= 2, or inf).
    m : int, default 1
        Records per person used in the formulas (1 in summary mode; ``m_min`` otherwise).
    range_bound : float, optional
        Public bound R with ``|mu| <= R`` (pure DP only).
    budget_mode : {"sequential", "parallel"}
        ``sequential`` (default): epsilon/2 to each stage, both reading all of ``group``.
        ``parallel`` (library only; the job no longer offers it): each stage gets the whole
        budget on its own fixed hash range (coarse_fraction / the rest), valid by parallel
        composition under add/remove.
    coarse_fraction : float, default 0.25
        Share of the hash range given to the coarse stage. The paper leaves it open (we first
        used 1/2); on flights 1/4 gave 1.6x smaller errors (benchmarks/demo_accuracy.py):
        the coarse histogram needs only a few multiples of its threshold.
    group : GroupRange, default all persons
        The persons this statistic may read.

    Raises
    ------
    InvalidParameterError
        On any parameter outside its range, or a pure-DP plan without ``range_bound``.
    """

    budget: Budget
    scale: float
    k: float = 4.0
    m: int = 1
    range_bound: float | None = None
    budget_mode: Literal["parallel", "sequential"] = "sequential"
    coarse_fraction: float = 0.25
    group: GroupRange = ALL_PERSONS

    def __post_init__(self) -> None:
        if not isinstance(self.budget, Budget):
            raise InvalidParameterError("budget must be a dplib.budget.Budget")
        object.__setattr__(self, "scale", check_positive(self.scale, "scale"))
        object.__setattr__(self, "k", check_moment_order(self.k))
        object.__setattr__(self, "m", check_records_per_person(self.m))
        if self.budget_mode not in ("parallel", "sequential"):
            raise InvalidParameterError(
                f"budget_mode must be 'parallel' or 'sequential', got {self.budget_mode!r}"
            )
        lo, hi = COARSE_FRACTION_LIMITS
        cf = self.coarse_fraction
        if isinstance(cf, bool) or not isinstance(cf, (int, float)) or not (lo <= cf <= hi):
            raise InvalidParameterError(f"coarse_fraction must be in [{lo}, {hi}], got {cf!r}")
        # every public quantity the stages use must be a finite, normal number (a scale of 1e308 gave
        # an infinite bin width after the reservation; a subnormal one loses all precision)
        if not (1e-300 <= self.bin_width and math.isfinite(self.coarse_error_bound) and self.coarse_error_bound < 1e300):
            raise InvalidParameterError(
                f"scale {self.scale!r} gives a bin width {self.bin_width!r} and a coarse error bound "
                f"{self.coarse_error_bound!r} outside [1e-300, 1e300]: declare the scale in other units"
            )
        if self.budget.delta == 0.0:
            if self.range_bound is None:
                raise InvalidParameterError(
                    "delta = 0 (pure DP) needs a public range_bound R with |mean| <= R; "
                    "give one, or use delta > 0"
                )
            object.__setattr__(self, "range_bound", check_positive(self.range_bound, "range_bound"))
            if self.n_pure_bins > MAX_PURE_BINS:
                raise InvalidParameterError(
                    f"range_bound / bin width gives {self.n_pure_bins} bins (max {MAX_PURE_BINS}); "
                    "use a smaller range_bound or delta > 0"
                )

    # ----- public quantities -------------------------------------------------------------
    @property
    def coarse_group(self) -> GroupRange:
        """Persons the coarse stage reads: its hash range (parallel) or all of ``group``."""
        if self.budget_mode == "sequential":
            return self.group
        return self.group.split([self.coarse_fraction, 1.0 - self.coarse_fraction])[0]

    @property
    def fine_group(self) -> GroupRange:
        """Persons the fine stage reads: its hash range (parallel) or all of ``group``."""
        if self.budget_mode == "sequential":
            return self.group
        return self.group.split([self.coarse_fraction, 1.0 - self.coarse_fraction])[1]

    @property
    def bin_width(self) -> float:
        """Coarse bin width r, data units."""
        return coarse_bin_width(self.scale, self.k, self.m)

    @property
    def coarse_error_bound(self) -> float:
        """A-priori bound u = 1.5 r on |mu_c - mu| (midpoint of a bin within mu +- 2r)."""
        return 1.5 * self.bin_width

    @property
    def n_pure_bins(self) -> int:
        r = coarse_bin_width(self.scale, self.k, self.m)
        return int(math.ceil((2.0 * float(self.range_bound) + 4.0 * r) / r))  # type: ignore[arg-type]  # set for the pure plan (checked in __post_init__)

    @property
    def coarse_budget(self) -> Budget:
        eps = self.budget.epsilon if self.budget_mode == "parallel" else self.budget.epsilon / 2
        return Budget(eps, self.budget.delta)

    @property
    def fine_budget(self) -> Budget:
        eps = self.budget.epsilon if self.budget_mode == "parallel" else self.budget.epsilon / 2
        return Budget(eps, 0.0)

    def charge_group(self, stage_group: GroupRange) -> GroupRange:
        """The persons a stage is charged on: its own range in parallel mode; the statistic's
        whole group in sequential mode (the paper's accounting, which also holds under
        replace-one neighbouring, where a replaced person may change range)."""
        return stage_group if self.budget_mode == "parallel" else self.group

    def charges(self, prefix: str = "") -> list[Charge]:
        """The charges this plan makes, in order: the privacy cost before any data is read."""
        return [
            Charge(f"{prefix}coarse range estimator", self.coarse_budget, self.charge_group(self.coarse_group)),
            Charge(f"{prefix}fine clip-and-noise", self.fine_budget, self.charge_group(self.fine_group)),
        ]

    def cost(self) -> Budget:
        """The composed cost of :meth:`charges` (equals ``budget`` in both modes)."""
        eps, delta = composed_cost(self.charges())
        return Budget(eps, delta) if eps > 0 else self.budget

    def describe(self) -> dict:
        """Public parameters, JSON-friendly (no data-dependent value)."""
        return {
            "budget_mode": self.budget_mode,
            "k": self.k,
            "m": self.m,
            "scale": self.scale,
            "range_bound": self.range_bound,
            "coarse_group": [self.coarse_group.lo, self.coarse_group.hi],
            "fine_group": [self.fine_group.lo, self.fine_group.hi],
            "coarse_epsilon": self.coarse_budget.epsilon,
            "coarse_delta": self.coarse_budget.delta,
            "fine_epsilon": self.fine_budget.epsilon,
            "bin_width": self.bin_width,
            "coarse_error_bound": self.coarse_error_bound,
            "coarse_histogram": "pure (Laplace on all bins)" if self.budget.delta == 0 else "thresholded",
        }


@dataclass(frozen=True)
class MeanRelease:
    """What the univariate estimator releases. Every number in it is DP or public.

    Attributes
    ----------
    status : "OK" or "INSUFFICIENT_DATA"
    estimate : float or None
        The private mean, data units (None unless status is OK).
    error_bar : float or None
        Half-width of a ``error_level`` interval for the noise of the fine stage (see
        ``error_covers``), data units.
    noise_scale : float or None
        Laplace scale of the released centred sum, data units.
    epsilon, delta : float
        Composed cost actually charged (the coarse stage alone when it found no bin).
    parameters : dict
        Public plan parameters plus DP by-products (coarse centre, radius, noisy count).
    """

    status: str
    estimate: float | None
    error_bar: float | None
    error_level: float
    error_covers: str
    noise_scale: float | None
    epsilon: float
    delta: float
    parameters: dict = field(default_factory=dict)


def count_weight(rho: float, u: float) -> float:
    """Weight ``c`` of the count released beside the centred sum: ``(S, c n)``.

    The l1 sensitivity is ``rho + c``; the error of ``mu_c + S~/N~`` is about
    ``(e_S - d e_N) / n`` with ``d = mean(trunc(Y)) - mu_c``, ``|d| <= u + ...``, Laplace scales
    ``(rho + c)/eps`` and ``(rho + c)/(c eps)``. Its variance ``(rho + c)^2 (1 + d^2/c^2)`` is
    smallest at ``c = (d^2 rho)^(1/3)``; we plug in the public worst case ``d = u``. Accuracy
    only (public inputs); privacy uses whatever ``c`` is chosen. (A first choice was rho/8.)
    """
    # u^(2/3) rho^(1/3), not (u^2 rho)^(1/3): the product overflows for values above ~1e102
    return float(max(u ** (2.0 / 3.0) * rho ** (1.0 / 3.0), rho / 8.0))


@dataclass(frozen=True)
class FineRelease:
    """DP outputs of :func:`centred_clip_and_noise` (all post-processing of one Laplace release)."""

    estimate: float
    deviation: float  # S~ / max(N~, 1)
    n_noisy: float
    denom: float  # max(N~, 1)
    scale: float  # Laplace scale of the sum, data units
    #: :func:`centred_clip_and_noise` with ``split`` only: the noisy count of persons at or beyond the
    #: radius (persons; its Laplace scale is ``scale / count_weight_``); N~ is then the sum of two
    #: noisy counts
    n_clipped: float | None = None

    def noise_quantile(self, count_weight_: float, level: float = ERROR_LEVEL) -> float:
        """The ``level`` quantile of ``|(e_S - d e_N) / N~|``, the release's Laplace noise on the
        deviation (``e_S`` of scale ``scale``, ``e_N`` of ``scale / count_weight_``, or the sum of
        two such terms for a split count; the released deviation as ``d``):
        :func:`noise_and_sampling_quantile` / :func:`laplace_sum_quantile`. Post-processing only."""
        a = self.scale / self.denom
        b = (abs(self.deviation) / count_weight_) * a
        if self.n_clipped is not None:
            return float(laplace_sum_quantile([a, b, b], level) if b > 0 else laplace_sum_quantile([a], level))
        return float(noise_and_sampling_quantile(a, b, 0.0, level))


def centred_clip_and_noise(
    backend: Aggregates,
    column: str,
    center: float,
    radius: float,
    count_weight_: float,
    group: GroupRange,
    epsilon: float,
    noise: NoiseSource,
    split: bool = False,
) -> FineRelease:
    """Fine stage: release ``(sum_i trunc(Y_i - center, radius), w n)`` with Laplace noise.

    ``split``: release the count as two, ``(w n_within, w n_clipped)``, ``n_clipped`` the persons
    with ``|Y_i - center| >= radius`` (:meth:`Aggregates.clipped_sum_split`); ``N~`` is the sum of
    the two noisy counts and ``FineRelease.n_clipped`` the second, which a tail model can be
    checked against (post-processing). A person is in exactly one of the two counts: the same
    l1 sensitivity.

    The caller must have charged ``epsilon`` on ``group``. ``center``, ``radius`` and ``w`` must
    be public (DP outputs or constants).

    Privacy
    -------
    epsilon-DP under add/remove: the fixed-point centred sum moves by at most ``radius`` and
    ``w n`` by ``w`` (l1 sensitivity ``radius + w``, inflated by the float-rounding margin); the
    exact vector is clamped to +-1e306 first (1-Lipschitz). Lemma 3.12 of Agarwal et al. 2024
    with a DP denominator (docs/privacy/person_level_mean.md).
    """
    w = count_weight_
    if split:
        total, n_within, n_clipped = backend.clipped_sum_split(column, center, radius, group)
        exact = clamp_exact(np.array([float(total), w * n_within, w * n_clipped]))
        del total, n_within, n_clipped
    else:
        exact_sum, exact_count = backend.clipped_sum([column], np.array([center]), radius, group)
        exact = clamp_exact(np.array([float(exact_sum[0]), w * exact_count]))
        del exact_sum, exact_count
    noisy, scale = laplace_mechanism(exact, inflate(radius + w), epsilon, noise)
    del exact
    s_noisy, n_noisy = float(noisy[0]), float(np.sum(noisy[1:])) / w
    denom = max(n_noisy, 1.0)
    deviation = s_noisy / denom
    clipped = float(noisy[2]) / w if split else None
    return FineRelease(float(center + deviation), deviation, n_noisy, denom, scale, clipped)



def range_estimator(
    backend: Aggregates,
    column: str,
    plan: UnivariateMeanPlan,
    noise: NoiseSource,
) -> tuple[float | None, float]:
    """RangeEstimator (Algorithm 1, Theorem 3.10) on the coarse group: the noisy-argmax bin.

    Returns ``(mu_c or None, n_hat)`` where ``n_hat`` is the sum of the released noisy counts,
    a DP (post-processed) estimate of the coarse group's size used only to set the radius.
    The caller must have charged ``plan.coarse_budget`` on ``plan.coarse_group``.

    Privacy
    -------
    (eps_A, delta_A)-DP under add/remove: thresholded histogram (delta > 0) or Laplace on all
    bins of ``[-R - 2r, R + 2r]`` (delta = 0); only the argmax bin and the noisy total leave.
    """
    r = plan.bin_width
    eps, delta = plan.coarse_budget.epsilon, plan.coarse_budget.delta
    if delta > 0:
        counts = backend.histogram(column, r, 0.0, plan.coarse_group)
        released, _, _ = thresholded_histogram(counts, eps, delta, noise)
        if not released:
            return None, 0.0
        j_star = min(released, key=lambda j: (-released[j], j))
        n_hat = float(sum(max(v, 0.0) for v in released.values()))
        return (j_star + 0.5) * r, n_hat
    R = float(plan.range_bound)  # type: ignore[arg-type]  # set for the pure plan (checked in __post_init__)
    offset = -R - 2.0 * r
    n_bins = plan.n_pure_bins
    clamp = (offset, offset + (n_bins - 0.5) * r)
    sparse = backend.histogram(column, r, offset, plan.coarse_group, clamp=clamp)
    dense = np.zeros(n_bins)
    for j, c in sparse.items():
        dense[j] = c
    noisy, _ = pure_dp_histogram(dense, eps, noise)
    j_star = int(np.argmax(noisy))  # first maximum: ties go to the smallest j
    n_hat = float(max(np.sum(noisy), 0.0))
    return offset + (j_star + 0.5) * r, n_hat


def univariate_person_mean(
    backend: Aggregates,
    column: str,
    plan: UnivariateMeanPlan,
    noise: NoiseSource,
    accountant: Accountant | None = None,
    stage_prefix: str = "",
) -> MeanRelease:
    """Private mean over persons of each person's mean of ``column``.

    Parameters
    ----------
    backend : Aggregates
        Exact aggregates over person summaries (numpy or Spark backend).
    column : str
        The value column; a person's value is the mean of their usable records of it.
    plan : UnivariateMeanPlan
        Public parameters (budget, scale, k, m, groups).
    noise : NoiseSource
        :class:`~dplib.mechanisms.SecureNoise` for releases; ``SeededNoise`` in tests.
    accountant : Accountant, optional
        Charged before each stage draws noise. Default: a fresh one limited to ``plan.budget``.

    Returns
    -------
    MeanRelease
        Estimate in data units with a 90% noise error bar, or status ``INSUFFICIENT_DATA``.

    Raises
    ------
    BudgetExceededError
        If the accountant cannot cover a stage (raised before that stage's noise is drawn).

    Privacy
    -------
    Neighbours: add/remove all records of one person. The coarse stage is (eps_A, delta)-DP on
    group A, the fine stage eps_B-DP on group B (Laplace, l1 sensitivity ``rho + c`` of the
    centred truncated sum and the weighted count). Parallel mode: (eps, delta) overall because
    A and B are disjoint fixed hash ranges; sequential mode: (eps/2 + eps/2, delta).

    References
    ----------
    Agarwal et al. 2024, Algorithm 1, Lemma 3.12, Theorem 3.14; docs/privacy/person_level_mean.md.
    """
    accountant = accountant if accountant is not None else Accountant(plan.budget)
    # Verify the whole plan fits before spending anything.
    accountant.check(plan.charges(stage_prefix))
    start = len(accountant.charges)
    params = plan.describe()

    coarse_charge, fine_charge = plan.charges(stage_prefix)
    accountant.charge(coarse_charge.stage, coarse_charge.budget, coarse_charge.group)
    mu_c, n_hat_a = range_estimator(backend, column, plan, noise)
    if mu_c is None:
        eps, delta = composed_cost(accountant.charges[start:])
        return MeanRelease(
            status=STATUS_INSUFFICIENT,
            estimate=None,
            error_bar=None,
            error_level=ERROR_LEVEL,
            error_covers="none: no coarse histogram bin passed the threshold",
            noise_scale=None,
            epsilon=eps,
            delta=delta,
            parameters=params,
        )

    fine_eps = plan.fine_budget.epsilon
    n_hat_b = n_hat_a * plan.fine_group.fraction / plan.coarse_group.fraction
    rho = fine_radius(plan.scale, plan.k, plan.m, plan.coarse_error_bound, n_hat_b * fine_eps)
    c = count_weight(rho, plan.coarse_error_bound)

    accountant.charge(fine_charge.stage, fine_charge.budget, fine_charge.group)
    fine = centred_clip_and_noise(backend, column, mu_c, rho, c, plan.fine_group, fine_eps, noise)
    n_noisy, estimate, scale = fine.n_noisy, fine.estimate, fine.scale
    # Noise-only error: (e_S - d * e_N) / N~ with e_S ~ Lap(scale), e_N ~ Lap(scale / c), and the
    # released deviation d as plug-in for the true clipped deviation (post-processing).
    half = fine.noise_quantile(c)
    eps, delta = composed_cost(accountant.charges[start:])
    params.update(
        {
            "coarse_center": mu_c,
            "clipping_radius": rho,
            "count_weight": c,
            "noisy_person_count": round(n_noisy, 1),
            "person_count_noise_scale": scale / c,
        }
    )
    return MeanRelease(
        status=STATUS_OK,
        estimate=float(estimate),
        error_bar=float(half),
        error_level=ERROR_LEVEL,
        error_covers=(
            "Laplace noise of the fine stage only (sum and count), at 90%; not the clipping "
            "bias nor the sampling of persons into the fine group"
        ),
        noise_scale=scale,
        epsilon=eps,
        delta=delta,
        parameters=params,
    )
