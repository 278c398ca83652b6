"""The Airflow 3 DAG factory (airflow_dags/person_dp_dags.py).

- Parse: DagBag loads one DAG per spec with no import errors, the expected tasks and
  dependencies, catchup off, max one active run, retries from the spec, and no SQL statement,
  network connection, Spark, delta-rs or job module at parse time.
- End to end: ``dag.test()`` against a temporary AIRFLOW_HOME with a migrated SQLite DB; the
  submit task really runs spark-submit (local Spark) on the 400-aircraft flights sample; the
  release and the ledger entry are found. The same DAG run again (same run id, so the submit task
  is retried with the same run key) returns the stored release: nothing new is released or spent.
- No room in the ledger: the check task fails, nothing is submitted, nothing is written.

Airflow runs in subprocesses (its settings and logging are process-wide), each with its own
AIRFLOW_HOME.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from spark_jobs.config import load_config
from spark_jobs.ledger import Ledger, spent_is_consistent
from spark_jobs.query import read_delta

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
DAGS = REPO / "airflow_dags"
CONN = "person_dp_test_spark"
TASKS = {
    "validate_config_and_input": [],
    "check_ledger_room": ["validate_config_and_input"],
    "submit_job": ["check_ledger_room"],
    "verify_release": ["submit_job"],
    "write_report": ["verify_release"],
}


def _env(home: Path, specs: Path) -> dict:
    bin_dir = os.path.dirname(sys.executable)
    return {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
        "PERSON_DP_DAG_SPECS": str(specs),
        f"AIRFLOW_CONN_{CONN.upper()}": json.dumps({"conn_type": "spark", "host": "local[2]"}),
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),  # spark-submit of this environment
    }


@pytest.fixture(scope="module")
def airflow_home(tmp_path_factory):
    """A temporary AIRFLOW_HOME with a migrated SQLite metadata DB."""
    home = tmp_path_factory.mktemp("airflow_home")
    specs = tmp_path_factory.mktemp("no_specs")
    proc = subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=_env(home, specs),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (home / "airflow.db").is_file()
    return home


def _spec(folder: Path, dag_id: str, flights: str, out: Path, py_files: str, overrides=(), retries=0) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    spec = {
        "dag_id": dag_id,
        "job_config": str(REPO / "conf/examples/flights.yaml"),
        "workdir": str(out.parent),
        "overrides": [f"input.path={flights}", f"output.path={out}",
                      # 400 aircraft: a declared scale (the scale-free estimator needs ~2,000)
                      "statistics.0.options.scale=20", "statistics.1.options.scale=20", *overrides],
        "schedule": "@daily",
        "retries": retries,
        "retry_delay_minutes": 0.05,
        "report": True,
        "spark": {"conn_id": CONN, "py_files": py_files, "conf": {"spark.sql.shuffle.partitions": "4"}},
    }
    path = folder / f"{dag_id}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


PARSE = r"""
import json, socket, sys, time
from sqlalchemy import event
from sqlalchemy.engine import Engine
statements = []
event.listen(Engine, "before_cursor_execute", lambda *a, **k: statements.append(a[2]))
def no_network(*a, **k):
    raise AssertionError("network access at DAG parse time")
socket.socket.connect = no_network
socket.create_connection = no_network
from airflow.dag_processing.dagbag import DagBag
t0 = time.monotonic()
bag = DagBag(dag_folder=sys.argv[1])
took = time.monotonic() - t0
out = {"errors": {k: str(v) for k, v in bag.import_errors.items()}, "sql": statements, "seconds": took,
       "heavy": [m for m in ("pyspark", "deltalake", "spark_jobs.job", "spark_jobs.ledger", "dplib.mean")
                 if m in sys.modules], "dags": {}}
for d in bag.dags.values():
    out["dags"][d.dag_id] = {
        "tasks": {t.task_id: sorted(t.upstream_task_ids) for t in d.tasks},
        "catchup": d.catchup, "max_active_runs": d.max_active_runs, "schedule": str(d.schedule),
        "retries": {t.task_id: t.retries for t in d.tasks},
        "submit": {k: getattr(d.get_task("submit_job"), k) for k in ("_conn_id", "application_args", "env_vars")},
    }
print("RESULT " + json.dumps(out, default=str))
"""


def test_dagbag_parses_without_db_network_or_spark(tmp_path, package_zip):
    specs = tmp_path / "specs"
    _spec(specs, "person_dp_a", "/data/a.parquet", tmp_path / "out_a", package_zip, retries=3)
    _spec(specs, "person_dp_b", "/data/b.parquet", tmp_path / "out_b", package_zip, retries=3)
    # the repository's own spec folder parses too
    for folder, expected in ((specs, {"person_dp_a", "person_dp_b"}), (DAGS / "jobs", {"person_dp_flights_delays"})):
        home = tmp_path / f"home_{folder.name}"  # no DB at all: DagBag must not need one
        proc = subprocess.run([sys.executable, "-c", PARSE, str(DAGS)], env=_env(home, folder),
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        res = json.loads(line.removeprefix("RESULT "))
        assert res["errors"] == {}
        assert res["sql"] == [] and res["heavy"] == []
        assert not (home / "airflow.db").exists()
        assert set(res["dags"]) == expected
        assert res["seconds"] < 30
        for d in res["dags"].values():
            assert d["tasks"] == TASKS
            assert d["catchup"] is False and d["max_active_runs"] == 1
            assert d["submit"]["env_vars"]["PYSPARK_PYTHON"] == sys.executable
            assert d["submit"]["application_args"][-2:] == ["--run-id", "{{ run_id }}"]
            assert d["retries"]["submit_job"] == (3 if folder == specs else 2)


def test_dagbag_reports_a_bad_spec_naming_the_field(tmp_path):
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "bad.yaml").write_text("dag_id: bad\njob_config: x.yaml\nretries: -1\nspark: {conn: x}\n")
    proc = subprocess.run([sys.executable, "-c", PARSE, str(DAGS)], env=_env(tmp_path / "home", specs),
                          capture_output=True, text=True, timeout=300)
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    (err,) = json.loads(line.removeprefix("RESULT "))["errors"].values()
    assert "retries: Input should be greater than or equal to 0" in err and "spark.conn: Extra inputs" in err


RUN = r"""
import datetime as dt, json, sys
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(dag_folder=sys.argv[1])
assert not bag.import_errors, bag.import_errors
dag = bag.get_dag(sys.argv[2])
when = dt.datetime(2026, 11, 29, tzinfo=dt.timezone.utc)
dr = dag.test(run_after=when, logical_date=when)
print("RESULT " + json.dumps({"state": str(dr.state), "run_id": dr.run_id,
                              "tis": {ti.task_id: str(ti.state) for ti in dr.get_task_instances()}}))
"""


def _dag_test(home, specs, dag_id):
    proc = subprocess.run([sys.executable, "-c", RUN, str(DAGS), dag_id], env=_env(home, specs),
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    return json.loads(line.removeprefix("RESULT ")), proc.stdout + proc.stderr


def test_dag_runs_end_to_end_and_a_rerun_releases_nothing_new(airflow_home, flights_sample, package_zip, tmp_path):
    flights, _ = flights_sample
    out = tmp_path / "out"
    spec = _spec(tmp_path / "specs", "person_dp_e2e", flights, out, package_zip)
    res, log = _dag_test(airflow_home, spec.parent, "person_dp_e2e")
    assert res["state"] == "success", log[-4000:]
    assert res["tis"] == {t: "success" for t in TASKS}

    # the run key is the DAG run's id: the release's run id is derived from it
    cfg = load_config(REPO / "conf/examples/flights.yaml",
                      yaml.safe_load(spec.read_text())["overrides"] + [f"input.path={flights}"])
    run_id = cfg.run_id_for(res["run_id"])
    rows = read_delta(str(out / "releases")).to_pylist()
    assert sorted((r["run_id"], r["statistic"]) for r in rows) == [(run_id, "arr_delay_mean"), (run_id, "dep_delay_mean")]
    for r in rows:
        assert r["status"] == "OK" and math.isfinite(r["estimate"][0]) and r["error_bar"][0] > 0
    ledger = Ledger(str(out / "privacy_ledger"))
    entries = ledger.entries("nycflights13-aircraft")
    assert [(e["run_id"], e["status"]) for e in entries] == [(run_id, "released")]
    spent = ledger.population("nycflights13-aircraft").spent_epsilon
    assert spent == pytest.approx(1.0)
    assert (out / "report" / run_id / "report.html").is_file()

    # the same DAG run again: every task re-runs, the submit task with the same run key
    again, log2 = _dag_test(airflow_home, spec.parent, "person_dp_e2e")
    assert again["run_id"] == res["run_id"] and again["state"] == "success", log2[-4000:]
    assert "had already released; nothing was spent" in log2
    rows2 = read_delta(str(out / "releases")).to_pylist()
    assert len(rows2) == 2 and sorted(r["estimate"][0] for r in rows2) == sorted(r["estimate"][0] for r in rows)
    assert [(e["run_id"], e["status"]) for e in ledger.entries("nycflights13-aircraft")] == [(run_id, "released")]
    assert ledger.population("nycflights13-aircraft").spent_epsilon == pytest.approx(spent)
    assert spent_is_consistent(ledger, "nycflights13-aircraft")


def test_no_room_in_the_ledger_fails_before_submitting(airflow_home, flights_sample, package_zip, tmp_path):
    flights, _ = flights_sample
    out = tmp_path / "out"
    spec = _spec(tmp_path / "specs", "person_dp_no_room", flights, out, package_zip,
                 overrides=["ledger.initial_limit.epsilon=0.5"])  # the run costs epsilon = 1
    res, log = _dag_test(airflow_home, spec.parent, "person_dp_no_room")
    assert res["state"] == "failed"
    assert res["tis"]["validate_config_and_input"] == "success"
    assert res["tis"]["check_ledger_room"] == "failed"  # AirflowFailException: no retries
    assert res["tis"]["submit_job"] == "upstream_failed"
    assert "has not enough budget left" in log and "SparkSubmitHook" not in log  # nothing was submitted
    assert not (out / "releases").exists() and not (out / "privacy_ledger").exists()
