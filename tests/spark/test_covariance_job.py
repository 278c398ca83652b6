"""BHS23 kinds through the whole job: config -> person vectors on Spark -> n0 -> Spark backend ->
Delta, against the numpy library (dplib.covariance.person) on the same person vectors with the
same salt and noise seed; plus a FAIL release (n0 below the gate: charged, no estimate), the
public refusal before any data, and the CLI/report printing a matrix."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from dplib.budget import Accountant
from dplib.covariance.person import NumpyPersonVectors, private_person_statistic
from dplib.errors import ConfigError
from dplib.groups import derive_salt
from dplib.mechanisms import SeededNoise
from spark_jobs import job as job_mod
from spark_jobs.config import parse_config
from spark_jobs.job import plan_job, run_job, statistic_plan
from spark_jobs.query import matrix_lines, read_delta, write_report

pytestmark = pytest.mark.spark

SALT = "7e" * 32
N_PERSONS = 12000
COLS = ["u", "v"]


def make_config(input_path, out, stats):
    return parse_config(
        {
            "job_name": "bhs-test",
            "input": {"path": str(input_path), "format": "parquet"},
            "privacy_unit": {"column": "pid"},
            "budget": {"epsilon": 1.0, "delta": 4e-4},
            "statistics": stats,
            "output": {"path": str(out)},
            "ledger": {"enabled": False},
        }
    )


STATS = [
    {"name": "cov", "kind": "covariance", "columns": COLS, "share": 0.9, "options": {"lambda0": 12.0}},
    {"name": "mu", "kind": "mean_affine", "columns": COLS, "share": 0.1},  # n0 far below its gate: FAIL
]


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    rng = np.random.default_rng(8)
    a = np.array([[2.0, 0.0], [1.5, 0.5]])
    per = rng.standard_normal((N_PERSONS, 2, 2)) @ a.T + [100.0, -7.0]  # 2 records per person
    pdf = pd.DataFrame({
        "pid": np.repeat([f"id{i}" for i in range(N_PERSONS)], 2),
        "u": per[:, :, 0].ravel(), "v": per[:, :, 1].ravel(),
    })
    path = tmp_path_factory.mktemp("bhs") / "records.parquet"
    pdf.to_parquet(path, index=False)
    return str(path), pdf


def person_means(pdf):
    """Each person's mean as Spark's summarize computes it: sorted values summed left to right."""
    ids, rows = [], []
    for pid, g in pdf.groupby("pid", sort=False):
        ids.append(pid)
        rows.append([(0.0 + sum(sorted(g[c].tolist()), 0.0)) / len(g) for c in COLS])
    return ids, np.array(rows)


def test_refusal_before_data_names_the_minimum(tmp_path):
    stats = [{"name": "mu", "kind": "mean_affine", "columns": COLS, "share": 1.0,
              "options": {"lambda0": 20.0, "expected_persons": 5000}}]
    with pytest.raises(ConfigError, match=r"needs at least \d+ persons"):
        plan_job(make_config("/nonexistent.parquet", tmp_path, stats))


def test_covariance_and_fail_release_to_delta_match_numpy(spark, records, tmp_path, monkeypatch, capsys):
    path, pdf = records
    monkeypatch.setattr(job_mod, "new_salt", lambda: SALT)
    cfg = make_config(path, tmp_path, STATS)
    result = run_job(cfg, spark=spark, noise=SeededNoise(17), run_id="bhs-1")
    rows = {r.statistic: r for r in result.rows}
    assert set(rows) == {"cov", "mu"}
    assert result.epsilon_spent == pytest.approx(1.0) and result.delta_spent == pytest.approx(4e-4)
    # the numpy library on the same person vectors, salt and noise seed
    ids, x = person_means(pdf)
    plan = statistic_plan(cfg, cfg.statistics[0])
    want = private_person_statistic(NumpyPersonVectors(ids, x, derive_salt(SALT, "cov")), plan, SeededNoise(17), Accountant(plan.budget))
    cov = rows["cov"]
    assert cov.status == want.release.status == "OK"
    assert cov.estimate_shape == [2, 2]
    assert np.array_equal(np.array(cov.estimate), want.release.covariance.ravel())
    params = json.loads(cov.parameters)
    assert params["n0"] == want.n0 and N_PERSONS - 400 < want.n0 <= N_PERSONS
    assert params["coordinates"] == COLS and params["lambda0"] == 12.0
    # accuracy sanity: person vectors have covariance A A^T / 2 (2 records each)
    a = np.array([[2.0, 0.0], [1.5, 0.5]])
    np.testing.assert_allclose(np.array(cov.estimate).reshape(2, 2), a @ a.T / 2, rtol=0.25, atol=0.1)
    mu = rows["mu"]
    assert mu.status == "FAIL" and mu.estimate is None and mu.epsilon == pytest.approx(0.1)
    # what landed in Delta
    table = read_delta(result.table_path, {"run_id": result.run_id}).to_pylist()
    by = {r["statistic"]: r for r in table}
    assert by["cov"]["estimate_shape"] == [2, 2] and by["mu"]["status"] == "FAIL"
    assert len(matrix_lines(by["cov"])) == 3
    page = write_report(result.table_path, str(tmp_path / "report"))
    assert "cov" in page.read_text()
    from spark_jobs.cli import _print_release

    _print_release(result)
    out = capsys.readouterr().out
    assert "cov (2 x 2)" in out and "FAIL" in out


def test_gaussian_kind_runs_and_fails_as_a_charged_release(spark, records, tmp_path, monkeypatch):
    """kind ``gaussian`` (Algorithm 5.2) through the job: 12,000 persons are below the gate of its
    mean part at (epsilon/2, delta/2), so the release is FAIL after the DP count, fully charged, with
    no estimate; the library path of an OK Gaussian is tested in tests/unit/test_covariance_private.py."""
    path, _ = records
    monkeypatch.setattr(job_mod, "new_salt", lambda: SALT)
    stats = [{"name": "g", "kind": "gaussian", "columns": COLS, "share": 1.0, "options": {"lambda0": 10.0}}]
    cfg = make_config(path, tmp_path, stats)
    plan = statistic_plan(cfg, cfg.statistics[0])
    assert plan.cost().epsilon == pytest.approx(1.0) and plan.cost().delta == pytest.approx(4e-4)
    assert plan.minimum_persons() > N_PERSONS  # the gate FAIL, not the PTR, is what this test exercises
    result = run_job(cfg, spark=spark, noise=SeededNoise(3), run_id="bhs-g")
    (row,) = result.rows
    assert row.status == "FAIL" and row.estimate is None
    assert row.epsilon == pytest.approx(1.0) and row.delta == pytest.approx(4e-4)
    assert result.epsilon_spent == pytest.approx(1.0)
    params = json.loads(row.parameters)
    assert 0 < params["n0"] <= N_PERSONS
    table = read_delta(result.table_path, {"run_id": result.run_id}).to_pylist()
    assert [r["status"] for r in table] == ["FAIL"]
