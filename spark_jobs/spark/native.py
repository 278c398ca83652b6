"""person-dp's native Spark aggregates: the jar, its registration, the switch.

The jar (``spark_jobs/jvm/lib/person-dp-native.jar``, built from ``spark_jobs/jvm/`` by
``make native``, which ``make demo`` and ``make test`` run; shipped inside the package) holds
Catalyst aggregates for the per-person passes:

- ``person_dp_exact_sum(x)``: per group, ``struct<m: bigint, total: double>``, the number of
  finite values of ``x`` and their exact fixed-point sum (:mod:`dplib.summary`), kept in five
  base-2**61 slots in carry-save form (no overflow short of ~10^17 records of one person). A
  declarative aggregate: Spark compiles its update into the aggregation's generated code (the
  first form, an imperative aggregate over all columns, ran outside it: ~1.4x slower at
  d = 1). Same result bit for bit as the SQL path's eight limb sums and the numpy twin (tested).
- ``person_dp_bottom_k(salt, pid, label, cnt, value, k)``: per person, the values of the ``k``
  records with the smallest keyed hashes ``SHA-256(salt || pid || 0x1f || label || ":" || j)``
  over each row's ``cnt`` identical copies ``j`` (the keyed-hash order of
  :mod:`dplib.distribution.batches`): the same choice as ``min_by`` over numbered copies,
  without a row per copy or a sort. Used by the batches and by record capping.

When the jar is absent (a checkout without Maven, a cluster without ``--jars``), or the running
Spark cannot load it, the jobs use the pure Spark SQL path: same results, slower. Set
``PERSON_DP_NATIVE=0`` to force the SQL path (benchmarks, tests of the fallback).

The session builder (:mod:`spark_jobs.spark.session`) puts the jar on ``spark.jars``; under
spark-submit pass it with ``--jars`` (``person-dp spark-jars`` lists it with the Delta jars).
Functions are registered per session (:func:`enabled`, on first use).
"""

from __future__ import annotations

import logging
import os
import weakref
from pathlib import Path

log = logging.getLogger("person_dp.native")

#: Interface version the Python side expects (``Functions.VERSION`` in the jar).
JAR_VERSION = 4
#: The Spark version the jar is compiled against (``Functions.SPARK_VERSION``; the pom's
#: ``spark.version``): the aggregates use Spark-internal interfaces, so another Spark version
#: runs the SQL path.
JAR_NAME = "person-dp-native.jar"
ENV_SWITCH = "PERSON_DP_NATIVE"

# per SparkSession (a new session has its own function registry): registered, or not loadable
_registered: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def native_jar() -> Path | None:
    """The built jar inside the package, or None when it was not built."""
    p = Path(__file__).resolve().parent.parent / "jvm" / "lib" / JAR_NAME
    return p if p.is_file() else None


def wanted() -> bool:
    """False when ``PERSON_DP_NATIVE=0`` (or ``false``/``off``/``no``) asks for the SQL path."""
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "false", "off", "no")


def enabled(spark) -> bool:
    """True when the native aggregates can be used in ``spark``'s session (registering them on
    first call per session). False, with one warning per session, when the jar is not on the
    JVM's classpath or is of another interface version; False without a warning when
    :func:`wanted` says no."""
    if not wanted():
        return False
    known = _registered.get(spark)
    if known is not None:
        return known
    ok = False
    try:
        fns = spark._jvm.org.apache.spark.sql.persondp.Functions
        version = int(fns.VERSION())
        built_for, running = str(fns.SPARK_VERSION()), str(spark.version)
        if version != JAR_VERSION:
            log.warning("native jar of interface version %s (expected %s): using the Spark SQL path; run `make native`",
                        version, JAR_VERSION)
        elif built_for != running:
            log.warning("native jar built for Spark %s, running Spark %s: using the Spark SQL path", built_for, running)
        else:
            fns.register(spark._jsparkSession)
            ok = True
            log.info("per-person passes: native aggregates (%s)", JAR_NAME)
    except Exception as exc:  # noqa: BLE001 - any failure to load means: use the SQL path
        # a class missing from the JVM reads as a py4j JavaPackage, which is not callable (TypeError)
        why = ("its jar is not on this Spark session's classpath" if isinstance(exc, TypeError)
               else f"loading it failed: {type(exc).__name__}")
        where = "not built here: run `make native`" if native_jar() is None else f"built at {native_jar()}"
        log.warning("native aggregates not used (%s): the Spark SQL path runs instead (same results, slower). The jar "
                    "is %s; a session made by person-dp adds it itself, one of your own needs spark.jars (or "
                    "spark-submit --jars; `person-dp spark-jars` lists it)", why, where)
    _registered[spark] = ok
    return ok


#: The SQL names of the jar's functions.
FUNCTIONS = ("person_dp_exact_sum", "person_dp_bottom_k")


def plan_uses_native(df) -> bool:
    """True when ``df``'s physical plan runs one of the jar's aggregates (tests, diagnostics)."""
    plan = df._jdf.queryExecution().executedPlan().toString()
    return any(f in plan for f in FUNCTIONS)


#: Spark's setting: persons per task an object-buffer aggregate keeps in its hash map before it
#: falls back to sort-based aggregation (spark_jobs/spark/session.py sets 100,000).
OBJECT_HASH_THRESHOLD = "spark.sql.objectHashAggregate.sortBased.fallbackThreshold"
#: Heap entries per task the bottom-k's hash map may hold (Spark does not account for them).
MAX_HEAP_ENTRIES = 4_000_000


def bound_object_hash_map(spark, k: int) -> None:
    """Lower (never raise) the session's :data:`OBJECT_HASH_THRESHOLD` so that a task's per-person
    heaps of ``k`` entries hold at most :data:`MAX_HEAP_ENTRIES` entries (at least 128 persons,
    Spark's default); beyond it Spark sorts the task's remaining rows (slower, bounded memory)."""
    try:
        current = int(spark.conf.get(OBJECT_HASH_THRESHOLD, "128"))
    except ValueError:
        current = 128
    bound = max(128, MAX_HEAP_ENTRIES // max(1, int(k)))
    if bound < current:
        spark.conf.set(OBJECT_HASH_THRESHOLD, str(bound))


#: Spark types whose grouping equates exactly the values with equal JSON (``to_json``): a label
#: may then be formatted once per group of equal values instead of once per record.
_JSON_GROUPABLE = {
    "ByteType", "ShortType", "IntegerType", "LongType", "BooleanType", "DateType", "TimestampType",
    "TimestampNTZType", "DecimalType",
}


def groups_like_json(data_type) -> bool:
    """True when grouping by a column of ``data_type`` puts two values in one group exactly when
    their JSON is equal: integers, booleans, dates, timestamps, decimals and strings of the
    default (binary) collation; not floats (grouping normalises -0.0 and NaN), collated strings,
    structs, arrays or maps."""
    name = type(data_type).__name__
    if name == "StringType":
        return getattr(data_type, "collation", "UTF8_BINARY") in ("UTF8_BINARY", None)
    return name in _JSON_GROUPABLE
