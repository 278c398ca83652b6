"""Config, plan and dry run of ``kind: variance | stddev | sum`` (no Spark): one column, options
refused with the kind they belong to, ranges from the dplib checks, the plan's charges and the
dry-run line, and the derived per-person total the sum asks for."""

from __future__ import annotations

import pytest

from dplib.derived import total_column
from dplib.errors import ConfigError
from dplib.sums import STAGE_SUM, ScaleFreeSumPlan
from dplib.variance import STAGE_MOMENTS, ScaleFreeVariancePlan
from spark_jobs.config import parse_config
from spark_jobs.job import plan_job
from spark_jobs.kinds import BY_NAME, kind_of


def cfg_of(stats, delta=1e-6):
    return parse_config({
        "job_name": "j", "input": {"path": "x.parquet"}, "privacy_unit": {"column": "uid"},
        "budget": {"epsilon": 2.0, "delta": delta}, "statistics": stats, "output": {"path": "out"},
        "ledger": {"enabled": False},
    })


def test_the_three_kinds_plan_and_render():
    cfg = cfg_of([
        {"name": "v", "kind": "variance", "columns": ["x"], "share": 0.25},
        {"name": "s", "kind": "stddev", "columns": ["x"], "share": 0.25, "options": {"k": 4}},
        {"name": "t", "kind": "sum", "columns": ["y"], "share": 0.5},
    ])
    plan = plan_job(cfg)
    assert isinstance(plan.plans["v"], ScaleFreeVariancePlan) and isinstance(plan.plans["s"], ScaleFreeVariancePlan)
    assert isinstance(plan.plans["t"], ScaleFreeSumPlan)
    assert plan.plans["s"].k == 4.0
    stages = [c.stage for c in plan.charges]
    assert f"v: {STAGE_MOMENTS}" in stages and f"t: {STAGE_SUM}" in stages
    assert plan.cost == pytest.approx((2.0, 1e-6))  # the shares sum to 1
    text = plan.render()
    assert "v: scale-free variance" in text and "s: scale-free standard deviation" in text
    assert "tail nu capped at k=4" in text and "t: scale-free sum of the persons' totals" in text
    assert "the rest (82%, less what the checks take)" in text and "15% overflow check only if" in text
    # the summary reads x and y; the sum asks for y's per-person total
    assert cfg.value_columns() == ["x", "y"]
    sum_stat = cfg.statistics[2]
    assert kind_of(sum_stat).derived_columns(sum_stat) == {total_column("y"): ("y", "total")}
    assert BY_NAME["variance"].derived_columns(cfg.statistics[0]) == {}


def test_pure_dp_is_allowed():
    plan = plan_job(cfg_of([{"name": "t", "kind": "sum", "columns": ["y"], "share": 1.0,
                             "options": {"exponent_range": [-10, 30]}}], delta=0.0))
    assert plan.cost == pytest.approx((2.0, 0.0))
    assert plan.plans["t"].exponent_range == (-10, 30)


@pytest.mark.parametrize("stat,message", [
    ({"kind": "variance", "columns": ["x", "y"]}, "kind 'variance' takes exactly one column"),
    ({"kind": "sum", "columns": ["x", "y"]}, "kind 'sum' takes exactly one column"),
    ({"kind": "stddev", "columns": ["x"], "options": {"scale": 2.0}},
     "options.scale is not an option of kind 'stddev' (it is for kind 'mean')"),
    ({"kind": "sum", "columns": ["x"], "options": {"q": 0.5}}, "options.q is not an option of kind 'sum'"),
    ({"kind": "variance", "columns": ["x"], "options": {"k": 1.5}}, "statistics.0.options.k: moment order k must be >= 2"),
    ({"kind": "sum", "columns": ["x"], "options": {"exponent_range": [5, 2]}}, "statistics.0.options.exponent_range"),
    ({"kind": "variance", "columns": ["x"], "options": {"nonsense": 1}}, "statistics.0.options.nonsense: unknown field"),
    ({"kind": "sum", "columns": ["uid"]}, "privacy unit"),
])
def test_bad_configs_are_refused_with_a_clear_message(stat, message):
    with pytest.raises(ConfigError) as err:
        cfg_of([{"name": "s", "share": 1.0, **stat}])
    assert message in str(err.value)
