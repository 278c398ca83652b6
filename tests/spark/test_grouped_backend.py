"""Grouped seam contract: one batched Spark aggregation answers every group's question exactly as
the ungrouped numpy twin answers it over that group's persons (bit for bit), with O(groups x
bins) rows back; and the per-(person, group) summary's L0 bound keeps, per person, the keys an
independent hashlib oracle picks."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from dplib.aggregates import NumpyAggregates
from dplib.distribution.batches import KEY_SEPARATOR
from dplib.groups import ALL_PERSONS, GroupRange, derive_salt
from spark_jobs.spark.grouped import SparkGroupedAggregates
from spark_jobs.grouping import NumpyGroupedInput, key_json
from spark_jobs.spark.grouping import L0_SALT_TAG, SparkGroupedInput

pytestmark = pytest.mark.spark

N = 2400
G = 5
SALT = "cd" * 32


@pytest.fixture(scope="module")
def grouped(spark):
    rng = np.random.default_rng(5)
    gid = rng.integers(0, G, N)
    gi = rng.integers(0, 2**32, N)
    a = rng.standard_t(3, N) * (10 * (gid + 1)) + 100 * gid
    b = rng.normal(-3, 2, N)
    a[rng.choice(N, 30, replace=False)] = np.nan
    a[3], a[4] = 1e308, -1e308
    rows = [(int(g), int(h), None if np.isnan(x) else float(x), float(y)) for g, h, x, y in zip(gid, gi, a, b)]
    df = spark.createDataFrame(rows, "_gid long, _group long, a double, b double").repartition(3).cache()
    twins = {g: NumpyAggregates({"a": a[gid == g], "b": b[gid == g]}, gi[gid == g]) for g in range(G)}
    return SparkGroupedAggregates(df), twins


def _ask(sp, twins, method, static, per_group):
    got = sp.answer(method, static, per_group)
    want = {g: getattr(twins[g], method)(**static, **args) for g, args in per_group.items()}
    return got, want


def _same(x, y):
    """(sum array, n) answers equal bit for bit."""
    assert len(x) == len(y) == 2
    np.testing.assert_array_equal(np.asarray(x[0]), np.asarray(y[0]))
    assert x[1] == y[1]


@pytest.mark.parametrize("group", [GroupRange(0.2, 0.7)], ids=str)
def test_count_and_histograms(grouped, group):
    sp, twins = grouped
    got, want = _ask(sp, twins, "count", {"columns": ["a"], "group": group}, {g: {} for g in range(G)})
    assert got == want
    assert sum(want.values()) == sum(twins[g].count(["a"], group) for g in range(G))
    per = {g: {"bin_width": 0.5 + g, "offset": -3.0 * g, "clamp": None if g % 2 else (-50.0, 400.0)} for g in range(G)}
    before = sp.rows_collected
    got, want = _ask(sp, twins, "histogram", {"column": "a", "group": group}, per)
    assert got == want
    assert sp.rows_collected - before == sum(len(v) for v in want.values())  # bins, never persons
    per = {g: {"bin_widths": [1.0 + g, 0.25], "offsets": [g * 1.0, -1.0]} for g in range(G)}
    got, want = _ask(sp, twins, "histograms", {"columns": ["a", "b"], "group": group}, per)
    assert got == want


def test_log_histograms(grouped):
    sp, twins = grouped
    edges = (1.25, 1.5, 1.75)
    per = {g: {"center": 100.0 * g + 0.5} for g in range(G)}
    got, want = _ask(sp, twins, "log_histogram", {"column": "a", "group": ALL_PERSONS, "sub_edges": edges}, per)
    assert got == want
    per = {g: {"centers": [100.0 * g, -3.0]} for g in range(G)}
    got, want = _ask(sp, twins, "log_histograms", {"columns": ["a", "b"], "group": ALL_PERSONS, "sub_edges": ()}, per)
    assert got == want
    per = {g: {"center": np.array([100.0 * g, -3.0]), "scales": np.array([10.0 * (g + 1), 2.0])} for g in range(G)}
    got, want = _ask(sp, twins, "norm_log_histogram", {"columns": ["a", "b"], "group": ALL_PERSONS, "sub_edges": edges}, per)
    assert got == want


@pytest.mark.parametrize("scaled", [False, True])
def test_clipped_sums_bit_for_bit(grouped, scaled):
    sp, twins = grouped
    per = {g: {"center": np.array([100.0 * g]), "radius": 5.0 * (g + 1), "scales": np.array([2.0]) if scaled else None}
           for g in range(G)}
    got, want = _ask(sp, twins, "clipped_sum", {"columns": ["a"], "group": ALL_PERSONS}, per)
    for g in range(G):
        _same(got[g], want[g])
    per = {g: {"center": np.array([100.0 * g, -3.0]), "radius": 3.0 + g, "scales": np.array([4.0, 1.0]) if scaled else None}
           for g in range(G)}
    got, want = _ask(sp, twins, "clipped_sum", {"columns": ["a", "b"], "group": ALL_PERSONS}, per)
    for g in range(G):
        _same(got[g], want[g])
    got, want = _ask(sp, twins, "clipped_outer_sum", {"columns": ["a", "b"], "group": ALL_PERSONS}, per)
    for g in range(G):
        _same(got[g], want[g])


def test_clipped_sum_split_bit_for_bit(grouped):
    """Each group's split clipped sum (sum, persons within the radius, persons at or beyond it)
    from one aggregation equals its numpy twin's, the +-1e308 persons included."""
    sp, twins = grouped
    per = {g: {"center": 100.0 * g, "radius": 5.0 * (g + 1)} for g in range(G)}
    got, want = _ask(sp, twins, "clipped_sum_split", {"column": "a", "group": GroupRange(0.1, 0.9)}, per)
    assert got == want
    assert all(w[2] > 0 for w in want.values())  # every group has persons clipped


def test_a_subset_of_groups_and_an_empty_group(grouped):
    sp, twins = grouped
    per = {1: {"center": np.array([100.0]), "radius": 2.0, "scales": None}, 77: {"center": np.array([0.0]), "radius": 1.0, "scales": None}}
    got = sp.answer("clipped_sum", {"columns": ["a"], "group": ALL_PERSONS}, per)
    _same(got[1], twins[1].clipped_sum(["a"], np.array([100.0]), 2.0, ALL_PERSONS))
    assert got[77][1] == 0 and np.all(got[77][0] == 0)  # no persons: zero sum, zero count
    assert sp.answer("count", {"columns": ["a"], "group": ALL_PERSONS}, {77: {}}) == {77: 0}


def _oracle_keep(person: str, keys: list[str], salt: str, l0: int) -> set[str]:
    s = derive_salt(salt, L0_SALT_TAG)
    h = {k: hashlib.sha256((s + person + KEY_SEPARATOR + k).encode()).hexdigest() for k in keys}
    return set(sorted(keys, key=lambda k: h[k])[:l0])


def test_l0_bound_matches_hashlib_oracle(spark):
    """Persons in up to 6 origins keep the L0 = 2 keys of smallest keyed hash; persons' means per
    kept key are their own records' means; the pooled view holds one row per person."""
    rng = np.random.default_rng(2)
    origins = ["A", "B", "C", "D", "E", "F"]
    recs, held = [], {}
    for p in range(60):
        mine = list(rng.choice(origins, rng.integers(1, 7), replace=False))
        held[f"u{p}"] = mine
        for o in mine:
            for _ in range(int(rng.integers(1, 4))):
                recs.append((f"u{p}", str(o), float(rng.normal(10, 3))))
    df = spark.createDataFrame(recs, "pid string, origin string, x double")
    src = SparkGroupedInput(df, "pid", ("", "NA"), ["origin"], None, 2, ["x"], SALT)
    try:
        rows = src._summary.select("_gkey", "x", "_m_x").collect()
        counts = src.person_counts()
        want_counts: dict[str, int] = {}
        for p, keys in held.items():
            gk = [json.dumps([k]).replace(" ", "") for k in keys]
            for k in _oracle_keep(p, gk, SALT, 2):
                want_counts[k] = want_counts.get(k, 0) + 1
        assert counts == want_counts
        assert len(rows) == sum(min(2, len(v)) for v in held.values())
        assert src.pooled().count(["x"], ALL_PERSONS) == 60
        # the first-key view of the grouped seam (the joint within-group profile's rows): each
        # person once, under its smallest-hash key; the same counts as the numpy twin's
        keys = sorted(want_counts)
        first = {k: 0 for k in keys}
        for p, ks in held.items():
            gk = [json.dumps([k]).replace(" ", "") for k in ks]
            s = derive_salt(SALT, L0_SALT_TAG)
            first[min(gk, key=lambda k: hashlib.sha256((s + p + KEY_SEPARATOR + k).encode()).hexdigest())] += 1
        fb = src.backend(keys, first_only=True)
        got = fb.answer("count", {"columns": ["x"], "group": ALL_PERSONS}, {i: {} for i in range(len(keys))})
        assert [got[i] for i in range(len(keys))] == [first[k] for k in keys] and sum(got.values()) == 60
        pdf = df.toPandas().groupby(["pid", "origin"], as_index=False)["x"].mean()
        twin = NumpyGroupedInput(list(pdf["pid"]), [key_json([o]) for o in pdf["origin"]], {"x": pdf["x"].to_numpy()},
                                 SALT, 2)
        tb = twin.backend(keys, first_only=True)
        want_twin = tb.answer("count", {"columns": ["x"], "group": ALL_PERSONS}, {i: {} for i in range(len(keys))})
        assert want_twin == got
        # the L0 check's exact count: persons holding more than L0 = 2 keys (oracle, twin)
        want_l0 = sum(len(v) > 2 for v in held.values())
        assert src.l0_over_count() == want_l0 == twin.l0_over_count() and 0 < want_l0 < 60
        hist = {i: {"center": 10.0} for i in range(len(keys))}
        static = {"column": "x", "group": ALL_PERSONS, "sub_edges": (2.0 ** 0.5,)}
        assert fb.answer("log_histogram", static, hist) == tb.answer("log_histogram", static, hist)
        # public keys: only the listed keys are kept, and selection is among them
        pub = SparkGroupedInput(df, "pid", ("", "NA"), ["origin"], [["A"], ["B"]], 1, ["x"], SALT)
        try:
            keys = pub.public_keys()
            assert keys == ['["A"]', '["B"]']
            want = sum(1 for v in held.values() if {"A", "B"} & set(v))
            assert sum(pub.person_counts().values()) == want
            # counted among the public keys only (L0 = 1: persons holding both A and B)
            assert pub.l0_over_count() == sum(1 for v in held.values() if {"A", "B"} <= set(v))
        finally:
            pub.unpersist()
    finally:
        src.unpersist()
