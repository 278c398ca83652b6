"""``kind: count`` — the number of persons with a value of every listed column (pure epsilon-DP,
Laplace, sensitivity 1; :mod:`dplib.count`). Persons with fewer than ``summary.m_min`` usable
records of a column do not count, as for every statistic on the shared summary.

This kind is also the worked example of a plug-in: this module and one line in
:data:`spark_jobs.kinds.REGISTRY` are all it took.
"""

from __future__ import annotations

from typing import Literal

from dplib.count import ALGORITHM, ALGORITHM_VERSION, PersonCountPlan, person_count
from spark_jobs.kinds.base import Frozen, Release, RunContext, StatisticConfigBase, StatisticKind

ESTIMAND_COUNT = "number of persons with a value of every one of ({cols}) (at least summary.m_min records each)"


class CountOptions(Frozen):
    """``kind: count`` takes no options."""


class CountStatistic(StatisticConfigBase):
    """One ``kind: count`` statistic: the columns whose persons are counted; no options."""

    kind: Literal["count"]
    options: CountOptions = CountOptions()


class CountKind(StatisticKind):
    """``kind: count``: epsilon-DP (Laplace, sensitivity 1); estimate shape (1,), persons."""

    config_model = CountStatistic

    def groupable(self, stat) -> bool:
        return True

    def plan(self, stat, cfg):
        return PersonCountPlan(budget=stat.budget(cfg))

    def describe(self, name: str, plan) -> str:
        return f"  {name}: person count, Laplace (sensitivity 1, pure epsilon={plan.budget.epsilon:.4g})"

    def run(self, stat, plan, ctx: RunContext) -> Release:
        rel = person_count(ctx.aggregates, list(stat.columns), plan, ctx.noise, ctx.accountant, f"{stat.name}: ")
        return Release.of(rel, estimand=ESTIMAND_COUNT.format(cols=", ".join(stat.columns)), algorithm=ALGORITHM,
                          algorithm_version=ALGORITHM_VERSION, estimate_shape=[1], parameters=ctx.summary_extras())


KIND = CountKind()
