"""Noise samplers against their distributions, and the analytic Gaussian calibration.

Each KS test comes with a power check: the same test on samples whose scale is 30% off rejects.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats
from scipy.special import log_ndtr, ndtr

from dplib.errors import InvalidParameterError
from dplib.mechanisms import SecureNoise, SeededNoise, analytic_gaussian_delta, gaussian_sigma

SEEDED_ALPHA = 1e-3  # seeded: deterministic outcome; alpha only sets how tight the test is
SECURE_ALPHA = 1e-6  # unseeded: a false alarm happens once in a million runs

DISTS = {
    "laplace": lambda s: stats.laplace(loc=0.0, scale=s),
    "gaussian": lambda s: stats.norm(loc=0.0, scale=s),
}


def _draw(source, kind: str, n: int, scale: float, loc: float = 0.0) -> np.ndarray:
    values = np.full(n, loc)
    out = source.add_laplace(values, scale) if kind == "laplace" else source.add_gaussian(values, scale)
    assert out.shape == values.shape
    return out - loc


def _ks_p(samples: np.ndarray, kind: str, scale: float) -> float:
    return float(stats.kstest(samples, DISTS[kind](scale).cdf).pvalue)


@pytest.mark.parametrize("kind", ["laplace", "gaussian"])
@pytest.mark.parametrize("scale", [0.37, 1.0, 25.0])
@pytest.mark.parametrize("seed", [0, 1])
def test_seeded_noise_distribution(kind, scale, seed):
    n = 20_000
    samples = _draw(SeededNoise(seed), kind, n, scale, loc=3.5)
    assert _ks_p(samples, kind, scale) > SEEDED_ALPHA
    # Power: samples drawn with a 30%-wrong scale fail the same test.
    for wrong in (0.7 * scale, 1.3 * scale):
        bad = _draw(SeededNoise(seed + 100), kind, n, wrong, loc=3.5)
        assert _ks_p(bad, kind, scale) < SEEDED_ALPHA


def test_seeded_noise_is_reproducible_and_independent_per_entry():
    a = SeededNoise(5).add_laplace(np.zeros(1000), 1.0)
    b = SeededNoise(5).add_laplace(np.zeros(1000), 1.0)
    assert np.array_equal(a, b)
    # Lag-1 correlation of independent draws: |r| < 5 / sqrt(n).
    assert abs(np.corrcoef(a[:-1], a[1:])[0, 1]) < 5 / math.sqrt(999)


@pytest.mark.parametrize("kind", ["laplace", "gaussian"])
def test_secure_noise_distribution(kind):
    noise = SecureNoise()
    assert noise.secure is True
    scale = 2.0
    samples = _draw(noise, kind, 16_000, scale, loc=1.25)
    assert _ks_p(samples, kind, scale) > SECURE_ALPHA
    # Power: the secure sampler run with a 30%-wrong scale fails the same test.
    for wrong in (0.7 * scale, 1.3 * scale):
        bad = _draw(noise, kind, 10_000, wrong, loc=1.25)
        assert _ks_p(bad, kind, scale) < SECURE_ALPHA


@pytest.mark.parametrize("kind", ["laplace", "gaussian"])
def test_secure_noise_reused_measurements_draw_afresh(kind):
    """The secure source keeps its measurements per scale (a grouped statistic draws one value per
    group at a few scales): 3,000 one-value draws alternating two scales are independent draws of
    each scale's distribution (KS, lag-1 correlation), and the same test rejects when the scales
    are swapped (power)."""
    noise = SecureNoise()
    a, b = [], []
    for i in range(3_000):
        (a if i % 2 == 0 else b).append(_draw(noise, kind, 1, 1.0 if i % 2 == 0 else 7.0)[0])
    a, b = np.array(a), np.array(b)
    assert _ks_p(a, kind, 1.0) > SECURE_ALPHA and _ks_p(b, kind, 7.0) > SECURE_ALPHA
    assert abs(np.corrcoef(a[:-1], a[1:])[0, 1]) < 5 / math.sqrt(len(a) - 1)
    assert len(np.unique(a)) == len(a)
    # power: the same samples read as the other scale are rejected
    assert _ks_p(a, kind, 7.0) < SECURE_ALPHA and _ks_p(b, kind, 1.0) < SECURE_ALPHA


def test_secure_noise_keeps_shape_and_is_not_constant():
    out = SecureNoise().add_laplace(np.zeros((3, 4)), 1.0)
    assert out.shape == (3, 4)
    assert len(np.unique(out)) == 12


@pytest.mark.parametrize("source", [SeededNoise(0), SecureNoise()], ids=["seeded", "secure"])
@pytest.mark.parametrize("scale", [0.0, -1.0, math.nan, math.inf])
def test_noise_sources_reject_bad_scale(source, scale):
    with pytest.raises(InvalidParameterError):
        source.add_laplace(np.zeros(2), scale)
    with pytest.raises(InvalidParameterError):
        source.add_gaussian(np.zeros(2), scale)


@pytest.mark.parametrize("source", [SeededNoise(0), SecureNoise()], ids=["seeded", "secure"])
@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_noise_sources_reject_non_finite_values(source, bad):
    with pytest.raises(InvalidParameterError):
        source.add_laplace(np.array([0.0, bad]), 1.0)


# --------------------------------------------------------------------------------------------
# Analytic Gaussian mechanism
# --------------------------------------------------------------------------------------------


def _delta_balle_wang(sigma: float, sens: float, eps: float) -> float:
    """Balle & Wang 2018, Thm 8: Phi(D/2s - e s/D) - e^e Phi(-D/2s - e s/D), written here."""
    a = sens / (2 * sigma)
    b = eps * sigma / sens
    return float(ndtr(a - b) - math.exp(eps + log_ndtr(-a - b)))


def _delta_by_integration(sigma: float, sens: float, eps: float) -> float:
    """delta(eps) = E_{x ~ N(0, s^2)}[max(0, 1 - e^eps * p1(x) / p0(x))] with p1 = N(D, s^2)."""
    # Privacy loss L(x) = ln p0/p1 = (D^2 - 2 D x) / (2 s^2) for x ~ p0 = N(0, s^2).
    def integrand(x):
        loss = (sens * sens - 2 * sens * x) / (2 * sigma * sigma)
        return max(0.0, 1.0 - math.exp(eps - loss)) * stats.norm.pdf(x, scale=sigma)

    from scipy.integrate import quad

    # The integrand vanishes where loss <= eps, i.e. x >= (D^2 - 2 s^2 eps) / (2D).
    x0 = (sens * sens - 2 * sigma * sigma * eps) / (2 * sens)
    val, _ = quad(integrand, -np.inf, x0, epsabs=1e-15, epsrel=1e-10, limit=200)
    return val


CASES = [
    (0.1, 1e-5, 1.0),
    (0.5, 1e-6, 2.5),
    (0.9, 1e-8, 1.0),
    (1.0, 1e-6, 1.0),
    (2.0, 1e-9, 0.3),
    (5.0, 1e-5, 3.0),
    (10.0, 1e-6, 1.0),
]


@pytest.mark.parametrize("eps, delta, sens", CASES)
def test_gaussian_sigma_is_valid_and_tight(eps, delta, sens):
    sigma = gaussian_sigma(sens, eps, delta)
    assert math.isfinite(sigma) and sigma > 0
    # Valid: delta(sigma) <= delta, by the library's formula and by ours.
    assert analytic_gaussian_delta(sigma, sens, eps) <= delta
    assert _delta_balle_wang(sigma, sens, eps) <= delta * (1 + 1e-9)
    # Tight: 1% less noise breaks the guarantee.
    assert analytic_gaussian_delta(0.99 * sigma, sens, eps) > delta
    assert _delta_balle_wang(0.99 * sigma, sens, eps) > delta
    # Sigma is linear in the sensitivity.
    assert gaussian_sigma(2 * sens, eps, delta) == pytest.approx(2 * sigma, rel=1e-4)


@pytest.mark.parametrize("eps, delta, sens", CASES)
def test_analytic_gaussian_delta_formula(eps, delta, sens):
    for sigma in (0.5 * sens / eps, sens / eps, 3 * sens / eps):
        assert analytic_gaussian_delta(sigma, sens, eps) == pytest.approx(
            _delta_balle_wang(sigma, sens, eps), rel=1e-9, abs=1e-300
        )
    # The closed form against a direct numerical integration of the privacy-loss tail.
    sigma = gaussian_sigma(sens, eps, delta)
    assert analytic_gaussian_delta(sigma, sens, eps) == pytest.approx(
        _delta_by_integration(sigma, sens, eps), rel=1e-4, abs=1e-14
    )


@pytest.mark.parametrize("eps, delta, sens", [c for c in CASES if c[0] < 1])
def test_gaussian_sigma_below_classic_bound(eps, delta, sens):
    classic = math.sqrt(2 * math.log(1.25 / delta)) * sens / eps
    assert gaussian_sigma(sens, eps, delta) < classic
    # The classic sigma is itself valid (sanity of our delta formula) for eps < 1.
    assert _delta_balle_wang(classic, sens, eps) <= delta


@pytest.mark.parametrize(
    "sens, eps, delta", [(1.0, 1.0, 0.0), (0.0, 1.0, 1e-6), (-1.0, 1.0, 1e-6), (math.inf, 1.0, 1e-6), (1.0, 0.0, 1e-6), (1.0, 1.0, 1.0)]
)
def test_gaussian_sigma_rejects_bad_parameters(sens, eps, delta):
    with pytest.raises(InvalidParameterError):
        gaussian_sigma(sens, eps, delta)
