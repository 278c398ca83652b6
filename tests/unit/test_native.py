"""The native aggregates' Python side without Spark: version pins, the JSON-grouping allow-list,
the object-hash-map bound."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from spark_jobs.spark import native

ROOT = Path(__file__).resolve().parents[2]


def test_versions_agree():
    """The pom's spark.version, the jar's SPARK_VERSION and pyspark's pin are one version; the
    jar's interface VERSION is the one native.py expects."""
    pom = (ROOT / "spark_jobs/jvm/pom.xml").read_text()
    scala = (ROOT / "spark_jobs/jvm/src/main/scala/org/apache/spark/sql/persondp/Functions.scala").read_text()
    spark_version = re.search(r"<spark.version>([^<]+)</spark.version>", pom).group(1)
    assert re.search(r'val SPARK_VERSION: String = "([^"]+)"', scala).group(1) == spark_version
    assert int(re.search(r"val VERSION: Int = (\d+)", scala).group(1)) == native.JAR_VERSION
    pins = (ROOT / "conf/constraints-airflow.txt").read_text()
    assert f"pyspark=={spark_version}" in pins


def test_groups_like_json_allow_list():
    from pyspark.sql import types as T

    yes = [T.IntegerType(), T.LongType(), T.ShortType(), T.ByteType(), T.BooleanType(), T.DateType(),
           T.TimestampType(), T.TimestampNTZType(), T.DecimalType(10, 2), T.StringType()]
    no = [T.DoubleType(), T.FloatType(), T.StringType("UTF8_LCASE"), T.StructType([T.StructField("x", T.IntegerType())]),
          T.ArrayType(T.IntegerType()), T.MapType(T.StringType(), T.IntegerType()), T.BinaryType(), None]
    assert all(native.groups_like_json(t) for t in yes)
    assert not any(native.groups_like_json(t) for t in no)


class _Conf:
    def __init__(self, value=None):
        self.values = {} if value is None else {native.OBJECT_HASH_THRESHOLD: value}

    def get(self, key, default=None):
        return self.values.get(key, default)

    def set(self, key, value):
        self.values[key] = value


class _Spark:
    def __init__(self, value=None):
        self.conf = _Conf(value)


@pytest.mark.parametrize("start, k, want", [
    ("100000", 10, "100000"),  # 10^6 entries: within the bound, unchanged
    ("100000", 1000, str(native.MAX_HEAP_ENTRIES // 1000)),  # lowered
    ("100000", 10**6, "128"),  # never below Spark's default
    ("500", 1000, "500"),  # never raised
    (None, 10, None),  # unset: Spark's default 128 is already within the bound
])
def test_bound_object_hash_map(start, k, want):
    s = _Spark(start)
    native.bound_object_hash_map(s, k)
    assert s.conf.get(native.OBJECT_HASH_THRESHOLD) == want


def test_a_session_without_the_jar_is_told_why(caplog, monkeypatch):
    """A session whose JVM lacks the jar's class (py4j hands back a package, calling it raises
    TypeError): the SQL path, and one warning that says the jar is not on the session's classpath
    and how to add it (a new user read "not available (TypeError)" and did not know what to do)."""
    from types import SimpleNamespace

    monkeypatch.delenv(native.ENV_SWITCH, raising=False)
    fns = SimpleNamespace(VERSION=object())  # not callable: TypeError, as a missing class
    jvm = SimpleNamespace(org=SimpleNamespace(apache=SimpleNamespace(spark=SimpleNamespace(
        sql=SimpleNamespace(persondp=SimpleNamespace(Functions=fns))))))

    class FakeSession:
        _jvm = jvm
        version = "4.0.0"

    with caplog.at_level("WARNING", logger="person_dp.native"):
        assert native.enabled(FakeSession()) is False
    (msg,) = [r.getMessage() for r in caplog.records]
    assert "not on this Spark session's classpath" in msg and "spark.jars" in msg and "TypeError" not in msg
