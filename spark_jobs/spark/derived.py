"""Derived per-person columns on the shared summary (the Spark twin of :mod:`dplib.derived`).

A kind that asks for derived columns (``StatisticKind.derived_columns``) gets the seam over the
summary with those columns added: one ``withColumn`` each, a projection over the cached summary
(no new pass over the records, no shuffle). The run's shared ``ctx.aggregates`` is not changed.
"""

from __future__ import annotations

from typing import Mapping

from dplib.derived import check_derived, count_column
from dplib.errors import InvalidParameterError
from spark_jobs.spark.aggregates import SparkAggregates
from spark_jobs.spark.sqlnames import qcol


def with_derived_columns(summary, spec: Mapping[str, tuple[str, str]]):
    """``summary`` plus the derived columns of ``spec`` (``{name: (column, operation)}``), computed
    as :func:`dplib.derived.derive_columns` (``total``: ``<col> * double(_m_<col>)``; null where the
    mean is null).

    Raises
    ------
    InvalidParameterError
        A bad spec, or a source column (or its count) the summary does not hold.
    """
    for name, (column, _op) in check_derived(spec).items():
        for c in (column, count_column(column)):
            if c not in summary.columns:
                raise InvalidParameterError(f"derived column {name!r}: the summary holds no column {c!r}")
        summary = summary.withColumn(name, qcol(column) * qcol(count_column(column)).cast("double"))
    return summary


def derived_aggregates(summary, spec: Mapping[str, tuple[str, str]]) -> SparkAggregates:
    """The :class:`~spark_jobs.spark.aggregates.SparkAggregates` seam over ``summary`` with the
    derived columns of ``spec``."""
    return SparkAggregates(with_derived_columns(summary, spec))
