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
from spark_jobs.spark.native import groups_like_json

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


def identical_record_counts(rows, label_columns, dtypes, keys=()):
    """Count each person's identical records, naming each group once (not once per record).

    ``rows``: ``_pid``, the label columns' raw values as ``_l0 .. _l{n-1}`` (``label_columns``
    their names, ``dtypes`` their Spark types) and ``keys`` (columns that are functions of the
    label, carried along). Returns ``(_pid, <keys>, _l0.., _label, _cnt)``: one row per (person,
    label), ``_label`` the SHA-256 hex of ``to_json(struct(label columns))`` (the record name of
    :func:`with_record_key`), the ``_l`` values as the group's records hold them, ``_cnt`` its
    records. No shuffle of its own beyond the aggregation's (repartition ``rows`` by ``_pid``
    first to count inside the person's partition).

    Grouping by the raw values equals grouping by their JSON for the types of
    :func:`spark_jobs.spark.native.groups_like_json`, and for floats with a zero's text as a
    further key (grouping normalises -0.0 to 0.0, the JSON does not; every NaN prints "NaN").
    Any other label column (collated strings, structs, arrays, maps): the JSON text is formatted
    per record and grouped by itself."""
    raw = [f"_l{i}" for i in range(len(label_columns))]
    floats = [i for i, c in enumerate(label_columns) if type(dtypes.get(c)).__name__ in ("FloatType", "DoubleType")]
    keys = list(keys)
    if all(i in floats or groups_like_json(dtypes.get(c)) for i, c in enumerate(label_columns)):
        signs = [F.when(F.col(raw[i]) == 0, F.col(raw[i]).cast("string")).alias(f"_z{i}") for i in floats]  # "-0.0" / "0.0"
        counted = rows.select("_pid", *keys, *raw, *signs).groupBy("_pid", *keys, *raw, *[f"_z{i}" for i in floats]).agg(
            F.count(F.lit(1)).alias("_cnt"))
        values = {i: F.col(r) for i, r in enumerate(raw)}
        for i in floats:  # the grouped key comes out normalised: -0.0 back from its text, in the column's own type
            minus_zero = F.lit(-0.0).cast(dtypes[label_columns[i]])
            values[i] = F.when(F.col(f"_z{i}") == F.lit("-0.0"), minus_zero).otherwise(F.col(raw[i]))
        json = F.to_json(F.struct(*[values[i].alias(c) for i, c in enumerate(label_columns)]))
        return counted.select("_pid", *keys, *[values[i].alias(r) for i, r in enumerate(raw)],
                              F.sha2(json, 256).alias("_label"), "_cnt")
    json = F.to_json(F.struct(*[F.col(r).alias(c) for r, c in zip(raw, label_columns)]))
    counted = rows.select("_pid", *keys, *raw, json.alias("_json")).groupBy("_pid", "_json", *keys).agg(
        *[F.first(r).alias(r) for r in raw], F.count(F.lit(1)).alias("_cnt"))
    return counted.select("_pid", *keys, *raw, F.sha2(F.col("_json"), 256).alias("_label"), "_cnt")
