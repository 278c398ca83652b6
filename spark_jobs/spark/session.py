"""SparkSession with Delta Lake.

- Run by ``spark-submit``: the master, the Delta jars and the settings it was given win
  (``--master``, ``--jars`` / ``--packages``, ``--conf`` over the config's ``spark.conf``); we
  only add the Delta SQL extension and catalog and the defaults below where ``--conf`` set
  nothing. The Delta jars must come with spark-submit (``--jars $(person-dp spark-jars)`` from
  the local Maven repository, or ``--packages``): jars added after the driver JVM started would
  not reach the driver.
- Run locally (``person-dp run``, tests): master from the config (default ``local[2]``), and the
  Delta jars from the local Maven repository, as listed by ``make jars`` in
  ``build/delta-classpath.txt`` (see ``conf/delta-jars.pom.xml``). Jars that pyspark already
  ships are left out. Without that file we fall back to ``spark.jars.packages`` (Ivy resolves
  the Delta artifact from Maven Central at session start).
"""

from __future__ import annotations

import glob
import logging
import os
import re
import sys
from pathlib import Path

import pyspark
from pyspark import SparkConf, SparkContext
from pyspark.find_spark_home import _find_spark_home
from pyspark.sql import SparkSession

from dplib.errors import ConfigError
from spark_jobs.spark.native import native_jar
from spark_jobs.spark.native import wanted as native_wanted

log = logging.getLogger("person_dp.session")

DELTA_PACKAGE = "io.delta:delta-spark_4.2_2.13:4.4.0"
CLASSPATH_ENV = "PERSON_DP_DELTA_CLASSPATH"
_VERSION_SUFFIX = re.compile(r"-[0-9][^/]*\.jar$")

DEFAULT_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "8",
    "spark.databricks.delta.snapshotPartitions": "2",
    "spark.sql.session.timeZone": "UTC",
    # Object-buffer aggregates (the native per-person bottom-k, spark_jobs/spark/native.py) keep a
    # hash map of persons per task up to this many keys before falling back to sort-based
    # aggregation (Spark's default 128 makes every pass over more persons sort its input rows;
    # 100,000 persons of an m = 10 heap hold ~60 MB).
    "spark.sql.objectHashAggregate.sortBased.fallbackThreshold": "100000",
    # Secure by default (SECURITY.md): Spark's web UI and its REST API show each stage's exact
    # "number of output rows" (records, persons, group sizes) to anyone who reaches the port, and
    # an event log writes the same to disk. Off unless the operator turns them on knowingly.
    "spark.ui.enabled": "false",
    "spark.eventLog.enabled": "false",
}

#: Settings that expose exact row counts when on, and what each reveals (logged as a warning).
REVEALING = {
    "spark.ui.enabled": "the Spark UI and its REST API show exact row counts of every stage (records, persons, group sizes)",
    "spark.eventLog.enabled": "the event log writes exact row counts of every stage to disk",
}


def revealing_settings(effective) -> list[str]:
    """Warnings for settings of ``effective`` (a mapping or SparkConf-like ``get``) that expose
    exact counts; empty when the secure defaults hold."""
    out = []
    for key, what in REVEALING.items():
        value = effective.get(key, "false" if key == "spark.eventLog.enabled" else "true")
        if str(value).strip().lower() == "true":
            out.append(f"{key}=true: {what}; turn it off unless everyone who can see it may see exact counts")
    return out


#: HotSpot does not JIT-compile a method above 8,000 bytes of bytecode (``DontCompileHugeMethods``).
#: The summarize pass at d = 8 generates an 11 KB per-person output method (72 limb sums and the
#: means), which then runs interpreted: with one record per person (10^7 persons) the pass took
#: 96 s in `make bench-scale` and 30 s with this flag (benchmarks/README.md, "Scale", re-check
#: table). Added to the executors'
#: (and in local mode the driver's, which runs the tasks) JVM options unless the user's options
#: already mention ``DontCompileHugeMethods``.
JIT_OPTION = "-XX:-DontCompileHugeMethods"


def spark_defaults_file() -> Path | None:
    """The ``spark-defaults.conf`` a locally launched JVM reads (``$SPARK_CONF_DIR``, else the
    Spark home's ``conf/``), or None."""
    conf_dir = os.environ.get("SPARK_CONF_DIR")
    if not conf_dir:
        try:
            conf_dir = os.path.join(_find_spark_home(), "conf")
        except Exception:  # no Spark home found: there is no defaults file either
            return None
    path = Path(conf_dir) / "spark-defaults.conf"
    return path if path.is_file() else None


def _defaults_keys(path: Path | None) -> set[str]:
    """Keys set in a ``spark-defaults.conf`` (``key value`` or ``key=value`` lines)."""
    if path is None:
        return set()
    keys = set()
    for line in path.read_text(errors="replace").splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keys.add(re.split(r"[\s=:]", line, maxsplit=1)[0])
    return keys


def with_jit_option(settings: dict[str, str], preset, submitted: bool, defaults_keys: set[str] = frozenset()) -> dict[str, str]:
    """``settings`` plus :data:`JIT_OPTION` appended to ``spark.executor.extraJavaOptions`` (and,
    when not under spark-submit, ``spark.driver.extraJavaOptions``: spark-submit's driver JVM is
    already running). The existing value (``settings``, else spark-submit's ``preset``) is kept in
    front. Left alone: a key whose value, or whose ``defaultJavaOptions`` counterpart, already names
    ``DontCompileHugeMethods`` (either sign), and a key set in ``spark-defaults.conf``
    (``defaults_keys``) when launching locally, where a ``--conf`` would replace that file's value
    rather than extend it (a warning says so)."""
    out = dict(settings)
    keys = ["spark.executor.extraJavaOptions"] + ([] if submitted else ["spark.driver.extraJavaOptions"])
    for key in keys:
        default_key = key.replace("extraJavaOptions", "defaultJavaOptions")
        named = [out.get(k) if k in out else (preset.get(k, "") if preset.contains(k) else "") for k in (key, default_key)]
        if any("DontCompileHugeMethods" in (v or "") for v in named):
            continue
        if key not in out and not preset.contains(key) and key in defaults_keys:
            log.warning("%s is set in spark-defaults.conf; not adding %s to it (add it there for the "
                        "JIT to compile the summarize pass's wide methods)", key, JIT_OPTION)
            continue
        out[key] = f"{named[0] or ''} {JIT_OPTION}".strip()
    return out


def _artifact(path: str) -> str:
    return _VERSION_SUFFIX.sub("", os.path.basename(path))


def delta_classpath_file() -> Path | None:
    """The classpath file written by ``make jars``: ``$PERSON_DP_DELTA_CLASSPATH``, else
    ``build/delta-classpath.txt`` under the working directory or the source checkout."""
    env = os.environ.get(CLASSPATH_ENV)
    candidates = [Path(env)] if env else []
    candidates.append(Path.cwd() / "build" / "delta-classpath.txt")
    candidates.append(Path(__file__).resolve().parent.parent / "build" / "delta-classpath.txt")
    for c in candidates:
        if c.is_file():
            return c
    return None


def delta_jars() -> list[str]:
    """Local Delta jars to put on ``spark.jars`` (those pyspark lacks), or [] if not fetched."""
    cp_file = delta_classpath_file()
    if cp_file is None:
        return []
    shipped = {_artifact(p) for p in glob.glob(os.path.join(os.path.dirname(pyspark.__file__), "jars", "*.jar"))}
    jars = [p for p in cp_file.read_text().strip().split(os.pathsep) if p]
    missing = [p for p in jars if not os.path.isfile(p)]
    if missing:
        log.warning("delta classpath lists %d missing jar(s); run `make jars` again", len(missing))
        return []
    return [p for p in jars if _artifact(p) not in shipped]


def under_spark_submit() -> bool:
    """True when this Python process was started by spark-submit (which passes its JVM's
    gateway port), False for ``person-dp run``, tests and notebooks."""
    return bool(os.environ.get("PYSPARK_GATEWAY_PORT"))


def build_session(
    master: str = "local[2]", app_name: str = "person-dp", conf: dict[str, str] | None = None, log_level: str = "ERROR"
):
    """Get or create the SparkSession with Delta Lake configured.

    Parameters
    ----------
    master : str
        Used only if no master was set by spark-submit or ``spark-defaults.conf``.
    app_name : str
    conf : dict, optional
        Extra Spark settings (override the defaults here).
    log_level : str
        Spark's log level after start-up.

    Returns
    -------
    pyspark.sql.SparkSession
    """
    existing = SparkSession.getActiveSession()
    if existing is not None:
        return existing
    submitted = under_spark_submit()
    if submitted:
        # Connect to spark-submit's JVM first (launches nothing): only then does SparkConf() see
        # its --master, --jars / --packages and --conf (before, it is an empty Python dict).
        SparkContext._ensure_initialized()
    preset = SparkConf()  # under spark-submit this holds --master, --packages, --conf ...
    builder = SparkSession.builder.appName(app_name)
    if not preset.contains("spark.master"):
        builder = builder.master(master)
    settings = dict(DEFAULT_CONF)
    settings.update(conf or {})
    if submitted:
        # spark-submit's --conf wins over the defaults here and the config's spark.conf
        settings = {k: v for k, v in settings.items() if not preset.contains(k)}
    has_delta = any(
        "delta" in preset.get(k, "") for k in ("spark.jars.packages", "spark.jars")
    ) or any("delta" in v for k, v in settings.items() if k in ("spark.jars.packages", "spark.jars"))
    if not has_delta and submitted:
        # jars added now would reach the executors but not the driver JVM spark-submit started
        raise ConfigError(
            "spark-submit was given no Delta Lake jars: pass them with --jars (the local Maven "
            "repository, `person-dp spark-jars`) or --packages " + DELTA_PACKAGE
        )
    if not has_delta:
        jars = delta_jars()
        if jars:
            settings["spark.jars"] = ",".join(jars)
        else:
            log.warning(
                "Delta jars not found locally (run `make jars`); asking Spark to resolve %s",
                DELTA_PACKAGE,
            )
            settings["spark.jars.packages"] = DELTA_PACKAGE
    if not submitted:
        # Python workers run the interpreter of PYSPARK_PYTHON (default: whatever `python3` is on
        # PATH, which may lack numpy/pyarrow); default it to this process's interpreter, the
        # project's environment. spark-submit's own settings are left alone.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if not submitted:
        # the native aggregates (spark_jobs/spark/native.py): on the driver's and executors'
        # classpath when built; under spark-submit they come with --jars (person-dp spark-jars)
        jar = native_jar()
        if jar is not None and native_wanted():
            settings["spark.jars"] = ",".join([j for j in settings.get("spark.jars", "").split(",") if j] + [str(jar)])
    settings = with_jit_option(settings, preset, submitted, set() if submitted else _defaults_keys(spark_defaults_file()))
    for k, v in settings.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    for warning in revealing_settings(spark.sparkContext.getConf()):
        log.warning(warning)
    return spark
