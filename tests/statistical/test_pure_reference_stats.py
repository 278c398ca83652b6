"""Pure-DP reference mean (Agarwal et al. 2024, Algorithms 5-8), seeded statistical checks.

* The exponential mechanism's draws follow the softmax of Scores that are themselves recomputed
  by brute force (all sets of changed persons) on tiny data; chi-square and total-variation
  tests sized from the distribution, each with a power check (epsilon doubled is rejected).
* The OpenDP (secure) sampler follows the same softmax.
* PureMean (Algorithm 8) lands within alpha of the true mean at d = 1 and d = 2 with a failure
  count consistent with beta; with a far smaller epsilon the same check fails (power).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats

from dplib.groups import group_index
from dplib.mean.pure_reference import fine_pure, grid_scores, plan_fine_pure, pure_mean
from dplib.mechanisms import SecureNoise, SeededNoise, sample_exponential_mechanism

SEEDED_ALPHA = 1e-3
SECURE_ALPHA = 1e-6
SALT = "c3" * 32


def brute_cost_1d(y, p, q, rho, labels, K):
    """cost(p, q) by searching all sets of changed persons (moved to p0 + rho), d = 1."""
    t = abs(q - p)
    if t / 2 >= rho:
        return math.inf
    z = np.clip((y - p) * np.sign(q - p), -rho, rho)
    n = z.size
    for s in range(n + 1):
        combos = list(itertools.combinations(range(n), s))
        zz = np.repeat(z[None, :], len(combos), axis=0)
        for r, subset in enumerate(combos):
            zz[r, list(subset)] = rho
        med = np.median(np.stack([zz[:, labels == h].mean(axis=1) for h in range(K)], axis=1), axis=1)
        if np.any(np.abs(med) > np.abs(med - t)):
            return s
    return math.inf  # pragma: no cover


def brute_scores_1d(y, grid, alpha_s, box, rho, labels, K):
    step = alpha_s / 4
    reach = int(math.floor(box / step + 1e-9))
    out = []
    for p in grid:
        costs = [brute_cost_1d(y, p, p + j * step, rho, labels, K) for j in range(-reach, reach + 1) if abs(j) > 4]
        out.append(min(min(costs), y.size))
    return np.array(out)


def softmax(scores, eps):
    w = np.array([math.exp(eps * (s - max(scores)) / 2.0) for s in scores])
    return w / w.sum()


def chi2_p(counts, probs):
    """Chi-square goodness-of-fit p-value, cells with expected < 5 merged into one."""
    n = counts.sum()
    exp = probs * n
    big = exp >= 5
    obs_c = np.append(counts[big], counts[~big].sum())
    exp_c = np.append(exp[big], exp[~big].sum())
    if exp_c[-1] == 0:
        obs_c, exp_c = obs_c[:-1], exp_c[:-1]
    return float(stats.chisquare(obs_c, exp_c).pvalue), exp_c, big


def chi2_power(n, probs, wrong, level):
    """Power of the chi-square test of ``probs`` when samples follow ``wrong`` (noncentral chi2)."""
    exp = probs * n
    big = exp >= 5
    p_c = np.append(probs[big], probs[~big].sum())
    w_c = np.append(wrong[big], wrong[~big].sum())
    keep = p_c > 0
    lam = n * np.sum((w_c[keep] - p_c[keep]) ** 2 / p_c[keep])
    dof = keep.sum() - 1
    crit = stats.chi2.ppf(1 - level, dof)
    return float(stats.ncx2.sf(crit, dof, lam))


@pytest.fixture(scope="module")
def tiny_case():
    rng = np.random.default_rng(2024)
    n, K, alpha, rho, eps = 12, 3, 1.0, 0.8, 1.0
    y = rng.normal(0.15, 0.3, size=n)
    labels = np.repeat(np.arange(K), n // K)
    plan = plan_fine_pure(eps, alpha, 0.1, 1, K=K, rho=rho)
    grid, scores = grid_scores(y[:, None], plan)
    brute = brute_scores_1d(y, grid[:, 0], plan.score_alpha, plan.box_radius, rho, labels, K)
    return y, plan, grid, scores, brute


def test_scores_equal_brute_force(tiny_case):
    _, _, _, scores, brute = tiny_case
    assert scores.tolist() == brute.tolist()
    assert len(set(brute.tolist())) >= 4  # a spread-out distribution to test against


def test_seeded_exponential_mechanism_matches_softmax_of_brute_force_scores(tiny_case):
    y, plan, grid, _, brute = tiny_case
    probs = softmax(brute, plan.epsilon)
    wrong = softmax(brute, 2 * plan.epsilon)
    n_draws = 4000
    assert chi2_power(n_draws, probs, wrong, SEEDED_ALPHA) > 0.999  # sized from the distribution
    noise = SeededNoise(11)
    draws = np.array([sample_exponential_mechanism(brute, plan.epsilon, noise) for _ in range(n_draws)])
    counts = np.bincount(draws, minlength=len(probs))
    assert chi2_p(counts, probs)[0] > SEEDED_ALPHA
    assert chi2_p(counts, wrong)[0] < SEEDED_ALPHA  # power: epsilon doubled is rejected
    # total variation: E TV <= sum sqrt(p(1-p)/N)/2, McDiarmid adds sqrt(ln(1/a)/(2N))
    tv_bound = 0.5 * np.sum(np.sqrt(probs * (1 - probs) / n_draws)) + math.sqrt(math.log(1 / SEEDED_ALPHA) / (2 * n_draws))
    emp = counts / n_draws
    assert 0.5 * np.abs(emp - probs).sum() <= tv_bound
    assert 0.5 * np.abs(emp - wrong).sum() > tv_bound
    # fine_pure uses exactly this sampler on exactly these scores
    for seed in range(5):
        got, _ = fine_pure(y[:, None], plan.epsilon, plan.alpha, plan.beta, SeededNoise(seed), K=plan.K, rho=plan.rho)
        want = grid[sample_exponential_mechanism(brute, plan.epsilon, SeededNoise(seed))]
        assert np.array_equal(got, want)


def test_secure_exponential_mechanism_matches_softmax(tiny_case):
    _, plan, _, _, brute = tiny_case
    probs = softmax(brute, plan.epsilon)
    wrong = softmax(brute, 2 * plan.epsilon)
    n_draws = 2500
    assert chi2_power(n_draws, probs, wrong, SECURE_ALPHA) > 0.99
    noise = SecureNoise()
    draws = np.array([sample_exponential_mechanism(brute, plan.epsilon, noise) for _ in range(n_draws)])
    counts = np.bincount(draws, minlength=len(probs))
    assert chi2_p(counts, probs)[0] > SECURE_ALPHA
    assert chi2_p(counts, wrong)[0] < SECURE_ALPHA


# ----- Algorithm 8 accuracy -------------------------------------------------------------------
M_RECORDS = 400
SIGMA = 3 ** -0.25  # records N(mu, SIGMA^2): 4th central moment exactly 1, so scale s = 1 (k = 4)


def _run_pure_mean(d, n_total, mu, eps, alpha, beta, seed):
    rng = np.random.default_rng(seed)
    Y = rng.normal(mu, SIGMA / math.sqrt(M_RECORDS), size=(n_total, d))  # exact law of a mean of m records
    gi = group_index(range(seed * n_total, (seed + 1) * n_total), SALT)
    first, second = gi < 2**31, gi >= 2**31
    res = pure_mean(Y[first], Y[second], eps, alpha, beta, 1.0, 4, M_RECORDS, 10.0, SeededNoise(seed + 1000),
                    group_idx_first=gi[first], group_idx_second=gi[second])
    assert res.delta == 0.0 and math.isclose(res.epsilon, eps, rel_tol=1e-12)
    return float(np.linalg.norm(res.estimate - mu))


@pytest.mark.parametrize(
    "d, n_total, reps, mu",
    [(1, 600, 40, np.array([3.7])), (2, 1000, 3, np.array([-2.3, 4.1]))],
)
def test_pure_mean_within_alpha_with_failure_rate_at_most_beta(d, n_total, reps, mu):
    eps, alpha, beta = 1.0, 2.0, 0.05
    errors = np.array([_run_pure_mean(d, n_total, mu, eps, alpha, beta, s) for s in range(reps)])
    allowed = int(stats.binom.ppf(1 - SEEDED_ALPHA, reps, beta))  # failures consistent with beta
    assert np.sum(errors > alpha) <= allowed
    # power: with epsilon 1000x smaller the coarse stage and the selection are near-random
    bad = np.array([_run_pure_mean(d, n_total, mu, eps / 1000, alpha, beta, s) for s in range(reps)])
    assert np.sum(bad > alpha) > allowed
