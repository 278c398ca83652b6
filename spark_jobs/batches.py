"""Per-person batches of a categorical column on Spark, and the batch aggregates backend.

:func:`person_batches` turns records into one row per person with at least ``m`` records:
``_group`` (the person's group index, as :func:`spark_jobs.summarize.summarize`) and ``counts``
(``array<int>`` of length ``k``, summing to ``m``): the categories of ``m`` records drawn
uniformly without replacement by the keyed-hash order of :mod:`dplib.distribution.batches`
(whose module docstring states the rule and why it is uniform and ignores the category). The
category list is public (config); values outside it, and nulls, count as OTHER (last index).
No Python UDF; the person id is dropped after hashing.

Two physical plans compute the same rows (tested equal):

- ``"window"`` (default): ``row_number()`` over ``Window.partitionBy(person).orderBy(key)``
  and a pivoted ``groupBy(person)`` count (spec §7.1's plan).
- ``"collect"``: one aggregation per person collecting ``(key, category)`` pairs (two longs
  and an int per record), ``array_sort`` + ``slice`` to the m smallest keys, and per-category
  sizes. Measured **slower** (``collect_list`` runs as an object hash aggregate that falls back
  to sort-based aggregation beyond 128 keys per task), kept for comparison.

``benchmarks/batch_sampling.py`` measures both (numbers in benchmarks/README.md): on 10^6
records the cost is dominated by the shared keying step (record JSON, two SHA-256 per record,
numbering of duplicates), and the window plan adds little to it.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from dplib.distribution.batches import (
    KEY_HEX_DIGITS,
    KEY_SEPARATOR,
    QUANT_SCALE,
    BatchMoments,
    check_batch_size,
    check_categories,
    check_clip,
)
from dplib.errors import InvalidParameterError
from dplib.groups import GroupRange, is_salt
from spark_jobs.summarize import _valid_id

PLANS = ("collect", "window")


def _keyed_records(df, unit_column, category_column, categories, salt_hex, label_columns, null_values):
    """Records -> (_pid, _cat, _k1, _k2): one row per record with its category index and key."""
    from pyspark.sql import functions as F

    cats = check_categories(categories)
    if not is_salt(salt_hex):
        raise InvalidParameterError("salt must be 64 lowercase hex characters")
    for c in [unit_column, category_column] + list(label_columns or []):
        if c not in df.columns:
            raise InvalidParameterError(f"column {c!r} not found in the records; they have {sorted(df.columns)}")
    other = len(cats)
    # public category list -> index (a literal map; the list is public, so plans may show it)
    mapping = F.create_map(*[x for i, c in enumerate(cats) for x in (F.lit(c), F.lit(i))])
    cat = F.coalesce(mapping[F.col(category_column).cast("string")], F.lit(other)).cast("int")
    label_cols = list(label_columns) if label_columns else list(df.columns)
    if category_column not in label_cols:
        # Two records with one label but different categories would get the same key (j counts
        # within (person, label, category)) and their tie would be broken by the category: the
        # draws would depend on it. The category is therefore always part of the label.
        label_cols.append(category_column)
    label = F.sha2(F.to_json(F.struct(*[F.col(c) for c in label_cols])), 256)
    uid = F.col(unit_column)
    records = df.where(_valid_id(uid, null_values)).select(
        uid.cast("string").alias("_pid"), cat.alias("_cat"), label.alias("_label")
    )
    # duplicates of (person, label) are identical records: number them 0..cnt-1
    numbered = records.groupBy("_pid", "_label", "_cat").agg(F.count(F.lit(1)).alias("_cnt"))
    numbered = numbered.select("_pid", "_label", "_cat", F.explode(F.sequence(F.lit(0), F.col("_cnt") - 1)).alias("_j"))
    salt_df = df.sparkSession.createDataFrame([(salt_hex,)], "_salt string")  # data, not a literal
    numbered = numbered.crossJoin(F.broadcast(salt_df))
    key = F.sha2(
        F.concat(F.col("_salt"), F.col("_pid"), F.lit(KEY_SEPARATOR), F.col("_label"), F.lit(":"), F.col("_j").cast("string")),
        256,
    )
    k1 = F.conv(F.substring(key, 1, KEY_HEX_DIGITS), 16, 10).cast("long")
    k2 = F.conv(F.substring(key, KEY_HEX_DIGITS + 1, KEY_HEX_DIGITS), 16, 10).cast("long")
    return numbered.select("_pid", "_cat", k1.alias("_k1"), k2.alias("_k2"))


def _with_group(per_person, salt_hex):
    """Add ``_group`` (as :func:`spark_jobs.summarize.summarize`) once per person row."""
    from pyspark.sql import functions as F

    salt_df = per_person.sparkSession.createDataFrame([(salt_hex,)], "_salt string")
    out = per_person.crossJoin(F.broadcast(salt_df))
    group = F.conv(F.substring(F.sha2(F.concat(F.col("_salt"), F.col("_pid")), 256), 1, 8), 16, 10).cast("long")
    return out.withColumn("_group", group)


def person_batches(
    df,
    unit_column: str,
    category_column: str,
    categories: Sequence[str],
    m: int,
    salt_hex: str,
    label_columns: Sequence[str] | None = None,
    null_values: Sequence[str] = ("", "NA", "null", "NULL", "None"),
    plan: str = "window",
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
        Columns whose JSON names a record (default: every column of ``df``).
    plan : "window" (default) or "collect"

    Returns
    -------
    DataFrame ``(_group long, counts array<int>)`` (lazy; persist it).

    Raises
    ------
    InvalidParameterError
        Bad categories, m, salt, plan, or a missing column.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    m = check_batch_size(m)
    if plan not in PLANS:
        raise InvalidParameterError(f"plan must be one of {PLANS}, got {plan!r}")
    k = len(check_categories(categories)) + 1
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


class SparkBatchAggregates:
    """The Spark backend of :class:`dplib.distribution.batches.BatchAggregates`.

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
        from pyspark.sql import functions as F

        lo, hi = group.bounds
        return self._df.where((F.col("_group") >= F.lit(lo)) & (F.col("_group") < F.lit(hi)))

    def _collect(self, df) -> list:
        rows = df.collect()
        self.rows_collected += len(rows)
        return rows

    def sums(self, group: GroupRange) -> tuple[int, tuple[int, ...]]:
        from pyspark.sql import functions as F

        c = F.col("counts")
        exprs = [F.count(F.lit(1)).alias("n")] + [F.sum(c[a].cast("decimal(38,0)")).alias(f"s{a}") for a in range(self.k)]
        (row,) = self._collect(self._where(group).agg(*exprs))
        return int(row["n"]), tuple(0 if row[f"s{a}"] is None else int(row[f"s{a}"]) for a in range(self.k))

    def moments(self, group: GroupRange) -> BatchMoments:
        from pyspark.sql import functions as F

        k = self.k
        c = F.col("counts")
        exprs = [F.count(F.lit(1)).alias("n")]
        exprs += [F.sum(c[a].cast("decimal(38,0)")).alias(f"s{a}") for a in range(k)]
        exprs += [
            F.sum(c[a].cast("decimal(38,0)") * c[b].cast("decimal(38,0)")).alias(f"o{a}_{b}")
            for a in range(k)
            for b in range(a, k)
        ]
        (row,) = self._collect(self._where(group).agg(*exprs))
        n = int(row["n"])
        val = lambda x: 0 if x is None else int(x)  # noqa: E731 (sum over no rows is null)
        s = tuple(val(row[f"s{a}"]) for a in range(k))
        o = [[0] * k for _ in range(k)]
        for a in range(k):
            for b in range(a, k):
                o[a][b] = o[b][a] = val(row[f"o{a}_{b}"])
        return BatchMoments(n, s, tuple(tuple(r) for r in o))

    def histogram(self, group: GroupRange) -> dict[tuple[int, ...], int]:
        rows = self._collect(self._where(group).groupBy("counts").count())
        return {tuple(int(x) for x in r["counts"]): int(r["count"]) for r in rows}

    def clipped_sum(self, center: np.ndarray, radius: float, norm: str, group: GroupRange) -> tuple[np.ndarray, int]:
        from pyspark.sql import functions as F

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
        aggs = [F.count(F.lit(1)).alias("n")] + [F.sum(F.col(f"u{j}").cast("decimal(38,0)")).alias(f"s{j}") for j in range(k)]
        (row,) = self._collect(df.agg(*aggs))
        total = [0 if row[f"s{j}"] is None else int(row[f"s{j}"]) for j in range(k)]
        return np.array([float(t) for t in total]) * (radius / QUANT_SCALE), int(row["n"])
