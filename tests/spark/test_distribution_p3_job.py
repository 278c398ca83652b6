"""kind: distribution with estimator P3 through the whole job on Spark (config -> batches -> n0
-> ranked histogram -> certified scores -> exponential mechanism -> Delta), the Spark ranked
histogram against the numpy twin with the same salt, and P3's config checks."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from dplib.distribution.batches import NumpyBatches
from dplib.errors import ConfigError
from dplib.groups import ALL_PERSONS, GroupRange
from dplib.mechanisms import SeededNoise
from spark_jobs.config import parse_config
from spark_jobs.job import plan_job, run_job
from spark_jobs.query import read_delta

pytestmark = pytest.mark.spark

AIRPORTS = ["ATL", "ORD"]  # public: two of the busiest US airports; k = 3 with OTHER
M = 10
LABEL_COLS = ["time_hour", "carrier", "flight", "origin", "dest"]


def make_config(path, out, epsilon=2.0, **opts):
    return parse_config(
        {
            "job_name": "flights-dest-p3-test",
            "input": {"path": str(path), "format": "parquet"},
            "privacy_unit": {"column": "tailnum"},
            "budget": {"epsilon": epsilon, "delta": 0.0},
            "statistics": [
                {
                    "name": "dest_p3",
                    "kind": "distribution",
                    "columns": ["dest"],
                    "share": 1.0,
                    "options": {"categories": AIRPORTS, "m": M, "estimator": "P3", "alpha": 0.3, **opts},
                }
            ],
            "output": {"path": str(out)},
            "ledger": {"enabled": False},
        }
    )


def test_p3_job_end_to_end(spark, flights_sample, tmp_path):
    path, pdf = flights_sample
    cfg = make_config(path, tmp_path, omega=0.05)
    plan = plan_job(cfg)
    assert plan.cost == (pytest.approx(2.0), 0.0)
    assert [c.stage for c in plan.charges] == ["dest_p3: person count (n0)", "dest_p3: P3 exponential mechanism"]
    assert "grid G=20 (231 points)" in plan.render()
    result = run_job(cfg, spark=spark, noise=SeededNoise(2))
    (row,) = result.rows
    assert row.algorithm == "batch-distribution-P3" and row.status == "OK"
    assert (row.epsilon, row.delta) == (pytest.approx(2.0), 0.0)
    est = np.array(row.estimate)
    assert est.shape == (3,) and np.all(est >= 0) and math.isclose(est.sum(), 1.0)
    assert np.allclose(est * 20, np.round(est * 20))  # a grid point
    assert row.error_bar is None and row.noise_scale is None
    params = json.loads(row.parameters)
    assert params["categories"] == AIRPORTS + ["OTHER"] and params["grid_resolution"] == 20
    # only public values and DP outputs in the release: no exact count, discard, score or padding flag
    allowed = {"estimator", "estimator_name", "categories", "k", "m", "beta", "eta", "omega", "eta_omega_use",
               "short_persons", "budget_mode", "stages", "p3_n_mode", "n0", "noisy_person_count",
               "count_laplace_scale", "grid_resolution", "grid_points", "alpha", "eta_priv", "tau_cov",
               "sandwich_gap_batches", "dummy_batch"}
    assert set(params) <= allowed, set(params) - allowed
    # the estimate is close to the truth (mean over aircraft with >= M flights of their dest shares)
    d = pdf[pdf.tailnum.notna() & ~pdf.tailnum.isin(["NA", ""])]
    d = d.assign(cat=np.where(d.dest.isin(AIRPORTS), d.dest, "OTHER"))
    sizes = d.groupby("tailnum").size()
    d = d[d.tailnum.isin(sizes[sizes >= M].index)]
    truth = d.groupby("tailnum").cat.value_counts(normalize=True).unstack(fill_value=0.0)
    truth = truth.reindex(columns=AIRPORTS + ["OTHER"], fill_value=0.0).mean().to_numpy()
    # loose bound: alpha-neighbourhood (0.3 in l1) + grid step + heterogeneity; catches a wrong
    # coordinate order or a constant output
    assert 0.5 * np.abs(est - truth).sum() <= 0.3
    back = read_delta(str(tmp_path / "releases")).to_pylist()
    assert len(back) == 1 and back[0]["estimate"] == pytest.approx(row.estimate)


def test_ranked_histogram_spark_equals_numpy(spark, flights_sample):
    from spark_jobs.batches import person_batches
    from spark_jobs.fixed_n import SparkFixedNBatches

    path, pdf = flights_sample
    salt = "d4" * 32
    sb = person_batches(spark.read.parquet(str(path)), "tailnum", "dest", AIRPORTS, M, salt, LABEL_COLS, ["NA", ""]).persist()
    try:
        backend = SparkFixedNBatches(sb, 3, M)
        d = pdf[pdf.tailnum.notna() & ~pdf.tailnum.isin(["NA", ""])]
        labels = [
            json.dumps({c: (int(v) if c == "flight" else v) for c, v in zip(LABEL_COLS, r)}, separators=(",", ":"))
            for r in d[LABEL_COLS].itertuples(index=False)
        ]
        twin = NumpyBatches(d.tailnum.tolist(), d.dest.tolist(), labels, AIRPORTS, M, salt)
        n = twin.counts.shape[0]
        for group in (ALL_PERSONS, GroupRange(0.2, 0.7)):
            for n0 in (1, 37, n // 2, n + 25):
                got = backend.ranked_histogram(group, n0)
                assert got == twin.ranked_histogram(group, n0)
                assert sum(got.values()) == min(n0, int(np.sum((twin.group >= int(group.lo * 2**32)) & (twin.group < int(group.hi * 2**32)))))
        assert backend.rows_collected <= 8 * len(twin.histogram(ALL_PERSONS))
    finally:
        sb.unpersist()


def test_p3_config_errors(tmp_path):
    for opts, field in (
        ({"alpha": 0.0}, "alpha"),
        ({"alpha": 0.01}, "grid points"),
        ({"grid_resolution": 0}, "grid_resolution"),
        ({"beta": 0.6}, "beta"),
    ):
        with pytest.raises(ConfigError, match=field):
            make_config("x.parquet", tmp_path, **opts)
    with pytest.raises(ConfigError, match="k <= 5"):
        parse_config(
            {
                "job_name": "j", "input": {"path": "x"}, "privacy_unit": {"column": "u"}, "budget": {"epsilon": 1.0},
                "statistics": [{"name": "s", "kind": "distribution", "columns": ["c"], "share": 1.0,
                                "options": {"categories": list("abcde"), "m": 5, "estimator": "P3"}}],
                "output": {"path": "o"}, "ledger": {"enabled": False},
            }
        )
    with pytest.raises(ConfigError, match="grid_resolution is for estimator P3"):
        make_config("x.parquet", tmp_path, estimator="P0", grid_resolution=10)
