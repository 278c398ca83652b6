"""Per-person batches of a categorical column on Spark, and the batch aggregates backend.

:func:`person_batches` turns records into one row per person with at least ``m`` records:
``_group`` (the person's group index, as :func:`spark_jobs.spark.summarize.summarize`) and ``counts``
(``array<int>`` of length ``k``, summing to ``m``): the categories of ``m`` records drawn
uniformly without replacement by the keyed-hash order of :mod:`dplib.distribution.batches`
(whose module docstring states the rule and why it is uniform and ignores the category). The
category list is public (config); values outside it, and nulls, count as OTHER (last index).
No Python UDF; the person id is dropped after hashing.

Three physical plans compute the same rows (tested equal, and equal to the numpy twin):

- ``"bottomk"`` (default): records with the same person and label (interchangeable for the
  batch, which reads only the category the label fixes) are counted by a hash aggregation,
  expanded to copies numbered ``j = 0, 1, ...``, the salted key is computed once per copy, and Spark's bounded aggregate ``min_by(category, (key, category), m)`` (Spark >= 4.2;
  a heap of at most m entries per person) keeps the m smallest keys. With the default label
  (the category alone) the count runs before the shuffle with map-side partial aggregation, as
  a plain ``groupBy(person, category).count()`` does, and a second, small exchange moves the
  (person, label, category, count) rows by person; with other labels the records are shuffled
  once by person and counted inside the partition. Counts per category come from native array
  expressions; no per-person Python.
  For ``m`` above Spark's limit of ``min_by``'s ``k`` (:data:`BOTTOM_K_LIMIT`) it falls back to
  the window plan.
- ``"window"``: numbering of identical records by an aggregation, then ``row_number()`` over
  ``Window.partitionBy(person).orderBy(key)`` and a pivoted ``groupBy(person)`` count (the
  straightforward plan; two shuffles and a sort of every record by its key).
- ``"collect"``: as ``"window"`` up to the keys, then one aggregation per person collecting
  ``(key, category)`` pairs, ``array_sort`` + ``slice`` to the m smallest. Slowest
  (``collect_list`` runs as an object hash aggregate that falls back to sort-based aggregation
  beyond 128 keys per task), kept for comparison.

Order of records: the key is compared as its first 30 hex digits (a string of lowercase hex
digits of fixed length sorts exactly as the two 60-bit integers ``(k1, k2)`` of
:func:`dplib.distribution.batches.record_keys`), then by the category index: the same total order
as the numpy twin. ``benchmarks/batch_sampling.py`` measures the plans against a plain
``groupBy(person, category).count()`` in the same run (numbers in benchmarks/README.md).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from pyspark.sql import Window
from pyspark.sql import functions as F

from dplib.distribution.batches import (
    KEY_HEX_DIGITS,
    QUANT_SCALE,
    BatchMoments,
    check_batch_size,
    check_categories,
    check_clip,
    numeric_categories,
)
from dplib.distribution.shares import SHARE_SCALE
from dplib.errors import InvalidParameterError
from dplib.groups import GroupRange, is_salt
from spark_jobs.spark.aggregates import exact_sums
from spark_jobs.spark.io import FLOAT_TYPES, INTEGER_TYPES
from spark_jobs.spark.native import bound_object_hash_map
from spark_jobs.spark.native import enabled as native_enabled
from spark_jobs.spark.keys import group_index, identical_record_counts, in_group, number_copies, valid_id, with_record_key, with_salt
from spark_jobs.spark.sqlnames import qcol

PLANS = ("bottomk", "collect", "window")
#: Largest ``m`` of the ``"bottomk"`` plan (Spark's limit on ``min_by``'s ``k``); above it the
#: window plan runs instead.
BOTTOM_K_LIMIT = 100_000


def _checked_records(df, unit_column, category_column, categories, salt_hex, label_cols, null_values):
    """Check the parameters and columns, then return ``(records, pid, cat)``: the records with a
    valid person id, the ``_pid`` column (the id as a string) and the ``_cat`` column (category
    index in the public list, OTHER = last). Shared by both ways of naming records."""
    cats = check_categories(categories)
    if not is_salt(salt_hex):
        raise InvalidParameterError("salt must be 64 lowercase hex characters")
    for c in [unit_column, category_column] + [c for c in label_cols if c != category_column]:
        if c not in df.columns:
            raise InvalidParameterError(f"column {c!r} not found in the records; they have {sorted(df.columns)}")
    # public category list -> index (a literal map; the list is public, so plans may show it).
    # Numeric columns match by number, record by record (3.0 matches "3"; -0.0 is 0.0); others
    # by text. The column's type comes from the schema, never from the data.
    dtype = type(df.schema[category_column].dataType).__name__
    if dtype in FLOAT_TYPES or dtype in INTEGER_TYPES:
        integer = dtype in INTEGER_TYPES
        pairs = numeric_categories(cats, integer)
        typ = "long" if integer else "double"
        mapping = F.create_map(*[x for v, i in pairs for x in (F.lit(int(v) if integer else v).cast(typ), F.lit(i))])
        value = qcol(category_column).cast(typ)
        cat = F.coalesce(mapping[value if integer else value + F.lit(0.0)], F.lit(len(cats))).cast("int")
    else:
        mapping = F.create_map(*[x for i, c in enumerate(cats) for x in (F.lit(c), F.lit(i))])
        cat = F.coalesce(mapping[qcol(category_column).cast("string")], F.lit(len(cats))).cast("int")
    uid = qcol(unit_column)
    return df.where(valid_id(uid, null_values)), uid.cast("string").alias("_pid"), cat.alias("_cat")


def _labelled_records(df, unit_column, category_column, categories, salt_hex, label_columns, null_values):
    """Records -> (_pid, _cat, _label): one row per record with a valid person id, its category
    index in the public list (OTHER = last) and the SHA-256 hex of its label."""
    label_cols = _label_columns(label_columns, category_column)
    records, pid, cat = _checked_records(df, unit_column, category_column, categories, salt_hex, label_cols, null_values)
    label = F.sha2(F.to_json(F.struct(*[qcol(c) for c in label_cols])), 256)
    return records.select(pid, cat, label.alias("_label"))


def _label_columns(label_columns, category_column):
    """The columns whose JSON names a record: ``label_columns`` (default: the category column
    alone), with the category column always added."""
    label_cols = list(label_columns) if label_columns else [category_column]
    if category_column not in label_cols:
        # Two records with one label but different categories would get the same key (j counts
        # within (person, label, category)) and their tie would be broken by the category: the
        # draws would depend on it. The category is therefore always part of the label.
        label_cols.append(category_column)
    return label_cols


def _keyed_records(df, unit_column, category_column, categories, salt_hex, label_columns, null_values):
    """Records -> (_pid, _cat, _k1, _k2): one row per record with its category index and key
    (the window and collect plans)."""
    records = _labelled_records(df, unit_column, category_column, categories, salt_hex, label_columns, null_values)
    # records sharing (person, label) are interchangeable for the batch: number them 0..cnt-1
    numbered = records.groupBy("_pid", "_label", "_cat").agg(F.count(F.lit(1)).alias("_cnt"))
    numbered = number_copies(numbered, ["_pid", "_label", "_cat"])
    keyed = with_record_key(numbered, salt_hex)
    key = F.col("_key")
    k1 = F.conv(F.substring(key, 1, KEY_HEX_DIGITS), 16, 10).cast("long")
    k2 = F.conv(F.substring(key, KEY_HEX_DIGITS + 1, KEY_HEX_DIGITS), 16, 10).cast("long")
    return keyed.select("_pid", "_cat", k1.alias("_k1"), k2.alias("_k2"))


def _with_group(per_person, salt_hex):
    """Add ``_group`` (as :func:`spark_jobs.spark.summarize.summarize`) once per person row."""
    return with_salt(per_person, salt_hex).withColumn("_group", group_index())


def person_batches(
    df,
    unit_column: str,
    category_column: str,
    categories: Sequence[str],
    m: int,
    salt_hex: str,
    label_columns: Sequence[str] | None = None,
    null_values: Sequence[str] = ("", "NA", "null", "NULL", "None"),
    plan: str = "bottomk",
):
    """Records -> one row per person with at least ``m`` records: ``_group``, ``counts``.

    Parameters
    ----------
    df : pyspark DataFrame
        The records.
    unit_column : str
        Privacy unit column (records with a null or ``null_values`` id are dropped).
    category_column : str
        The categorical column; compared as a string with the public list.
    categories : sequence of str
        Public category list (OTHER is appended as index ``k - 1``).
    m : int
        Draws per person; persons with fewer records are dropped (policy ``drop``).
    salt_hex : str
        The run's secret salt (64 hex); joined as data, never a literal.
    label_columns : sequence of str, optional
        Columns whose JSON names a record (default: the category column alone; the category
        column is always added). Any choice gives the same law of the batches.
    plan : "bottomk" (default), "window" or "collect"
        Physical plan (module docstring); all give the same rows.

    Returns
    -------
    DataFrame ``(_group long, counts array<int>)`` (lazy; persist it).

    Raises
    ------
    InvalidParameterError
        Bad categories, m, salt, plan, or a missing column.
    """
    m = check_batch_size(m)
    if plan not in PLANS:
        raise InvalidParameterError(f"plan must be one of {PLANS}, got {plan!r}")
    k = len(check_categories(categories)) + 1
    if plan == "bottomk" and m <= BOTTOM_K_LIMIT:
        return _bottom_k_batches(df, unit_column, category_column, categories, m, salt_hex, label_columns, null_values)
    rec = _keyed_records(df, unit_column, category_column, categories, salt_hex, label_columns, null_values)
    if plan == "collect":
        per = rec.groupBy("_pid").agg(F.collect_list(F.struct("_k1", "_k2", "_cat")).alias("_recs"))
        per = _with_group(per.where(F.size("_recs") >= m), salt_hex)
        cats = F.transform(F.slice(F.array_sort(F.col("_recs")), 1, m), lambda r: r["_cat"])
        per = per.select("_group", cats.alias("_cats"))
        counts = F.transform(F.sequence(F.lit(0), F.lit(k - 1)), lambda j: F.size(F.filter(F.col("_cats"), lambda x: x == j)))
        return per.select("_group", counts.cast("array<int>").alias("counts"))
    w = Window.partitionBy("_pid")
    ranked = rec.select(
        "_pid",
        "_cat",
        F.row_number().over(w.orderBy("_k1", "_k2", "_cat")).alias("_rank"),
        F.count(F.lit(1)).over(w).alias("_records"),
    ).where((F.col("_rank") <= m) & (F.col("_records") >= m))
    per_cat = _with_group(ranked.groupBy("_pid").pivot("_cat", list(range(k))).count(), salt_hex)
    counts = F.array(*[F.coalesce(F.col(str(j)), F.lit(0)) for j in range(k)])
    return per_cat.select("_group", counts.cast("array<int>").alias("counts"))


def _bottom_k_batches(df, unit_column, category_column, categories, m, salt_hex, label_columns, null_values):
    """The ``"bottomk"`` plan (module docstring): hash-aggregated counts of identical records, one
    key per copy, a bounded ``min_by`` per person."""
    k = len(categories) + 1
    native = native_enabled(df.sparkSession)
    if _label_columns(label_columns, category_column) == [category_column]:
        # Records named by their category alone (the default): count (person, category), then
        # name each group once. The same labels, keys and draws as the per-record path below.
        # Native: the records are shuffled by person once and the counts and the bottom-k run in
        # the partition (measured faster than a map-side count and a second exchange of the
        # (person, label) rows); SQL path: map-side partial counts, as a plain
        # groupBy(person, category).count(), then a second exchange by person.
        counted = _category_counts(df, unit_column, category_column, categories, salt_hex, null_values, by_person=native)
    else:
        rec = _labelled_records(df, unit_column, category_column, categories, salt_hex, label_columns, null_values)
        # One shuffle by person; everything after it stays in the partition (hash partitioning
        # by person satisfies the clustering on (person, label, category) and on person).
        rec = rec.repartition("_pid")
        # Identical records share (person, label) (and so the category, which is part of the
        # label): a hash aggregation counts them inside the partition (no sort).
        counted = rec.groupBy("_pid", "_label", "_cat").agg(F.count(F.lit(1)).alias("_cnt"))
    if native:
        # the jar's bounded bottom-k (spark_jobs/spark/native.py): the same keys per copy, computed
        # inside a mergeable per-person aggregate (no row per copy, no sort)
        bound_object_hash_map(df.sparkSession, m)
        salted = with_salt(counted, salt_hex)
        per = salted.groupBy("_pid").agg(F.expr(f"person_dp_bottom_k(_salt, _pid, _label, _cnt, _cat, {int(m)})").alias("_cats"))
    else:
        # number identical records 0..cnt-1 (which copy gets which number is immaterial)
        numbered = number_copies(counted, ["_pid", "_label", "_cat"])
        keyed = with_record_key(numbered, salt_hex)
        order = F.struct(F.substring("_key", 1, 2 * KEY_HEX_DIGITS).alias("key"), F.col("_cat").alias("cat"))
        per = keyed.groupBy("_pid").agg(F.min_by("_cat", order, m).alias("_cats"))
    # fewer than m records: fewer than m kept (policy "drop")
    per = _with_group(per.where(F.size("_cats") == F.lit(m)), salt_hex)
    # count of category j among the m kept = m - size(array_remove(cats, j)) (native, no lambda)
    counts = F.array(*[F.lit(m) - F.size(F.array_remove("_cats", F.lit(j))) for j in range(k)])
    return per.select("_group", counts.cast("array<int>").alias("counts"))


def _category_counts(df, unit_column, category_column, categories, salt_hex, null_values, by_person=False):
    """``(_pid, _label, _cat, _cnt)`` for records named by their category alone: one row per
    (person, category value), ``_label`` the SHA-256 hex of ``to_json(struct(category))`` (as
    :func:`_labelled_records` computes it per record), ``_cnt`` the person's records of it.

    ``by_person``: shuffle the records by person first (one exchange; the counts and a per-person
    aggregate after them stay in the partition) instead of counting map-side before a shuffle
    by (person, value)."""
    records, pid, cat = _checked_records(df, unit_column, category_column, categories, salt_hex, [category_column], null_values)
    rows = records.select(pid, qcol(category_column).alias("_l0"), cat)
    if by_person:
        rows = rows.repartition("_pid")
    counted = identical_record_counts(rows, [category_column], {category_column: records.schema[category_column].dataType}, keys=["_cat"])
    return counted.select("_pid", "_label", "_cat", "_cnt")


class SparkBatchAggregates:
    """The Spark backend of :class:`dplib.seam.BatchAggregates`.

    Each call is one aggregation over the (cached) batches DataFrame and brings back O(k^2)
    numbers (``histogram``: O(D), D = distinct count vectors). Arithmetic mirrors
    :class:`dplib.distribution.batches.NumpyBatches` operation for operation; sums are exact
    (``decimal(38,0)``).

    Parameters
    ----------
    batches : DataFrame from :func:`person_batches`
    k, m : int
        Public number of categories (incl. OTHER) and draws per person.
    """

    def __init__(self, batches, k: int, m: int) -> None:
        self._df = batches
        self.k = int(k)
        self.m = check_batch_size(m)
        self.rows_collected = 0

    def _where(self, group: GroupRange):
        return self._df.where(in_group(group))

    def _collect(self, df) -> list:
        rows = df.collect()
        self.rows_collected += len(rows)
        return rows

    def sums(self, group: GroupRange) -> tuple[int, tuple[int, ...]]:
        c = F.col("counts")
        n, s = exact_sums(self._where(group), [c[a] for a in range(self.k)], self._collect)
        return n, tuple(s)

    def moments(self, group: GroupRange) -> BatchMoments:
        k = self.k
        c = F.col("counts")
        pairs = [(a, b) for a in range(k) for b in range(a, k)]
        products = [c[a].cast("decimal(38,0)") * c[b].cast("decimal(38,0)") for a, b in pairs]
        n, sums = exact_sums(self._where(group), [c[a] for a in range(k)] + products, self._collect)
        o = [[0] * k for _ in range(k)]
        for (a, b), v in zip(pairs, sums[k:]):
            o[a][b] = o[b][a] = v
        return BatchMoments(n, tuple(sums[:k]), tuple(tuple(r) for r in o))

    def histogram(self, group: GroupRange) -> dict[tuple[int, ...], int]:
        rows = self._collect(self._where(group).groupBy("counts").count())
        return {tuple(int(x) for x in r["counts"]): int(r["count"]) for r in rows}

    def clipped_sum(self, center: np.ndarray, radius: float, norm: str, group: GroupRange) -> tuple[np.ndarray, int]:
        center = check_clip(center, radius, norm, self.k)
        radius = float(radius)
        k, m = self.k, float(self.m)
        c = F.col("counts")
        dev = [c[j].cast("double") / F.lit(m) - F.lit(float(center[j])) for j in range(k)]
        size = F.lit(0.0)
        for d in dev:  # left to right, as numpy's cumsum
            size = size + (F.abs(d) if norm == "l1" else d * d)
        if norm == "l2":
            size = F.sqrt(size)
        factor = F.when(size > F.lit(radius), F.lit(radius) / size).otherwise(F.lit(1.0))
        units = [F.rint(d * factor / F.lit(radius) * F.lit(QUANT_SCALE)).cast("long") for d in dev]
        df = self._where(group).select(*[u.alias(f"u{j}") for j, u in enumerate(units)])
        n, total = exact_sums(df, [F.col(f"u{j}") for j in range(k)], self._collect)
        return np.array([float(t) for t in total]) * (radius / QUANT_SCALE), n


def person_shares(
    df,
    unit_column: str,
    category_column: str,
    categories: Sequence[str],
    salt_hex: str,
    null_values: Sequence[str] = ("", "NA", "null", "NULL", "None"),
):
    """Records -> one row per person: ``_group`` and ``units`` (array<long>, k entries), the
    person's fixed-point category shares over all records,
    ``round_half_even(c_ij / M_i * 2^30)`` (:func:`dplib.distribution.shares.share_units`: the same
    IEEE division and power-of-two product, Spark's ``bround``). One shuffle by person.

    Returns
    -------
    DataFrame ``(_group long, units array<long>)`` (lazy; persist it).
    """
    k = len(check_categories(categories)) + 1
    counted = _category_counts(df, unit_column, category_column, categories, salt_hex, null_values)
    per = counted.groupBy("_pid").pivot("_cat", list(range(k))).agg(F.sum("_cnt"))
    cnts = [F.coalesce(F.col(str(j)), F.lit(0)).cast("double") for j in range(k)]
    total = cnts[0]
    for c in cnts[1:]:
        total = total + c
    per = per.select("_pid", *[c.alias(f"_c{j}") for j, c in enumerate(cnts)], total.alias("_total"))
    units = F.array(*[F.bround(F.col(f"_c{j}") / F.col("_total") * F.lit(SHARE_SCALE), 0).cast("long") for j in range(k)])
    return _with_group(per.select("_pid", units.alias("units")), salt_hex).select("_group", "units")


class SparkShareSums:
    """The Spark backend of :class:`dplib.seam.ShareAggregates` over
    :func:`person_shares`: one aggregation per call, k + 1 numbers back, exact (decimal) sums."""

    def __init__(self, shares, k: int) -> None:
        self._df = shares
        self.k = int(k)
        self.rows_collected = 0

    def _collect(self, df) -> list:
        rows = df.collect()
        self.rows_collected += len(rows)
        return rows

    def share_sums(self, group: GroupRange) -> tuple[int, tuple[int, ...]]:
        u = F.col("units")
        n, s = exact_sums(self._df.where(in_group(group)), [u[j] for j in range(self.k)], self._collect)
        return n, tuple(s)
