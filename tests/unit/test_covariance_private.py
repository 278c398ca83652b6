"""BHS23 plans (the corrected constants of docs/privacy/stable_covariance.md against their
formulas, gates at the boundary) and the private algorithms' public refusals, bad input, FAIL path
and budget handling."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dplib.budget import Accountant, Budget
from dplib.covariance import (
    GaussianPlan,
    PrivateCovariancePlan,
    PrivateMeanPlan,
    minimum_rows_private_mean,
    numpy_backend,
    private_covariance,
    private_gaussian,
    private_mean,
)
from dplib.covariance.order import pair, random_order, reference_positions
from dplib.covariance.params import ptr_threshold
from dplib.errors import BudgetExceededError, ConfigError, InputDataError
from dplib.mechanisms import SecureNoise, SeededNoise

SALT = "cd" * 32
EPS, DELTA = 0.99, 1e-3  # Algorithm 1: k = ceil(6 ln(6000)/0.99) + 4 = 57


def sphere(n: int, d: int, seed: int, center: float = 0.0) -> np.ndarray:
    """Points on a unit sphere then an affine map: well concentrated (Def. 17), so both scores are 0."""
    rng = np.random.default_rng(seed)
    u = rng.normal(size=(n, d))
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    a = rng.normal(size=(d, d)) + 3 * np.eye(d)
    return u @ a.T + center


def test_mean_plan_constants_match_spec_formulas():
    n, lam = 20 * 57 * 10 + 1, 10.0  # odd n at the gate
    plan = PrivateMeanPlan(Budget(EPS, DELTA), n, 3, lam)
    k = math.ceil(6 * math.log(6 / DELTA) / EPS) + 4
    assert plan.k == k == 57
    assert plan.k >= ptr_threshold(EPS / 3, DELTA / 6)  # score k fails the PTR with probability 1
    m = n // 2
    assert plan.m == m == 5700
    assert plan.M == 6 * k + math.ceil(18 * math.log(16 * n / DELTA)) and plan.M > 6 * k
    gamma = (20 / 7) * lam / m
    assert gamma <= plan.gamma <= gamma * (1 + 1e-15)
    lam_2k = plan.thresholds[-1]
    assert plan.thresholds[0] == lam and lam_2k == pytest.approx(1.25 * lam)
    assert lam_2k / (1 - k * lam_2k / m) <= (10 / 7) * lam * (1 + 1e-12)  # lambda_good (Lemma 25, corrected)
    assert 2 * (10 / 7) * lam / m <= plan.gamma * (1 + 1e-12)
    assert plan.core_thresholds[-1] == pytest.approx(lam * (1 - gamma) ** (-2 * k))
    c2 = 50 / ((1 - gamma) ** (2 * k + 1) * (1 - k / n) ** 4) * lam / n**2 * 18 * math.log(12 / DELTA) / EPS**2
    assert c2 <= plan.c2 <= c2 * (1 + 1e-13)
    coef = plan.c2 * EPS**2 * n**2 / (lam * math.log(12 / DELTA))
    assert 1590 < coef < 1645  # "about 1593-1640 at the gate" (docs/privacy/stable_covariance.md)
    # intertwining: lambda_l / (1 - lambda_l/m) <= lambda_{l+1} (up to float rounding)
    t = plan.thresholds
    assert all(t[i] / (1 - t[i] / m) <= t[i + 1] * (1 + 1e-12) for i in range(2 * k))
    assert plan.charges()[0].budget == Budget(EPS, DELTA) and plan.cost() == Budget(EPS, DELTA)


def test_mean_plan_gate_at_the_boundary():
    b = Budget(EPS, DELTA)
    PrivateMeanPlan(b, 20 * 57 * 10, 2, 10.0)
    with pytest.raises(ConfigError, match="20 k lambda0"):
        PrivateMeanPlan(b, 20 * 57 * 10 - 1, 2, 10.0)
    # 20 k lambda0 = 20 * 57 * 10.05 = 11457 (odd): n = 11457 has floor(n/2) < 10 k lambda0
    with pytest.raises(ConfigError):
        PrivateMeanPlan(b, 11457, 2, 10.05)
    PrivateMeanPlan(b, 11458, 2, 10.05)


@pytest.mark.parametrize(
    "eps,delta,lam",
    [(1.0, 1e-4, 10.0), (0.5, 0.06, 10.0), (0.99, 2e-3, 10.0), (0.5, 1e-6, 9.99), (0.5, 1e-6, float("nan"))],
)
def test_mean_plan_refuses_parameters_outside_the_proof(eps, delta, lam):
    with pytest.raises(ConfigError):
        PrivateMeanPlan(Budget(eps, delta), 10**9, 2, lam)


def test_readme_gate_and_minimum_rows():
    # the reference README's 98,000 at eps = 1 (just below), delta = 1e-6, lambda0 = 50, d = 10
    assert minimum_rows_private_mean(0.999999, 1e-6, 10, 50.0) == 20 * 98 * 50
    n_min = minimum_rows_private_mean(0.5, 1e-6, 10)
    plan = PrivateMeanPlan(Budget(0.5, 1e-6), n_min, 10)
    assert plan.k == 192 and n_min >= 20 * 192 * plan.lambda0
    with pytest.raises(ConfigError):
        PrivateMeanPlan(Budget(0.5, 1e-6), n_min - 2, 10, plan.lambda0)


def test_covariance_plan_constants_and_gate():
    eps, delta, lam = 0.9, 1e-4, 6.0
    k = math.ceil(4 * math.log(2 / delta) / eps) + 4
    n = 10 * k * 6
    plan = PrivateCovariancePlan(Budget(eps, delta), n, 4, lam)
    assert plan.k == k
    assert plan.N == math.floor(n**2 * eps**2 / (48 * lam**2 * math.log(2 / delta)))
    paper = math.floor(n**2 * eps**2 / (24 * lam**2 * math.log(2 / delta)))
    assert abs(2 * plan.N - paper) <= 2
    assert plan.N >= 1  # at the gate N >= 100 k^2 eps^2 / (48 ln(2/delta)) >> 1
    with pytest.raises(ConfigError, match="10 k lambda0"):
        PrivateCovariancePlan(Budget(eps, delta), n - 1, 4, lam)
    for e, dl in [(1.0, 1e-5), (0.5, 6e-4), (0.005, 1e-9)]:
        with pytest.raises(ConfigError):
            PrivateCovariancePlan(Budget(e, dl), 10**9, 4, lam)
    with pytest.raises(ConfigError):
        PrivateCovariancePlan(Budget(eps, delta), 10**9, 4, 0.5)


def test_gaussian_plan_splits_budget_and_checks_both_gates():
    plan = GaussianPlan(Budget(1.9, 1e-4), 16000, 3, 10.0, 8.0)
    assert plan.mean_plan.budget == Budget(0.95, 5e-5) and plan.cov_plan.budget == Budget(0.95, 5e-5)
    assert plan.cov_plan.n == 8000
    assert sum(c.budget.epsilon for c in plan.charges()) == pytest.approx(1.9)
    with pytest.raises(ConfigError):
        GaussianPlan(Budget(1.9, 1e-4), 16000, 3, 10.0, 20.0)  # 8000 pairs < 10 k lambda0_cov


def test_order_pairs_and_reference_set_depend_on_the_salt_only():
    n = 1001
    o1, o2 = random_order(n, SALT), random_order(n, "ef" * 32)
    assert sorted(o1) == list(range(n)) and not np.array_equal(o1, o2)
    np.testing.assert_array_equal(o1, random_order(n, SALT))
    x = np.arange(2 * n, dtype=float).reshape(n, 2)
    y = pair(x[o1])
    assert y.shape == (500, 2)
    np.testing.assert_allclose(y[0], (x[o1[0]] - x[o1[1]]) / math.sqrt(2))
    R = reference_positions(n, 300, SALT)
    assert len(set(R.tolist())) == 300 and R.min() >= 0 and R.max() < n
    np.testing.assert_array_equal(R, reference_positions(n, 300, SALT))
    with pytest.raises(Exception):
        random_order(n, "not a salt")


def _mean_setup(n=20 * 57 * 10, d=3, seed=0):
    plan = PrivateMeanPlan(Budget(EPS, DELTA), n, d, 10.0)
    x = sphere(n, d, seed, center=1e3)
    return plan, x


def test_private_mean_is_exact_on_well_concentrated_data():
    # Observation 18: scores 0, PASS, and (mu_hat, Sigma_hat) = (empirical mean, paired covariance)
    plan, x = _mean_setup()
    b = numpy_backend(x, SALT)
    out = private_mean(b, plan, SeededNoise(1), keep_internals=True)
    it = out.diagnostics.internals
    assert out.release.status == "OK" and it["score1"] == 0 and it["score2"] == 0
    np.testing.assert_allclose(it["mu_hat"], x.mean(axis=0), rtol=1e-12)
    y = pair(x[random_order(len(x), SALT)])
    np.testing.assert_allclose(it["sigma_hat"], y.T @ y / y.shape[0], rtol=1e-10)
    assert out.diagnostics.passes == 3  # Gram + one score pass + one core pass
    assert set(out.release.parameters).isdisjoint({"score", "score1", "score2", "passes"})


def test_bad_input_is_refused_before_any_charge():
    plan, x = _mean_setup()
    acc = Accountant(Budget(1.0, 1e-2))
    x_bad = x.copy()
    x_bad[17, 1] = np.nan
    with pytest.raises(InputDataError, match="NaN or infinite"):
        private_mean(numpy_backend(x_bad, SALT), plan, SeededNoise(0), acc)
    with pytest.raises(InputDataError, match="d=3"):
        private_mean(numpy_backend(x[:, :2], SALT), PrivateMeanPlan(Budget(EPS, DELTA), len(x), 3, 10.0), SeededNoise(0), acc)
    with pytest.raises(ConfigError):
        private_mean(numpy_backend(x[:-2], SALT), plan, SeededNoise(0), acc)
    with pytest.raises(BudgetExceededError):
        private_mean(numpy_backend(x, SALT), plan, SeededNoise(0), Accountant(Budget(0.5, 1e-3)))
    assert acc.charges == []


@pytest.mark.parametrize("kind", ["constant", "duplicate"])
def test_singular_data_fail_as_a_dp_outcome_and_stay_charged(kind):
    plan, x = _mean_setup()
    x = x.copy()
    if kind == "constant":
        x[:, 2] = 7.0
    else:
        x[:, 2] = x[:, 0]
    acc = Accountant(Budget(1.0, 1e-2))
    out = private_mean(numpy_backend(x, SALT), plan, SeededNoise(0), acc, keep_internals=True)
    assert out.release.failed and out.release.mean is None and out.release.covariance is None
    assert out.diagnostics.internals["score1"] == plan.k
    assert acc.cost() == (EPS, DELTA)
    assert out.diagnostics.passes == 1  # only the Gram pass: singular at once


def test_gross_outliers_beyond_k_fail():
    plan, x = _mean_setup()
    x = x.copy()
    x[: 2 * plan.k : 2] = 1e9 * np.random.default_rng(3).normal(size=(plan.k, 3))
    out = private_mean(numpy_backend(x, SALT), plan, SeededNoise(0), keep_internals=True)
    assert out.release.failed and out.diagnostics.internals["score1"] == plan.k


def test_private_covariance_and_gaussian_run_end_to_end():
    eps, delta = 0.9, 1e-4
    k = math.ceil(4 * math.log(2 / delta) / eps) + 4
    n, d = 10 * k * 6, 3
    y = sphere(n, d, 4)
    y = y - y.mean(axis=0)
    plan = PrivateCovariancePlan(Budget(eps, delta), n, d, 6.0)
    out = private_covariance(numpy_backend(y, SALT, paired=False), plan, SecureNoise(), keep_internals=True)
    assert out.release.status == "OK" and out.diagnostics.internals["score_cov"] == 0
    cov = out.release.covariance
    assert cov.shape == (d, d) and np.allclose(cov, cov.T) and np.linalg.eigvalsh(cov).min() > 0
    np.testing.assert_allclose(out.diagnostics.internals["sigma_hat_cov"], y.T @ y / n, rtol=1e-10)
    assert out.release.noise_source == SecureNoise.name and "not floating-point hardened" in out.release.hardening

    gplan = GaussianPlan(Budget(1.9, 1e-4), 16000, 3, 10.0, 8.0)
    x = sphere(16000, 3, 5, center=-40.0)
    g = private_gaussian(numpy_backend(x, SALT), gplan, SeededNoise(2), keep_internals=True)
    assert g.release.status == "OK" and g.release.mean.shape == (3,) and g.release.covariance.shape == (3, 3)
    it = g.diagnostics.internals
    assert it["score1"] == it["score2"] == it["score_cov"] == 0
    np.testing.assert_allclose(it["sigma_hat_cov"], it["sigma_hat"], rtol=1e-10)  # same pairs, weights 1/m


def test_released_mean_is_affine_equivariant_with_shared_randomness():
    # chol(B S B^T) = B chol(S) for lower-triangular B with a positive diagonal, so the same
    # normals give mu_tilde(Bx + b) = B mu_tilde(x) + b
    plan, x = _mean_setup(seed=6)
    B = np.array([[1e3, 0.0, 0.0], [-2.0, 1e-2, 0.0], [5.0, 7.0, 30.0]])
    b = np.array([1e4, -3.0, 0.5])
    r1 = private_mean(numpy_backend(x, SALT), plan, SeededNoise(21)).release
    r2 = private_mean(numpy_backend(x @ B.T + b, SALT), plan, SeededNoise(21)).release
    assert r1.status == r2.status == "OK"
    np.testing.assert_allclose(r2.mean, B @ r1.mean + b, rtol=1e-9, atol=1e-6)
