"""The per-(person, group) summary of a ``group_by`` statistic, on Spark.

One pass over the records, as :func:`spark_jobs.spark.summarize.summarize` (same record rules,
same exact fixed-point means) with the group key joining the person id in the grouping key:

1. Records with a null group column are dropped (documented: null is not a key). The group key
   ``_gkey`` is the JSON array of the group columns cast to string (Spark's ``to_json``).
2. With a public key set, records of other keys are dropped (a semi-join on a broadcast table of
   the listed keys, their ``_gkey`` computed by the same Spark expression).
3. The summary is taken per (person, key): the person's mean of each value column within the key.
4. **L0 bound.** A person holding more than ``max_groups_per_person = L0`` keys keeps the L0 keys
   with the smallest ``SHA-256(salt' || person || 0x1f || key)`` (``salt' =
   derive_salt(salt, "group-l0")``): the choice depends only on the person's own keys and the
   run's secret salt, so adding or removing one person changes nobody else's keys, and each
   person contributes to at most L0 groups.
5. Each kept key gets its group id ``_gid`` (its index in the released key list) by a broadcast
   join; :class:`spark_jobs.spark.grouped.SparkGroupedAggregates` answers per ``_gid``.

Nothing here adds noise; the exact per-key person counts (:meth:`SparkGroupedInput.person_counts`)
go only into the partition selection mechanism.
"""

from __future__ import annotations

import json
import logging

from pyspark.sql import Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dplib.distribution.batches import KEY_SEPARATOR
from dplib.groups import derive_salt
from spark_jobs.spark.aggregates import SparkAggregates
from spark_jobs.spark.derived import with_derived_columns
from spark_jobs.spark.grouped import GID, SparkGroupedAggregates
from spark_jobs.spark.keys import valid_id, with_salt
from spark_jobs.spark.sqlnames import qcol
from spark_jobs.spark.summarize import summarize

log = logging.getLogger("person_dp.grouping")

#: The L0 choice's keys use ``derive_salt(salt, L0_SALT_TAG)`` (independent of every other order).
L0_SALT_TAG = "group-l0"
GKEY = "_gkey"
_PG = "__person_group"


def key_expr(columns):
    """The group key of a record: the JSON array of its group columns as strings."""
    return F.to_json(F.array(*[qcol(c).cast("string") for c in columns]))


def decode_key(gkey: str, columns) -> dict[str, str]:
    """``_gkey`` (JSON array) -> ``{column: value}`` for the release row."""
    return dict(zip(columns, json.loads(gkey)))


class SparkGroupedInput:
    """The L0-bounded per-(person, key) summary of one grouped statistic (cached).

    Parameters
    ----------
    records : DataFrame
        The validated records (ids normalised as the job does).
    unit_column, null_values : the privacy unit column and its null ids.
    group_columns : list of str
    keys : list of tuple of str, optional
        The public key set (values as strings), or None for private selection.
    l0 : int
        ``max_groups_per_person``.
    value_columns : list of str
    salt_hex : str
        The run's salt (never logged).
    m_min, max_records_per_person, label_columns : as :func:`summarize` (per (person, key)).
    """

    def __init__(self, records, unit_column, null_values, group_columns, keys, l0, value_columns, salt_hex,
                 m_min=1, max_records_per_person=None, label_columns=None, derived=None) -> None:
        self.group_columns = list(group_columns)
        self.value_columns = list(value_columns)
        spark = records.sparkSession
        uid = qcol(unit_column)
        cond = valid_id(uid, null_values)
        for c in self.group_columns:
            cond = cond & qcol(c).isNotNull()
        rec = records.where(cond).withColumn(GKEY, key_expr(self.group_columns))
        self._public = None
        if keys is not None:
            schema = T.StructType([T.StructField(c, T.StringType(), False) for c in self.group_columns]
                                  + [T.StructField(GID, T.LongType(), False)])
            kdf = spark.createDataFrame([(*k, i) for i, k in enumerate(keys)], schema)
            self._public = kdf.select(key_expr(self.group_columns).alias(GKEY), F.col(GID))
            rec = rec.join(F.broadcast(self._public.select(GKEY)), on=GKEY, how="left_semi")
        # the person and the key as one summary "person": JSON, so no id can collide with a separator
        rec = rec.withColumn(_PG, F.to_json(F.array(uid.cast("string"), F.col(GKEY))))
        summary = summarize(rec, _PG, self.value_columns, salt_hex, m_min, null_values=(), keep_id=True,
                            max_records_per_person=max_records_per_person, label_columns=label_columns)
        parts = F.from_json(F.col("_pid"), "array<string>")
        s = summary.select("*", parts.getItem(0).alias("_person"), parts.getItem(1).alias(GKEY)).drop("_pid", "_salt")
        s = with_salt(s, derive_salt(salt_hex, L0_SALT_TAG))
        h = F.sha2(F.concat(F.col("_salt"), F.col("_person"), F.lit(KEY_SEPARATOR), F.col(GKEY)), 256)
        rank = F.row_number().over(Window.partitionBy("_person").orderBy(h))
        # the person holds more than L0 keys (its L0 + 1st exists): read only by the L0 check
        over = F.max(F.lit(1)).over(Window.partitionBy("_person").orderBy(h).rowsBetween(int(l0), int(l0)))
        kept = s.select("*", rank.alias("_rank"), over.isNotNull().alias("_over")).where(F.col("_rank") <= F.lit(int(l0)))
        keep_cols = [GKEY, "_group", "_rank", "_over"] + [c for v in self.value_columns for c in (v, f"_m_{v}")]
        kept = kept.select(*[qcol(c) for c in keep_cols])
        if derived:  # per-(person, group) derived columns (e.g. a sum's totals), as on the shared summary
            kept = with_derived_columns(kept, derived)
        self._summary = kept.persist()

    def person_counts(self) -> dict[str, int]:
        """Exact persons per key after the L0 bound (for the selection mechanism only; O(keys) rows)."""
        return {r[GKEY]: int(r["count"]) for r in self._summary.groupBy(GKEY).count().collect()}

    def l0_over_count(self) -> int:
        """The exact number of persons holding more than L0 keys (for the L0 check only; one row)."""
        r = self._summary.where((F.col("_rank") == F.lit(1)) & F.col("_over")).agg(F.count(F.lit(1)).alias("over"))
        return int(r.collect()[0]["over"])

    def backend(self, keys: list[str] | None = None, first_only: bool = False) -> SparkGroupedAggregates:
        """The grouped seam over the released keys: ``keys[i]`` (``_gkey`` JSON) gets group id ``i``;
        None: the public key set (its order). ``first_only``: only the rows of each person's first
        kept key (the pooled view's rows, split by key; a joint stage's sensitivity-1 histogram)."""
        if keys is None:
            if self._public is None:
                raise ValueError("private selection: pass the released keys")
            ids = self._public
        else:
            spark = self._summary.sparkSession
            schema = T.StructType([T.StructField(GKEY, T.StringType(), False), T.StructField(GID, T.LongType(), False)])
            ids = spark.createDataFrame([(k, i) for i, k in enumerate(keys)], schema)
        rows = self._summary.where(F.col("_rank") == F.lit(1)) if first_only else self._summary
        df = rows.join(F.broadcast(ids), on=GKEY, how="inner").drop(GKEY, "_rank", "_over")
        return SparkGroupedAggregates(df)

    def pooled(self) -> SparkAggregates:
        """The seam over one value per person: the person's first kept key (smallest keyed hash),
        every key pooled; for a stage shared by all groups (sensitivity 1, as ungrouped)."""
        return SparkAggregates(self._summary.where(F.col("_rank") == F.lit(1)).drop(GKEY, "_rank", "_over"))

    def public_keys(self) -> list[str]:
        """The public key set as ``_gkey`` JSON, in config order (one small Spark job)."""
        if self._public is None:
            raise ValueError("no public key set")
        rows = self._public.collect()
        return [r[GKEY] for r in sorted(rows, key=lambda r: r[GID])]

    def unpersist(self) -> None:
        self._summary.unpersist()
