"""Spark side of :mod:`dplib.fixed_n`: the histogram of the count vectors of exactly the ``n0``
persons of smallest keyed-hash rank (P3 of ``kind: distribution``).

:class:`SparkFixedNBatches` extends :class:`spark_jobs.spark.batches.SparkBatchAggregates` with
``ranked_histogram``, the Spark twin of
:meth:`dplib.distribution.batches.NumpyBatches.ranked_histogram`: persons of the group ordered by
``(_group, counts)`` (the keyed hash of the person id with the run's secret salt, ties broken by
the count vector, Spark's lexicographic array order), the first ``n0`` kept, then
``groupBy(counts).count()``. The top-``n0`` is Spark's ``orderBy(...).limit(n0)`` (a per-partition
top-k and one merge); only O(D) rows (D = distinct count vectors) reach the driver. Padding with
dummies happens in dplib (:func:`dplib.fixed_n.pad_histogram`), identically for both backends.
"""

from __future__ import annotations

from dplib.errors import InvalidParameterError
from dplib.groups import GroupRange
from spark_jobs.spark.batches import SparkBatchAggregates


class SparkFixedNBatches(SparkBatchAggregates):
    """:class:`SparkBatchAggregates` plus ``ranked_histogram`` (same constructor)."""

    def ranked_histogram(self, group: GroupRange, n0: int) -> dict[tuple[int, ...], int]:
        """Persons per distinct count vector among the ``n0`` persons of the group with the
        smallest ``(_group, counts)`` (all of them when fewer exist). O(D) rows collected.

        Raises
        ------
        InvalidParameterError
            ``n0`` not an integer >= 1.
        """
        if isinstance(n0, bool) or not isinstance(n0, int) or n0 < 1:
            raise InvalidParameterError(f"n0 must be an integer >= 1, got {n0!r}")
        top = self._where(group).orderBy("_group", "counts").limit(int(n0))
        rows = self._collect(top.groupBy("counts").count())
        return {tuple(int(x) for x in r["counts"]): int(r["count"]) for r in rows}
