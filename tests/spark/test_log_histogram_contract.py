"""Backend contract for log-magnitude histograms: the numpy and Spark backends put every person
in the same bin (exact equality of the returned dicts), on values chosen to stress the exact
``floor(log2 |x|)``: powers of two and their neighbours ``2**k (1 +- 2**-52)``, subnormals, the
quarter-octave edges, zero, negatives, 1e300 / +-1e308 (clamped), and persons without a value
(NaN in numpy, null in Spark). The Spark backend brings back one row per non-empty bin."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dplib.aggregates import NumpyAggregates
from dplib.groups import ALL_PERSONS, GroupRange
from dplib.mean.ranges import QUARTER_OCTAVE
from spark_jobs.spark.aggregates import SparkAggregates

pytestmark = pytest.mark.spark


def _values(rng: np.random.Generator) -> np.ndarray:
    vals = [0.0, -0.0, 5e-324, -5e-324, 1e300, -1e300, 1e308, -1e308, 3.0, -3.0, 2.5, 1e-310]
    for k in range(-1074, 1024):
        p = math.ldexp(1.0, k)
        vals += [p, -p]
        if -1021 <= k <= 1022:
            vals += [p * (1 + 2.0**-52), p * (1 - 2.0**-53), -p * (1 + 2.0**-52)]
    for k in (-1021, -40, -1, 0, 1, 2, 50, 990):
        for edge in QUARTER_OCTAVE:
            v = math.ldexp(edge, k)
            vals += [v, math.nextafter(v, 0.0), -math.nextafter(v, math.inf)]
    # values x with x - 3 a power of two or just off it (for the centre 3.0)
    for k in range(-50, 50):
        p = math.ldexp(1.0, k)
        vals += [3.0 + p, 3.0 - p, math.nextafter(3.0 + p, 0.0)]
    n = 3000
    vals += list(10.0 ** rng.uniform(-320, 308, size=n) * rng.choice([-1.0, 1.0], size=n))
    vals += list(rng.normal(3.0, 2.0, size=n))
    out = np.array(vals, dtype=np.float64)
    out[rng.choice(out.size, 300, replace=False)] = np.nan  # persons without a value
    return out


@pytest.fixture(scope="module")
def backends(spark):
    rng = np.random.default_rng(2025)
    y = _values(rng)
    gi = rng.integers(0, 2**32, size=y.size)
    rows = [(int(g), None if np.isnan(v) else float(v)) for g, v in zip(gi, y)]
    df = spark.createDataFrame(rows, "_group long, v double").repartition(3).cache()
    df.count()
    return NumpyAggregates({"v": y}, gi), SparkAggregates(df), y, gi


CASES = [
    (0.0, (), ALL_PERSONS),
    (0.0, QUARTER_OCTAVE, ALL_PERSONS),
    (0.0, QUARTER_OCTAVE, GroupRange(0.25, 0.6)),
    (3.0, (), GroupRange(0.25, 0.6)),
    (3.0, QUARTER_OCTAVE, ALL_PERSONS),
    (-1e300, (), ALL_PERSONS),
    (-1e300, QUARTER_OCTAVE, GroupRange(0.0, 0.1)),
    (1e308, QUARTER_OCTAVE, ALL_PERSONS),  # centre clamped to 1e300
    (1e-310, (), ALL_PERSONS),
    (2.0**-1000, QUARTER_OCTAVE, GroupRange(0.9, 1.0)),
    (0.0, (1.1, 1.5, 1.9999), ALL_PERSONS),
]


@pytest.mark.parametrize("center,sub_edges,group", CASES, ids=lambda v: str(v) if not isinstance(v, tuple) else f"{len(v)}edges")
def test_log_histograms_identical(backends, center, sub_edges, group):
    np_b, sp_b, y, gi = backends
    before = sp_b.rows_collected
    got = sp_b.log_histogram("v", center, group, sub_edges)
    want = np_b.log_histogram("v", center, group, sub_edges)
    assert got == want
    assert all(isinstance(k, int) and isinstance(c, int) for k, c in got.items())
    # one row per non-empty bin came back, no per-person rows
    assert sp_b.rows_collected - before == len(got)
    # every person of the group with a value is counted once (independent count)
    lo, hi = group.bounds
    n_group = int(np.sum((gi >= lo) & (gi < hi) & ~np.isnan(y)))
    assert sum(got.values()) == n_group
