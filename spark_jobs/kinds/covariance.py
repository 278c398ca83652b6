"""``kind: covariance`` — the covariance of the person vectors (each person's mean of their records).

``options.estimator: auto`` (default): a DP person count picks BHS23 when its lower bound passes
BHS23's gate, else the clipped estimator (:mod:`dplib.covariance.auto`). ``bhs23``: BHS23's
stable covariance only (:mod:`spark_jobs.kinds.bhs23`; needs ~10^5 persons at d = 4, else FAIL).
``clipped``: clip-and-noise around a private mean, scales and radius
(:mod:`dplib.covariance.clipped`; from a few thousand persons).
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from dplib.covariance.auto import ALGORITHM as AUTO_ALGORITHM
from dplib.covariance.auto import AutoCovariancePlan, auto_covariance
from dplib.covariance.clipped import ALGORITHM as CLIPPED_COV_ALGORITHM
from dplib.covariance.clipped import ALGORITHM_VERSION as CLIPPED_COV_VERSION
from dplib.covariance.clipped import SMALL_DATA_N_EPS, ClippedCovariancePlan, clipped_covariance
from spark_jobs.kinds.base import Release, RunContext
from dplib.covariance.params import ALGORITHM_VERSION as BHS_VERSION
from dplib.groups import derive_salt
from spark_jobs.kinds.bhs23 import BHS_HETEROGENEOUS, ESTIMAND_BHS, BHSKind, BHSStatisticBase, CovarianceOptions


class CovarianceKindOptions(CovarianceOptions):
    """``kind: covariance``'s options: those of BHS23 and ``estimator``, default ``auto``."""

    estimator: Literal["auto", "bhs23", "clipped"] = "auto"


class CovarianceStatistic(BHSStatisticBase):
    """One ``kind: covariance`` statistic: d >= 2 distinct columns (``auto``, ``clipped``) or BHS23 options."""

    kind: Literal["covariance"]
    options: CovarianceKindOptions = CovarianceKindOptions()


def _clipped_needs(p: ClippedCovariancePlan) -> str:
    """The dry run's statement of how many persons the clipped estimator needs at this budget."""
    need = p.mean_plan().joint_range_minimum_persons()
    text = (f"releases from about {need:,} persons at this budget (its joint range's confirmation, with 3/4 of "
            "the persons in one two-octave bucket of their norms; a release, not necessarily a useful one)")
    if p.small_data:
        return text + (
            "; measured at d = 4 and epsilon 0.9 with columns in units 0.1 to 10 (error after putting each column "
            "in its own standard deviations): 1.4x that of a clamped per-entry mean given the data's own bounds "
            "at 1,000-2,000 persons, 1.8x at 700, 2.9x at 500; matrix-wide (relative Frobenius) 0.8-1.1x")
    return text + ("; the large-data layout: below a few thousand persons columns in very different units can "
                   "share a scale (a DP count picks the small-data layout there)")


class CovarianceKind(BHSKind):
    """``kind: covariance``: (epsilon, delta)-DP; estimate shape (d, d), data units squared."""

    config_model = CovarianceStatistic

    def groupable(self, stat) -> bool:
        return stat.options.estimator == "clipped"

    def needs_person_id(self, stat) -> bool:
        return stat.options.estimator != "clipped"

    def plan(self, stat, cfg):
        if stat.options.estimator == "clipped":
            # a DP person count picks the layout (small data below SMALL_DATA_N_EPS); never BHS23
            return AutoCovariancePlan(budget=stat.budget(cfg), d=len(stat.columns), bhs=False)
        if stat.options.estimator == "auto":
            o = stat.options
            return AutoCovariancePlan(budget=stat.budget(cfg), d=len(stat.columns), lambda0=o.lambda0, beta=o.beta,
                                      dummy=o.dummy)
        return super().plan(stat, cfg)

    def describe(self, name: str, p) -> str:
        if isinstance(p, AutoCovariancePlan) and not p.bhs:
            small = p.clipped_plan(0.0)
            below = int(SMALL_DATA_N_EPS / p.rest_budget.epsilon)
            return (f"  {name}: clipped covariance, d={p.d}: a DP person count ({p.count_budget.epsilon:.4g} of "
                    "epsilon) picks the layout of the scale-free multivariate mean that comes first (at "
                    f"{p.clipped_plan().mean_plan().budget.epsilon:.4g} of epsilon, or at "
                    f"{small.mean_plan().budget.epsilon:.4g} with its small-data layout when the count is below about "
                    f"{below:,} persons, which {_clipped_needs(small)}; else INSUFFICIENT_DATA and the second stage "
                    "is not charged), then Gaussian noise on the clipped second and first moments and the count, "
                    "with per-entry 90% error bars")
        if isinstance(p, AutoCovariancePlan):
            need = p.bhs_minimum_persons()
            bhs = (f"BHS23 when the DP lower bound n0 on the person count is at least {need} (its gate at this "
                   "budget)" if need is not None else f"never BHS23 ({p.bhs_unavailable()})")
            small = p.clipped_plan(0.0)
            below = int(SMALL_DATA_N_EPS / p.rest_budget.epsilon)
            return (f"  {name}: covariance, d={p.d}, estimator auto: a DP person count "
                    f"({p.count_budget.epsilon:.4g} of epsilon), then {bhs}, else the clipped estimator (the "
                    f"scale-free multivariate mean at {p.clipped_plan().mean_plan().budget.epsilon:.4g} of epsilon, "
                    f"or at {small.mean_plan().budget.epsilon:.4g} with its small-data layout when the count is "
                    f"below about {below:,} persons, which {_clipped_needs(small)}; then Gaussian noise on the "
                    "clipped second and first moments and the count, with per-entry 90% error bars; the second "
                    "stage is not charged if the first is INSUFFICIENT_DATA)")
        if not isinstance(p, ClippedCovariancePlan):
            return super().describe(name, p)
        return (f"  {name}: clipped covariance, d={p.d}: the scale-free multivariate mean first "
                f"({p.mean_plan().budget.epsilon:.4g} of epsilon; it {_clipped_needs(p)}; "
                "else INSUFFICIENT_DATA and the second stage is not charged), then Gaussian noise on the "
                "clipped second and first moments and the count, with per-entry 90% error bars")

    def run(self, stat, plan, ctx: RunContext) -> Release:
        if isinstance(plan, AutoCovariancePlan):
            return self._run_auto(stat, plan, ctx)
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
            error_bar=_flat(rel.error_bar), error_level=float(rel.error_level),
        )

    def _run_auto(self, stat, plan: AutoCovariancePlan, ctx: RunContext) -> Release:
        """``estimator: auto`` (person vectors for BHS23), or ``estimator: clipped`` (``plan.bhs``
        False: the DP count from the aggregates seam, also per group, then the clipped estimator in
        the layout it picks)."""
        columns = list(stat.columns)
        d = len(columns)
        vectors = None
        if plan.bhs:
            from spark_jobs.spark.vectors import SparkPersonVectors, vectors_from_summary  # lazy: keeps pyspark out

            vectors = SparkPersonVectors(vectors_from_summary(ctx.summary, columns), columns,
                                         derive_salt(ctx.salt, stat.name))
        rel = auto_covariance(ctx.aggregates, vectors, columns, plan, ctx.noise, ctx.accountant, f"{stat.name}: ")
        params = {**rel.parameters, "coordinates": columns, "estimate_layout": [d, d], **ctx.summary_extras()}
        if plan.bhs:
            params["auto"] = AUTO_ALGORITHM
        if rel.parameters["estimator_choice"]["chosen"] == "bhs23":
            params["unequal_records"] = BHS_HETEROGENEOUS
            version = BHS_VERSION
        else:
            version = CLIPPED_COV_VERSION
        return Release(
            estimand=ESTIMAND_BHS["covariance"].format(cols=", ".join(columns)), algorithm=rel.algorithm,
            algorithm_version=version, status=rel.status, epsilon=float(rel.epsilon), delta=float(rel.delta),
            estimate=None if rel.covariance is None else [float(v) for v in np.ravel(rel.covariance)],
            estimate_shape=[d, d], error_covers=rel.error_covers, parameters=params,
            error_bar=_flat(rel.error_bar), error_level=float(rel.error_level),
        )


def _flat(bar) -> list[float] | None:
    """A (d, d) bar, row-major like the estimate; None stays None."""
    return None if bar is None else [float(v) for v in np.ravel(bar)]


KIND = CovarianceKind()
