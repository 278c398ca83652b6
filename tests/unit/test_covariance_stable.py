"""BHS23 building blocks: fast StableCovariance/StableMean == the literal definitions, stability
lemmas on adversarial neighbours, crafted data sets (outliers, shells, singular), equivariance."""

from __future__ import annotations

import numpy as np
import pytest

from dplib.covariance.backend import NumpyCovarianceBackend, whiten
from dplib.covariance.kernels import entry_levels
from dplib.covariance.literal import largest_good_subset, stable_covariance_literal, stable_mean_literal
from dplib.covariance.order import pair
from dplib.covariance.params import core_thresholds, thresholds
from dplib.covariance.stable import stable_covariance, stable_mean, weight_count

SALT = "ab" * 32


def backend_of(x_ordered: np.ndarray) -> NumpyCovarianceBackend:
    return NumpyCovarianceBackend(pair(x_ordered), x_ordered, SALT)


def heavy(n: int, d: int, seed: int, df: float = 3.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(d, d)) + 2 * np.eye(d)
    return rng.standard_t(df, size=(n, d)) @ a.T + 5.0


def concentrated(n: int, d: int, seed: int, straggle: float = 0.15) -> np.ndarray:
    """Random directions with radius 1 + straggle |t_3|, then an affine map: few stragglers."""
    rng = np.random.default_rng(seed)
    u = rng.normal(size=(n, d))
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    x = u * (1.0 + straggle * np.abs(rng.standard_t(3.0, size=(n, 1))))
    a = rng.normal(size=(d, d)) + 2 * np.eye(d)
    return x @ a.T + 5.0


def check_cov_equal(y: np.ndarray, lambda0: float, k: int):
    fast = stable_covariance(NumpyCovarianceBackend(y), thresholds(lambda0, k), k)
    lit = stable_covariance_literal(y, lambda0, k)
    assert fast.score == lit.score
    for ell in fast.sizes:
        np.testing.assert_array_equal(fast.subset(ell), lit.subsets[ell])
    if fast.score < k:
        np.testing.assert_array_equal(fast.weights(), lit.weights)
        np.testing.assert_allclose(fast.sigma_hat, lit.sigma_hat, rtol=1e-9, atol=1e-12 * np.abs(lit.sigma_hat).max())
    else:
        assert fast.sigma_hat is None
        # early stop is exact: every unsettled level of the literal family has <= m - k rows
        for ell in range(2 * k + 1):
            if ell not in fast.sizes:
                assert lit.subsets[ell].size <= y.shape[0] - k
    return fast, lit


@pytest.mark.parametrize(
    "seed,lambda0,k,df,expect_fail",
    [(0, 12.0, 4, 5.0, False), (1, 20.0, 6, 3.0, False), (2, 20.0, 3, 3.0, False), (3, 12.0, 6, 5.0, False),
     (3, 20.0, 4, 5.0, False), (0, 6.0, 4, 3.0, True), (4, 8.0, 5, 3.0, True)],
)
def test_fast_stable_covariance_equals_literal_on_heavy_tails(seed, lambda0, k, df, expect_fail):
    y = pair(heavy(400, 3, seed, df))
    fast, _ = check_cov_equal(y, lambda0, k)
    assert (fast.score == k) == expect_fail
    if not expect_fail:
        assert fast.score > 0 and len(fast.removed_level) >= 2  # removals really happened


def test_fast_equals_literal_with_cascading_shells():
    # nested shells: each removal round shrinks Sigma_S and exposes the next shell
    rng = np.random.default_rng(7)
    core = rng.normal(size=(372, 2))
    shells = [30.0 * 25.0**j * np.array([np.cos(t), np.sin(t)]) for j, t in enumerate(rng.uniform(0, 6.3, 8))]
    y = np.vstack([core, shells])
    fast, lit = check_cov_equal(y, 30.0, 15)
    assert fast.passes >= 5  # several removal rounds really happened
    assert fast.score == 8


def test_gross_outliers_give_score_equal_to_their_number():
    rng = np.random.default_rng(3)
    d, m, r, k = 3, 1000, 5, 12
    y = rng.normal(size=(m, d))
    y /= np.linalg.norm(y, axis=1, keepdims=True)  # well concentrated: leverage ~ d
    y[:r] = 1e6 * rng.normal(size=(r, d))
    fast, _ = check_cov_equal(y, 10.0, k)
    assert fast.score == r
    assert set(fast.removed_level) == set(range(r))


def test_too_many_outliers_stop_early_with_score_k():
    rng = np.random.default_rng(4)
    y = rng.normal(size=(300, 2))
    y[:20] = 1e8 * rng.normal(size=(20, 2))
    fast, _ = check_cov_equal(y, 8.0, 6)
    assert fast.score == 6 and not fast.complete and fast.sigma_hat is None
    assert fast.passes <= 6 + 2  # never more than k + 1 scans plus the Gram


@pytest.mark.parametrize("kind", ["constant", "duplicate", "sum", "zero"])
def test_singular_data_are_all_outliers_no_linalg_error(kind):
    rng = np.random.default_rng(5)
    y = rng.normal(size=(200, 3))
    if kind == "constant":
        y[:, 1] = 0.0  # pairs of a constant column are exactly 0
    elif kind == "duplicate":
        y[:, 2] = y[:, 0]
    elif kind == "sum":
        y[:, 2] = y[:, 0] + y[:, 1]
    else:
        y[:] = 0.0
    fast, lit = check_cov_equal(y, 10.0, 4)
    assert fast.score == 4 and fast.singular_level == 8
    assert largest_good_subset(y, 1e9).size == 0


def test_literal_good_subset_definition():
    # every returned set is lambda-good (normalised by m), and adding any removed row breaks it
    y = pair(concentrated(600, 2, 11, straggle=0.15))
    m = y.shape[0]
    S = largest_good_subset(y, 6.0)
    sig = y[S].T @ y[S] / m
    lev = np.einsum("ij,ji->i", y, np.linalg.solve(sig, y.T))
    assert lev[S].max() <= 6.0
    assert 0 < S.size < m
    for i in np.setdiff1d(np.arange(m), S)[:5]:  # adding back any removed row breaks goodness
        T = np.union1d(S, [i])
        sig_t = y[T].T @ y[T] / m
        assert np.einsum("ij,ji->i", y[T], np.linalg.solve(sig_t, y[T].T)).max() > 6.0


def check_mean_equal(xo: np.ndarray, lambda0: float, k: int, M: int, gamma: float):
    b = backend_of(xo)
    sc = stable_covariance(b, thresholds(lambda0, k), k)
    assert sc.score < k
    fast = stable_mean(b, sc.sigma_hat, core_thresholds(lambda0, gamma, k), k, M)
    R = b.reference_positions(M)
    lit = stable_mean_literal(xo, sc.sigma_hat, lambda0, gamma, k, R)
    assert fast.score == lit.score
    cum = np.cumsum(fast.level_counts)
    for ell in range(2 * k + 1):
        assert cum[ell] == lit.subsets[ell].size
    if lit.mu_hat is not None:
        np.testing.assert_allclose(fast.mu_hat, lit.mu_hat, rtol=1e-10, atol=1e-10)
    return fast, lit, sc


@pytest.mark.parametrize(
    "seed,straggle,lambda0,k,n", [(1, 0.15, 6.0, 5, 600), (0, 0.1, 6.0, 5, 600), (3, 0.3, 10.0, 4, 800)]
)
def test_fast_stable_mean_equals_literal(seed, straggle, lambda0, k, n):
    xo = concentrated(n, 2, seed, straggle)
    xo[:2] += 40.0  # a few far points, so some cores are incomplete
    fast, _, _ = check_mean_equal(xo, lambda0, k, 6 * k + 7, 20.0 * lambda0 / (7.0 * (n // 2)))
    assert fast.score > 0


def test_fast_stable_mean_weights_equal_literal_membership():
    xo = concentrated(600, 2, 2, straggle=0.1)
    xo[:4] *= 30.0
    k, lam = 5, 6.0
    fast, lit, _ = check_mean_equal(xo, lam, k, 40, 20.0 * lam / (7.0 * 300))
    # the literal weights w_i = c_i / Z, with c_i counted from the 2k + 1 literal cores
    c = np.zeros(600)
    for ell in range(k + 1, 2 * k + 1):
        c[lit.subsets[ell]] += 1
    z = float(np.dot([2 * k - max(e, k + 1) + 1 for e in range(2 * k + 1)], fast.level_counts[: 2 * k + 1]))
    assert z == c.sum()
    np.testing.assert_array_equal(lit.weights, c / c.sum())


# ---------------------------------------------------------------------------------------------
# Stability on adversarial neighbours (BHS23's stability of StableCovariance and StableMean): one
# row replaced by an extreme point
# ---------------------------------------------------------------------------------------------


def replacements(xo: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    d = xo.shape[1]
    far = 1e7 * np.eye(d)[0]
    return [far, -far, xo[5].copy(), np.zeros(d), xo.mean(axis=0) + 3 * xo.std(axis=0), 50 * rng.normal(size=d)]


@pytest.mark.parametrize("seed", [0, 1, 3])
def test_stable_covariance_neighbours_lemmas_26_32_24(seed):
    rng = np.random.default_rng(seed)
    k, lam = 6, 8.0
    xo = concentrated(960, 2, seed)
    m = 480
    assert m >= 10 * k * lam  # Lemma 28's condition
    gamma = 20.0 * lam / (7.0 * m)
    base = stable_covariance(backend_of(xo), thresholds(lam, k), k)
    checked = 0
    for i_star in (0, 1, 57, 959):
        for z in replacements(xo, rng):
            x2 = xo.copy()
            x2[i_star] = z
            other = stable_covariance(backend_of(x2), thresholds(lam, k), k)
            assert abs(base.score - other.score) <= 2  # Lemma 32
            if base.score < k and other.score < k:
                p = i_star // 2  # the pair holding row i_star
                w, w2 = base.weights(), other.weights()
                mask = np.arange(m) != p
                assert np.abs(w - w2)[mask].sum() <= 1.0 / m + 1e-15  # Lemma 26
                assert w[p] <= 1.0 / m and w2[p] <= 1.0 / m
                # Lemma 24/11: (1 - gamma) Sigma <= Sigma' <= Sigma / (1 - gamma)
                ev = np.linalg.eigvals(np.linalg.solve(base.sigma_hat, other.sigma_hat)).real
                assert ev.min() >= 1.0 - gamma - 1e-12 and ev.max() <= 1.0 / (1.0 - gamma) + 1e-12
                checked += 1
    assert checked >= 12


@pytest.mark.parametrize("seed", [0, 3])
def test_stable_mean_neighbours_lemmas_39_42_13(seed):
    rng = np.random.default_rng(seed)
    k, lam = 6, 8.0
    xo = concentrated(960, 2, seed, straggle=0.1)
    n, m, M = 960, 480, 6 * 6 + 20
    gamma = 20.0 * lam / (7.0 * m)
    Lam = core_thresholds(lam, gamma, k)

    def run(x):
        b = backend_of(x)
        sc = stable_covariance(b, thresholds(lam, k), k)
        sm = stable_mean(b, sc.sigma_hat, Lam, k, M) if sc.score < k else None
        return sc, sm, b

    sc, sm, b = run(xo)
    assert sc.score < k and sm.score < k
    R = b.reference_positions(M)
    checked = 0
    for i_star in (3, 100, int(R[0]), 959):
        for z in replacements(xo, rng):
            x2 = xo.copy()
            x2[i_star] = z
            sc2, sm2, _ = run(x2)
            if sc2.score >= k:
                continue
            assert abs(sm.score - sm2.score) <= 2  # Lemma 42 (fixed R, gamma-close covariances)
            if sm2.score < k:
                w = row_weights(x2, sc2, Lam, k, R)
                w0 = row_weights(xo, sc, Lam, k, R)
                mask = np.arange(n) != i_star
                assert np.abs(w0 - w)[mask].sum() <= 3.0 / ((1 - k / n) ** 2 * n) + 1e-12  # Lemma 39
                assert max(w0[i_star], w[i_star]) <= 1.0 / ((1 - k / n) * n) + 1e-12
                diff = sm.mu_hat - sm2.mu_hat
                bound = 50.0 / ((1 - gamma) ** (2 * k + 1) * (1 - k / n) ** 4) * lam / n**2  # Lemma 13, constant 50
                assert diff @ np.linalg.solve(sc.sigma_hat, diff) <= bound
                checked += 1
    assert checked >= 8


def row_weights(x, sc, Lam, k, R):
    """Per-row StableMean weights from the whole (n, M) distance matrix (entry levels checked
    against the literal cores in the equality tests above)."""
    f = np.linalg.cholesky(sc.sigma_hat)
    t, tr = whiten(f, x - x[R[0]]), whiten(f, x[R] - x[R[0]])
    dist = ((t[:, None, :] - tr[None, :, :]) ** 2).sum(axis=2)
    c = weight_count(entry_levels(dist, Lam, k), k).astype(float)
    return c / c.sum()


def test_affine_equivariance_of_nonprivate_estimates():
    rng = np.random.default_rng(12)
    xo = concentrated(400, 3, 3, straggle=0.1)
    xo[:2] *= 25
    u, _ = np.linalg.qr(rng.normal(size=(3, 3)))
    B = u @ np.diag([1.0, 1e-2, 1e2]) @ u.T  # condition number 1e4
    shift = np.array([1e3, -2e3, 5e2])
    k, lam, M = 4, 10.0, 40
    gamma = 20.0 * lam / (7.0 * 200)
    out = []
    for x in (xo, xo @ B.T + shift):
        b = backend_of(x)
        sc = stable_covariance(b, thresholds(lam, k), k)
        sm = stable_mean(b, sc.sigma_hat, core_thresholds(lam, gamma, k), k, M)
        out.append((sc, sm))
    (sc, sm), (sc2, sm2) = out
    assert sc.score == sc2.score and sm.score == sm2.score and 0 < sc.score < k and sm.mu_hat is not None
    assert sc.removed_level == sc2.removed_level
    np.testing.assert_array_equal(sm.level_counts, sm2.level_counts)
    np.testing.assert_allclose(sc2.sigma_hat, B @ sc.sigma_hat @ B.T, rtol=1e-8, atol=1e-8 * np.abs(sc2.sigma_hat).max())
    np.testing.assert_allclose(sm2.mu_hat, B @ sm.mu_hat + shift, rtol=1e-9, atol=1e-7)
