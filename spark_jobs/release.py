"""The Delta ``releases`` table: one row per released statistic, one Delta commit per run.

Every value written is public (config, plan) or DP (estimates, error bars, noisy counts).
Exact counts, sums, salts and seeds are never written.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import asdict, dataclass

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


def release_schema():
    """The Spark schema of the ``releases`` table."""
    from pyspark.sql import types as T

    return T.StructType(
        [
            T.StructField("run_id", T.StringType(), False),
            T.StructField("job_name", T.StringType(), False),
            T.StructField("dataset", T.StringType(), False),
            T.StructField("input_path", T.StringType(), False),
            T.StructField("input_format", T.StringType(), False),
            T.StructField("input_delta_version", T.LongType(), True),
            T.StructField("input_fingerprint", T.StringType(), True),
            T.StructField("privacy_unit", T.StringType(), False),
            T.StructField("statistic", T.StringType(), False),
            T.StructField("kind", T.StringType(), False),
            T.StructField("columns", T.ArrayType(T.StringType(), False), False),
            T.StructField("estimand", T.StringType(), False),
            T.StructField("algorithm", T.StringType(), False),
            T.StructField("algorithm_version", T.StringType(), False),
            T.StructField("status", T.StringType(), False),
            T.StructField("estimate", T.ArrayType(T.DoubleType(), False), True),
            T.StructField("estimate_shape", T.ArrayType(T.IntegerType(), False), False),
            T.StructField("epsilon", T.DoubleType(), False),
            T.StructField("delta", T.DoubleType(), False),
            T.StructField("neighbouring", T.StringType(), False),
            T.StructField("noise_scale", T.DoubleType(), True),
            T.StructField("noise_source", T.StringType(), False),
            T.StructField("error_bar", T.ArrayType(T.DoubleType(), False), True),
            T.StructField("error_level", T.DoubleType(), False),
            T.StructField("error_covers", T.StringType(), False),
            T.StructField("parameters", T.StringType(), False),
            T.StructField("config_hash", T.StringType(), False),
            T.StructField("code_version", T.StringType(), False),
            T.StructField("created_at", T.TimestampType(), False),
            T.StructField("flagged", T.BooleanType(), True),
        ]
    )


def write_releases(spark, rows: list[ReleaseRow], output_path: str) -> str:
    """Append ``rows`` to ``<output_path>/releases`` in one Delta commit; returns the table path."""
    table = output_path.rstrip("/") + "/" + RELEASES_TABLE
    data = [tuple(asdict(r).values()) for r in rows]
    df = spark.createDataFrame(data, schema=release_schema()).coalesce(1)
    # mergeSchema: a table written before a column was added (``flagged``) gains it; older rows read null
    df.write.format("delta").mode("append").option("mergeSchema", "true").save(table)
    return table


def to_json(params: dict) -> str:
    """Canonical JSON of public parameters."""
    return json.dumps(params, sort_keys=True, default=float)
