"""Statistical tests of the multivariate person mean (seeded, numpy backend).

1. The Gaussian mechanism of ``clip_and_noise``: over many seeded repetitions on fixed persons,
   the released ``(S, w n)`` minus the exact ``(S, w n)`` has per-coordinate variance sigma^2, with
   sigma the analytic-Gaussian sigma (Balle & Wang 2018) for the l2 sensitivity
   ``sqrt(rho^2 + (rho/4)^2)`` (docs/privacy/multivariate_mean.md), computed here by our own bisection. Chi-square tests
   (all coordinates pooled, and each coordinate with a Bonferroni split) at level 1e-3.
   Power, exactly from the chi-square law: >= 0.99 for the pooled test against a 15% wrong sigma,
   >= 0.95 for each per-coordinate test against a 30% wrong sigma; the same deviations are then
   rejected for 0.85/1.15 sigma (pooled) and 0.7/1.3 sigma (every coordinate).
2. Error vs n (Gaussian-type noise, eps small, light tails: slope -1 in n).
   Light-tailed Gaussian persons, k = inf (no clipping-bias term, so the radius stays near the
   floor), error measured against the exact mean of the final group's persons (this removes the
   sampling term, slope -1/2, that the noise otherwise competes with). The fitted slope of
   log RMS error on log n must be within 0.15 of -1. The tolerance is ~4.5 standard errors of the
   slope (log RMS of R*d chi-square terms has sd sqrt(1/(2 R d))), plus the small drift of the
   final radius toward the floor. Power: the same runs measured against the population mean
   (sampling included: slope ~ -0.6) fail the check; an analytic check shows a -0.75 slope
   (the heavy-tail regime) passes with probability < 1e-3.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import chi2, norm

from dplib.aggregates import NumpyAggregates
from dplib.budget import Budget
from dplib.groups import GroupRange
from dplib.mean.multivariate import COUNT_WEIGHT, STAGE_FINAL, STATUS_OK, MultivariateMeanPlan, clip_and_noise, multivariate_person_mean
from dplib.mechanisms import SeededNoise

pytestmark = pytest.mark.slow

HASH = 2**32
EPS, DELTA = 1.0, 1e-6
ALPHA = 1e-3


def _cols(d):
    return [f"x{j}" for j in range(d)]


def _backend(values, gi):
    return NumpyAggregates({c: values[:, j] for j, c in enumerate(_cols(values.shape[1]))}, gi)


def _balle_wang_delta(sigma, sens, eps):
    a, b = sens / (2 * sigma), eps * sigma / sens
    return norm.cdf(a - b) - math.exp(eps + norm.logcdf(-a - b))


def _our_sigma(sens, eps, delta):
    """Smallest sigma with Balle-Wang delta <= delta, by bisection (independent of dplib)."""
    lo, hi = 1e-6 * sens, 100.0 * sens
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if _balle_wang_delta(mid, sens, eps) <= delta else (mid, hi)
    return hi


# ------------------------------------------------------------------------------------------------
# 1. Gaussian noise of clip_and_noise
# ------------------------------------------------------------------------------------------------

REPS = 200
D = 4
RADIUS = 2.0


def _accepts(q: float, df: int, alpha: float) -> bool:
    return chi2.ppf(alpha / 2, df) <= q <= chi2.ppf(1 - alpha / 2, df)


def test_clip_and_noise_gaussian_variance_with_power():
    rng = np.random.default_rng(2024)
    y = rng.normal(1.0, 2.0, size=(400, D))
    gi = rng.integers(0, HASH, 400)
    scales = np.array([1.0, 2.0, 0.5, 1.0])
    center = np.array([0.5, 1.5, 1.0, 0.0])
    group = GroupRange(0.0, 1.0)
    backend = _backend(y, gi)
    exact_sum, n = backend.clipped_sum(_cols(D), center, RADIUS, group, scales=scales)
    w = COUNT_WEIGHT * RADIUS
    assert w == RADIUS / 4  # the count weight c = rho / 4
    sigma0 = _our_sigma(math.hypot(RADIUS, w), EPS, DELTA)

    noise = SeededNoise(77)
    devs = np.empty((REPS, D + 1))
    for r in range(REPS):
        rel = clip_and_noise(backend, _cols(D), center, RADIUS, scales, group, Budget(EPS, DELTA), noise)
        # the release is post-processing of (S~, w N~): recover S~ and N~ from it
        noisy_sum = (rel.center - center) / scales * rel.denom
        devs[r, :D] = noisy_sum - exact_sum
        devs[r, D] = w * (rel.n_noisy - n)
        # sigma: ours up to the documented float-rounding margin (2**-20 relative, toward more noise)
        assert sigma0 <= rel.sigma <= sigma0 * (1 + 1e-5)
    assert np.all(np.abs(devs.mean(axis=0)) < 4 * sigma0 / math.sqrt(REPS))  # centred

    def test(sig):
        pooled = _accepts(float(np.sum(devs**2) / sig**2), REPS * (D + 1), ALPHA)
        per = all(_accepts(float(np.sum(devs[:, j] ** 2) / sig**2), REPS, ALPHA / (D + 1)) for j in range(D + 1))
        return pooled and per

    assert test(sigma0)
    # power, exactly from the chi-square law. Under sigma = f sigma0 the statistic Q computed with
    # sigma0 is f^2 chi2(df): accepted iff lo <= Q <= hi. The pooled test (df = REPS (d+1)) must
    # catch a 15% error in sigma (power 0.99), each per-coordinate test (df = REPS) a 30% error
    # (power 0.95).
    def p_accept(f, df, alpha):
        lo, hi = chi2.ppf(alpha / 2, df), chi2.ppf(1 - alpha / 2, df)
        return chi2.cdf(hi / f**2, df) - chi2.cdf(lo / f**2, df)

    for f in (0.85, 1.15):
        assert p_accept(f, REPS * (D + 1), ALPHA) < 0.01, f
        assert not test(f * sigma0)
    for f in (0.7, 1.3):
        assert p_accept(f, REPS, ALPHA / (D + 1)) < 0.05, f
        assert not all(_accepts(float(np.sum(devs[:, j] ** 2) / (f * sigma0) ** 2), REPS, ALPHA / (D + 1)) for j in range(D + 1))


# ------------------------------------------------------------------------------------------------
# 2. error vs n slope
# ------------------------------------------------------------------------------------------------

SLOPE_D = 5
SLOPE_NS = (2000, 4000, 8000, 16000, 32000)
SLOPE_REPS = 20
SLOPE_TOL = 0.15
MU = np.array([3.0, -1.0, 0.5, 10.0, 0.0])


def _slope(ns, rms):
    x, yv = np.log(ns), np.log(rms)
    return float(np.polyfit(x, yv, 1)[0])


def test_error_vs_n_slope_gaussian_noise_regime():
    d = SLOPE_D
    rms_group, rms_pop, radii = [], [], []
    for n in SLOPE_NS:
        plan = MultivariateMeanPlan(Budget(EPS, DELTA), d, k=math.inf, scales=(1.0,) * d, expected_persons=float(n), budget_mode="parallel")
        final = plan.groups[STAGE_FINAL]
        lo, hi = math.floor(final.lo * HASH), math.floor(final.hi * HASH)
        e_group, e_pop = [], []
        for rep in range(SLOPE_REPS):
            rng = np.random.default_rng([7, n, rep])
            y = MU + rng.normal(size=(n, d))
            gi = rng.integers(0, HASH, n)
            out = multivariate_person_mean(_backend(y, gi), _cols(d), plan, SeededNoise([8, n, rep]))
            assert out.status == STATUS_OK
            in_final = (gi >= lo) & (gi < hi)
            e_group.append(np.sum((out.estimate - y[in_final].mean(axis=0)) ** 2))
            e_pop.append(np.sum((out.estimate - MU) ** 2))
        radii.append(out.parameters["final_radius"])
        rms_group.append(math.sqrt(np.mean(e_group)))
        rms_pop.append(math.sqrt(np.mean(e_pop)))

    # standard error of the slope: log RMS of R*d ~chi-square(1) terms has sd ~ sqrt(1/(2 R d))
    x = np.log(SLOPE_NS)
    se = math.sqrt(1 / (2 * SLOPE_REPS * d)) / math.sqrt(np.sum((x - x.mean()) ** 2))
    assert 4 * se < SLOPE_TOL  # the tolerance is sized from the distribution, not wider
    slope = _slope(SLOPE_NS, rms_group)
    assert abs(slope - (-1.0)) <= SLOPE_TOL, (slope, rms_group, radii)
    # noise is proportional to the final radius / n: the radius-normalised slope is -1 sharply
    slope_norm = _slope(SLOPE_NS, np.array(rms_group) / np.array(radii))
    assert abs(slope_norm + 1.0) <= 4 * se + 0.02, slope_norm
    # power 1 (empirical): with the sampling of persons included the slope is flatter, and fails
    slope_pop = _slope(SLOPE_NS, rms_pop)
    assert abs(slope_pop + 1.0) > SLOPE_TOL, slope_pop
    assert -0.8 < slope_pop < -0.4
    # power 2 (analytic): a -0.75 slope (heavy-tail regime) passes with probability < 1e-3
    p_pass = norm.cdf((-1 + SLOPE_TOL + 0.75) / se) - norm.cdf((-1 - SLOPE_TOL + 0.75) / se)
    assert p_pass < 1e-3
