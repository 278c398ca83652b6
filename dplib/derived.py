"""Per-person columns derived from the shared person summary (numpy twin of the Spark helper).

The job's summary holds, per person and value column ``<col>``, the person's mean of their usable
records (after the record rules: null ids, non-finite values, the record cap, ``m_min``) and the
number of those records, ``_m_<col>``. A statistic kind may ask for a column derived from these
two, row by row, without a new pass over the records (``StatisticKind.derived_columns``):

==========  ==========================================================================
operation   per-person value
==========  ==========================================================================
``total``   ``<col> * _m_<col>``: the person's total of the column over those records
            (null / NaN where the mean is)
==========  ==========================================================================

A derived value is a function of one person's own summary row, so add/remove of one person still
changes one row: every person-level sensitivity argument over summary rows holds for it unchanged.
``spark_jobs.spark.derived.with_derived_columns`` computes the same values in Spark (one
``withColumn`` per column, the same IEEE double product; the contract test holds them equal).
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from dplib.errors import InvalidParameterError

#: The operations a derived column may use.
OPERATIONS = ("total",)


def count_column(column: str) -> str:
    """Name of the summary's record-count column of ``column``."""
    return f"_m_{column}"


def total_column(column: str) -> str:
    """The name the kinds give the derived per-person total of ``column``."""
    return f"__total__{column}"


def display_name(column: str) -> str:
    """The user's name for a column the kinds may have derived (``__total__v`` -> ``v (each
    person's total)``), for messages and release texts."""
    prefix = total_column("")
    return f"{column[len(prefix):]} (each person's total)" if column.startswith(prefix) else column


def check_derived(spec: Mapping[str, tuple[str, str]]) -> dict[str, tuple[str, str]]:
    """Validate ``{name: (column, operation)}``: string names, known operations, a derived name
    that is not also one of the source columns. Returns a plain dict."""
    out = {}
    for name, pair in spec.items():
        if not isinstance(name, str) or not name:
            raise InvalidParameterError(f"a derived column needs a non-empty name, got {name!r}")
        try:
            column, op = pair
        except (TypeError, ValueError):
            raise InvalidParameterError(f"derived column {name!r}: expected (column, operation), got {pair!r}") from None
        if op not in OPERATIONS:
            raise InvalidParameterError(f"derived column {name!r}: operation must be one of {OPERATIONS}, got {op!r}")
        if name == column:
            raise InvalidParameterError(f"derived column {name!r} would replace its own source column")
        out[name] = (str(column), str(op))
    return out


def derive_columns(
    values: Mapping[str, np.ndarray], counts: Mapping[str, np.ndarray], spec: Mapping[str, tuple[str, str]]
) -> dict[str, np.ndarray]:
    """The derived columns of :func:`check_derived`'s ``spec`` from arrays of the summary.

    Parameters
    ----------
    values : mapping column -> ndarray (n_persons,)
        Each person's mean of the column (NaN where the person has none).
    counts : mapping column -> ndarray (n_persons,)
        Each person's number of usable records of the column (``_m_<col>``).
    spec : mapping name -> (column, operation)

    Returns
    -------
    dict name -> float64 ndarray (n_persons,): ``values[column] * counts[column]`` for ``total``.

    Raises
    ------
    InvalidParameterError
        A bad spec, a missing column, or arrays of different lengths.
    """
    out = {}
    for name, (column, _op) in check_derived(spec).items():
        if column not in values or column not in counts:
            raise InvalidParameterError(f"derived column {name!r}: no mean and count of column {column!r}")
        y = np.asarray(values[column], dtype=np.float64)
        m = np.asarray(counts[column], dtype=np.float64)
        if y.shape != m.shape:
            raise InvalidParameterError(f"derived column {name!r}: means and counts of {column!r} differ in length")
        out[name] = y * m
    return out
