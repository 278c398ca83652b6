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
- finite values are clamped to ``[-VALUE_BOUND, VALUE_BOUND]`` (1e300) before averaging, so a
  person's sum cannot overflow; a per-record transform that leaves real data untouched.
"""

from __future__ import annotations

from dplib.aggregates import VALUE_BOUND
from dplib.errors import InvalidParameterError
from dplib.groups import is_salt


def _valid_id(col, null_values):
    from pyspark.sql import functions as F

    s = F.trim(col.cast("string"))
    cond = col.isNotNull()
    if null_values:
        cond = cond & ~s.isin(list(null_values))
    return cond


def summarize(df, unit_column: str, value_columns: list[str], salt_hex: str, m_min: int = 1, null_values=("NA", "")):
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

    Returns
    -------
    DataFrame with columns ``_group``, ``<col>``, ``_m_<col>`` (lazy; cache it).
    """
    from pyspark.sql import functions as F

    if not is_salt(salt_hex):
        raise InvalidParameterError("salt must be 64 lowercase hex characters")
    uid = F.col(unit_column)
    records = df.where(_valid_id(uid, null_values))
    aggs = []
    for c in value_columns:
        v = F.col(c).cast("double")
        # Spark's least/greatest skip nulls (greatest(null, x) = x): test for null first.
        bad = v.isNull() | F.isnan(v) | (F.abs(v) == F.lit(float("inf")))
        usable = F.when(bad, F.lit(None).cast("double")).otherwise(
            F.least(F.greatest(v, F.lit(-VALUE_BOUND)), F.lit(VALUE_BOUND))
        )
        aggs.append(F.count(usable).alias(f"_m_{c}"))
        aggs.append(F.avg(usable).alias(f"_avg_{c}"))
    per_person = records.groupBy(uid.cast("string").alias("_pid")).agg(*aggs)
    # The salt enters as data of a one-row broadcast table, not as a literal: literals are
    # printed in query plans (Spark UI, event logs, explain()), table rows are not.
    salt_df = df.sparkSession.createDataFrame([(salt_hex,)], "_salt string")
    per_person = per_person.crossJoin(F.broadcast(salt_df))
    group = F.conv(F.substring(F.sha2(F.concat(F.col("_salt"), F.col("_pid")), 256), 1, 8), 16, 10).cast("long")
    cols = [group.alias("_group")]
    for c in value_columns:
        cols.append(F.when(F.col(f"_m_{c}") >= m_min, F.col(f"_avg_{c}")).alias(c))
        cols.append(F.col(f"_m_{c}"))
    return per_person.select(*cols)
