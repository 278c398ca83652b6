"""A category column stored as floating point (issue 19): its values print as '3.0', so listed
categories '1'..'13' never match and everything would go to OTHER after the budget is spent.
The check refuses it from the schema alone (validate, dry runs and the job, before the
reservation), and accepts lists written the way the floats print, and non-float columns."""

from __future__ import annotations

import pandas as pd
import pytest

from dplib.errors import InputDataError
from spark_jobs.config import parse_config
from spark_jobs.preflight import check_input_schema


def _cfg(path, cats):
    return parse_config({
        "job_name": "cats", "input": {"path": str(path), "format": "parquet"},
        "privacy_unit": {"column": "pid"}, "budget": {"epsilon": 1.0, "delta": 1e-6},
        "statistics": [{"name": "codes", "kind": "distribution", "columns": ["code"], "share": 1.0,
                        "options": {"categories": cats}}],
        "output": {"path": str(path.parent / "out")}, "ledger": {"enabled": False},
    })


@pytest.fixture()
def files(tmp_path):
    f = tmp_path / "float.parquet"
    pd.DataFrame({"pid": ["a", "b"], "code": [3.0, 1.0]}).to_parquet(f)
    i = tmp_path / "int.parquet"
    pd.DataFrame({"pid": ["a", "b"], "code": [3, 1]}).to_parquet(i)
    return f, i


def test_float_codes_with_integer_categories_are_refused_before_spending(files):
    f, _ = files
    with pytest.raises(InputDataError, match=r"category column 'code' has type double.*\['1', '2', '3'\]"):
        check_input_schema(_cfg(f, ["1", "2", "3"]))


def test_float_codes_listed_as_floats_and_integer_columns_pass(files):
    f, i = files
    assert "usable types" in check_input_schema(_cfg(f, ["1.0", "2.0", "3.0"]))
    assert "usable types" in check_input_schema(_cfg(i, ["1", "2", "3"]))
