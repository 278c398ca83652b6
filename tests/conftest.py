"""Shared fixtures. One Spark session per test run, as ``local-cluster[2,1,1024]`` (two executor
JVMs with their own Python workers), so anything that does not serialise or import on executors
fails, and what crosses from driver to executors is real."""

from __future__ import annotations

import os
import sys

import pytest

# Executors must use this interpreter (the project's environment).
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

SPARK_MASTER = os.environ.get("PERSON_DP_TEST_MASTER", "local-cluster[2,1,1024]")


@pytest.fixture(scope="session")
def spark():
    from spark_jobs.spark.session import build_session

    session = build_session(
        SPARK_MASTER,
        "person-dp-tests",
        {"spark.sql.shuffle.partitions": "4", "spark.default.parallelism": "4"},
    )
    yield session
    session.stop()


@pytest.fixture(scope="session")
def flights_sample(tmp_path_factory):
    """All flights of 400 randomly drawn aircraft (incl. the "NA" tail number if drawn), as a
    Parquet file, plus the pandas frame it came from."""
    from spark_jobs.datasets import load_flights

    df = load_flights(sample_aircraft=400, seed=7)
    path = tmp_path_factory.mktemp("flights") / "flights_sample.parquet"
    df.to_parquet(path, index=False)
    return str(path), df


@pytest.fixture(scope="session")
def flights_full(tmp_path_factory):
    """All 336,776 flights as a Parquet file, plus the pandas frame."""
    from spark_jobs.datasets import load_flights

    df = load_flights()
    path = tmp_path_factory.mktemp("flights_full") / "flights.parquet"
    df.to_parquet(path, index=False)
    return str(path), df


@pytest.fixture(scope="session")
def package_zip(tmp_path_factory):
    """The package as spark-submit ships it (``make dist``): pip's wheel of this checkout, saved
    as .zip for ``--py-files``."""
    import shutil
    import subprocess

    out = tmp_path_factory.mktemp("dist")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), root],
                   check=True, capture_output=True, timeout=300)
    (wheel,) = out.glob("person_dp-*.whl")
    return str(shutil.copy(wheel, out / "person_dp.zip"))
