"""Contract of the derived per-person columns and of the d = 1 seam calls the variance and the sum
use: the Spark side (``spark_jobs.spark.derived``, ``SparkAggregates``) equals the numpy twin
(``dplib.derived``, ``NumpyAggregates``) bit for bit on the job's own summary, and the totals equal
a pandas oracle computed from the records."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dplib.aggregates import NumpyAggregates
from dplib.derived import derive_columns, total_column
from dplib.errors import InvalidParameterError
from dplib.groups import ALL_PERSONS, GroupRange
from spark_jobs.spark.aggregates import SparkAggregates
from spark_jobs.spark.derived import derived_aggregates, with_derived_columns
from spark_jobs.spark.summarize import summarize

pytestmark = pytest.mark.spark

SALT = "cd" * 32
SPEC = {total_column("x"): ("x", "total")}


@pytest.fixture(scope="module")
def summary(spark):
    """The summary of 600 persons' records (1-12 records each, some NaN and huge values), as the
    job builds it, collected to pandas too."""
    rng = np.random.default_rng(3)
    rows = []
    for p in range(600):
        for _ in range(int(rng.integers(1, 13))):
            v = float(rng.normal(20.0, 5.0))
            rows.append((f"p{p}", v))
    rows += [("p0", float("nan")), ("p1", 1e25), ("p2", -3e28)]
    pdf = pd.DataFrame(rows, columns=["pid", "x"])
    df = spark.createDataFrame(pdf)
    s = summarize(df, "pid", ["x"], SALT, m_min=2).cache()
    return pdf, s, s.toPandas()


def test_totals_match_numpy_twin_and_records(summary):
    pdf, s, local = summary
    derived = with_derived_columns(s, SPEC).toPandas()
    twin = derive_columns({"x": local["x"].to_numpy(dtype=float)}, {"x": local["_m_x"].to_numpy(dtype=float)}, SPEC)
    got = derived[total_column("x")].to_numpy(dtype=float)
    assert np.array_equal(np.isnan(got), np.isnan(twin[total_column("x")]))
    assert np.array_equal(got[~np.isnan(got)], twin[total_column("x")][~np.isnan(got)])  # bit for bit
    # oracle: persons with at least m_min = 2 finite records; total = their sum
    rec = pdf[np.isfinite(pdf["x"])]
    sizes = rec.groupby("pid")["x"].size()
    oracle = rec.groupby("pid")["x"].sum()[sizes >= 2]
    assert np.isnan(got).sum() == int((sizes < 2).sum())
    assert np.sort(got[~np.isnan(got)]) == pytest.approx(np.sort(oracle.to_numpy()), rel=1e-12)


def test_derived_spec_errors(summary):
    _, s, _ = summary
    with pytest.raises(InvalidParameterError, match="holds no column"):
        with_derived_columns(s, {"t": ("nope", "total")})
    with pytest.raises(InvalidParameterError):
        with_derived_columns(s, {"t": ("x", "square")})


@pytest.mark.parametrize("group", [ALL_PERSONS, GroupRange(0.2, 0.7)], ids=str)
@pytest.mark.parametrize("center,radius", [(20.0, 9.0), (0.0, 1e-4), (1e3, 5e27)])
def test_scaled_one_column_sums_equal(summary, group, center, radius):
    """The variance's final stage: clipped outer and clipped sums with d = 1, scales = [radius]
    and radius 1, on the mean column and on the derived totals."""
    _, s, local = summary
    sp = derived_aggregates(s, SPEC)
    twin_cols = derive_columns({"x": local["x"].to_numpy(dtype=float)}, {"x": local["_m_x"].to_numpy(dtype=float)}, SPEC)
    nb = NumpyAggregates({"x": local["x"].to_numpy(dtype=float), **twin_cols}, local["_group"].to_numpy())
    for col in ("x", total_column("x")):
        a = sp.clipped_outer_sum([col], np.array([center]), 1.0, group, np.array([radius]))
        b = nb.clipped_outer_sum([col], np.array([center]), 1.0, group, np.array([radius]))
        assert a[1] == b[1] and np.array_equal(a[0], b[0])
        a = sp.clipped_sum([col], np.array([center]), 1.0, group, np.array([radius]))
        b = nb.clipped_sum([col], np.array([center]), 1.0, group, np.array([radius]))
        assert a[1] == b[1] and np.array_equal(a[0], b[0])
        assert sp.count([col], group) == nb.count([col], group)
    # the derived seam leaves the shared one alone
    assert total_column("x") not in SparkAggregates(s)._df.columns
