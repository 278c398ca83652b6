"""The session's JVM options: the JIT flag that keeps summarize's wide per-person method compiled
reaches the executor JVMs (local-cluster: real executor processes), and user options are kept."""

from __future__ import annotations

import os

import pytest

from spark_jobs.spark.session import DEFAULT_CONF, JIT_OPTION, _defaults_keys, revealing_settings, with_jit_option


class _Preset:
    """A stand-in for spark-submit's SparkConf (``get`` / ``contains``)."""

    def __init__(self, values):
        self.values = values

    def contains(self, key):
        return key in self.values

    def get(self, key, default=None):
        return self.values.get(key, default)


EXEC, DRIVER = "spark.executor.extraJavaOptions", "spark.driver.extraJavaOptions"


def test_flag_added_to_executor_and_local_driver():
    out = with_jit_option({"spark.sql.shuffle.partitions": "8"}, _Preset({}), submitted=False)
    assert out[EXEC] == JIT_OPTION and out[DRIVER] == JIT_OPTION
    assert out["spark.sql.shuffle.partitions"] == "8"


def test_user_options_kept_in_front_and_explicit_choice_respected():
    out = with_jit_option({EXEC: "-Dfoo=1 -Xss4m"}, _Preset({}), submitted=False)
    assert out[EXEC] == f"-Dfoo=1 -Xss4m {JIT_OPTION}"
    # the user's own choice (either sign) is not second-guessed
    out = with_jit_option({EXEC: "-XX:+DontCompileHugeMethods"}, _Preset({}), submitted=False)
    assert out[EXEC] == "-XX:+DontCompileHugeMethods"


def test_under_spark_submit_its_conf_is_extended_and_the_driver_left_alone():
    preset = _Preset({EXEC: "-Dbar=2", DRIVER: "-Dbaz=3"})
    out = with_jit_option({}, preset, submitted=True)
    assert out[EXEC] == f"-Dbar=2 {JIT_OPTION}"
    assert DRIVER not in out  # spark-submit's driver JVM is already running


def test_default_java_options_naming_the_flag_are_respected():
    preset = _Preset({"spark.executor.defaultJavaOptions": "-XX:+DontCompileHugeMethods"})
    out = with_jit_option({}, preset, submitted=True)
    assert "spark.executor.extraJavaOptions" not in out
    out = with_jit_option({"spark.driver.defaultJavaOptions": "-XX:+DontCompileHugeMethods"}, _Preset({}), submitted=False)
    assert out[EXEC] == JIT_OPTION and DRIVER not in out


def test_local_launch_leaves_keys_of_spark_defaults_conf_alone(tmp_path, caplog):
    conf = tmp_path / "spark-defaults.conf"
    conf.write_text("# comment\nspark.executor.extraJavaOptions   -Dfrom.file=1\nspark.eventLog.enabled=true\n")
    keys = _defaults_keys(conf)
    assert keys == {"spark.executor.extraJavaOptions", "spark.eventLog.enabled"}
    out = with_jit_option({}, _Preset({}), submitted=False, defaults_keys=keys)
    # a --conf would replace the file's value rather than extend it: left alone, with a warning
    assert EXEC not in out and out[DRIVER] == JIT_OPTION
    assert "spark-defaults.conf" in caplog.text
    assert _defaults_keys(None) == set()


@pytest.mark.spark
def test_executor_jvms_run_with_the_flag(spark):
    if not spark.sparkContext.master.startswith("local-cluster"):
        pytest.skip("needs executor JVMs (local-cluster)")
    assert JIT_OPTION in spark.sparkContext.getConf().get(EXEC).split()

    # defined here so that it is shipped by value (executors cannot import a test module)
    def _executor_jvm_cmdline(_):
        """From a Python worker: the command line of the executor JVM above it in the process tree."""
        pid = os.getppid()
        for _ in range(6):
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
            if any(b"CoarseGrainedExecutorBackend" in c for c in cmd):
                return [c.decode() for c in cmd]
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        return []

    cmds = spark.sparkContext.parallelize(range(4), 4).map(_executor_jvm_cmdline).collect()
    assert all(cmds), "no executor JVM found above the Python workers"
    assert all(JIT_OPTION in c for c in cmds)


def test_secure_defaults_and_warnings_name_what_is_revealed():
    assert DEFAULT_CONF["spark.ui.enabled"] == "false" and DEFAULT_CONF["spark.eventLog.enabled"] == "false"
    assert revealing_settings(DEFAULT_CONF) == []
    # Spark's own defaults: the UI is on unless disabled, the event log off unless enabled
    (ui,) = revealing_settings({})
    assert ui.startswith("spark.ui.enabled=true") and "exact row counts" in ui
    both = revealing_settings({"spark.ui.enabled": "True", "spark.eventLog.enabled": "true"})
    assert len(both) == 2 and "to disk" in both[1]


@pytest.mark.spark
def test_default_session_exposes_no_ui_port(spark):
    """The shared test session is built by build_session with the defaults: no web UI (no port,
    no REST API with row counts) and no event log."""
    sc = spark.sparkContext
    assert sc.uiWebUrl is None
    assert sc.getConf().get("spark.ui.enabled") == "false"
    assert sc.getConf().get("spark.eventLog.enabled", "false") == "false"
