"""Salted keys on Spark, shared by the summarize pass and the per-person batches.

- :func:`valid_id`: which records have a person (the record rule of
  :mod:`spark_jobs.spark.summarize`).
- :func:`with_salt`, :func:`group_index`, :func:`in_group`: the run's salt joined as data, the
  person's group index ``int(sha2(salt || id)[:8], 16)`` (:func:`dplib.groups.group_index`) and
  the test that it lies in a group's hash range.
- :func:`number_copies`, :func:`with_record_key`: identical records numbered ``j = 0, 1, ...``
  and keyed ``SHA-256(salt || person || 0x1f || label || ":" || j)``, the keyed-hash order of
  :mod:`dplib.distribution.batches` (:func:`~dplib.distribution.batches.record_keys`), used by
  the batches' draws and by the summary's record cap.

The salt never appears as a literal: it enters as the row of a one-row broadcast table, and
literals are printed in query plans (Spark UI, event logs, ``explain()``), table rows are not.
"""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql import functions as F

from dplib.distribution.batches import KEY_SEPARATOR

#: Copies of one record are numbered in blocks of this size (no array above it, whatever the count).
COPY_BLOCK = 65_536


def valid_id(col, null_values):
    """True for a record with a person: id not null and, after trimming, not one of ``null_values``."""
    s = F.trim(col.cast("string"))
    cond = col.isNotNull()
    if null_values:
        cond = cond & ~s.isin(list(null_values))
    return cond


def with_salt(df, salt_hex: str):
    """``df`` with a ``_salt`` column: the salt joined as data (a broadcast one-row table).

    The table is made from an Arrow table (decoded in the JVM): a table made from a Python list
    is an RDD whose one row a Python worker must produce in every job that reads it (~0.15 s a
    pass)."""
    salt_df = df.sparkSession.createDataFrame(pa.table({"_salt": pa.array([salt_hex], pa.string())}))
    return df.crossJoin(F.broadcast(salt_df))


def group_index():
    """The person's group index in ``[0, 2**32)`` from the ``_salt`` and ``_pid`` columns: the
    first 8 hex digits of ``sha2(salt || id)`` (as :func:`dplib.groups.group_index`)."""
    return F.conv(F.substring(F.sha2(F.concat(F.col("_salt"), F.col("_pid")), 256), 1, 8), 16, 10).cast("long")


def in_group(group):
    """True for the persons of ``group`` (a :class:`dplib.groups.GroupRange`): ``_group`` in its
    bounds ``[lo, hi)``."""
    lo, hi = group.bounds
    return (F.col("_group") >= F.lit(lo)) & (F.col("_group") < F.lit(hi))


def number_copies(counted, keep):
    """``(<keep>, _cnt)`` -> ``(<keep>, _j)``: each row repeated ``_cnt`` times with
    ``_j = 0 .. _cnt - 1`` (long). Two levels of ``explode``, so no array holds more than
    :data:`COPY_BLOCK` elements: a person with 10^9 identical records (a bot sending one value)
    costs no oversized row, and Spark's array-size error, whose message would print the count,
    cannot occur."""
    cnt = F.col("_cnt").cast("long")
    blocks = counted.select(*keep, cnt.alias("_cnt"), F.explode(F.sequence(F.lit(0).cast("long"), F.floor((cnt - 1) / COPY_BLOCK))).alias("_b"))
    lo = F.col("_b") * COPY_BLOCK
    hi = F.least(F.col("_cnt"), lo + COPY_BLOCK) - 1
    return blocks.select(*keep, F.explode(F.sequence(lo, hi)).alias("_j"))


def with_record_key(numbered, salt_hex, keep=("_cat",)):
    """``(_pid, _label, <keep>, _j)`` -> ``(_pid, <keep>, _key)``, ``_key`` the hex digest
    ``SHA-256(salt || person || 0x1f || label || ":" || j)`` of
    :func:`dplib.distribution.batches.record_keys`. The salt is joined as data (:func:`with_salt`),
    never a literal in the plan."""
    out = with_salt(numbered, salt_hex)
    key = F.sha2(
        F.concat(F.col("_salt"), F.col("_pid"), F.lit(KEY_SEPARATOR), F.col("_label"), F.lit(":"), F.col("_j").cast("string")),
        256,
    )
    return out.select("_pid", *keep, key.alias("_key"))
