"""The job under a real ``spark-submit --master local-cluster[2,1,1024]`` (a standalone master,
two worker JVMs, executors with their own Python workers; conf/spark-submit/local-cluster.conf):
the package shipped as a zip with
``--py-files``, the Delta jars from the local Maven repository with ``--jars``, the config from
the YAML plus ``--set`` (job) and ``--conf`` (Spark) overrides. Runs the launcher exactly as the
README says."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spark_jobs.config import load_config
from spark_jobs.ledger import Ledger
from spark_jobs.query import read_delta

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
MASTER = "local-cluster[2,1,1024]"
PROBE = """
import json, sys
from pyspark.sql import SparkSession
spark = SparkSession.builder.getOrCreate()
def where(_):
    import dplib, spark_jobs, spark_jobs.spark.summarize
    return (spark_jobs.__file__, dplib.__file__)
print("PROBE " + json.dumps(sorted(set(spark.sparkContext.parallelize(range(4), 4).map(where).collect()))))
print("MASTER " + spark.sparkContext.master)
spark.stop()
"""


def _env():
    bin_dir = os.path.dirname(sys.executable)
    return {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
            "PATH": bin_dir + os.pathsep + os.environ.get("PATH", "")}


def _jars():
    out = subprocess.run([sys.executable, "-m", "spark_jobs.cli", "spark-jars"], capture_output=True, text=True,
                         check=True, env=_env())
    return out.stdout.strip()


def _submit(args, cwd, timeout=600):
    cmd = [os.path.join(os.path.dirname(sys.executable), "spark-submit"),
           "--properties-file", str(REPO / "conf/spark-submit/local-cluster.conf"), *args]
    return subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout)


def test_flights_job_under_spark_submit(flights_sample, package_zip, tmp_path):
    path, _ = flights_sample
    sets = [f"input.path={path}", f"output.path={tmp_path / 'out'}",
            # 400 aircraft: a declared scale (the scale-free estimator needs ~2,000 persons)
            "statistics.0.options.scale=20", "statistics.1.options.scale=20"]
    argv = ["run", "--config", str(REPO / "conf/examples/flights.yaml"), "--run-id", "2026-11-29"]
    for s in sets:
        argv += ["--set", s]
    proc = _submit(["--py-files", package_zip, "--jars", _jars(), "--conf", "spark.sql.shuffle.partitions=4",
                    "--conf", "spark.driver.memory=1g", str(REPO / "bin/person_dp_submit.py"), *argv], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "StandaloneSchedulerBackend" in proc.stderr  # spark-submit's master was used, not the config's local[2]
    assert "2 statistic(s) released to the Delta table" in proc.stdout

    cfg = load_config(REPO / "conf/examples/flights.yaml", sets)
    run_id = cfg.run_id_for("2026-11-29")
    rows = read_delta(str(tmp_path / "out" / "releases")).to_pylist()
    assert sorted(r["statistic"] for r in rows) == ["arr_delay_mean", "dep_delay_mean"]
    assert {r["run_id"] for r in rows} == {run_id}
    for r in rows:
        assert r["status"] == "OK" and math.isfinite(r["estimate"][0]) and r["error_bar"][0] > 0
        assert -60 < r["estimate"][0] < 60  # minutes of delay, not garbage
    entries = Ledger(str(tmp_path / "out" / "privacy_ledger")).entries("nycflights13-aircraft")
    assert [(e["run_id"], e["status"]) for e in entries] == [(run_id, "released")]
    assert entries[0]["epsilon"] == pytest.approx(1.0)


def test_package_imports_from_the_zip_on_executors(package_zip, tmp_path):
    """Python on the executors imports dplib and spark_jobs from the shipped zip (it comes first
    on their path), so a package that does not import there fails here."""
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    proc = _submit(["--py-files", package_zip, str(probe)], tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("PROBE ")]
    paths = json.loads(line.removeprefix("PROBE "))
    assert paths and all("person_dp.zip" in p for pair in paths for p in pair), paths
    assert f"MASTER {MASTER}" in proc.stdout
