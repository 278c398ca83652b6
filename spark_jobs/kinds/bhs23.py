"""``kind: mean_affine | gaussian`` (and ``covariance`` with the default estimator) — BHS23.

The stable, affine-invariant mean (Algorithm 1), covariance (Algorithm 5.1 on pairs) and both
(Algorithm 5.2) of the person vectors (each person's mean of their records), on exactly n0
persons (a DP lower bound) — Brown, Hopkins, Smith 2023 (:mod:`dplib.covariance.person`).
Approximate DP: needs ``budget.delta > 0``. ``kind: covariance`` lives in
:mod:`spark_jobs.kinds.covariance` and uses this module for its ``bhs23`` estimator.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
from pydantic import field_validator, model_validator

from dplib.covariance.params import ALGORITHM_VERSION as BHS_VERSION
from dplib.covariance.person import PersonBHSPlan, private_person_statistic
from dplib.groups import derive_salt
from spark_jobs.kinds.base import Frozen, Release, RunContext, StatisticConfigBase, StatisticKind

ESTIMAND_BHS = {
    "mean_affine": "mean of the person vectors ({cols}) (each person's mean of their records; persons weighted equally)",
    "covariance": "covariance of the person vectors ({cols}) (each person's mean of their records)",
    "gaussian": "mean (row 0) and covariance (rows 1..d) of the person vectors ({cols}) (each person's mean of their records)",
}
BHS_HETEROGENEOUS = (
    "person vectors are means over different numbers of records: a scale mixture, which raises the "
    "FAIL rate and lowers accuracy, never privacy (spec section 7.4)"
)
NO_BAR = "none: BHS23 releases a draw (mean) or a Wishart (covariance); no error bar"


#: Config kinds of BHS23 (dplib.covariance.person): Algorithm 1, 5.1 on pairs, 5.2.
BHS_KINDS = ("mean_affine", "covariance", "gaussian")


class CovarianceOptions(Frozen):
    """Options of ``kind: mean_affine | covariance | gaussian`` (BHS23, ``dplib.covariance.person``).

    ``lambda0`` (and ``lambda0_cov``, Algorithm 5.1's part of ``gaussian``): outlier thresholds,
    public; default the library's rule at the DP n0. ``beta``: probability that n0 exceeds the
    person count (then the set is padded with ``dummy``, a public vector, default zeros).
    ``expected_persons``: a declared public person count; a config below the gate is refused
    before any budget is reserved.
    """

    lambda0: float | None = None
    lambda0_cov: float | None = None
    beta: float = 0.05
    dummy: tuple[float, ...] | None = None
    expected_persons: int | None = None
    #: kind ``covariance`` only (its own default is ``auto``, :mod:`spark_jobs.kinds.covariance`):
    #: ``auto`` (BHS23 when a DP lower bound on the person count passes its gate, else ``clipped``;
    #: ``dplib.covariance.auto``), ``bhs23`` (needs ~10^5 persons at d = 4, else FAIL) or
    #: ``clipped`` (clip-and-noise around a private mean, scales and radius: from a few thousand
    #: persons; ``dplib.covariance.clipped``). The BHS23 options above do not apply to
    #: ``clipped``; ``expected_persons`` is for ``bhs23`` only. The other BHS23 kinds keep the
    #: value ``bhs23`` (so their config hashes did not change when ``auto`` was added).
    estimator: Literal["auto", "bhs23", "clipped"] = "bhs23"

    @field_validator("lambda0", "lambda0_cov")
    @classmethod
    def _lam(cls, v: float | None) -> float | None:
        if v is not None and not (math.isfinite(v) and v > 0):
            raise ValueError(f"must be a finite number > 0 (got {v!r})")
        return v

    @field_validator("beta")
    @classmethod
    def _beta(cls, v: float) -> float:
        if not (math.isfinite(v) and 0 < v < 0.5):
            raise ValueError(f"must be in (0, 0.5) (got {v!r})")
        return v


class BHSStatisticBase(StatisticConfigBase):
    """Fields and checks shared by the BHS23 kinds (``mean_affine``, ``covariance``, ``gaussian``)."""

    options: CovarianceOptions = CovarianceOptions()

    @model_validator(mode="before")
    @classmethod
    def _null_options(cls, data):
        if isinstance(data, dict) and "options" in data and data["options"] is None:
            data = {k: v for k, v in data.items() if k != "options"}
        return data

    @model_validator(mode="after")
    def _bhs_checks(self):
        o, kind = self.options, self.kind
        self.check_distinct_columns()
        if o.dummy is not None and len(o.dummy) != len(self.columns):
            raise ValueError(f"options.dummy must hold one value per column ({len(self.columns)}), got {len(o.dummy)}")
        if o.lambda0_cov is not None and kind != "gaussian":
            raise ValueError("options.lambda0_cov is for kind 'gaussian' (kind 'covariance' takes options.lambda0)")
        if o.estimator != "bhs23" and kind != "covariance":
            raise ValueError(f"options.estimator is for kind 'covariance', not {kind!r}")
        if kind == "covariance" and o.estimator == "auto" and o.expected_persons is not None:
            raise ValueError("options.expected_persons is for estimator 'bhs23' (estimator 'auto' counts the "
                             "persons privately and picks BHS23 or the clipped estimator)")
        if kind == "covariance" and o.estimator != "bhs23" and len(self.columns) < 2:
            raise ValueError("kind 'covariance' needs at least 2 columns (one column: kind 'variance', or "
                             "options.estimator 'bhs23')")
        if o.estimator == "clipped":
            bhs_only = [n for n in ("lambda0", "lambda0_cov", "dummy", "expected_persons") if getattr(o, n) is not None]
            if bhs_only or o.beta != 0.05:
                raise ValueError(f"options {bhs_only or ['beta']} are BHS23's; estimator 'clipped' takes none")
        return self


class MeanAffineStatistic(BHSStatisticBase):
    """One ``kind: mean_affine`` statistic: BHS23 Algorithm 1 on the person vectors of d distinct columns."""

    kind: Literal["mean_affine"]


class GaussianStatistic(BHSStatisticBase):
    """One ``kind: gaussian`` statistic: BHS23 Algorithm 5.2 (mean and covariance, shape (d + 1, d))."""

    kind: Literal["gaussian"]


class BHSKind(StatisticKind):
    """The BHS23 kinds ``mean_affine`` and ``gaussian`` (``covariance``: a subclass elsewhere)."""

    def needs_person_id(self, stat) -> bool:
        return True  # BHS23 orders persons by a keyed hash of their id

    def check_job(self, stat, cfg) -> None:
        if cfg.budget.delta == 0:
            raise ValueError(f"budget.delta must be > 0 for kinds {list(BHS_KINDS)} (BHS23, approximate DP)")

    def plan(self, stat, cfg):
        opts = stat.options
        return PersonBHSPlan(
            kind=stat.kind,
            budget=stat.budget(cfg),
            d=len(stat.columns),
            lambda0=opts.lambda0,
            lambda0_cov=opts.lambda0_cov,
            beta=opts.beta,
            dummy=opts.dummy,
            expected_persons=opts.expected_persons,
        )

    def describe(self, name: str, p) -> str:
        lam = "default rule at n0" if p.lambda0 is None else f"{p.lambda0:g}"
        return (f"  {name}: BHS23 {p.kind}, d={p.d}, lambda0 {lam}; exactly n0 persons (DP lower bound, "
                f"beta={p.beta:g}, keyed-hash rank, padded with the public dummy); needs n0 >= "
                f"{p.minimum_persons()} persons, else FAIL (charged)")

    def run(self, stat, plan, ctx: RunContext) -> Release:
        """Person vectors read from the run's cached summary (no second pass over the records)."""
        from spark_jobs.spark.vectors import SparkPersonVectors, vectors_from_summary  # lazy: keeps pyspark out

        columns = list(stat.columns)
        persons = vectors_from_summary(ctx.summary, columns)
        # each BHS23 statistic draws its own random order and reference set (a salt derived from the
        # run's salt and the statistic's name), so two statistics of one run never share them
        vectors = SparkPersonVectors(persons, columns, derive_salt(ctx.salt, stat.name))
        out = private_person_statistic(vectors, plan, ctx.noise, ctx.accountant, f"{stat.name}: ")
        rel = out.release
        d = len(columns)
        shape = [d, d] if plan.kind == "covariance" else ([d + 1, d] if plan.kind == "gaussian" else [d])
        estimate = None
        if not rel.failed:
            parts = {"mean_affine": [rel.mean], "covariance": [rel.covariance], "gaussian": [rel.mean, rel.covariance]}
            estimate = [float(v) for a in parts[plan.kind] for v in np.ravel(a)]
        params = {**rel.parameters, "coordinates": columns, "estimate_layout": shape, "hardening": rel.hardening,
                  **ctx.summary_extras(), "unequal_records": BHS_HETEROGENEOUS}
        return Release(
            estimand=ESTIMAND_BHS[plan.kind].format(cols=", ".join(columns)), algorithm=rel.algorithm,
            algorithm_version=BHS_VERSION, status=rel.status, epsilon=float(rel.epsilon), delta=float(rel.delta),
            estimate=estimate, estimate_shape=shape, error_covers=NO_BAR, parameters=params,
        )


class MeanAffineKind(BHSKind):
    """``kind: mean_affine``: (epsilon, delta)-DP under add/remove one person (BHS23 Algorithm 1)."""

    config_model = MeanAffineStatistic


class GaussianKind(BHSKind):
    """``kind: gaussian``: (epsilon, delta)-DP under add/remove one person (BHS23 Algorithm 5.2)."""

    config_model = GaussianStatistic


MEAN_AFFINE = MeanAffineKind()
GAUSSIAN = GaussianKind()
