"""The timed operations: the product's Spark passes and the plain baselines they are compared to.

Every Spark operation is forced with a ``noop`` write of its whole output (all columns, all rows
computed; nothing collected to the driver), so column pruning cannot skip work.
"""

from __future__ import annotations

import os

from benchmarks.scale.data import D, K

SALT = "5a" * 32  # benchmark salt (public; a run of the product draws its own from the OS)
CATEGORIES = [f"c{i}" for i in range(K - 1)]  # 19 public categories + OTHER = k = 20
VALUE_COLUMNS = [f"x{j}" for j in range(D)]


def force(df) -> None:
    """Compute every row and column of ``df`` and discard it."""
    df.write.format("noop").mode("overwrite").save()


def plain_person(df, d: int):
    """Plain Spark: per person count, sum and mean of ``d`` value columns (no privacy)."""
    from pyspark.sql import functions as F

    aggs = [F.count(F.lit(1)).alias("n")]
    for c in VALUE_COLUMNS[:d]:
        aggs += [F.sum(c).alias(f"s_{c}"), F.avg(c).alias(f"a_{c}")]
    return df.groupBy("person").agg(*aggs)


def plain_person_category(df):
    """Plain Spark: person x category counts (no privacy)."""
    return df.groupBy("person", "cat").count()


def summarize_pass(df, d: int, cap: int | None = None):
    """The product's summarize pass over ``d`` value columns (record cap ``cap``: None = off)."""
    from spark_jobs.spark.summarize import summarize

    return summarize(df, "person", VALUE_COLUMNS[:d], SALT, max_records_per_person=cap)


def batches_pass(df, m: int):
    """The product's m-draws-per-person batches of ``cat`` (whatever plan the job uses)."""
    from spark_jobs.spark.batches import person_batches

    return person_batches(df, "person", "cat", CATEGORIES, m, SALT)


def job_config(path: str, out: str, m: int, kinds=("mean", "multivariate_mean", "distribution")):
    """A release job over the synthetic records: univariate mean of x0, multivariate mean of
    x0..x7, distribution of cat (m draws); ledger off, output under ``out``."""
    from spark_jobs.config import parse_config

    stats = []
    if "mean" in kinds:
        stats.append({"name": "x0_mean", "kind": "mean", "columns": ["x0"], "share": 0.3})
    if "multivariate_mean" in kinds:
        stats.append({"name": "x_vector", "kind": "multivariate_mean", "columns": VALUE_COLUMNS, "share": 0.4})
    if "distribution" in kinds:
        stats.append({
            "name": "cat_dist", "kind": "distribution", "columns": ["cat"], "share": 0.3,
            "options": {"categories": CATEGORIES, "m": m, "estimator": "P0"},
        })
    return parse_config({
        "job_name": "scale-bench",
        "input": {"path": path, "format": "parquet", "dataset": "synthetic-scale"},
        "privacy_unit": {"column": "person"},
        "budget": {"epsilon": 3.0, "delta": 1e-6},
        "statistics": stats,
        "output": {"path": out},
        "ledger": {"enabled": False},
    })


def run_release_job(spark, path: str, out: str, m: int, kinds=("mean", "multivariate_mean", "distribution")):
    """The whole release job through ``spark_jobs.job.run_job`` (writes Delta under ``out``)."""
    from spark_jobs.job import run_job

    os.makedirs(out, exist_ok=True)
    return run_job(job_config(path, out, m, kinds), spark=spark)


def duckdb_queries(path: str, d: int) -> dict[str, str]:
    """The same plain aggregations in DuckDB SQL over the same Parquet files; each query
    reduces the grouped result to one row over all its columns (so nothing is pruned)."""
    src = f"read_parquet('{path}/*.parquet')"
    sums = ", ".join(f"sum(x{j}) AS s{j}, avg(x{j}) AS a{j}" for j in range(d))
    over = " + ".join(f"coalesce(s{j}, 0) + coalesce(a{j}, 0)" for j in range(d))
    return {
        f"per person d={d}": f"SELECT count(*), sum(n), sum({over}) FROM (SELECT person, count(*) AS n, {sums} FROM {src} GROUP BY person)",
        "person x category": f"SELECT count(*), sum(n) FROM (SELECT person, cat, count(*) AS n FROM {src} GROUP BY person, cat)",
    }
