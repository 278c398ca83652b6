"""Writing the ``releases`` Delta table (its schema derived from :class:`ReleaseRow`)."""

from __future__ import annotations

import datetime as dt
import typing
from dataclasses import fields

from pyspark.sql import types as T

from spark_jobs.release import (
    LONG_NULLABLE, NULLABLE, RELEASES_LONG_TABLE, RELEASES_TABLE, LongRow, ReleaseRow, long_rows,
)

_SCALARS = {str: T.StringType(), int: T.LongType(), float: T.DoubleType(), bool: T.BooleanType(),
            dt.datetime: T.TimestampType()}
#: Narrower Spark types than the Python annotation gives (kept as the table was first written).
_OVERRIDES = {"estimate_shape": T.ArrayType(T.IntegerType(), False)}


def _spark_type(annotation) -> T.DataType:
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return _spark_type(args[0])
    if typing.get_origin(annotation) is list:
        return T.ArrayType(_spark_type(args[0]), False)
    if typing.get_origin(annotation) is dict:
        return T.MapType(_spark_type(args[0]), _spark_type(args[1]), False)
    return _SCALARS[annotation]


def _schema(cls, nullable) -> T.StructType:
    hints = typing.get_type_hints(cls)
    return T.StructType(
        [
            T.StructField(f.name, _OVERRIDES.get(f.name) or _spark_type(hints[f.name]), f.name in nullable)
            for f in fields(cls)
        ]
    )


def release_schema() -> T.StructType:
    """The Spark schema of the ``releases`` table, derived from :class:`ReleaseRow`."""
    return _schema(ReleaseRow, NULLABLE)


def long_schema() -> T.StructType:
    """The Spark schema of the ``releases_long`` table, derived from :class:`LongRow`."""
    return _schema(LongRow, LONG_NULLABLE)


def _row_tuple(row) -> tuple:
    """A dataclass row's field values in order (``asdict`` deep-copies every nested value: 8 s
    for 2 x 10^4 rows)."""
    return tuple(getattr(row, f.name) for f in fields(row))


def write_long(spark, rows: list[ReleaseRow], output_path: str) -> str | None:
    """Append the long-format rows of ``rows`` to ``<output_path>/releases_long`` (one Delta
    commit; derived from the releases, so a crash before it loses nothing:
    :func:`spark_jobs.job.sync_long_table` rebuilds missing runs). Returns the table path."""
    if not rows:
        return None
    table = output_path.rstrip("/") + "/" + RELEASES_LONG_TABLE
    data = [_row_tuple(r) for r in long_rows(rows)]
    df = spark.createDataFrame(data, schema=long_schema(), verifySchema=False).coalesce(1)
    df.write.format("delta").mode("append").option("mergeSchema", "true").save(table)
    return table


def write_releases(spark, rows: list[ReleaseRow], output_path: str) -> str:
    """Append ``rows`` to ``<output_path>/releases`` in one Delta commit; returns the table path."""
    table = output_path.rstrip("/") + "/" + RELEASES_TABLE
    data = [_row_tuple(r) for r in rows]
    df = spark.createDataFrame(data, schema=release_schema(), verifySchema=False).coalesce(1)
    # mergeSchema: a table written before a column was added (``flagged``) gains it; older rows read null
    df.write.format("delta").mode("append").option("mergeSchema", "true").save(table)
    return table
