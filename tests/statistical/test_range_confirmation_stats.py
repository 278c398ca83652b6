"""The pure-DP magnitude range's confirmation (``confirm_beta``, used by the multivariate mean's
range retries): on a histogram with no persons, a range is released in at most about
``confirm_beta / 2`` of the runs (binomial upper quantile; measured 23 / 4,000 at 1e-2); power:
without the confirmation the noise floor alone releases a range from noise in several percent of
runs (208 / 4,000; binomial lower quantile of 2%), so the check can fail."""

from __future__ import annotations

from scipy.stats import binom

from dplib.mean.ranges import magnitude_range_from_counts
from dplib.mechanisms import SeededNoise

RUNS = 4000
EXP, OCT = (-40, 60), 2


def _false_ranges(confirm_beta):
    return sum(
        magnitude_range_from_counts({}, 0.05, 0.0, SeededNoise([31, r]), 0.9, EXP, OCT, confirm_beta) is not None
        for r in range(RUNS)
    )


def test_confirmation_bounds_ranges_read_from_noise():
    beta = 1e-2
    assert _false_ranges(beta) <= binom.ppf(1 - 1e-4, RUNS, beta / 2)  # ~20 expected at most


def test_without_confirmation_noise_alone_gives_ranges():
    # the floor ln(103 / 0.1): P(some of 103 Laplace draws passes it) ~ 5%
    assert _false_ranges(None) >= binom.ppf(1e-4, RUNS, 0.02)
