"""kind: distribution with estimator P3 through the whole job on Spark (config -> batches -> n0
-> ranked histogram -> certified scores -> exponential mechanism -> Delta), with the seeded
double and with the PRODUCTION noise source (OpenDP; issue 19: every production P3 run had
failed after its budget was reserved), the Spark ranked histogram against the numpy twin with
the same salt, and P3's config checks."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from dplib.distribution import p3
from dplib.distribution.batches import NumpyBatches
from dplib.errors import ConfigError, InvalidParameterError
from dplib.fixed_n import pad_histogram
from dplib.groups import ALL_PERSONS, GroupRange
from dplib.mechanisms import SecureNoise, SeededNoise
from spark_jobs.config import parse_config
from spark_jobs.job import plan_job, run_job
from spark_jobs.ledger import Ledger
from spark_jobs.query import read_delta

pytestmark = pytest.mark.spark

AIRPORTS = ["ATL", "ORD"]  # public: two of the busiest US airports; k = 3 with OTHER
M = 10
LABEL_COLS = ["time_hour", "carrier", "flight", "origin", "dest"]


def make_config(path, out, epsilon=2.0, **opts):
    return parse_config(
        {
            "job_name": "flights-dest-p3-test",
            "input": {"path": str(path), "format": "parquet"},
            "privacy_unit": {"column": "tailnum"},
            "budget": {"epsilon": epsilon, "delta": 0.0},
            "statistics": [
                {
                    "name": "dest_p3",
                    "kind": "distribution",
                    "columns": ["dest"],
                    "share": 1.0,
                    "options": {"categories": AIRPORTS, "m": M, "estimator": "P3", "alpha": 0.3, **opts},
                }
            ],
            "output": {"path": str(out)},
            "ledger": {"enabled": False},
        }
    )


def test_p3_job_end_to_end(spark, flights_sample, tmp_path):
    path, pdf = flights_sample
    cfg = make_config(path, tmp_path, omega=0.05)
    plan = plan_job(cfg)
    assert plan.cost == (pytest.approx(2.0), 0.0)
    assert [c.stage for c in plan.charges] == ["dest_p3: person count (n0)", "dest_p3: P3 exponential mechanism"]
    assert "grid G=20 (231 points)" in plan.render()
    result = run_job(cfg, spark=spark, noise=SeededNoise(2))
    (row,) = result.rows
    assert row.algorithm == "batch-distribution-P3" and row.status == "OK"
    assert (row.epsilon, row.delta) == (pytest.approx(2.0), 0.0)
    est = np.array(row.estimate)
    assert est.shape == (3,) and np.all(est >= 0) and math.isclose(est.sum(), 1.0)
    assert np.allclose(est * 20, np.round(est * 20))  # a grid point
    assert row.error_bar is None and row.noise_scale is None
    params = json.loads(row.parameters)
    assert params["categories"] == AIRPORTS + ["OTHER"] and params["grid_resolution"] == 20
    # only public values and DP outputs in the release: no exact count, discard, score or padding flag
    allowed = {"estimator", "estimator_name", "categories", "k", "m", "beta", "eta", "omega", "eta_omega_use",
               "short_persons", "budget_mode", "stages", "p3_n_mode", "n0", "persons_scored", "persons_scored_cap",
               "noisy_person_count",
               "count_laplace_scale", "grid_resolution", "grid_points", "alpha", "closeness_radius", "eta_priv", "tau_cov",
               "sandwich_gap_batches", "dummy_batch", "em_score_bound_90_batches", "uninformative"}
    assert set(params) <= allowed, set(params) - allowed
    # the estimate is close to the truth (mean over aircraft with >= M flights of their dest shares)
    d = pdf[pdf.tailnum.notna() & ~pdf.tailnum.isin(["NA", ""])]
    d = d.assign(cat=np.where(d.dest.isin(AIRPORTS), d.dest, "OTHER"))
    sizes = d.groupby("tailnum").size()
    d = d[d.tailnum.isin(sizes[sizes >= M].index)]
    truth = d.groupby("tailnum").cat.value_counts(normalize=True).unstack(fill_value=0.0)
    truth = truth.reindex(columns=AIRPORTS + ["OTHER"], fill_value=0.0).mean().to_numpy()
    # loose bound: alpha-neighbourhood (0.3 in l1) + grid step + heterogeneity; catches a wrong
    # coordinate order or a constant output
    assert 0.5 * np.abs(est - truth).sum() <= 0.3
    back = read_delta(str(tmp_path / "releases")).to_pylist()
    assert len(back) == 1 and back[0]["estimate"] == pytest.approx(row.estimate)


# ---- the production noise source ---------------------------------------------------------------
SAME_PERSONS = 200
SAME_BATCH = (5, 3, 2)  # every person: 5 records "a", 3 "b", 2 "c" (OTHER): exactly the m = 10 drawn
TRUTH = np.array(SAME_BATCH) / M


def same_persons_config(tmp_path, epsilon=2.0):
    """Every person has the same 10 records, so the selected histogram is ``{(5,3,2): n}`` (plus
    dummies when n exceeds the persons) whatever the secret salt: the mechanism's exact output
    distribution is computable from the released n alone."""
    path = tmp_path / "same.parquet"
    cats = ["a"] * 5 + ["b"] * 3 + ["c"] * 2
    pd.DataFrame({"pid": np.repeat([f"p{i}" for i in range(SAME_PERSONS)], M),
                  "cat": cats * SAME_PERSONS}).to_parquet(path, index=False)
    return parse_config({
        "job_name": "p3-production-noise",
        "input": {"path": str(path), "format": "parquet"},
        "privacy_unit": {"column": "pid"},
        "budget": {"epsilon": epsilon, "delta": 0.0},
        "statistics": [{"name": "cat_p3", "kind": "distribution", "columns": ["cat"], "share": 1.0,
                        "options": {"categories": ["a", "b"], "m": M, "estimator": "P3", "alpha": 0.3}}],
        "output": {"path": str(tmp_path / "out")},
        "ledger": {"population": "same-persons", "initial_limit": {"epsilon": 10.0, "delta": 0.0}},
    })


def tv_tolerance(n: int, epsilon_em: float, miss: float = 1e-6) -> tuple[np.ndarray, float]:
    """The grid and the TV distance t to TRUTH with ``P[TV(output, TRUTH) > t] <= miss`` under
    the mechanism's exact output distribution on ``n`` persons (n0 from the release)."""
    hist = pad_histogram({SAME_BATCH: min(n, SAME_PERSONS)}, n, p3.dummy_batch(3, M))
    setup = p3.p3_setup(3, M, n, 0.3, None, None, None, 0.05)
    scores = p3.p3_scores(hist, M, setup.G, 0.0, setup.tau, setup.gap)
    probs = p3.p3_probabilities(scores.alpha_scores, epsilon_em)
    tv = 0.5 * np.abs(scores.grid / setup.G - TRUTH[None, :]).sum(axis=1)
    order = np.argsort(tv, kind="stable")
    covered = np.cumsum(probs[order])
    return scores.grid / setup.G, float(tv[order][np.searchsorted(covered, 1.0 - miss)])


def test_p3_job_production_noise_releases_ok_and_charges_once(spark, tmp_path):
    """A real run with the default (production) noise source and the ledger on: status OK, a
    grid point of the simplex within the TV tolerance the mechanism's exact output distribution
    gives at 1 - 1e-6 (computed from the released n0; it excludes the far grid points, so a
    wrong mechanism -- argmax instead of argmin, a constant index -- fails), charged once."""
    cfg = same_persons_config(tmp_path)
    result = run_job(cfg, spark=spark)  # no noise argument: production_noise()
    (row,) = result.rows
    assert row.noise_source == SecureNoise.name and row.status == "OK"
    assert (row.epsilon, row.delta) == (pytest.approx(2.0), 0.0)
    est = np.array(row.estimate)
    assert est.shape == (3,) and np.all(est >= 0) and math.isclose(est.sum(), 1.0)
    params = json.loads(row.parameters)
    n = params["persons_scored"]
    assert n == min(params["n0"], p3.MAX_PERSONS) and params["grid_resolution"] == 20
    grid, tol = tv_tolerance(n, 0.9 * 2.0)
    assert np.any(np.all(np.isclose(grid, est[None, :]), axis=1))  # a grid point
    assert tol <= 0.15  # the check has teeth: half the grid is farther than this
    assert 0.5 * np.abs(est - TRUTH).sum() <= tol + 1e-12
    led = Ledger(str(tmp_path / "out" / "privacy_ledger"))
    assert led.population("same-persons").spent_epsilon == pytest.approx(2.0)
    assert [e["status"] for e in led.entries("same-persons")] == ["released"]
    assert read_delta(str(tmp_path / "out" / "releases")).num_rows == 1


def test_p3_mechanism_is_built_before_the_reservation(spark, tmp_path, monkeypatch):
    """With OpenDP's noisy-max built as before the fix (a float domain that admits NaN, which
    make_noisy_max refuses), the run now fails before the ledger reservation: nothing is spent
    and no Spark work starts."""
    import opendp.prelude as dp

    from dplib.mechanisms import exponential

    def old_construction(integer_scores, scale):
        dp.enable_features("contrib")
        space = dp.vector_domain(dp.atom_domain(T=float)), dp.linf_distance(T=float)
        return dp.m.make_noisy_max(*space, dp.zero_concentrated_divergence(), scale=scale)

    monkeypatch.setattr(exponential, "_opendp_gumbel_max", old_construction)
    cfg = same_persons_config(tmp_path)
    with pytest.raises(InvalidParameterError, match="OpenDP could not build.*non-nan"):
        run_job(cfg, spark=spark)
    pop = Ledger(str(tmp_path / "out" / "privacy_ledger")).population("same-persons")
    assert pop is None or pop.spent_epsilon == 0.0


def test_ranked_histogram_spark_equals_numpy(spark, flights_sample):
    from spark_jobs.spark.batches import person_batches
    from spark_jobs.spark.fixed_n import SparkFixedNBatches

    path, pdf = flights_sample
    salt = "d4" * 32
    sb = person_batches(spark.read.parquet(str(path)), "tailnum", "dest", AIRPORTS, M, salt, LABEL_COLS, ["NA", ""]).persist()
    try:
        backend = SparkFixedNBatches(sb, 3, M)
        d = pdf[pdf.tailnum.notna() & ~pdf.tailnum.isin(["NA", ""])]
        labels = [
            json.dumps({c: (int(v) if c == "flight" else v) for c, v in zip(LABEL_COLS, r)}, separators=(",", ":"))
            for r in d[LABEL_COLS].itertuples(index=False)
        ]
        twin = NumpyBatches(d.tailnum.tolist(), d.dest.tolist(), labels, AIRPORTS, M, salt)
        n = twin.counts.shape[0]
        for group in (ALL_PERSONS, GroupRange(0.2, 0.7)):
            for n0 in (1, 37, n // 2, n + 25):
                got = backend.ranked_histogram(group, n0)
                assert got == twin.ranked_histogram(group, n0)
                assert sum(got.values()) == min(n0, int(np.sum((twin.group >= int(group.lo * 2**32)) & (twin.group < int(group.hi * 2**32)))))
        assert backend.rows_collected <= 8 * len(twin.histogram(ALL_PERSONS))
    finally:
        sb.unpersist()


def test_p3_config_errors(tmp_path):
    for opts, field in (
        ({"alpha": 0.0}, "alpha"),
        ({"alpha": 0.01}, "grid points"),
        ({"grid_resolution": 0}, "grid_resolution"),
        ({"beta": 0.6}, "beta"),
        ({"closeness_radius": -0.01}, "closeness_radius"),
        ({"closeness_radius": 2.5}, "closeness_radius"),
        ({"p3_count_share": 0.0}, "p3_count_share"),
        ({"p3_count_share": 1.0}, "p3_count_share"),
    ):
        with pytest.raises(ConfigError, match=field):
            make_config("x.parquet", tmp_path, **opts)
    with pytest.raises(ConfigError, match="k <= 5"):
        parse_config(
            {
                "job_name": "j", "input": {"path": "x"}, "privacy_unit": {"column": "u"}, "budget": {"epsilon": 1.0},
                "statistics": [{"name": "s", "kind": "distribution", "columns": ["c"], "share": 1.0,
                                "options": {"categories": list("abcde"), "m": 5, "estimator": "P3"}}],
                "output": {"path": "o"}, "ledger": {"enabled": False},
            }
        )
    with pytest.raises(ConfigError, match="grid_resolution is for estimator P3"):
        make_config("x.parquet", tmp_path, estimator="P0", grid_resolution=10)
    for name, value in (("closeness_radius", 0.0), ("p3_count_share", 0.2)):
        with pytest.raises(ConfigError, match=f"{name} is for estimator P3"):
            make_config("x.parquet", tmp_path, estimator="P0", **{name: value})
    # the options reach the plan: radius and share as configured, defaults 0 and 0.1
    plan = plan_job(make_config("x.parquet", tmp_path, closeness_radius=0.1, p3_count_share=0.25))
    (p,) = plan.plans.values()
    assert (p.closeness_radius, p.p3_count_share) == (0.1, 0.25)
    assert [c.budget.epsilon for c in plan.charges] == [pytest.approx(0.5), pytest.approx(1.5)]
    assert "closeness radius=0.1, count share=0.25" in plan.render()
    (d,) = plan_job(make_config("x.parquet", tmp_path)).plans.values()
    assert (d.closeness_radius, d.p3_count_share) == (0.0, 0.1)
