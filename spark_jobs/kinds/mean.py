"""``kind: mean`` — the person-level mean of one numeric column.

Default: the scale-free estimator (:mod:`dplib.mean.scale_free`; range, centre and clipping
radius found privately). With ``options.scale``: the paper's estimator with that declared scale
(:mod:`dplib.mean.univariate`; Agarwal, Kamath, Majid, Mouzakis, Silver, Ullman 2024, Algorithm 1).
With ``options.bounds``: the person means clamped into declared public bounds, one Laplace stage
(:mod:`dplib.mean.bounded`; for 0/1 indicators, fixed rating scales, percentages).
:class:`MeanOptions` is shared with ``kind: multivariate_mean`` (one options model: the config
hash of existing jobs is unchanged).
"""

from __future__ import annotations

import math
from typing import ClassVar, Literal

from pydantic import field_validator, model_serializer, model_validator

from dplib.mean.bounded import ALGORITHM as BOUNDED_ALGORITHM
from dplib.mean.bounded import ALGORITHM_VERSION as BOUNDED_VERSION
from dplib.mean.bounded import BoundedMeanPlan, bounded_person_mean, check_bounds
from dplib.mean.scale_free import ALGORITHM as SF_ALGORITHM
from dplib.mean.scale_free import ALGORITHM_VERSION as SF_VERSION
from dplib.budget import Budget
from dplib.mean.per_group import ALGORITHM as GROUP_ALGORITHM
from dplib.mean.per_group import ALGORITHM_VERSION as GROUP_VERSION
from dplib.mean.per_group import (
    COUNT_SHARE, JOINT_WITHIN, OWN_STAGES_N_EPS, SHARED_SHARE, GroupMeanPlan, SharedScalePlan, group_person_mean,
    shared_scale, within_profile,
)
from dplib.mean.scale_free import (
    ScaleFreeMeanPlan, scale_free_person_mean,
)
from dplib.mean.scale_free_stages import DEFAULT_SHARES, persons_needed_text
from dplib.mean.params import check_moment_order
from dplib.mean.ranges import check_exponent_range
from dplib.mean.univariate import (
    ALGORITHM, ALGORITHM_VERSION, COARSE_FRACTION_LIMITS, UnivariateMeanPlan, univariate_person_mean,
)
from spark_jobs.kinds.base import (
    Frozen, Release, RunContext, StatisticConfigBase, StatisticKind, dplib_check, per_group_statistic,
)

ESTIMAND_MEAN = "mean over persons of each person's mean of {col} (persons weighted equally)"
ESTIMAND_BOUNDED = ("mean over persons of each person's mean of {col} clamped into the declared bounds "
                    "[{lo:g}, {hi:g}] (persons weighted equally)")


class MeanOptions(Frozen):
    """Options of the person-level mean (``kind: mean``). All optional.

    Default (no ``scale``): the scale-free estimator finds the range, centre and clipping radius
    privately (``dplib.mean.scale_free``). ``exponent_range``: binary exponents of its pure-DP
    magnitude buckets, used only when delta = 0.

    With ``scale`` (public scale of the person means in data units, a bound on the k-th moment
    root of how far a person's mean sits from the mean over persons): the paper's estimator
    with that declared scale (``dplib.mean.univariate``); ``range_bound`` (public R with
    ``|mean| <= R``) is then needed when delta = 0; ``coarse_fraction`` is its coarse share.
    ``k``: moment order. With ``scale``: the paper's k (default 4). Without: optional cap on the
    degrees of freedom of the tail model beyond what the private deviation profile measures
    (default: no cap; a smaller k gives wider, more robust radii).

    With ``bounds`` (``[lower, upper]``: declared public limits of a person's mean, e.g. ``[0, 1]``
    for a 0/1 indicator): each person's mean is clamped into them and one Laplace stage spends all
    of epsilon (``dplib.mean.bounded``); the other options do not apply to it.

    ``kind: multivariate_mean`` (``dplib.mean.multivariate``) takes ``k``, ``scales`` (optional
    public per-column scales, a diagonal preconditioner; found privately when absent),
    ``records_iid`` (assert records within a person are i.i.d.: the radii then use
    ``m = summary.m_min``; default: each person's mean is one item) and ``expected_persons``
    (optional public number of persons; else a DP count on 2% of the persons).
    """

    #: the kinds each option of this shared model is for (error messages of other kinds)
    ONLY_FOR: ClassVar[dict[str, tuple[str, ...]]] = {
        "bounds": ("mean",), "scale": ("mean",), "range_bound": ("mean",), "coarse_fraction": ("mean",),
        "scales": ("multivariate_mean",), "records_iid": ("multivariate_mean",),
        "expected_persons": ("multivariate_mean",),
    }

    scale: float | None = None
    k: float | None = None
    range_bound: float | None = None
    coarse_fraction: float = 0.25
    exponent_range: tuple[int, int] = (-40, 60)
    scales: tuple[float, ...] | None = None
    records_iid: bool = False
    expected_persons: float | None = None
    bounds: tuple[float, float] | None = None

    @model_serializer(mode="wrap")
    def _dump(self, handler):
        """``bounds`` is left out of the dump while unset: the config and release hashes of
        statistics written before it existed stay what they were (their run ids, their ledger)."""
        d = handler(self)
        if self.bounds is None:
            d.pop("bounds", None)
        return d

    @field_validator("bounds", mode="before")
    @classmethod
    def _bounds_shape(cls, v):
        """Two numbers, ``[lower, upper]``: not strings, booleans, a mapping or one pair per column."""
        if v is None:
            return v
        if not (isinstance(v, (list, tuple)) and len(v) == 2
                and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)):
            raise ValueError(f"must be two numbers [lower, upper] (kind 'mean', one column), got {v!r}")
        return v

    @field_validator("bounds")
    @classmethod
    def _bounds(cls, v: tuple[float, float] | None) -> tuple[float, float] | None:
        return v if v is None else dplib_check(check_bounds, v)

    @field_validator("scales")
    @classmethod
    def _scales(cls, v: tuple[float, ...] | None) -> tuple[float, ...] | None:
        if v is not None and (len(v) == 0 or any(not math.isfinite(x) or x <= 0 for x in v)):
            raise ValueError(f"must be one finite value > 0 per column, in data units (got {list(v)})")
        return v

    @field_validator("expected_persons")
    @classmethod
    def _persons(cls, v: float | None) -> float | None:
        if v is not None and (not math.isfinite(v) or v < 1):
            raise ValueError(f"must be a public number of persons >= 1 (got {v!r})")
        return v

    @field_validator("scale")
    @classmethod
    def _scale(cls, v: float | None) -> float | None:
        if v is not None and (not math.isfinite(v) or v <= 0):
            raise ValueError(f"must be finite and > 0, in data units (got {v!r})")
        return v

    @field_validator("exponent_range")
    @classmethod
    def _exp(cls, v: tuple[int, int]) -> tuple[int, int]:
        return dplib_check(check_exponent_range, v)

    @field_validator("k")
    @classmethod
    def _k(cls, v: float | None) -> float | None:
        return v if v is None else dplib_check(check_moment_order, v)

    @field_validator("range_bound")
    @classmethod
    def _r(cls, v: float | None) -> float | None:
        if v is not None and (not math.isfinite(v) or v <= 0):
            raise ValueError(f"must be finite and > 0 (got {v!r})")
        return v

    @field_validator("coarse_fraction")
    @classmethod
    def _cf(cls, v: float) -> float:
        lo, hi = COARSE_FRACTION_LIMITS
        if not (lo <= v <= hi):
            raise ValueError(f"must be in [{lo:g}, {hi:g}] (got {v!r})")
        return v


class MeanStatistic(StatisticConfigBase):
    """One ``kind: mean`` statistic: exactly one numeric column."""

    kind: Literal["mean"]
    options: MeanOptions = MeanOptions()

    @model_validator(mode="after")
    def _one_column(self) -> "MeanStatistic":
        o = self.options
        if len(self.columns) != 1:
            raise ValueError(
                f"kind 'mean' takes exactly one column (got {list(self.columns)}); "
                "list one statistic per column, or use kind 'multivariate_mean'"
            )
        for f in ("scales", "expected_persons"):
            if getattr(o, f) is not None:
                raise ValueError(f"options.{f} is for kind 'multivariate_mean' (kind 'mean' takes options.scale)")
        if o.records_iid:
            raise ValueError("options.records_iid is for kind 'multivariate_mean'")
        if o.bounds is not None:
            other = sorted(f for f in ("scale", "k", "range_bound", "coarse_fraction", "exponent_range")
                           if f in o.model_fields_set)
            if other:
                raise ValueError(
                    "options.bounds runs the bounded mean (one Laplace stage inside the declared bounds); "
                    f"options.{', options.'.join(other)} belong to the scale-free or declared-scale estimators: "
                    "give one or the other"
                )
        return self


class MeanKind(StatisticKind):
    """``kind: mean``: estimate shape (1,), data units; (epsilon, delta)-DP (pure with delta = 0)."""

    config_model = MeanStatistic

    def groupable(self, stat) -> bool:
        return True

    def check_job(self, stat: MeanStatistic, cfg) -> None:
        if cfg.budget.delta == 0 and stat.options.scale is not None and stat.options.range_bound is None:
            raise ValueError(
                f"statistic {stat.name!r}: budget.delta = 0 (pure DP) with a declared options.scale "
                "needs options.range_bound (or drop options.scale for the scale-free estimator)"
            )

    def plan(self, stat: MeanStatistic, cfg):
        opts = stat.options
        if opts.bounds is not None:
            return BoundedMeanPlan(budget=stat.budget(cfg), lower=opts.bounds[0], upper=opts.bounds[1])
        if opts.scale is None:
            return ScaleFreeMeanPlan(budget=stat.budget(cfg), k=opts.k, exponent_range=opts.exponent_range)
        return UnivariateMeanPlan(
            budget=stat.budget(cfg),
            scale=opts.scale,
            k=4.0 if opts.k is None else opts.k,
            m=1,
            range_bound=opts.range_bound,
            budget_mode=cfg.budget.budget_mode,
            coarse_fraction=opts.coarse_fraction,
        )

    def grouped_plans(self, stat: MeanStatistic, cfg, fraction: float, l0: int):
        """The scale-free mean per group finds its scales once for all groups
        (:mod:`dplib.mean.per_group`): range, centre and deviation profile on one value per
        person with ``SHARED_SHARE`` of the groups' epsilon (and all their delta); each group
        then spends the rest / L0 on a noisy count and either its own stages (enough persons x
        epsilon) or a two-step clip around the pooled centre (between its steps, the joint
        within-group profile, :meth:`joint_stages`, also out of the shared share). A declared
        ``options.scale`` or ``options.bounds``: no shared stage (each group runs its own plan)."""
        if stat.options.scale is not None or stat.options.bounds is not None:
            return super().grouped_plans(stat, cfg, fraction, l0)
        b = stat.budget(cfg)
        shared = SharedScalePlan(budget=Budget(b.epsilon * fraction * SHARED_SHARE, b.delta * fraction),
                                 k=stat.options.k, exponent_range=stat.options.exponent_range)
        share = stat.share * fraction * (1.0 - SHARED_SHARE) / l0
        g = per_group_statistic(stat, share).budget(cfg)
        inner = GroupMeanPlan(budget=Budget(g.epsilon, 0.0), k=stat.options.k,
                              exponent_range=stat.options.exponent_range)
        return shared, inner, share

    def run_shared(self, stat: MeanStatistic, plan, aggregates, ctx: RunContext):
        return shared_scale(aggregates, stat.columns[0], plan, ctx.noise, ctx.accountant, f"{stat.name}: all groups: ",
                            joint_within=True)

    def joint_stages(self, stat: MeanStatistic, plan, shared, first_backend, ctx: RunContext) -> dict:
        """The within-group profile of the pooled-path groups (:func:`dplib.mean.per_group.within_profile`),
        charged to the statistic's accountant as an "all groups" stage."""
        if not isinstance(plan, SharedScalePlan) or shared is None or not shared.within:
            return {}

        def within(centres: dict) -> dict:
            w = within_profile(first_backend(), stat.columns[0], centres, plan, shared, ctx.noise, ctx.accountant,
                               f"{stat.name}: all groups: ")
            return {gid: w for gid in centres}

        return {JOINT_WITHIN: within}

    def describe(self, name: str, plan) -> str:
        if isinstance(plan, GroupMeanPlan):
            cap = "" if plan.k is None else f", tail nu capped at k={plan.k:g}"
            return (f"  {name}: scale-free, range, centre and deviation profile found once for all groups on one "
                    f"value per person, with the within-group profile below ({SHARED_SHARE:.0%} of the epsilon; on "
                    f"small data a pooled range retry out of the profile's share); per group: {COUNT_SHARE:.0%} noisy "
                    f"count, then its own centre and profile if noisy persons x epsilon >= {OWN_STAGES_N_EPS:g}, "
                    f"else a clip-and-noise around the pooled centre and one around the group's rough mean, its "
                    f"radius from a within-group profile shared by those groups when much tighter than the "
                    f"pooled one{cap}")
        if isinstance(plan, BoundedMeanPlan):
            return (f"  {name}: declared bounds [{plan.lower:g}, {plan.upper:g}]: each person's mean clamped into "
                    f"them, one Laplace stage on the centred sum and the count (all of epsilon, every person; "
                    f"sensitivity {plan.radius:g} + count weight {plan.count_weight:.3g}); persons outside the bounds "
                    f"count at them")
        if isinstance(plan, UnivariateMeanPlan):
            return (f"  {name}: declared scale {plan.scale:g}: bin width r={plan.bin_width:.4g}, "
                    f"coarse error bound u={plan.coarse_error_bound:.4g}, k={plan.k:g}")
        cap = "" if plan.k is None else f", tail nu capped at k={plan.k:g}"
        return (f"  {name}: scale-free (range, centre and radius found privately; every stage on all "
                f"persons, sequential: 4% range [+20% retry on small data or a zero atom; +15% pooled retry "
                f"if both release nothing], 4% centre, 10% profile, 15% overflow check only if the profile's overflow bin "
                f"reads above its noise, the rest to clip-and-noise; "
                f"{persons_needed_text(plan.budget.epsilon, DEFAULT_SHARES)}){cap}")

    def run(self, stat: MeanStatistic, plan, ctx: RunContext) -> Release:
        column = stat.columns[0]
        prefix = f"{stat.name}: "
        if isinstance(plan, GroupMeanPlan):
            rel = group_person_mean(ctx.aggregates, column, plan, ctx.noise, ctx.accountant, prefix, shared=ctx.shared)
            algorithm, version = GROUP_ALGORITHM, GROUP_VERSION
        elif isinstance(plan, ScaleFreeMeanPlan):
            rel = scale_free_person_mean(ctx.aggregates, column, plan, ctx.noise, ctx.accountant, prefix)
            algorithm, version = SF_ALGORITHM, SF_VERSION
        elif isinstance(plan, BoundedMeanPlan):
            rel = bounded_person_mean(ctx.aggregates, column, plan, ctx.noise, ctx.accountant, prefix)
            return Release.of(rel, estimand=ESTIMAND_BOUNDED.format(col=column, lo=plan.lower, hi=plan.upper),
                              algorithm=BOUNDED_ALGORITHM, algorithm_version=BOUNDED_VERSION, estimate_shape=[1],
                              parameters=ctx.summary_extras())
        else:
            rel = univariate_person_mean(ctx.aggregates, column, plan, ctx.noise, ctx.accountant, prefix)
            algorithm, version = ALGORITHM, ALGORITHM_VERSION
        return Release.of(rel, estimand=ESTIMAND_MEAN.format(col=column), algorithm=algorithm,
                          algorithm_version=version, estimate_shape=[1], parameters=ctx.summary_extras())


KIND = MeanKind()
