"""The release job end to end on a flights sample: Delta written once per run, read back with
Spark SQL and with deltalake (no Spark), values checked against a pandas oracle; bad input
refused before anything is written."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dplib.errors import ConfigError, InputDataError
from dplib.mechanisms import SeededNoise
from spark_jobs.config import parse_config
from spark_jobs.query import read_delta
from spark_jobs.job import plan_job, run_job

pytestmark = pytest.mark.spark


def make_config(input_path, out, fmt="parquet", options=None, **budget):
    """Two statistics; ``options=None`` runs the scale-free estimator, {"scale": 30} the
    declared-scale one."""
    options = options or {}
    return parse_config(
        {
            "job_name": "flights-test",
            "input": {"path": str(input_path), "format": fmt, "dataset": "flights-sample"},
            "privacy_unit": {"column": "tailnum"},
            "budget": {"epsilon": 1.0, "delta": 1e-6, **budget},
            "statistics": [
                {"name": "arr", "kind": "mean", "columns": ["arr_delay"], "share": 0.5, "options": options},
                {"name": "dep", "kind": "mean", "columns": ["dep_delay"], "share": 0.5, "options": options},
            ],
            "output": {"path": str(out)},
            "ledger": {"population": "flights-aircraft", "initial_limit": {"epsilon": 1000.0, "delta": 0.5}},
        }
    )


def exact_person_mean(pdf: pd.DataFrame, col: str) -> tuple[float, int]:
    """Oracle: mean over aircraft (tailnum not NA) of each aircraft's mean of col, NaN dropped."""
    d = pdf[pdf.tailnum.notna() & ~pdf.tailnum.isin(["NA", ""]) & pdf[col].notna()]
    per = d.groupby("tailnum")[col].mean()
    return float(per.mean()), int(per.size)


def test_end_to_end_seeded(spark, flights_full, tmp_path):
    path, pdf = flights_full
    cfg = make_config(path, tmp_path)
    result = run_job(cfg, spark=spark, noise=SeededNoise(2024), run_id="run-seeded")
    assert [r.status for r in result.rows] == ["OK", "OK"]
    assert result.rows[0].algorithm == "agarwal2024-univariate-person-mean/scale-free"
    # each statistic charges its whole epsilon share; delta: half of its share to the range stage,
    # the other half only if that stage needs its retry (2,000+ persons here: it does not)
    assert result.epsilon_spent == pytest.approx(1.0) and result.delta_spent == pytest.approx(0.5e-6)

    table = str(tmp_path / "releases")
    # Read back with Spark SQL ...
    sql = spark.sql(
        f"SELECT statistic, estimate[0] AS est, error_bar[0] AS bar, epsilon, delta, status, "
        f"noise_source, privacy_unit FROM delta.`{table}` ORDER BY statistic"
    ).collect()
    assert [r.statistic for r in sql] == ["arr", "dep"]
    # ... and with deltalake, without Spark
    from deltalake import DeltaTable

    dt = DeltaTable(table)
    assert dt.version() == 0  # one commit for the whole run
    rel = read_delta(table).to_pandas().sort_values("statistic").reset_index(drop=True)
    assert list(rel.statistic) == ["arr", "dep"]
    assert rel.epsilon.sum() == pytest.approx(1.0)
    assert (rel.privacy_unit == "tailnum").all() and (rel.run_id == cfg.run_id_for("run-seeded")).all()
    assert rel.noise_source.str.contains("NOT for release").all()
    assert rel.input_fingerprint.notna().all()
    # the flag column mirrors each mean's DP tail check
    for _, r in rel.iterrows():
        assert r.flagged is not None and bool(r.flagged) == json.loads(r.parameters)["tail_flag"]
    for col, name, row in (("arr_delay", "arr", sql[0]), ("dep_delay", "dep", sql[1])):
        exact, n = exact_person_mean(pdf, col)
        est = float(rel.loc[rel.statistic == name, "estimate"].iloc[0][0])
        assert est == pytest.approx(row.est)
        # noise scale of the fine stage, per person, ~ scale / (n/... ): allow 5 noise bars plus
        # the sampling of persons into the fine group (spread of person means / sqrt(n)).
        spread = pdf[pdf[col].notna()].groupby("tailnum")[col].mean().std()
        assert abs(est - exact) <= 5 * row.bar + 4 * spread / math.sqrt(n), (name, est, exact)


def test_two_runs_differ_and_append(spark, flights_sample, tmp_path):
    path, _ = flights_sample
    cfg = make_config(path, tmp_path, options={"scale": 30})
    r1 = run_job(cfg, spark=spark)
    r2 = run_job(cfg, spark=spark)
    assert r1.run_id != r2.run_id
    assert r1.rows[0].estimate != r2.rows[0].estimate  # real, fresh noise each run
    from deltalake import DeltaTable

    dt = DeltaTable(str(tmp_path / "releases"))
    assert dt.version() == 1  # two runs, two commits
    df = read_delta(str(tmp_path / "releases")).to_pandas()
    assert len(df) == 4 and df.error_bar.notna().all()
    assert set(df.noise_source) == {"opendp-0.16"}


def test_releases_table_written_before_the_flag_column_gains_it(spark, flights_sample, tmp_path):
    """A releases table from before ``flagged`` existed: the next run appends (schema evolution),
    its rows carry the flag, the old rows read null (Spark SQL and deltalake)."""
    import dataclasses

    from pyspark.sql import types as T

    from spark_jobs.spark.releases import release_schema

    path, _ = flights_sample
    cfg = make_config(path, tmp_path, options={"scale": 30})
    first = run_job(cfg, spark=spark, noise=SeededNoise(1), run_id="old")
    table = str(tmp_path / "releases")
    # rewrite the table as an old writer would have made it: no flagged column
    old_schema = T.StructType([f for f in release_schema().fields if f.name != "flagged"])
    old_rows = [tuple(v for k, v in dataclasses.asdict(r).items() if k != "flagged") for r in first.rows]
    import shutil

    shutil.rmtree(table)
    spark.createDataFrame(old_rows, schema=old_schema).write.format("delta").mode("append").save(table)
    assert "flagged" not in read_delta(table).column_names
    second = run_job(cfg, spark=spark, noise=SeededNoise(2), run_id="new")
    df = read_delta(table).to_pandas()
    old = df[df.run_id == cfg.run_id_for("old")]
    new = df[df.run_id == cfg.run_id_for("new")]
    assert len(old) == 2 and old.flagged.isna().all()
    # declared-scale means make no tail check: null as well, but the column now exists
    assert len(new) == 2 and [r.flagged for r in second.rows] == [None, None]
    sql = spark.sql(f"SELECT count(*) AS c FROM delta.`{table}` WHERE flagged IS NULL").collect()
    assert sql[0].c == 4


def test_csv_and_delta_inputs(spark, flights_sample, tmp_path):
    _, pdf = flights_sample
    small = pdf[pdf.tailnum.isin(sorted(pdf.tailnum.unique())[:200])]
    csv_path = tmp_path / "flights.csv"
    small.to_csv(csv_path, index=False)
    delta_path = tmp_path / "flights_delta"
    spark.createDataFrame(small).write.format("delta").save(str(delta_path))
    for fmt, p in (("csv", csv_path), ("delta", delta_path)):
        cfg = make_config(p, tmp_path / f"out_{fmt}", fmt=fmt, options={"scale": 30})
        res = run_job(cfg, spark=spark, noise=SeededNoise(1))
        assert len(res.rows) == 2
        assert res.rows[0].algorithm == "agarwal2024-univariate-person-mean"
        if fmt == "delta":
            assert res.rows[0].input_delta_version == 0
        else:
            assert res.rows[0].input_fingerprint


def _not_written(out: Path) -> bool:
    return not (out / "releases").exists()


def test_missing_column(spark, flights_sample, tmp_path):
    path, _ = flights_sample
    cfg = make_config(path, tmp_path)
    cfg = cfg.model_copy(update={"privacy_unit": cfg.privacy_unit.model_copy(update={"column": "aircraft"})})
    with pytest.raises(InputDataError, match="'aircraft' not found"):
        run_job(cfg, spark=spark)
    assert _not_written(tmp_path)


def test_wrong_type(spark, tmp_path):
    p = tmp_path / "bad.parquet"
    pd.DataFrame({"tailnum": ["a", "b"], "arr_delay": ["1", "2"], "dep_delay": [1.0, 2.0]}).to_parquet(p)
    with pytest.raises(InputDataError, match="value column 'arr_delay' has type string"):
        run_job(make_config(p, tmp_path), spark=spark)
    assert _not_written(tmp_path)


def test_empty_input(spark, tmp_path):
    p = tmp_path / "empty.parquet"
    pd.DataFrame({"tailnum": pd.Series([], dtype=str), "arr_delay": pd.Series([], dtype=float),
                  "dep_delay": pd.Series([], dtype=float)}).to_parquet(p)
    with pytest.raises(InputDataError, match="holds no rows"):
        run_job(make_config(p, tmp_path), spark=spark)
    assert _not_written(tmp_path)


def test_single_person_gives_insufficient_data(spark, tmp_path):
    p = tmp_path / "one.parquet"
    pd.DataFrame({"tailnum": ["N1"] * 5, "arr_delay": np.arange(5.0), "dep_delay": np.arange(5.0)}).to_parquet(p)
    res = run_job(make_config(p, tmp_path), spark=spark, noise=SeededNoise(0))
    assert [r.status for r in res.rows] == ["INSUFFICIENT_DATA"] * 2
    assert all(r.estimate is None for r in res.rows)
    # the range stage, its retry and the pooled retry were charged (0.04 + 0.20 + 0.15 of the
    # statistic's 0.5); the release says so
    assert res.rows[0].epsilon == pytest.approx(0.5 * 0.39)


@pytest.mark.parametrize(
    "budget,match",
    [({"epsilon": 0}, "budget.epsilon"), ({"epsilon": float("inf")}, "budget.epsilon"),
     ({"delta": 1.0}, "budget.delta"), ({"delta": -1e-9}, "budget.delta")],
)
def test_bad_budget_refused_before_anything(tmp_path, budget, match):
    with pytest.raises(ConfigError, match=match):
        make_config(tmp_path / "nowhere.parquet", tmp_path, **budget)
    assert _not_written(tmp_path)


def test_dry_run_reads_no_data(tmp_path):
    cfg = make_config(tmp_path / "does-not-exist.parquet", tmp_path)
    text = plan_job(cfg).render()
    assert "arr: magnitude range" in text and "dep: fine clip-and-noise" in text
    assert "total cost (composed): epsilon=1, delta=1e-06" in text


def test_no_salt_or_exact_count_in_logs_or_table(spark, flights_sample, tmp_path, caplog, monkeypatch):
    path, pdf = flights_sample
    salt = "5a" * 32
    monkeypatch.setattr("spark_jobs.job.new_salt", lambda: salt)
    caplog.set_level(logging.DEBUG)
    res = run_job(make_config(path, tmp_path, options={"scale": 30}), spark=spark, noise=SeededNoise(5))
    exact_n = {str(exact_person_mean(pdf, c)[1]) for c in ("arr_delay", "dep_delay")}

    table_text = read_delta(res.table_path).to_pandas().astype(str).to_csv()
    log_text = caplog.text
    assert salt not in log_text and salt not in table_text
    for n in exact_n:
        assert f" {n} " not in log_text and f"={n}" not in log_text
        assert f'"{n}"' not in table_text and f": {n}," not in table_text


def test_record_cap_through_the_job(spark, flights_sample, tmp_path, monkeypatch):
    """summary.max_records_per_person reaches the summarize pass and the release parameters: a
    cap above every aircraft's record count gives the uncapped release bit for bit (same salt and
    noise seed); a cap of 2 changes it; a cap below m_min is refused at config time."""
    from spark_jobs import job as job_mod

    path, pdf = flights_sample
    monkeypatch.setattr(job_mod, "new_salt", lambda: "3c" * 32)
    base = make_config(path, tmp_path / "a", options={"scale": 30}).model_dump()
    most = int(pdf.groupby("tailnum").size().max())

    def run(cap, out):
        raw = {**base, "output": {"path": str(tmp_path / out)}, "ledger": {"enabled": False}}
        raw["summary"] = {"m_min": 1, "max_records_per_person": cap}
        return run_job(parse_config(raw), spark=spark, noise=SeededNoise(11), run_id="cap")

    import json

    uncapped = run_job(parse_config({**base, "ledger": {"enabled": False}}), spark=spark, noise=SeededNoise(11), run_id="cap")
    high, two = run(most + 1, "high"), run(2, "two")
    assert [r.estimate for r in high.rows] == [r.estimate for r in uncapped.rows]
    assert [r.estimate for r in two.rows] != [r.estimate for r in uncapped.rows]
    assert {json.loads(r.parameters)["max_records_per_person"] for r in two.rows} == {2}
    # the multivariate release under the i.i.d. assertion says the average is over the kept records
    raw = {**base, "output": {"path": str(tmp_path / "vec")}, "ledger": {"enabled": False},
           "summary": {"m_min": 1, "max_records_per_person": 2},
           "statistics": [{"name": "v", "kind": "multivariate_mean", "columns": ["arr_delay", "dep_delay"],
                           "share": 1.0, "options": {"records_iid": True}}]}
    (vec,) = run_job(parse_config(raw), spark=spark, noise=SeededNoise(11), run_id="cap").rows
    assert "at most summary.max_records_per_person" in json.loads(vec.parameters)["unequal_records"]
    with pytest.raises(ConfigError, match="max_records_per_person"):
        parse_config({**base, "summary": {"m_min": 3, "max_records_per_person": 2}})
