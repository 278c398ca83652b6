"""Parquet schema drift inside one input folder (issue 20, defect 3): the job and ``validate``
used to read one file's schema. A file whose value column has another type crashed inside Spark
after the reservation; a file without the value column silently lost its persons. Both are now
refused from the footers, before anything is reserved, naming the column and the file."""

from __future__ import annotations

import pandas as pd
import pytest

from dplib.errors import InputDataError
from spark_jobs.config import parse_config
from spark_jobs.job import run_job
from spark_jobs.preflight import check_input_schema

pytestmark = pytest.mark.spark


def _cfg(path, out):
    return parse_config({
        "job_name": "drift", "input": {"path": str(path), "format": "parquet"},
        "privacy_unit": {"column": "pid"}, "budget": {"epsilon": 1.0, "delta": 1e-6},
        "statistics": [{"name": "m", "kind": "mean", "columns": ["x"], "share": 1.0}],
        "output": {"path": str(out)},
        "ledger": {"population": "drift", "initial_limit": {"epsilon": 5.0, "delta": 1e-5}},
    })


def _folder(tmp_path, second: pd.DataFrame):
    d = tmp_path / "in"
    d.mkdir()
    pd.DataFrame({"pid": [f"a{i}" for i in range(50)], "x": [float(i) for i in range(50)]}).to_parquet(d / "part-0.parquet")
    second.to_parquet(d / "part-1.parquet")
    return d


@pytest.mark.parametrize(
    "second, match",
    [
        (pd.DataFrame({"pid": ["b1", "b2"], "x": ["1.5", "oops"]}), "column 'x' has type string in input file 'part-1.parquet'"),
        (pd.DataFrame({"pid": ["b1", "b2"], "y": [1.0, 2.0]}), "column 'x' is missing from input file 'part-1.parquet'"),
    ],
    ids=["other type", "missing column"],
)
def test_drifting_files_are_refused_before_the_reservation(spark, tmp_path, second, match):
    folder = _folder(tmp_path, second)
    cfg = _cfg(folder, tmp_path / "out")
    with pytest.raises(InputDataError, match=match):
        check_input_schema(cfg)
    with pytest.raises(InputDataError, match=match):
        run_job(cfg, spark=spark, run_id="drift-1")
    # nothing was reserved
    from spark_jobs.ledger import Ledger

    ledger_dir = tmp_path / "out" / "privacy_ledger"
    if ledger_dir.exists():
        pop = Ledger(str(ledger_dir)).population("drift")
        assert pop is None or pop.spent_epsilon == 0.0
