"""Job configuration: YAML validated into typed, frozen objects (pydantic v2).

Errors name the field path and the allowed values, e.g.
``budget.epsilon: must be finite and > 0 (got -1.0)``. See ``conf/examples/flights.yaml``.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from dplib.errors import ConfigError, InvalidParameterError
from spark_jobs.kinds import BY_NAME, REGISTRY, Statistic, kind_of
from spark_jobs.kinds.base import Frozen
from spark_jobs.grouping import statistic_plan

#: One statistic of a job (the union of the kinds' models, discriminated on ``kind``).
StatisticConfig = Statistic


class InputConfig(Frozen):
    """Where the records are. ``format``: parquet, delta or csv (csv with a header row)."""

    path: str = Field(min_length=1)
    format: Literal["parquet", "delta", "csv"] = "parquet"
    dataset: str | None = Field(default=None, description="dataset name recorded in the release")
    csv_options: dict[str, str] = Field(default_factory=lambda: {"header": "true"})


class PrivacyUnitConfig(Frozen):
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


class _EpsilonDelta(Frozen):
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



class SummaryConfig(Frozen):
    """Per-person reduction: persons with fewer than ``m_min`` usable records of a column are
    dropped from that column's statistics. ``max_records_per_person`` (optional record cap R):
    a person with more than R records keeps R of them, drawn uniformly without replacement by a
    salted keyed hash of the record (:func:`spark_jobs.spark.summarize.summarize`); their means are over
    the kept records. Off by default; applies to every kind that reads the shared per-person
    summary (its ``value_columns``: the means, count, quantile and covariance kinds), not to
    ``distribution`` (which draws its own ``m`` records per person)."""

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


#: A file system refuses a path component longer than this many bytes (NAME_MAX on Linux and
#: macOS, and object-store clients that map keys to local staging files): a path with one is
#: refused by the config check, before any budget is reserved, not by the writer after it.
MAX_PATH_COMPONENT_BYTES = 255
#: The same for the whole path (PATH_MAX 4096, less room for the tables' own sub-paths).
MAX_PATH_BYTES = 3800


def check_table_path(path: str | None, field: str) -> str | None:
    """Refuse a path the writer could not create: a component over MAX_PATH_COMPONENT_BYTES or a
    path over MAX_PATH_BYTES (UTF-8 bytes), or a NUL character. The URI scheme (``s3://``) is not
    a component."""
    if path is None:
        return path
    if "\x00" in path:
        raise ValueError(f"{field} contains a NUL character")
    body = path.split("://", 1)[1] if "://" in path else path
    if len(path.encode()) > MAX_PATH_BYTES:
        raise ValueError(f"{field} is {len(path.encode())} bytes long; at most {MAX_PATH_BYTES} are allowed")
    for part in body.split("/"):
        n = len(part.encode())
        if n > MAX_PATH_COMPONENT_BYTES:
            raise ValueError(f"{field} has a path component of {n} bytes ({part[:20]}...); file systems allow at "
                             f"most {MAX_PATH_COMPONENT_BYTES}")
    return path


class OutputConfig(Frozen):
    """Where releases go: the Delta table ``<path>/releases``."""

    path: str = Field(min_length=1)

    @field_validator("path")
    @classmethod
    def _path(cls, v: str) -> str:
        return check_table_path(v, "output.path")  # type: ignore[return-value]


class LimitConfig(_EpsilonDelta):
    """A lifetime budget limit (epsilon, delta)."""

    epsilon: float
    delta: float = 0.0



class LedgerConfig(Frozen):
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

    @field_validator("path")
    @classmethod
    def _path(cls, v: str | None) -> str | None:
        return check_table_path(v, "ledger.path")


class SparkConfig(Frozen):
    """Spark settings. ``master`` is used only when the job is not run by spark-submit (which
    passes its own master). ``log_level``: Spark's own log level (ERROR hides Spark's warnings
    and their stack traces; WARN or INFO to debug Spark)."""

    master: str = "local[2]"
    log_level: Literal["ERROR", "WARN", "INFO", "DEBUG"] = "ERROR"
    app_name: str = "person-dp"
    conf: dict[str, str] = Field(default_factory=dict)


class JobConfig(Frozen):
    """A whole job: input, privacy unit, budget, statistics, output, Spark.

    An input source without a single row is refused (``InputDataError``) before any budget is
    spent; that error reveals only that the source is empty.
    """

    job_name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.\-]+$")
    input: InputConfig
    privacy_unit: PrivacyUnitConfig
    budget: BudgetConfig
    statistics: tuple[Statistic, ...] = Field(min_length=1)
    summary: SummaryConfig = SummaryConfig()
    output: OutputConfig
    spark: SparkConfig = SparkConfig()
    ledger: LedgerConfig = LedgerConfig()

    @model_validator(mode="after")
    def _shares(self) -> "JobConfig":
        total = math.fsum(s.share for s in self.statistics)
        if total > 1.0 + 1e-12:
            raise ValueError(
                f"statistics shares sum to {total:.9g}, more than the whole budget (1.0): round the shares "
                "down (e.g. 0.058823 for 1/17), or leave part of a share unspent"
            )
        if self.ledger.enabled and not self.ledger.population:
            raise ValueError(
                "ledger.population is required: name the persons behind this source (e.g. "
                "'web-users'), the same in every job that reads them, or set ledger.enabled: false"
            )
        names = [s.name for s in self.statistics]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"statistic names must be unique; repeated: {dup}")
        lo = RUN_EPSILON_RANGE[0]
        for s in self.statistics:
            if s.share * self.budget.epsilon < lo:
                raise ValueError(
                    f"statistic {s.name!r}: share {s.share:g} of epsilon {self.budget.epsilon:g} is "
                    f"{s.share * self.budget.epsilon:.3g}, below the smallest epsilon a statistic may run at "
                    f"({lo:g}: smaller ones give noise scales that overflow)"
                )
            kind = kind_of(s)
            if s.group_by is not None and not kind.groupable(s):
                raise ValueError(
                    f"statistic {s.name!r}: kind {s.kind!r}{_estimator_note(s)} cannot be released per group "
                    "(group_by works for the kinds on the shared per-person summary: mean, multivariate_mean, "
                    "count, quantile, sum, variance, stddev, covariance with estimator: clipped)"
                )
            if s.group_by is not None and self.privacy_unit.column in s.group_by:
                raise ValueError(f"statistic {s.name!r}: group_by cannot use the privacy unit column")
            if s.group_by is not None and s.groups.select == "private" and self.budget.delta == 0:
                raise ValueError(
                    f"statistic {s.name!r}: groups.select: private needs budget.delta > 0 (partition selection "
                    "is (epsilon, delta)-DP); with delta = 0 list the keys (groups: {keys: [...]})"
                )
            kind.check_job(s, self)
            try:  # the plan's own checks (dplib declares each parameter range once)
                statistic_plan(s, self)
            except InvalidParameterError as err:
                raise ValueError(f"statistic {s.name!r}: {err}") from err
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
        """Every column a statistic reads from the records itself (e.g. a distribution's category
        column and record-label columns), in order of first use; any type (values are matched as
        strings)."""
        return _unique(c for s in self.statistics for c in [*kind_of(s).categorical_columns(s), *(s.group_by or ())])

    def value_columns(self) -> list[str]:
        """Every numeric column of the run's shared per-person summary, in order of first use."""
        return _unique(c for s in self.statistics for c in kind_of(s).value_columns(s))

    def summary_columns(self) -> list[str]:
        """The numeric columns of the run's shared per-person summary: those of the ungrouped
        statistics (a ``group_by`` statistic has its own per-(person, group) summary)."""
        return _unique(c for s in self.statistics if s.group_by is None for c in kind_of(s).value_columns(s))


def _estimator_note(stat) -> str:
    est = getattr(getattr(stat, "options", None), "estimator", None)
    return f" (estimator {est!r})" if est is not None else ""


def _unique(items) -> list[str]:
    out: list[str] = []
    for c in items:
        if c not in out:
            out.append(c)
    return out


def _known_fields() -> set[str]:
    models = [InputConfig, PrivacyUnitConfig, BudgetConfig, SummaryConfig, OutputConfig, SparkConfig, LimitConfig,
              LedgerConfig, JobConfig]
    for k in REGISTRY:
        models += [k.config_model, k.config_model.model_fields["options"].annotation]
    return {name for m in models for name in m.model_fields}


def _format_errors(err: ValidationError) -> str:
    errors = err.errors()
    locs = [tuple(e["loc"]) for e in errors]
    lines = []
    for e, loc_t in zip(errors, locs):
        # pydantic adds "tuple too short" for a list whose items all failed: noise, drop it
        if e["type"] == "too_short" and any(len(o) > len(loc_t) and o[: len(loc_t)] == loc_t for o in locs):
            continue
        # a statistic's location carries its kind tag (statistics.0.mean.options): drop the tag
        parts = [p for i, p in enumerate(e["loc"]) if not (i and isinstance(e["loc"][i - 1], int) and p in BY_NAME)]
        loc = ".".join(str(p) for p in parts) or "(top level)"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "literal_error":
            msg = f"{msg} (got {e.get('input')!r})"
        elif e["type"] == "extra_forbidden":
            # never suggest the unknown word itself (``column`` is a field of privacy_unit: a
            # statistic's ``column:`` suggested 'column', not 'columns')
            word = str(e["loc"][-1])
            close = difflib.get_close_matches(word, sorted(_known_fields() - {word}), n=1)
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
