"""Scale-free univariate person-level mean: the user gives epsilon (and delta), nothing else.

The coarse-then-fine structure of Agarwal, Kamath, Majid, Mouzakis, Silver, Ullman 2024
(Algorithm 1 + Lemma 3.12, Theorem 3.14), with every public scale the paper assumes (the moment
scale s, the range R) replaced by private estimates on their own persons
(:mod:`dplib.mean.ranges`). Four stages, each on a fixed hash range of persons:

====  =====================  ===============  ===========================================
 #    stage                   persons (share)  mechanism
====  =====================  ===============  ===========================================
 1    magnitude range         0.10             thresholded (delta > 0) or pure histogram of
                                               signed binary magnitudes -> [L, U]
 2    centre                  0.10             RangeEstimator, bins of (U-L)/8, pure -> c
 3    deviation profile       0.15             pure histogram of |Y - c| on quarter octaves
                                               -> radius rho, bias bound, spread
 4    fine clip-and-noise     0.65             Laplace on (sum trunc(Y - c, rho), w n)
====  =====================  ===============  ===========================================

Budget: ``parallel`` (default): each stage gets the statistic's whole epsilon (stage 1 also its
delta), valid by parallel composition across disjoint fixed hash ranges under add/remove.
``sequential``: epsilon shares 1/8, 1/8, 1/4, 1/2 (delta to stage 1), each charged on all persons.

The error bar covers the exact dataset statistic (mean over all persons of each person's mean):
Laplace noise of stage 4, the sampling of persons into stage 4 (normal approximation with a DP
upper bound on the spread from stage 3), plus a DP bound on the clipping bias from stage 3.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal


from dplib.aggregates import Aggregates
from dplib.budget import Accountant, Budget, Charge, composed_cost
from dplib.errors import InvalidParameterError
from dplib.groups import ALL_PERSONS, GroupRange
from dplib.mean.error_bars import noise_and_sampling_quantile
from dplib.mean.params import check_moment_order
from dplib.mean.ranges import choose_radius, deviation_profile, magnitude_range, tail_model, window_center
from dplib.mean.univariate import (
    ERROR_LEVEL,
    STATUS_INSUFFICIENT,
    STATUS_OK,
    MeanRelease,
    centred_clip_and_noise,
    count_weight,
)
from dplib.mechanisms import NoiseSource

ALGORITHM = "agarwal2024-univariate-person-mean/scale-free"
ALGORITHM_VERSION = "1"
STAGES = ("magnitude range", "centre", "deviation profile", "fine clip-and-noise")
#: The deviation profile spans [bin width / 2**10, range width * 2**6]: quarter octaves, ~80 bins.
PROFILE_OCTAVES_BELOW = 10
PROFILE_OCTAVES_ABOVE = 6
#: The radius is Q_0.98(|Y - c|) * max(2, (n eps)^(1/k)) (measured: 0.9 and 0.95 under-covered
#: the heavy-tailed sets, benchmarks/error_bar_coverage.py).
RADIUS_QUANTILE = 0.98
#: Beyond what the deviation profile measures, the clipping-bias bound assumes the survival of
#: |Y - c| falls at least like x^-TAIL_POWER (finite variance), or like the fitted power if that is
#: heavier. 3 and 4 under-covered flights' dep_delay (benchmarks/error_bar_coverage.py).
TAIL_POWER = 2.0
#: Overflow share of the deviation profile above which the bias bound is flagged as an assumption.
OVERFLOW_WARN = 0.01


@dataclass(frozen=True)
class ScaleFreeMeanPlan:
    """Public plan of the scale-free mean: groups and budgets, fixed before any data is read.

    Parameters
    ----------
    budget : Budget
        The statistic's budget. delta > 0: stage 1 uses the thresholded histogram (no bound on
        magnitudes); delta == 0: stage 1 uses Laplace over ``exponent_range`` (pure DP).
    budget_mode : {"parallel", "sequential"}
    fractions : 4 floats summing to 1
        Shares of the hash range for the four stages.
    range_quantile : float
        Fraction of persons the stage-1 interval must hold (0.9).
    k : float, default 4
        Moment order of the radius balance ``rho ~ Q (n eps)^(1/k)`` (>= 2, or inf).
    exponent_range : (int, int)
        Binary exponents of the pure-DP magnitude buckets (public; delta == 0 only).
    group : GroupRange
        The persons this statistic may read.

    Raises
    ------
    InvalidParameterError
    """

    budget: Budget
    budget_mode: Literal["parallel", "sequential"] = "parallel"
    fractions: tuple[float, float, float, float] = (0.10, 0.10, 0.15, 0.65)
    range_quantile: float = 0.9
    k: float = 4.0
    range_octaves: int = 1
    exponent_range: tuple[int, int] = (-40, 60)
    group: GroupRange = ALL_PERSONS

    def __post_init__(self) -> None:
        if not isinstance(self.budget, Budget):
            raise InvalidParameterError("budget must be a dplib.budget.Budget")
        if self.budget_mode not in ("parallel", "sequential"):
            raise InvalidParameterError(f"budget_mode must be 'parallel' or 'sequential', got {self.budget_mode!r}")
        fr = tuple(float(f) for f in self.fractions)
        if len(fr) != 4 or any(f <= 0 for f in fr) or abs(sum(fr) - 1.0) > 1e-9:
            raise InvalidParameterError(f"fractions must be 4 positive numbers summing to 1, got {self.fractions!r}")
        if not (0.5 <= self.range_quantile < 1.0):
            raise InvalidParameterError(f"range_quantile must be in [0.5, 1), got {self.range_quantile!r}")
        object.__setattr__(self, "k", check_moment_order(self.k))
        if isinstance(self.range_octaves, bool) or not isinstance(self.range_octaves, int) or self.range_octaves < 1:
            raise InvalidParameterError(f"range_octaves must be an integer >= 1, got {self.range_octaves!r}")
        lo, hi = self.exponent_range
        if not all(isinstance(e, int) and not isinstance(e, bool) for e in (lo, hi)):
            raise InvalidParameterError(f"exponent_range must be two integers, got {self.exponent_range!r}")
        if not (-1000 < lo < hi < 997):
            raise InvalidParameterError(f"exponent_range must satisfy -1000 < lo < hi < 997, got {self.exponent_range!r}")

    @property
    def groups(self) -> list[GroupRange]:
        return self.group.split(self.fractions)

    @property
    def stage_budgets(self) -> list[Budget]:
        eps, delta = self.budget.epsilon, self.budget.delta
        shares = (1.0, 1.0, 1.0, 1.0) if self.budget_mode == "parallel" else (0.125, 0.125, 0.25, 0.5)
        return [Budget(eps * s, delta if i == 0 else 0.0) for i, s in enumerate(shares)]

    def charges(self, prefix: str = "") -> list[Charge]:
        """The charges, in order (the privacy cost before any data is read)."""
        out = []
        for name, g, b in zip(STAGES, self.groups, self.stage_budgets):
            out.append(Charge(f"{prefix}{name}", b, g if self.budget_mode == "parallel" else self.group))
        return out

    def cost(self) -> Budget:
        eps, delta = composed_cost(self.charges())
        return Budget(eps, delta)

    def describe(self) -> dict:
        return {
            "budget_mode": self.budget_mode,
            "stages": [
                {"stage": c.stage, "persons": [g.lo, g.hi], "epsilon": c.budget.epsilon, "delta": c.budget.delta}
                for c, g in zip(self.charges(), self.groups)
            ],
            "range_quantile": self.range_quantile,
            "exponent_range": list(self.exponent_range) if self.budget.delta == 0 else None,
        }


def _insufficient(reason: str, accountant: Accountant, start: int, params: dict) -> MeanRelease:
    eps, delta = composed_cost(accountant.charges[start:])
    return MeanRelease(STATUS_INSUFFICIENT, None, None, ERROR_LEVEL, f"none: {reason}", None, eps, delta, params)


def scale_free_person_mean(
    backend: Aggregates,
    column: str,
    plan: ScaleFreeMeanPlan,
    noise: NoiseSource,
    accountant: Accountant | None = None,
    stage_prefix: str = "",
) -> MeanRelease:
    """Private mean over persons of each person's mean of ``column``, with no scale or bounds.

    Parameters
    ----------
    backend : Aggregates
    column : str
    plan : ScaleFreeMeanPlan
    noise : NoiseSource
    accountant : Accountant, optional
        Charged before each stage reads its persons. Default: limited to ``plan.budget``.

    Returns
    -------
    MeanRelease
        Estimate (data units) with a 90% error bar for the exact dataset statistic, or
        ``INSUFFICIENT_DATA`` when stage 1 releases no bucket.

    Raises
    ------
    BudgetExceededError
        Before any stage runs, if the whole plan does not fit the accountant.

    Privacy
    -------
    Add/remove one person. Stage 1 is (eps1, delta)-DP, stages 2-4 eps_i-DP, each on its own fixed
    hash range; all later parameters are post-processing of earlier DP outputs. Parallel mode:
    (eps, delta) overall; sequential: sum of the shares.

    References
    ----------
    Agarwal et al. 2024, Algorithm 1, Lemma 3.12, Theorem 3.14; ApproxBounds-style magnitude
    histograms for the range; ``docs/privacy/person_level_mean.md``.
    """
    accountant = accountant if accountant is not None else Accountant(plan.budget)
    charges = plan.charges(stage_prefix)
    accountant.check(charges)
    start = len(accountant.charges)
    params = plan.describe()
    g_range, g_centre, g_profile, g_fine = plan.groups
    b_range, b_centre, b_profile, b_fine = plan.stage_budgets

    def charge(i: int) -> None:
        accountant.charge(charges[i].stage, charges[i].budget, charges[i].group)

    # 1. magnitude range
    charge(0)
    rng_out = magnitude_range(
        backend, column, g_range, b_range.epsilon, b_range.delta, noise, plan.range_quantile, plan.exponent_range,
        plan.range_octaves,
    )
    if rng_out is None:
        return _insufficient(
            "no magnitude bucket passed the threshold (too few persons for the scale-free estimator "
            "at this budget: it needs roughly 1,000/epsilon persons; or declare options.scale)",
            accountant, start, params,
        )
    lower, upper = rng_out.lower, rng_out.upper
    params.update({"range_lower": lower, "range_upper": upper})

    # 2. centre
    charge(1)
    center, bin_width = window_center(backend, column, g_centre, b_centre.epsilon, noise, lower, upper)
    width = upper - lower
    params.update({"coarse_center": center, "bin_width": bin_width})

    # 3. deviation profile -> radius, bias bound, spread
    charge(2)
    profile = deviation_profile(
        backend, column, g_profile, b_profile.epsilon, noise, center, low=bin_width * 2.0**-PROFILE_OCTAVES_BELOW, high=width * 2.0**PROFILE_OCTAVES_ABOVE
    )
    n_profile = max(profile.total, 1.0)
    n_fine_hat = n_profile * g_fine.fraction / g_profile.fraction
    model = tail_model(profile, b_profile.epsilon, TAIL_POWER)
    rho = choose_radius(profile, n_fine_hat * b_fine.epsilon, plan.k, RADIUS_QUANTILE)
    bias_bound = model.bias(rho)
    # the clipped person means lie within rho of the centre: their variance is at most rho^2
    spread_ratio = model.second_moment_ratio(rho)  # E[min(|Y-c|, rho)^2] / rho^2

    # 4. fine clip-and-noise
    charge(3)
    c = count_weight(rho, min(1.5 * bin_width, rho))
    fine = centred_clip_and_noise(backend, column, center, rho, c, g_fine, b_fine.epsilon, noise)
    n_noisy, denom, deviation, estimate, scale = fine.n_noisy, fine.denom, fine.deviation, fine.estimate, fine.scale

    # error bar: (e_S - d e_N)/N~  +  split sampling  +  clipping-bias bound
    n_all_hat = max(denom / g_fine.fraction, denom)
    sampling_sd = rho * math.sqrt(max(spread_ratio, 0.0) * max(1.0 / denom - 1.0 / n_all_hat, 0.0))
    # (order of products chosen so that data near 1e300 do not overflow)
    half = noise_and_sampling_quantile(scale / denom, (abs(deviation) / c) * (scale / denom), sampling_sd) + bias_bound
    overflow = profile.overflow_share()
    if not math.isfinite(half):
        half = None
    covers = (
        "the exact dataset statistic, at 90%: Laplace noise of the fine stage (sum and count), "
        "sampling of persons into the fine group (normal approximation, DP spread bound) and a DP "
        "bound on the clipping bias"
    )
    if half is None:
        covers = (
            "nothing: the deviation profile gives no finite bound on the clipping bias (no persons "
            "measured in it, or a tail heavier than x^-1); the estimate is private but has no honest "
            "error bar"
        )
    elif overflow > OVERFLOW_WARN:
        covers += (
            "; WARNING: some persons lie beyond the deviation histogram, whose bias is bounded "
            "assuming they sit within twice its top edge"
        )
    eps, delta = composed_cost(accountant.charges[start:])
    params.update(
        {
            "clipping_radius": rho,
            "count_weight": c,
            "noisy_person_count": round(n_noisy, 1),
            "clipping_bias_bound": bias_bound,
            "sampling_sd": sampling_sd,
            "profile_overflow_share": round(overflow, 4),
        }
    )
    return MeanRelease(
        STATUS_OK, float(estimate), None if half is None else float(half), ERROR_LEVEL, covers, scale, eps, delta, params
    )
