"""Category columns of numeric type (issue 19): a double column of codes used to print as '3.0',
so listed categories '1'..'13' never matched and everything went to OTHER after the budget was
spent. Numeric columns now match by number, record by record (3.0 matches '3'); a listed
category that cannot be such a number is refused from the schema alone (validate, dry runs and
the job, before the reservation), naming the column and the expected format."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dplib.distribution.batches import category_index

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


def test_float_codes_with_integer_categories_pass(files):
    """The issue's case: codes stored as double, categories listed as '1'..'3': matched by number."""
    f, _ = files
    assert "usable types" in check_input_schema(_cfg(f, ["1", "2", "3"]))
    assert "usable types" in check_input_schema(_cfg(f, ["1.0", "2.5", "3"]))


@pytest.mark.parametrize("which,cats,pattern", [
    (0, ["1", "a"], r"category column 'code' has type double.*\['a'\].*finite numbers"),
    (0, ["1", "nan"], r"\['nan'\]"),
    (0, ["3", "3.0"], r"'3' and '3.0' are the same number"),
    (1, ["1", "2.5"], r"category column 'code' has type bigint.*\['2.5'\].*integers"),
    (1, ["1", "3.0", "x"], r"\['3.0', 'x'\]"),
    (1, ["1", " 2"], r"\[' 2'\].*without spaces"),
])
def test_categories_that_cannot_match_a_numeric_column_are_refused_before_spending(files, which, cats, pattern):
    with pytest.raises(InputDataError, match=pattern):
        check_input_schema(_cfg(files[which], cats))


def test_integer_columns_and_text_columns_pass(files, tmp_path):
    _, i = files
    assert "usable types" in check_input_schema(_cfg(i, ["1", "2", "-3"]))
    t = tmp_path / "text.parquet"
    pd.DataFrame({"pid": ["a", "b"], "code": ["x", "3.0"]}).to_parquet(t)
    assert "usable types" in check_input_schema(_cfg(t, ["x", "anything", "3"]))


def test_numpy_twin_matches_floats_by_number():
    cats = ["1", "2.5", "x"]
    vals = [1.0, 2.5, np.float64(1.0), -0.0, float("nan"), None, "x", "1", 3.0, 1]
    assert category_index(vals, cats).tolist() == [0, 1, 0, 3, 3, 3, 2, 0, 3, 0]
    assert category_index([-0.0, 0.0], ["0"]).tolist() == [0, 0]


def test_dry_run_checks_the_schema_from_metadata(files, tmp_path, capsys):
    """`run --dry-run` printed a plan for categories that cannot match the column's type (only
    `validate` and the run refused them); now it checks the input's schema too, from metadata."""
    import yaml

    from spark_jobs.cli import main

    f, _ = files
    cfg = {
        "job_name": "cats", "input": {"path": str(f), "format": "parquet"},
        "privacy_unit": {"column": "pid"}, "budget": {"epsilon": 1.0, "delta": 1e-6},
        "statistics": [{"name": "codes", "kind": "distribution", "columns": ["code"], "share": 1.0,
                        "options": {"categories": ["a", "b"]}}],
        "output": {"path": str(tmp_path / "out")}, "ledger": {"enabled": False},
    }
    p = tmp_path / "job.yaml"
    p.write_text(yaml.safe_dump(cfg))
    assert main(["run", "--config", str(p), "--dry-run"]) == 2
    assert "categories ['a', 'b'] cannot match a numeric column" in capsys.readouterr().err
    cfg["statistics"][0]["options"]["categories"] = ["1", "3"]
    p.write_text(yaml.safe_dump(cfg))
    assert main(["run", "--config", str(p), "--dry-run"]) == 0
    assert "present with usable types" in capsys.readouterr().out
    cfg["input"]["path"] = str(tmp_path / "later.parquet")  # planning before the data exists
    p.write_text(yaml.safe_dump(cfg))
    assert main(["run", "--config", str(p), "--dry-run"]) == 0
    assert "not found: its schema is not checked" in capsys.readouterr().out
    assert not (tmp_path / "out").exists()


def test_yaml_booleans_as_group_keys_of_a_text_column_are_refused(tmp_path, capsys):
    """`groups: {keys: [[yes], [no]]}` on a string column: YAML reads yes / no as booleans, the
    keys became 'true' / 'false' and matched no record (a new user's trial: validate passed, two
    groups released from nobody). Refused now by validate, the dry run and the job's checks, naming
    the column; quoted values pass, and booleans stay valid keys of a boolean column."""
    from spark_jobs.cli import main

    data = tmp_path / "g.parquet"
    pd.DataFrame({"pid": ["a", "b", "c"], "south": ["yes", "no", "yes"], "flag": [True, False, True],
                  "x": [1.0, 2.0, 3.0]}).to_parquet(data)
    text = """
job_name: g
input: {path: %s, format: parquet}
privacy_unit: {column: pid}
budget: {epsilon: 1.0, delta: 1.0e-6}
statistics:
  - {name: x_by, kind: mean, columns: [x], share: 1.0, group_by: [%s], groups: {keys: [[%s], [%s]]}, max_groups_per_person: 1}
output: {path: %s}
ledger: {enabled: false}
"""
    p = tmp_path / "job.yaml"
    p.write_text(text % (data, "south", "yes", "no", tmp_path / "out"))
    assert main(["validate", "--config", str(p)]) == 2
    err = capsys.readouterr().err
    assert "'south'" in err and "boolean" in err and "quote" in err
    assert main(["run", "--config", str(p), "--dry-run"]) == 2
    capsys.readouterr()
    p.write_text(text % (data, "south", "'yes'", "'no'", tmp_path / "out"))
    assert main(["validate", "--config", str(p)]) == 0
    p.write_text(text % (data, "flag", "true", "false", tmp_path / "out"))
    assert main(["validate", "--config", str(p)]) == 0
    assert not (tmp_path / "out").exists()
