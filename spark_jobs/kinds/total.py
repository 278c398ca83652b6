"""``kind: sum`` — the sum over persons of each person's total of one numeric column.

A person's total is the sum of their usable records of the column (after the summary's record
rules: ``summary.m_min``, ``summary.max_records_per_person``, non-finite values dropped): the
shared summary's mean times its record count, a derived per-person column
(:meth:`StatisticKind.derived_columns`, :mod:`dplib.derived`). No bounds from the user: the
scale-free mean's private stages on the totals find a centre and a clipping radius, then one
Laplace release of the clipped sum (:mod:`dplib.sums`). (The module is ``total`` so that it does
not shadow the builtin ``sum`` in the registry.)
"""

from __future__ import annotations

from typing import Literal

from dplib.derived import total_column
from dplib.sums import ALGORITHM, ALGORITHM_VERSION, ScaleFreeSumPlan, person_sum
from spark_jobs.kinds.base import Release, RunContext, StatisticKind
from spark_jobs.kinds.variance import OneColumnStatistic, scale_free_plan, stage_text

ESTIMAND_SUM = ("sum over persons of each person's total of {col} (the sum of their usable records: their mean "
                "times the records used, after the summary's record rules)")


class SumStatistic(OneColumnStatistic):
    """One ``kind: sum`` statistic: one numeric column."""

    kind: Literal["sum"]


class SumKind(StatisticKind):
    """``kind: sum``: estimate shape (1,), data units; (epsilon, delta)-DP (pure with delta = 0)
    under add/remove of one person (all their records)."""

    config_model = SumStatistic

    def groupable(self, stat) -> bool:
        return True

    def derived_columns(self, stat) -> dict[str, tuple[str, str]]:
        return {total_column(stat.columns[0]): (stat.columns[0], "total")}

    def plan(self, stat, cfg):
        return scale_free_plan(ScaleFreeSumPlan, stat, cfg)

    def describe(self, name: str, plan) -> str:
        cap = "" if plan.k is None else f", tail nu capped at k={plan.k:g}"
        return (f"  {name}: scale-free sum of the persons' totals (centre and radius found privately; "
                f"{stage_text(plan)}: Laplace on the clipped sum){cap}")

    def run(self, stat, plan, ctx: RunContext) -> Release:
        column = stat.columns[0]
        rel = person_sum(ctx.aggregates_for(self, stat), total_column(column), plan, ctx.noise, ctx.accountant,
                         f"{stat.name}: ")
        return Release.of(rel, estimand=ESTIMAND_SUM.format(col=column), algorithm=ALGORITHM,
                          algorithm_version=ALGORITHM_VERSION, estimate_shape=[1], parameters=ctx.summary_extras())


KIND = SumKind()
