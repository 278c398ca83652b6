"""dplib.fixed_n: the DP lower bound n0 (its failure probability against the exact Laplace tail,
with a power check), the padding rule, and bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from dplib.errors import InvalidParameterError
from dplib.fixed_n import lower_bound, pad_histogram, release_lower_bound
from dplib.mechanisms import SeededNoise


def test_lower_bound_formula():
    assert lower_bound(100.4, 10.0, 0.05) == math.floor(100.4 - 10 * math.log(10))
    assert lower_bound(-50.0, 10.0, 0.05) == 1 and lower_bound(-50.0, 10.0, 0.05, n_min=3) == 3
    for bad in (dict(beta=0.5), dict(beta=0.0), dict(laplace_scale=0.0), dict(noisy_count="10"), dict(n_min=0)):
        kw = dict(noisy_count=10.0, laplace_scale=1.0, beta=0.1) | bad
        with pytest.raises(InvalidParameterError):
            lower_bound(**kw)
    # total on extreme DP outputs (post-processing never refuses a noisy count): [n_min, 2^62]
    assert lower_bound(math.inf, 10.0, 0.05) == lower_bound(1e300, 10.0, 0.05) == 2**62
    assert lower_bound(-math.inf, 10.0, 0.05, n_min=3) == lower_bound(math.nan, 10.0, 0.05, n_min=3) == 3
    assert lower_bound(np.float64(5e-324), 1.0, 0.1) == 1


def test_failure_probability_matches_the_laplace_tail():
    """P[n0 > n] = P[L >= 1 + b ln(1/(2 beta))] = beta exp(-1/b) exactly (integer n, floor).
    20,000 seeded draws at b = 2 (epsilon = 0.5): two-sided binomial test at 0.001; power: the
    same test rejects a Laplace scale 30% too small."""
    n, eps, beta, draws = 500, 0.5, 0.1, 20_000
    rng = np.random.default_rng(5)
    noise = SeededNoise(rng)
    fails = sum(release_lower_bound(n, eps, beta, noise).n0 > n for _ in range(draws))
    b = (1 + 2.0**-20) / eps
    p_true = beta * math.exp(-1 / b)
    assert stats.binomtest(fails, draws, p_true).pvalue > 0.001
    b_wrong = 0.7 * b
    fails_wrong = sum(lower_bound(n + rng.laplace(0, b_wrong), b, beta) > n for _ in range(draws))
    assert stats.binomtest(fails_wrong, draws, p_true).pvalue < 0.001


def test_pad_histogram():
    h = {(1, 2): 3, (3, 0): 1}
    assert pad_histogram(h, 4, (0, 3)) == h
    assert pad_histogram(h, 6, (0, 3)) == {(1, 2): 3, (3, 0): 1, (0, 3): 2}
    assert pad_histogram(h, 6, (3, 0)) == {(1, 2): 3, (3, 0): 3}
    with pytest.raises(InvalidParameterError, match="more summaries than n0"):
        pad_histogram(h, 3, (0, 3))
    with pytest.raises(InvalidParameterError, match="n0"):
        pad_histogram(h, 0, (0, 3))
    with pytest.raises(InvalidParameterError, match="exact_count"):
        release_lower_bound(-1, 1.0, 0.1, SeededNoise(0))
