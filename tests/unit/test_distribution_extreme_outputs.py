"""Every batch-distribution estimator (P0-P3) is total in its earlier DP outputs: whatever the
noise makes of a DP count, a DP centre or a noisy sum (huge, tiny, +-inf), the release is OK
and its estimate a point of the simplex. The DP outputs feed radii, denominators, the P3 lower
bound n0 and the number of persons P3 scores only through clamping maps (post-processing);
nothing checks a data-dependent value to decide whether to run (issue 19).

The noise double below returns ``values + shift`` for a fixed extreme ``shift``: every DP
output is then extreme in the same direction. The exponential mechanism draws from its
seeded ``rng``."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dplib.budget import Budget
from dplib.distribution import p3
from dplib.distribution.batches import NumpyBatches
from dplib.distribution.private import DistributionPlan, PooledRelease, private_distribution
from dplib.distribution.simplex import project_to_simplex

M = 10
SHIFTS = [1e300, -1e300, math.inf, -math.inf, 1e17, 5e-324, -5e-324]


class ShiftNoise:
    """Adds a fixed extreme value to every exact value (a stand-in for extreme DP outputs)."""

    name, secure = "extreme-shift (test double)", False

    def __init__(self, shift: float, seed: int = 0) -> None:
        self.shift = shift
        self.rng = np.random.default_rng(seed)

    def add_laplace(self, values, scale):
        return np.asarray(values, dtype=np.float64) + self.shift

    add_gaussian = add_laplace


@pytest.fixture(scope="module")
def backend():
    rng = np.random.default_rng(4)
    counts = rng.multinomial(M, [0.5, 0.3, 0.2], size=80)
    return NumpyBatches.from_counts(counts, rng.integers(0, 2**32, size=len(counts)), M)


def assert_on_simplex(est, k=3):
    est = np.asarray(est)
    assert est.shape == (k,) and np.all(np.isfinite(est)) and np.all(est >= 0)
    assert math.isclose(math.fsum(est), 1.0, rel_tol=1e-12)


@pytest.mark.parametrize("shift", SHIFTS, ids=str)
@pytest.mark.parametrize("estimator,mode", [("P0", "parallel"), ("P1", "parallel"), ("P1", "sequential"),
                                            ("P2", "parallel"), ("P2", "sequential")])
def test_p0_p1_p2_total_in_extreme_dp_outputs(backend, estimator, mode, shift):
    plan = DistributionPlan(Budget(1.0, 1e-6 if estimator == "P2" else 0.0), ("a", "b"), M, estimator,
                            budget_mode=mode)
    rel = private_distribution(backend, plan, ShiftNoise(shift), None)
    assert rel.status == "OK"
    assert_on_simplex(rel.estimate)
    if rel.error_bar is not None:
        assert np.all(np.asarray(rel.error_bar) >= 0)


@pytest.mark.parametrize("shift", [math.inf, 1e300, -math.inf, 5e-324], ids=str)
def test_p3_total_in_extreme_n0(backend, shift):
    """The count's noise decides n0: +inf / 1e300 give n0 = 2^62 (the lower bound's clamp), and
    P3 scores n = min(n0, MAX_PERSONS) persons (the 80 real ones padded with the public dummy);
    -inf gives n0 = 1. Without the cap every grid point's certified bracket is wider than g
    from ~8e4 persons on and the release aborts after its charges (measured: every n >= 1e5)."""
    plan = DistributionPlan(Budget(2.0), ("a", "b"), M, "P3", alpha=0.3)
    rel = private_distribution(backend, plan, ShiftNoise(shift), None)
    assert rel.status == "OK"
    assert_on_simplex(rel.estimate)
    scored = rel.parameters["persons_scored"]
    assert 1 <= scored <= p3.MAX_PERSONS and scored == min(rel.parameters["n0"], p3.MAX_PERSONS)
    if shift > 1.0:
        assert rel.parameters["n0"] == 2**62 and scored == p3.MAX_PERSONS


def test_projection_and_noisy_count_are_total():
    assert_on_simplex(project_to_simplex(np.array([math.inf, 1.0, -math.inf])))
    assert project_to_simplex(np.array([math.inf, math.inf, 0.0])).tolist() == [0.5, 0.5, 0.0]
    assert project_to_simplex(np.array([math.nan, -1.0, -2.0])).tolist() == pytest.approx([1 / 3] * 3)
    assert project_to_simplex(np.array([1.7e308, 1.7e308, 1.0])).tolist() == pytest.approx([0.5, 0.5, 0.0])
    assert project_to_simplex(np.array([5e-324, 0.0, 0.0])).tolist() == [1.0, 0.0, 0.0]
    for v in ([math.inf, -math.inf, 1.0], [1.7e308] * 3, [math.nan] * 3):
        assert math.isfinite(PooledRelease(np.array(v), 1.0).noisy_count)
