"""Seeded statistical tests of BHS23's random steps, each against its exact law, with a power check.

Every test has false-positive rate 1e-3 (two-sided, Bonferroni where several statistics are
tested) under the exact distribution stated; each power check applies the same test to a
30%-wrong noise scale (or a shifted probability) and must reject.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from dplib.budget import Budget
from dplib.covariance import PrivateCovariancePlan, PrivateMeanPlan, numpy_backend, private_covariance, private_mean
from dplib.covariance.sampling import chi_square, gaussian_draw, ptr, ptr_pass_probability, uniforms, wishart_release
from dplib.mechanisms import SeededNoise

ALPHA = 1e-3
SALT = "0f" * 32


def sphere(n, d, seed, center=0.0):
    rng = np.random.default_rng(seed)
    u = rng.normal(size=(n, d))
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    return u @ (rng.normal(size=(d, d)) + 3 * np.eye(d)).T + center


def chi2_two_sided_ok(stat: float, dof: float, alpha: float = ALPHA) -> bool:
    return stats.chi2.ppf(alpha / 2, dof) <= stat <= stats.chi2.isf(alpha / 2, dof)


def test_uniforms_from_normals_are_uniform():
    u = uniforms(SeededNoise(1), 20000)
    assert stats.kstest(u, "uniform").pvalue > ALPHA
    assert stats.kstest(u**1.1, "uniform").pvalue < ALPHA  # power: a mildly wrong law is rejected


def test_ptr_pass_probability_matches_claim_10():
    eps, delta = 0.9, 0.09
    z, trials = 4, 4000
    p = ptr_pass_probability(z, eps, delta)
    assert p == 1 - delta * math.exp(eps / 2 * (z - 2))
    noise = SeededNoise(7)
    passes = sum(ptr(z, eps, delta, noise) for _ in range(trials))
    assert stats.binomtest(passes, trials, p).pvalue > ALPHA
    assert stats.binomtest(passes, trials, p - 0.05).pvalue < ALPHA  # power
    # deterministic branches: z = 0 passes, z >= tau fails, and neither draws a coin
    tau = 2 * math.log((1 - delta) / delta) / eps + 4
    assert ptr(0, eps, delta, None) and not ptr(math.ceil(tau), eps, delta, None)


def test_chi_square_both_paths():
    noise = SeededNoise(3)
    for dof in (5, 500):
        draws = np.array([chi_square(noise, dof) for _ in range(1500)])
        assert stats.kstest(draws, stats.chi2(dof).cdf).pvalue > ALPHA / 2
        assert stats.kstest(draws, stats.chi2(dof * 1.1).cdf).pvalue < ALPHA / 2  # power


def test_released_mean_has_the_exact_conditional_law():
    """Given the non-private (mu_hat, Sigma_hat) and PASS, mu_tilde ~ N(mu_hat, c^2 Sigma_hat) exactly:
    T = (mu_tilde - mu_hat)^T Sigma_hat^{-1} (mu_tilde - mu_hat) / c^2 ~ chi2_d, so the sum over
    R independent releases is chi2_{R d}."""
    d, n = 3, 20 * 57 * 10
    plan = PrivateMeanPlan(Budget(0.99, 1e-3), n, d, 10.0)
    backend = numpy_backend(sphere(n, d, 1, center=300.0), SALT)
    stats_e2e = []
    for seed in range(8):  # end to end: same salt, fresh noise; scores 0 so PASS is certain
        out = private_mean(backend, plan, SeededNoise(100 + seed), keep_internals=True)
        it = out.diagnostics.internals
        assert out.release.status == "OK" and it["score1"] == it["score2"] == 0
        diff = out.release.mean - it["mu_hat"]
        stats_e2e.append(diff @ np.linalg.solve(it["sigma_hat"], diff))
    mu_hat, sigma_hat, c2 = it["mu_hat"], it["sigma_hat"], it["c2"]
    noise = SeededNoise(5)
    draws = np.array([gaussian_draw(mu_hat, sigma_hat, math.sqrt(c2), noise) for _ in range(3000)]) - mu_hat
    quad = np.einsum("ij,ji->i", draws, np.linalg.solve(sigma_hat, draws.T))
    total = np.concatenate([stats_e2e, quad])
    r = total.size
    assert chi2_two_sided_ok(total.sum() / c2, r * d)
    assert not chi2_two_sided_ok(total.sum() / (1.3**2 * c2), r * d)  # power: c 30% too large
    assert not chi2_two_sided_ok(total.sum() / (0.7**2 * c2), r * d)  # and 30% too small
    # the direction is right too: whitened draws are N(0, c^2 I) coordinate-wise (no rotation error)
    white = np.linalg.solve(np.linalg.cholesky(sigma_hat), draws.T).T / math.sqrt(c2)
    assert stats.kstest(white.ravel(), "norm").pvalue > ALPHA


def test_wishart_release_has_the_exact_conditional_law():
    """Given Sigma_hat and PASS, W = N A^{-1} Sigma_tilde A^{-T} ~ Wishart_d(N, I) (A = chol Sigma_hat):
    each W_jj ~ chi2_N and each W_jl (j != l) has mean 0 and variance N."""
    eps, delta, lam, d = 0.9, 1e-4, 6.0, 3
    k = math.ceil(4 * math.log(2 / delta) / eps) + 4
    n = 10 * k * 6
    y = sphere(n, d, 2)
    plan = PrivateCovariancePlan(Budget(eps, delta), n, d, lam)
    out = private_covariance(numpy_backend(y, SALT, paired=False), plan, SeededNoise(9), keep_internals=True)
    it = out.diagnostics.internals
    assert out.release.status == "OK" and it["score_cov"] == 0
    sigma_hat, N = it["sigma_hat_cov"], plan.N
    assert N > 64  # the Bartlett diagonal uses the gamma-rejection path
    a = np.linalg.cholesky(sigma_hat)
    noise = SeededNoise(11)
    reps = 400
    ws = [out.release.covariance] + [wishart_release(sigma_hat, N, noise) for _ in range(reps - 1)]
    W = np.array([N * np.linalg.solve(a, np.linalg.solve(a, s).T) for s in ws])
    n_tests = d + d * (d - 1) // 2
    alpha = ALPHA / n_tests
    zcrit = stats.norm.isf(alpha / 2)
    for j in range(d):
        assert chi2_two_sided_ok(W[:, j, j].sum(), reps * N, alpha)
        assert not chi2_two_sided_ok(1.3 * W[:, j, j].sum(), reps * N, alpha)  # power
    for j in range(d):
        for l in range(j):
            assert abs(W[:, j, l].sum() / math.sqrt(reps * N)) <= zcrit
    # power for the off-diagonal test: a Sigma_tilde built with the wrong (transposed) factor is off
    wrong = np.array([N * np.linalg.solve(a.T, np.linalg.solve(a.T, s).T) for s in ws])
    offs = [abs(wrong[:, j, l].sum() / math.sqrt(reps * N)) for j in range(d) for l in range(j)]
    diags = [not chi2_two_sided_ok(wrong[:, j, j].sum(), reps * N, alpha) for j in range(d)]
    assert max(offs) > zcrit or any(diags)
