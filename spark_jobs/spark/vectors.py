"""The Spark backend of :mod:`dplib.covariance` (BHS23) and the person-level selection of n0 rows.

:class:`SparkPersonVectors` holds one summary vector per person (the person's mean of the d
columns, :func:`person_vectors`). It answers the person count (for the DP lower bound n0,
:mod:`dplib.fixed_n`) and builds a :class:`SparkCovarianceBackend` over exactly n0 rows:

1. every person gets the key ``SHA-256(salt || ":bhs23-order:" || "p:" || id)[:16 hex]`` and
   every public dummy ``j`` the key of ``"d:" || j`` (:data:`dplib.covariance.person.DUMMY_PREFIX`);
2. persons and ``max(0, n0 - n)`` dummies are sorted by (key, vector) once, and the first n0
   rows are kept: the selection by keyed-hash rank and BHS23's random order of the rows are
   the same sort (the argument is in :mod:`dplib.covariance.person`);
3. global positions come from per-partition counts of the sorted, cached table; rows are joined
   into **pair rows** ``(x_{2i}, x_{2i+1})`` (BHS23's Pair), plus the leftover row when n0 is odd,
   and cached once (``persist`` + ``count``). Everything is a deterministic function of
   (salt, ids, vectors): a recomputed partition or a task retry reproduces the same order, pairs
   and reference set; nothing is drawn with ``rand()``.

Each backend call is one pass over the cached pair rows with ``mapInArrow`` and numpy per Arrow
batch (no per-row Python UDF). Partitions return mergeable partial results
(:mod:`dplib.covariance.backend`: exact superaccumulator sums, bucket counts, per-partition
top-T heaps) combined with ``treeReduce``; the arithmetic is that of the numpy twin
(:mod:`dplib.covariance.kernels`), so subsets, weights, scores, mu_hat and Sigma_hat are
*identical* to :class:`dplib.covariance.NumpyCovarianceBackend` on the same rows and salt.

Driver memory: O(#buckets d^2 + T d) per scan, O(k d) per core scan, M d for the reference
rows: never O(n d). The only per-person rows collected are the ``top_t`` rows of a scan and the
M reference rows. The number of passes (``passes``) depends on the data: it is logged at DEBUG
level only and never released (docs/privacy/stable_covariance.md).
"""

from __future__ import annotations

import logging
import math
import pickle

import numpy as np
import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql import functions as F

from dplib.covariance.backend import (
    CORE_BATCH,
    VALUE_BOUND,
    CorePartial,
    CoreScan,
    ExactSum,
    ScanResult,
    core_block,
    finish_core,
    finish_scan,
    merge_core,
    merge_scan,
    scan_block,
)
from dplib.covariance.kernels import gram_from_sum, gram_terms, whiten_rows
from dplib.covariance.order import ORDER_HEX_CHARS, ORDER_TAG, reference_positions
from dplib.covariance.person import DUMMY_PREFIX, PERSON_PREFIX, check_dummy
from dplib.errors import InputDataError, InvalidParameterError
from dplib.groups import is_salt
from spark_jobs.spark.sqlnames import qcol
from spark_jobs.spark.summarize import summarize

log = logging.getLogger("person_dp.covariance")

_SQRT2 = math.sqrt(2.0)


def person_vectors(
    records, unit_column: str, columns: list[str], salt_hex: str, m_min: int = 1, null_values=("NA", ""),
    max_records_per_person: int | None = None, label_columns: list[str] | None = None,
):
    """One row per person: ``_pid`` (string) and the person's mean of each column (float64).

    The means are those of :func:`spark_jobs.spark.summarize.summarize` (records with non-finite
    values dropped per column, sorted-order sums); persons without ``m_min`` usable records of
    *every* column are left out (a per-person rule, applied before anything is counted).
    ``max_records_per_person``, ``label_columns``: the summary's record cap (None: all records)
    and the columns naming a record for it (:func:`spark_jobs.spark.summarize.summarize`).
    Means are clamped to ``[-VALUE_BOUND, VALUE_BOUND]`` (1e100) as the numpy backend does.
    """
    summ = summarize(records, unit_column, columns, salt_hex, m_min, null_values, keep_id=True,
                     max_records_per_person=max_records_per_person, label_columns=label_columns)
    return vectors_from_summary(summ, columns)


def vectors_from_summary(summary, columns: list[str]):
    """:func:`person_vectors` from a summary already computed (and cached) by the job.

    ``summary``: a :func:`spark_jobs.spark.summarize.summarize` DataFrame made with ``keep_id=True``
    over a superset of ``columns`` (each column's mean is a function of that column's records
    and the record draw, so summarizing more columns at once gives the same means). One row per
    person with every one of ``columns`` non-null (``m_min`` usable records), means clamped to
    ``[-VALUE_BOUND, VALUE_BOUND]``.

    Raises
    ------
    InvalidParameterError
        The summary lacks ``_pid`` (made without ``keep_id``) or one of the columns.
    """
    missing = [c for c in ["_pid", *columns] if c not in summary.columns]
    if missing:
        raise InvalidParameterError(f"the summary lacks column(s) {missing} (summarize with keep_id=True over them)")
    cond = None
    for c in columns:
        ok = qcol(c).isNotNull()
        cond = ok if cond is None else cond & ok
    clamp = [F.least(F.greatest(qcol(c), F.lit(-VALUE_BOUND)), F.lit(VALUE_BOUND)).alias(c) for c in columns]
    return summary.where(cond).select("_pid", *clamp)


class SparkPersonVectors:
    """Person summary vectors on Spark: the count for n0 and the backend over n0 selected rows.

    Parameters
    ----------
    persons : DataFrame
        Columns ``_pid`` (string, one row per person) and the d value columns (finite doubles),
        e.g. from :func:`person_vectors`.
    columns : list of str
    salt_hex : str
        The run's secret salt (never logged or stored).
    """

    def __init__(self, persons, columns: list[str], salt_hex: str) -> None:
        if not is_salt(salt_hex):
            raise InvalidParameterError("salt must be 64 lowercase hex characters")
        missing = [c for c in ["_pid", *columns] if c not in persons.columns]
        if missing:
            raise InvalidParameterError(f"person vectors lack column(s) {missing}; they hold {persons.columns}")
        self._df = persons
        self._columns = list(columns)
        self._salt = salt_hex
        self.d = len(columns)

    def count(self) -> int:
        """Exact number of persons (never logged; only for the DP lower bound)."""
        return int(self._df.count())

    def backend(self, n0: int, dummy: np.ndarray, count: int) -> "SparkCovarianceBackend":
        """The n0 rows of smallest key (persons and ``max(0, n0 - count)`` dummies), in key order.

        ``count`` is the exact person count from :meth:`count` (used only to size the padding).
        """
        spark = self._df.sparkSession
        dummy = check_dummy(dummy, self.d)
        pad = max(0, int(n0) - int(count))
        salt_df = F.broadcast(spark.createDataFrame([(self._salt,)], "_salt string"))
        xs = [f"_x{j}" for j in range(self.d)]
        persons = self._df.select(
            F.concat(F.lit(PERSON_PREFIX), F.col("_pid")).alias("_key_src"),
            *[qcol(c).cast("double").alias(x) for c, x in zip(self._columns, xs)],
        )
        # the padding size comes from the exact count: it enters as broadcast data, never as a
        # literal (``spark.range(pad)`` would print it in query plans and the Spark UI); the
        # range itself has the public size n0
        pad_df = F.broadcast(spark.createDataFrame([(pad,)], "_pad long"))
        dummies = spark.range(int(n0)).crossJoin(pad_df).where(F.col("id") < F.col("_pad")).select(
            F.concat(F.lit(DUMMY_PREFIX), F.col("id").cast("string")).alias("_key_src"),
            *[F.lit(float(v)).alias(x) for v, x in zip(dummy, xs)],
        )
        rows = persons.unionByName(dummies).crossJoin(salt_df)
        key = F.substring(F.sha2(F.concat(F.col("_salt"), F.lit(ORDER_TAG), F.col("_key_src")), 256), 1, ORDER_HEX_CHARS)
        rows = rows.select(key.alias("_key"), *xs)
        ranked = _ranked(rows.orderBy("_key", *xs), xs)
        try:
            pairs = self._pairs(ranked, int(n0), xs)
        finally:
            ranked.unpersist()  # after the pairs are cached (or on failure: nothing stays cached)
        return SparkCovarianceBackend(pairs, int(n0), self.d, self._salt)

    def _pairs(self, ranked, n0: int, xs: list[str]):
        """The cached pair rows of the first ``n0`` ranked rows (unpersisted again on failure)."""
        kept = ranked.where(F.col("_pos") < n0)
        a = kept.where(F.col("_pos") % 2 == 0).select(
            (F.col("_pos") / 2).cast("long").alias("pair"), *[F.col(x).alias(f"a{j}") for j, x in enumerate(xs)]
        )
        b = kept.where(F.col("_pos") % 2 == 1).select(
            ((F.col("_pos") - 1) / 2).cast("long").alias("pair"), *[F.col(x).alias(f"b{j}") for j, x in enumerate(xs)]
        )
        pairs = a.join(b, "pair", "left").select(
            "pair", *[f"a{j}" for j in range(self.d)], *[F.coalesce(F.col(f"b{j}"), F.lit(0.0)).alias(f"b{j}") for j in range(self.d)]
        )
        pairs = pairs.persist()
        try:
            pairs.count()
        except BaseException:
            pairs.unpersist()
            raise
        return pairs


def _ranked(sorted_df, xs: list[str]):
    """``sorted_df`` (globally sorted) with ``_pos`` = its global rank, from per-partition counts
    of the cached sorted table (a small collect of one count per partition)."""
    cached = sorted_df.persist()
    try:
        return _with_positions(cached, xs)
    finally:
        cached.unpersist()  # after the result is cached (or on failure: nothing stays cached)


def _with_positions(cached, xs: list[str]):
    def count_rows(batches):
        pid = TaskContext.get().partitionId()
        total = sum(b.num_rows for b in batches)
        yield pa.RecordBatch.from_arrays([pa.array([pid], pa.int64()), pa.array([total], pa.int64())], ["p", "n"])

    sizes = {int(r["p"]): int(r["n"]) for r in cached.mapInArrow(count_rows, "p long, n long").collect()}
    offsets, acc = {}, 0
    for p in sorted(sizes):
        offsets[p] = acc
        acc += sizes[p]

    def add_pos(batches):
        pos = offsets[TaskContext.get().partitionId()]
        for b in batches:
            arr = pa.array(np.arange(pos, pos + b.num_rows, dtype=np.int64))
            pos += b.num_rows
            yield pa.RecordBatch.from_arrays([*b.columns, arr], [*b.schema.names, "_pos"])

    schema = ", ".join(["_key string", *[f"{x} double" for x in xs], "_pos long"])
    out = cached.mapInArrow(add_pos, schema).persist()
    try:
        out.count()
    except BaseException:
        out.unpersist()
        raise
    return out


def _arrays(batch, d: int):
    pair = batch.column(0).to_numpy()
    a = np.column_stack([batch.column(1 + j).to_numpy() for j in range(d)]) if batch.num_rows else np.zeros((0, d))
    b = np.column_stack([batch.column(1 + d + j).to_numpy() for j in range(d)]) if batch.num_rows else np.zeros((0, d))
    return pair, a.astype(np.float64, copy=False), b.astype(np.float64, copy=False)


def _state_batch(obj):
    return pa.RecordBatch.from_arrays([pa.array([pickle.dumps(obj)], pa.binary())], ["state"])


class SparkCovarianceBackend:
    """The :class:`dplib.covariance.backend.CovarianceBackend` protocol over cached pair rows.

    Parameters
    ----------
    pairs : DataFrame
        Columns ``pair`` (long), ``a0..a{d-1}``, ``b0..b{d-1}``: row ``pair = i`` holds the ordered
        rows at positions 2i and 2i+1; with odd n the last row (``pair = m``) has only ``a``.
        Cached by the caller.
    n : int
        Number of ordered rows (n0).
    d : int
    salt_hex : str
        The run's salt (reference positions).

    Attributes
    ----------
    n, m, d : int
    passes : int
        Data passes so far (debug metric only: data-dependent, never released or logged above DEBUG).
    """

    def __init__(self, pairs, n: int, d: int, salt_hex: str) -> None:
        self._pairs = pairs
        self.n, self.d = int(n), int(d)
        self.m = self.n // 2
        self._salt = salt_hex
        self.passes = 0

    def close(self) -> None:
        """Drop the cached pair rows."""
        self._pairs.unpersist()

    def _reduce(self, fn, merge):
        """One pass: ``fn`` maps a partition's Arrow batches to one pickled partial; partials are
        merged with ``treeReduce``."""
        self.passes += 1
        log.debug("bhs23 spark pass %d", self.passes)
        rdd = self._pairs.mapInArrow(fn, "state binary").rdd.map(lambda r: pickle.loads(r[0]))
        return rdd.treeReduce(merge, depth=2)

    def _y_batches(self, exclude):
        d, m = self.d, self.m
        excl = np.asarray(exclude, dtype=np.int64)

        def rows(batches):
            for batch in batches:
                pair, a, b = _arrays(batch, d)
                keep = (pair < m) & ~np.isin(pair, excl)
                yield pair[keep], (a[keep] - b[keep]) / _SQRT2

        return rows

    def gram(self, exclude: np.ndarray) -> np.ndarray:
        d = self.d
        rows = self._y_batches(exclude)

        def fn(batches):
            acc = ExactSum(d * (d + 1) // 2)
            for _, y in rows(batches):
                acc.add(gram_terms(y))
            yield _state_batch(acc)

        return gram_from_sum(self._reduce(fn, lambda a, b: a.merge(b)), d)

    def mahalanobis_scan(self, factor, exclude, thresholds, top_t) -> ScanResult:
        d = self.d
        thr = np.asarray(thresholds, dtype=np.float64)
        L = np.asarray(factor, dtype=np.float64)
        t = int(top_t)
        rows = self._y_batches(exclude)

        def fn(batches):
            part = scan_block(L, np.zeros((0, d)), np.zeros(0, dtype=np.int64), thr, t)
            for pos, y in rows(batches):
                part = merge_scan(part, scan_block(L, y, pos, thr, t), t)
            yield _state_batch(part)

        return finish_scan(self._reduce(fn, lambda a, b: merge_scan(a, b, t)), d)

    def fetch_rows(self, positions: np.ndarray) -> np.ndarray:
        """The ordered rows at ``positions`` (at most M rows collected), in the given order."""
        pos = np.asarray(positions, dtype=np.int64)
        if pos.size and (pos.min() < 0 or pos.max() >= self.n):
            raise InputDataError("reference positions out of range")
        wanted = sorted({int(p) // 2 for p in pos})
        got = self._pairs.where(F.col("pair").isin(wanted)).collect()
        by_pair = {int(r["pair"]): r for r in got}
        out = np.empty((pos.size, self.d))
        for i, p in enumerate(pos):
            r = by_pair[int(p) // 2]
            side = "a" if p % 2 == 0 else "b"
            out[i] = [float(r[f"{side}{j}"]) for j in range(self.d)]
        return out

    def core_scan(self, factor, shift, ref_rows, Lambda, k) -> CoreScan:
        d, m, kk = self.d, self.m, int(k)
        L = np.asarray(factor, dtype=np.float64)
        s = np.asarray(shift, dtype=np.float64)
        lam = np.asarray(Lambda, dtype=np.float64)
        tr = whiten_rows(L, np.asarray(ref_rows, dtype=np.float64) - s)

        def fn(batches):
            part = CorePartial(np.zeros(2 * kk + 2, dtype=np.int64), {})
            for batch in batches:
                pair, a, b = _arrays(batch, d)
                x = np.concatenate([a, b[pair < m]])
                for start in range(0, x.shape[0], CORE_BATCH):
                    part = merge_core(part, core_block(L, s, tr, x[start : start + CORE_BATCH], lam, kk))
            yield _state_batch(part)

        return finish_core(self._reduce(fn, merge_core), kk, d)

    def reference_positions(self, M: int) -> np.ndarray:
        return reference_positions(self.n, M, self._salt)
