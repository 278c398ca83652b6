"""The exponential mechanism through the PRODUCTION noise source (OpenDP ``make_noisy_max``), on
the inputs P3 gives it (issue 19: every P3 release with the secure source failed in OpenDP's
constructor, after the budget was charged; only seeded doubles had been tested).

The draws are not seeded (the secure source has no seed): every test checks a distributional
property at a false-alarm rate of 1e-4, and each has a power check that a wrong mechanism (a
30%-wrong epsilon, a sign error, a deterministic tie-break) fails it. The last tests check the
output distribution's formula and the input rules (deterministic; moved here from the pure-DP
reference's tests, which use the same mechanism)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from dplib.budget import Budget
from dplib.distribution import p3
from dplib.distribution.private import STAGE_P3, DistributionPlan
from dplib.errors import InvalidParameterError
from dplib.mechanisms import (
    ExponentialMechanism,
    SecureNoise,
    SeededNoise,
    clamp_scores,
    exponential_mechanism_probabilities,
    inflate,
    sample_exponential_mechanism,
)
from dplib.mechanisms.exponential import SCORE_BOUND

ALPHA = 1e-4  # false-alarm rate of every test below (and the bar the power checks must clear)
EPS_EM = 1.8  # P3's mechanism budget at epsilon = 2 with the default count share 0.1
P3_SENSITIVITY = inflate(1.0 + p3.SANDWICH_GAP)


@pytest.fixture(scope="module")
def secure():
    return SecureNoise()


@pytest.fixture(scope="module")
def small_p3_scores():
    """Certified P3 scores (batch units) of a fixed 60-person histogram: k = 3, m = 10, G = 10
    (66 grid points): non-integer floats, the minimum near 2, most points far above it."""
    rng = np.random.default_rng(0)  # fixes the data only; the mechanism's draws are not seeded
    hist: dict[tuple[int, ...], int] = {}
    for c in rng.multinomial(10, [0.5, 0.3, 0.2], size=60):
        key = tuple(int(x) for x in c)
        hist[key] = hist.get(key, 0) + 1
    setup = p3.p3_setup(3, 10, 60, 0.3, 10, None, 0.05, 0.05)
    return p3.p3_scores(hist, 10, setup.G, 0.0, setup.tau, setup.gap).alpha_scores


def chi2_pvalue(draws: np.ndarray, probs: np.ndarray, min_prob: float = 0.01) -> float:
    """Chi-square goodness of fit; candidates below ``min_prob`` pooled into one cell."""
    counts = np.bincount(draws, minlength=probs.size)
    keep = probs >= min_prob
    obs = np.append(counts[keep], counts[~keep].sum())
    exp = np.append(probs[keep], probs[~keep].sum()) * draws.size
    if exp[-1] == 0.0:
        obs, exp = obs[:-1], exp[:-1]
    return float(stats.chisquare(obs, exp).pvalue)


def test_mechanisms_are_built_from_public_inputs_with_the_calibrated_map(secure):
    """Both OpenDP paths build (the float one was refused: "input_domain elements must be
    non-nan") and OpenDP's own privacy map gives rho = epsilon^2 / 8 at d_in = Delta."""
    for integer, delta in ((False, P3_SENSITIVITY), (True, 1.0), (False, 1.0)):
        mech = ExponentialMechanism(EPS_EM, secure, sensitivity=delta, integer_scores=integer)
        assert mech.sampler.startswith("OpenDP make_noisy_max")
        d_in = int(delta) if integer else delta
        assert mech._measurement.map(d_in) == pytest.approx(EPS_EM**2 / 8.0, rel=1e-9)
    plan = DistributionPlan(Budget(2.0), ("a", "b"), 10, estimator="P3", alpha=0.3)
    prepared = plan.prepare(secure)  # what the job builds before its ledger reservation
    assert set(prepared) == {STAGE_P3}
    assert (prepared[STAGE_P3].epsilon, prepared[STAGE_P3].sensitivity) == (pytest.approx(1.8), P3_SENSITIVITY)
    assert DistributionPlan(Budget(2.0), ("a", "b"), 10, estimator="P0").prepare(secure) == {}
    # public refusals happen at construction, before any charge
    with pytest.raises(InvalidParameterError, match="integer sensitivity"):
        ExponentialMechanism(1.0, secure, sensitivity=1.5, integer_scores=True)
    with pytest.raises(InvalidParameterError, match="noise"):
        ExponentialMechanism(1.0, object())
    with pytest.raises(InvalidParameterError, match="epsilon"):
        ExponentialMechanism(0.0, secure)


def test_p3_scores_follow_the_exponential_mechanism_with_power_check(secure, small_p3_scores):
    """3,000 secure draws on real P3 scores at epsilon 0.5 match prop. exp(-eps S / (2 (1+g)))
    (chi-square); the same draws reject the distribution of a 30%-wrong epsilon either way
    (simulated: no miss in 2,000 runs)."""
    eps, draws_n = 0.5, 3000
    mech = p3.p3_exponential_mechanism(eps, secure)
    draws = np.array([mech.sample(-small_p3_scores) for _ in range(draws_n)])
    assert chi2_pvalue(draws, p3.p3_probabilities(small_p3_scores, eps)) > ALPHA
    for wrong in (1.3 * eps, 0.7 * eps):
        assert chi2_pvalue(draws, p3.p3_probabilities(small_p3_scores, wrong)) < ALPHA
    # the exact probabilities are the mechanism's own (same clamp, same calibration)
    assert np.allclose(mech.probabilities(-small_p3_scores), p3.p3_probabilities(small_p3_scores, eps), rtol=1e-12)


@pytest.mark.parametrize("winner", [0, 4, 7])
def test_clear_winner_among_extreme_scores(secure, winner):
    """P3-style float scores (batch units, lower is better) with extreme losers: huge, beyond
    the clamp, +inf, NaN, the largest float. The winner is 60 batches ahead of the next, so any
    other output has probability < 8 exp(-1.8 * 60 / 2.02) < 1e-22 per draw: 300 draws must all
    be the winner. A sign error would pick the +inf / NaN / huge candidates, a constant index
    fails for two of the three positions."""
    losers = [60.0, 1e5, 1.01 * 2.0**62, math.inf, math.nan, 1.7976931348623157e308, 4.6e18]
    s = np.array(losers[:winner] + [0.0] + losers[winner:])
    mech = p3.p3_exponential_mechanism(EPS_EM, secure)
    assert {mech.sample(-s) for _ in range(300)} == {winner}
    # the integer path (the pure-DP reference's person counts) with extreme integers
    si = np.array([-(2**63) + 1, 2**63 - 1, 5, 2**62, -7], dtype=np.int64)  # 2^63-1 and 2^62 tie at the bound
    mech_i = ExponentialMechanism(EPS_EM, secure, sensitivity=1.0, integer_scores=True)
    got = np.array([mech_i.sample(si) for _ in range(600)])
    assert set(got) <= {1, 3}
    assert stats.binomtest(int(np.sum(got == 1)), got.size, 0.5).pvalue > ALPHA


def test_ties_and_tiny_differences_are_drawn_uniformly(secure):
    """Three winners a subnormal apart (and losers at -inf, NaN, -1e300) are drawn uniformly:
    chi-square against 1/3 each; power: a deterministic tie-break (always the first best) is
    rejected by the same test. Scores at or beyond the clamp tie exactly (the clamp is part of
    the mechanism)."""
    s = np.array([-math.inf, 5e-324, math.nan, 0.0, -5e-324, -1e300])
    mech = p3.p3_exponential_mechanism(EPS_EM, secure)
    draws = np.array([mech.sample(s) for _ in range(1500)])
    assert set(draws) <= {1, 3, 4}
    counts = np.array([np.sum(draws == i) for i in (1, 3, 4)])
    assert stats.chisquare(counts).pvalue > ALPHA
    assert stats.chisquare([draws.size, 0, 0]).pvalue < ALPHA  # the power check's alternative
    big = np.array([math.inf, 1e300, 2.0**62, 0.0])
    assert clamp_scores(big)[:3].tolist() == [float(SCORE_BOUND)] * 3
    draws = np.array([mech.sample(big) for _ in range(900)])
    assert set(draws) <= {0, 1, 2} and stats.chisquare(np.bincount(draws, minlength=3)).pvalue > ALPHA


@pytest.mark.parametrize("integer", [False, True])
def test_known_probability_three_quarters_with_power_check(secure, integer):
    """Two candidates whose scores differ by d with eps d / (2 Delta) = ln 3: the better one has
    probability exactly 3/4. 4,000 draws: binomial test at 3/4; a 30%-wrong epsilon gives 0.807
    or 0.684, which the same counts reject (simulated: 0 misses in 10^5 runs; 2,000 draws
    missed 1.5%)."""
    if integer:
        delta, d = 1.0, 2
        eps = math.log(3.0)
        s = np.array([0, -d], dtype=np.int64)
        mech = ExponentialMechanism(eps, secure, sensitivity=delta, integer_scores=True)
    else:
        delta, eps = P3_SENSITIVITY, EPS_EM
        d = 2.0 * delta * math.log(3.0) / eps
        s = np.array([0.0, -d])
        mech = p3.p3_exponential_mechanism(eps, secure)
    draws = 4000
    wins = sum(mech.sample(s) == 0 for _ in range(draws))
    assert stats.binomtest(wins, draws, 0.75).pvalue > ALPHA
    for factor in (1.3, 0.7):
        r = 3.0**factor
        assert stats.binomtest(wins, draws, r / (1.0 + r)).pvalue < ALPHA


def test_seeded_double_samples_the_same_distribution(small_p3_scores):
    """The seeded double (tests only) and the secure source share the clamp and the exact
    probabilities, so the seeded tests elsewhere test the production distribution."""
    mech = p3.p3_exponential_mechanism(0.5, SeededNoise(3))
    draws = np.array([mech.sample(-small_p3_scores) for _ in range(3000)])
    assert chi2_pvalue(draws, p3.p3_probabilities(small_p3_scores, 0.5)) > ALPHA
    assert chi2_pvalue(draws, p3.p3_probabilities(small_p3_scores, 0.65)) < ALPHA


# ----- the output distribution's formula and the input rules ------------------------------------
def test_exponential_mechanism_probabilities_match_formula_and_do_not_overflow():
    scores = np.array([0, 3, 7, 7, 2])
    eps = 0.8
    w = [math.exp(eps * s / 2) for s in scores]
    assert np.allclose(exponential_mechanism_probabilities(scores, eps), np.array(w) / sum(w), rtol=1e-13)
    w2 = [math.exp(eps * s / 4) for s in scores]
    assert np.allclose(exponential_mechanism_probabilities(scores, eps, 2.0), np.array(w2) / sum(w2), rtol=1e-13)
    big = exponential_mechanism_probabilities([1e6, 1e6 - 1, 0], 1.0)
    assert np.all(np.isfinite(big)) and abs(big[1] / big[0] - math.exp(-0.5)) < 1e-12 and big[2] == 0.0


def test_sampler_refuses_unknown_noise_sources_and_bad_shapes():
    class Plain:
        secure = False

    with pytest.raises(InvalidParameterError, match="noise"):
        sample_exponential_mechanism([1, 2], 1.0, Plain())
    for bad in ([], [[1, 2]]):  # the candidate set's shape is public: refused
        with pytest.raises(InvalidParameterError, match="scores"):
            sample_exponential_mechanism(bad, 1.0, SeededNoise(0))
    # score values are data: never refused, clamped (inf to the bound, NaN to minus the bound)
    assert sample_exponential_mechanism([1.0, np.inf], 1.0, SeededNoise(0)) == 1
    assert exponential_mechanism_probabilities([np.nan, 0.0], 1.0).tolist() == [0.0, 1.0]
    with pytest.raises(InvalidParameterError, match="epsilon"):
        exponential_mechanism_probabilities([1, 2], 0.0)
