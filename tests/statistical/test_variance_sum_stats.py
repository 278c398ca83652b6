"""Statistical tests of the final stages of the person-level variance and sum (seeded, numpy
backend), and of the variance's error bar.

1. Noise scale: the noise each final stage adds is Laplace with exactly the scale its declared
   sensitivity and epsilon give (Kolmogorov-Smirnov against that law, every coordinate). Power:
   the same test on releases drawn with a 30% smaller or larger scale rejects.
   The split releases (the variance's ``split=True``, the scale-free mean's
   ``centred_clip_and_noise(split=True)``): each of their coordinates, the count of the persons within
   the radius and the count of those at or beyond it included, has the same declared law.
2. Error bar: on Gaussian and t10 person means the variance's 90% bar covers the exact dataset
   statistic at least as often as a binomial lower quantile of the nominal level allows, and so
   do the sum's on Gaussian totals. Power: a bar shrunk to the noise quantile's 40% fails.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats
from scipy.stats import binom

from dplib.aggregates import NumpyAggregates
from dplib.budget import Budget
from dplib.groups import ALL_PERSONS
from dplib.mechanisms import SeededNoise
from dplib.sums import ScaleFreeSumPlan, clipped_total, person_sum
from dplib.mean.univariate import centred_clip_and_noise
from dplib.variance import SECOND_MOMENT_SENSITIVITY, ScaleFreeVariancePlan, clipped_moments, person_variance

ALPHA = 1e-4
REPS = 2000
NOMINAL = 0.9


class ScaledNoise(SeededNoise):
    """SeededNoise drawing Laplace with ``factor`` times the requested scale (a mis-calibrated
    mechanism, for power checks)."""

    def __init__(self, seed, factor: float = 1.0):
        super().__init__(seed)
        self.factor = factor

    def add_laplace(self, values, scale):
        return super().add_laplace(values, scale * self.factor)


def _backend(y, seed=0):
    return NumpyAggregates({"v": y}, np.random.default_rng(seed).integers(0, 2**32, y.size))


def _moments_noise(factor: float, seed: int):
    """Noise of REPS releases of the variance's final stage on fixed data, per coordinate, and
    the declared Laplace scales per coordinate (data in scaled units)."""
    y = np.random.default_rng(1).normal(0.0, 1.0, 500)
    c, rho, w1, w0, eps = 0.1, 2.0, 0.3, 0.25, 0.7
    u = np.clip((y - c) / rho, -1.0, 1.0)
    exact = np.array([np.sum(np.rint(u * u * 2**30) / 2**30), np.sum(np.rint(u * 2**30) / 2**30), y.size])
    backend = _backend(y)
    out = np.array([
        (lambda m: (m.second, m.first, m.n_noisy))(
            clipped_moments(backend, "v", c, rho, w1, w0, ALL_PERSONS, eps, ScaledNoise([seed, r], factor)))
        for r in range(REPS)
    ])
    scale = (SECOND_MOMENT_SENSITIVITY + w1 + w0) * (1 + 2**-20) / eps
    return out - exact, np.array([scale, scale / w1, scale / w0])


def test_variance_final_stage_noise_is_the_declared_laplace():
    noise, scales = _moments_noise(1.0, 7)
    for j in range(3):
        assert stats.kstest(noise[:, j], stats.laplace(scale=scales[j]).cdf).pvalue > ALPHA, j


@pytest.mark.parametrize("factor", [0.7, 1.3])
def test_variance_final_stage_noise_check_has_power(factor):
    noise, scales = _moments_noise(factor, 8)
    assert all(stats.kstest(noise[:, j], stats.laplace(scale=scales[j]).cdf).pvalue < ALPHA for j in range(3))


def _split_noise(factor: float, seed: int):
    """Noise of REPS split releases on fixed data (a third of the persons beyond the radius), per
    coordinate, against the declared scales: the variance's (A, B, n_within, n_clipped) and the
    mean's (S, n_within, n_clipped) (counts in persons, the weights divided out)."""
    y = np.random.default_rng(3).normal(0.0, 1.0, 600)
    c, rho, w1, w0, w, eps = 0.1, 1.0, 0.3, 0.25, 0.4, 0.7
    u = np.clip((y - c) / rho, -1.0, 1.0)
    clipped = int(np.sum(np.abs(y - c) >= rho))
    backend = _backend(y)
    var_exact = np.array([np.sum(np.rint(u * u * 2**30) / 2**30), np.sum(np.rint(u * 2**30) / 2**30),
                          y.size - clipped, clipped])
    mean_exact = np.array([np.sum(np.rint(u * 2**30) / 2**30) * rho, y.size - clipped, clipped])
    var_out, mean_out = [], []
    for r in range(REPS):
        m = clipped_moments(backend, "v", c, rho, w1, w0, ALL_PERSONS, eps, ScaledNoise([seed, r], factor), split=True)
        var_out.append((m.second, m.first, m.n_noisy - m.n_clipped, m.n_clipped))
        f = centred_clip_and_noise(backend, "v", c, rho, w, ALL_PERSONS, eps, ScaledNoise([seed, 9, r], factor), split=True)
        mean_out.append((f.deviation * f.denom, f.n_noisy - f.n_clipped, f.n_clipped))
    d = (SECOND_MOMENT_SENSITIVITY + w1 + w0) * (1 + 2**-20) / eps
    m = (rho + w) * (1 + 2**-20) / eps
    return ((np.array(var_out) - var_exact, np.array([d, d / w1, d / w0, d / w0])),
            (np.array(mean_out) - mean_exact, np.array([m, m / w, m / w])))


def test_split_final_stages_noise_is_the_declared_laplace():
    for noise, scales in _split_noise(1.0, 11):
        for j in range(len(scales)):
            assert stats.kstest(noise[:, j], stats.laplace(scale=scales[j]).cdf).pvalue > ALPHA, j


@pytest.mark.parametrize("factor", [0.7, 1.3])
def test_split_final_stages_noise_check_has_power(factor):
    for noise, scales in _split_noise(factor, 12):
        assert all(stats.kstest(noise[:, j], stats.laplace(scale=scales[j]).cdf).pvalue < ALPHA
                   for j in range(len(scales)))


def _total_noise(factor: float, seed: int):
    t = np.random.default_rng(2).normal(50.0, 10.0, 400)
    c, rho, eps = 48.0, 25.0, 0.6
    exact = float(np.sum(np.clip(t, c - rho, c + rho)))
    backend = _backend(t)
    out = np.array([clipped_total(backend, "v", c, rho, ALL_PERSONS, eps, ScaledNoise([seed, r], factor))[0]
                    for r in range(REPS)])
    return out - exact, (rho + abs(c)) * (1 + 2**-20) / eps


def test_sum_final_stage_noise_is_the_declared_laplace():
    noise, scale = _total_noise(1.0, 9)
    assert stats.kstest(noise, stats.laplace(scale=scale).cdf).pvalue > ALPHA
    for factor in (0.7, 1.3):  # power
        bad, _ = _total_noise(factor, 10)
        assert stats.kstest(bad, stats.laplace(scale=scale).cdf).pvalue < ALPHA


COVERAGE_REPS = 40


def _coverage(kind: str):
    """(covered, covered by a bar shrunk to 40% of its noise quantile, runs with a bar)."""
    hits, shrunk_hits, runs = 0, 0, 0
    for rep in range(COVERAGE_REPS):
        rng = np.random.default_rng([77, rep, len(kind)])
        if kind == "sum":
            y = rng.normal(30.0, 8.0, 3000)
            truth = float(np.sum(y))
            rel = person_sum(_backend(y, rep), "v", ScaleFreeSumPlan(Budget(1.0, 1e-6)), SeededNoise([5, rep]))
        else:
            y = rng.normal(10.0, 3.0, 3000) if kind == "gaussian" else 10.0 + 3.0 * rng.standard_t(10, 3000)
            truth = float(np.var(y))
            rel = person_variance(_backend(y, rep), "v", ScaleFreeVariancePlan(Budget(1.0, 1e-6)), SeededNoise([5, rep]))
        if rel.error_bar is None:
            continue
        runs += 1
        err = abs(rel.estimate - truth)
        hits += err <= rel.error_bar
        shrunk_hits += err <= 0.4 * rel.parameters["noise_quantile"]
    return hits, shrunk_hits, runs


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["gaussian", "t10", "sum"])
def test_error_bar_coverage_with_power(kind):
    hits, shrunk, runs = _coverage(kind)
    assert runs >= 0.8 * COVERAGE_REPS  # a bar in most runs on these light-tailed cells
    lower = binom.ppf(1e-3, runs, NOMINAL)
    assert hits >= lower, (hits, runs)
    assert shrunk < lower, (shrunk, runs)  # power: a bar at 40% of the noise quantile covers too rarely
