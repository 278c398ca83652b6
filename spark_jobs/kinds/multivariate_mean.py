"""``kind: multivariate_mean`` — the person-level mean vector of d numeric columns.

Default (no ``options.scales``, not ``records_iid``): the scale-free multivariate estimator
(:mod:`dplib.mean.scale_free_multivariate`). With declared scales or ``records_iid``: the paper's
multivariate estimator with coarse stage and TCN threads (:mod:`dplib.mean.multivariate`;
Agarwal et al. 2024, Algorithm 3). Approximate DP: needs ``budget.delta > 0``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import model_validator

from dplib.mean.multivariate import ALGORITHM as MV_ALGORITHM
from dplib.mean.multivariate import ALGORITHM_VERSION as MV_VERSION
from dplib.mean.multivariate import MultivariateMeanPlan, multivariate_person_mean
from dplib.mean.scale_free_multivariate import ALGORITHM as SFMV_ALGORITHM
from dplib.mean.scale_free_multivariate import ALGORITHM_VERSION as SFMV_VERSION
from dplib.mean.scale_free_multivariate import ScaleFreeMultivariatePlan, scale_free_multivariate_mean
from spark_jobs.kinds.base import Release, RunContext, StatisticConfigBase, StatisticKind
from spark_jobs.kinds.mean import MeanOptions

ESTIMAND_VECTOR = (
    "mean over persons of each person's mean vector of ({cols}) (persons weighted equally; "
    "persons without a value of every column left out)"
)
UNEQUAL_RECORDS_IID = (
    "records within a person asserted i.i.d.: radii use m = summary.m_min (public); persons with more "
    "records are averaged over all of them and still weighted equally"
)
UNEQUAL_RECORDS_IID_CAPPED = (
    "records within a person asserted i.i.d.: radii use m = summary.m_min (public); persons with more "
    "records are averaged over at most summary.max_records_per_person of them (a uniform draw) and "
    "still weighted equally"
)
UNEQUAL_RECORDS_SUMMARY = (
    "summary mode: each person's mean is one item (m = 1 in every formula), whatever the person's "
    "number of records"
)


class MultivariateMeanStatistic(StatisticConfigBase):
    """One ``kind: multivariate_mean`` statistic: d >= 1 distinct numeric columns."""

    kind: Literal["multivariate_mean"]
    options: MeanOptions = MeanOptions()

    @model_validator(mode="after")
    def _columns(self) -> "MultivariateMeanStatistic":
        o = self.options
        self.check_distinct_columns()
        for f in ("scale", "range_bound", "bounds"):
            if getattr(o, f) is not None:
                raise ValueError(
                    f"options.{f} is for kind 'mean'; kind 'multivariate_mean' takes options.scales "
                    "(one per column) and needs delta > 0"
                )
        if o.scales is not None and len(o.scales) != len(self.columns):
            raise ValueError(f"options.scales must hold one value per column ({len(self.columns)}), got {len(o.scales)}")
        return self


class MultivariateMeanKind(StatisticKind):
    """``kind: multivariate_mean``: estimate shape (d,), data units; (epsilon, delta)-DP, delta > 0."""

    config_model = MultivariateMeanStatistic

    def groupable(self, stat) -> bool:
        return True

    def check_job(self, stat, cfg) -> None:
        if cfg.budget.delta == 0:
            raise ValueError("budget.delta must be > 0 for kind 'multivariate_mean' (an approximate-DP estimator)")

    def plan(self, stat, cfg):
        opts = stat.options
        if opts.scales is None and not opts.records_iid:
            # the default: no scales, each person's mean one item (dplib.mean.scale_free_multivariate)
            return ScaleFreeMultivariatePlan(budget=stat.budget(cfg), d=len(stat.columns), k=opts.k)
        return MultivariateMeanPlan(
            budget=stat.budget(cfg),
            d=len(stat.columns),
            k=4.0 if opts.k is None else opts.k,
            mode="iid" if opts.records_iid else "summary",
            m=cfg.summary.m_min if opts.records_iid else 1,
            scales=opts.scales,
            expected_persons=opts.expected_persons,
            # the library default (parallel: measured to fail less often than sequential on
            # real panels of ~4,000-6,000 persons; dplib/mean/multivariate.py, issue 18)
        )

    def describe(self, name: str, plan) -> str:
        if isinstance(plan, ScaleFreeMultivariatePlan):
            cap = "" if plan.k is None else f", tail nu capped at k={plan.k:g}"
            return (f"  {name}: scale-free multivariate mean, d={plan.d} (ranges, centre, scales and l2 radius found "
                    f"privately; every stage on all persons, sequential: 4% ranges [+10% and +15% per-coordinate retries and a 10% joint-norm "
                    f"retry on small data], "
                    f"4% centre, 5% scales, 6% norm profile, the rest to one Gaussian clip-and-noise){cap}")
        how = "declared scales" if plan.scales is not None else "scales found privately"
        return (f"  {name}: multivariate mean, d={plan.d}, {how}, mode={plan.mode} (m={plan.m_model}), k={plan.k:g}; "
                f"TCN threads planned after the coarse stage from public/DP inputs")

    def run(self, stat, plan, ctx: RunContext) -> Release:
        columns = list(stat.columns)
        prefix = f"{stat.name}: "
        if isinstance(plan, ScaleFreeMultivariatePlan):
            rel = scale_free_multivariate_mean(ctx.aggregates, columns, plan, ctx.noise, ctx.accountant, prefix)
            algorithm, version = SFMV_ALGORITHM, SFMV_VERSION
        else:
            rel = multivariate_person_mean(ctx.aggregates, columns, plan, ctx.noise, ctx.accountant, prefix)
            algorithm, version = MV_ALGORITHM, MV_VERSION
        extra = ctx.summary_extras()
        if getattr(plan, "mode", "summary") != "iid":
            extra["unequal_records"] = UNEQUAL_RECORDS_SUMMARY
        elif ctx.cfg.summary.max_records_per_person is None:
            extra["unequal_records"] = UNEQUAL_RECORDS_IID
        else:
            extra["unequal_records"] = UNEQUAL_RECORDS_IID_CAPPED
        # noise_scale: the largest per-coordinate noise sd (all in parameters.noise_sd)
        return Release.of(rel, estimand=ESTIMAND_VECTOR.format(cols=", ".join(columns)), algorithm=algorithm,
                          algorithm_version=version, estimate_shape=[len(columns)], parameters=extra)


KIND = MultivariateMeanKind()
