"""Grouped statistics end to end through the PRODUCTION noise source (``production_noise()``):
per-group mean, quantile and count; a public key set with a key nobody holds; private partition
selection that releases the well-populated keys and not a key of one person; the rows' group
keys; the grouped cost in the plan and the spend; and the long-format table queried from Spark
SQL, DuckDB and delta-rs."""

from __future__ import annotations

import json

import duckdb
import numpy as np
import pandas as pd
import pytest

from dplib.mean.per_group import LOCATE_PEAK_MARGIN, RECENTRE_SHARE, WITHIN_RADIUS_RATIO
from dplib.mechanisms import SecureNoise
from spark_jobs.config import parse_config
from spark_jobs.delta import read_delta
from spark_jobs.job import FLAG_KEYS, plan_job, run_job

pytestmark = pytest.mark.spark

N_PERSONS = 3000
GROUP_MEANS = {"A": 10.0, "B": -4.0, "C": 100.0}


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    """Persons in 1-3 of the origins A, B, C (3-6 records in each); the value's person mean in
    origin o is GROUP_MEANS[o] + N(0, 2^2). One person also holds origin Z (the singleton key)."""
    rng = np.random.default_rng(3)  # the data only; the releases' noise is not seeded
    rows = []
    for p in range(N_PERSONS):
        for o in rng.choice(list(GROUP_MEANS), int(rng.integers(1, 4)), replace=False):
            mu = GROUP_MEANS[o] + rng.normal(0, 2.0)
            for _ in range(int(rng.integers(3, 7))):
                rows.append((f"p{p}", str(o), mu + rng.normal(0, 1.0)))
    rows.append(("p0", "Z", 5.0))
    pdf = pd.DataFrame(rows, columns=["pid", "origin", "x"])
    path = tmp_path_factory.mktemp("grouped") / "records.parquet"
    pdf.to_parquet(path, index=False)
    person = pdf.groupby(["origin", "pid"])["x"].mean()
    totals = pdf.groupby(["origin", "pid"])["x"].sum()
    truth = {o: (float(person[o].mean()), float(person[o].median()), int(person[o].size)) for o in GROUP_MEANS}
    extra = {o: (float(person[o].var(ddof=0)), float(totals[o].sum())) for o in GROUP_MEANS}
    return str(path), truth, extra


def test_grouped_job_production_noise(spark, records, tmp_path):
    path, truth, extra = records
    grouped = {"group_by": ["origin"], "max_groups_per_person": 3}
    cfg = parse_config({
        "job_name": "grouped-production",
        "input": {"path": path, "format": "parquet"},
        "privacy_unit": {"column": "pid"},
        "budget": {"epsilon": 15.0, "delta": 1e-6},
        "statistics": [
            {"name": "mean_by_origin", "kind": "mean", "columns": ["x"], "share": 0.2, **grouped,
             "groups": {"keys": [["A"], ["B"], ["C"], ["D"]]}},
            {"name": "median_by_origin", "kind": "quantile", "columns": ["x"], "share": 0.2, **grouped,
             "options": {"q": 0.5}, "groups": {"keys": [["A"], ["B"], ["C"]]}},
            {"name": "persons_by_origin", "kind": "count", "columns": ["x"], "share": 0.2, **grouped,
             "groups": {"select": "private"}},
            {"name": "var_by_origin", "kind": "variance", "columns": ["x"], "share": 0.2, **grouped,
             "groups": {"keys": [["A"], ["B"], ["C"]]}},
            {"name": "sum_by_origin", "kind": "sum", "columns": ["x"], "share": 0.2, **grouped,
             "groups": {"keys": [["A"], ["B"], ["C"]]}},
        ],
        "output": {"path": str(tmp_path)},
        "ledger": {"enabled": False},
    })
    plan = plan_job(cfg)
    # every grouped stage shows the L0 multiplier; the composed cost is the budget
    assert any("per group x L0=3" in c.stage for c in plan.charges)
    assert any(c.stage == "persons_by_origin: partition selection" for c in plan.charges)
    assert plan.cost[0] == pytest.approx(15.0)
    result = run_job(cfg, spark=spark)  # production noise
    # everything but the shared range's retry (run only if its first run released nothing:
    # 15% of the mean's shared stages, which take 30% of its 3.0 after the 2% L0 check)
    retry = next(c.budget.epsilon for c in plan.charges if c.stage == "mean_by_origin: all groups: magnitude range (retry)")
    assert retry == pytest.approx(3.0 * 0.98 * 0.3 * 0.15)
    retry += sum(c.budget.epsilon for c in plan.charges if c.stage.endswith("(retry)") and "per group" in c.stage)
    assert plan.cost[0] - retry - 1e-9 <= result.epsilon_spent <= plan.cost[0] + 1e-9
    rows = {(r.statistic, json.dumps(r.group_key)): r for r in result.rows}
    for r in result.rows:
        assert r.noise_source == SecureNoise.name
        # a grouped row carries the L0 check unless its public key set has at most L0 = 3 keys
        # (nobody here holds more than 3 origins; the flag is the check's or the tail's)
        p = json.loads(r.parameters)
        assert ("l0_truncated" in p) is (r.statistic in {"mean_by_origin", "persons_by_origin"}), (r.statistic, p)
        if "l0_truncated" in p:
            assert p["l0_over_persons"] >= 0 and p["l0_over_persons_bar"] > 0
        assert bool(r.flagged) == any(bool(p.get(k)) for k in FLAG_KEYS), (r.statistic, p)
    # public keys: every listed key has a row, D (no persons) through the same DP path
    means = {r.group_key["origin"]: r for r in result.rows if r.statistic == "mean_by_origin"}
    assert set(means) == {"A", "B", "C", "D"}
    for o, (mean, median, n) in truth.items():
        r = means[o]
        assert r.status == "OK", o
        # within 0.5, or within 5 of its own 90% bars: at these budgets a group's own deviation
        # profile sometimes reads noise as far persons and widens the radius (numpy twin, 20
        # seeds: 2 of 60 groups off by 6 and 18, each inside its bar; docs/privacy/grouped.md)
        assert r.error_bar is not None and r.error_bar[0] > 0, o
        assert abs(r.estimate[0] - mean) <= max(0.5, 5.0 * r.error_bar[0]), (o, r.estimate, mean, r.error_bar)
        p = json.loads(r.parameters)
        assert p["max_groups_per_person"] == 3 and p["group_selection"] == "public key set"
    assert means["D"].status in {"OK", "INSUFFICIENT_DATA"}
    medians = {r.group_key["origin"]: r for r in result.rows if r.statistic == "median_by_origin"}
    for o, (mean, median, n) in truth.items():
        assert medians[o].status == "OK" and abs(medians[o].estimate[0] - median) <= 1.0, o
    # private selection: the three populated keys are released (their counts are far above the
    # threshold); Z, held by one person, only with probability delta/L0 = 3.3e-8
    counts = {r.group_key["origin"]: r for r in result.rows if r.statistic == "persons_by_origin"}
    assert set(counts) == {"A", "B", "C"}
    for o, (mean, median, n) in truth.items():
        assert abs(counts[o].estimate[0] - n) <= 40, o  # Laplace scale 1/(3 x 0.9 / 3)... ~1.1 persons
    assert len(rows) == len(result.rows)
    # variance and sum per group (the sum over the persons' totals: a derived per-(person,
    # group) column of the grouped summary)
    for stat, j, tol in (("var_by_origin", 0, 0.5), ("sum_by_origin", 1, 0.1)):
        got = {r.group_key["origin"]: r for r in result.rows if r.statistic == stat}
        assert set(got) == {"A", "B", "C"}
        for o in GROUP_MEANS:
            want = extra[o][j]
            if got[o].status == "OK":
                assert abs(got[o].estimate[0] - want) <= tol * abs(want) + 5.0, (
                    stat, o, got[o].estimate, want, got[o].error_bar, got[o].parameters)  # (parameters: what ran)
        assert sum(r.status == "OK" for r in got.values()) >= 2, stat

    # the long-format table: one row per statistic x group x coordinate
    long_path = str(tmp_path / "releases_long")
    spark.read.format("delta").load(long_path).createOrReplaceTempView("releases_long_t")
    got = spark.sql("SELECT value, error_bar, flagged, error_covers FROM releases_long_t WHERE statistic = "
                    "'mean_by_origin' AND group_key['origin'] = 'C'").collect()
    assert len(got) == 1 and got[0]["value"] == means["C"].estimate[0]
    # each long row carries its release row's flag and bar text (a new user filtered on status alone)
    assert got[0]["flagged"] == means["C"].flagged and got[0]["error_covers"] == means["C"].error_covers
    table = read_delta(long_path)  # delta-rs
    assert table.num_rows == len(result.rows)
    con = duckdb.connect()
    con.register("releases_long", table)
    (value,) = con.execute("SELECT value FROM releases_long WHERE statistic = 'median_by_origin' "
                           "AND group_key['origin'] = 'A'").fetchone()
    assert value == medians["A"].estimate[0]
    (n_long,) = con.execute("SELECT count(*) FROM releases_long WHERE group_key['origin'] = 'D'").fetchone()
    assert n_long == 1


def test_grouped_p90_windowed_path_production_noise(spark, records, tmp_path):
    """The grouped quantile's windowed path (small persons x epsilon per group) through the
    production noise source, on groups far apart (means -4, 10, 100): the shared window (pooled
    median +- 4 MADs) would leave C outside; the group's extra octaves bring it in (before: C's p90
    released at the window's edge). Each group's p90 within 2.0 of the exact one (sd 2 per person)."""
    path, _, _ = records
    cfg = parse_config({
        "job_name": "grouped-p90", "input": {"path": path, "format": "parquet"}, "privacy_unit": {"column": "pid"},
        "budget": {"epsilon": 1.0, "delta": 0.0},
        "statistics": [{"name": "p90", "kind": "quantile", "columns": ["x"], "share": 1.0, "group_by": ["origin"],
                        "max_groups_per_person": 3, "groups": {"keys": [["A"], ["B"], ["C"]]}, "options": {"q": 0.9}}],
        "output": {"path": str(tmp_path)}, "ledger": {"enabled": False},
    })
    result = run_job(cfg, spark=spark)  # production noise
    pdf = pd.read_parquet(path)
    person = pdf.groupby(["origin", "pid"])["x"].mean()
    for r in result.rows:
        o = r.group_key["origin"]
        exact = float(np.quantile(person[o].to_numpy(), 0.9, method="inverted_cdf"))
        p = json.loads(r.parameters)
        assert r.noise_source == SecureNoise.name and r.status == "OK", o
        assert p["path"] == "shared window", (o, p["path"])
        assert abs(r.estimate[0] - exact) <= 2.0, (o, r.estimate, exact, p.get("extra_octaves"))


def _one_group_per_person_job(tmp_path, name: str, centres, persons: int, records: tuple[int, int], epsilon: float,
                              seed: int):
    """Groups at ``centres`` (person means centre + N(0, 1); ``persons`` each, records uniform in
    ``records`` with N(0, 1) noise; one group per person) written as Parquet; the job config of a
    grouped scale-free mean over them (public key set, L0 = 1) and the exact per-group
    person-level means."""
    rng = np.random.default_rng(seed)
    rows = []
    for g, centre in enumerate(centres):
        for i, mu in enumerate(centre + rng.normal(0, 1, persons)):
            for _ in range(int(rng.integers(*records))):
                rows.append((f"p{g}_{i}", str(g), float(mu + rng.normal(0, 1.0))))
    pdf = pd.DataFrame(rows, columns=["pid", "grp", "x"])
    path = str(tmp_path / f"{name}.parquet")
    pdf.to_parquet(path, index=False)
    truth = pdf.groupby(["grp", "pid"])["x"].mean().groupby(level=0).mean()
    cfg = parse_config({
        "job_name": name, "input": {"path": path, "format": "parquet"}, "privacy_unit": {"column": "pid"},
        "budget": {"epsilon": epsilon, "delta": 1e-6},
        "statistics": [{"name": "m", "kind": "mean", "columns": ["x"], "share": 1.0, "group_by": ["grp"],
                        "max_groups_per_person": 1, "groups": {"keys": [[str(g)] for g in range(len(centres))]}}],
        "output": {"path": str(tmp_path / "out")}, "ledger": {"enabled": False},
    })
    return cfg, truth


def test_grouped_mean_pooled_path_joint_stage_production_noise(spark, tmp_path):
    """Ten groups far apart (centres 0, 10, ..., 90; person means sd 1; 600 persons each, 3-6
    records, one group per person) at epsilon 0.4: the groups take the pooled path (600 x 0.27
    noisy persons x epsilon < 300; a group's noisy count far enough off to send it to its own
    stages is allowed), located by the locating histogram (the pooled tail is light), whose
    within-group profile is one joint stage: one Spark aggregation over the persons' first kept
    groups, noise drawn once on the driver, charged once for all groups (the spend shows it).
    Each release within 3 of its own 90% bars of the exact per-group person-level mean. Numpy
    twin of this test's data (its person means through NumpyGroupedInput + run_grouped_numpy,
    SeededNoise([21, seed]), 200 seeds, build/scratch/far_exact.py): version 6 (locating
    histogram) worst |error| / bar 1.64, 99.6% covered, every pooled group located, 99% of group
    releases on the within radius (0.07 of the pooled radius, median), 1% of runs with none;
    version 5 (clip-located) worst 3.52, 98.1%, 80%, 17%. Over 4,000 seeds version 7 missed by
    more than 3 bars 7 times in 40,000 releases (worst 59 bars: a group outside the histogram's
    span, or cut at its end, read as located; one such run failed this test in CI); version 8:
    none, worst 1.9 bars, 99.8% within one bar."""
    G = 10
    cfg, truth = _one_group_per_person_job(tmp_path, "grouped-joint", [10.0 * g for g in range(G)], 600, (3, 7), 0.4, 8)
    plan = plan_job(cfg)
    within = [c for c in plan.charges if c.stage == "m: all groups: within-group profile"]
    assert len(within) == 1 and within[0].budget.epsilon == pytest.approx(0.4 * 0.98 * 0.3 * 0.2)
    result = run_job(cfg, spark=spark)  # production noise
    retries = sum(c.budget.epsilon for c in plan.charges if "(retry)" in c.stage)
    # spent: everything planned but the retries (run only when the first range releases nothing)
    assert plan.cost[0] - retries - 1e-9 <= result.epsilon_spent <= plan.cost[0] + 1e-9
    assert len(result.rows) == G
    pooled = 0
    for r in result.rows:
        g = r.group_key["grp"]
        p = json.loads(r.parameters)
        assert r.noise_source == SecureNoise.name and r.status == "OK", g
        assert r.error_bar is not None and r.error_bar[0] > 0, g
        assert abs(r.estimate[0] - truth[g]) <= 3.0 * r.error_bar[0], (g, r.estimate, truth[g], r.error_bar, p)
        if p["path"] == "pooled clip":
            pooled += 1
            stages = [st["stage"] for st in p["stages"]]
            assert p["locating_histogram"] is True, (g, p)
            # skipped only when the group's noisy count came out too small for it to claim anything
            assert stages[1] == ("fine clip-and-noise" if p["locating_skipped"] else "locating histogram"), (g, p)
            assert "re-centring clip-and-noise" not in stages, (g, p)
            if not p["locating_skipped"]:
                h, (w_lo, w_hi) = p["locating_bin_width"], p["locating_window"]
                assert h > 0 and w_lo < w_hi and (w_hi - w_lo) / h <= 512 + 1e-9, (g, p)
            if p["within_group_profile"]:  # the within radius is taken only when at most half the pooled one
                assert p["clipping_radius"] <= WITHIN_RADIUS_RATIO * p["pooled_radius"], (g, p)
            elif p["bar_tail"] == "pooled":
                assert p["clipping_radius"] == p["pooled_radius"], (g, p)
            else:  # a located group whose within-group tail is heavier: its wider radius
                assert p["clipping_radius"] >= p["pooled_radius"], (g, p)
    assert pooled >= G - 1


def test_grouped_mean_small_groups_skip_the_histogram_production_noise(spark, tmp_path):
    """Forty groups of 30 persons (centres 100-139, person means sd 1, 2-4 records each, one group
    per person) at epsilon 1: a group whose noisy count x the histogram's epsilon (~30 x 0.17) falls
    below ln(bins) + 3 skips the locating histogram and its fine clip-and-noise takes the whole rest
    around the pooled centre (the skip path, production noise; the rule checked per group from its
    DP count and public grid). Every group is released; a skipping group charged exactly the count
    and the fine stage, summing to its epsilon; at least 80% of the releases lie within their 90% bars of the exact
    per-group person-level mean (numpy twin of the rule: gaussian G = 1e3, coverage 0.98)."""
    G = 40
    cfg, truth = _one_group_per_person_job(tmp_path, "grouped-skip", [100.0 + g for g in range(G)], 30, (2, 5), 1.0, 41)
    result = run_job(cfg, spark=spark)  # production noise
    assert len(result.rows) == G
    covered = skipped = 0
    for r in result.rows:
        g = r.group_key["grp"]
        p = json.loads(r.parameters)
        assert r.noise_source == SecureNoise.name and r.status == "OK", g
        assert p["path"] == "pooled clip" and p["locating_histogram"] is True, (g, p)
        stages = [st["stage"] for st in p["stages"]]
        assert sum(st["epsilon"] for st in p["stages"]) == pytest.approx(p["group_epsilon"]), (g, p)
        eps_a = RECENTRE_SHARE * (p["group_epsilon"] - p["stages"][0]["epsilon"])
        skip_rule = p["group_noisy_count"] * eps_a < np.log(p["locating_bins"]) + LOCATE_PEAK_MARGIN
        assert p["locating_skipped"] is bool(skip_rule), (g, p)
        if p["locating_skipped"]:
            skipped += 1
            assert stages == ["group count", "fine clip-and-noise"], (g, p)
            assert p["group_center"] == p["pooled_center"] and p["within_group_profile"] is False, (g, p)
        if r.error_bar is not None:
            covered += abs(r.estimate[0] - truth[g]) <= r.error_bar[0]
    assert skipped >= 10  # the count's noise (scale ~29 persons) decides for some groups
    assert covered >= 0.8 * G, covered


def _grouped_job(tmp_path, name: str, rows, kind: str, epsilon: float, keys):
    """Records ``rows`` ((pid, grp, x) tuples) written as Parquet and the config of one grouped
    statistic ``kind`` of ``x`` by ``grp`` over them (public ``keys``, L0 = 1, the whole budget)."""
    path = str(tmp_path / f"{name}.parquet")
    pd.DataFrame(rows, columns=["pid", "grp", "x"]).to_parquet(path, index=False)
    return parse_config({
        "job_name": name, "input": {"path": path, "format": "parquet"}, "privacy_unit": {"column": "pid"},
        "budget": {"epsilon": epsilon, "delta": 1e-6},
        "statistics": [{"name": "m" if kind == "mean" else "n", "kind": kind, "columns": ["x"], "share": 1.0,
                        "group_by": ["grp"], "max_groups_per_person": 1, "groups": {"keys": [[k] for k in keys]}}],
        "output": {"path": str(tmp_path / "out")}, "ledger": {"enabled": False},
    })


def test_grouped_mean_spread_small_data_production_noise(spark, tmp_path):
    """600 persons in 3 groups (one each), person means on the integers 0..39 (five octaves; 1-3
    records at the person's value), epsilon 1: the stages shared by all groups need the range
    retry (no one-octave bucket holds enough persons for the thresholded runs), and usually the
    pooled third run, charged out of the profile's share. Before that run every group released
    INSUFFICIENT_DATA (numpy twin: 40 of 40 seeds). Now every group is released, the run spends
    at most its plan and, on this small-data path, all of it (range, retry, pooled retry or not,
    centre and profile add up to the shared share; no within-group profile is offered); each
    release within 3 of its 90% bars of the exact group mean (numpy twin, 40 seeds: every bar
    covered, |error| median 0.38 against bars ~6)."""
    rng = np.random.default_rng(42)
    rows = []
    truth = {}
    for g in range(3):
        means = rng.integers(0, 40, 200).astype(float)
        truth[str(g)] = float(means.mean())
        for i, mu in enumerate(means):
            rows.extend((f"p{g}_{i}", str(g), mu) for _ in range(int(rng.integers(1, 4))))
    cfg = _grouped_job(tmp_path, "grouped-spread", rows, "mean", 1.0, ["0", "1", "2"])
    plan = plan_job(cfg)
    assert not any("pooled retry" in c.stage for c in plan.charges)  # inside the profile's share
    result = run_job(cfg, spark=spark)  # production noise
    assert result.epsilon_spent == pytest.approx(1.0) and result.epsilon_spent <= plan.cost[0] + 1e-9
    assert len(result.rows) == 3
    for r in result.rows:
        g = r.group_key["grp"]
        p = json.loads(r.parameters)
        assert r.noise_source == SecureNoise.name and r.status == "OK", (g, r.status, p)
        assert p["shared_range_retried"] is True, (g, p)
        if r.error_bar is None:
            # the pooled profile's tail fit unbounded (nu <= 1): no bar, flagged, for every group at
            # once (numpy twin, build/scratch/sided/spread_twin.py, 200 seeds: 1 seed; a CI-like local
            # run met it once)
            assert p["tail_flag"] and r.error_covers.startswith("nothing"), (g, r.error_covers)
            continue
        assert abs(r.estimate[0] - truth[g]) <= 3.0 * r.error_bar[0], (g, r.estimate, truth[g])


def test_grouped_count_flags_l0_truncation_production_noise(spark, tmp_path):
    """600 persons each holding all three keys (2 records each), L0 = 1, a grouped count at
    epsilon 2: every person is truncated to one key, so each group's count is about 200 while 600
    persons hold it. The L0 check (Laplace(1 / (2 x 0.02)) = 25 on 600, flagged from 75) flags
    every row, its text says what the bar covers, and the count sits near the kept 200."""
    rows = [(f"p{i}", g, 1.0) for i in range(600) for g in "ABC" for _ in range(2)]
    cfg = _grouped_job(tmp_path, "l0-check", rows, "count", 2.0, ["A", "B", "C"])
    plan = plan_job(cfg)
    assert [c.budget.epsilon for c in plan.charges if "beyond the L0 bound" in c.stage] == [pytest.approx(0.04)]
    result = run_job(cfg, spark=spark)  # production noise
    assert result.epsilon_spent == pytest.approx(2.0)
    kept = 0.0
    for r in result.rows:
        p = json.loads(r.parameters)
        assert r.noise_source == SecureNoise.name and r.status == "OK"
        assert p["l0_truncated"] is True and r.flagged is True, p
        assert abs(p["l0_over_persons"] - 600) <= 300 and "WARNING (l0_truncated)" in r.error_covers
        kept += r.estimate[0]
    assert abs(kept - 600) <= 30  # the kept pairs: one per person (Laplace scale 1 / 1.96 each)


def test_private_selection_releasing_no_key_writes_one_row_through_the_job(spark, tmp_path):
    """A grouped mean with ``groups: {select: private}`` over 60 persons in three keys (20 each,
    far below the selection's threshold of ~1 + ln(L0 / delta) / (0.1 epsilon) = 139 persons at
    epsilon 1: a key of 20 passes with probability < 1e-5), through the job and the production
    noise source: one statistic-level row, INSUFFICIENT_DATA with no group key and the reason,
    charged the selection's share only (the per-group stages never start), and the long view
    carries the row too (the unit test covers the numpy path; this one the writer and Delta)."""
    rows = [(f"p{i}", "ABC"[i % 3], float(i % 7)) for i in range(60) for _ in range(2)]
    path = str(tmp_path / "nokey.parquet")
    pd.DataFrame(rows, columns=["pid", "grp", "x"]).to_parquet(path, index=False)
    cfg = parse_config({
        "job_name": "nokey", "input": {"path": path, "format": "parquet"}, "privacy_unit": {"column": "pid"},
        "budget": {"epsilon": 1.0, "delta": 1e-6},
        "statistics": [{"name": "m", "kind": "mean", "columns": ["x"], "share": 1.0, "group_by": ["grp"],
                        "max_groups_per_person": 1, "groups": {"select": "private"}}],
        "output": {"path": str(tmp_path / "out")}, "ledger": {"enabled": False},
    })
    plan = plan_job(cfg)
    selection = [c.budget.epsilon for c in plan.charges if c.stage == "m: partition selection"]
    assert selection == [pytest.approx(0.1)]
    result = run_job(cfg, spark=spark)  # production noise
    (row,) = result.rows
    assert row.noise_source == SecureNoise.name
    assert row.status == "INSUFFICIENT_DATA" and row.estimate is None and row.error_bar is None
    assert row.group_key is None or row.group_key == {}
    assert "no group key passed the private partition selection" in row.error_covers
    assert json.loads(row.parameters)["l0_check"] == "not run"
    assert result.epsilon_spent == pytest.approx(0.1)
    assert (row.epsilon, row.delta) == pytest.approx((0.1, plan.charges[0].budget.delta))
    stored = spark.read.format("delta").load(str(tmp_path / "out" / "releases")).collect()
    assert len(stored) == 1 and stored[0]["status"] == "INSUFFICIENT_DATA"
    long_rows = spark.read.format("delta").load(str(tmp_path / "out" / "releases_long")).collect()
    assert len(long_rows) == 1 and long_rows[0]["status"] == "INSUFFICIENT_DATA" and long_rows[0]["value"] is None


def test_grouped_mean_with_declared_bounds_production_noise(spark, records, tmp_path):
    """``options.bounds`` in a grouped mean: no shared stage, each group its own one-stage bounded
    mean (its share of the epsilon over L0), through the production noise source; each group's
    release within max(0.5, 5 of its 90% bars) of its exact mean (Laplace scale ~0.05 here), its
    algorithm the bounded mean's."""
    path, truth, _ = records
    cfg = parse_config({
        "job_name": "grouped-bounds",
        "input": {"path": path, "format": "parquet"},
        "privacy_unit": {"column": "pid"},
        "budget": {"epsilon": 3.0, "delta": 1e-6},
        "statistics": [{"name": "mean_by_origin", "kind": "mean", "columns": ["x"], "share": 1.0,
                        "group_by": ["origin"], "max_groups_per_person": 3,
                        "groups": {"keys": [["A"], ["B"], ["C"]]}, "options": {"bounds": [-20.0, 120.0]}}],
        "output": {"path": str(tmp_path)},
        "ledger": {"enabled": False},
    })
    plan = plan_job(cfg)
    assert not any("all groups" in c.stage for c in plan.charges)
    assert any("clip-and-noise (declared bounds)" in c.stage and "per group x L0=3" in c.stage for c in plan.charges)
    result = run_job(cfg, spark=spark)
    assert result.epsilon_spent == pytest.approx(plan.cost[0])
    rows = {r.group_key["origin"]: r for r in result.rows}
    assert set(rows) == set(truth)
    for o, (mean, _, _) in truth.items():
        r = rows[o]
        assert r.status == "OK" and r.noise_source == SecureNoise.name
        assert r.algorithm.startswith("bounded person-level mean")
        assert abs(r.estimate[0] - mean) <= max(0.5, 5.0 * r.error_bar[0]), (o, r.estimate, mean, r.error_bar)
        assert json.loads(r.parameters)["bounds"] == [-20.0, 120.0]
        assert "clamped into the declared bounds [-20, 120]" in r.estimand and r.flagged is False
