"""The multivariate mean through the whole job: config -> Spark summaries -> estimator -> Delta,
checked against a pandas oracle (mean over aircraft of each aircraft's mean vector) and against
the same estimator on the numpy backend with the same salt and noise seed."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from dplib.aggregates import NumpyAggregates
from dplib.budget import Accountant
from dplib.errors import ConfigError
from dplib.mean.multivariate import multivariate_person_mean
from dplib.mechanisms import SeededNoise
from spark_jobs.config import parse_config
from spark_jobs.job import plan_job, run_job, statistic_plan
from spark_jobs.query import read_delta

pytestmark = pytest.mark.spark

COLS = ["arr_delay", "dep_delay", "air_time"]


def make_config(input_path, out, options=None, **budget):
    return parse_config(
        {
            "job_name": "flights-vector-test",
            "input": {"path": str(input_path), "format": "parquet"},
            "privacy_unit": {"column": "tailnum"},
            "budget": {"epsilon": 1.0, "delta": 1e-6, **budget},
            "statistics": [
                {"name": "vec", "kind": "multivariate_mean", "columns": COLS, "share": 1.0, "options": options or {}}
            ],
            "output": {"path": str(out)},
            "ledger": {"enabled": False},
        }
    )


def oracle(pdf: pd.DataFrame) -> np.ndarray:
    d = pdf[pdf.tailnum.notna() & ~pdf.tailnum.isin(["NA", ""])].dropna(subset=COLS)
    return d.groupby("tailnum")[COLS].mean().mean().to_numpy()


def test_vector_release_lands_with_its_plan(spark, flights_full, tmp_path):
    path, pdf = flights_full
    cfg = make_config(path, tmp_path)
    result = run_job(cfg, spark=spark, noise=SeededNoise(7), run_id="vec-1")
    (row,) = result.rows
    assert row.status == "OK" and row.kind == "multivariate_mean"
    assert row.estimate_shape == [3] and len(row.estimate) == 3 and len(row.error_bar) == 3
    exact = oracle(pdf)
    # ~4,000 aircraft, eps = 1: each coordinate within a few minutes of the exact mean
    err = np.abs(np.array(row.estimate) - exact)
    assert np.all(err < np.array([3.0, 3.0, 6.0])), (row.estimate, exact)
    params = json.loads(row.parameters)
    # the default: the scale-free estimator (no scales declared), every stage on all persons
    assert row.algorithm == "agarwal2024-multivariate-person-mean/scale-free"
    assert len(params["scales_used"]) == 3 and params["final_radius"] > 0
    assert len(params["coordinate_ranges"]) == 3
    assert "summary mode" in params["unequal_records"]
    # the whole epsilon; delta: the range's delta/4, delta/8 per retry that ran, the final delta/2
    assert result.epsilon_spent == pytest.approx(1.0)
    retries = int(params["range_retried"]) + int("range_retried_twice_coordinates" in params)
    assert result.delta_spent == pytest.approx(1e-6 * (0.75 + retries / 8.0))
    # the bar covers the exact statistic here (a 90% bar per coordinate; seeded, checked once)
    assert np.all(err <= np.array(row.error_bar)), (err, row.error_bar)
    back = read_delta(str(tmp_path / "releases")).to_pylist()
    assert len(back) == 1 and back[0]["estimate"] == pytest.approx(row.estimate)
    assert back[0]["columns"] == COLS and back[0]["estimate_shape"] == [3]


def test_spark_and_numpy_runs_agree(spark, flights_sample, tmp_path):
    """Same salt, same seed, same plan: exact aggregates make the two releases identical."""
    from spark_jobs.spark.aggregates import SparkAggregates
    from spark_jobs.spark.summarize import summarize

    path, _ = flights_sample
    cfg = make_config(path, tmp_path, options={"scales": [30.0, 30.0, 60.0], "expected_persons": 400})
    plan = statistic_plan(cfg, cfg.statistics[0])
    salt = "ab" * 32
    records = spark.read.parquet(str(path))
    summary = summarize(records, "tailnum", COLS, salt, 1, ["", "NA"]).persist()
    try:
        spark_rel = multivariate_person_mean(SparkAggregates(summary), COLS, plan, SeededNoise(3), Accountant(plan.budget))
        # the numpy backend over the very same person summaries (test only: collected here)
        per = summary.select("_group", *COLS).toPandas()
    finally:
        summary.unpersist()
    np_backend = NumpyAggregates({c: per[c].to_numpy(dtype=float) for c in COLS}, per["_group"].to_numpy())
    np_rel = multivariate_person_mean(np_backend, COLS, plan, SeededNoise(3), Accountant(plan.budget))
    assert spark_rel.status == np_rel.status == "OK"
    assert spark_rel.parameters["schedule"] == np_rel.parameters["schedule"]
    np.testing.assert_array_equal(spark_rel.estimate, np_rel.estimate)


def test_dry_run_plan_and_bad_configs(tmp_path):
    cfg = make_config(tmp_path / "nowhere.parquet", tmp_path, budget_mode="sequential")
    text = plan_job(cfg).render()
    assert "multivariate mean, d=3" in text and "final clip-and-noise" in text
    assert plan_job(cfg).cost == pytest.approx((1.0, 1e-6))
    with pytest.raises(ConfigError, match="delta must be > 0"):
        make_config(tmp_path / "x", tmp_path, delta=0.0)
    with pytest.raises(ConfigError, match="options.scales must hold one value per column"):
        make_config(tmp_path / "x", tmp_path, options={"scales": [1.0, 2.0]})
    with pytest.raises(ConfigError, match="options.scale is for kind 'mean'"):
        make_config(tmp_path / "x", tmp_path, options={"scale": 3.0})
