"""``kind: covariance`` — the covariance of the person vectors (each person's mean of their records).

``options.estimator: bhs23`` (default): BHS23's stable covariance (:mod:`spark_jobs.kinds.bhs23`;
needs ~10^5 persons at d = 4). ``clipped``: clip-and-noise around a private mean, scales and
radius (:mod:`dplib.covariance.clipped`; from a few thousand persons).
"""

from __future__ import annotations

from typing import Literal

from dplib.covariance.clipped import ALGORITHM as CLIPPED_COV_ALGORITHM
from dplib.covariance.clipped import ALGORITHM_VERSION as CLIPPED_COV_VERSION
from dplib.covariance.clipped import ClippedCovariancePlan, clipped_covariance
from spark_jobs.kinds.base import Release, RunContext
from spark_jobs.kinds.bhs23 import ESTIMAND_BHS, BHSKind, BHSStatisticBase


class CovarianceStatistic(BHSStatisticBase):
    """One ``kind: covariance`` statistic: d >= 2 distinct columns (``clipped``) or BHS23 options."""

    kind: Literal["covariance"]


class CovarianceKind(BHSKind):
    """``kind: covariance``: (epsilon, delta)-DP; estimate shape (d, d), data units squared."""

    config_model = CovarianceStatistic

    def groupable(self, stat) -> bool:
        return stat.options.estimator == "clipped"

    def needs_person_id(self, stat) -> bool:
        return stat.options.estimator != "clipped"

    def plan(self, stat, cfg):
        if stat.options.estimator == "clipped":
            return ClippedCovariancePlan(budget=stat.budget(cfg), d=len(stat.columns))
        return super().plan(stat, cfg)

    def describe(self, name: str, p) -> str:
        if not isinstance(p, ClippedCovariancePlan):
            return super().describe(name, p)
        return (f"  {name}: clipped covariance, d={p.d}: the scale-free multivariate mean first "
                f"({p.mean_plan().budget.epsilon:.4g} of epsilon; needs a few thousand persons at d = 4, "
                "else INSUFFICIENT_DATA and the second stage is not charged), then Gaussian noise on the "
                "clipped second moment")

    def run(self, stat, plan, ctx: RunContext) -> Release:
        if not isinstance(plan, ClippedCovariancePlan):
            return super().run(stat, plan, ctx)
        columns = list(stat.columns)
        d = len(columns)
        rel = clipped_covariance(ctx.aggregates, columns, plan, ctx.noise, ctx.accountant, f"{stat.name}: ")
        params = {**rel.parameters, "coordinates": columns, "estimate_layout": [d, d], **ctx.summary_extras()}
        return Release(
            estimand=ESTIMAND_BHS["covariance"].format(cols=", ".join(columns)), algorithm=CLIPPED_COV_ALGORITHM,
            algorithm_version=CLIPPED_COV_VERSION, status=rel.status, epsilon=float(rel.epsilon),
            delta=float(rel.delta),
            estimate=None if rel.covariance is None else [float(v) for v in rel.covariance.ravel()],
            estimate_shape=[d, d], error_covers=rel.error_covers, parameters=params,
        )


KIND = CovarianceKind()
