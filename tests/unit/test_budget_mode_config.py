"""The job config's composition (issue 18): sequential only; a config naming the removed
``budget_mode: parallel`` is refused before anything runs, with the reason and the fix."""

from __future__ import annotations

import pytest

from dplib.errors import ConfigError
from spark_jobs.config import parse_config
from spark_jobs.job import plan_job


def _data(tmp_path, **budget):
    return {
        "job_name": "modes", "input": {"path": str(tmp_path / "x.parquet"), "format": "parquet"},
        "privacy_unit": {"column": "user"}, "budget": {"epsilon": 1.0, "delta": 1e-6, **budget},
        "statistics": [{"name": "x_mean", "kind": "mean", "columns": ["x"], "share": 1.0}],
        "output": {"path": str(tmp_path / "out")}, "ledger": {"population": "users"},
    }


def test_parallel_is_refused_with_the_reason(tmp_path):
    with pytest.raises(ConfigError) as err:
        parse_config(_data(tmp_path, budget_mode="parallel"))
    text = str(err.value)
    assert "budget_mode" in text and "removed" in text and "sequential" in text


@pytest.mark.parametrize("budget", [{}, {"budget_mode": "sequential"}])
def test_sequential_is_the_default_and_every_stage_reads_all_persons(tmp_path, budget):
    cfg = parse_config(_data(tmp_path, **budget))
    assert cfg.budget.budget_mode == "sequential"
    plan = plan_job(cfg)
    # scale-free mean: every nominal charge on all persons; the nominal shares sum to the budget
    assert all(c.group.lo == 0.0 and c.group.hi == 1.0 for c in plan.charges)
    assert plan.cost == pytest.approx((1.0, 1e-6))
