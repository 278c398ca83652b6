"""The summarize pass: records -> one row per person. One Spark aggregation, no Python UDF.

Output columns of :func:`summarize`:

- ``_group``: the person's group index, ``int(sha2(salt || id)[:8], 16)`` in ``[0, 2**32)``
  (the same function as :func:`dplib.groups.group_index`).
- ``<col>``: the person's mean of the usable records of each value column, or null when the
  person has fewer than ``m_min`` of them.
- ``_m_<col>``: records used for ``<col>``.

The person id itself is dropped after hashing: nothing downstream needs it.

Record rules (documented in README.md):

- id null, or equal after trimming to one of ``null_values``: record dropped (no person).
- value NaN, +inf or -inf: that value is dropped for that column before the person's mean.
- finite values are clamped to ``[-VALUE_BOUND, VALUE_BOUND]`` (1e300) before averaging; a
  per-record transform that leaves real data untouched. (A sum of more than ~1e8 such extreme
  records could still overflow to +-inf; the clamp in the aggregates maps it back to +-1e300.)
- the person's mean sums their values in sorted order, so it depends only on their own values,
  never on how Spark partitions the data.
- record capping (``max_records_per_person = R``, off by default): a person with more than R
  records keeps R of them, drawn uniformly without replacement by the salted keyed-hash order of
  :mod:`dplib.distribution.batches` (record ``r`` of person ``p`` gets the key
  ``SHA-256(salt' || p || 0x1f || label_r || ":" || j_r)``, ``salt' = derive_salt(salt,
  "record-cap")``, ``label_r`` the SHA-256 of the JSON of its value columns (the job: every value
  column of the run, so all its statistics keep the same records), ``j_r`` numbering identical
  records of the person; the R smallest keys are kept). Spark's bounded ``min_by`` holds O(R) per
  person whatever their record count: keep R to what a person's mean needs (hundreds or
  thousands), not near the limit. The
  choice depends only on the person's own records and the run's secret salt: capping never
  changes the person-level sensitivity of anything downstream, it bounds per-person work and
  the weight of persons with millions of records (bots, shared devices) in their own mean.
  Capping is applied to records before the per-column rules above (a kept record with a NaN
  value still drops out of that column).
"""

from __future__ import annotations

from dplib.aggregates import VALUE_BOUND
from dplib.errors import InvalidParameterError
from dplib.groups import derive_salt, is_salt

#: Largest ``max_records_per_person`` (Spark's limit on ``min_by``'s ``k``).
MAX_RECORDS_LIMIT = 100_000
#: The cap's keys use ``derive_salt(salt, CAP_SALT_TAG)``: an order of their own, independent of
#: the distribution batches' draws and of the group index.
CAP_SALT_TAG = "record-cap"


def _valid_id(col, null_values):
    from pyspark.sql import functions as F

    s = F.trim(col.cast("string"))
    cond = col.isNotNull()
    if null_values:
        cond = cond & ~s.isin(list(null_values))
    return cond


def summarize(
    df, unit_column: str, value_columns: list[str], salt_hex: str, m_min: int = 1, null_values=("NA", ""),
    keep_id: bool = False, max_records_per_person: int | None = None, label_columns: list[str] | None = None,
):
    """Group records by person into person summaries (one Spark aggregation).

    Parameters
    ----------
    df : pyspark DataFrame
        The records; validated by :func:`spark_jobs.io.validate_schema`.
    unit_column : str
        Privacy unit column.
    value_columns : list of str
        Numeric columns to average per person.
    salt_hex : str
        64 hex characters from the OS CSPRNG; never logged or stored.
    m_min : int
        Minimum usable records per person and column.
    null_values : sequence of str
        Id values treated as missing.
    keep_id : bool
        Also keep the person id as ``_pid`` (string): for estimators that hash it again with
        their own tag (BHS23's keyed order, :mod:`spark_jobs.covariance`). Never written out.
    max_records_per_person : int, optional
        Record cap R in ``[m_min, MAX_RECORDS_LIMIT]`` (module docstring); None (default) keeps all.
    label_columns : list of str, optional
        Columns whose JSON names a record for the cap's keys (default ``value_columns``). The job
        passes every value column of the run, so all statistics of a run keep the same records.

    Raises
    ------
    InvalidParameterError
        Bad salt, ``max_records_per_person`` or ``label_columns``.

    Returns
    -------
    DataFrame with columns ``_group``, ``<col>``, ``_m_<col>`` (and ``_pid``) (lazy; cache it).
    """
    from pyspark.sql import functions as F

    if not is_salt(salt_hex):
        raise InvalidParameterError("salt must be 64 lowercase hex characters")
    cap = _check_cap(max_records_per_person)
    if cap is not None and cap < m_min:
        raise InvalidParameterError(f"max_records_per_person ({cap}) is below m_min ({m_min}): no person could keep m_min records")
    labels = list(value_columns) if label_columns is None else list(label_columns)
    if cap is not None and not set(value_columns) <= set(labels):
        raise InvalidParameterError("label_columns must include every value column")
    uid = F.col(unit_column)
    records = df.where(_valid_id(uid, null_values))
    if cap is not None:
        capped = _capped_values(records, uid, value_columns, labels, derive_salt(salt_hex, CAP_SALT_TAG), cap)
        return _finish(capped, df, value_columns, salt_hex, m_min, keep_id)
    aggs = []
    for c in value_columns:
        # Order-independent mean: sum the person's values in sorted order. Spark's avg adds in
        # shuffle order, which depends on partitioning (and so on other persons); its last bits
        # could move a person across a histogram bin edge. Sorting makes Y_i a function of the
        # person's own multiset of values.
        # sort_array, not array_sort: the same ascending order here (collect_list drops nulls,
        # NaN was mapped to null; the two orders differ only on nulls), but sort_array is
        # generated code while array_sort evaluates a comparator lambda per comparison
        # (measured ~1.3x faster on the whole pass, benchmarks/README.md). Ties are equal values
        # or -0.0 / 0.0, whose order cannot change a sum that starts at +0.0.
        aggs.append(F.sort_array(F.collect_list(_usable(c))).alias(f"_vals_{c}"))
    per_person = records.groupBy(uid.cast("string").alias("_pid")).agg(*aggs)
    return _finish(per_person, df, value_columns, salt_hex, m_min, keep_id)


def _usable(c):
    """A value column as the summary uses it: double, non-finite -> null, clamped to
    ``[-VALUE_BOUND, VALUE_BOUND]``."""
    from pyspark.sql import functions as F

    v = F.col(c).try_cast("double")  # CSV strings: a non-number becomes null (dropped)
    # Spark's least/greatest skip nulls (greatest(null, x) = x): test for null first.
    bad = v.isNull() | F.isnan(v) | (F.abs(v) == F.lit(float("inf")))
    return F.when(bad, F.lit(None).cast("double")).otherwise(F.least(F.greatest(v, F.lit(-VALUE_BOUND)), F.lit(VALUE_BOUND)))


def _check_cap(cap):
    if cap is None:
        return None
    if isinstance(cap, bool) or not isinstance(cap, int) or not 1 <= cap <= MAX_RECORDS_LIMIT:
        raise InvalidParameterError(f"max_records_per_person must be an integer in [1, {MAX_RECORDS_LIMIT}], got {cap!r}")
    return cap


def _capped_values(records, uid, value_columns, label_columns, salt_hex, cap):
    """``(_pid, _vals_<col>...)``: each person's usable values of the at most ``cap`` records
    with the smallest keys (module docstring), sorted ascending per column. One shuffle by
    person; the window numbering identical records and the bounded ``min_by`` run inside it."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from spark_jobs.batches import KEY_HEX_DIGITS, _with_record_key

    names = [f"_v{i}" for i in range(len(value_columns))]
    label = F.sha2(F.to_json(F.struct(*[F.col(c) for c in label_columns])), 256)
    rec = records.select(
        uid.cast("string").alias("_pid"), label.alias("_label"),
        F.struct(*[_usable(c).alias(n) for c, n in zip(value_columns, names)]).alias("_rec"),
    ).repartition("_pid")
    # identical records (same label) are numbered 0..cnt-1 within the person; their order among
    # themselves is immaterial (the label is a function of every value column the summary reads)
    same = Window.partitionBy("_pid", "_label").orderBy("_label")
    numbered = rec.select("_pid", "_label", "_rec", (F.row_number().over(same) - 1).alias("_j"))
    keyed = _with_record_key(numbered, salt_hex, keep=("_rec",))
    order = F.struct(F.substring("_key", 1, 2 * KEY_HEX_DIGITS).alias("key"), F.col("_rec").alias("rec"))
    per = keyed.groupBy("_pid").agg(F.min_by("_rec", order, cap).alias("_kept"))
    vals = [
        F.sort_array(F.filter(F.col("_kept").getField(n), lambda x: x.isNotNull())).alias(f"_vals_{c}")
        for c, n in zip(value_columns, names)
    ]
    return per.select("_pid", *vals)


def _finish(per_person, df, value_columns, salt_hex, m_min, keep_id):
    """``(_pid, _vals_<col>...)`` (sorted usable values) -> the summary columns."""
    from pyspark.sql import functions as F

    sums = {}
    for c in value_columns:
        vals = F.col(f"_vals_{c}")
        total = F.aggregate(vals, F.lit(0.0), lambda acc, x: acc + x)
        sums[c] = (F.size(vals), F.when(F.size(vals) > 0, total / F.size(vals)))
    per_person = per_person.select(
        "_pid", *[x for c in value_columns for x in (sums[c][0].alias(f"_m_{c}"), sums[c][1].alias(f"_avg_{c}"))]
    )
    # The salt enters as data of a one-row broadcast table, not as a literal: literals are
    # printed in query plans (Spark UI, event logs, explain()), table rows are not.
    salt_df = df.sparkSession.createDataFrame([(salt_hex,)], "_salt string")
    per_person = per_person.crossJoin(F.broadcast(salt_df))
    group = F.conv(F.substring(F.sha2(F.concat(F.col("_salt"), F.col("_pid")), 256), 1, 8), 16, 10).cast("long")
    cols = [group.alias("_group")] + ([F.col("_pid")] if keep_id else [])
    for c in value_columns:
        cols.append(F.when(F.col(f"_m_{c}") >= m_min, F.col(f"_avg_{c}")).alias(c))
        cols.append(F.col(f"_m_{c}"))
    return per_person.select(*cols)
