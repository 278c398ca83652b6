"""``kind: quantile`` — a quantile (``options.q``, default the median) of the person means of one
numeric column, without a user range (:mod:`dplib.quantile`: the exponential mechanism over
log-magnitude bins, zooming in over two or three stages, the last one width-weighted; pure
epsilon-DP)."""

from __future__ import annotations

from typing import Literal

from pydantic import field_validator, model_validator

from dplib.errors import InvalidParameterError
from dplib.budget import Budget
from dplib.quantile import ALGORITHM, ALGORITHM_VERSION, QuantilePlan, check_exponent_range, person_quantile
from dplib.quantile_groups import ALGORITHM as GROUP_ALGORITHM
from dplib.quantile_groups import ALGORITHM_VERSION as GROUP_VERSION
from dplib.quantile_groups import (
    SHARED_KEY, SHARED_SHARE, WINDOW_MADS, GroupQuantilePlan, SharedWindowPlan, group_person_quantile,
    shared_window,
)
from spark_jobs.kinds.base import (
    Frozen, Release, RunContext, StatisticConfigBase, StatisticKind, per_group_statistic,
)

ESTIMAND_QUANTILE = "the {q:g}-quantile over persons of each person's mean of {col} (persons weighted equally)"


class QuantileOptions(Frozen):
    """``q``: the quantile level in (0, 1) (default 0.5, the median). ``exponent_range``: binary
    exponents ``[lo, hi]`` of the magnitudes the answer is searched in (default [-40, 60])."""

    q: float = 0.5
    exponent_range: tuple[int, int] = (-40, 60)

    @field_validator("q")
    @classmethod
    def _q(cls, v: float) -> float:
        if not 0.0 < v < 1.0:
            raise ValueError(f"must be in (0, 1) (got {v!r})")
        return v

    @field_validator("exponent_range")
    @classmethod
    def _exp(cls, v: tuple[int, int]) -> tuple[int, int]:
        try:
            return check_exponent_range(v)
        except InvalidParameterError as err:
            raise ValueError(str(err)) from err


class QuantileStatistic(StatisticConfigBase):
    """One ``kind: quantile`` statistic: exactly one numeric column."""

    kind: Literal["quantile"]
    options: QuantileOptions = QuantileOptions()

    @model_validator(mode="after")
    def _one_column(self) -> "QuantileStatistic":
        if len(self.columns) != 1:
            raise ValueError(f"kind 'quantile' takes exactly one column (got {list(self.columns)})")
        return self


class QuantileKind(StatisticKind):
    """``kind: quantile``: epsilon-DP; estimate shape (1,), data units; no value error bar."""

    config_model = QuantileStatistic

    def groupable(self, stat) -> bool:
        return True

    def plan(self, stat, cfg):
        return QuantilePlan(budget=stat.budget(cfg), q=stat.options.q, exponent_range=stat.options.exponent_range)

    def grouped_plans(self, stat, cfg, fraction: float, l0: int):
        """A window found once for all groups (two pooled quantiles, ``SHARED_SHARE`` of the
        statistic's epsilon), then per group the rest / L0 (:mod:`dplib.quantile_groups`)."""
        b = stat.budget(cfg)
        shared = SharedWindowPlan(budget=Budget(b.epsilon * fraction * SHARED_SHARE, 0.0),
                                  exponent_range=stat.options.exponent_range)
        share = stat.share * fraction * (1.0 - SHARED_SHARE) / l0
        g = per_group_statistic(stat, share).budget(cfg)
        inner = GroupQuantilePlan(budget=Budget(g.epsilon, 0.0), q=stat.options.q,
                                  exponent_range=stat.options.exponent_range, shared=shared)
        return shared, inner, share

    def run_shared(self, stat, plan, aggregates, ctx: RunContext):
        prepared = (ctx.prepared.get(stat.name) or {}).get(SHARED_KEY)
        return shared_window(aggregates, stat.columns[0], plan, ctx.noise, ctx.accountant,
                             f"{stat.name}: all groups: ", prepared)

    def describe(self, name: str, plan) -> str:
        if isinstance(plan, GroupQuantilePlan):
            return (f"  {name}: {plan.q:g}-quantile of the person means per group, no user range: a window found "
                    f"once for all groups ({SHARED_SHARE:.0%} of the epsilon: the pooled median +- {WINDOW_MADS:g} "
                    "median absolute deviations), then "
                    "per group a Laplace count (3%; decisions read its lower bound) and one width-weighted exponential mechanism over the window "
                    "(the range-free stages instead when the group's persons x epsilon are large); pure epsilon")
        return (f"  {name}: {plan.q:g}-quantile of the person means, no user range: a Laplace count (10%; decisions read its lower bound), then the "
                "exponential mechanism (sensitivity max(q, 1-q)) over log-magnitude bins: coarse, fine (skipped "
                "below 300 persons on the short side of q) and a width-weighted final stage; the coarse and fine "
                "shares (5-40%) are chosen from the DP count, the final stage takes the rest (40-85%); pure epsilon; "
                f"releases from about {plan.persons_needed():,} persons at this epsilon (fewer: INSUFFICIENT_DATA, "
                "only the count charged)")

    def run(self, stat, plan, ctx: RunContext) -> Release:
        column = stat.columns[0]
        if isinstance(plan, GroupQuantilePlan):
            rel = group_person_quantile(ctx.aggregates, column, plan, ctx.noise, ctx.shared, ctx.accountant,
                                        f"{stat.name}: ", ctx.prepared.get(stat.name))
            return Release.of(rel, estimand=ESTIMAND_QUANTILE.format(q=plan.q, col=column), algorithm=GROUP_ALGORITHM,
                              algorithm_version=GROUP_VERSION, estimate_shape=[1], parameters=ctx.summary_extras())
        rel = person_quantile(ctx.aggregates, column, plan, ctx.noise, ctx.accountant, f"{stat.name}: ",
                              ctx.prepared.get(stat.name))
        return Release.of(rel, estimand=ESTIMAND_QUANTILE.format(q=plan.q, col=column), algorithm=ALGORITHM,
                          algorithm_version=ALGORITHM_VERSION, estimate_shape=[1], parameters=ctx.summary_extras())


KIND = QuantileKind()
