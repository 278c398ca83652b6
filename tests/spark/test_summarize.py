"""The summarize pass against a pandas oracle: per-person means, NaN / inf records dropped,
null and "NA" ids dropped, the group index equal to dplib's hashlib reference, no UDFs."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from dplib.groups import group_index
from dplib.summary import CLAMP, person_mean
from spark_jobs.spark.summarize import summarize
from spark_jobs.spark.native import plan_uses_native as uses_native

pytestmark = pytest.mark.spark
SALT = "0f" * 32


def test_summarize_matches_pandas(spark, path):
    rows = [
        ("u1", 1.0, 10.0), ("u1", 3.0, float("nan")), ("u1", float("inf"), 2.0),
        ("u2", -5.0, None), ("u2", None, 4.0),
        ("NA", 100.0, 100.0), (None, 50.0, 50.0), ("  NA ", 7.0, 7.0), ("", 8.0, 8.0),
        ("u3", float("-inf"), float("nan")),
        ("u4", 2.5, 1.0),
    ]
    df = spark.createDataFrame(rows, "uid string, x double, y double")
    got = summarize(df, "uid", ["x", "y"], SALT, m_min=1, null_values=("NA", "")).toPandas()

    pdf = pd.DataFrame(rows, columns=["uid", "x", "y"])
    pdf = pdf[pdf.uid.notna() & ~pdf.uid.str.strip().isin(["NA", ""])]
    expected = {}
    for uid, g in pdf.groupby("uid"):
        entry = {}
        for c in ("x", "y"):
            v = g[c].to_numpy(dtype=float)
            v = v[np.isfinite(v)]
            entry[c] = (v.mean() if v.size else None, v.size)
        expected[uid] = entry
    gi = dict(zip(group_index(list(expected), SALT), expected))
    assert len(got) == len(expected) == 4
    for _, row in got.iterrows():
        uid = gi[int(row["_group"])]
        for c in ("x", "y"):
            mean, m = expected[uid][c]
            assert row[f"_m_{c}"] == m
            if mean is None:
                assert row[c] is None or math.isnan(row[c])
            else:
                assert row[c] == pytest.approx(mean, rel=1e-15)
    assert "uid" not in got.columns  # the id is not carried past the hash


def test_m_min_and_integer_ids(spark):
    rows = [(1, 1.0), (1, 2.0), (1, 3.0), (2, 5.0), (3, 6.0), (3, 8.0)]
    df = spark.createDataFrame(rows, "uid long, x double")
    got = summarize(df, "uid", ["x"], SALT, m_min=2).toPandas()
    by_group = {int(g): (x, m) for g, x, m in zip(got["_group"], got["x"], got["_m_x"])}
    gi = dict(zip([1, 2, 3], group_index([1, 2, 3], SALT)))
    assert by_group[gi[1]][0] == pytest.approx(2.0)
    assert by_group[gi[2]][0] is None or math.isnan(by_group[gi[2]][0])  # 1 record < m_min
    assert by_group[gi[3]][0] == pytest.approx(7.0)


def test_huge_values_do_not_overflow(spark, path):
    df = spark.createDataFrame([("a", 1e308), ("a", 1e308), ("b", -1e308)], "uid string, x double")
    got = summarize(df, "uid", ["x"], SALT).toPandas()
    assert np.all(np.isfinite(got["x"].to_numpy(dtype=float)))
    assert sorted(got["x"]) == [-CLAMP, CLAMP]  # clamped per record: no sum can overflow


def test_no_value_column_is_refused(spark):
    from dplib.errors import InvalidParameterError

    df = spark.createDataFrame([("a", 1.0)], "uid string, x double")
    with pytest.raises(InvalidParameterError, match="value_columns"):
        summarize(df, "uid", [], SALT)


def test_no_python_udf_and_salt_not_in_plan(spark):
    df = spark.createDataFrame([("a", 1.0)], "uid string, x double")
    s = summarize(df.select("uid", "x"), "uid", ["x"], SALT)
    plan = s._jdf.queryExecution().toString()
    assert "PythonUDF" not in plan and "BatchEvalPython" not in plan and "ArrowEvalPython" not in plan
    # the salt table is decoded in the JVM (an Arrow table), not produced by a Python worker
    assert "applySchemaToPythonRDD" not in s._jdf.queryExecution().executedPlan().toString()
    for mode in ("simple", "extended", "codegen", "cost", "formatted"):
        text = spark._jvm.org.apache.spark.sql.api.python.PythonSQLUtils.explainString(s._jdf.queryExecution(), mode)
        assert SALT not in text and SALT.upper() not in text, mode


def test_person_mean_independent_of_partitioning(spark, path):
    """Spark's avg adds in shuffle order; summarize sums exact fixed-point limbs, so the person
    mean does not depend on how the records are partitioned (found: avg gave 0.9999999999999999
    or 1.0) and equals the numpy twin."""
    rows = [("p", v) for v in (1.4, 0.5, 1.9, 0.2)] * 5 + [(f"q{i}", float(i) / 7) for i in range(200)]
    df = spark.createDataFrame(rows, "uid string, x double")
    seen = set()
    for parts in (1, 3, 7, 11):
        got = summarize(df.repartition(parts), "uid", ["x"], SALT).toPandas()
        gi = int(group_index(["p"], SALT)[0])
        seen.add(float(got.loc[got["_group"] == gi, "x"].iloc[0]))
    assert seen == {person_mean([1.4, 0.5, 1.9, 0.2] * 5)}
    # the values tell summation orders apart: the exact sum is not the naive one
    assert sum([1.4, 0.5, 1.9, 0.2] * 5) / 20 != math.fsum([1.4, 0.5, 1.9, 0.2] * 5) / 20 == person_mean([1.4, 0.5, 1.9, 0.2] * 5)


def test_csv_ids_are_strings_and_bad_tokens_dropped(spark, path, tmp_path):
    """CSV is read without schema inference: "007" and "7" are two persons, and a non-numeric
    value token is dropped like NaN (it cannot make the job fail)."""
    from spark_jobs.spark.io import read_records, validate_schema

    p = tmp_path / "r.csv"
    p.write_text("uid,x\n007,1.0\n7,3.0\n7,oops\nNA,9.0\n")
    df = read_records(spark, str(p), "csv")
    validate_schema(df, "uid", ["x"], "csv")
    got = summarize(df, "uid", ["x"], SALT).toPandas()
    gi = dict(zip(group_index(["007", "7"], SALT), ["007", "7"]))
    by_id = {gi[int(g)]: (x, m) for g, x, m in zip(got["_group"], got["x"], got["_m_x"])}
    assert by_id == {"007": (1.0, 1), "7": (3.0, 1)}


def _tricky_values(rng):
    """Values near powers of two across the fixed-point window and beyond it (clamped or
    truncated), subnormals, signed zeros, mixed magnitudes."""
    vals = []
    for k in list(range(-160, 100, 7)) + [-150, -149, -98, -97, 0, 1, 52, 53, 97, 98]:
        for d in (-1, 0, 1):
            vals.append(math.ldexp(1.0, k) * (1 + d * 2**-52))
    vals += [5e-324, -5e-324, 1e-310, 3.1e29, -3.3e29, 1e300, -1e308, 0.0, -0.0, 0.1, 1 / 3, CLAMP, -CLAMP]
    vals += list(rng.standard_normal(200) * 10 ** rng.uniform(-40, 40, 200))
    return [float(v) for v in vals]


def test_person_mean_equals_the_numpy_twin_bit_for_bit(spark, path):
    """Bit for bit against dplib.summary.person_mean (an independent implementation: frexp and
    integer shifts in numpy, where Spark uses double arithmetic): persons of many mixed values,
    every value alone, any partitioning; inside the fixed-point window the mean is the exact
    mean (math.fsum) up to the final roundings."""
    vals = _tricky_values(np.random.default_rng(1))
    rows = [(f"p{i % 37}", v) for i, v in enumerate(vals)] + [(f"s{i}", v) for i, v in enumerate(vals)]
    df = spark.createDataFrame(rows, "uid string, x double")
    ids = sorted({r[0] for r in rows})
    by_id = {}
    for pid, v in rows:
        by_id.setdefault(pid, []).append(v)
    gi = dict(zip(group_index(ids, SALT), ids))
    assert uses_native(summarize(df, "uid", ["x"], SALT)) == (path == "native")
    for parts in (1, 5):
        got = summarize(df.repartition(parts), "uid", ["x"], SALT).toPandas()
        assert len(got) == len(ids)
        for g, x, m in zip(got["_group"], got["x"], got["_m_x"]):
            pid = gi[int(g)]
            assert m == len(by_id[pid])
            assert x == person_mean(by_id[pid]), pid
    # inside the window the mean is the exact mean up to the final roundings
    inside = [v for v in vals if 2.0**-98 <= abs(v) < 2.0**97]
    assert person_mean(inside) == pytest.approx(math.fsum(inside) / len(inside), rel=1e-15)
    # outside it: clamped at CLAMP, and truncated below 2**-150
    assert person_mean([1e300, 1e300]) == CLAMP and person_mean([-1e308]) == -CLAMP
    assert person_mean([2.5 * 2.0**-150]) == 2 * 2.0**-150 and person_mean([-2.5 * 2.0**-150]) == -2 * 2.0**-150
    assert person_mean([3e-46]) == 0.0 and person_mean([5e-324]) == 0.0


def test_native_and_sql_paths_agree_bit_for_bit(spark, monkeypatch):
    """The jar's five carry-save base-2**61 slots and the SQL path's eight limb sums give the same
    totals: persons of many records whose sums carry across digits and limbs (values near
    2**61 / 2**31 digit boundaries of the fixed point, both signs, cancellations to zero and to
    one ulp), d = 3 columns with NaN / inf / null / CSV strings, several partitionings."""
    from pyspark.sql import functions as F

    from spark_jobs.spark import native

    rng = np.random.default_rng(3)
    # all-ones mantissas ending at the 2**61 slot boundaries (native) and 2**62 ones (its first form)
    big = [math.ldexp(1.0, k) - math.ldexp(1.0, k - 53) for k in (-89, -88, -28, -26, 33, 36, 94, 97)]
    rows = []
    for p in range(60):
        n = [1, 2, 50, 700][p % 4]
        for j in range(n):
            x = big[p % len(big)] * (1 if (j + p) % 3 else -1)
            y = float(rng.standard_normal() * 10 ** rng.uniform(-30, 29))
            z = [float("nan"), float("inf"), None, float(j)][j % 4] if p % 5 == 0 else float(rng.integers(-9, 9))
            rows.append((f"p{p}", x, y, z))
    rows += [("c", 1.0, 0.1, 1e29), ("c", -1.0, 0.2, -1e29), ("c", 5e-324, 0.3, 1e-300)]
    df = spark.createDataFrame(rows, "uid string, x double, y double, z double").withColumn("w", F.col("y").cast("string"))
    cols = ["x", "y", "z", "w"]
    assert native.enabled(spark)
    got = {}
    for mode in ("1", "0"):
        monkeypatch.setenv(native.ENV_SWITCH, mode)
        for parts in (1, 7):
            s = summarize(df.repartition(parts), "uid", cols, SALT)
            assert uses_native(s) == (mode == "1")
            got[(mode, parts)] = s.toPandas().sort_values("_group").reset_index(drop=True)
    first = got[("1", 1)]
    for k, frame in got.items():
        pd.testing.assert_frame_equal(frame, first, check_exact=True, obj=str(k))
    by_id = {}
    for r in rows:
        by_id.setdefault(r[0], []).append(r)
    gi = dict(zip(group_index(list(by_id), SALT), by_id))
    for _, row in first.iterrows():
        recs = by_id[gi[int(row["_group"])]]
        for i, c in enumerate(("x", "y", "z")):
            vals = [r[1 + i] for r in recs if r[1 + i] is not None and math.isfinite(r[1 + i])]
            assert row[f"_m_{c}"] == len(vals)
            assert (math.isnan(row[c]) if not vals else row[c] == person_mean(vals))
    assert first["w"].equals(first["y"])  # strings parsed to the same doubles


def test_native_sum_interpreted_equals_generated(spark):
    """Spark runs the declarative sum's generated code, its interpreted form when code
    generation is off or fails to compile, or a sort-based aggregation when its hash maps fill:
    all give the numpy twin's means bit for bit (values
    at the slot and limb boundaries, both signs, clamped and truncated values, NaN / inf / null,
    persons of up to 500 records, 1 and 6 partitions: partial buffers merged)."""
    from spark_jobs.spark import native

    assert native.enabled(spark)
    rng = np.random.default_rng(11)
    edge = [math.ldexp(1.0, k) - math.ldexp(1.0, k - 53) for k in (-89, -28, 33, 94, 97)] + [
        1e300, -1e308, 5e-324, 3e-46, 2.5 * 2.0**-150, 0.0, -0.0, float("nan"), float("inf"), None]
    rows = []
    for p in range(40):
        for j in range([1, 3, 500][p % 3]):
            r = rng.random()
            v = edge[int(rng.integers(len(edge)))] if r < 0.4 else float(rng.standard_cauchy() * 10 ** rng.uniform(-20, 20))
            rows.append((f"p{p}", None if v is None else (v if j % 2 else -v if v == v else v)))
    df = spark.createDataFrame(rows, "uid string, x double")
    got = {}
    modes = {
        "generated": {},
        "interpreted": {"spark.sql.codegen.wholeStage": "false", "spark.sql.codegen.factoryMode": "NO_CODEGEN"},
        # the hash maps give up after 10 / 20 groups: sort-based aggregation, buffers updated after merges
        "sort fallback": {"spark.sql.TungstenAggregate.testFallbackStartsAt": "10, 20"},
    }
    for mode, conf in modes.items():
        old = {k: spark.conf.get(k, None) for k in conf}
        try:
            for k, v in conf.items():
                spark.conf.set(k, v)
            for parts in (1, 6):
                got[(mode, parts)] = summarize(df.repartition(parts), "uid", ["x"], SALT, keep_id=True).toPandas().sort_values("_pid").reset_index(drop=True)
        finally:
            for k, v in old.items():
                spark.conf.unset(k) if v is None else spark.conf.set(k, v)
    first = got[("generated", 1)]
    for k, frame in got.items():
        pd.testing.assert_frame_equal(frame, first, check_exact=True, obj=str(k))
    by_id = {}
    for pid, v in rows:
        by_id.setdefault(pid, []).append(v)
    for _, row in first.iterrows():
        vals = [v for v in by_id[row["_pid"]] if v is not None and math.isfinite(v)]
        assert row["_m_x"] == len(vals)
        assert (math.isnan(row["x"]) if not vals else row["x"] == person_mean(vals)), row["_pid"]


def test_native_aggregate_refuses_a_bad_call(spark):
    """The registered function checks its arguments (an error, not a crash)."""
    from pyspark.sql import functions as F

    from spark_jobs.spark import native

    assert native.enabled(spark)
    df = spark.createDataFrame([("a", 1.0)], "uid string, x double")
    with pytest.raises(Exception, match="person_dp_exact_sum takes one argument, got 0"):
        df.groupBy("uid").agg(F.expr("person_dp_exact_sum()")).collect()
    with pytest.raises(Exception, match="person_dp_exact_sum takes one argument, got 2"):
        df.groupBy("uid").agg(F.expr("person_dp_exact_sum(x, x)")).collect()
    with pytest.raises(Exception, match="(?i)data type|DATATYPE_MISMATCH"):
        df.groupBy("uid").agg(F.expr("person_dp_exact_sum(array(x))")).collect()


# ---------------------------------------------------------------------------------------------
# Record capping (max_records_per_person)
# ---------------------------------------------------------------------------------------------


def _capped_oracle(df, cols, cap):
    """Independent reference of capping: Spark gives only each record's JSON label (the input
    of the key); dplib's hashlib ``record_keys`` orders the records, pandas keeps the ``cap``
    smallest per person and dplib.summary.person_mean averages the finite kept values."""
    from pyspark.sql import functions as F

    from dplib.distribution.batches import record_keys
    from dplib.groups import derive_salt

    recs = df.select(F.col("uid").cast("string").alias("uid"), *cols, F.to_json(F.struct(*cols)).alias("label")).toPandas()
    recs = recs[recs.uid.notna() & ~recs.uid.str.strip().isin(["NA", ""])].reset_index(drop=True)
    keys = record_keys(recs.uid.tolist(), recs.label.tolist(), derive_salt(SALT, "record-cap"))
    recs["k1"], recs["k2"] = keys[:, 0], keys[:, 1]
    out = {}
    for uid, g in recs.groupby("uid"):
        kept = g.sort_values(["k1", "k2"]).head(cap)
        entry = {}
        for c in cols:
            v = [x for x in kept[c].to_numpy(dtype=float) if math.isfinite(x)]
            entry[c] = (person_mean(v) if v else None, len(v))
        out[uid] = entry
    return out


def test_capping_matches_the_keyed_hash_reference(spark, path):
    """Bit for bit against the hashlib reference: persons above, at and below the cap; exact
    duplicate records above the cap, the same duplicates in two persons; NaN, +-inf and nulls in a
    person above the cap (cap first, then the per-column rules); signed zeros; shuffled row
    orders and several partitionings."""
    from pyspark.sql import functions as F

    rng = np.random.default_rng(5)
    rows = []
    for i in range(40):
        n = [1, 3, 4, 9, 30][i % 5]
        for _ in range(n):
            rows.append((f"u{i}", float(rng.integers(0, 4)) if i % 2 else float(rng.normal()), float(rng.normal())))
    rows += [("u14", 1.0, 1.0)] * 12 + [("u19", 1.0, 1.0)] * 12 + [("u3", 2.0, 2.0)] * 3
    rows += [("u4", float("nan"), 7.0), ("u4", float("inf"), None), ("u4", None, float("-inf"))] * 4
    rows += [("u0", float("nan"), 7.0), ("NA", 1.0, 1.0), (None, 2.0, 2.0)]
    # -0.0 and 0.0 are two labels ("-0.0" / "0.0" in the JSON) although grouping equates them
    rows += [("u7", -0.0, 1.0)] * 3 + [("u7", 0.0, 1.0)] * 3 + [("u7", 0.0, -0.0)] * 2
    for z in range(10):  # which of the distinct records are kept depends on the zeros' keys
        rows += [(f"z{z}", -0.0, 1.0)] * 5 + [(f"z{z}", 0.0, 1.0)] * 5 + [(f"z{z}", float(t), float(t)) for t in range(1, 7)]
    assert len(rows) > len(set(rows))  # real duplicates
    df = spark.createDataFrame(rows, "uid string, x double, y double")
    want = _capped_oracle(df, ["x", "y"], 4)
    gi = dict(zip(group_index(list(want), SALT), want))
    for parts in (1, 6, 13):
        shuffled = df.orderBy(F.rand(parts)).repartition(parts)
        got = summarize(shuffled, "uid", ["x", "y"], SALT, max_records_per_person=4).toPandas()
        assert len(got) == len(want) == 50
        for _, row in got.iterrows():
            uid = gi[int(row["_group"])]
            for c in ("x", "y"):
                mean, m = want[uid][c]
                assert row[f"_m_{c}"] == m <= 4
                assert (row[c] is None or math.isnan(row[c])) if mean is None else row[c] == mean
    # a cap no person reaches keeps everything: the uncapped summary
    a = summarize(df, "uid", ["x", "y"], SALT, max_records_per_person=1000).toPandas().sort_values("_group")
    b = summarize(df, "uid", ["x", "y"], SALT).toPandas().sort_values("_group")
    pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True))


def test_capping_neighbour_leaves_other_persons_unchanged(spark, path):
    """Adding a person whose records duplicate other persons' records (same labels) changes no
    other person's capped summary, bit for bit (numbering of identical records is per person)."""
    base = [("a", 1.0)] * 10 + [("a", float(v)) for v in range(5)] + [("b", 1.0)] * 8 + [("b", 9.0), ("c", 3.0)]
    extra = [("z", 1.0)] * 50 + [("z", float(v)) for v in range(5)]
    got = [
        summarize(spark.createDataFrame(r, "uid string, x double").repartition(p), "uid", ["x"], SALT,
                  max_records_per_person=3).toPandas().set_index("_group").sort_index()
        for r, p in ((base, 3), (base + extra, 5))
    ]
    only_base = got[1].loc[got[0].index]
    pd.testing.assert_frame_equal(got[0], only_base)
    assert len(got[1]) == len(got[0]) + 1


def test_capping_draws_uniformly_without_replacement(spark, path):
    """2,000 persons, cap 5 of 20 records: record p of a person holds 2^p, so the kept sum is
    the bitmask of kept positions. Each position is kept by Binomial(2000, 1/4) persons
    (sd 19.4): every |z| < 4.5 (false alarm ~1e-4 over 20 cells); keeping the 5 lowest
    positions would give z = 77. A second set of persons has 10 identical records (value 1) and
    10 distinct ones (2^4..2^13): the identical ones kept per person are Hypergeometric(20, 10, 5),
    mean 2.5, variance 0.987 (sd of the mean of 2,000: 0.022; sd of the sample variance ~0.03);
    a key shared by identical records would keep them all or none (variance ~6)."""
    n = 2000
    rows = [(f"a{i}", float(2**p)) for i in range(n) for p in range(20)]
    rows += [(f"b{i}", 1.0) for i in range(n) for _ in range(10)]
    rows += [(f"b{i}", float(2 ** (4 + p))) for i in range(n) for p in range(10)]
    df = spark.createDataFrame(rows, "uid string, x double")
    got = summarize(df, "uid", ["x"], SALT, max_records_per_person=5).toPandas()
    assert (got["_m_x"] == 5).all() and len(got) == 2 * n
    gi = dict(zip(group_index([f"a{i}" for i in range(n)], SALT), range(n)))
    is_a = got["_group"].map(lambda g: int(g) in gi).to_numpy()
    masks = np.rint(got.loc[is_a, "x"].to_numpy() * 5).astype(np.int64)
    assert len(masks) == n
    kept = np.array([[(m >> p) & 1 for p in range(20)] for m in masks])
    assert (kept.sum(axis=1) == 5).all()
    z = (kept.sum(axis=0) - n / 4) / math.sqrt(n * 0.25 * 0.75)
    assert np.abs(z).max() < 4.5, z
    same = np.rint(got.loc[~is_a, "x"].to_numpy() * 5).astype(np.int64) % 16
    assert abs(same.mean() - 2.5) < 4.5 * 0.0222
    assert abs(same.var() - 5 * 0.25 * 15 / 19) < 0.15


def test_capping_bad_parameter_and_plan(spark):
    from dplib.errors import ConfigError, InvalidParameterError
    from dplib.summary import MAX_RECORDS_LIMIT
    from spark_jobs.config import SummaryConfig, parse_config

    df = spark.createDataFrame([("a", 1.0)], "uid string, x double")
    for bad in (0, -3, 2.5, True, 10**6):
        with pytest.raises(InvalidParameterError, match="max_records_per_person"):
            summarize(df, "uid", ["x"], SALT, max_records_per_person=bad)
    with pytest.raises(InvalidParameterError, match="below m_min"):
        summarize(df, "uid", ["x"], SALT, m_min=3, max_records_per_person=2)
    with pytest.raises(InvalidParameterError, match="label_columns"):
        summarize(df, "uid", ["x"], SALT, max_records_per_person=2, label_columns=["uid"])
    # the config's limit is the library's; YAML `true` is refused, not read as a cap of 1
    assert SummaryConfig(max_records_per_person=MAX_RECORDS_LIMIT).max_records_per_person == MAX_RECORDS_LIMIT
    base = {"job_name": "j", "input": {"path": "x.parquet"}, "privacy_unit": {"column": "uid"},
            "budget": {"epsilon": 1.0}, "output": {"path": "out"}, "ledger": {"enabled": False},
            "statistics": [{"name": "m", "kind": "mean", "columns": ["x"], "share": 1.0}]}
    for bad in (True, MAX_RECORDS_LIMIT + 1, 0):
        with pytest.raises(ConfigError, match="max_records_per_person"):
            parse_config({**base, "summary": {"max_records_per_person": bad}})
    plan = summarize(df, "uid", ["x"], SALT, max_records_per_person=3)._jdf.queryExecution().toString()
    assert "PythonUDF" not in plan and "BatchEvalPython" not in plan and SALT not in plan


def test_capping_in_bhs_person_vectors_keeps_the_summary_records(spark):
    """The BHS23 person vectors with a cap are the capped summary's means (same label columns,
    same kept records), bit for bit."""
    from spark_jobs.spark.vectors import person_vectors

    rng = np.random.default_rng(9)
    rows = [(f"p{i % 30}", float(rng.normal()), float(rng.normal()), float(rng.normal())) for i in range(600)]
    df = spark.createDataFrame(rows, "uid string, x double, y double, z double")
    labels = ["x", "y", "z"]
    summ = summarize(df, "uid", ["x", "y"], SALT, max_records_per_person=5, label_columns=labels, keep_id=True).toPandas()
    vec = person_vectors(df, "uid", ["x", "y"], SALT, max_records_per_person=5, label_columns=labels).toPandas()
    a = summ.set_index("_pid")[["x", "y"]].sort_index()
    b = vec.set_index("_pid")[["x", "y"]].sort_index()
    assert len(a) == 30 and (summ["_m_x"] == 5).all()
    pd.testing.assert_frame_equal(a, b)
    # a different label list draws other records: the label columns matter
    other = summarize(df, "uid", ["x", "y"], SALT, max_records_per_person=5, keep_id=True).toPandas()
    assert not np.array_equal(other.set_index("_pid")[["x"]].sort_index().to_numpy(), a[["x"]].to_numpy())


def test_capping_float_columns_keep_their_json_labels(spark, path):
    """A float (32-bit) value column: labels are the JSON of the float values ("1.1", not the
    double 1.100000023841858), signed zeros apart; bit for bit against the hashlib reference."""
    rows = []
    for p in range(12):
        rows += [(f"f{p}", -0.0)] * 4 + [(f"f{p}", 0.0)] * 4 + [(f"f{p}", 1.1)] * 2 + [(f"f{p}", float(t) / 3) for t in range(5)]
    df = spark.createDataFrame(rows, "uid string, x float")
    want = _capped_oracle(df, ["x"], 3)
    gi = dict(zip(group_index(list(want), SALT), want))
    got = summarize(df.repartition(5), "uid", ["x"], SALT, max_records_per_person=3).toPandas()
    assert len(got) == len(want) == 12
    for _, row in got.iterrows():
        mean, m = want[gi[int(row["_group"])]]["x"]
        assert row["_m_x"] == m == 3 and row["x"] == mean
