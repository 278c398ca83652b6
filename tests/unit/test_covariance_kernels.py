"""Partition-independent arithmetic of the BHS23 backends (dplib.covariance.kernels).

Oracles: math.fsum (correctly rounded exact sum), scipy's triangular solve, the elementwise
distances; invariance is checked by splitting the same rows in different ways.
"""

import math

import numpy as np
import pytest
from scipy.linalg import solve_triangular

from dplib.covariance import backend as bk
from dplib.covariance.backend import NumpyCovarianceBackend, merge_scan, scan_block, finish_scan
from dplib.covariance.kernels import (
    ExactSum,
    core_levels,
    entry_levels,
    exact_gram,
    gram_from_sum,
    row_sq_norms,
    sq_distances,
    whiten_rows,
)


def _wide(rng, n, e):
    return rng.standard_normal((n, e)) * 10.0 ** rng.integers(-30, 30, size=(n, e))


def test_exact_sum_is_fsum_whatever_the_split():
    rng = np.random.default_rng(1)
    v = _wide(rng, 3000, 4)
    v[5, 0], v[6, 0] = 1e100, -1e100  # catastrophic cancellation
    v[7, 1] = 5e-324  # subnormal
    want = np.array([math.fsum(v[:, j]) for j in range(4)])
    whole = ExactSum(4).add(v).value()
    assert np.array_equal(whole, want)
    for trial in range(3):
        cuts = np.sort(rng.choice(np.arange(1, 3000), size=7, replace=False))
        parts = [ExactSum(4).add(p) for p in np.split(v[rng.permutation(3000)], cuts)]
        acc = ExactSum(4)
        for p in parts[::-1]:
            acc.merge(p)
        assert np.array_equal(acc.value(), want)


def test_exact_gram_matches_fsum_of_products():
    rng = np.random.default_rng(2)
    y = rng.standard_normal((500, 3)) * [1.0, 1e6, 1e-6] + [0.0, 3e7, 0.0]
    g = gram_from_sum(exact_gram(y, batch=64), 3)
    for a in range(3):
        for b in range(3):
            assert g[a, b] == math.fsum(y[:, a] * y[:, b])


def test_whiten_rows_rowwise_and_accurate():
    rng = np.random.default_rng(3)
    a = rng.standard_normal((6, 6))
    L = np.linalg.cholesky(a @ a.T + 6 * np.eye(6))
    y = rng.standard_normal((1000, 6))
    t = whiten_rows(L, y)
    np.testing.assert_allclose(t, solve_triangular(L, y.T, lower=True).T, rtol=1e-12, atol=1e-12)
    idx = rng.permutation(1000)[:77]
    assert np.array_equal(whiten_rows(L, y[idx]), t[idx])
    assert np.array_equal(row_sq_norms(t[idx]), row_sq_norms(t)[idx])


def test_core_levels_equal_elementwise_levels_near_thresholds():
    rng = np.random.default_rng(4)
    k, M, d = 3, 40, 3
    ref = rng.standard_normal((M, d))
    t = rng.standard_normal((400, d)) * 2.0
    t[:50] *= 0.1  # certainly level 0
    full = sq_distances(t, ref)
    # thresholds placed exactly on attained distances: ties decided as the elementwise values say
    lam = np.sort(full.ravel())[::-1][[500, 400, 300, 200, 150, 100, 50]] / 2.0
    lam = np.sort(lam)
    want = entry_levels(full, lam, k)
    assert np.array_equal(core_levels(t, ref, lam, k), want)
    assert len(set(want.tolist())) > 2
    loose = np.full(2 * k + 1, 1e6)
    assert np.array_equal(core_levels(t, ref, loose, k), np.zeros(400, dtype=np.int64))


def test_scan_partials_merge_to_the_same_result_in_any_split():
    rng = np.random.default_rng(5)
    y = rng.standard_normal((700, 3))
    y[:4] *= 30.0
    L = np.linalg.cholesky(y.T @ y / 700)
    thr = np.array([2.0, 4.0, 8.0, 16.0])
    pos = np.arange(700)
    one = finish_scan(scan_block(L, y, pos, thr, 5), 3)
    cuts = [0, 13, 300, 301, 700]
    parts = [scan_block(L, y[a:b], pos[a:b], thr, 5) for a, b in zip(cuts[:-1], cuts[1:])]
    acc = parts[3]
    for p in parts[:3]:
        acc = merge_scan(p, acc, 5)
    two = finish_scan(acc, 3)
    assert np.array_equal(one.counts_above, two.counts_above)
    assert np.array_equal(one.top_positions, two.top_positions) and np.array_equal(one.top_scores, two.top_scores)
    for b in one.bucket_grams:
        assert np.array_equal(one.bucket_grams[b], two.bucket_grams[b])
    s = np.einsum("ij,ij->i", *(2 * [solve_triangular(L, y.T, lower=True).T]))
    np.testing.assert_array_equal(one.counts_above, [(s > t_).sum() for t_ in thr])
    assert set(one.top_positions.tolist()) == set(np.argsort(-s)[:5].tolist())
    np.testing.assert_allclose(one.gram_below(1), y[s <= thr[1]].T @ y[s <= thr[1]], rtol=1e-12)


@pytest.mark.parametrize("batches", [(7, 5), (65536, 4096)])
def test_numpy_backend_independent_of_batch_size(monkeypatch, batches):
    from dplib.covariance.stable import stable_covariance, stable_mean

    rng = np.random.default_rng(6)
    x = rng.standard_normal((300, 2))
    x[:2] += 40.0
    # a fixed salt: the removal check below depends on the salted order (with fresh salts the
    # score was 0 in 2 of 300 runs under NumPy 2: a cold CI's np2 step met one); this salt gives
    # 2 under NumPy 1.26 and 2.4
    salt = "5a" * 32
    k, lam0 = 4, 25.0  # small constants (no gate): only the arithmetic is under test
    thr = tuple(lam0 / (1 - ell / (10 * k)) for ell in range(2 * k + 1))
    Lam = tuple(lam0 * (1.02) ** ell for ell in range(2 * k + 1))
    ref = {}
    for sb, cb in [(65536, 4096), batches]:
        monkeypatch.setattr(bk, "SCAN_BATCH", sb)
        monkeypatch.setattr(bk, "CORE_BATCH", cb)
        be = NumpyCovarianceBackend.from_data(x, salt)
        sc = stable_covariance(be, thr, k)
        sm = stable_mean(be, sc.sigma_hat, Lam, k, 6 * k + 5)
        ref[(sb, cb)] = (sc.score, sc.removed_level, sc.sigma_hat.tobytes(), sm.score, sm.mu_hat.tobytes())
    a, b = ref[(65536, 4096)], ref[batches]
    assert a == b
    assert 2 <= a[0] < k  # the planted outliers were removed, not a FAIL
