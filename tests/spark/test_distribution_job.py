"""kind: distribution through the whole job: config -> Spark batches -> P0/P1/P2 -> Delta, on the
flights sample (destination airport per aircraft, a public category list of large US airports
written here), against a pandas oracle; Spark and numpy releases equal with the same salt and
seed; dry-run plan; config errors before any budget."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from dplib.budget import Accountant
from dplib.distribution.batches import NumpyBatches
from dplib.distribution.private import private_distribution
from dplib.errors import ConfigError
from dplib.mechanisms import SeededNoise
from spark_jobs.config import parse_config
from spark_jobs.job import plan_job, run_job, statistic_plan
from spark_jobs.query import read_delta

pytestmark = pytest.mark.spark

# Public knowledge, not the data: the 20 busiest US airports by passenger boardings (FAA
# large hubs), in IATA codes. Everything else (and a missing dest) is OTHER.
AIRPORTS = ["ATL", "DFW", "DEN", "ORD", "LAX", "JFK", "LAS", "MCO", "MIA", "CLT",
            "SEA", "PHX", "EWR", "SFO", "IAH", "BOS", "FLL", "MSP", "LGA", "DTW"]
M = 10
LABEL_COLS = ["time_hour", "carrier", "flight", "origin", "dest"]


def make_config(path, out, estimator="P0", epsilon=2.0, delta=1e-6, **opts):
    return parse_config(
        {
            "job_name": "flights-dest-test",
            "input": {"path": str(path), "format": "parquet"},
            "privacy_unit": {"column": "tailnum"},
            "budget": {"epsilon": epsilon, "delta": delta},
            "statistics": [
                {
                    "name": "dest",
                    "kind": "distribution",
                    "columns": ["dest"],
                    "share": 1.0,
                    "options": {"categories": AIRPORTS, "m": M, "estimator": estimator, **opts},
                }
            ],
            "output": {"path": str(out)},
            "ledger": {"enabled": False},
        }
    )


def oracle(pdf: pd.DataFrame):
    """Mean over aircraft with >= M flights of each aircraft's distribution of dest over all its
    flights (the expectation of the sampled batches), and the number of such aircraft."""
    d = pdf[pdf.tailnum.notna() & ~pdf.tailnum.isin(["NA", ""])]
    d = d.assign(cat=np.where(d.dest.isin(AIRPORTS), d.dest, "OTHER"))
    sizes = d.groupby("tailnum").size()
    d = d[d.tailnum.isin(sizes[sizes >= M].index)]
    per = pd.crosstab(d.tailnum, d.cat, normalize="index").reindex(columns=AIRPORTS + ["OTHER"], fill_value=0.0)
    return per.mean().to_numpy(), len(per)


@pytest.mark.parametrize("estimator", ["P0", "P1", "P2"])
def test_distribution_release_against_pandas_oracle(spark, flights_sample, tmp_path, estimator):
    path, pdf = flights_sample
    cfg = make_config(path, tmp_path, estimator)
    result = run_job(cfg, spark=spark, noise=SeededNoise(5))
    (row,) = result.rows
    k = len(AIRPORTS) + 1
    assert row.kind == "distribution" and row.status == "OK" and row.estimate_shape == [k]
    est = np.array(row.estimate)
    assert np.all(est >= 0) and math.fsum(est) == pytest.approx(1.0, abs=1e-12)
    params = json.loads(row.parameters)
    assert params["categories"] == AIRPORTS + ["OTHER"] and params["estimator"] == estimator
    assert row.algorithm == f"batch-distribution-{estimator}"
    assert (row.epsilon, row.delta) == (pytest.approx(2.0), pytest.approx(1e-6 if estimator == "P2" else 0.0))
    exact, n = oracle(pdf)
    # Tolerance (l1), from the noise law and the sampling of draws, each at 99.9%:
    # noise: P0's Laplace(1/eps) on the sum over n persons -> Gamma(k, 1/eps)/n, doubled by the
    # projection; P1/P2 read 75% of the persons and add a centre and count, bounded by the same
    # form with their released scale over 0.75 n (plus 0.1 for the clipping bias and centre);
    # sampling: Bretagnolle-Huber-Carol for n*M pooled draws plus persons' split (P1/P2).
    if estimator == "P0":
        noise_l1 = 2 * stats.gamma.ppf(0.999, k, scale=1 / 2.0) / n
    else:
        n_f = 0.75 * n
        q = stats.gamma.ppf(0.999, k, scale=row.noise_scale) if estimator == "P1" else math.sqrt(k * stats.chi2.ppf(0.999, k)) * row.noise_scale
        noise_l1 = 2 * q / n_f + 0.1
    sampling_l1 = math.sqrt(2 * (k * math.log(2) + math.log(1000)) / (n * M)) * (1 if estimator == "P0" else 2)
    err = np.abs(est - exact).sum()
    assert err <= noise_l1 + sampling_l1, (err, noise_l1, sampling_l1)
    back = read_delta(str(tmp_path / "releases")).to_pylist()
    assert len(back) == 1 and back[0]["estimate"] == pytest.approx(row.estimate)
    assert back[0]["kind"] == "distribution" and back[0]["columns"] == ["dest"]
    # nothing non-private: parameters hold only the public plan and DP by-products
    public = {"estimator", "estimator_name", "categories", "k", "m", "beta", "eta", "omega", "eta_omega_use",
              "short_persons", "budget_mode", "stages"}
    dp = {"noisy_person_count", "laplace_scale_of_sum", "gaussian_sigma_of_sum", "center",
          "center_noisy_person_count", "center_error_bound_l1", "radius", "radius_norm", "count_weight"}
    assert set(params) <= public | dp, set(params) - public - dp


def test_spark_and_numpy_releases_agree(spark, flights_sample):
    """Same salt, same seed, same plan: the Spark batches equal the twin's, so releases equal."""
    from spark_jobs.spark.batches import SparkBatchAggregates, person_batches

    path, pdf = flights_sample
    cfg = make_config(path, "/tmp/unused", "P1", record_label_columns=LABEL_COLS)
    plan = statistic_plan(cfg, cfg.statistics[0])
    salt = "c3" * 32
    records = spark.read.parquet(str(path))
    sb = person_batches(records, "tailnum", "dest", AIRPORTS, M, salt, LABEL_COLS, ["NA", ""]).persist()
    try:
        s_rel = private_distribution(SparkBatchAggregates(sb, plan.k, M), plan, SeededNoise(9), Accountant(plan.budget))
    finally:
        sb.unpersist()
    d = pdf[pdf.tailnum.notna() & ~pdf.tailnum.isin(["NA", ""])]
    labels = [
        json.dumps({c: (int(v) if c == "flight" else v) for c, v in zip(LABEL_COLS, row)}, separators=(",", ":"))
        for row in d[LABEL_COLS].itertuples(index=False)
    ]
    twin = NumpyBatches(d.tailnum.tolist(), d.dest.tolist(), labels, AIRPORTS, M, salt)
    n_rel = private_distribution(twin, plan, SeededNoise(9), Accountant(plan.budget))
    assert np.array_equal(s_rel.estimate, n_rel.estimate)
    assert s_rel.parameters == n_rel.parameters


def test_dry_run_plan_and_config_errors(tmp_path):
    cfg = make_config("x.parquet", tmp_path, "P2")
    text = plan_job(cfg).render()
    assert "distribution over k=21" in text and "estimator P2" in text and "centre (pooled laplace)" in text
    assert "total cost (composed): epsilon=2, delta=1e-06" in text
    for opts, field in (
        ({"categories": []}, "categories"),
        ({"categories": ["JFK", "JFK"]}, "categories"),
        ({"m": 0}, "m"),
        ({"estimator": "P4"}, "estimator"),
        ({"eta": 0.9}, "eta"),
    ):
        with pytest.raises(ConfigError, match=field):
            make_config("x.parquet", tmp_path, **opts)
    with pytest.raises(ConfigError, match="delta"):
        make_config("x.parquet", tmp_path, "P2", delta=0.0)
    with pytest.raises(ConfigError, match="epsilon"):
        make_config("x.parquet", tmp_path, epsilon=0.0)
