"""The job config most production-noise job tests need (one Parquet input keyed by ``pid``, no
ledger), shared by the Spark job tests."""

from __future__ import annotations

from spark_jobs.config import parse_config


def job_config(job_name, path, statistics, out, epsilon=1.0, delta=1e-6):
    """A job of ``statistics`` (config dicts) on a Parquet file keyed by ``pid``, at (epsilon,
    delta), written to ``out``, no ledger."""
    return parse_config({
        "job_name": job_name,
        "input": {"path": str(path), "format": "parquet"},
        "privacy_unit": {"column": "pid"},
        "budget": {"epsilon": epsilon, "delta": delta},
        "statistics": list(statistics),
        "output": {"path": str(out)},
        "ledger": {"enabled": False},
    })
