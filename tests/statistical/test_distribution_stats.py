"""Seeded statistical tests of the batch-distribution mechanisms: the noise actually added has
the declared law and scale (KS test), with a power check that a 30%-wrong scale fails; and the
end-to-end estimates stay within bounds derived from the noise law."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from dplib.budget import Budget
from dplib.distribution.batches import NumpyBatches
from dplib.distribution.private import DistributionPlan, clipped_release, pooled_laplace, private_distribution
from dplib.groups import ALL_PERSONS
from dplib.mechanisms import SeededNoise

CATS = ("A", "B", "C")
K = 4
P_LEVEL = 1e-3


def data(seed, n, m, mu=(0.5, 0.3, 0.15, 0.05)):
    rng = np.random.default_rng(seed)
    c = rng.multinomial(m, mu, size=n).astype(np.int64)
    return NumpyBatches.from_counts(c, rng.integers(0, 2**32, size=n), m), c


def _ks(samples, law):
    return stats.kstest(samples, law.cdf).pvalue


def test_p0_noise_is_laplace_one_over_epsilon():
    tw, c = data(0, 50, 10)
    eps = 0.7
    noise = SeededNoise(11)
    exact = c.sum(axis=0) / 10
    res = np.concatenate([pooled_laplace(tw, ALL_PERSONS, eps, noise).noisy_sum - exact for _ in range(500)])
    b = 1.0 / eps  # l1 sensitivity 1 on sum y_i (closed form), before the 2^-20 margin
    assert _ks(res, stats.laplace(scale=b)) > P_LEVEL
    for wrong in (0.7 * b, 1.3 * b):  # power: a 30%-wrong scale is detected
        assert _ks(res, stats.laplace(scale=wrong)) < P_LEVEL


@pytest.mark.parametrize("norm", ["l1", "l2"])
def test_clipped_stage_noise_law_and_scale(norm):
    m, eps, delta, radius = 20, 0.9, 1e-6, 0.3
    tw, _ = data(1, 80, m)
    center = np.array([0.45, 0.35, 0.1, 0.1])
    exact_sum, exact_n = tw.clipped_sum(center, radius, norm, ALL_PERSONS)
    noise = SeededNoise(12)
    w = radius / 4
    res = []
    for _ in range(400):
        rel = clipped_release(tw, center, radius, norm, ALL_PERSONS, Budget(eps, delta), noise)
        res.append(np.r_[rel.noisy_sum - exact_sum, (rel.noisy_count - exact_n) * w])
    res = np.concatenate(res)
    if norm == "l1":
        scale = (radius + w) / eps  # l1 sensitivity rho + w
        law = stats.laplace
    else:
        # analytic Gaussian (Balle & Wang 2018, Thm 8) for l2 sensitivity hypot(rho, w), written
        # out here independently of the code: the sigma used must satisfy delta(sigma) <= delta
        # and be tight (delta(0.98 sigma) > delta).
        sens = math.hypot(radius, w)

        def delta_of(s):
            a, b = sens / (2 * s), eps * s / sens
            return stats.norm.cdf(a - b) - math.exp(eps) * stats.norm.cdf(-a - b)

        scale = float(np.std(res))
        sigma = rel.scale
        assert delta_of(sigma) <= delta * (1 + 1e-6) and delta_of(0.98 * sigma) > delta
        scale = sigma
        law = stats.norm
    assert rel.scale == pytest.approx(scale, rel=1e-5)
    assert _ks(res, law(scale=scale)) > P_LEVEL
    for wrong in (0.7 * scale, 1.3 * scale):
        assert _ks(res, law(scale=wrong)) < P_LEVEL


@pytest.mark.parametrize("est", ["P0", "P1", "P2"])
def test_estimates_within_noise_derived_bounds(est):
    """n = 3000 persons, m = 200 draws, k = 4, epsilon = 1. Per seed, the l1 error against the
    exact mean of the persons the final stage read is at most 2x (the l1 norm of the noise on the
    sum over the DP count + the count's relative error times |S|/n) at a 99.9% quantile of the
    noise law (Gamma(k, b) for Laplace, sqrt(k chi2_k) sigma for Gaussian); no clipping happens
    at this m (checked), so the noise is the only error source."""
    m, n, eps = 200, 3000, 1.0
    tw, c = data(2, n, m)
    fails = 0
    for seed in range(20):
        plan = DistributionPlan(Budget(eps, 1e-6), CATS, m, est)
        rel = private_distribution(tw, plan, SeededNoise(100 + seed))
        g = plan.groups[plan.stage_names[-1]]
        sel = (tw.group >= g.bounds[0]) & (tw.group < g.bounds[1])
        y = c[sel] / m
        ybar, n_f = y.mean(axis=0), sel.sum()
        if est == "P0":
            b = 1.0 / eps
            bound = 2 * stats.gamma.ppf(0.999, K, scale=b) / max(rel.parameters["noisy_person_count"], 1)
        else:
            p = rel.parameters
            center, radius = np.array(p["center"]), p["radius"]
            dist = np.abs(y - center).sum(axis=1) if est == "P1" else np.sqrt(((y - center) ** 2).sum(axis=1))
            assert np.all(dist <= radius)  # no clipping: the bound below is the whole error
            n_t = max(p["noisy_person_count"], 1.0)
            s_l1 = np.abs((y - center).sum(axis=0)).sum()
            if est == "P1":
                noise_l1 = stats.gamma.ppf(0.999, K, scale=rel.noise_scale)
                count_err = stats.laplace.ppf(0.9995, scale=rel.noise_scale) / p["count_weight"]
            else:
                noise_l1 = math.sqrt(K * stats.chi2.ppf(0.999, K)) * rel.noise_scale
                count_err = stats.norm.ppf(0.9995) * rel.noise_scale / p["count_weight"]
            bound = 2 * (noise_l1 / n_t + s_l1 * count_err / (n_t * max(n_f - count_err, 1)))
        err = np.abs(rel.estimate - ybar).sum()
        fails += err > bound
    assert fails <= 1, fails
