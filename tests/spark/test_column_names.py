"""Columns of any spelling (issue 20, defect 2): a dot (``v.x``, ``user.id``) or a backtick
(``v`1``) in a column name used to pass the config check and fail inside Spark after the budget
was reserved. Every kind that reads user columns is run through the job on such names; the
estimates are checked against a pandas oracle on the same data."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dplib.mechanisms import SeededNoise
from spark_jobs.config import parse_config
from spark_jobs.job import run_job

pytestmark = pytest.mark.spark

N, R = 800, 5
UNIT, X, Y, CAT = "user.id", "v.x", "v`1", "c.a`t"


@pytest.fixture(scope="module")
def odd_names(tmp_path_factory):
    rng = np.random.default_rng(5)
    mu = rng.normal([3.0, -1.0], [1.0, 0.5], size=(N, 2))
    vals = np.repeat(mu, R, axis=0) + rng.normal(0.0, 0.5, size=(N * R, 2))
    pdf = pd.DataFrame({UNIT: np.repeat([f"u{i}" for i in range(N)], R), X: vals[:, 0], Y: vals[:, 1],
                        CAT: (["a", "a", "b", "b", "c"]) * N})
    path = tmp_path_factory.mktemp("odd") / "odd.parquet"
    pdf.to_parquet(path, index=False)
    truth = pdf.groupby(UNIT)[[X, Y]].mean().mean().to_numpy()
    return str(path), truth


def test_dotted_and_backticked_column_names_run_end_to_end(spark, odd_names, tmp_path):
    path, truth = odd_names
    cfg = parse_config({
        "job_name": "odd-names",
        "input": {"path": path, "format": "parquet"},
        "privacy_unit": {"column": UNIT},
        "budget": {"epsilon": 8.0, "delta": 1e-6},
        "statistics": [
            {"name": "mean_x", "kind": "mean", "columns": [X], "share": 0.25},
            {"name": "mean_y_scaled", "kind": "mean", "columns": [Y], "share": 0.25, "options": {"scale": 1.0}},
            {"name": "vector", "kind": "multivariate_mean", "columns": [X, Y], "share": 0.25},
            {"name": "dist", "kind": "distribution", "columns": [CAT], "share": 0.25,
             "options": {"categories": ["a", "b"], "m": R, "estimator": "P0"}},
        ],
        "output": {"path": str(tmp_path)},
        "ledger": {"enabled": False},
    })
    result = run_job(cfg, spark=spark, noise=SeededNoise(4), run_id="odd-1")
    rows = {r.statistic: r for r in result.rows}
    assert {r.status for r in rows.values()} == {"OK"}
    assert abs(rows["mean_x"].estimate[0] - truth[0]) < 0.1
    assert abs(rows["mean_y_scaled"].estimate[0] - truth[1]) < 0.1
    assert np.all(np.abs(np.array(rows["vector"].estimate) - truth) < 0.1)
    assert np.allclose(rows["dist"].estimate, [0.4, 0.4, 0.2], atol=0.05)
    assert rows["vector"].columns == [X, Y]
