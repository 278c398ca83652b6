"""Empirical DP audits, one per mechanism kind the estimators release through (issue 20).

For each mechanism: two neighbouring datasets that differ by one extreme person (chosen to move
the exact aggregate by its full sensitivity), many runs of the mechanism on each (seeded numpy
noise: the same code path as production up to the sampler), and a one-sided lower bound on
epsilon from the best threshold event: thresholds are chosen on a first half of the runs and the
probabilities estimated on the second half with Clopper-Pearson bounds (95% each side), so
``eps_lower = ln((P_lo[E | D'] - delta) / P_hi[E | D])`` is a valid lower confidence bound.

Each audit asserts no violation (``eps_lower <= epsilon``) and, at the same sample size, that a
planted bug is caught (``eps_lower > epsilon``): the noise scale halved (an effective 2 epsilon),
or for the thresholded histogram a threshold computed with twice the epsilon (a new bin crosses
it far more often than delta). Sizes: 20,000 runs per side, a few seconds per mechanism.

BHS23: its PTR coin is audited on neighbouring scores (z, z + 2); its Gaussian draw and Wishart
release are not audited empirically (their privacy loss on events likely enough to count is a
small part of epsilon: no planted bug could show at this size), see benchmarks/results/dp_audit.md.
The same audits at 100,000 runs per side: ``python -m benchmarks.dp_audit``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import beta as beta_dist

from dplib.aggregates import NumpyAggregates
from dplib.budget import Budget
from dplib.covariance.clipped import second_moment_release
from dplib.distribution.shares import NumpyShares, SharePlan, share_distribution
from dplib.groups import ALL_PERSONS
from dplib.mean.multivariate import clip_and_noise
from dplib.mean.univariate import centred_clip_and_noise, count_weight
from dplib.mechanisms import SeededNoise, gaussian_sigma
from dplib.mechanisms import histograms as H
from dplib.mechanisms.exponential import ExponentialMechanism
from dplib.quantile import STAGE_FINAL, QuantilePlan, candidates, log_widths, rank_scores, sub_edges

RUNS = 20_000
EPS = 1.0


@pytest.fixture(autouse=True)
def _fast_post_processing(monkeypatch):
    """Speed only, nothing the audit tests: the analytic-Gaussian calibration (a pure function of
    public values, ~0.1 s per call) is cached."""
    import functools

    from dplib.mechanisms import basic as B

    monkeypatch.setattr(B, "gaussian_sigma", functools.lru_cache(maxsize=64)(B.gaussian_sigma))


class HalvedNoise(SeededNoise):
    """The planted bug: every noise scale halved (what a sensitivity off by 2 does)."""

    def add_laplace(self, values, scale):
        return super().add_laplace(values, scale / 2.0)

    def add_gaussian(self, values, sigma):
        return super().add_gaussian(values, sigma / 2.0)


def _cp_low(k: int, n: int, a: float = 0.05) -> float:
    return 0.0 if k == 0 else float(beta_dist.ppf(a, k, n - k + 1))


def _cp_high(k: int, n: int, a: float = 0.05) -> float:
    return 1.0 if k == n else float(beta_dist.ppf(1 - a, k + 1, n - k))


def eps_lower_bound(out_d: np.ndarray, out_dp: np.ndarray, delta: float = 0.0, alpha: float = 0.05) -> float:
    """Lower confidence bound on epsilon from scalar outputs on D and D' (both directions, events
    {o > t} and {o < t}, t chosen on the first half, estimated on the second; Clopper-Pearson at
    ``alpha`` on each side)."""
    half = len(out_d) // 2
    cal_d, cal_p, est_d, est_p = out_d[:half], out_dp[:half], out_d[half:], out_dp[half:]
    best = -math.inf
    for a_cal, b_cal, a_est, b_est in ((cal_p, cal_d, est_p, est_d), (cal_d, cal_p, est_d, est_p)):
        # maximise P[E | a] / P[E | b] on the calibration half
        ts = np.quantile(np.concatenate([a_cal, b_cal]), np.linspace(0.02, 0.98, 49))
        cands = []
        for t in ts:
            for sign in (1, -1):
                pa = np.mean(sign * a_cal > sign * t)
                pb = np.mean(sign * b_cal > sign * t)
                if pa > 0.01:
                    cands.append(((pa - delta) / max(pb, 1.0 / len(b_cal)), t, sign))
        _, t, sign = max(cands)
        ka, kb = int(np.sum(sign * a_est > sign * t)), int(np.sum(sign * b_est > sign * t))
        lo_a, hi_b = _cp_low(ka, len(a_est), alpha), _cp_high(kb, len(b_est), alpha)
        if lo_a - delta > 0:
            best = max(best, math.log((lo_a - delta) / hi_b))
    return best


# ------------------------------------------------------------------------------------------------
# the mechanisms, each as "run once on D or D' with a noise source -> a scalar"
# ------------------------------------------------------------------------------------------------

N_BASE = 20


def _laplace_clip_run(extreme: bool, noise) -> float:
    """Univariate fine stage (Laplace on (centred clipped sum, w n)): D' adds a person at 1e6."""
    vals = np.zeros(N_BASE + (1 if extreme else 0))
    if extreme:
        vals[-1] = 1e6
    be = NumpyAggregates({"v": vals}, np.arange(vals.size))
    radius = 1.0
    out = centred_clip_and_noise(be, "v", 0.0, radius, count_weight(radius, 0.25), ALL_PERSONS, EPS, noise)
    return out.estimate


def _gaussian_clip_run(extreme: bool, noise) -> float:
    """Multivariate final stage (analytic Gaussian on (l2-clipped sum, w n)), d = 2, delta 1e-3."""
    vals = np.zeros((N_BASE + (1 if extreme else 0), 2))
    if extreme:
        vals[-1] = [1e6, 1e6]
    be = NumpyAggregates({"a": vals[:, 0], "b": vals[:, 1]}, np.arange(vals.shape[0]))
    out = clip_and_noise(be, ["a", "b"], np.zeros(2), 1.0, np.ones(2), ALL_PERSONS, Budget(EPS, 1e-3), noise)
    return float(out.center[0] + out.center[1])


_COV_SIGMA_UNIT = None


class _Memo:
    """The numpy aggregates of one side, each exact sum computed once (speed only: the audit is of
    the mechanism, sensitivity and noise; the sums' oracle and extreme-neighbour tests are in
    tests/unit/test_covariance_clipped.py)."""

    def __init__(self, inner):
        self.inner, self.cache = inner, {}

    def clipped_outer_sum(self, *args):
        key = ("outer", repr(args))
        if key not in self.cache:
            self.cache[key] = self.inner.clipped_outer_sum(*args)
        return self.cache[key]

    def clipped_sum(self, *args):
        key = ("sum", repr(args))
        if key not in self.cache:
            self.cache[key] = self.inner.clipped_sum(*args)
        return self.cache[key]


_COV_BACKENDS: dict = {}


def _cov_backend(extreme: bool):
    if extreme not in _COV_BACKENDS:
        vals = np.zeros((N_BASE + (1 if extreme else 0), 2))
        if extreme:
            vals[-1] = [1e6, 1e6]
        _COV_BACKENDS[extreme] = _Memo(NumpyAggregates({"a": vals[:, 0], "b": vals[:, 1]}, np.arange(vals.shape[0])))
    return _COV_BACKENDS[extreme]


def _covariance_second_moment_run(extreme: bool, noise) -> float:
    """The clipped covariance's stage 2 (analytic Gaussian on (vech second moment, c first moment,
    w n) of l2-clipped deviations), d = 2, delta 1e-3, R = 1: D' adds a person at (1e6, 1e6), on the
    ball's surface after clipping. The scalar: the released vector's projection on the direction of
    that person's contribution (the likelihood-ratio statistic of a Gaussian)."""
    global _COV_SIGMA_UNIT
    if _COV_SIGMA_UNIT is None:
        _COV_SIGMA_UNIT = gaussian_sigma(1.0, EPS, 1e-3)
    released, _, w, c = second_moment_release(_cov_backend(extreme), ["a", "b"], np.zeros(2), 1.0, ALL_PERSONS,
                                              np.ones(2), _COV_SIGMA_UNIT, noise)
    u = np.full(2, math.sqrt(0.5))
    direction = np.r_[u[0] * u[0], u[0] * u[1], u[1] * u[1], c * u, w]
    return float(released @ direction / np.linalg.norm(direction))


def _shares_run(extreme: bool, noise) -> float:
    """Share-sum distribution: D' adds a person whose every record is in category 1."""
    counts = np.tile([5, 0, 0], (N_BASE, 1))
    if extreme:
        counts = np.vstack([counts, [0, 1_000, 0]])
    be = NumpyShares.from_counts(counts, np.arange(counts.shape[0]))
    rel = share_distribution(be, SharePlan(Budget(EPS), ("x", "y")), noise)
    return float(rel.estimate[1])


def _histogram_existing_bin_run(extreme: bool, noise) -> float:
    """Thresholded histogram, a bin present on both sides (5 vs 6 persons): its released count
    (or -1e9 when suppressed)."""
    released, _, _ = H.thresholded_histogram({3: 6 if extreme else 5}, EPS, 1e-3, noise)
    return float(released.get(3, -1e9))


def _histogram_new_bin_run(extreme: bool, noise) -> float:
    """Thresholded histogram, a bin only the added person creates: released or not (delta 0.01)."""
    counts = {3: 50, 7: 1} if extreme else {3: 50}
    released, _, _ = H.thresholded_histogram(counts, EPS, 0.01, noise)
    return 1.0 if 7 in released else 0.0


_Q_CANDS = candidates(-1, 0, 1)  # 7 bins: |x| < 1/2, [1/2, 1), [1, 2), beyond, both signs
_Q_VALUES = np.array([-1.0, 1.0])


def _quantile_final_run(extreme: bool, noise, sensitivity: float = 0.5) -> float:
    """The quantile's final stage (dplib.quantile): the width-weighted exponential mechanism with
    the median's rank score (sensitivity 0.5), built at epsilon 2 and drawn at epsilon 1 (the
    adaptive-share path). D' adds a person far above every bin: every bin below the median loses
    0.5 and every bin above gains 0.5. Two persons and 7 bins keep every bin likely enough for
    threshold events to see the shift (in closed form the best threshold event of probability
    >= 2% reaches 0.70 epsilon honest and 1.44 epsilon with the bug). The planted bug declares the
    sensitivity as 0.25 (an effective 2 epsilon)."""
    vals = np.r_[_Q_VALUES, 1e6] if extreme else _Q_VALUES
    exact = NumpyAggregates({"v": vals}, np.arange(vals.size)).log_histogram("v", 0.0, ALL_PERSONS, sub_edges(1))
    scores, _ = rank_scores(exact, _Q_CANDS, 0.5)
    em = ExponentialMechanism(2.0 * EPS, noise, sensitivity=sensitivity)
    return float(em.sample(scores, epsilon=EPS, log_weights=log_widths(_Q_CANDS)))


def _outputs(run, noise_cls, seed: int) -> tuple[np.ndarray, np.ndarray]:
    nd, np_ = noise_cls(np.random.default_rng([seed, 0])), noise_cls(np.random.default_rng([seed, 1]))
    return (np.array([run(False, nd) for _ in range(RUNS)]), np.array([run(True, np_) for _ in range(RUNS)]))


#: name -> (run, delta, the least lower bound an honest run must reach). Threshold events of
#: probability >= 1% see almost all of a Laplace mechanism's epsilon; a Gaussian mechanism's
#: privacy loss reaches its epsilon only on events of probability ~delta, so less is visible.
MECHANISMS = {
    "laplace clip-and-noise": (_laplace_clip_run, 0.0, 0.5),
    "gaussian clip-and-noise": (_gaussian_clip_run, 1e-3, 0.3),
    "gaussian covariance second moment": (_covariance_second_moment_run, 1e-3, 0.3),
    "share-sum laplace": (_shares_run, 0.0, 0.5),
    "thresholded histogram (existing bin)": (_histogram_existing_bin_run, 1e-3, 0.5),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MECHANISMS))
def test_no_violation_and_the_planted_bug_is_caught(name):
    run, delta, visible = MECHANISMS[name]
    d, dp = _outputs(run, SeededNoise, 1)
    honest = eps_lower_bound(d, dp, delta)
    assert honest <= EPS, (name, honest)
    # an audit that cannot see anything would pass trivially: it must get close to the claim ...
    assert honest > visible * EPS, (name, honest)
    # ... and see the planted bug (noise halved: an effective 2 epsilon) at the same size
    d, dp = _outputs(run, HalvedNoise, 2)
    buggy = eps_lower_bound(d, dp, delta)
    assert buggy > EPS, (name, buggy)


@pytest.mark.slow
def test_quantile_weighted_exponential_mechanism_audit():
    """The quantile's final stage: no violation, most of epsilon visible, and a sensitivity
    declared at half its value (0.25 for the median) caught at the same size."""
    d, dp = _outputs(_quantile_final_run, SeededNoise, 5)
    honest = eps_lower_bound(d, dp)
    assert 0.4 * EPS < honest <= EPS, honest

    def buggy_run(extreme, noise):
        return _quantile_final_run(extreme, noise, sensitivity=0.25)

    d, dp = _outputs(buggy_run, SeededNoise, 6)
    buggy = eps_lower_bound(d, dp)
    assert buggy > EPS, buggy


def test_thresholded_histogram_new_bin_crosses_with_probability_at_most_delta(monkeypatch):
    delta = 0.01
    hits = sum(_histogram_new_bin_run(True, SeededNoise(np.random.default_rng([3, i]))) for i in range(RUNS))
    assert _cp_low(int(hits), RUNS) <= delta, hits / RUNS
    # planted bug: the threshold computed with twice the epsilon (too low): caught
    real = H.stability_threshold
    monkeypatch.setattr(H, "stability_threshold", lambda e, d: real(2.0 * e, d))
    hits = sum(_histogram_new_bin_run(True, SeededNoise(np.random.default_rng([4, i]))) for i in range(RUNS))
    assert _cp_low(int(hits), RUNS) > delta, hits / RUNS


def _quantile_plan_run(extreme: bool, noise) -> float:
    """The p90's final stage as the job builds it (``QuantilePlan(q=0.9).prepare``, drawn at half
    its budget): D' adds a person far above every bin (every bin below the p90 loses 0.9, every
    bin above gains 0.9). In closed form the best threshold event of probability >= 2% reaches
    0.35 epsilon honest, 4.6 epsilon if the plan declared min(q, 1 - q) = 0.1."""
    vals = np.r_[_Q_VALUES, 1e6] if extreme else _Q_VALUES
    exact = NumpyAggregates({"v": vals}, np.arange(vals.size)).log_histogram("v", 0.0, ALL_PERSONS, sub_edges(1))
    scores, _ = rank_scores(exact, _Q_CANDS, 0.9)
    em = QuantilePlan(Budget(2.0 * EPS), q=0.9).prepare(noise)[STAGE_FINAL]
    return float(em.sample(scores, epsilon=EPS, log_weights=log_widths(_Q_CANDS)))


@pytest.mark.slow
def test_quantile_plan_sensitivity_audit_at_q09(monkeypatch):
    """Through the plan's own prepare(): no violation at q = 0.9, and a plan that declares the
    sensitivity min(q, 1 - q) instead of max(q, 1 - q) is caught at the same size (a review's
    mutant that every other test missed)."""
    d, dp = _outputs(_quantile_plan_run, SeededNoise, 7)
    honest = eps_lower_bound(d, dp)
    assert 0.2 * EPS < honest <= EPS, honest
    monkeypatch.setattr(QuantilePlan, "sensitivity", property(lambda self: min(self.q, 1.0 - self.q)))
    d, dp = _outputs(_quantile_plan_run, SeededNoise, 8)
    buggy = eps_lower_bound(d, dp)
    assert buggy > EPS, buggy



# ------------------------------------------------------------------------------------------------
# BHS23's propose-test-release coin (dplib.covariance.sampling.ptr)
# ------------------------------------------------------------------------------------------------

PTR_EPS, PTR_DELTA = 1.0, 1e-3  # Claim 10 needs epsilon <= 1 and delta <= epsilon / 10


def _ptr_pair() -> tuple[int, int]:
    """The neighbouring scores the audit stresses: the scores are 2-sensitive (Lemma 42, tested
    on adversarial neighbours in tests/unit/test_covariance_stable.py), so (z, z + 2) with z the
    largest even score whose neighbour still passes with probability >= 1/2 under the coin being
    audited (there the FAIL events' ratio is largest among events likely enough to see)."""
    from dplib.covariance import sampling as S

    z = 0
    while S.ptr_pass_probability(z + 4, PTR_EPS, PTR_DELTA) >= 0.5:
        z += 2
    return z, z + 2


def _ptr_outputs(seed: int) -> tuple[np.ndarray, np.ndarray]:
    from dplib.covariance.sampling import ptr

    z, z2 = _ptr_pair()
    nd, np_ = SeededNoise(np.random.default_rng([seed, 0])), SeededNoise(np.random.default_rng([seed, 1]))
    # the released bit (PASS = 1) on D (score z) and on D' (score z + 2), RUNS coins each
    return (np.array([float(ptr(z, PTR_EPS, PTR_DELTA, nd)) for _ in range(RUNS)]),
            np.array([float(ptr(z2, PTR_EPS, PTR_DELTA, np_)) for _ in range(RUNS)]))


@pytest.mark.slow
def test_bhs23_ptr_coin_audit(monkeypatch):
    """BHS23's PTR coin M_PTR^{eps, delta} (Claim 10) on neighbouring scores z, z + 2: no
    violation of (1, 1e-3), most of epsilon visible (FAIL's probability ratio is exactly e^eps in
    closed form), and a coin calibrated for a 1-sensitive score (the exponent's 1/2 dropped, an
    effective 2 epsilon) caught at the same size."""
    from dplib.covariance import sampling as S

    d, dp = _ptr_outputs(9)
    assert 0.1 < d.mean() < 0.99 and 0.1 < dp.mean() < 0.99  # both coins random at the pair
    # FAIL's ratio reaches epsilon exactly, so the bound sits just below it: a 1e-3 level per side
    # keeps a false alarm below ~0.2% of seeds (at 0.05 it would be up to ~10%)
    honest = eps_lower_bound(d, dp, PTR_DELTA, alpha=1e-3)
    assert 0.7 * PTR_EPS < honest <= PTR_EPS, honest
    real = S.ptr_pass_probability
    monkeypatch.setattr(S, "ptr_pass_probability", lambda z, e, dl: real(z, 2.0 * e, dl))
    d, dp = _ptr_outputs(10)
    buggy = eps_lower_bound(d, dp, PTR_DELTA, alpha=1e-3)
    assert buggy > PTR_EPS, buggy
