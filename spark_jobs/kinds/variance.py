"""``kind: variance`` and ``kind: stddev`` — the spread of the person means of one numeric column.

The population variance (divide by n) over persons of each person's mean of the column, and its
square root, with no bounds or scale from the user: the scale-free mean's private stages find a
centre and a clipping radius, then one Laplace release of the clipped second and first moments
and the count (:mod:`dplib.variance`). ``stddev`` is the square root of the same release
(post-processing; its 90% interval is the variance's mapped through the square root).
:class:`ScaleFreeOptions` is shared with ``kind: sum``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import field_validator, model_validator

from dplib.mean.params import check_moment_order
from dplib.mean.ranges import check_exponent_range
from dplib.mean.scale_free_stages import persons_needed_text
from dplib.variance import (
    ALGORITHM,
    ALGORITHM_VERSION,
    STDDEV_ALGORITHM,
    ScaleFreeVariancePlan,
    person_variance,
    stddev_from_variance,
)
from spark_jobs.kinds.base import Frozen, Release, RunContext, StatisticConfigBase, StatisticKind, dplib_check

ESTIMAND_VARIANCE = ("population variance (divide by n) over persons of each person's mean of {col} "
                     "(persons weighted equally)")
ESTIMAND_STDDEV = ("population standard deviation (square root of the variance, divide by n) over persons of "
                   "each person's mean of {col} (persons weighted equally)")


class ScaleFreeOptions(Frozen):
    """Options of ``kind: variance | stddev | sum`` (all optional). ``k``: cap on the degrees of
    freedom of the tail model beyond what the private deviation profile measures (>= 2, or inf;
    default none: a smaller k gives wider radii and bars). ``exponent_range``: binary exponents of
    the pure-DP magnitude buckets, used only when delta = 0 (default [-40, 60])."""

    k: float | None = None
    exponent_range: tuple[int, int] = (-40, 60)

    @field_validator("k")
    @classmethod
    def _k(cls, v: float | None) -> float | None:
        return v if v is None else dplib_check(check_moment_order, v)

    @field_validator("exponent_range")
    @classmethod
    def _exp(cls, v: tuple[int, int]) -> tuple[int, int]:
        return dplib_check(check_exponent_range, v)


class OneColumnStatistic(StatisticConfigBase):
    """A statistic of exactly one numeric column with :class:`ScaleFreeOptions`."""

    options: ScaleFreeOptions = ScaleFreeOptions()

    @model_validator(mode="after")
    def _one_column(self) -> "OneColumnStatistic":
        if len(self.columns) != 1:
            raise ValueError(f"kind {self.kind!r} takes exactly one column (got {list(self.columns)}); "  # type: ignore[attr-defined]  # every subclass has kind
                             "list one statistic per column")
        return self


class VarianceStatistic(OneColumnStatistic):
    """One ``kind: variance`` statistic: one numeric column."""

    kind: Literal["variance"]


class StddevStatistic(OneColumnStatistic):
    """One ``kind: stddev`` statistic: one numeric column."""

    kind: Literal["stddev"]


def scale_free_plan(plan_cls, stat, cfg):
    """The dplib plan of a one-column scale-free statistic from its config."""
    return plan_cls(budget=stat.budget(cfg), k=stat.options.k, exponent_range=stat.options.exponent_range)


def stage_text(plan) -> str:
    """The dry-run text of the scale-free early stages and the final share."""
    sh = plan.shares
    balance = f", {sh.balance:.0%} tail balance" if sh.balance > 0 else ""
    pooled = f"; +{sh.range_retry2:.0%} pooled retry if both release nothing" if sh.range_retry2 > 0 else ""
    overflow = (f", {sh.overflow:.0%} overflow check only if the profile's overflow bin reads above its noise"
                if sh.overflow > 0 else "")
    return (f"every stage on all persons, sequential: {sh.range:.0%} range [+{sh.range_retry:.0%} retry on small "
            f"data or a zero atom{pooled}], {sh.centre:.0%} centre, {sh.profile:.0%} profile{balance}{overflow}, "
            f"the rest ({1 - sh.range - sh.centre - sh.profile - sh.balance:.0%}, less what the checks take) to the "
            f"{plan.final_stage}; "
            f"{persons_needed_text(plan.budget.epsilon, sh)}")


class VarianceKind(StatisticKind):
    """``kind: variance`` (data units squared) and ``kind: stddev`` (data units): estimate shape
    (1,); (epsilon, delta)-DP (pure with delta = 0) under add/remove of one person."""

    def groupable(self, stat) -> bool:
        return True

    def __init__(self, config_model, stddev: bool) -> None:
        self.config_model = config_model
        self.stddev = stddev

    def plan(self, stat, cfg):
        return scale_free_plan(ScaleFreeVariancePlan, stat, cfg)

    def describe(self, name: str, plan) -> str:
        what = "standard deviation (sqrt of the variance)" if self.stddev else "variance"
        cap = "" if plan.k is None else f", tail nu capped at k={plan.k:g}"
        return (f"  {name}: scale-free {what} (centre and radius found privately; {stage_text(plan)}: Laplace on "
                f"the clipped second and first moments and the count){cap}")

    def run(self, stat, plan, ctx: RunContext) -> Release:
        column = stat.columns[0]
        rel = person_variance(ctx.aggregates_for(self, stat), column, plan, ctx.noise, ctx.accountant,
                              f"{stat.name}: ")
        estimand = ESTIMAND_VARIANCE
        algorithm = ALGORITHM
        if self.stddev:
            rel, estimand, algorithm = stddev_from_variance(rel), ESTIMAND_STDDEV, STDDEV_ALGORITHM
        return Release.of(rel, estimand=estimand.format(col=column), algorithm=algorithm,
                          algorithm_version=ALGORITHM_VERSION, estimate_shape=[1], parameters=ctx.summary_extras())


VARIANCE = VarianceKind(VarianceStatistic, stddev=False)
STDDEV = VarianceKind(StddevStatistic, stddev=True)
