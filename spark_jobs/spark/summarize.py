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
- finite values are clamped to ``[-CLAMP, CLAMP]`` (``CLAMP`` ~3.17e29, the largest double
  below 2**98, :data:`dplib.summary.CLAMP`), and magnitudes below 2**-98 (~3.2e-30) keep only
  their bits above 2**-150 (~7e-46; truncated toward zero): per-record transforms that leave real
  data untouched (rescale a column whose values live outside [1e-29, 1e29]).
- the person's mean is the exact fixed-point sum of :mod:`dplib.summary` divided by the count.
  Two implementations, equal bit for bit (tested, with the numpy twin
  :func:`dplib.summary.person_mean`): the native aggregate ``person_dp_exact_sum`` of the jar,
  one per column (:mod:`spark_jobs.spark.native`: five base-2**61 slots in carry-save form, of
  which a value touches two; a declarative aggregate whose update Spark compiles into the
  aggregation's generated code; used when the jar is loaded), and the pure Spark SQL fallback (each value becomes
  eight signed 31-bit limbs of ``floor(|v| 2**150)``, summed per person as 64-bit integers, then
  carried into canonical digits). Both reduce map-side like a plain ``sum`` and depend only on
  the person's own values, never on partitioning or shuffle order. A limb sum of the SQL path
  could overflow only beyond 2**32 records of one person: Spark's ANSI mode (the default of
  Spark 4) then fails the job; with ANSI mode switched off the sum wraps, which is still
  order-independent (no privacy effect) but gives that person a wrong mean (the native digits
  never overflow). Cap such persons' records (``max_records_per_person``).
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

import math

from pyspark.sql import functions as F

from dplib.distribution.batches import KEY_HEX_DIGITS
from dplib.errors import InvalidParameterError
from dplib.groups import derive_salt, is_salt
from dplib.summary import CLAMP, LIMB_BITS, LIMBS, SHIFT, check_record_cap
from spark_jobs.spark.native import bound_object_hash_map
from spark_jobs.spark.native import enabled as native_enabled
from spark_jobs.spark.keys import group_index, identical_record_counts, number_copies, valid_id, with_record_key, with_salt
from spark_jobs.spark.sqlnames import qcol

#: The cap's keys use ``derive_salt(salt, CAP_SALT_TAG)``: an order of their own, independent of
#: the distribution batches' draws and of the group index.
CAP_SALT_TAG = "record-cap"

_MASK31 = (1 << LIMB_BITS) - 1


def summarize(
    df, unit_column: str, value_columns: list[str], salt_hex: str, m_min: int = 1, null_values=("NA", ""),
    keep_id: bool = False, max_records_per_person: int | None = None, label_columns: list[str] | None = None,
):
    """Group records by person into person summaries (one Spark aggregation).

    Parameters
    ----------
    df : pyspark DataFrame
        The records; validated by :func:`spark_jobs.spark.io.validate_schema`.
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
        their own tag (BHS23's keyed order, :mod:`spark_jobs.spark.vectors`). Never written out.
    max_records_per_person : int, optional
        Record cap R in ``[m_min, MAX_RECORDS_LIMIT]`` (:data:`dplib.summary.MAX_RECORDS_LIMIT`; module
        docstring); None (default) keeps all.
    label_columns : list of str, optional
        Columns whose JSON names a record for the cap's keys (default ``value_columns``). The job
        passes every value column of the run, so all statistics of a run keep the same records.

    Raises
    ------
    InvalidParameterError
        Bad salt, no value column, bad ``max_records_per_person`` or ``label_columns``.

    Returns
    -------
    DataFrame with columns ``_group``, ``<col>``, ``_m_<col>`` (and ``_pid``) (lazy; cache it).
    """
    if not is_salt(salt_hex):
        raise InvalidParameterError("salt must be 64 lowercase hex characters")
    if not value_columns:
        raise InvalidParameterError("value_columns must name at least one column")
    cap = check_record_cap(max_records_per_person)
    if cap is not None and cap < m_min:
        raise InvalidParameterError(f"max_records_per_person ({cap}) is below m_min ({m_min}): no person could keep m_min records")
    labels = list(value_columns) if label_columns is None else list(label_columns)
    if cap is not None and not set(value_columns) <= set(labels):
        raise InvalidParameterError("label_columns must include every value column")
    uid = qcol(unit_column)
    if cap is not None:
        # invalid ids dropped first: their records never reach the keyed draw
        records = df.where(valid_id(uid, null_values))
        per_person = _capped_values(records, uid, value_columns, labels, derive_salt(salt_hex, CAP_SALT_TAG), cap)
        return _finish(per_person, value_columns, salt_hex, m_min, keep_id)
    # Records without a valid id are grouped like any id and their group is dropped after the
    # aggregation: the same persons as dropping the records first (validity is a function of the
    # grouping key), with the string test (trim + compare) run once per group, not per record.
    names = [f"_u{i}" for i in range(len(value_columns))]
    native = native_enabled(df.sparkSession)
    # the native aggregate applies the value rules itself (NaN/inf dropped, clamp): it reads the
    # doubles as they are
    value = _as_double if native else _usable
    rows = df.select(uid.cast("string").alias("_pid"), *[value(c).alias(n) for c, n in zip(value_columns, names)])
    per_person = _person_sums(rows, value_columns, names, native)
    # (Spark pushes a filter on a grouping key below the aggregation; tying the test to an
    # aggregate output keeps it above: every group has a count >= 0.)
    kept = F.when(qcol(f"_m_{value_columns[0]}") >= 0, valid_id(F.col("_pid"), null_values)).otherwise(F.lit(False))
    return _finish(per_person.where(kept), value_columns, salt_hex, m_min, keep_id)


def _as_double(c):
    """A value column as a double (CSV strings: a non-number becomes null, dropped)."""
    return qcol(c).try_cast("double")


def _usable(c):
    """A value column as the summary uses it: double, non-finite -> null, clamped to
    ``[-CLAMP, CLAMP]``."""
    return _usable_of(qcol(c))


def _usable_of(col):
    """:func:`_usable` of a column expression."""
    v = col.try_cast("double")
    # Spark's least/greatest skip nulls (greatest(null, x) = x): test for null first.
    bad = v.isNull() | F.isnan(v) | (F.abs(v) == F.lit(float("inf")))
    return F.when(bad, F.lit(None).cast("double")).otherwise(F.least(F.greatest(v, F.lit(-CLAMP)), F.lit(CLAMP)))


def _person_sums(rows, value_columns, names, native: bool):
    """``(_pid, <names>: doubles)`` -> ``(_pid, _m_<col>, _t_<col>)``: per person the count of
    usable values and their exact total (:mod:`dplib.summary`), in one aggregation by ``_pid``.

    ``native``: the jar's ``person_dp_exact_sum``, one per column (:mod:`spark_jobs.spark.native`;
    it applies the value rules of :func:`_usable` itself); else the pure SQL path (:func:`_limb_sums` over
    :func:`_usable` values, then :func:`_total_from_limbs`). The two agree bit for bit."""
    if native:
        # one aggregate per column: Spark generates (and splits) each one's update code
        per = rows.groupBy("_pid").agg(*[F.expr(f"person_dp_exact_sum({n})").alias(f"_x{i}") for i, n in enumerate(names)])
        cols = []
        for i, c in enumerate(value_columns):
            cols += [F.col(f"_x{i}").getField("m").alias(f"_m_{c}"), F.col(f"_x{i}").getField("total").alias(f"_t_{c}")]
        return per.select("_pid", *cols)
    return _total_from_limbs(_limb_sums(rows, value_columns, names), value_columns)


def _total_from_limbs(per_person, value_columns):
    """``(_pid, _m_<col>, _s<i>_<col>)`` -> ``(_pid, _m_<col>, _t_<col>)``: the limb sums carried
    into the canonical base-2**31 digits and added high digit first
    (:func:`dplib.summary.total_from_limb_sums`). One select per carry step: Spark does not
    inline a non-trivial column into two uses, so each step is computed once."""
    df = per_person
    for c in value_columns:
        df = df.withColumn(f"_c_{c}", F.lit(0).cast("long"))
    for i in range(LIMBS):
        steps = []
        for c in value_columns:
            t = qcol(f"_s{i}_{c}") + qcol(f"_c_{c}")  # |t| < 2**63 below 2**32 records (docstring)
            steps += [t.bitwiseAND(F.lit(_MASK31)).alias(f"_e{i}_{c}"), F.shiftright(t, LIMB_BITS).alias(f"_c_{c}")]
        keep = [x for x in df.columns if not x.startswith("_c_") and not (x.startswith(f"_s{i}_"))]
        df = df.select(*[qcol(x) for x in keep], *steps)
    totals = []
    for c in value_columns:
        digits = [qcol(f"_e{i}_{c}") for i in range(LIMBS)] + [qcol(f"_c_{c}")]
        total = F.lit(0.0)
        for i in range(LIMBS, -1, -1):  # high digit first, as dplib.summary.total_from_limb_sums
            total = total + digits[i].cast("double") * F.lit(math.ldexp(1.0, LIMB_BITS * i - SHIFT))
        totals.append(total.alias(f"_t_{c}"))
    return df.select("_pid", *[qcol(f"_m_{c}") for c in value_columns], *totals)


def _limb_sums(rows, value_columns, names):
    """``(_pid, <names>: usable doubles)`` -> ``(_pid, _m_<col>, _s<i>_<col>)``: per person the
    count of usable values and the ``LIMBS`` exact limb sums of :mod:`dplib.summary`, in one
    aggregation by ``_pid`` (native expressions; map-side partial aggregation).

    Limb ``i`` of a value ``u`` is ``sign(u) * (floor(|u| 2**(SHIFT - 31 i)) mod 2**31)``, computed
    in double arithmetic that is exact here: with ``y = u 2**(SHIFT - 31 i)`` (a power-of-two
    scaling: exact for ``|y| >= 2**-1022``, ``|u| <= CLAMP`` keeps it finite; a subnormal ``y``
    may round, but ``|y| < 1`` has limb 0 and rounding among subnormals never reaches 1),
    clamped to ``+-2**84`` (where the limb is 0 anyway: ``ulp(y) >= 2**32``),
    ``k = trunc(y 2**-31)`` fits a long (``|k| <= 2**53``), ``y - k 2**31`` is exact (both are
    multiples of ``ulp(y)`` and the difference is below ``2**31``) and its truncation toward zero
    is the signed limb. No ``log2``/``pow``/shifts, no branches: it stays generated code."""
    two84, down, up = repr(math.ldexp(1.0, 84)), repr(math.ldexp(1.0, -LIMB_BITS)), repr(math.ldexp(1.0, LIMB_BITS))
    aggs = []
    for c, n in zip(value_columns, names):
        aggs.append(F.count(n).alias(f"_m_{c}"))
        for i in range(LIMBS):
            y = f"least(greatest({n} * {math.ldexp(1.0, SHIFT - LIMB_BITS * i)!r}D, -{two84}D), {two84}D)"
            limb = f"cast({y} - cast(cast({y} * {down}D as bigint) as double) * {up}D as bigint)"
            aggs.append(F.sum(F.expr(limb)).alias(f"_s{i}_{c}"))
    return rows.groupBy("_pid").agg(*aggs)


def _capped_values(records, uid, value_columns, label_columns, salt_hex, cap):
    """:func:`_person_sums` over each person's at most ``cap`` records with the smallest keys
    (module docstring). One shuffle by person; the count of identical records, the bounded
    bottom-k (the jar's ``person_dp_bottom_k``, else ``min_by`` over numbered copies) and the
    sums run inside it."""
    names = [f"_v{i}" for i in range(len(value_columns))]
    # Identical records (same label) are counted inside the person's partition and named once
    # per group (keys.identical_record_counts). The values read (value columns) are label
    # columns, so copies hold the same values.
    dtypes = {f.name: f.dataType for f in records.schema.fields}
    raw = {c: f"_l{i}" for i, c in enumerate(label_columns)}
    rows = records.select(uid.cast("string").alias("_pid"), *[qcol(c).alias(raw[c]) for c in label_columns]).repartition("_pid")
    counted = identical_record_counts(rows, label_columns, dtypes)
    counted = counted.select(
        "_pid", "_label",
        F.struct(*[_usable_of(F.col(raw[c])).alias(n) for c, n in zip(value_columns, names)]).alias("_rec"),
        "_cnt",
    )
    native = native_enabled(records.sparkSession)
    if native:
        # the jar's bounded bottom-k: the same key per copy inside a per-person aggregate
        bound_object_hash_map(records.sparkSession, cap)
        per = with_salt(counted, salt_hex).groupBy("_pid").agg(
            F.expr(f"person_dp_bottom_k(_salt, _pid, _label, _cnt, _rec, {int(cap)})").alias("_kept"))
    else:
        numbered = number_copies(counted, ["_pid", "_label", "_rec"])
        keyed = with_record_key(numbered, salt_hex, keep=("_rec",))
        order = F.struct(F.substring("_key", 1, 2 * KEY_HEX_DIGITS).alias("key"), F.col("_rec").alias("rec"))
        per = keyed.groupBy("_pid").agg(F.min_by("_rec", order, cap).alias("_kept"))
    # the kept records, one row each, summed like uncapped records (the rows are already
    # partitioned by person: no second shuffle)
    kept = per.select("_pid", F.explode("_kept").alias("_r")).select("_pid", *[F.col("_r").getField(n).alias(n) for n in names])
    return _person_sums(kept, value_columns, names, native)


def _finish(per_person, value_columns, salt_hex, m_min, keep_id):
    """``(_pid, _m_<col>, _t_<col>)`` (:func:`_person_sums`) -> the summary columns."""
    means = [F.when(qcol(f"_m_{c}") > 0, qcol(f"_t_{c}") / qcol(f"_m_{c}")).alias(f"_avg_{c}") for c in value_columns]
    per_person = per_person.select("_pid", *[qcol(f"_m_{c}") for c in value_columns], *means)
    per_person = with_salt(per_person, salt_hex)  # the salt as data, never a literal (keys.py)
    cols = [group_index().alias("_group")] + ([F.col("_pid")] if keep_id else [])
    for c in value_columns:
        cols.append(F.when(qcol(f"_m_{c}") >= m_min, qcol(f"_avg_{c}")).alias(c))
        cols.append(qcol(f"_m_{c}"))
    return per_person.select(*cols)
