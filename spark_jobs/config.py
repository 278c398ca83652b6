"""Job configuration: YAML validated into typed, frozen objects (pydantic v2).

Errors name the field path and the allowed values, e.g.
``budget.epsilon: must be finite and > 0 (got -1.0)``. See ``conf/examples/flights.yaml``.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError, field_validator, model_validator

from dplib.errors import ConfigError


def _takes_number(annotation) -> bool:
    """True if a field annotation admits a float or int (bare, optional or in a union)."""
    if annotation in (float, int):
        return True
    return any(_takes_number(a) for a in typing.get_args(annotation)) if typing.get_origin(annotation) in (
        typing.Union, types.UnionType) else False


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _no_bool_numbers(cls, data):
        """YAML's ``true`` is not a number: ``epsilon: true`` must not become 1.0."""
        if isinstance(data, dict):
            for name, field in cls.model_fields.items():
                if isinstance(data.get(name), bool) and _takes_number(field.annotation):
                    raise ValueError(f"{name}: must be a number, got a boolean ({str(data[name]).lower()})")
        return data


class InputConfig(_Frozen):
    """Where the records are. ``format``: parquet, delta or csv (csv with a header row)."""

    path: str = Field(min_length=1)
    format: Literal["parquet", "delta", "csv"] = "parquet"
    dataset: str | None = Field(default=None, description="dataset name recorded in the release")
    csv_options: dict[str, str] = Field(default_factory=lambda: {"header": "true"})


class PrivacyUnitConfig(_Frozen):
    """The privacy unit: one person = all records sharing a value of ``column``.

    Records whose id is null, or equal (after trimming) to one of ``null_values``, are dropped:
    there is no person to attribute them to.
    """

    column: str = Field(min_length=1)
    null_values: tuple[str, ...] = ("", "NA", "null", "NULL", "None")
    #: Normalise ids before grouping (Unicode NFC, case folded, surrounding whitespace of any kind
    #: stripped), so that spelling variants of one id are one person. Recommended when ids come
    #: from free text: without it each variant is a person of its own, and that person's records
    #: get the budget once per variant. Off by default (ids are taken verbatim).
    normalize: bool = False


#: A run's epsilon must lie in this range: below it the noise scales of the smallest stage shares
#: overflow (1e-310 gave an infinite Laplace scale after the reservation); above it the "noise" is
#: negligible and the privacy statement meaningless (an error bar at epsilon 1e300 misses by orders
#: of magnitude).
RUN_EPSILON_RANGE = (1e-4, 100.0)


class _EpsilonDelta(_Frozen):
    """Validation shared by budgets and limits: epsilon finite > 0, delta in [0, 1)."""

    epsilon: float
    delta: float = 0.0

    @field_validator("epsilon")
    @classmethod
    def _eps(cls, v: float) -> float:
        if not math.isfinite(v) or v <= 0:
            raise ValueError(f"must be finite and > 0 (got {v!r})")
        return v


    @field_validator("delta")
    @classmethod
    def _delta(cls, v: float) -> float:
        if not math.isfinite(v) or not (0.0 <= v < 1.0):
            raise ValueError(f"must be in [0, 1) (got {v!r})")
        return v


class BudgetConfig(_EpsilonDelta):
    """Total budget of one run (add/remove one person), and how stages compose.

    ``budget_mode``: ``sequential`` (the only mode): every stage of an estimator reads all of its
    persons and the stages compose sequentially. ``parallel`` (stages on disjoint hash ranges)
    was removed: against the exact dataset statistic its final stage on a fraction of the
    persons lost to clamping with good bounds (benchmarks/anchors); a config naming it is refused
    with that explanation.
    """

    epsilon: float
    delta: float = 1e-6
    budget_mode: Literal["sequential"] = "sequential"

    @field_validator("epsilon")
    @classmethod
    def _run_eps(cls, v: float) -> float:
        lo, hi = RUN_EPSILON_RANGE
        if not (lo <= v <= hi):
            raise ValueError(f"must be in [{lo:g}, {hi:g}] for one run (got {v!r})")
        return v

    @field_validator("budget_mode", mode="before")
    @classmethod
    def _no_parallel(cls, v):
        if v == "parallel":
            raise ValueError(
                "budget_mode: parallel was removed: every stage now reads all persons and the stages "
                "compose sequentially (the final stage on a fraction of the persons was less accurate "
                "than clamping with good bounds; docs/privacy/person_level_mean.md). Delete the line "
                "or write budget_mode: sequential"
            )
        return v



class MeanOptions(_Frozen):
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

    ``kind: multivariate_mean`` (``dplib.mean.multivariate``) takes ``k``, ``scales`` (optional
    public per-column scales, a diagonal preconditioner; found privately when absent),
    ``records_iid`` (assert records within a person are i.i.d.: the radii then use
    ``m = summary.m_min``; default: each person's mean is one item) and ``expected_persons``
    (optional public number of persons; else a DP count on 2% of the persons).
    """

    scale: float | None = None
    k: float | None = None
    range_bound: float | None = None
    coarse_fraction: float = 0.25
    exponent_range: tuple[int, int] = (-40, 60)
    scales: tuple[float, ...] | None = None
    records_iid: bool = False
    expected_persons: float | None = None

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
        if not (-1000 < v[0] < v[1] < 997):
            raise ValueError(f"must be [lo, hi] with -1000 < lo < hi < 997 (got {list(v)})")
        return v

    @field_validator("k")
    @classmethod
    def _k(cls, v: float | None) -> float | None:
        if v is not None and (math.isnan(v) or v < 2):
            raise ValueError(f"must be >= 2 or .inf (got {v!r})")
        return v

    @field_validator("range_bound")
    @classmethod
    def _r(cls, v: float | None) -> float | None:
        if v is not None and (not math.isfinite(v) or v <= 0):
            raise ValueError(f"must be finite and > 0 (got {v!r})")
        return v

    @field_validator("coarse_fraction")
    @classmethod
    def _cf(cls, v: float) -> float:
        if not (0.05 <= v <= 0.95):
            raise ValueError(f"must be in [0.05, 0.95] (got {v!r})")
        return v


class DistributionOptions(_Frozen):
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
        if not (math.isfinite(v) and 0.0 < v <= 2.0):
            raise ValueError(f"must be in (0, 2] (l1 closeness radius of P3; got {v!r})")
        return v

    @field_validator("closeness_radius")
    @classmethod
    def _radius(cls, v: float) -> float:
        if not (math.isfinite(v) and 0.0 <= v <= 2.0):
            raise ValueError(f"must be in [0, 2] (l1 closeness radius of P3, 0 = none; got {v!r})")
        return v

    @field_validator("p3_count_share")
    @classmethod
    def _share(cls, v: float) -> float:
        if not (math.isfinite(v) and 0.0 < v < 1.0):
            raise ValueError(f"must be in (0, 1) (P3's share of epsilon for the count n0; got {v!r})")
        return v

    @field_validator("grid_resolution")
    @classmethod
    def _grid(cls, v: int | None) -> int | None:
        if v is not None and v < 1:
            raise ValueError(f"must be an integer >= 1 (P3 grid points i/G; got {v!r})")
        return v

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
        from dplib.distribution.p3 import p3_setup

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
        from dplib.distribution.batches import check_categories

        try:
            return check_categories(v)
        except Exception as err:  # InvalidParameterError -> a config error naming the field
            raise ValueError(str(err)) from err

    @field_validator("m")
    @classmethod
    def _m(cls, v: int) -> int:
        if v < 1:
            raise ValueError(f"must be an integer >= 1 (draws per person), got {v!r}")
        return v

    @field_validator("beta")
    @classmethod
    def _beta(cls, v: float) -> float:
        if not (0.0 < v < 1.0):
            raise ValueError(f"must be in (0, 1) (got {v!r})")
        return v

    @field_validator("eta")
    @classmethod
    def _eta(cls, v: float | None) -> float | None:
        if v is not None and not (0.0 < v < 0.5):
            raise ValueError(f"must be in (0, 0.5) (got {v!r})")
        return v

    @field_validator("omega")
    @classmethod
    def _omega(cls, v: float | None) -> float | None:
        if v is not None and not (0.0 <= v < 1.0):
            raise ValueError(f"must be in [0, 1) (got {v!r})")
        return v


#: Config kinds of BHS23 (dplib.covariance.person): Algorithm 1, 5.1 on pairs, 5.2.
BHS_KINDS = ("mean_affine", "covariance", "gaussian")


class CovarianceOptions(_Frozen):
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
    #: kind ``covariance`` only: ``bhs23`` (default; needs ~10^5 persons at d = 4) or ``clipped``
    #: (clip-and-noise around a private mean, scales and radius: from a few thousand persons;
    #: ``dplib.covariance.clipped``). The BHS23 options above do not apply to ``clipped``.
    estimator: Literal["bhs23", "clipped"] = "bhs23"

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


def _options_kind(v: Any) -> str:
    """Which options model a mapping is: distribution options name ``categories`` or ``m``."""
    if isinstance(v, CovarianceOptions):
        return "covariance"
    if isinstance(v, dict) and v.get("estimator") in ("bhs23", "clipped"):
        return "covariance"
    if isinstance(v, DistributionOptions):
        return "distribution"
    if isinstance(v, dict) and ({"categories", "m", "estimator"} & set(v)):
        return "distribution"
    return "mean"


class StatisticConfig(_Frozen):
    """One released statistic. ``share``: its fraction of the run's budget (sequential
    composition across statistics, which all read the same persons)."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.\-]+$")
    kind: Literal["mean", "multivariate_mean", "distribution", "mean_affine", "covariance", "gaussian"]
    columns: tuple[str, ...] = Field(min_length=1)
    share: float
    options: Annotated[
        Union[
            Annotated[MeanOptions, Tag("mean")],
            Annotated[DistributionOptions, Tag("distribution")],
            Annotated[CovarianceOptions, Tag("covariance")],
        ],
        Discriminator(_options_kind),
    ] = MeanOptions()

    @model_validator(mode="before")
    @classmethod
    def _bhs_options(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("kind") in BHS_KINDS:
            opts = data.get("options") or {}
            if isinstance(opts, dict):
                data = {**data, "options": CovarianceOptions(**opts)}
        return data

    @field_validator("share")
    @classmethod
    def _share(cls, v: float) -> float:
        if not math.isfinite(v) or not (0 < v <= 1):
            raise ValueError(f"must be in (0, 1] (got {v!r})")
        return v

    @model_validator(mode="after")
    def _univariate(self) -> "StatisticConfig":
        o = self.options
        if self.kind == "distribution":
            if not isinstance(o, DistributionOptions):
                raise ValueError("kind 'distribution' needs options.categories (the public list)")
            if len(self.columns) != 1:
                raise ValueError(f"kind 'distribution' takes exactly one categorical column (got {list(self.columns)})")
            return self
        if self.kind in BHS_KINDS:
            if not isinstance(o, CovarianceOptions):
                raise ValueError(f"kind {self.kind!r} takes options lambda0, lambda0_cov, beta, dummy, expected_persons")
            if len(set(self.columns)) != len(self.columns):
                raise ValueError(f"columns must be distinct (got {list(self.columns)})")
            if o.dummy is not None and len(o.dummy) != len(self.columns):
                raise ValueError(f"options.dummy must hold one value per column ({len(self.columns)}), got {len(o.dummy)}")
            if o.lambda0_cov is not None and self.kind != "gaussian":
                raise ValueError("options.lambda0_cov is for kind 'gaussian' (kind 'covariance' takes options.lambda0)")
            if o.estimator == "clipped":
                if self.kind != "covariance":
                    raise ValueError(f"options.estimator 'clipped' is for kind 'covariance', not {self.kind!r}")
                if len(self.columns) < 2:
                    raise ValueError("kind 'covariance' needs at least 2 columns")
                bhs_only = [n for n in ("lambda0", "lambda0_cov", "dummy", "expected_persons") if getattr(o, n) is not None]
                if bhs_only or o.beta != 0.05:
                    raise ValueError(f"options {bhs_only or ['beta']} are BHS23's; estimator 'clipped' takes none")
            return self
        if isinstance(o, CovarianceOptions):
            raise ValueError(f"options of kind {self.kind!r} given to a BHS23 kind's model")
        if isinstance(o, DistributionOptions):
            raise ValueError("options.categories, options.m and options.estimator are for kind 'distribution'")
        if self.kind == "mean":
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
        else:
            if len(set(self.columns)) != len(self.columns):
                raise ValueError(f"columns must be distinct (got {list(self.columns)})")
            for f in ("scale", "range_bound"):
                if getattr(o, f) is not None:
                    raise ValueError(
                        f"options.{f} is for kind 'mean'; kind 'multivariate_mean' takes options.scales "
                        "(one per column) and needs delta > 0"
                    )
            if o.scales is not None and len(o.scales) != len(self.columns):
                raise ValueError(
                    f"options.scales must hold one value per column ({len(self.columns)}), got {len(o.scales)}"
                )
        return self


class SummaryConfig(_Frozen):
    """Per-person reduction: persons with fewer than ``m_min`` usable records of a column are
    dropped from that column's statistics. ``max_records_per_person`` (optional record cap R):
    a person with more than R records keeps R of them, drawn uniformly without replacement by a
    salted keyed hash of the record (:func:`spark_jobs.spark.summarize.summarize`); their means are over
    the kept records. Off by default; applies to the mean kinds (``mean``,
    ``multivariate_mean``, ``mean_affine``, ``covariance``, ``gaussian``), not to ``distribution``
    (which draws its own ``m`` records per person)."""

    m_min: int = Field(default=1, ge=1)
    max_records_per_person: int | None = Field(default=None, ge=1, le=100_000)  # = summarize.MAX_RECORDS_LIMIT

    @field_validator("m_min", "max_records_per_person", mode="before")
    @classmethod
    def _no_bool(cls, v):
        # YAML `true` would otherwise become 1 (a cap of one record per person), silently
        if isinstance(v, bool):
            raise ValueError("must be an integer, not a boolean")
        return v

    @model_validator(mode="after")
    def _cap_holds_m_min(self):
        if self.max_records_per_person is not None and self.max_records_per_person < self.m_min:
            raise ValueError(
                f"max_records_per_person ({self.max_records_per_person}) is below m_min ({self.m_min}): "
                "no person could keep m_min records"
            )
        return self


class OutputConfig(_Frozen):
    """Where releases go: the Delta table ``<path>/releases``."""

    path: str = Field(min_length=1)


class LimitConfig(_EpsilonDelta):
    """A lifetime budget limit (epsilon, delta)."""

    epsilon: float
    delta: float = 0.0



class LedgerConfig(_Frozen):
    """The privacy ledger (``spark_jobs.ledger``).

    ``population`` (required while the ledger is enabled): the protected population this job's
    persons belong to; every job reading the same persons must name the same population, whatever
    table or partition it reads. ``path``: the ledger Delta table (default
    ``<output.path>/privacy_ledger``; give every job of a site the same path: a different ledger
    is a different budget). ``initial_limit``: the lifetime limit created when the population has
    none yet (an operator changes it with ``person-dp budget set``); without it, a population
    with no limit refuses to run. ``enabled: false`` runs without a ledger (no lifetime budget:
    for tests and experiments only).
    """

    enabled: bool = True
    path: str | None = None
    population: str | None = None
    initial_limit: LimitConfig | None = None


class SparkConfig(_Frozen):
    """Spark settings. ``master`` is used only when the job is not run by spark-submit (which
    passes its own master). ``log_level``: Spark's own log level (ERROR hides Spark's warnings
    and their stack traces; WARN or INFO to debug Spark)."""

    master: str = "local[2]"
    log_level: Literal["ERROR", "WARN", "INFO", "DEBUG"] = "ERROR"
    app_name: str = "person-dp"
    conf: dict[str, str] = Field(default_factory=dict)


class JobConfig(_Frozen):
    """A whole job: input, privacy unit, budget, statistics, output, Spark.

    An input source without a single row is refused (``InputDataError``) before any budget is
    spent; that error reveals only that the source is empty.
    """

    job_name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.\-]+$")
    input: InputConfig
    privacy_unit: PrivacyUnitConfig
    budget: BudgetConfig
    statistics: tuple[StatisticConfig, ...] = Field(min_length=1)
    summary: SummaryConfig = SummaryConfig()
    output: OutputConfig
    spark: SparkConfig = SparkConfig()
    ledger: LedgerConfig = LedgerConfig()

    @model_validator(mode="after")
    def _shares(self) -> "JobConfig":
        total = math.fsum(s.share for s in self.statistics)
        if total > 1.0 + 1e-12:
            raise ValueError(
                f"statistics shares sum to {total:.6g}, more than the whole budget (1.0)"
            )
        if self.ledger.enabled and not self.ledger.population:
            raise ValueError(
                "ledger.population is required: name the persons behind this source (e.g. "
                "'web-users'), the same in every job that reads them, or set ledger.enabled: false"
            )
        if self.budget.delta == 0 and any(s.kind == "multivariate_mean" for s in self.statistics):
            raise ValueError(
                "budget.delta must be > 0 for kind 'multivariate_mean' (an approximate-DP estimator)"
            )
        if self.budget.delta == 0 and any(s.kind in BHS_KINDS for s in self.statistics):
            raise ValueError(f"budget.delta must be > 0 for kinds {list(BHS_KINDS)} (BHS23, approximate DP)")
        for s in self.statistics:
            if s.kind == "distribution" and s.options.estimator == "P2" and self.budget.delta == 0:
                raise ValueError(
                    f"statistic {s.name!r}: estimator P2 (Gaussian) needs budget.delta > 0; use P0 or P1 for pure epsilon"
                )
        names = [s.name for s in self.statistics]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"statistic names must be unique; repeated: {dup}")
        for s in self.statistics:
            if s.kind == "distribution" or s.kind in BHS_KINDS:
                pass
            elif self.budget.delta == 0 and s.options.scale is not None and s.options.range_bound is None:
                raise ValueError(
                    f"statistic {s.name!r}: budget.delta = 0 (pure DP) with a declared options.scale "
                    "needs options.range_bound (or drop options.scale for the scale-free estimator)"
                )
            if self.privacy_unit.column in s.columns:
                raise ValueError(f"statistic {s.name!r} uses the privacy unit column as a value")
        return self

    def config_hash(self) -> str:
        """SHA-256 of the canonical JSON of the validated config (first 16 hex chars)."""
        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def release_hash(self) -> str:
        """SHA-256 (16 hex) of what determines a release: input, privacy unit, budget,
        statistics, summary rules and population; not Spark settings or output locations, so a
        retry under another master or cluster keeps its run id."""
        d = self.model_dump(mode="json")
        keep = {k: d[k] for k in ("input", "privacy_unit", "budget", "statistics", "summary")}
        keep["population"] = self.population()
        return hashlib.sha256(json.dumps(keep, sort_keys=True).encode()).hexdigest()[:16]

    def ledger_path(self) -> str:
        """The ledger table path (config, or ``<output.path>/privacy_ledger``)."""
        return self.ledger.path or self.output.path.rstrip("/") + "/privacy_ledger"

    def population(self) -> str:
        """The protected population this job spends from (``ledger.population``)."""
        return self.ledger.population or f"(unnamed:{self.privacy_unit.column})"

    def run_id_for(self, run_key: str | None) -> str | None:
        """Run id of a keyed run: SHA-256 of (job name, run key, :meth:`release_hash`), or None."""
        if run_key is None:
            return None
        blob = json.dumps([self.job_name, str(run_key), self.release_hash()]).encode()
        return "k-" + hashlib.sha256(blob).hexdigest()[:32]

    def categorical_columns(self) -> list[str]:
        """Every column a distribution statistic reads (its category column and record-label
        columns), in order of first use; any type (values are matched as strings)."""
        out: list[str] = []
        for s in self.statistics:
            if s.kind != "distribution":
                continue
            for c in list(s.columns) + list(s.options.record_label_columns or []):
                if c not in out:
                    out.append(c)
        return out

    def value_columns(self) -> list[str]:
        """Every numeric value column a mean statistic reads, in order of first use."""
        out: list[str] = []
        for s in self.statistics:
            if s.kind == "distribution":
                continue
            for c in s.columns:
                if c not in out:
                    out.append(c)
        return out


def _known_fields() -> set[str]:
    models = [InputConfig, PrivacyUnitConfig, BudgetConfig, MeanOptions, DistributionOptions, CovarianceOptions,
              StatisticConfig, SummaryConfig,
              OutputConfig, SparkConfig, LimitConfig, LedgerConfig, JobConfig]
    return {name for m in models for name in m.model_fields}


def _format_errors(err: ValidationError) -> str:
    errors = err.errors()
    locs = [tuple(e["loc"]) for e in errors]
    lines = []
    for e, loc_t in zip(errors, locs):
        # pydantic adds "tuple too short" for a list whose items all failed: noise, drop it
        if e["type"] == "too_short" and any(len(o) > len(loc_t) and o[: len(loc_t)] == loc_t for o in locs):
            continue
        loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "literal_error":
            msg = f"{msg} (got {e.get('input')!r})"
        elif e["type"] == "extra_forbidden":
            close = difflib.get_close_matches(str(e["loc"][-1]), sorted(_known_fields()), n=1)
            msg = "unknown field" + (f" (did you mean {close[0]!r}?)" if close else "")
        lines.append(f"  {loc}: {msg}")
    return "invalid job config:\n" + "\n".join(lines)


def parse_config(data: dict[str, Any] | Any) -> JobConfig:
    """Validate a mapping into a :class:`JobConfig`.

    Raises
    ------
    ConfigError
        Naming every field that is wrong and the allowed values.
    """
    if not isinstance(data, dict):
        raise ConfigError(f"a job config must be a mapping at the top level, got {type(data).__name__}")
    try:
        return JobConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_errors(err)) from err


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``dotted.key=value`` overrides (values parsed as YAML scalars) to a config mapping."""
    out = json.loads(json.dumps(data))
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like dotted.key=value")
        key, raw = item.split("=", 1)
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            raise ConfigError(f"override {item!r}: the value is not valid YAML") from exc
        parts = key.strip().split(".")
        node = out
        for p in parts[:-1]:
            if p.isdigit() and isinstance(node, list):
                node = node[int(p)]
            else:
                node = node.setdefault(p, {})
        last = parts[-1]
        if last.isdigit() and isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
    return out


class _StrictLoader(yaml.SafeLoader):
    """YAML SafeLoader that refuses a mapping with a repeated key (YAML would keep the last)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (YAML would silently keep the last value)", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_config(path: str | Path, overrides: list[str] | None = None) -> JobConfig:
    """Read a YAML job config, apply ``dotted.key=value`` overrides, validate.

    Raises
    ------
    ConfigError
        If the file is missing, is not YAML, or does not validate.
    """
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        data = yaml.load(p.read_text(), Loader=_StrictLoader)
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {p} is not valid YAML: {str(err).replace('<unicode string>', str(p))}") from err
    return parse_config(apply_overrides(data or {}, overrides or []))
