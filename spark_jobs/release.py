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
    #: True when the release's error bar rests on an assumption a DP check could not confirm
    #: (``parameters.tail_flag`` of the means); None where the estimator makes no such check,
    #: and in rows written before the column existed.
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
