"""Error of the univariate person-level mean shrinks with n at the rate the theory predicts.

Synthetic person means Y_i ~ N(3, 1), scale s = 1, k = 4, epsilon = 0.05, delta = 1e-6. At this
epsilon the Laplace noise of the fine stage dominates: its error is (rho + c) / (eps n) with
rho ~ (n eps)^(1/k), i.e. ~ n^{-(k-1)/k} = n^{-0.75} at large n and ~ n^{-1} while rho is still
dominated by its n-free part u; the sampling error n^{-1/2} is smaller for these n. The fitted
log-log slope of the median absolute error must lie in [-1.05, -0.6].

Power: the same fit on deliberately broken variants (a fine-stage noise scale that grows with n,
one that grows like sqrt(n), one that vanishes so only sampling error is left) lands outside.
"""

from __future__ import annotations

import numpy as np
import pytest

from dplib.aggregates import NumpyAggregates
from dplib.budget import Budget
from dplib.mean.univariate import STATUS_OK, UnivariateMeanPlan, univariate_person_mean
from dplib.mechanisms import SeededNoise

NS = (2000, 8000, 32000)
TRUE_MEAN = 3.0
SLOPE_BAND = (-1.05, -0.6)
PLAN = UnivariateMeanPlan(Budget(0.05, 1e-6), scale=1.0, k=4)


class FineScaleBroken:
    """Seeded noise whose fine-stage (2-value) Laplace scale is multiplied by ``factor``."""

    name = "broken"
    secure = False

    def __init__(self, rng: np.random.Generator, factor: float):
        self.inner = SeededNoise(rng)
        self.factor = factor

    def add_laplace(self, values, scale):
        if np.asarray(values).shape == (2,):
            scale = scale * self.factor
        return self.inner.add_laplace(values, scale)

    def add_gaussian(self, values, sigma):  # pragma: no cover
        return self.inner.add_gaussian(values, sigma)


def _median_abs_errors(seed: int, reps: int, factor=lambda n: 1.0):
    medians = []
    for i, n in enumerate(NS):
        rng = np.random.default_rng([seed, i])
        errors, insufficient = [], 0
        for _ in range(reps):
            y = rng.normal(TRUE_MEAN, 1.0, size=n)
            gidx = rng.integers(0, 2**32, size=n)
            f = factor(n)
            noise = SeededNoise(rng) if f == 1.0 else FineScaleBroken(rng, f)
            rel = univariate_person_mean(NumpyAggregates({"v": y}, gidx), "v", PLAN, noise)
            if rel.status != STATUS_OK:
                insufficient += 1
                continue
            errors.append(abs(rel.estimate - TRUE_MEAN))
        # The coarse group (n/4 persons) clears the threshold (~264 at eps 0.05) nearly always.
        assert insufficient <= 0.05 * reps
        medians.append(float(np.median(errors)))
    return medians


def _slope(medians) -> float:
    return float(np.polyfit(np.log(NS), np.log(medians), 1)[0])


def _in_band(slope: float) -> bool:
    return SLOPE_BAND[0] <= slope <= SLOPE_BAND[1]


def test_error_scaling_slope():
    # 300 repetitions per n: the slope's sampling sd is about 0.04 (measured), the band's edges
    # are more than 4 sd from the expected slope (about -0.87).
    medians = _median_abs_errors(seed=2024, reps=300)
    assert medians[0] > medians[1] > medians[2]
    slope = _slope(medians)
    assert _in_band(slope), f"slope {slope:.3f}, medians {medians}"


@pytest.mark.parametrize(
    "label, factor, reps",
    [
        # Slope about +0.1 (sd 0.05 at 120 repetitions).
        ("noise scale grows like n: errors do not shrink", lambda n: n / NS[0], 120),
        # Slope about -0.4 (sd 0.05).
        ("noise scale grows like sqrt(n)", lambda n: (n / NS[0]) ** 0.5, 120),
        # Slope about -0.52, only 0.08 from the band: 1000 repetitions make its sd about 0.01.
        ("noise nearly removed: sampling error n^-1/2 only", lambda n: 1e-6, 1000),
    ],
)
def test_error_scaling_power(label, factor, reps):
    slope = _slope(_median_abs_errors(seed=7, reps=reps, factor=factor))
    assert not _in_band(slope), f"{label}: slope {slope:.3f} inside the band"
