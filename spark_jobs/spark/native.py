"""person-dp's native Spark aggregates: the jar, its registration, the switch.

The jar (``spark_jobs/jvm/lib/person-dp-native.jar``, built from ``spark_jobs/jvm/`` by
``make native``, which ``make demo`` and ``make test`` run; shipped inside the package) holds
Catalyst aggregates for the per-person passes:

- ``person_dp_exact_sum(x)``: per group, ``struct<m: bigint, total: double>``, the number of
  finite values and their exact fixed-point sum (:mod:`dplib.summary`), updating two of five
  carry-normalised digits per value instead of the eight limb sums of the pure SQL path. Same
  result bit for bit (tested against the SQL path and the numpy twin).

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
JAR_VERSION = 2
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
        if version != JAR_VERSION:
            log.warning("native jar of interface version %s (expected %s): using the Spark SQL path; run `make native`",
                        version, JAR_VERSION)
        else:
            fns.register(spark._jsparkSession)
            ok = True
            log.info("per-person passes: native aggregates (%s)", JAR_NAME)
    except Exception as exc:  # noqa: BLE001 - any failure to load means: use the SQL path
        log.warning("native aggregates not available (%s): using the Spark SQL path (same results, slower); "
                    "build them with `make native` and pass the jar to spark-submit with --jars",
                    type(exc).__name__)
    _registered[spark] = ok
    return ok


#: The SQL names of the jar's functions.
FUNCTIONS = ("person_dp_exact_sums", "person_dp_exact_sum", "person_dp_bottom_k")


def plan_uses_native(df) -> bool:
    """True when ``df``'s physical plan runs one of the jar's aggregates (tests, diagnostics)."""
    plan = df._jdf.queryExecution().executedPlan().toString()
    return any(f in plan for f in FUNCTIONS)
