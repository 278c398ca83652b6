"""The statistic kinds as plug-ins (issue 17): the registry is the only place that lists kinds;
the runner and the config name none; the config is a union discriminated on ``kind`` with
errors that name the kind an option belongs to; existing configs keep their hashes (so keyed
runs keep their run ids across the refactor)."""

from __future__ import annotations

import ast
import typing
from pathlib import Path

import pytest

from dplib.errors import ConfigError
from spark_jobs.config import load_config, parse_config
from spark_jobs.job import plan_job
from spark_jobs.kinds import BY_NAME, REGISTRY, kind_of
from spark_jobs.kinds.base import StatisticConfigBase, StatisticKind

ROOT = Path(__file__).resolve().parents[2]
#: The kinds, from the registry itself: a new kind needs no edit here.
YAML_KINDS = set(BY_NAME)


def base(stats, delta=1e-6):
    return {
        "job_name": "j",
        "input": {"path": "x.parquet"},
        "privacy_unit": {"column": "uid"},
        "budget": {"epsilon": 1.0, "delta": delta},
        "statistics": stats,
        "output": {"path": "out"},
        "ledger": {"enabled": False},
    }


def test_registry_lists_every_kind_once():
    assert {"mean", "multivariate_mean", "distribution", "covariance", "count", "quantile"} <= YAML_KINDS
    names = [n for k in REGISTRY for n in k.names]
    assert len(names) == len(set(names))
    for k in REGISTRY:
        assert isinstance(k, StatisticKind)
        assert issubclass(k.config_model, StatisticConfigBase)
        assert set(typing.get_args(k.config_model.model_fields["kind"].annotation)) == set(k.names)


def _string_constants(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


@pytest.mark.parametrize("module", ["spark_jobs/job.py", "spark_jobs/config.py"])
def test_runner_and_config_name_no_kind(module):
    """No kind name in code (docstrings aside) and no estimator import: adding a kind is one
    module and one registry line."""
    path = ROOT / module
    tree = ast.parse(path.read_text())
    docstrings = {ast.get_docstring(n, clean=False) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef))}
    assert not (_string_constants(path) - docstrings) & YAML_KINDS
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not {m for m in imported if m and m.startswith(("dplib.mean", "dplib.distribution", "dplib.covariance",
                                                          "dplib.count", "spark_jobs.kinds."))
                if m != "spark_jobs.kinds.base"}


def test_config_discriminates_on_kind():
    cfg = parse_config(base([
        {"name": "n", "kind": "count", "columns": ["x"], "share": 0.2},
        {"name": "m", "kind": "mean", "columns": ["x"], "share": 0.3},
        {"name": "d", "kind": "distribution", "columns": ["c"], "share": 0.2, "options": {"categories": ["a"]}},
        {"name": "v", "kind": "covariance", "columns": ["x", "y"], "share": 0.3, "options": {"estimator": "clipped"}},
    ]))
    assert [type(s).__name__ for s in cfg.statistics] == [
        "CountStatistic", "MeanStatistic", "DistributionStatistic", "CovarianceStatistic"]
    assert [kind_of(s) for s in cfg.statistics] == [BY_NAME[k] for k in ("count", "mean", "distribution", "covariance")]
    assert cfg.value_columns() == ["x", "y"]
    assert cfg.categorical_columns() == ["c"]
    text = plan_job(cfg).render()
    assert "n: person count, Laplace (sensitivity 1, pure epsilon=0.2)" in text
    assert "v: clipped covariance, d=2" in text


def test_dry_run_says_the_record_cap_skips_distributions():
    """A new user set summary.max_records_per_person and a distribution: the cap silently did not
    apply to it (documented only in the configuration table). The plan now says which statistics
    read the cap."""
    stats = [{"name": "m", "kind": "mean", "columns": ["x"], "share": 0.5},
             {"name": "d", "kind": "distribution", "columns": ["c"], "share": 0.5, "options": {"categories": ["a"]}}]
    cfg = parse_config({**base(stats), "summary": {"max_records_per_person": 20}})
    assert ("record cap: at most 20 records per person (a salted uniform draw) for every statistic except d: "
            "it draws its own records per person (options.m) and does not read the cap") in plan_job(cfg).render()
    cfg = parse_config({**base(stats[:1]), "summary": {"max_records_per_person": 20}})
    text = plan_job(cfg).render()
    assert "record cap: at most 20 records per person" in text and "except" not in text
    assert "record cap" not in plan_job(parse_config(base(stats))).render()


@pytest.mark.parametrize("stat, message", [
    ({"kind": "median", "columns": ["x"]}, "does not match any of the expected tags: 'mean'"),
    ({"kind": "mean", "columns": ["x"], "options": {"categories": ["a"]}},
     "statistics.0: options.categories is not an option of kind 'mean' (it is for kind 'distribution')"),
    ({"kind": "count", "columns": ["x"], "options": {"k": 4}},
     "options.k is not an option of kind 'count' (it is for kind 'mean' / 'multivariate_mean' / 'stddev' / 'sum' / 'variance')"),
    ({"kind": "mean", "columns": ["x"], "options": {"scale": -1}}, "statistics.0.options.scale: must be finite"),
    ({"kind": "distribution", "columns": ["c"]}, "needs options.categories"),
    ({"kind": "count", "columns": ["x"], "options": {"nonsense": 1}}, "statistics.0.options.nonsense: unknown field"),
    # a new user's `column:` for `columns:` was told "did you mean 'column'?"
    ({"kind": "mean", "column": ["x"]}, "statistics.0.column: unknown field (did you mean 'columns'?)"),
])
def test_config_errors_name_the_kind(stat, message):
    with pytest.raises(ConfigError) as err:
        parse_config(base([{"name": "s", "share": 1.0, **stat}]))
    assert message in str(err.value)


def test_job_checks_come_from_the_kind():
    with pytest.raises(ConfigError, match="budget.delta must be > 0 for kind 'multivariate_mean'"):
        parse_config(base([{"name": "s", "kind": "multivariate_mean", "columns": ["x"], "share": 1.0}], delta=0.0))
    # a pure-epsilon kind runs at delta = 0
    parse_config(base([{"name": "s", "kind": "count", "columns": ["x"], "share": 1.0}], delta=0.0))


# Computed with the code before the kinds refactor (commit 2ac0f20): the same YAML gives the
# same config and release hashes, so a keyed (Airflow) run keeps its run id across the upgrade.
HASHES = {
    "flights.yaml": ("e1ee0b8bdc0d35dd", "fa8e2a7c4c01177d"),
    "flights_distribution.yaml": ("e20fcba116c01baf", "0a34096aae222370"),
    "flights_multivariate.yaml": ("c5fe0e5a70c5b5c1", "ff3d0078c26e812a"),
    "synthetic_bhs23.yaml": ("1704c24583e8e332", "eb101830cc0b6469"),
}


@pytest.mark.parametrize("name", sorted(HASHES))
def test_config_hashes_unchanged(name):
    cfg = load_config(ROOT / "conf" / "examples" / name)
    assert (cfg.config_hash(), cfg.release_hash()) == HASHES[name]


@pytest.mark.parametrize("kind", sorted(YAML_KINDS))
def test_every_kind_is_documented(kind):
    """docs/configuration.md's kinds table names every registered kind."""
    text = (ROOT / "docs" / "configuration.md").read_text()
    assert f"`{kind}`" in text


def test_dry_run_says_how_many_persons_a_grouped_mean_shared_range_needs():
    """A new user's grouped mean failed with "roughly 15,556 / 10,370 persons" in its
    INSUFFICIENT_DATA text only; the dry run now gives the shared range's figure."""
    from dplib.mean.per_group import SHARED_STAGE_SHARES
    from dplib.mean.scale_free_stages import persons_needed_text

    cfg = parse_config(base([{"name": "m", "kind": "mean", "columns": ["x"], "share": 1.0, "group_by": ["g"],
                              "max_groups_per_person": 1, "groups": {"keys": [["a"], ["b"]]}}]))
    plan = plan_job(cfg)
    shared = plan.plans["m"].shared
    text = plan.render()
    assert f"shared range (all groups together): {persons_needed_text(shared.budget.epsilon, SHARED_STAGE_SHARES)}" in text
    assert "releases need roughly" in text
