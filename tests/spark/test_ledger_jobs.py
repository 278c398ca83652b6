"""The ledger inside the job: idempotent keyed runs, refusal before any noise, crash injection
at each commit step (a killed process) with retry, and the CLI on the tables the job wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from dplib.errors import BudgetExceededError
from dplib.mechanisms import SeededNoise
from spark_jobs.config import parse_config
from spark_jobs.query import read_delta
from spark_jobs.job import run_job
from spark_jobs.ledger import Ledger, spent_is_consistent

pytestmark = pytest.mark.spark


def _data(tmp_path, n_persons=300, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, n_persons, 6000)
    p = tmp_path / "events.parquet"
    pd.DataFrame({"user": [f"u{i}" for i in ids], "x": rng.normal(5, 2, ids.size)}).to_parquet(p)
    return p


def _cfg(tmp_path, limit=(10.0, 1e-4), epsilon=1.0, **ledger):
    data = {
        "job_name": "ledger-test",
        "input": {"path": str(_data(tmp_path)), "dataset": "events"},
        "privacy_unit": {"column": "user"},
        "budget": {"epsilon": epsilon, "delta": 1e-6},
        "statistics": [{"name": "x_mean", "kind": "mean", "columns": ["x"], "share": 1.0, "options": {"scale": 2.0}}],
        "output": {"path": str(tmp_path / "out")},
        "ledger": {"population": "events-users", **({"initial_limit": {"epsilon": limit[0], "delta": limit[1]}} if limit else {}), **ledger},
    }
    return parse_config(data), data


def _ledger(tmp_path):
    return Ledger(str(tmp_path / "out" / "privacy_ledger"))


def test_keyed_run_spends_once_unkeyed_twice(spark, tmp_path):
    cfg, _ = _cfg(tmp_path)
    first = run_job(cfg, spark=spark, noise=SeededNoise(1), run_id="2026-11-29")
    again = run_job(cfg, spark=spark, noise=SeededNoise(2), run_id="2026-11-29")
    assert again.reused and again.run_id == first.run_id
    assert again.rows[0].estimate == first.rows[0].estimate  # the stored release, not new noise
    # the caller's key is kept in the release (find "the release of Airflow run X" by its run id)
    assert json.loads(first.rows[0].parameters)["run_key"] == "2026-11-29"
    led = _ledger(tmp_path)
    assert led.population("events-users").spent_epsilon == pytest.approx(1.0)
    run_job(cfg, spark=spark, noise=SeededNoise(3))
    run_job(cfg, spark=spark, noise=SeededNoise(4))
    assert led.population("events-users").spent_epsilon == pytest.approx(3.0)
    assert sorted(e["status"] for e in led.entries("events-users")) == ["released"] * 3
    assert spent_is_consistent(led, "events-users")

    assert len(read_delta(str(tmp_path / "out" / "releases")).to_pandas()) == 3


class _NoNoise:
    name, secure = "forbidden", True

    def add_laplace(self, values, scale):
        raise AssertionError("noise drawn although the budget was refused")

    add_gaussian = add_laplace


def test_budget_too_low_refuses_before_any_noise(spark, tmp_path):
    cfg, _ = _cfg(tmp_path, limit=(0.5, 1e-4))
    with pytest.raises(BudgetExceededError, match=r"limit \(epsilon=0.5.*requested \(epsilon=1"):
        run_job(cfg, spark=spark, noise=_NoNoise())
    assert not (tmp_path / "out" / "releases").exists()
    assert _ledger(tmp_path).population("events-users").spent_epsilon == 0.0


def test_population_without_limit_refuses(spark, tmp_path):
    cfg, _ = _cfg(tmp_path, limit=None)
    with pytest.raises(BudgetExceededError, match="no budget is set for population 'events-users'"):
        run_job(cfg, spark=spark, noise=_NoNoise())


RUNNER = """
import json, logging, os, sys
from dplib.mechanisms import SeededNoise
from spark_jobs.config import parse_config
from spark_jobs.query import read_delta
from spark_jobs.job import run_job
cfg = parse_config(json.loads(sys.argv[1]))
step = sys.argv[2]


def crash(name):
    if name == step:
        logging.shutdown()
        os._exit(86)


run_job(cfg, noise=SeededNoise(7), run_id="nightly-1", checkpoint=crash)
"""


@pytest.mark.parametrize("step", ["after_reserve", "before_release_commit", "after_release_commit"])
def test_crash_at_each_step_then_retry(spark, tmp_path, step):
    cfg, data = _cfg(tmp_path)
    data = {**data, "spark": {"master": "local[1]"}}
    proc = subprocess.run([sys.executable, "-c", RUNNER, json.dumps(data), step], capture_output=True, timeout=300)
    assert proc.returncode == 86, proc.stderr.decode()[-2000:]  # killed at the injected point
    led = _ledger(tmp_path)
    table = tmp_path / "out" / "releases"
    released = table.exists()
    assert released == (step == "after_release_commit")  # never a partial release
    assert led.population("events-users").spent_epsilon == pytest.approx(1.0)  # reserved stays spent
    assert [e["status"] for e in led.entries("events-users")] == ["reserved"]

    retry = run_job(cfg, spark=spark, noise=SeededNoise(8), run_id="nightly-1")
    entries = sorted((e["attempt"], e["status"]) for e in led.entries("events-users"))
    if step == "after_release_commit":
        # the release landed: the retry returns it, spends nothing, and reconciles the ledger
        assert retry.reused
        assert entries == [(1, "released")]
        assert led.population("events-users").spent_epsilon == pytest.approx(1.0)
    else:
        # no release: the retry reserves again (noise may have been drawn) and releases
        assert not retry.reused
        assert entries == [(1, "abandoned"), (2, "released")]
        assert led.population("events-users").spent_epsilon == pytest.approx(2.0)
    assert spent_is_consistent(led, "events-users")

    assert len(read_delta(str(table)).to_pandas()) == 1


def test_cli_on_the_job_tables(spark, tmp_path):
    cfg, _ = _cfg(tmp_path)
    res = run_job(cfg, spark=spark, noise=SeededNoise(1), run_id="day-1")
    out = tmp_path / "out"
    env = {**os.environ}
    cli = [sys.executable, "-m", "spark_jobs.cli"]

    def run(*args):
        p = subprocess.run(cli + list(args), env=env, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        return p.stdout

    listed = json.loads(run("releases", "list", "--table", str(out / "releases"), "--format", "json"))
    assert [r["run_id"] for r in listed] == [res.run_id]
    assert listed[0]["estimate"] == [pytest.approx(res.rows[0].estimate[0])]
    shown = run("releases", "show", res.run_id, "--table", str(out / "releases"), "--format", "csv")
    assert res.run_id in shown and "x_mean" in shown
    budget = run("budget", "show", "--ledger", str(out / "privacy_ledger"), "--format", "csv", "--entries")
    assert "events-users,10,0.0001,1,1e-06,9,9.9e-05" in budget.replace(".0,", ",")
    assert "released" in budget
    run("budget", "set", "--ledger", str(out / "privacy_ledger"), "--population", "events-users",
        "--epsilon", "20", "--delta", "1e-4")
    assert _ledger(tmp_path).population("events-users").limit_epsilon == 20.0
    report = run("report", "--table", str(out / "releases"), "--out", str(tmp_path / "report"))
    page = (tmp_path / "report" / "report.html").read_text()
    assert "x_mean" in page and (tmp_path / "report" / "x_mean.png").stat().st_size > 1000
    assert "report.html" in report


def test_spark_sql_views_as_documented(spark, tmp_path):
    """The README's Spark SQL recipe: temp views over both Delta tables, then plain SQL."""
    cfg, _ = _cfg(tmp_path)
    res = run_job(cfg, spark=spark, noise=SeededNoise(1))
    out = tmp_path / "out"
    spark.sql(f"CREATE OR REPLACE TEMP VIEW releases AS SELECT * FROM delta.`{out / 'releases'}`")
    spark.sql(f"CREATE OR REPLACE TEMP VIEW privacy_ledger AS SELECT * FROM delta.`{out / 'privacy_ledger'}`")
    got = spark.sql("SELECT statistic, estimate[0] AS est FROM releases").collect()
    assert [(r.statistic, r.est) for r in got] == [("x_mean", pytest.approx(res.rows[0].estimate[0]))]
    pop = spark.sql("SELECT limit_epsilon, spent_epsilon FROM privacy_ledger WHERE kind = 'population'").collect()
    assert [(r.limit_epsilon, r.spent_epsilon) for r in pop] == [(10.0, pytest.approx(1.0))]


JOB = """
import json, os, sys, time
from dplib.errors import BudgetExceededError
from spark_jobs.config import parse_config
from spark_jobs.job import run_job
cfg = parse_config(json.loads(sys.argv[1]))
folder, n = sys.argv[2], 2


def barrier(name):
    # the processes wait for each other just before the reservation
    if name != "before_reserve":
        return
    os.makedirs(folder, exist_ok=True)
    open(os.path.join(folder, str(os.getpid())), "w").close()
    deadline = time.monotonic() + 300
    while len(os.listdir(folder)) < n and time.monotonic() < deadline:
        time.sleep(0.01)


try:
    run_job(cfg, checkpoint=barrier)
except BudgetExceededError as err:
    print("REFUSED", err)
    sys.exit(3)
"""


def test_two_jobs_overlap_room_for_one(tmp_path):
    """Two whole jobs (separate processes, separate Spark drivers) reach the reservation at the
    same moment against a ledger with room for one run: one releases, one refuses."""
    _, data = _cfg(tmp_path, limit=(1.5, 1e-4))
    data = {**data, "spark": {"master": "local[1]"}}
    procs = [subprocess.Popen([sys.executable, "-c", JOB, json.dumps(data), str(tmp_path / "barrier")], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    codes = sorted(p.wait(timeout=600) for p in procs)
    outs = [p.stdout.read() for p in procs]
    assert codes == [0, 3], outs
    assert any("has not enough budget left" in o for o in outs)
    led = _ledger(tmp_path)
    assert led.population("events-users").spent_epsilon == pytest.approx(1.0)
    assert [e["status"] for e in led.entries("events-users")] == ["released"]
    assert spent_is_consistent(led, "events-users")
    assert len(read_delta(str(tmp_path / "out" / "releases")).to_pandas()) == 1


def test_stages_a_dp_outcome_stopped_are_refunded(spark, tmp_path):
    """Issue 20, defect 6: the ledger kept the whole reservation when a statistic stopped early.
    Ten persons: the scale-free mean's range runs (the first, its retry and the pooled retry)
    release nothing, so only those three stages (0.04 + 0.20 + 0.15 of the share; delta/2 for
    each thresholded run, none for the pure pooled one) are charged; a second statistic that runs to
    the end spends its whole share but only half its delta (no retry needed). The ledger entry,
    the population's spent budget and the release rows agree on the realised cost."""
    rng = np.random.default_rng(3)
    p = tmp_path / "tiny.parquet"
    big = rng.integers(0, 3000, 30000)
    pd.DataFrame({"user": [f"u{i}" for i in big], "x": rng.normal(5, 2, big.size),
                  "y": np.where(big < 10, 1.0, np.nan)}).to_parquet(p)
    data = {
        "job_name": "refund-test", "input": {"path": str(p)}, "privacy_unit": {"column": "user"},
        "budget": {"epsilon": 2.0, "delta": 1e-6},
        "statistics": [{"name": "y_mean", "kind": "mean", "columns": ["y"], "share": 0.5},
                       {"name": "x_mean", "kind": "mean", "columns": ["x"], "share": 0.5}],
        "output": {"path": str(tmp_path / "out")},
        "ledger": {"population": "refund-users", "initial_limit": {"epsilon": 10.0, "delta": 1e-4}},
    }
    result = run_job(parse_config(data), spark=spark, noise=SeededNoise(5), run_id="refund-1")
    rows = {r.statistic: r for r in result.rows}
    assert rows["y_mean"].status == "INSUFFICIENT_DATA" and rows["x_mean"].status == "OK"
    expect_eps = 1.0 * (0.04 + 0.20 + 0.15) + 1.0
    expect_delta = 0.5e-6 + 0.25e-6  # y: both thresholded range runs (delta/2 each of its 0.5e-6); x: the first run only
    assert result.epsilon_spent == pytest.approx(expect_eps) and result.delta_spent == pytest.approx(expect_delta)
    led = Ledger(str(tmp_path / "out" / "privacy_ledger"))
    pop = led.population("refund-users")
    assert pop.spent_epsilon == pytest.approx(expect_eps) and pop.spent_delta == pytest.approx(expect_delta)
    (entry,) = led.entries("refund-users")
    assert entry["status"] == "released" and entry["epsilon"] == pytest.approx(expect_eps)
    assert spent_is_consistent(led, "refund-users")
