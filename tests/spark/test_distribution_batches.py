"""Spark batches == numpy twin, exactly: per-person count vectors, n, sum c, sum c c^T, the
histogram of distinct count vectors and the clipped sums; the three physical plans; the sampling
rule's uniformity on one person; the category list comes from the config, not the data."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from dplib.distribution.batches import NumpyBatches, moments_from_histogram
from dplib.groups import ALL_PERSONS, GroupRange
from spark_jobs.spark import native
from spark_jobs.spark.batches import SparkBatchAggregates, person_batches
from spark_jobs.spark.native import plan_uses_native as uses_native

pytestmark = pytest.mark.spark

SALT = "5e" * 32
CATS = ["JFK", "LAX", "ORD"]


def _records(seed=0, n_persons=60):
    """Records with string/int columns only (so Python's json.dumps reproduces Spark's to_json),
    persons with 0..12 records, exact duplicate rows, nulls and unknown categories."""
    rng = np.random.default_rng(seed)
    rows = []
    for p in range(n_persons):
        pid = f"p{p}" if p % 17 else None if p == 17 else str(p)
        for r in range(int(rng.integers(0, 13))):
            cat = rng.choice(["JFK", "LAX", "ORD", "SFO", None], p=[0.4, 0.25, 0.2, 0.1, 0.05])
            flight = int(rng.integers(0, 3))  # few distinct values -> exact duplicate rows
            rows.append({"pid": pid, "dest": None if cat is None else str(cat), "flight": flight})
    return rows


def _labels(rows, cols):
    # Spark's to_json(struct(...)) omits null fields and writes compact JSON
    return [json.dumps({c: r[c] for c in cols if r[c] is not None}, separators=(",", ":")) for r in rows]


@pytest.fixture(scope="module")
def frame(spark):
    rows = _records()
    df = spark.createDataFrame(rows, "pid string, dest string, flight int")
    return rows, df


@pytest.mark.parametrize("plan", ["bottomk", "bottomk-sql", "collect", "window"])
@pytest.mark.parametrize("label_columns", [None, ["pid", "dest", "flight"], ["flight"]], ids=["default", "all", "flight"])
def test_spark_batches_equal_numpy_twin(spark, frame, plan, label_columns, monkeypatch):
    """Default labels (the category alone: bottomk counts (person, category) before the
    shuffle), every column, and a column list the category is added to (after it)."""
    rows, df = frame
    m = 4
    cols = ["dest"] if label_columns is None else label_columns + ([] if "dest" in label_columns else ["dest"])
    twin = NumpyBatches([r["pid"] for r in rows], [r["dest"] for r in rows], _labels(rows, cols), CATS, m, SALT)
    if plan == "bottomk-sql":  # the default plan without the native jar: Spark's min_by
        monkeypatch.setenv(native.ENV_SWITCH, "0")
        plan = "bottomk"
    out = person_batches(df, "pid", "dest", CATS, m, SALT, label_columns=label_columns, null_values=[], plan=plan)
    if plan == "bottomk":
        assert uses_native(out) == native.enabled(spark) == (native.wanted())
    batches = out.collect()
    got = sorted((int(r["_group"]), tuple(r["counts"])) for r in batches)
    want = sorted((int(g), tuple(int(x) for x in c)) for g, c in zip(twin.group, twin.counts))
    assert got == want
    # independent oracle of who is kept: persons with >= m records (null id dropped)
    per_person = Counter(r["pid"] for r in rows if r["pid"] is not None)
    assert len(got) == sum(1 for v in per_person.values() if v >= m)
    assert all(sum(c) == m and len(c) == len(CATS) + 1 for _, c in got)


def test_statistics_agree_exactly(spark, frame):
    rows, df = frame
    m = 3
    twin = NumpyBatches([r["pid"] for r in rows], [r["dest"] for r in rows], _labels(rows, ["dest"]), CATS, m, SALT)
    sb = person_batches(df, "pid", "dest", CATS, m, SALT, null_values=[]).persist()
    try:
        spark_agg = SparkBatchAggregates(sb, len(CATS) + 1, m)
        for group in (ALL_PERSONS, GroupRange(0.2, 0.7)):
            full = group is ALL_PERSONS
            ms, mn = spark_agg.moments(group), twin.moments(group)
            assert ms == mn
            assert spark_agg.sums(group) == twin.sums(group) == (ms.n, ms.sum_counts)
            # oracle: numpy on the twin's count matrix
            sel = (twin.group >= group.bounds[0]) & (twin.group < group.bounds[1])
            c = twin.counts[sel]
            assert ms.n == c.shape[0]
            assert list(ms.sum_counts) == c.sum(axis=0).tolist()
            assert np.array(ms.sum_outer).tolist() == (c.T @ c).tolist()
            if not full:
                continue
            hs = spark_agg.histogram(group)
            assert hs == twin.histogram(group)
            assert moments_from_histogram(hs, len(CATS) + 1) == ms
            center = np.array([0.4, 0.3, 0.2, 0.1])
            for norm, radius in (("l1", 0.5), ("l2", 0.3), ("l1", 3.0)):
                s_sum, s_n = spark_agg.clipped_sum(center, radius, norm, group)
                t_sum, t_n = twin.clipped_sum(center, radius, norm, group)
                assert s_n == t_n and np.array_equal(s_sum, t_sum)
        assert spark_agg.rows_collected < 100  # O(k^2 + D) rows, never a per-person row
    finally:
        sb.unpersist()


def test_default_label_is_the_category_and_unknown_is_other(spark, frame):
    rows, df = frame
    m = 1
    batches = person_batches(df, "pid", "dest", CATS, m, SALT, null_values=[]).collect()
    twin = NumpyBatches([r["pid"] for r in rows], [r["dest"] for r in rows], _labels(rows, ["dest"]), CATS, m, SALT)
    assert sorted(tuple(r["counts"]) for r in batches) == sorted(tuple(int(x) for x in c) for c in twin.counts)
    # categories never come from the data: a list naming none of the values puts all in OTHER
    only_other = person_batches(df, "pid", "dest", ["NO_SUCH_AIRPORT"], m, SALT, null_values=[]).collect()
    assert {tuple(r["counts"]) for r in only_other} == {(0, 1)}


def test_keyed_order_is_uniform_per_person(spark):
    """150 persons, each with records {A, A (identical rows), B}: with m = 1 each keeps A with
    probability 2/3, independently (their keys hash different person ids). Content-only hashing
    without the duplicate number would give 1/2."""
    rows = [(f"p{i}", d) for i in range(150) for d in ("A", "A", "B")]
    df = spark.createDataFrame(rows, "pid string, dest string")
    got = person_batches(df, "pid", "dest", ["A", "B"], 1, SALT).collect()
    hits = sum(r["counts"][0] for r in got)
    assert len(got) == 150
    # Binomial(150, 2/3): mean 100, sd 5.8 (+-2.6 sd); 1/2 would give 75 (power ~1)
    assert 85 <= hits <= 115, hits


@pytest.mark.parametrize("plan", ["bottomk", "window", "collect"])
def test_label_without_the_category_cannot_bias_the_draws(spark, plan):
    """Review regression: with ``label_columns`` naming only the person, records {A, B} of one
    person got the same key and the tie went to the lower category index (A 600/600). The
    category is now always part of the label: with m = 1 each person keeps A with probability
    1/2, independently across persons."""
    rows = [(f"p{i}", d) for i in range(200) for d in ("A", "B")]
    df = spark.createDataFrame(rows, "pid string, dest string")
    got = person_batches(df, "pid", "dest", ["A", "B"], 1, SALT, label_columns=["pid"], plan=plan).collect()
    hits = sum(r["counts"][0] for r in got)
    assert len(got) == 200
    # Binomial(200, 1/2): mean 100, sd 7.1 (+-3.5 sd); the bug gave 200 (power ~1)
    assert 75 <= hits <= 125, hits


def _twin_rows(rows, m, cols=("dest",)):
    twin = NumpyBatches([r["pid"] for r in rows], [r["dest"] for r in rows], _labels(rows, list(cols)), CATS, m, SALT)
    return sorted((int(g), tuple(int(x) for x in c)) for g, c in zip(twin.group, twin.counts))


def test_bottomk_with_many_identical_records(spark, path):
    """Persons whose records are mostly exact copies (2-3 distinct rows, 5-40 records): the
    duplicate numbering decides which copies are kept; bottom-k == numpy twin for m from 1 to
    above most persons' record counts, with an independent check of who is kept."""
    rng = np.random.default_rng(3)
    rows = []
    for p in range(40):
        kinds = [("JFK", 1), ("LAX", 2), ("SFO", 1)][: int(rng.integers(2, 4))]
        for _ in range(int(rng.integers(5, 41))):
            d, f = kinds[int(rng.integers(0, len(kinds)))]
            rows.append({"pid": f"q{p}", "dest": d, "flight": f})
    df = spark.createDataFrame(rows, "pid string, dest string, flight int")
    per_person = Counter(r["pid"] for r in rows)
    for m in (1, 7, 30):
        got = person_batches(df, "pid", "dest", CATS, m, SALT, null_values=[], plan="bottomk").collect()
        got = sorted((int(r["_group"]), tuple(r["counts"])) for r in got)
        assert got == _twin_rows(rows, m)
        assert len(got) == sum(1 for v in per_person.values() if v >= m)


def test_bottomk_falls_back_to_window_above_the_min_by_limit(spark, frame, monkeypatch):
    """m above Spark's limit on min_by's k runs the window plan (same rows): the limit is
    lowered to 2 here so that m = 3 takes the fallback path."""
    import spark_jobs.spark.batches as sb

    rows, df = frame
    monkeypatch.setattr(sb, "BOTTOM_K_LIMIT", 2)
    plan = sb.person_batches(df, "pid", "dest", CATS, 3, SALT, null_values=[])
    assert "min_by" not in plan._jdf.queryExecution().optimizedPlan().toString()
    got = sorted((int(r["_group"]), tuple(r["counts"])) for r in plan.collect())
    assert got == _twin_rows(rows, 3)
    monkeypatch.setattr(sb, "BOTTOM_K_LIMIT", 100_000)
    assert uses_native(sb.person_batches(df, "pid", "dest", CATS, 3, SALT, null_values=[]))


def test_bottomk_plan_shuffles_the_records_once(spark, frame, path):
    """The default plan moves each record across the network once: with every column as the
    label, one exchange of the records by person; with the category as the label (default),
    native: the same single exchange; SQL path: the records leave their task only as partial
    (person, label, category) counts, and a second exchange moves those count rows by person
    (the salt and the final aggregate only add broadcasts / a single row)."""
    _, df = frame
    out = person_batches(df, "pid", "dest", CATS, 2, SALT, label_columns=["pid", "dest", "flight"], null_values=[])
    plan = out._jdf.queryExecution().executedPlan().toString()
    assert plan.count("Exchange hashpartitioning") == 1, plan
    plan = person_batches(df, "pid", "dest", CATS, 2, SALT, null_values=[])._jdf.queryExecution().executedPlan().toString()
    if path == "native":  # the records by person once; counts and bottom-k in the partition
        assert plan.count("Exchange hashpartitioning") == 1, plan
        return
    assert plan.count("Exchange hashpartitioning") == 2, plan
    lines = plan.splitlines()
    first = max(i for i, line in enumerate(lines) if "Exchange hashpartitioning" in line)  # the one nearest the scan
    assert "partial_count" in lines[first + 1] and "_l0" in lines[first + 1], plan


def test_copies_are_numbered_in_blocks(spark, monkeypatch):
    """number_copies: each row repeated _cnt times with _j = 0.._cnt-1, across block edges
    (blocks of 3 here), and the batches with small blocks equal the numpy twin's."""
    import spark_jobs.spark.batches as sb
    import spark_jobs.spark.keys as keys

    monkeypatch.setattr(keys, "COPY_BLOCK", 3)
    counted = spark.createDataFrame([(f"r{c}", c) for c in range(1, 11)], "name string, _cnt long")
    got = sorted((r["name"], r["_j"]) for r in keys.number_copies(counted, ["name"]).collect())
    assert got == sorted((f"r{c}", j) for c in range(1, 11) for j in range(c))
    rows = [{"pid": f"p{i % 4}", "dest": ["JFK", "LAX", None][i % 3], "flight": 1} for i in range(40)]
    df = spark.createDataFrame(rows, "pid string, dest string, flight int")
    batches = sb.person_batches(df, "pid", "dest", CATS, 7, SALT, null_values=[]).collect()
    assert sorted((int(r["_group"]), tuple(r["counts"])) for r in batches) == _twin_rows(rows, 7)


def test_person_shares_equal_the_numpy_twin(spark, frame):
    """Issue 19's share-sum estimator: Spark's per-person fixed-point shares and their exact sums
    equal the numpy twin's on persons with 1..12 records, nulls and unknown categories."""
    from dplib.distribution.shares import NumpyShares, share_units
    from spark_jobs.spark.batches import SparkShareSums, person_shares

    rows, df = frame
    twin = NumpyShares([r["pid"] for r in rows], [r["dest"] for r in rows], CATS, SALT)
    shares = person_shares(df, "pid", "dest", CATS, SALT, null_values=[]).persist()
    try:
        got = sorted((int(r["_group"]), tuple(r["units"])) for r in shares.collect())
        want = sorted((int(g), tuple(int(x) for x in u)) for g, u in zip(twin.group, share_units(twin.counts)))
        assert got == want
        # every person with a record is there (none dropped), the null id excluded
        assert len(got) == len({r["pid"] for r in rows if r["pid"] is not None})
        backend = SparkShareSums(shares, len(CATS) + 1)
        for group in (ALL_PERSONS, GroupRange(0.2, 0.7)):
            assert backend.share_sums(group) == twin.share_sums(group)
        assert backend.rows_collected == 2
    finally:
        shares.unpersist()


@pytest.mark.parametrize("dtype", ["double", "bigint", "string"])
def test_numeric_category_columns_match_by_number_like_the_twin(spark, dtype):
    """Issue 19: a category column of codes stored as double (or bigint) with categories listed
    as '1', '2', ... is matched by number (3.0 matches '3'; -0.0 is '0'; NaN and null are OTHER),
    record by record, exactly as the numpy twin does; a text column by its text."""
    from pyspark.sql import functions as F

    from dplib.distribution.shares import NumpyShares, share_units
    from spark_jobs.spark.batches import person_shares

    rng = np.random.default_rng(5)
    codes = rng.choice([0.0, -0.0, 1.0, 2.0, 3.0, 7.0, float("nan")], size=300)
    pids = [f"p{i % 40}" for i in range(300)]
    cats = ["0", "1", "2", "3"]
    if dtype == "bigint":
        codes = np.where(np.isnan(codes), 7.0, codes).astype(np.int64)
    values = [str(c) for c in codes] if dtype == "string" else codes.tolist()
    df = spark.createDataFrame(list(zip(pids, values)), ["pid", "code"])
    if dtype != "string":
        df = df.withColumn("code", F.col("code").cast(dtype))
    twin = NumpyShares(pids, values, cats, SALT)
    if dtype == "double":  # the twin matched 3.0 to '3' and -0.0 to '0': nothing numeric lost to OTHER
        assert twin.counts[:, -1].sum() == int(np.sum(np.isnan(codes)) + np.sum(codes == 7.0))
    shares = person_shares(df, "pid", "code", cats, SALT, null_values=[])
    got = sorted((int(r["_group"]), tuple(r["units"])) for r in shares.collect())
    want = sorted((int(g), tuple(int(x) for x in u)) for g, u in zip(twin.group, share_units(twin.counts)))
    assert got == want


def test_category_columns_whose_grouping_is_not_their_json(spark, path):
    """A struct category holding -0.0 and 0.0 (grouping equates them, their JSON does not) and
    a map category (Spark cannot group by it): the default plan names records by their JSON like
    the per-record window plan, draw for draw."""
    from pyspark.sql import functions as F

    cats = ["{0.0}", "{-0.0}", "{1.0}"]
    rows = [(f"p{p}", x) for p in range(20) for x in [-0.0] * 4 + [0.0] * 4 + [1.0] * 4]
    df = spark.createDataFrame(rows, "pid string, x double").withColumn("dest", F.struct("x"))
    got = sorted((int(r["_group"]), tuple(r["counts"])) for r in person_batches(df, "pid", "dest", cats, 4, SALT, null_values=[]).collect())
    want = sorted((int(r["_group"]), tuple(r["counts"])) for r in person_batches(df, "pid", "dest", cats, 4, SALT, null_values=[], plan="window").collect())
    assert got == want and len(got) == 20
    assert {c[0] > 0 and c[1] > 0 for _, c in got} == {True, False}  # both zeros are drawn, apart
    mapped = df.withColumn("dest", F.create_map(F.lit("x"), F.col("x")))
    got = sorted((int(r["_group"]), tuple(r["counts"])) for r in person_batches(mapped, "pid", "dest", cats, 4, SALT, null_values=[]).collect())
    want = sorted((int(r["_group"]), tuple(r["counts"])) for r in person_batches(mapped, "pid", "dest", cats, 4, SALT, null_values=[], plan="window").collect())
    assert got == want and len(got) == 20
