"""What every statistic kind is: its config model, its plan, its run, its release.

A *kind* (``kind: mean`` in a job's YAML) is one module under :mod:`spark_jobs.kinds` holding a
config model (a subclass of :class:`StatisticConfigBase` with ``kind: Literal[...]``) and a
:class:`StatisticKind` object, listed once in :data:`spark_jobs.kinds.REGISTRY`. The runner
(:mod:`spark_jobs.job`) knows no kind by name: it asks the kind

- which per-person input it reads (:meth:`StatisticKind.value_columns`: the run's one shared
  per-person summary of numeric columns; :meth:`StatisticKind.derived_columns`: per-person columns
  computed from that summary, e.g. a person's total; :meth:`StatisticKind.categorical_columns`:
  columns it reads from the records itself, e.g. a distribution's category column),
- whether the config is consistent with the job (:meth:`StatisticKind.check_job`),
- its public plan (:meth:`StatisticKind.plan`; the dplib ``*Plan`` object whose ``charges`` are
  the privacy cost) and the dry-run line (:meth:`StatisticKind.describe`),
- to run on the driver against the seam (:meth:`StatisticKind.run`) and return one
  :class:`Release`, which the runner turns into one ``releases`` row.

No module here imports pyspark: Spark objects reach a kind through :class:`RunContext`.
"""

from __future__ import annotations

import math
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_serializer, model_validator

from dplib.budget import Accountant, Budget
from dplib.errors import InvalidParameterError
from dplib.mechanisms import NoiseSource
from dplib.partitions import check_l0


def _takes_number(annotation) -> bool:
    """True if a field annotation admits a float or int (bare, optional or in a union)."""
    if annotation in (float, int):
        return True
    return any(_takes_number(a) for a in typing.get_args(annotation)) if typing.get_origin(annotation) in (
        typing.Union, types.UnionType) else False


class Frozen(BaseModel):
    """Base of every config model: immutable, unknown fields refused, YAML booleans never numbers."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _no_bool_numbers(cls, data):
        """YAML's ``true`` is not a number: ``epsilon: true`` must not become 1.0."""
        if isinstance(data, dict):
            for name, fld in cls.model_fields.items():
                if isinstance(data.get(name), bool) and _takes_number(fld.annotation):
                    raise ValueError(f"{name}: must be a number, got a boolean ({str(data[name]).lower()})")
        return data


def dplib_check(check, *args):
    """Run a dplib parameter check (the one declaration of the range) as a config validator:
    its ``InvalidParameterError`` becomes the ``ValueError`` pydantic reports for the field."""
    try:
        return check(*args)
    except InvalidParameterError as err:
        raise ValueError(str(err)) from err


#: A group key value in the YAML (matched as the string Spark casts the column to).
KeyValue = str | int | float | bool

#: Share of a grouped statistic's budget spent on private group selection by default.
DEFAULT_SELECTION_SHARE = 0.1


class GroupsConfig(Frozen):
    """Which group keys a ``group_by`` statistic releases.

    ``keys``: a public key set, one list of values per key (one value per ``group_by`` column,
    matched as strings, as Spark casts the column to string: ``1`` matches an integer column's 1,
    a double column's 1 is ``"1.0"``). Every listed key gets a row through the same DP path,
    whether or not anyone holds it. ``select: private``: the keys present in the data are released
    only through DP partition selection (:mod:`dplib.partitions`), which spends
    ``selection_share`` of the statistic's budget and needs ``budget.delta > 0``.
    """

    keys: tuple[tuple[KeyValue, ...], ...] | None = None
    select: typing.Literal["private"] | None = None
    selection_share: float = DEFAULT_SELECTION_SHARE

    @model_validator(mode="after")
    def _one_way(self) -> "GroupsConfig":
        if (self.keys is None) == (self.select is None):
            raise ValueError("give exactly one of groups.keys (a public key set) or groups.select: private")
        if self.keys is not None:
            if not self.keys:
                raise ValueError("groups.keys must list at least one key")
            if len({tuple(str(v).lower() if isinstance(v, bool) else str(v) for v in k) for k in self.keys}) != len(self.keys):
                raise ValueError("groups.keys must be distinct")
        if not (math.isfinite(self.selection_share) and 0 < self.selection_share < 1):
            raise ValueError(f"groups.selection_share must be in (0, 1) (got {self.selection_share!r})")
        if self.keys is not None and self.selection_share != DEFAULT_SELECTION_SHARE:
            raise ValueError("groups.selection_share is for groups.select: private (a public key set spends nothing on selection)")
        return self

    def key_strings(self) -> list[tuple[str, ...]] | None:
        """The public keys as the strings Spark compares (booleans as Spark writes them)."""
        if self.keys is None:
            return None
        return [tuple(str(v).lower() if isinstance(v, bool) else str(v) for v in k) for k in self.keys]


def _kind_models(cls) -> list[type["StatisticConfigBase"]]:
    out = []
    for sub in cls.__subclasses__():
        if "kind" in sub.model_fields:
            out.append(sub)
        out.extend(_kind_models(sub))
    return out


class StatisticConfigBase(Frozen):
    """Fields every statistic has. ``share``: its fraction of the run's budget (sequential
    composition across statistics, which all read the same persons). Subclasses add
    ``kind: Literal[...]`` and ``options``."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.\-]+$")
    columns: tuple[str, ...] = Field(min_length=1)
    share: float
    #: ``group_by``: release one value per group key (docs/configuration.md, "Groups"); with it,
    #: ``groups`` and ``max_groups_per_person`` (the L0 bound) are required.
    group_by: tuple[str, ...] | None = None
    groups: GroupsConfig | None = None
    max_groups_per_person: int | None = None

    @model_serializer(mode="wrap")
    def _without_unused_grouping(self, handler):
        """An ungrouped statistic serialises as before grouping existed (its config hash, and so
        the run ids of keyed runs, are unchanged)."""
        data = handler(self)
        if isinstance(data, dict) and self.group_by is None:
            for k in ("group_by", "groups", "max_groups_per_person"):
                if data.get(k) is None:
                    data.pop(k, None)
        return data

    @model_validator(mode="after")
    def _grouping(self):
        if self.group_by is None:
            if self.groups is not None or self.max_groups_per_person is not None:
                raise ValueError("groups and max_groups_per_person need group_by (the columns that form the group key)")
            return self
        if not self.group_by or len(set(self.group_by)) != len(self.group_by):
            raise ValueError(f"group_by must list distinct columns (got {list(self.group_by)})")
        overlap = set(self.group_by) & set(self.columns)
        if overlap:
            raise ValueError(f"group_by columns {sorted(overlap)} are also value columns of the statistic")
        if self.groups is None:
            raise ValueError("group_by needs groups: {keys: [[...], ...]} (a public key set) or groups: {select: private}")
        if self.max_groups_per_person is None:
            raise ValueError("group_by needs max_groups_per_person (the L0 bound: groups one person may contribute to)")
        dplib_check(check_l0, self.max_groups_per_person)
        if self.groups.keys is not None:
            bad = [list(k) for k in self.groups.keys if len(k) != len(self.group_by)]
            if bad:
                raise ValueError(f"groups.keys: each key needs one value per group_by column ({len(self.group_by)}); got {bad[:3]}")
        return self

    @model_validator(mode="before")
    @classmethod
    def _options_of_another_kind(cls, data: Any) -> Any:
        """An option that belongs to another kind gets an error naming that kind."""
        if not isinstance(data, dict) or not isinstance(data.get("options"), dict) or "options" not in cls.model_fields:
            return data
        mine = set(cls.model_fields["options"].annotation.model_fields)
        for key in data["options"]:
            if key in mine:
                continue
            owners = sorted({
                k for m in _kind_models(StatisticConfigBase)
                if key in m.model_fields["options"].annotation.model_fields
                for k in typing.get_args(m.model_fields["kind"].annotation)
                # an options model shared by kinds names, in ONLY_FOR, the kinds an option is for
                if k in getattr(m.model_fields["options"].annotation, "ONLY_FOR", {}).get(key, (k,))
            })
            if owners:
                kind = data.get("kind")
                raise ValueError(f"options.{key} is not an option of kind {kind!r} (it is for kind "
                                 f"{' / '.join(repr(o) for o in owners)})")
        return data

    @field_validator("share")
    @classmethod
    def _share(cls, v: float) -> float:
        if not math.isfinite(v) or not (0 < v <= 1):
            raise ValueError(f"must be in (0, 1] (got {v!r})")
        return v

    def budget(self, cfg) -> Budget:
        """This statistic's (epsilon, delta): its share of the job's budget."""
        return Budget(cfg.budget.epsilon, cfg.budget.delta).scaled(self.share)

    def check_distinct_columns(self) -> None:
        if len(set(self.columns)) != len(self.columns):
            raise ValueError(f"columns must be distinct (got {list(self.columns)})")


@dataclass(frozen=True)
class Release:
    """What one statistic releases, whatever its kind: the row the runner writes (with the run's
    lineage and config fields added). Every number is DP or public.

    ``estimate`` is flat (row-major for matrices) with shape ``estimate_shape``; ``None`` when
    nothing was released (status not OK). ``noise_scale``: the largest per-coordinate noise sd or
    Laplace scale (``None``: no additive noise, e.g. an exponential mechanism). ``error_bar``:
    per-coordinate half-widths at ``error_level`` covering what ``error_covers`` says (``None``:
    no honest bar). ``parameters``: public parameters and DP by-products (JSON).
    """

    estimand: str
    algorithm: str
    algorithm_version: str
    status: str
    epsilon: float
    delta: float
    estimate: list[float] | None
    estimate_shape: list[int]
    noise_scale: float | None = None
    error_bar: list[float] | None = None
    error_level: float = 0.0
    error_covers: str = "none"
    parameters: dict = field(default_factory=dict)

    @classmethod
    def of(cls, rel, *, estimand: str, algorithm: str, algorithm_version: str, estimate_shape: list[int],
           parameters: dict | None = None, **override) -> "Release":
        """From a dplib release object (``status, epsilon, delta``; optional ``estimate``,
        ``noise_scale``, ``error_bar``, ``error_level``, ``error_covers``, ``parameters``)."""
        def flat(v):
            return None if v is None else [float(x) for x in np.ravel(v)]

        noise = getattr(rel, "noise_scale", None)
        values = dict(
            estimand=estimand,
            algorithm=algorithm,
            algorithm_version=algorithm_version,
            status=rel.status,
            epsilon=float(rel.epsilon),
            delta=float(rel.delta),
            estimate=flat(getattr(rel, "estimate", None)),
            estimate_shape=list(estimate_shape),
            noise_scale=None if noise is None else float(np.max(noise)),
            error_bar=flat(getattr(rel, "error_bar", None)),
            error_level=float(getattr(rel, "error_level", 0.0) or 0.0),
            error_covers=getattr(rel, "error_covers", "none"),
            parameters={**getattr(rel, "parameters", {}), **(parameters or {})},
        )
        values.update(override)
        return cls(**values)


@dataclass
class RunContext:
    """What a kind's :meth:`StatisticKind.run` may use. Built by the runner after the budget
    reservation.

    ``summary``: the run's one per-person summary (a cached Spark DataFrame of every kind's
    ``value_columns``; ``None`` if no kind asked for one); ``aggregates``: the seam over it
    (:class:`spark_jobs.spark.aggregates.SparkAggregates`); ``records``: the validated input
    records (kinds that build their own per-person input from them, e.g. batches); ``salt``: the
    run's secret salt (never logged or written); ``prepared``: what ``plan.prepare(noise)``
    built before the reservation, per statistic name.
    """

    cfg: Any
    records: Any
    summary: Any
    aggregates: Any
    salt: str
    noise: NoiseSource
    accountant: Accountant
    prepared: dict[str, Any] = field(default_factory=dict)
    #: A group of a ``group_by`` statistic: what the kind's shared stage released (run once for
    #: all groups, :meth:`StatisticKind.run_shared`); None otherwise.
    shared: Any = None

    def aggregates_for(self, kind: "StatisticKind", stat) -> Any:
        """The seam a statistic reads: ``aggregates`` itself, or, when its kind asks for derived
        per-person columns (:meth:`StatisticKind.derived_columns`), the seam over the shared
        summary with those columns added (:func:`spark_jobs.spark.derived.derived_aggregates`:
        a projection of the cached summary; ``aggregates`` is left as it is)."""
        derived = kind.derived_columns(stat)
        if not derived or self.summary is None:  # a group's proxy: its summary has them already
            return self.aggregates
        from spark_jobs.spark.derived import derived_aggregates  # lazy: keeps pyspark out of Spark-free imports

        return derived_aggregates(self.summary, derived)

    def summary_extras(self) -> dict:
        """The summary rules every release over the shared summary reports."""
        return {"m_min": self.cfg.summary.m_min, "max_records_per_person": self.cfg.summary.max_records_per_person}


def per_group_statistic(stat: StatisticConfigBase, share: float) -> StatisticConfigBase:
    """The statistic as each group's estimator sees it: no grouping, ``share`` of the job's budget."""
    return stat.model_copy(update={"share": share, "group_by": None, "groups": None, "max_groups_per_person": None})


class StatisticKind:
    """One statistic kind. Subclasses set :attr:`config_model` and implement :meth:`plan`,
    :meth:`describe` and :meth:`run`; the defaults suit a kind that reads the shared per-person
    summary of its columns."""

    #: the pydantic model of one statistic of this kind (its ``kind`` Literal names the YAML kinds)
    config_model: ClassVar[type[StatisticConfigBase]]

    @property
    def names(self) -> tuple[str, ...]:
        """The YAML ``kind`` values this kind handles."""
        return typing.get_args(self.config_model.model_fields["kind"].annotation)

    def value_columns(self, stat) -> list[str]:
        """Numeric columns this statistic reads from the run's shared per-person summary."""
        return list(stat.columns)

    def categorical_columns(self, stat) -> list[str]:
        """Columns (any type) this statistic reads from the records itself."""
        return []

    def groupable(self, stat) -> bool:
        """True if the statistic can be released per group (``group_by``): it asks only the
        :class:`dplib.seam.Aggregates` seam of the shared summary, so :mod:`dplib.grouped` can
        answer every group's questions in one aggregation per stage."""
        return False

    def grouped_plans(self, stat, cfg, fraction: float, l0: int) -> tuple[Any, Any, float]:
        """Plans of a ``group_by`` statistic that spends ``fraction`` of its budget on its groups:
        ``(shared, per_group, per_group_share)``. ``shared``: a plan run once for all groups on
        one value per person before them (:meth:`run_shared`), or None; ``per_group``: the plan
        each group's :meth:`run` follows, with ``per_group_share`` of the job's budget (each
        person is in at most ``l0`` groups). Default: no shared stage, the rest split over L0."""
        share = stat.share * fraction / l0
        return None, self.plan(per_group_statistic(stat, share), cfg), share

    def run_shared(self, stat, plan, aggregates, ctx: "RunContext") -> Any:
        """Run the shared plan of :meth:`grouped_plans` over ``aggregates`` (one value per
        person, every group pooled); its result reaches each group as ``ctx.shared``."""
        raise NotImplementedError

    def joint_stages(self, stat, plan, shared, first_backend: Callable[[], Any], ctx: "RunContext") -> dict:
        """Joint stages of the groups (:meth:`dplib.grouped.GroupProxy.joint`): ``{name: handler}``
        with ``handler({gid: payload}) -> {gid: answer}``, given the shared plan ``plan``, its
        result ``shared`` and ``first_backend()`` (the grouped seam over each person's first kept
        group only). Default: none."""
        return {}

    def derived_columns(self, stat) -> dict[str, tuple[str, str]]:
        """Per-person columns derived from the shared summary, ``{name: (column, operation)}``
        (operations: :data:`dplib.derived.OPERATIONS`, e.g. ``total`` = mean x records used), read
        through :meth:`RunContext.aggregates_for`. ``column`` must be one of :meth:`value_columns`."""
        return {}

    def needs_person_id(self, stat) -> bool:
        """True if the shared summary must keep the person id (e.g. to order persons by a key)."""
        return False

    def check_job(self, stat, cfg) -> None:
        """Checks that need the whole job (its budget, its summary rules). Raise ``ValueError``."""

    def plan(self, stat, cfg):
        """The public plan (a dplib ``*Plan`` with ``charges(prefix)``) from the config alone."""
        raise NotImplementedError

    def describe(self, name: str, plan) -> str:
        """The dry-run line of one planned statistic."""
        raise NotImplementedError

    def run(self, stat, plan, ctx: RunContext) -> Release:
        """Run on the driver: charge ``ctx.accountant`` for each stage, then draw its noise."""
        raise NotImplementedError
