"""Spark backend of BHS23 (spark_jobs.spark.vectors) against the numpy backend: IDENTICAL results.

Same person vectors, same salt: the Spark path (keyed sort, n0 selection and padding, pair rows,
mapInArrow scans merged with treeReduce) and :class:`dplib.covariance.NumpyCovarianceBackend`
must give the same order, the same largest good subsets and cores (entry levels), scores,
weights, Sigma_hat and mu_hat bit for bit, and the same released values under the same seeded
noise, on clean Gaussian data and on data with nested gross outliers (several removal rounds).
d = 3; n is the smallest that passes Algorithm 1's gate at epsilon = 0.9, delta = 1e-3,
lambda0 = 25 (k = 62: 20 k lambda0 = 31,000).
"""

from __future__ import annotations

import numpy as np
import pytest

from dplib.budget import Budget
from dplib.covariance.params import PrivateCovariancePlan, PrivateMeanPlan
from dplib.covariance.person import NumpyPersonVectors, select_rows
from dplib.covariance.private import private_covariance, private_mean
from dplib.covariance.stable import stable_covariance, stable_mean
from dplib.mechanisms import SeededNoise
from spark_jobs.spark.vectors import SparkPersonVectors

pytestmark = pytest.mark.spark

SALT = "3a" * 32
N = 31000
D = 3
LAMBDA0 = 25.0


def _data(outliers: bool) -> np.ndarray:
    rng = np.random.default_rng(11 if outliers else 12)
    a = rng.standard_normal((D, D))
    x = rng.standard_normal((N, D)) @ a.T + [250.0, -3.0, 1e4]
    if outliers:  # nested shells: each removal round shrinks the Gram and exposes the next shell
        direction = np.array([1.0, -2.0, 0.5])
        for j, scale in enumerate([1e4, 300.0, 60.0, 20.0]):
            x[5 * j : 5 * j + 5] += scale * direction * (1 + np.arange(5))[:, None] / 5.0
    return x


def _sources(spark, x):
    import pandas as pd

    ids = [f"u{i}" for i in range(x.shape[0])]
    pdf = pd.DataFrame({"_pid": ids, **{f"c{j}": x[:, j] for j in range(D)}})
    df = spark.createDataFrame(pdf).repartition(3)
    return NumpyPersonVectors(ids, x, SALT), SparkPersonVectors(df, [f"c{j}" for j in range(D)], SALT), ids


@pytest.mark.parametrize("outliers", [False, True])
def test_spark_equals_numpy_building_blocks_and_release(spark, outliers):
    x = _data(outliers)
    np_src, sp_src, _ = _sources(spark, x)
    plan = PrivateMeanPlan(Budget(0.9, 1e-3), N, D, LAMBDA0)
    nb = np_src.backend(N, np.zeros(D), N)
    sb = sp_src.backend(N, np.zeros(D), N)
    try:
        assert (sb.n, sb.m, sb.d) == (nb.n, nb.m, nb.d)
        pos = nb.reference_positions(plan.M)
        assert np.array_equal(sb.fetch_rows(pos), nb.fetch_rows(pos))
        res = {}
        for name, be in (("numpy", nb), ("spark", sb)):
            sc = stable_covariance(be, plan.thresholds, plan.k)
            sm = stable_mean(be, sc.sigma_hat, plan.core_thresholds, plan.k, plan.M)
            res[name] = (sc, sm)
        (c1, m1), (c2, m2) = res["numpy"], res["spark"]
        assert c1.score == c2.score and c1.removed_level == c2.removed_level and c1.sizes == c2.sizes
        assert np.array_equal(c1.entry_levels(), c2.entry_levels())
        assert np.array_equal(c1.weights(), c2.weights())
        assert np.array_equal(c1.sigma_hat, c2.sigma_hat)
        assert m1.score == m2.score and np.array_equal(m1.level_counts, m2.level_counts)
        assert np.array_equal(m1.mu_hat, m2.mu_hat)
        assert c1.passes == c2.passes
        if outliers:
            assert c1.passes >= 4 and len(c1.removed_level) >= 15  # several removal rounds happened
            assert c1.score < plan.k and m1.score < plan.k
        else:  # P[chi2_3 > 25] = 1.6e-5: about 0.15 of the 9,300 pairs expected above lambda0
            assert c1.score <= 3
        # Sigma_hat against an independent numpy computation on the pairs (not the backend's sums)
        xo = select_rows([f"u{i}" for i in range(N)], x, SALT, N, np.zeros(D))
        y = (xo[0 : 2 * (N // 2) : 2] - xo[1 : 2 * (N // 2) : 2]) / np.sqrt(2.0)
        w = c1.weights()
        np.testing.assert_allclose(c1.sigma_hat, (y * w[:, None]).T @ y, rtol=1e-10)
        # released values under the same seeded noise
        o1 = private_mean(nb, plan, SeededNoise(5), keep_internals=True)
        o2 = private_mean(sb, plan, SeededNoise(5), keep_internals=True)
        assert o1.release.status == o2.release.status == "OK"
        assert np.array_equal(o1.release.mean, o2.release.mean)
        for key in ("score1", "score2"):
            assert o1.diagnostics.internals[key] == o2.diagnostics.internals[key]
        for key in ("sigma_hat", "mu_hat"):
            assert np.array_equal(o1.diagnostics.internals[key], o2.diagnostics.internals[key])
        if outliers:
            return
        cplan = PrivateCovariancePlan(Budget(0.9, 5e-4), N // 2, D, LAMBDA0)
        q1 = private_covariance(nb, cplan, SeededNoise(6), keep_internals=True)
        q2 = private_covariance(sb, cplan, SeededNoise(6), keep_internals=True)
        assert q1.release.status == q2.release.status
        if q1.release.covariance is not None:
            assert np.array_equal(q1.release.covariance, q2.release.covariance)
        assert np.array_equal(q1.diagnostics.internals["sigma_hat_cov"], q2.diagnostics.internals["sigma_hat_cov"])
    finally:
        sb.close()


def test_selection_order_and_padding_match_numpy(spark):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((300, D))
    x[7] = x[8]  # identical vectors: the tie rule is the vector itself
    np_src, sp_src, ids = _sources(spark, x)
    dummy = np.array([1.5, -2.0, 0.0])
    for n0 in (211, 333):  # subsample; padded with 33 dummies
        want = select_rows(ids, x, SALT, n0, dummy)
        sb = sp_src.backend(n0, dummy, 300)
        try:
            got = sb.fetch_rows(np.arange(n0))
        finally:
            sb.close()
        assert np.array_equal(got, want)
        assert (np.all(want == dummy, axis=1).sum() == max(0, n0 - 300))
    # the selected persons are those of smallest keyed hash (independent recomputation)
    import hashlib

    # 128-bit keys (32 hex characters): ties are negligible against any delta even at 1e8 persons
    keys = [int(hashlib.sha256((SALT + ":bhs23-order:p:" + i).encode()).hexdigest()[:32], 16) for i in ids]
    first = np.argsort(keys, kind="stable")[:211]
    assert np.array_equal(select_rows(ids, x, SALT, 211, dummy), x[first])


def test_a_failing_selection_leaves_nothing_cached(spark):
    """A Spark failure while the n0 rows are ranked (here a value that raises when evaluated)
    propagates and leaves no DataFrame cached behind it."""
    from pyspark.errors import PySparkException
    from pyspark.sql import functions as F

    x = np.random.default_rng(4).standard_normal((50, D))
    _, sp_src, _ = _sources(spark, x)
    bad = sp_src._df.withColumn("c0", F.when(F.col("_pid") == "u5", F.raise_error(F.lit("bad value"))).otherwise(F.col("c0")))
    src = SparkPersonVectors(bad, [f"c{j}" for j in range(D)], SALT)
    spark.catalog.clearCache()
    cache = spark._jsparkSession.sharedState().cacheManager()
    with pytest.raises(PySparkException, match="bad value"):
        src.backend(40, np.zeros(D), 50)
    assert cache.isEmpty()
