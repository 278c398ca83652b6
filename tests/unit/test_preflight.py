"""Checks before a run (spark_jobs.preflight; Airflow's first two tasks, `person-dp validate` and
`person-dp budget check`): input schema by the job's rules without Spark, ledger room without
writing."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dplib.budget import Budget
from dplib.errors import BudgetExceededError, ConfigError, InputDataError
from spark_jobs.config import parse_config
from spark_jobs.ledger import Ledger
from spark_jobs.preflight import check_input_schema, check_output_paths, ledger_room


def _cfg(tmp_path, path, fmt="parquet", column="user", limit=(10.0, 1e-4), **extra):
    ledger = {"population": "users"}
    if limit:
        ledger["initial_limit"] = {"epsilon": limit[0], "delta": limit[1]}
    return parse_config({
        "job_name": "pre", "input": {"path": str(path), "format": fmt, **extra},
        "privacy_unit": {"column": column}, "budget": {"epsilon": 1.0, "delta": 1e-6},
        "statistics": [{"name": "x_mean", "kind": "mean", "columns": ["x"], "share": 1.0, "options": {"scale": 2.0}}],
        "output": {"path": str(tmp_path / "out")}, "ledger": ledger,
    })


def _frame(n=50):
    rng = np.random.default_rng(0)
    return pd.DataFrame({"user": [f"u{i % 7}" for i in range(n)], "x": rng.normal(size=n), "label": ["a"] * n})


def test_parquet_schema_rules(tmp_path):
    p = tmp_path / "d.parquet"
    _frame().to_parquet(p)
    assert "usable types" in check_input_schema(_cfg(tmp_path, p))
    with pytest.raises(InputDataError, match=r"column 'who' not found in the input; it has \['label', 'user', 'x'\]"):
        check_input_schema(_cfg(tmp_path, p, column="who"))
    bad = _frame().assign(x=lambda d: d["label"])
    bad.to_parquet(tmp_path / "bad.parquet")
    with pytest.raises(InputDataError, match="value column 'x' has type string; expected a numeric type"):
        check_input_schema(_cfg(tmp_path, tmp_path / "bad.parquet"))
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pandas(_frame()).slice(0, 0), tmp_path / "empty.parquet")  # typed, no rows
    with pytest.raises(InputDataError, match="holds no rows"):
        check_input_schema(_cfg(tmp_path, tmp_path / "empty.parquet"))
    with pytest.raises(InputDataError, match="cannot read input.path"):
        check_input_schema(_cfg(tmp_path, tmp_path / "missing.parquet"))


def test_csv_and_delta(tmp_path):
    _frame().to_csv(tmp_path / "d.csv", sep=";", index=False)
    assert "usable types" in check_input_schema(_cfg(tmp_path, tmp_path / "d.csv", "csv", csv_options={"sep": ";"}))
    from deltalake import write_deltalake

    write_deltalake(str(tmp_path / "delta"), _frame())
    assert "usable types" in check_input_schema(_cfg(tmp_path, tmp_path / "delta", "delta"))


def test_ledger_room_reads_and_never_writes(tmp_path):
    p = tmp_path / "d.parquet"
    _frame().to_parquet(p)
    check = ledger_room(_cfg(tmp_path, p), "day-1")
    assert check.requested == Budget(1.0, 1e-6) and not check.already_released and check.run_id.startswith("k-")
    assert not (tmp_path / "out" / "privacy_ledger").exists()  # nothing written
    with pytest.raises(BudgetExceededError, match=r"limit \(epsilon=0.5.*requested \(epsilon=1"):
        ledger_room(_cfg(tmp_path, p, limit=(0.5, 1e-4)))
    with pytest.raises(BudgetExceededError, match="no budget is set for population 'users'"):
        ledger_room(_cfg(tmp_path, p, limit=None))
    led = Ledger(str(tmp_path / "out" / "privacy_ledger"))
    led.set_limit("users", Budget(1.5, 1e-4))
    led.reserve("users", "earlier", "pre", Budget(1.0, 1e-6))
    with pytest.raises(BudgetExceededError, match=r"spent \(epsilon=1, delta=1e-06\)"):
        ledger_room(_cfg(tmp_path, p))  # the ledger's limit wins over initial_limit
    assert led.population("users").spent_epsilon == pytest.approx(1.0)


def test_distribution_columns_are_checked(tmp_path):
    """New-user trial regression: a distribution statistic's category column was not checked."""
    p = tmp_path / "d.parquet"
    _frame().to_parquet(p)

    def cfg(column):
        return parse_config({
            "job_name": "pre", "input": {"path": str(p), "format": "parquet"},
            "privacy_unit": {"column": "user"}, "budget": {"epsilon": 1.0, "delta": 1e-6},
            "statistics": [{"name": "lab", "kind": "distribution", "columns": [column], "share": 1.0,
                            "options": {"categories": ["a", "b"], "m": 2}}],
            "output": {"path": str(tmp_path / "out")}, "ledger": {"enabled": False},
        })

    assert "'label'" in check_input_schema(cfg("label"))
    with pytest.raises(InputDataError, match=r"column 'lbl' not found in the input; it has \['label', 'user', 'x'\]"):
        check_input_schema(cfg("lbl"))


def test_coordinate_labels_of_a_distribution_release():
    """New-user trial regression: the report labelled a distribution's k values with its one column."""
    import json

    from spark_jobs.query import coordinate_labels

    dist = {"kind": "distribution", "columns": ["dest"], "estimate": [0.5, 0.3, 0.2],
            "parameters": json.dumps({"categories": ["ATL", "ORD", "OTHER"]})}
    assert coordinate_labels(dist) == ["ATL", "ORD", "OTHER"]
    vec = {"kind": "multivariate_mean", "columns": ["a", "b"], "estimate": [1.0, 2.0], "parameters": "{}"}
    assert coordinate_labels(vec) == ["a", "b"]


def test_dry_run_warns_when_the_ledger_path_is_the_default(tmp_path):
    """A new user ran two jobs on the same population with different output paths and got two
    ledgers (9 and 3.97 epsilon spent, each under its own limit), with no warning: the dry run now
    says so when ledger.path is not set, and not when it is."""
    from spark_jobs.job import DEFAULT_LEDGER_WARNING, plan_job

    text = plan_job(_cfg(tmp_path, tmp_path / "d.parquet")).render()
    assert "WARNING: " + DEFAULT_LEDGER_WARNING in text and "SEPARATE budget" in text
    shared = parse_config({
        "job_name": "pre", "input": {"path": str(tmp_path / "d.parquet"), "format": "parquet"},
        "privacy_unit": {"column": "user"}, "budget": {"epsilon": 1.0, "delta": 1e-6},
        "statistics": [{"name": "x_mean", "kind": "mean", "columns": ["x"], "share": 1.0}],
        "output": {"path": str(tmp_path / "out")},
        "ledger": {"population": "users", "path": str(tmp_path / "shared_ledger")},
    })
    text = plan_job(shared).render()
    assert "shared_ledger" in text and DEFAULT_LEDGER_WARNING not in text


def test_output_paths_that_cannot_be_created_are_refused_before_any_charge(tmp_path):
    """A new user's output.path under a CSV file (``data.csv/out``) passed validate, reserved epsilon 1
    and ended in a Delta traceback with the reservation kept. Now validate, the dry run and the job
    refuse it from the file system's metadata, naming the field; a fresh nested path is fine."""
    data = tmp_path / "data.csv"
    data.write_text("user,x\nu1,1.0\n")
    cfg = _cfg(tmp_path, data, fmt="csv")
    assert "can be written" in check_output_paths(cfg)
    bad = cfg.model_copy(update={"output": cfg.output.model_copy(update={"path": str(data / "out")})})
    with pytest.raises(ConfigError, match="output.path.*not a directory"):
        check_output_paths(bad)
    ledger_bad = cfg.model_copy(update={"ledger": cfg.ledger.model_copy(update={"path": str(data / "ledger")})})
    with pytest.raises(ConfigError, match="ledger.path"):
        check_output_paths(ledger_bad)
    nested = cfg.model_copy(update={"output": cfg.output.model_copy(update={"path": str(tmp_path / "a" / "b" / "c")})})
    assert "can be written" in check_output_paths(nested)
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        import os
        if not os.access(ro, os.W_OK):  # (root can write anywhere: nothing to check then)
            ro_cfg = cfg.model_copy(update={"output": cfg.output.model_copy(update={"path": str(ro / "out")})})
            with pytest.raises(ConfigError, match="not writable"):
                check_output_paths(ro_cfg)
    finally:
        ro.chmod(0o700)
    # the table itself: a read-only releases folder inside a writable output folder is refused; a
    # read-only output root whose releases folder exists and is writable is fine
    out = tmp_path / "out2"
    (out / "releases").mkdir(parents=True)
    out_cfg = cfg.model_copy(update={"output": cfg.output.model_copy(update={"path": str(out)}),
                                     "ledger": cfg.ledger.model_copy(update={"path": str(tmp_path / "led")})})
    import os
    (out / "releases").chmod(0o500)
    try:
        if not os.access(out / "releases", os.W_OK):
            with pytest.raises(ConfigError, match="releases"):
                check_output_paths(out_cfg)
    finally:
        (out / "releases").chmod(0o700)
    out.chmod(0o500)
    try:
        assert "can be written" in check_output_paths(out_cfg)
    finally:
        out.chmod(0o700)


def test_a_run_whose_output_cannot_be_created_charges_nothing(tmp_path, capsys):
    """Through the CLI (`person-dp run`, no dry run): exit 2 naming output.path, before any Spark
    session or ledger entry (the ledger table is not even created); `validate` says the same."""
    import yaml

    from spark_jobs.cli import main

    data = tmp_path / "data.parquet"
    _frame().to_parquet(data)
    cfg = {
        "job_name": "pre", "input": {"path": str(data), "format": "parquet"},
        "privacy_unit": {"column": "user"}, "budget": {"epsilon": 1.0, "delta": 1e-6},
        "statistics": [{"name": "x_mean", "kind": "mean", "columns": ["x"], "share": 1.0}],
        "output": {"path": str(data / "out")},
        "ledger": {"population": "users", "path": str(tmp_path / "ledger"),
                   "initial_limit": {"epsilon": 10.0, "delta": 1e-4}},
    }
    p = tmp_path / "job.yaml"
    p.write_text(yaml.safe_dump(cfg))
    assert main(["validate", "--config", str(p)]) == 2
    assert "output.path" in capsys.readouterr().err
    assert main(["run", "--config", str(p)]) == 2
    err = capsys.readouterr().err
    assert "output.path" in err and "not a directory" in err and "Traceback" not in err
    assert not (tmp_path / "ledger").exists()


def test_budget_set_below_what_was_spent_warns(tmp_path, capsys):
    """`person-dp budget set` to a limit under what a population already spent was accepted
    silently (a new user then read `remaining -3.89`): it still sets the limit (an operator may
    want to stop all runs), and says on stderr that nothing can be charged until it is raised."""
    from spark_jobs.cli import main

    led = tmp_path / "ledger"
    ledger = Ledger(str(led))
    ledger.set_limit("users", Budget(10.0, 1e-4))
    r = ledger.reserve("users", "run-1", "job", Budget(8.0, 1e-6))
    ledger.settle("users", "run-1", r.attempt, 8.0, 1e-6)
    assert main(["budget", "set", "--ledger", str(led), "--population", "users", "--epsilon", "5"]) == 0
    out = capsys.readouterr()
    assert "limit epsilon=5" in out.out and "below what this population has already spent" in out.err
    assert main(["budget", "set", "--ledger", str(led), "--population", "users", "--epsilon", "20"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_an_initial_limit_that_differs_from_the_ledger_is_said_to_be_ignored(tmp_path):
    """`ledger.initial_limit` only creates a population: a new user raised it after the first run
    and read nothing about it being ignored. `budget check` (ledger_room) now says so when the
    population exists with another limit, and nothing when they agree."""
    p = tmp_path / "d.parquet"
    _frame().to_parquet(p)
    led = Ledger(str(tmp_path / "out" / "privacy_ledger"))
    led.set_limit("users", Budget(3.0, 1e-4))
    msg = ledger_room(_cfg(tmp_path, p, limit=(10.0, 1e-4))).message
    assert "initial_limit (epsilon=10, delta=0.0001) is ignored" in msg and "limit (epsilon=3" in msg
    assert "ignored" not in ledger_room(_cfg(tmp_path, p, limit=(3.0, 1e-4))).message
