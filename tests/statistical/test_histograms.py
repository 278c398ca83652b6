"""Private histograms: Laplace noise on every bin, and the stability threshold's release rate."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from dplib.errors import InvalidParameterError
from dplib.mechanisms import SeededNoise, pure_dp_histogram, stability_threshold, thresholded_histogram

ALPHA = 1e-4


class RecordingNoise:
    """Records the noisy output of each Laplace call; optionally multiplies the scale (to build
    deliberately mis-calibrated variants for power checks)."""

    def __init__(self, inner, scale_factor: float = 1.0):
        self.inner = inner
        self.scale_factor = scale_factor
        self.name = "recording"
        self.secure = False
        self.noisy: list[np.ndarray] = []
        self.scales: list[float] = []

    def add_laplace(self, values, scale):
        self.scales.append(float(scale))
        out = self.inner.add_laplace(values, scale * self.scale_factor)
        self.noisy.append(np.array(out, copy=True))
        return out

    def add_gaussian(self, values, sigma):  # pragma: no cover - not used here
        raise AssertionError("histograms must use Laplace noise")


# --------------------------------------------------------------------------------------------
# Pure-DP histogram
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("eps", [0.1, 1.0, 3.0])
def test_pure_dp_histogram_noise_is_laplace_one_over_eps(eps):
    rng = np.random.default_rng(int(eps * 1000))
    counts = rng.integers(0, 50, size=20_000).astype(float)
    counts[::3] = 0.0  # empty bins are noised too
    noisy, scale = pure_dp_histogram(counts, eps, SeededNoise(int(eps * 10)))
    assert scale == pytest.approx(1.0 / eps, rel=1e-15)
    assert noisy.shape == counts.shape
    assert np.all(noisy != counts)  # every bin, empty or not, got noise
    noise = noisy - counts
    ref = stats.laplace(scale=1.0 / eps).cdf
    assert stats.kstest(noise, ref).pvalue > ALPHA
    # Power: the same test on a histogram calibrated with a 30%-wrong scale rejects.
    for factor in (0.7, 1.3):
        bad_noisy, _ = pure_dp_histogram(counts, eps / factor, SeededNoise(int(eps * 10) + 1))
        assert stats.kstest(bad_noisy - counts, ref).pvalue < ALPHA


@pytest.mark.parametrize("counts", [np.array([]), np.zeros((2, 3))])
def test_pure_dp_histogram_rejects_bad_shapes(counts):
    with pytest.raises(InvalidParameterError):
        pure_dp_histogram(counts, 1.0, SeededNoise(0))


@pytest.mark.parametrize("eps", [0.0, -1.0, math.nan, math.inf])
def test_pure_dp_histogram_rejects_bad_epsilon(eps):
    with pytest.raises(InvalidParameterError, match="epsilon"):
        pure_dp_histogram(np.zeros(3), eps, SeededNoise(0))


# --------------------------------------------------------------------------------------------
# Stability threshold
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("eps, delta", [(1.0, 0.05), (1.0, 1e-6), (0.1, 1e-9), (5.0, 0.25), (0.5, 0.4999)])
def test_stability_threshold_formula(eps, delta):
    expected = 1.0 + math.log(1.0 / (2.0 * delta)) / eps
    assert stability_threshold(eps, delta) == pytest.approx(expected, rel=1e-14)
    # A count-1 bin crosses it with probability exactly delta (Laplace tail, closed form).
    assert stats.laplace(scale=1 / eps).sf(expected - 1.0) == pytest.approx(delta, rel=1e-10)


@pytest.mark.parametrize("eps, delta", [(1.0, 0.0), (0.0, 0.1), (1.0, 1.0), (1.0, -0.1), (math.nan, 0.1)])
def test_stability_threshold_rejects_bad_budget(eps, delta):
    with pytest.raises(InvalidParameterError):
        stability_threshold(eps, delta)


def _binom_ok(k: int, n: int, p: float) -> bool:
    return stats.binomtest(k, n, p).pvalue > ALPHA


def test_count_one_bins_are_released_with_probability_delta():
    eps, delta = 1.0, 0.05
    n_bins = 100_000
    counts = {j: 1 for j in range(-n_bins // 2, n_bins // 2)}
    rec = RecordingNoise(SeededNoise(11))
    released, scale, tau = thresholded_histogram(counts, eps, delta, rec)
    assert scale == pytest.approx(1.0 / eps)
    assert tau == pytest.approx(1.0 + math.log(10.0), rel=1e-14)
    k = len(released)
    assert _binom_ok(k, n_bins, delta)
    # Released values are the noisy counts above tau; nothing else is returned.
    noisy = rec.noisy[0]
    keys = sorted(counts)
    assert released == {kk: float(v) for kk, v in zip(keys, noisy) if v > tau}
    assert all(v > tau for v in released.values())

    # Power 1: a threshold computed for Laplace scale 2/eps (replace-one constants) releases at
    # rate exp(-2 ln 10) / 2 = 0.005 with this noise: outside the interval.
    tau_wrong = 1.0 + (2.0 / eps) * math.log(1.0 / (2.0 * delta))
    assert not _binom_ok(int(np.sum(noisy > tau_wrong)), n_bins, delta)
    # Power 2: noise of scale 2/eps with the right threshold: rate exp(-ln(10)/2) / 2 = 0.158.
    rec2 = RecordingNoise(SeededNoise(12), scale_factor=2.0)
    released2, _, _ = thresholded_histogram(counts, eps, delta, rec2)
    assert not _binom_ok(len(released2), n_bins, delta)
    # Power 3: a 30%-wrong Laplace scale is also detected.
    for f in (0.7, 1.3):
        rec3 = RecordingNoise(SeededNoise(13), scale_factor=f)
        released3, _, _ = thresholded_histogram(counts, eps, delta, rec3)
        assert not _binom_ok(len(released3), n_bins, delta)


@pytest.mark.parametrize("count", [2, 3, 5])
def test_larger_counts_release_rate_matches_laplace_tail(count):
    eps, delta = 1.0, 0.05
    n_bins = 40_000
    counts = {j: count for j in range(n_bins)}
    tau = 1.0 + math.log(1.0 / (2.0 * delta)) / eps
    p = float(stats.laplace(loc=count, scale=1 / eps).sf(tau))
    released, _, _ = thresholded_histogram(counts, eps, delta, SeededNoise(20 + count))
    assert _binom_ok(len(released), n_bins, p)


def test_thresholded_histogram_edge_cases():
    released, scale, tau = thresholded_histogram({}, 1.0, 1e-6, SeededNoise(0))
    assert released == {} and scale == 1.0 and tau == pytest.approx(1 + math.log(5e5))
    with pytest.raises(InvalidParameterError):
        thresholded_histogram({0: 0, 1: 5}, 1.0, 1e-6, SeededNoise(0))
    with pytest.raises(InvalidParameterError):
        thresholded_histogram({0: 3}, 1.0, 0.0, SeededNoise(0))
    # A huge bin is always released, with noise around its count.
    released, _, _ = thresholded_histogram({7: 10_000}, 1.0, 1e-6, SeededNoise(1))
    assert list(released) == [7] and abs(released[7] - 10_000) < 30
