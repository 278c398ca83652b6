"""Strict configs (issue 20, defect 9 and the epsilon / scale cases of defect 2): a YAML boolean
is not a number, a repeated key is refused, and a run's epsilon must lie in a range where every
stage's noise scale is finite. All refused by the config check, before any budget is reserved."""

from __future__ import annotations

import pytest

from dplib.errors import ConfigError
from spark_jobs.config import RUN_EPSILON_RANGE, load_config, parse_config


def _data(tmp_path, budget=None, stat=None, ledger=None):
    return {
        "job_name": "strict", "input": {"path": str(tmp_path / "x.parquet"), "format": "parquet"},
        "privacy_unit": {"column": "user"}, "budget": {"epsilon": 1.0, "delta": 1e-6, **(budget or {})},
        "statistics": [{"name": "x_mean", "kind": "mean", "columns": ["x"], "share": 1.0, **(stat or {})}],
        "output": {"path": str(tmp_path / "out")}, "ledger": {"population": "users", **(ledger or {})},
    }


@pytest.mark.parametrize(
    "kw, field",
    [
        ({"budget": {"epsilon": True}}, "epsilon"),
        ({"budget": {"delta": False}}, "delta"),
        ({"stat": {"share": True}}, "share"),
        ({"stat": {"options": {"scale": True}}}, "scale"),
        ({"ledger": {"initial_limit": {"epsilon": True}}}, "epsilon"),
    ],
)
def test_a_boolean_is_not_a_number(tmp_path, kw, field):
    with pytest.raises(ConfigError, match=f"{field}: must be a number, got a boolean"):
        parse_config(_data(tmp_path, **kw))


def test_numbers_still_accepted_as_ints_and_floats(tmp_path):
    cfg = parse_config(_data(tmp_path, budget={"epsilon": 2}, stat={"share": 1}))
    assert cfg.budget.epsilon == 2.0


@pytest.mark.parametrize("eps", [1e-310, 1e-5, 101.0, 1e300])
def test_run_epsilon_out_of_the_safe_range_is_refused(tmp_path, eps):
    with pytest.raises(ConfigError, match="epsilon") as err:
        parse_config(_data(tmp_path, budget={"epsilon": eps}))
    assert f"{RUN_EPSILON_RANGE[0]:g}" in str(err.value)


@pytest.mark.parametrize("eps", list(RUN_EPSILON_RANGE))
def test_run_epsilon_at_the_range_ends_is_accepted(tmp_path, eps):
    assert parse_config(_data(tmp_path, budget={"epsilon": eps})).budget.epsilon == eps


def test_duplicate_yaml_keys_are_refused(tmp_path):
    text = (
        "job_name: strict\ninput: {path: x.parquet}\nprivacy_unit: {column: user}\n"
        "budget:\n  epsilon: 1.0\n  epsilon: 50.0\n"
        "statistics: [{name: m, kind: mean, columns: [x], share: 1.0}]\noutput: {path: out}\nledger: {enabled: false}\n"
    )
    p = tmp_path / "dup.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError, match="duplicate key 'epsilon'"):
        load_config(p)
    p.write_text(text.replace("  epsilon: 50.0\n", ""))
    assert load_config(p).budget.epsilon == 1.0


@pytest.mark.parametrize("scale", [1e308, 1e-320])
def test_a_declared_scale_whose_bins_overflow_is_refused_by_the_plan(tmp_path, scale):
    """The config builds every statistic's plan (dplib declares the ranges once): a plan that
    refuses its parameters is a config error naming the statistic, before anything runs."""
    with pytest.raises(ConfigError, match=r"statistic 'x_mean': scale .* outside \[1e-300, 1e300\]"):
        parse_config(_data(tmp_path, stat={"options": {"scale": scale}}))


def _dist(tmp_path, **options):
    d = _data(tmp_path)
    d["statistics"] = [{"name": "cats", "kind": "distribution", "columns": ["c"], "share": 1.0,
                        "options": {"categories": ["a", "b"], **options}}]
    return d


def test_distribution_defaults_to_shares_without_m_and_p0_with_m(tmp_path):
    from dplib.distribution.shares import SharePlan
    from spark_jobs.job import plan_job

    cfg = parse_config(_dist(tmp_path))
    assert cfg.statistics[0].options.estimator == "shares"
    plan = plan_job(cfg)
    assert isinstance(plan.plans["cats"], SharePlan) and plan.cost == pytest.approx((1.0, 0.0))
    assert "estimator shares" in plan.render()
    assert parse_config(_dist(tmp_path, m=5)).statistics[0].options.estimator == "P0"


@pytest.mark.parametrize(
    "options, match",
    [({"estimator": "shares", "m": 5}, "m is not used by estimator 'shares'"),
     ({"estimator": "P1"}, "options.m is required"),
     ({"estimator": "shares", "eta": 0.1}, "eta is not used")],
)
def test_distribution_option_mismatches_are_named(tmp_path, options, match):
    with pytest.raises(ConfigError, match=match):
        parse_config(_dist(tmp_path, **options))


def test_default_log_lines_carry_no_time():
    """Issue 20: timestamps on every INFO line give stage timings (data-dependent, not DP)."""
    from spark_jobs.cli import LOG_FORMAT, LOG_FORMAT_VERBOSE

    assert "asctime" not in LOG_FORMAT and "asctime" in LOG_FORMAT_VERBOSE


def test_cli_takes_table_and_ledger_paths_from_config(tmp_path):
    """Issue 20: `budget show` / `releases list` / `report` needed --ledger / --table even when
    --config says where they are."""
    import yaml

    from spark_jobs.cli import DEFAULT_LEDGER, DEFAULT_TABLE, _paths, _why_no_bar, build_parser

    data = _data(tmp_path)
    p = tmp_path / "job.yaml"
    p.write_text(yaml.safe_dump(data))
    out = str(tmp_path / "out")
    args = build_parser().parse_args(["budget", "show", "--config", str(p)])
    _paths(args)
    assert args.ledger == out + "/privacy_ledger"
    args = build_parser().parse_args(["releases", "list", "--config", str(p)])
    _paths(args)
    assert args.table == out + "/releases"
    args = build_parser().parse_args(["report", "--config", str(p), "--table", "/x/t"])
    _paths(args)
    assert args.table == "/x/t"  # an explicit path wins
    args = build_parser().parse_args(["releases", "list"])
    _paths(args)
    assert args.table == DEFAULT_TABLE
    args = build_parser().parse_args(["budget", "show"])
    _paths(args)
    assert args.ledger == DEFAULT_LEDGER
    assert _why_no_bar("no error bar: the exponential mechanism") == "the exponential mechanism"
    # --set as for run: a job run with --set ledger.path=... is read back the same way
    args = build_parser().parse_args(["budget", "show", "--config", str(p), "--set", f"ledger.path={tmp_path}/L"])
    _paths(args)
    assert args.ledger == f"{tmp_path}/L"
    args = build_parser().parse_args(["releases", "list", "--config", str(p), "--set", f"output.path={tmp_path}/o2"])
    _paths(args)
    assert args.table == f"{tmp_path}/o2/releases"
    with pytest.raises(ConfigError, match="give --config too"):
        _paths(build_parser().parse_args(["budget", "show", "--set", "ledger.path=/x"]))


def test_an_unwritable_table_path_is_refused_by_the_config_check(tmp_path):
    """An adversarial re-run: a 300-character output path component passed `validate`, the run
    reserved its budget, then delta-rs failed with 'File name too long' (a raw traceback, the
    entry left reserved). Now the config check refuses it, naming the field."""
    long = "a" * 300
    d = _data(tmp_path)
    d["output"] = {"path": str(tmp_path / long)}
    with pytest.raises(ConfigError, match=r"output.path has a path component of 300 bytes"):
        parse_config(d)
    d = _data(tmp_path, ledger={"path": f"s3://bucket/{long}/ledger"})
    with pytest.raises(ConfigError, match=r"ledger.path has a path component of 300 bytes"):
        parse_config(d)
    d = _data(tmp_path)
    d["output"] = {"path": "/" + "/".join(["b" * 200] * 20)}
    with pytest.raises(ConfigError, match=r"output.path is 4020 bytes long"):
        parse_config(d)
    # 255-byte components (multi-byte characters counted in bytes) and URIs are fine
    d = _data(tmp_path, ledger={"path": "s3://bucket/" + "é" * 127 + "/ledger"})
    d["output"] = {"path": str(tmp_path / ("c" * 255))}
    cfg = parse_config(d)
    assert cfg.output.path.endswith("c" * 255)
    d = _data(tmp_path, ledger={"path": "s3://bucket/" + "é" * 128})
    with pytest.raises(ConfigError, match="ledger.path has a path component of 256 bytes"):
        parse_config(d)


def test_a_statistic_below_the_smallest_epsilon_is_refused(tmp_path):
    """An adversarial re-run: `share: 1e-300` ran a statistic at epsilon ~1e-300 (the run's floor
    did not bound one statistic's)."""
    with pytest.raises(ConfigError, match=r"statistic 'x_mean': share 1e-300 of epsilon 1 is 1e-300, below"):
        parse_config(_data(tmp_path, stat={"share": 1e-300}))
    lo = RUN_EPSILON_RANGE[0]
    cfg = parse_config(_data(tmp_path, budget={"epsilon": 2 * lo}, stat={"share": 0.5}))
    assert cfg.statistics[0].share * cfg.budget.epsilon == pytest.approx(lo)
