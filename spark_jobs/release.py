"""The ``releases`` table's row: one row per released statistic, one Delta commit per run.

:class:`ReleaseRow` is the one source of the table's schema; :mod:`spark_jobs.spark.releases`
derives the Spark schema from it and writes the rows.

Every value written is public (config, plan) or DP (estimates, error bars, noisy counts).
Exact counts, sums, salts and seeds are never written.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, fields

RELEASES_TABLE = "releases"


@dataclass(frozen=True)
class ReleaseRow:
    """One row of the ``releases`` table (see README.md for the meaning of each column)."""

    run_id: str
    job_name: str
    dataset: str
    input_path: str
    input_format: str
    input_delta_version: int | None
    input_fingerprint: str | None
    privacy_unit: str
    statistic: str
    kind: str
    columns: list[str]
    estimand: str
    algorithm: str
    algorithm_version: str
    status: str
    estimate: list[float] | None
    estimate_shape: list[int]
    epsilon: float
    delta: float
    neighbouring: str
    noise_scale: float | None
    noise_source: str
    error_bar: list[float] | None
    error_level: float
    error_covers: str
    parameters: str
    config_hash: str
    code_version: str
    created_at: dt.datetime
    #: True when the release's error bar rests on an assumption a DP check could not confirm, or
    #: when such a check found it could give no honest bar at all (a range at the zero floor: no
    #: bar, ``parameters.zero_atom``) (``parameters.tail_flag`` of the means,
    #: ``parameters.l0_truncated`` of a grouped row); None
    #: where the estimator makes no such check, and in rows written before the column existed.
    flagged: bool | None = None
    #: The group of a ``group_by`` statistic: ``{column: value}`` (values as strings, as Spark
    #: casts them); None for an ungrouped statistic and in rows written before the column existed.
    #: Query it as ``group_key['origin'] = 'JFK'`` (Spark SQL, DuckDB).
    group_key: dict[str, str] | None = None


#: Columns that may be null (the rest are NOT NULL in the Delta table).
NULLABLE = frozenset(
    f.name for f in fields(ReleaseRow) if "None" in str(f.type)
)


def to_json(params: dict) -> str:
    """Canonical JSON of public parameters."""
    return json.dumps(params, sort_keys=True, default=float)


#: The long-format table beside ``releases``: one row per statistic x group x coordinate.
RELEASES_LONG_TABLE = "releases_long"


@dataclass(frozen=True)
class LongRow:
    """One row of ``releases_long``: one coordinate (or category, or matrix cell) of one
    statistic of one group of one run, derived from its ``releases`` row (nothing new is
    released). ``value`` / ``error_bar`` are null when the statistic released nothing (status
    not OK) or has no bar. ``coordinate``: the column, category or ``row,column`` of a matrix
    cell; ``coordinate_index``: its position in the flat (row-major) ``estimate``.

    Query (Spark SQL, DuckDB): ``SELECT value, error_bar FROM releases_long WHERE statistic =
    'arr_delay_by_origin' AND group_key['origin'] = 'JFK'``.
    """

    run_id: str
    job_name: str
    created_at: dt.datetime
    statistic: str
    kind: str
    group_key: dict[str, str] | None
    coordinate: str
    coordinate_index: int
    value: float | None
    error_bar: float | None
    error_level: float
    epsilon: float
    delta: float
    status: str
    privacy_unit: str
    estimand: str
    noise_source: str
    #: the release row's ``flagged`` and ``error_covers`` (what its bar covers, or why it has none),
    #: repeated per coordinate; null in rows written before the columns existed
    flagged: bool | None = None
    error_covers: str | None = None


LONG_NULLABLE = frozenset(f.name for f in fields(LongRow) if "None" in str(f.type))


def coordinate_names(row: ReleaseRow) -> list[str]:
    """One name per entry of the row's flat estimate (shape ``estimate_shape``): a matrix's
    ``row,column`` cells (rows ``mean`` then the columns for a (d+1) x d mean-and-covariance),
    a distribution's categories (+ OTHER), a vector's columns, or the columns joined for one
    number over several columns (a count)."""
    shape = list(row.estimate_shape)
    cols = list(row.columns)
    size = 1
    for s in shape:
        size *= s
    if len(shape) == 2:
        rows = cols if shape[0] == len(cols) else ["mean", *cols][: shape[0]]
        return [f"{rows[i]},{cols[j]}" for i in range(shape[0]) for j in range(shape[1])]
    if row.kind == "distribution":
        cats = json.loads(row.parameters).get("categories")
        if cats and len(cats) == size:
            return [str(c) for c in cats]
    if len(cols) == size:
        return cols
    if size == 1:
        return [",".join(cols)]
    return [str(i) for i in range(size)]


def long_rows(rows: list[ReleaseRow]) -> list[LongRow]:
    """The ``releases_long`` rows of release rows (post-processing of what they hold)."""
    out = []
    for r in rows:
        names = coordinate_names(r)
        for i, name in enumerate(names):
            value = None if r.estimate is None or i >= len(r.estimate) else float(r.estimate[i])
            bar = None if r.error_bar is None or i >= len(r.error_bar) else float(r.error_bar[i])
            out.append(LongRow(
                run_id=r.run_id, job_name=r.job_name, created_at=r.created_at, statistic=r.statistic, kind=r.kind,
                group_key=r.group_key, coordinate=name, coordinate_index=i, value=value, error_bar=bar,
                error_level=r.error_level, epsilon=r.epsilon, delta=r.delta, status=r.status,
                privacy_unit=r.privacy_unit, estimand=r.estimand, noise_source=r.noise_source,
                flagged=r.flagged, error_covers=r.error_covers,
            ))
    return out
