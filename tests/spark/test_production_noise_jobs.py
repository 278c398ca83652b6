"""Every estimator the job supports, run end to end through the PRODUCTION noise source (no
noise argument: ``production_noise()``, OpenDP), on one small dataset and the shared Spark
session (issue 19: P3 crashed on every production run, after its budget was reserved, because
no test reached that path; this file guards all the others).

Three job runs (one per budget type, so that every code path of the estimators is taken:
pure, approximate, BHS23), each with one statistic per estimator. For every row: the secure
source drew it; the status is one the estimator documents; its cost is the plan's; an OK
estimate is finite, has its documented shape and lies near the exact dataset statistic (loose
tolerances: these are smoke tests of the production path, the seeded statistical tests
measure accuracy). BHS23 needs tens of thousands of persons at these budgets, so at this n its
kinds release the documented FAIL (charged, no estimate)."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from dplib.mechanisms import SecureNoise
from spark_jobs.job import plan_job, run_job
from spark_jobs.query import read_delta

from jobcfg import job_config

pytestmark = pytest.mark.spark

N_PERSONS = 1000
RECORDS = 10
CATS = ["a", "b"]  # k = 3 with OTHER ("c")
CAT_TRUTH = np.array([0.5, 0.3, 0.2])  # every person: 5 "a", 3 "b", 2 "c"


def dist(estimator, **opts):
    return {"kind": "distribution", "columns": ["cat"],
            "options": {"categories": CATS, "m": RECORDS, "estimator": estimator, **opts}}


# job -> (budget (epsilon, delta), {statistic name: statistic}); shares are equal
JOBS = {
    "pure": ((8.75, 0.0), {  # 0.875 each
        "count": {"kind": "count", "columns": ["x"]},
        # declared bounds (the person means of x ~ N(5, 2^2): +-5 sds, nothing clamped in practice)
        "mean_bounds": {"kind": "mean", "columns": ["x"], "options": {"bounds": [-5.0, 15.0]}},
        "median": {"kind": "quantile", "columns": ["x"], "options": {"q": 0.5}},
        "mean_scale_free": {"kind": "mean", "columns": ["x"], "options": {"k": 4}},
        "mean_with_scale": {"kind": "mean", "columns": ["x"], "options": {"scale": 2.0, "range_bound": 100.0}},
        "dist_P0": dist("P0"),
        "dist_P1": dist("P1"),
        "dist_P3": dist("P3", alpha=0.3),
        "dist_shares": {"kind": "distribution", "columns": ["cat"], "options": {"categories": CATS}},
        "sum": {"kind": "sum", "columns": ["y"]},
    }),
    "approx": ((24.0, 8e-6), {  # 3.0 each: at 1,000 persons and epsilon 1 the multivariate mean
        # released INSUFFICIENT_DATA in 6 of 10 runs; at 2 or 3 in none of 300
        "mean_scale_free": {"kind": "mean", "columns": ["x"], "options": {"k": 4}},
        "mean_with_scale": {"kind": "mean", "columns": ["x"], "options": {"scale": 2.0}},
        "mean_bounds": {"kind": "mean", "columns": ["x"], "options": {"bounds": [-5.0, 15.0]}},
        "multivariate_mean": {"kind": "multivariate_mean", "columns": ["x", "y"], "options": {"k": 4}},
        "dist_P2": dist("P2"),
        "variance": {"kind": "variance", "columns": ["x"]},
        "stddev": {"kind": "stddev", "columns": ["x"]},
        # the default estimator 'auto': epsilon 3 is outside BHS23's range, so the clipped branch
        "covariance_auto": {"kind": "covariance", "columns": ["x", "y"]},
    }),
    # BHS23's algorithms need epsilon < 1 and delta < epsilon / 1000 per statistic
    "bhs23": ((2.7, 3e-6), {
        "mean_affine": {"kind": "mean_affine", "columns": ["x", "y"], "options": {"lambda0": 10.0}},
        "covariance": {"kind": "covariance", "columns": ["x", "y"], "options": {"lambda0": 4.0, "estimator": "bhs23"}},
        "gaussian": {"kind": "gaussian", "columns": ["x", "y"], "options": {"lambda0": 10.0}},
    }),
}
STATUSES = {"count": {"OK"}, "quantile": {"OK"}, "mean": {"OK"}, "multivariate_mean": {"OK"}, "distribution": {"OK"},
            "mean_affine": {"OK", "FAIL"}, "covariance": {"OK", "FAIL"}, "gaussian": {"OK", "FAIL"},
            "variance": {"OK"}, "stddev": {"OK"}, "sum": {"OK"}}


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    """N_PERSONS persons x RECORDS records: numeric x, y around a person mean (person means
    N((5, -3), diag(4, 1))), and the same category counts for everyone."""
    rng = np.random.default_rng(11)  # the data only; the releases' noise is not seeded
    mu = rng.normal([5.0, -3.0], [2.0, 1.0], size=(N_PERSONS, 2))
    vals = np.repeat(mu, RECORDS, axis=0) + rng.normal(0.0, 1.0, size=(N_PERSONS * RECORDS, 2))
    pdf = pd.DataFrame({
        "pid": np.repeat([f"id{i}" for i in range(N_PERSONS)], RECORDS),
        "x": vals[:, 0], "y": vals[:, 1],
        "cat": (["a"] * 5 + ["b"] * 3 + ["c"] * 2) * N_PERSONS,
    })
    path = tmp_path_factory.mktemp("production") / "records.parquet"
    pdf.to_parquet(path, index=False)
    means = pdf.groupby("pid")[["x", "y"]].mean()
    # the exact statistics of the new kinds: population variance of the person means of x, and
    # the sum over persons of their totals of y (= the sum of all records: every record counts)
    extra = {"variance": float(np.var(means["x"].to_numpy())), "sum": float(pdf["y"].sum()),
             "covariance": np.cov(means[["x", "y"]].to_numpy().T, bias=True)}
    return str(path), means.mean().to_numpy(), extra


def config(path, out, job):
    (eps, delta), stats = JOBS[job]
    share = 1.0 / len(stats)
    return job_config(f"production-{job}", path, [{"name": name, "share": share, **stat} for name, stat in stats.items()],
                      out, epsilon=eps, delta=delta)


MEDIAN_X = 5.0  # the person means' median is within 0.1 of 5 at 1,000 persons (sd 2 / sqrt(1000) ~ 0.08)


def check_spread_or_sum(kind, est, extra):
    """variance ~4.1 (sd of the person means ~2.02; noise sd ~0.04 at the final stage's epsilon
    2.5); sum ~ -30,000 (pure job: Laplace scale (|c| + rho) / eps ~ 100 at epsilon 0.7; 5% is
    15 scales)."""
    assert est.shape == (1,)
    if kind == "variance":
        assert abs(est[0] - extra["variance"]) <= 0.15 * extra["variance"]
    elif kind == "stddev":
        assert abs(est[0] - np.sqrt(extra["variance"])) <= 0.1 * np.sqrt(extra["variance"])
    else:
        assert abs(est[0] - extra["sum"]) <= 0.05 * abs(extra["sum"])


def check_estimate(kind, est, mean_truth, extra, bar=None):
    """Shape, finiteness and a loose distance to the exact dataset statistic. The means may be
    off by more than 0.5 when their own error bar says so: a Laplace tail (pure job, the
    declared-scale mean: |error| > 0.5 in 5 of 2,000 seeded runs, its 90% bar ~0.19, i.e.
    Laplace scale ~0.08) or a profile read as heavy-tailed (the scale-free mean, 4 of 1,000,
    each inside its widened bar). Five 90% bars is a Laplace tail of ~1e-5 (none of 4,000 seeded
    runs of either beyond max(0.5, 5 bars), measured on this data and budget with the numpy
    backend and seeded noise)."""
    tol = 0.5 if bar is None else max(0.5, 5.0 * float(np.max(bar)))
    assert np.all(np.isfinite(est))
    if kind in ("variance", "stddev", "sum"):
        check_spread_or_sum(kind, est, extra)
        return
    if kind == "count":  # Laplace scale ~1.2 persons at this share: 30 is > 20 scales
        assert est.shape == (1,) and abs(est[0] - N_PERSONS) <= 30 and est[0] == round(est[0])
    elif kind == "quantile":  # the median of the person means of x (~N(5, 2^2 + 1/10))
        assert est.shape == (1,) and abs(est[0] - MEDIAN_X) <= 0.5
    elif kind == "mean":
        assert est.shape == (1,) and abs(est[0] - mean_truth[0]) <= tol
    elif kind in ("multivariate_mean", "mean_affine"):
        assert est.shape == (2,) and np.all(np.abs(est - mean_truth) <= 0.5)
    elif kind == "distribution":
        assert est.shape == (3,) and np.all(est >= 0) and math.isclose(est.sum(), 1.0)
        assert 0.5 * np.abs(est - CAT_TRUTH).sum() <= 0.05
    elif kind == "covariance":
        c = est.reshape(2, 2)
        assert np.allclose(c, c.T) and np.all(np.linalg.eigvalsh(c) >= -1e-9)
        if extra.get("clipped"):  # the clipped branch at epsilon 3
            # numpy twin of this data and plan, 200 seeded runs: relative Frobenius median 0.047,
            # max 0.44 (a coordinate scale 3-4x off at stage 1 amplifies the noise; its bars widen
            # with it), worst |error| / 90% bar over the entries 1.52 (99th percentile 1.04)
            true = extra["covariance"]
            assert np.linalg.norm(c - true) / np.linalg.norm(true) <= 0.6
            assert bar is not None and np.all(np.abs(c - true) <= 3.0 * np.array(bar).reshape(2, 2))
    else:  # gaussian: the mean row, then the covariance
        assert est.shape == (6,) and np.all(np.abs(est[:2] - mean_truth) <= 0.5)


@pytest.mark.parametrize("job", list(JOBS))
def test_production_noise_job(spark, records, tmp_path, job):
    path, mean_truth, extra = records
    cfg = config(path, tmp_path, job)
    plan = plan_job(cfg)
    costs = {c.stage.split(": ")[0] for c in plan.charges}
    assert costs == set(JOBS[job][1])
    result = run_job(cfg, spark=spark)  # the production noise source
    rows = {r.statistic: r for r in result.rows}
    assert set(rows) == set(JOBS[job][1])
    # epsilon: every statistic spends its share; delta: the scale-free mean's range retry (and its
    # delta half) runs only on small data, so the realised delta may be below the plan's
    assert result.epsilon_spent == pytest.approx(plan.cost[0])
    assert 0.0 <= result.delta_spent <= plan.cost[1] * (1 + 1e-12)
    assert read_delta(result.table_path, {"run_id": result.run_id}).num_rows == len(rows)
    for name, row in rows.items():
        kind = JOBS[job][1][name]["kind"]
        assert row.noise_source == SecureNoise.name, name
        assert row.status in STATUSES[kind], (name, row.status)
        if row.status == "OK":
            params = json.loads(row.parameters)
            chosen = params.get("estimator_choice", {}).get("chosen")
            if name == "covariance_auto":
                assert chosen == "clipped" and "epsilon must be in" in params["estimator_choice"]["reason"]
            check_estimate(kind, np.array(row.estimate, dtype=float), mean_truth,
                           {**extra, "clipped": chosen == "clipped"}, row.error_bar)
        else:  # BHS23 below its gate (or a failed PTR): charged, no estimate, n0 released
            assert row.estimate is None and "n0" in json.loads(row.parameters), name


def _one_statistic_config(job_name, path, name, kind, columns, out):
    """A job of one statistic (the whole budget: epsilon 1, delta 1e-6)."""
    return job_config(job_name, path, [{"name": name, "kind": kind, "columns": list(columns), "share": 1.0}], out)


def test_multivariate_mean_second_range_retry_through_the_job(spark, tmp_path):
    """The multivariate mean's second range retry (issue 18: small data, one coordinate spread
    over many octaves) through a job with the production noise source. 1,000 persons, d = 4,
    coordinate sds (1, 10, 0.1, 3): seeded, the first run misses all four coordinates, the retry
    the sd-10 one (its fullest magnitude bucket ~245 persons against a threshold ~340, five
    Laplace scales), the second retry finds it (threshold ~70); so with production noise the
    second retry runs in all but ~1% of runs. Then a release within five of its own 90% bars of
    the exact mean of person means (worst of 300 numpy runs with the secure source: 1.29 bars),
    the whole epsilon charged."""
    rng = np.random.default_rng(12)
    units = np.array([1.0, 10.0, 0.1, 3.0])
    mu = 5.0 + rng.standard_normal((1_000, 4)) * units
    pdf = pd.DataFrame(np.repeat(mu, 2, axis=0), columns=["a", "b", "c", "e"])
    pdf.insert(0, "pid", np.repeat([f"p{i}" for i in range(1_000)], 2))
    path = tmp_path / "small.parquet"
    pdf.to_parquet(path, index=False)
    cfg = _one_statistic_config("production-retry2", path, "mv", "multivariate_mean", ["a", "b", "c", "e"], tmp_path / "out")
    result = run_job(cfg, spark=spark)
    (row,) = result.rows
    params = json.loads(row.parameters)
    assert row.noise_source == SecureNoise.name and row.status == "OK"
    assert result.epsilon_spent == pytest.approx(1.0)
    # with the secure source (numpy twin, 300 runs): [1] in 298, [1, 3] in 1, no second retry in 1
    if params.get("range_retried_twice_coordinates") is not None:
        assert 1 in params["range_retried_twice_coordinates"] and params["range_retried"] is True
    # version 10's flags reach the table's parameters, and set tail_flag when they fire
    assert isinstance(params["unseen_flag"], bool) and isinstance(params["far_unconfirmed_flag"], bool)
    assert params["tail_flag"] or not (params["unseen_flag"] or params["far_unconfirmed_flag"])
    est, bar = np.array(row.estimate, dtype=float), np.array(row.error_bar, dtype=float)
    exact = mu.mean(axis=0)
    assert est.shape == (4,) and np.all(np.isfinite(bar))
    assert np.all(np.abs(est - exact) <= 5.0 * bar), (est - exact, bar)


def test_pure_dp_mean_beyond_the_exponent_range_stops_before_the_fine_stage_through_the_job(spark, tmp_path):
    """Issue 20 (confident wrong answers) through a job with the production noise source: delta = 0
    and person means near 3e25, beyond the pure range stage's default 2^60 (~1.2e18; inside the
    summary's record clamp of ~3.2e29). Most persons lie above the deviation histogram's top (a DP
    share), so the statistic stops with INSUFFICIENT_DATA before its fine stage, which is neither
    run nor charged; the row names options.exponent_range. Then the same data with
    ``exponent_range: [75, 95]`` (2^75..2^95 covers 3e25) releases OK within 1% of the exact mean
    of person means."""
    rng = np.random.default_rng(5)
    mu = 1e25 * (3.0 + rng.standard_normal(3_000))
    pdf = pd.DataFrame({"pid": np.repeat([f"p{i}" for i in range(3_000)], 2), "v": np.repeat(mu, 2)})
    path = tmp_path / "huge.parquet"
    pdf.to_parquet(path, index=False)

    def run(options, name):
        cfg = job_config(name, path, [{"name": "m", "kind": "mean", "columns": ["v"], "share": 1.0, "options": options}],
                         tmp_path / name, epsilon=1.0, delta=0.0)
        result = run_job(cfg, spark=spark)
        (row,) = result.rows
        assert row.noise_source == SecureNoise.name
        return result, row

    result, row = run({}, "beyond-range")
    assert row.status == "INSUFFICIENT_DATA" and row.estimate is None and row.error_bar is None
    assert "options.exponent_range" in row.error_covers
    params = json.loads(row.parameters)
    assert params["profile_overflow_share"] > 0.5
    assert row.epsilon < 0.5 and result.epsilon_spent == pytest.approx(row.epsilon)  # no fine stage charged
    _, row = run({"exponent_range": [75, 95]}, "inside-range")
    # within its own 90% bar's 3x (a fixed 1% failed once in CI: 1.4% off with production noise)
    # and a bar that is itself useful: numpy twin of this data and plan with the secure source
    # (build/scratch/pure_range_twin.py, 400 runs, 2026-12-05): bar / mean median 0.0016, 95th
    # percentile 0.0033, above 0.05 in 2 runs (max 0.32: a cold CI run met one at 0.12 against a
    # former 0.05 bound), |error| / bar at most 2.47
    assert row.status == "OK" and row.error_bar[0] < 0.5 * float(mu.mean())
    assert abs(row.estimate[0] - float(mu.mean())) <= 3.0 * row.error_bar[0]


def test_small_data_path_through_the_job(spark, tmp_path):
    """The scale-free stages' small-data path (issue 18: after the range retry, ~100-400 persons at
    epsilon 1) through a job with the production noise source, for the three kinds that run it:
    mean, sum, variance. 150 persons x 4 records N(5, 1) (person means sd 0.5). Tolerances from the
    numpy twin (100 persons, 60-80 seeded runs): mean median error 0.025 for a spread 0.32, its
    misses either flagged or within 5 bars; sum median relative error 0.018; variance 0.28. The
    tolerances come from 400 seeded numpy runs of this data's twin (mean: 1 run more than 0.3
    off after the far-bin guard, 7 before it, all of them within their bars or flagged; sum: worst
    18% off; variance: at most 2.4x the exact, and 0 in 0.5%)."""
    rng = np.random.default_rng(8)
    n, m = 150, 4
    v = rng.normal(5.0, 1.0, (n, m))
    pdf = pd.DataFrame({"pid": np.repeat([f"s{i}" for i in range(n)], m), "v": v.reshape(-1)})
    path = tmp_path / "small.parquet"
    pdf.to_parquet(path, index=False)
    means = v.mean(axis=1)
    stats = [{"name": name, "kind": kind, "columns": ["v"], "share": 1 / 3}
             for name, kind in (("m", "mean"), ("s", "sum"), ("var", "variance"))]
    cfg = job_config("small-data", path, stats, tmp_path / "small-out", epsilon=3.0, delta=3e-6)
    result = run_job(cfg, spark=spark)
    rows = {r.statistic: r for r in result.rows}
    assert result.epsilon_spent <= 3.0 * (1 + 1e-12)
    for name, row in rows.items():
        assert row.noise_source == SecureNoise.name, name
        assert row.status == "OK", (name, row.status, row.error_covers)
        params = json.loads(row.parameters)
        assert params["range_retried"] is True, name  # 150 persons at epsilon 1: the retry ran
    mp = json.loads(rows["m"].parameters)
    assert mp["small_data"] is True and mp["tail_balanced"] is None  # no tail balance on small data
    est, bar = rows["m"].estimate[0], rows["m"].error_bar
    tol = 0.5 if bar is None else max(0.25, 5.0 * bar[0])
    assert abs(est - means.mean()) <= tol
    assert abs(rows["s"].estimate[0] - v.sum()) <= 0.25 * v.sum()
    assert 0.0 <= rows["var"].estimate[0] <= 3.0 * means.var()


def test_zero_inflated_mean_retries_its_range_through_the_job(spark, tmp_path):
    """A zero-inflated column (4,000 persons x 2 records; 92% of persons all zeros, the rest
    Gamma(3, 5)) through a job with the production noise source: the first range run releases
    only the zero bucket, so the retry runs (its window then reaches the other persons' buckets,
    up to at least 16) and the mean is released near the exact one. Before the retry on a zero
    atom the release was ~0 (100% off, flagged). Tolerance from the numpy twin of this data (200
    seeded runs, 2026-12-05, the retry's 3-octave buckets): median relative error 2.0%, worst 28%,
    every run within 1.2 of its bars (the check: 1.5) or (2 runs without a bar) within 30%; the
    window reached 16 in 200 of 200."""
    rng = np.random.default_rng(21)
    n = 4_000
    mu = np.where(rng.random(n) < 0.92, 0.0, rng.gamma(3.0, 5.0, n))
    pdf = pd.DataFrame({"pid": np.repeat([f"z{i}" for i in range(n)], 2), "v": np.repeat(mu, 2)})
    path = tmp_path / "zeros.parquet"
    pdf.to_parquet(path, index=False)
    cfg = _one_statistic_config("zero-inflated", path, "m", "mean", ["v"], tmp_path / "zeros-out")
    result = run_job(cfg, spark=spark)
    (row,) = result.rows
    assert row.noise_source == SecureNoise.name
    assert row.status == "OK", row.error_covers
    params = json.loads(row.parameters)
    assert params["range_retried"] is True and params["range_upper"] >= 16.0
    assert result.epsilon_spent <= 1.0 * (1 + 1e-12)
    tol = 0.3 * float(mu.mean()) if row.error_bar is None else 1.5 * row.error_bar[0]
    assert abs(row.estimate[0] - float(mu.mean())) <= tol


def test_zero_floor_releases_no_bar_through_the_job(spark, tmp_path):
    """A column at exactly 0 for ~97% of 2,000 persons (2 records each), through a job with the
    production noise source: mean, sum and variance at epsilon 0.3 each. No range run sees the
    other 3% at this budget, so each range stays at the zero floor: before, the mean released 0
    with a bar of ~5e-302 against an exact mean of ~0.02 (sometimes unflagged); now each releases
    no bar, flagged, naming the column. Numpy twin of this data and plan: the zero floor, no bar
    and the flag in 200 of 200 seeded runs of each statistic."""
    rng = np.random.default_rng(23)
    n = 2_000
    mu = np.where(rng.random(n) > 0.97, rng.lognormal(-1.5, 1.5, n), 0.0)
    pdf = pd.DataFrame({"pid": np.repeat([f"a{i}" for i in range(n)], 2), "v": np.repeat(mu, 2)})
    path = tmp_path / "mostly_zero.parquet"
    pdf.to_parquet(path, index=False)
    cfg = job_config("zero-floor", path, [{"name": k, "kind": k, "columns": ["v"], "share": 1 / 3} for k in ("mean", "sum", "variance")],
                     tmp_path / "zero-floor-out", epsilon=0.9, delta=1e-6)
    result = run_job(cfg, spark=spark)
    assert len(result.rows) == 3
    for row in result.rows:
        assert row.noise_source == SecureNoise.name and row.status == "OK", row.error_covers
        assert row.error_bar is None and row.flagged is True, (row.statistic, row.error_bar)
        shown = "v (each person's total)" if row.statistic == "sum" else "v"
        assert row.error_covers.startswith(f"nothing: {shown}: most persons are 0"), row.error_covers
        assert json.loads(row.parameters)["zero_atom"] is True
    assert result.epsilon_spent <= 0.9 * (1 + 1e-12)


def test_pooled_range_retry_through_the_job(spark, tmp_path):
    """150 persons (x 3 records) whose means are spread over ~6 octaves (lognormal, log-sd 1):
    neither thresholded range run releases a bucket, the pooled retry (pure, 4-octave buckets)
    does, through a job with the production noise source; released within 1.5 of its bars, or
    without a bar and flagged (numpy twin, 100 seeded runs: all released, no bar missed, median
    relative error 19%)."""
    rng = np.random.default_rng(41)
    mu = np.exp(rng.normal(3.5, 1.0, 150))
    pdf = pd.DataFrame({"pid": np.repeat([f"f{i}" for i in range(150)], 3), "v": np.repeat(mu, 3)})
    path = tmp_path / "spread.parquet"
    pdf.to_parquet(path, index=False)
    result = run_job(_one_statistic_config("pooled-retry", path, "m", "mean", ["v"], tmp_path / "spread-out"), spark=spark)
    (row,) = result.rows
    assert row.noise_source == SecureNoise.name
    assert row.status == "OK", row.error_covers
    params = json.loads(row.parameters)
    assert params["range_pooled_retry"] is True and params["small_data"] is True
    assert result.epsilon_spent == pytest.approx(1.0)
    if row.error_bar is None:
        assert params["tail_flag"] is True and abs(row.estimate[0] - float(mu.mean())) <= 0.6 * float(mu.mean())
    else:
        assert abs(row.estimate[0] - float(mu.mean())) <= 1.5 * row.error_bar[0]


def test_variance_without_a_bar_through_the_job(spark, tmp_path):
    """Skewed, light person means (Gamma(4, 3) for 4,000 persons, 2 records each) with variance and
    stddev at epsilon 1 each, through a job with the production noise source. The deviation
    profile fits the folded one-sided tail heavier than x^-2 or the tail balance reads one long
    tail: then the release has no bar, is flagged, says why and states the noise alone's 90%
    half-width (parameters.noise_quantile). Numpy twin of this data and plan, 200 seeds: no bar
    and flagged in 198 (110 no finite bound, 88 one long tail), an unflagged bar in 2; relative
    error median 0.020, largest 0.47."""
    rng = np.random.default_rng(31)
    n = 4_000
    mu = rng.gamma(4.0, 3.0, n)
    pdf = pd.DataFrame({"pid": np.repeat([f"g{i}" for i in range(n)], 2), "v": np.repeat(mu, 2)})
    path = tmp_path / "gamma.parquet"
    pdf.to_parquet(path, index=False)
    cfg = job_config("variance-no-bar", path, [{"name": k, "kind": k, "columns": ["v"], "share": 0.5} for k in ("variance", "stddev")],
                     tmp_path / "variance-no-bar-out", epsilon=2.0, delta=1e-6)
    result = run_job(cfg, spark=spark)
    exact = {"variance": float(mu.var()), "stddev": float(mu.std())}
    assert len(result.rows) == 2
    for row in result.rows:
        p = json.loads(row.parameters)
        assert row.noise_source == SecureNoise.name and row.status == "OK", row.error_covers
        want = exact[row.statistic]
        assert abs(row.estimate[0] - want) <= 0.75 * want, (row.statistic, row.estimate, want)
        if row.error_bar is None:
            assert row.flagged is True and p["tail_flag"] is True
            assert row.error_covers.startswith(("nothing: the persons' means have one long tail",
                                                "nothing: the deviation profile gives no finite bound",
                                                "nothing: most persons' means sit at one value",
                                                "nothing: about")), row.error_covers
            assert "The noise alone spans" in row.error_covers and 0 < p["noise_quantile"] < math.inf
        else:  # the twin's 1%: an unflagged bar, which covered there
            assert abs(row.estimate[0] - want) <= 1.5 * row.error_bar[0], (row.statistic, row.error_bar)
    assert result.epsilon_spent <= 2.0 * (1 + 1e-12)


def test_mean_centre_zoom_through_the_job(spark, tmp_path):
    """The scale-free mean's centre zoom (stage 2b) through a job with the production noise
    source: 5,000 persons whose means (N(5.2, 0.1^2), 3 records each) are far narrower than the
    centre histogram's bins (range [4, 8]: bins of 0.5), epsilon 1. The bulk sits in one or two
    centre bins (pair share ~0.99 against the 0.8 it needs; Laplace scale 25 persons a bin), so
    the zoom runs (charged 0.03 before its histogram) and is kept (its 7 top bins hold ~all of the
    first one's persons: the ratio of the two noisy sums is ~1 +- 0.03 against the 0.8 it needs;
    at 1,000 persons +- 0.16, kept in ~90% of runs); the release lies within five of its own 90%
    bars of the exact mean of person means, the whole epsilon charged."""
    from dplib.mean.scale_free_stages import ZOOM_SHARE

    rng = np.random.default_rng(14)
    mu = rng.normal(5.2, 0.1, size=5_000)
    vals = np.repeat(mu, 3) + rng.normal(0.0, 0.05, size=15_000)
    pdf = pd.DataFrame({"pid": np.repeat([f"p{i}" for i in range(5_000)], 3), "z": vals})
    path = tmp_path / "narrow.parquet"
    pdf.to_parquet(path, index=False)
    cfg = _one_statistic_config("production-zoom", path, "m", "mean", ["z"], tmp_path / "out")
    result = run_job(cfg, spark=spark)
    (row,) = result.rows
    assert row.noise_source == SecureNoise.name and row.status == "OK"
    params = json.loads(row.parameters)
    assert params["centre_zoom"] == "kept"
    # charged: the fine stage got at most what range, centre, zoom and profile left (less the
    # tail balance's 0.05 when it ran)
    assert params["fine_epsilon"] <= 1.0 - 0.04 - 0.04 - ZOOM_SHARE - 0.10 + 1e-9
    exact = float(pdf.groupby("pid")["z"].mean().mean())
    assert abs(row.estimate[0] - exact) <= 5.0 * float(np.max(row.error_bar))
    assert result.epsilon_spent == pytest.approx(1.0)


def _uniform_means_job(tmp_path, job_name, cols, n, seed, extra=()):
    """``n`` persons with one record each, every column uniform on 5 +- sqrt 3 (person-mean sd 1),
    and a job of one scale-free mean per column, plus ``extra`` (kind, column) statistics, at
    epsilon 1 and delta 1e-6 each."""
    rng = np.random.default_rng(seed)
    pdf = pd.DataFrame({"pid": [f"p{i}" for i in range(n)],
                        **{c: rng.uniform(5.0 - np.sqrt(3.0), 5.0 + np.sqrt(3.0), n) for c in cols}})
    path = tmp_path / "uniform.parquet"
    pdf.to_parquet(path, index=False)
    specs = [("mean", c) for c in cols] + list(extra)
    k = len(specs)
    stats = [{"name": c if kind == "mean" else f"{kind}_{c}", "kind": kind, "columns": [c], "share": 1.0 / k}
             for kind, c in specs]
    return pdf, job_config(job_name, path, stats, tmp_path / "out", epsilon=float(k), delta=k * 1e-6)


def test_mean_sharp_end_through_the_job(spark, tmp_path):
    """The scale-free mean's sharp end (version 13) through a job with the production noise source:
    two columns of uniform person means (30,000 persons, one record each, 5 +- sqrt 3, sd 1), each
    a statistic at epsilon 1. The profile ends in the bin holding the column's end; the rule fires
    in ~97% of runs (numpy, 100 seeds), so in at least one of the two statistics in all but ~0.1%
    of jobs; where it fires the radius is that bin's top, 2.0 (version 12: 3.0), and every release
    lies within five of its own 90% bars of the exact mean (100 of 100 numpy runs)."""
    pdf, cfg = _uniform_means_job(tmp_path, "production-sharp-end", ("u1", "u2"), 30_000, 15)
    result = run_job(cfg, spark=spark)
    fired = 0
    for row in result.rows:
        assert row.noise_source == SecureNoise.name and row.status == "OK"
        params = json.loads(row.parameters)
        col = row.statistic
        if params["sharp_end"]:
            fired += 1
            # the reach's bin top, grown by the median step's shift (nothing clipped around c')
            assert params["clipping_radius"] - abs(params["centre_shift"]) <= 2.0 + 1e-9, params["clipping_radius"]
        assert abs(row.estimate[0] - float(pdf[col].mean())) <= 5.0 * float(np.max(row.error_bar))
    assert fired >= 1
    assert result.epsilon_spent == pytest.approx(2.0)


def test_overflow_check_through_the_job(spark, tmp_path):
    """The overflow check (scale-free mean version 14, and the sum and variance on the same
    stages) through a job with the production noise source: three columns of 3,001 persons'
    N(10, 1) means, 1% of the persons of each at +-1e20 (30 persons: the profile's one-bin test,
    35 persons at epsilon 1, flags ~30% of runs; the check runs in ~60%), eight statistics at
    epsilon 1 each, so that the check runs in at least one in all but 0.4^8 < 0.1% of jobs. Where
    it runs, it was charged within the statistic's budget and a confirmation flags the release."""
    rng = np.random.default_rng(16)
    n = 3001
    cols = {}
    for c in ("a", "b", "c"):
        v = rng.normal(10.0, 1.0, n)
        far = rng.choice(n, size=30, replace=False)
        v[far] = rng.choice([-1.0, 1.0], size=30) * 1e20
        cols[c] = v
    pdf = pd.DataFrame({"pid": [f"p{i}" for i in range(n)], **cols})
    path = tmp_path / "far.parquet"
    pdf.to_parquet(path, index=False)
    stats = [{"name": f"{c}_{kind}", "kind": kind, "columns": [c], "share": 1 / 8}
             for c in ("a", "b") for kind in ("mean", "sum", "variance")]
    stats += [{"name": f"c_{kind}", "kind": kind, "columns": ["c"], "share": 1 / 8} for kind in ("mean", "sum")]
    cfg = job_config("production-overflow-check", path, stats,
                     tmp_path / "out", epsilon=8.0, delta=8e-6)
    result = run_job(cfg, spark=spark)
    ran = 0
    for row in result.rows:
        assert row.noise_source == SecureNoise.name and row.status == "OK", (row.statistic, row.status)
        assert row.epsilon == pytest.approx(1.0)
        params = json.loads(row.parameters)
        planned = [s["stage"] for s in params["stages"]]
        assert any(s.endswith("overflow check") for s in planned)  # listed in the public plan
        check = params.get("overflow_check")
        if check is not None:
            ran += 1
            assert check in ("confirmed: flagged", "not confirmed")
            if check.startswith("confirmed"):
                assert row.flagged is True and params["tail_flag"] is True
    assert ran >= 1
    assert result.epsilon_spent == pytest.approx(8.0)


def test_median_step_and_centre_boost_through_the_job(spark, tmp_path):
    """The median step and the centre boost (scale-free mean version 15) through a job with the
    production noise source: three columns of uniform person means (700 persons, one record each,
    5 +- sqrt 3), each a statistic at epsilon 1, and the sum and variance of the first (same stages,
    so the same boost; no median step in them). Stage 1's DP count x epsilon (~700) is under 800:
    the centre is charged 0.12 (stages_run, from the accountant). The centre histogram is flat, so
    its centre sits ~0.4-0.6 sd off the median; where the tail balance ran, its side counts move
    the fine stage's centre (fine_center = coarse_center + centre_shift) toward the median
    (numpy, 30 seeds: 0.38 -> 0.11 sd in median), in at least one of the three statistics in all
    but a tiny share of jobs; every release lies within five of its own 90% bars of the exact
    mean, the whole epsilon charged."""
    pdf, cfg = _uniform_means_job(tmp_path, "production-median-step", ("a", "b", "c"), 700, 16,
                                  extra=(("sum", "a"), ("variance", "a")))
    result = run_job(cfg, spark=spark)
    # the sum and the variance run the same stages: boosted centre, charged 0.12, then OK releases
    # whose bars cover within five bars of the exact statistic
    others = {r.statistic: r for r in result.rows if r.statistic in ("sum_a", "variance_a")}
    assert set(others) == {"sum_a", "variance_a"}
    for name, row in others.items():
        assert row.noise_source == SecureNoise.name and row.status == "OK", (name, row.status)
        params = json.loads(row.parameters)
        assert params["centre_boosted"] is True
        centre = [st for st in params["stages_run"] if st["stage"].endswith("centre")]
        assert len(centre) == 1 and centre[0]["epsilon"] == pytest.approx(0.12)
    exact = {"sum_a": float(pdf["a"].sum()), "variance_a": float(pdf["a"].var(ddof=0))}
    for name, row in others.items():
        if row.error_bar is None:  # no bar only when flagged (e.g. a one-sided reading, ~5% of runs)
            assert json.loads(row.parameters)["tail_flag"] is True, name
        else:
            assert abs(row.estimate[0] - exact[name]) <= 5.0 * float(np.max(row.error_bar)), name
    moved = 0
    for row in (r for r in result.rows if r.statistic in ("a", "b", "c")):
        assert row.noise_source == SecureNoise.name and row.status == "OK"
        params = json.loads(row.parameters)
        assert params["centre_boosted"] is True
        centre = [st for st in params["stages_run"] if st["stage"].endswith("centre")]
        assert len(centre) == 1 and centre[0]["epsilon"] == pytest.approx(0.12)
        assert params["fine_center"] == pytest.approx(params["coarse_center"] + params["centre_shift"])
        if params["centre_shift"] != 0.0:  # only from the tail balance's release
            assert any(st["stage"].endswith("tail balance") for st in params["stages_run"])
            moved += 1
            med = float(pdf[row.statistic].median())
            assert abs(params["fine_center"] - med) < abs(params["coarse_center"] - med) + 0.2
        assert abs(row.estimate[0] - float(pdf[row.statistic].mean())) <= 5.0 * float(np.max(row.error_bar))
    assert moved >= 1
    assert result.epsilon_spent == pytest.approx(5.0)


def test_far_group_is_flagged_by_the_clipped_count_through_the_job(spark, tmp_path):
    """Issue 20 (no confident wrong answers) through a job with the production noise source: 2% of
    10,000 persons 15 sd above the bulk, on one side (their profile bins isolated from the bulk's
    run, so no tail model counts them). Before the clipped-persons check the mean and the variance
    released OK, unflagged, with bars that missed (numpy twin: 12 of 12 runs each); now the final
    stage's split count sees ~200 persons beyond the radius against a noise sd of ~15-25, and both
    rows are flagged, saying why (numpy twin: 12 of 12 each)."""
    rng = np.random.default_rng(29)
    n = 10_000
    mu = rng.normal(10.0, 1.0, n)
    far = rng.choice(n, n // 50, replace=False)
    mu[far] = rng.normal(25.0, 1.0, far.size)
    pdf = pd.DataFrame({"pid": np.repeat([f"f{i}" for i in range(n)], 2), "v": np.repeat(mu, 2)})
    path = tmp_path / "far_group.parquet"
    pdf.to_parquet(path, index=False)
    cfg = job_config("far-group", path, [{"name": k, "kind": k, "columns": ["v"], "share": 0.5} for k in ("mean", "variance")],
                     tmp_path / "far-group-out", epsilon=2.0, delta=1e-6)
    result = run_job(cfg, spark=spark)
    assert len(result.rows) == 2
    for row in result.rows:
        params = json.loads(row.parameters)
        assert row.noise_source == SecureNoise.name and row.status == "OK", row.error_covers
        assert params["clipped_flag"] is True and row.flagged is True, (row.statistic, params.get("clipped_persons"))
        assert params["clipped_persons"] > params["clipped_expected"]
        assert "at or beyond the clipping radius" in row.error_covers, row.error_covers
