"""``kind: distribution`` — the person-level distribution of one categorical column over public
categories (+ OTHER).

Estimators: ``shares`` (default without ``m``; :mod:`dplib.distribution.shares`) or the batch
estimators P0-P3 that draw ``m`` records per person (:mod:`dplib.distribution.private`; Kamath,
Majid, Moitra, Mouzakis, Ullman: P3 is the robust and private estimator). The per-person input
(batches or category shares) is built from the records by this kind, not from the shared summary.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import field_validator, model_validator

from dplib.distribution.batches import check_batch_size, check_categories
from dplib.distribution.frc import check_rate
from dplib.distribution.p3 import (
    check_alpha, check_closeness_radius, check_grid_resolution, grid_resolution, grid_size, p3_setup,
)
from dplib.distribution.private import ALGORITHM as DIST_ALGORITHM
from dplib.distribution.private import BETA_LIMITS, P3_COUNT_SHARE_LIMITS
from dplib.distribution.private import ALGORITHM_VERSION as DIST_VERSION
from dplib.distribution.private import ESTIMATOR_NAMES, DistributionPlan, private_distribution
from dplib.distribution.shares import ALGORITHM as SHARES_ALGORITHM
from dplib.distribution.shares import ALGORITHM_VERSION as SHARES_VERSION
from dplib.distribution.shares import SharePlan, share_distribution
from spark_jobs.kinds.base import Frozen, dplib_check, Release, RunContext, StatisticConfigBase, StatisticKind

ESTIMAND_SHARES = (
    "mean over persons of each person's distribution of {col} over the public categories (+ OTHER), "
    "over all of the person's records (persons weighted equally)"
)
ESTIMAND_DISTRIBUTION = (
    "mean over persons of each person's distribution of {col} over the public categories (+ OTHER), "
    "from m={m} of the person's records drawn uniformly without replacement (persons with fewer "
    "than m records left out; persons weighted equally)"
)


class DistributionOptions(Frozen):
    """Options of ``kind: distribution`` (``dplib.distribution``; spec discrete_batches.md §3.7).

    ``categories``: the **public, fixed** category list (written in the config from public
    knowledge, never derived from the data); values outside it and nulls count as ``OTHER``,
    appended as the last coordinate. ``estimator``: ``shares`` (the default without ``m``:
    Laplace on the sum of each person's category shares over **all** their records; pure
    epsilon; ``dplib.distribution.shares``), or a batch estimator that draws ``m`` records per
    person (the default with ``m`` is P0). ``m``: draws per person (persons with fewer records are
    left out; more: m drawn uniformly without replacement in keyed-hash order). Batch estimators:
    P0 (pooled Laplace, pure epsilon), P1 (l1-clipped Laplace around a private
    centre, pure epsilon), P2 (l2-clipped Gaussian, needs delta > 0) or P3 (robust and private:
    exponential mechanism on a simplex grid with the certified FRC score, pure epsilon, k <= 5
    including OTHER; runs on a DP lower bound n0 of the persons, padded). ``beta``: failure
    probability in the radii (P3: of n0 and tau_cov's null term). ``eta``, ``omega``:
    corruption bound and heterogeneity radius, **unused by P0-P2**; P3's trimming level
    (default from alpha and m) and heterogeneity allowance. ``alpha`` (P3, default 0.06):
    accuracy target (l1) that sets the grid G = ceil(2k/alpha) and eta_priv;
    ``grid_resolution`` (P3): G, overrides the default; ``closeness_radius`` (P3, default 0):
    l1 radius of the score's neighbourhood minimum (0 = none; one grid step is 2/G; the spec's
    alpha flattens the score and costs accuracy, benchmarks/README.md); ``p3_count_share``
    (P3, default 0.1): share of epsilon spent on the DP count n0. All public and fixed (the grid
    is never chosen from the data). ``record_label_columns``:
    the columns that name a record in the sampling order (default: the category column alone,
    which gives the same law of the batches as naming records by every column and is the
    fastest plan; the category column is always added, so the draws cannot depend on it).
    """

    categories: tuple[str, ...]
    m: int | None = None
    estimator: Literal["shares", "P0", "P1", "P2", "P3"] | None = None
    beta: float = 0.05
    eta: float | None = None
    omega: float | None = None
    alpha: float = 0.06
    grid_resolution: int | None = None
    closeness_radius: float = 0.0
    p3_count_share: float = 0.1
    record_label_columns: tuple[str, ...] | None = None

    @field_validator("alpha")
    @classmethod
    def _alpha(cls, v: float) -> float:
        return dplib_check(check_alpha, v)

    @field_validator("closeness_radius")
    @classmethod
    def _radius(cls, v: float) -> float:
        return dplib_check(check_closeness_radius, v)

    @field_validator("p3_count_share")
    @classmethod
    def _share(cls, v: float) -> float:
        lo, hi = P3_COUNT_SHARE_LIMITS
        if not (math.isfinite(v) and lo <= v < hi):
            raise ValueError(f"must be in [{lo:g}, {hi:g}) (P3's share of epsilon for the count n0; got {v!r})")
        return v

    @field_validator("grid_resolution")
    @classmethod
    def _grid(cls, v: int | None) -> int | None:
        return v if v is None else dplib_check(check_grid_resolution, v)

    @model_validator(mode="after")
    def _p3(self) -> "DistributionOptions":
        if self.estimator is None:  # default: every record (shares); with m, the batch baseline P0
            object.__setattr__(self, "estimator", "shares" if self.m is None else "P0")
        if self.estimator == "shares":
            if self.m is not None:
                raise ValueError("m is not used by estimator 'shares' (every record of every person counts); "
                                 "drop m, or name a batch estimator (P0-P3) that draws m records per person")
            for name in ("eta", "omega", "grid_resolution", "closeness_radius", "p3_count_share", "record_label_columns"):
                if name in self.model_fields_set:
                    raise ValueError(f"{name} is not used by estimator 'shares'")
            return self
        if self.m is None:
            raise ValueError(f"estimator {self.estimator} draws m records per person: options.m is required")
        if self.m < 1:
            raise ValueError(f"m must be an integer >= 1 (got {self.m!r})")
        if self.estimator != "P3":
            for name in ("grid_resolution", "closeness_radius", "p3_count_share"):
                if name in self.model_fields_set:
                    raise ValueError(f"{name} is for estimator P3")
            return self
        if self.beta >= 0.5:
            raise ValueError(f"beta must be < 0.5 for estimator P3 (got {self.beta!r})")
        try:
            p3_setup(len(self.categories) + 1, self.m, 1, self.alpha, self.grid_resolution, self.eta, self.omega, self.beta,
                     closeness_radius=self.closeness_radius)
        except Exception as err:  # InvalidParameterError -> a config error naming the option
            raise ValueError(f"estimator P3: {err}") from err
        return self

    @field_validator("categories")
    @classmethod
    def _cats(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        try:
            return check_categories(v)
        except Exception as err:  # InvalidParameterError -> a config error naming the field
            raise ValueError(str(err)) from err

    @field_validator("m")
    @classmethod
    def _m(cls, v: int | None) -> int | None:
        return v if v is None else dplib_check(check_batch_size, v)

    @field_validator("beta")
    @classmethod
    def _beta(cls, v: float) -> float:
        lo, hi = BETA_LIMITS
        if not (lo <= v < hi):
            raise ValueError(f"must be in [{lo:g}, {hi:g}) (got {v!r})")
        return v

    @field_validator("eta")
    @classmethod
    def _eta(cls, v: float | None) -> float | None:
        return v if v is None else dplib_check(check_rate, "eta", v)

    @field_validator("omega")
    @classmethod
    def _omega(cls, v: float | None) -> float | None:
        return v if v is None else dplib_check(check_rate, "omega", v)


class DistributionStatistic(StatisticConfigBase):
    """One ``kind: distribution`` statistic: exactly one categorical column; ``options.categories``
    (the public list) is required."""

    kind: Literal["distribution"]
    options: DistributionOptions

    @model_validator(mode="before")
    @classmethod
    def _needs_categories(cls, data):
        if isinstance(data, dict) and not data.get("options"):
            raise ValueError("kind 'distribution' needs options.categories (the public list)")
        return data

    @model_validator(mode="after")
    def _one_column(self) -> "DistributionStatistic":
        if len(self.columns) != 1:
            raise ValueError(f"kind 'distribution' takes exactly one categorical column (got {list(self.columns)})")
        return self


class DistributionKind(StatisticKind):
    """``kind: distribution``: estimate shape (k,) on the simplex (OTHER last); pure epsilon except P2."""

    config_model = DistributionStatistic

    def value_columns(self, stat) -> list[str]:
        return []

    def categorical_columns(self, stat) -> list[str]:
        return list(stat.columns) + list(stat.options.record_label_columns or [])

    def check_job(self, stat, cfg) -> None:
        if stat.options.estimator == "P2" and cfg.budget.delta == 0:
            raise ValueError(
                f"statistic {stat.name!r}: estimator P2 (Gaussian) needs budget.delta > 0; use P0 or P1 for pure epsilon"
            )

    def plan(self, stat, cfg):
        opts = stat.options
        if opts.estimator == "shares":
            return SharePlan(budget=stat.budget(cfg), categories=opts.categories)
        return DistributionPlan(
            budget=stat.budget(cfg),
            categories=opts.categories,
            m=opts.m,
            estimator=opts.estimator,
            beta=opts.beta,
            eta=opts.eta,
            omega=opts.omega,
            budget_mode=cfg.budget.budget_mode,
            alpha=opts.alpha,
            grid_resolution=opts.grid_resolution,
            closeness_radius=opts.closeness_radius,
            p3_count_share=opts.p3_count_share,
        )

    def describe(self, name: str, p) -> str:
        if isinstance(p, SharePlan):
            return (f"  {name}: distribution over k={p.k} categories ({p.k - 1} listed + OTHER last), estimator shares: "
                    "Laplace on the sum of each person's category shares over all their records (no person or "
                    "record dropped; pure epsilon)")
        if p.estimator == "P3":
            G = p.grid_resolution or grid_resolution(p.k, p.alpha)
            return (f"  {name}: distribution over k={p.k} categories ({p.k - 1} listed + OTHER last), m={p.m} draws per person "
                    f"(fewer: person left out), estimator P3: {ESTIMATOR_NAMES['P3']}; grid G={G} "
                    f"({grid_size(p.k, G)} points), alpha={p.alpha:g}, closeness radius={p.closeness_radius:g}, "
                    f"count share={p.p3_count_share:g}; exactly n0 persons (DP lower bound, "
                    f"keyed-hash rank, padded with all-OTHER batches)")
        return (f"  {name}: distribution over k={p.k} categories ({p.k - 1} listed + OTHER last), m={p.m} draws per person "
                f"(fewer: person left out), estimator {p.estimator}: {ESTIMATOR_NAMES[p.estimator]}; "
                f"radii from public inputs and the DP centre; eta/omega unused by P0-P2")

    def run(self, stat, plan, ctx: RunContext) -> Release:
        from spark_jobs.spark.batches import SparkShareSums, person_batches, person_shares  # lazy: keeps pyspark out
        from spark_jobs.spark.fixed_n import SparkFixedNBatches  # lazy: keeps pyspark out of Spark-free imports

        cfg, column, prefix = ctx.cfg, stat.columns[0], f"{stat.name}: "
        unit, nulls = cfg.privacy_unit.column, cfg.privacy_unit.null_values
        if isinstance(plan, SharePlan):
            shares = person_shares(ctx.records, unit, column, plan.categories, ctx.salt, null_values=nulls).persist()
            try:
                rel = share_distribution(SparkShareSums(shares, plan.k), plan, ctx.noise, ctx.accountant, prefix)
            finally:
                shares.unpersist()
            return Release.of(rel, estimand=ESTIMAND_SHARES.format(col=column), algorithm=SHARES_ALGORITHM,
                              algorithm_version=SHARES_VERSION, estimate_shape=[plan.k])
        batches = person_batches(
            ctx.records, unit, column, plan.categories, plan.m, ctx.salt,
            label_columns=stat.options.record_label_columns, null_values=nulls,
        ).persist()
        try:
            backend = SparkFixedNBatches(batches, plan.k, plan.m)
            rel = private_distribution(backend, plan, ctx.noise, ctx.accountant, prefix, ctx.prepared.get(stat.name))
        finally:
            batches.unpersist()
        # noise_scale None: P3 (exponential mechanism)
        return Release.of(rel, estimand=ESTIMAND_DISTRIBUTION.format(col=column, m=plan.m),
                          algorithm=f"{DIST_ALGORITHM}-{plan.estimator}", algorithm_version=DIST_VERSION,
                          estimate_shape=[plan.k])


KIND = DistributionKind()
