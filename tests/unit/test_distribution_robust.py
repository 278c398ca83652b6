"""Unit tests of the robust building blocks (:mod:`dplib.distribution.robust`; docs/privacy/
distribution.md, "Robust building blocks"): subset maximisation against brute force, the SDP
bound, Lemma 2.11, one filter update and a whole filter run against a per-batch brute-force
reference, and small seeded attacks (contaminated batches) against the rate eta sqrt(ln(1/eta)/m).
Everything here is non-private library code."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from dplib.distribution import robust
from dplib.distribution.robust import (
    filter_threshold,
    filter_update,
    majorizer_check,
    max_subset_quadratic,
    min_trace_majorizer,
    subset_filter,
    tail_offset,
    weighted_gap,
)
from dplib.errors import InvalidParameterError


def sym(rng, k):
    a = rng.standard_normal((k, k))
    return (a + a.T) / 2.0


def centred(d):
    k = d.shape[0]
    p = np.eye(k) - np.ones((k, k)) / k
    return p @ d @ p


def all_subsets(k):
    return [np.array(s, dtype=np.float64) for s in itertools.product((0, 1), repeat=k)]


def brute_max(d):
    return max(float(s @ d @ s) for s in all_subsets(d.shape[0]))


def hist_of(counts):
    uniq, cnt = np.unique(counts, axis=0, return_counts=True)
    return {tuple(int(x) for x in u): int(c) for u, c in zip(uniq, cnt)}


def tv(a, b):
    return 0.5 * float(np.abs(np.asarray(a) - np.asarray(b)).sum())


# ---------------------------------------------------------------------------------------------
# max over subsets


@pytest.mark.parametrize("k", range(1, 9))
def test_enumeration_matches_brute_force(k):
    rng = np.random.default_rng(100 + k)
    for d in (sym(rng, k), centred(sym(rng, k)), -np.abs(sym(rng, k))):
        res = max_subset_quadratic(d)
        s = res.subset.astype(np.float64)
        assert res.exact
        assert res.value == pytest.approx(brute_max(d), abs=1e-12)
        assert float(s @ d @ s) == pytest.approx(res.value, abs=1e-12)


def test_enumeration_block_boundaries(monkeypatch):
    # small blocks: the block loop and the argmax bookkeeping across blocks are exercised
    monkeypatch.setattr(robust, "_BLOCK", 8)
    rng = np.random.default_rng(7)
    for k in (5, 7, 8):
        d = sym(rng, k)
        assert max_subset_quadratic(d).value == pytest.approx(brute_max(d), abs=1e-12)


def test_enumeration_k20_planted():
    # Delta = a a^T: max_s (a.s)^2 = max(sum of positive a, -sum of negative a)^2, known exactly
    rng = np.random.default_rng(3)
    a = rng.standard_normal(20)
    res = max_subset_quadratic(np.outer(a, a))
    expected = max(a[a > 0].sum(), -a[a < 0].sum()) ** 2
    assert res.exact and res.value == pytest.approx(expected, rel=1e-12)
    assert set(np.flatnonzero(res.subset)) in ({*np.flatnonzero(a > 0)}, {*np.flatnonzero(a < 0)})


def test_lemma_2_11_sign_vs_subset():
    # sigma^T Delta sigma = 4 s^T Delta s for sigma = 2 s - 1 whenever Delta 1 = 0, including a
    # covariance gap built from simplex points; it fails for an uncentred matrix (the test can fail)
    rng = np.random.default_rng(11)
    y = rng.dirichlet(np.ones(5), size=30)
    _, gap = weighted_gap(y, rng.uniform(0.1, 2.0, size=30), m=7)
    assert np.max(np.abs(gap @ np.ones(5))) < 1e-15
    for d in (centred(sym(rng, 5)), gap):
        for s in all_subsets(5):
            sigma = 2.0 * s - 1.0
            assert sigma @ d @ sigma == pytest.approx(4.0 * (s @ d @ s), abs=1e-12)
    d = sym(rng, 5)
    s = np.array([1.0, 0, 0, 0, 0])
    assert (2 * s - 1) @ d @ (2 * s - 1) != pytest.approx(4.0 * (s @ d @ s))


@pytest.mark.parametrize("k", [5, 7])
def test_sdp_bound_above_exact(k):
    rng = np.random.default_rng(200 + k)
    for d in (centred(sym(rng, k)), sym(rng, k)):
        exact = brute_max(d)
        res = max_subset_quadratic(d, exact_max_k=0)  # force the SDP path at small k
        s = res.subset.astype(np.float64)
        assert not res.exact
        assert res.value >= exact - 1e-12  # certified upper bound
        assert res.subset_value == pytest.approx(float(s @ d @ s), abs=1e-12)
        assert res.subset_value <= exact + 1e-12
    # centred: the homogenised SDP is the k x k majorizer SDP (Corollary 2.16) divided by 4 (Lemma 2.11),
    # and Proposition 2.17 bounds it by sinh(pi/2) x max |s^T Delta s|
    d = centred(sym(rng, k))
    res = max_subset_quadratic(d, exact_max_k=0)
    assert res.value == pytest.approx(min_trace_majorizer(d) / 4.0, rel=1e-6)
    rho = max(abs(float(s @ d @ s)) for s in all_subsets(k))
    assert res.value <= math.sinh(math.pi / 2) * rho * (1 + 1e-6)


# ---------------------------------------------------------------------------------------------
# majorizer check and one filter update against per-batch brute force

# 15 batches, m = 20: 12 from (.4, .35, .25) and 3 from random distributions; the filter makes one
# update (one vector dropped, one kept at ~0.49) and certifies
M_TINY = 20
TINY = {
    (0, 20, 0): 1, (1, 18, 1): 2, (6, 6, 8): 1, (6, 9, 5): 1, (7, 10, 3): 1,
    (8, 7, 5): 2, (8, 8, 4): 3, (9, 7, 4): 2, (10, 7, 3): 1, (11, 6, 3): 1,
}


def reference_step(batches, keep, m, t0):
    """Plain-Python reference of one filter iteration over individual batches."""
    k = len(batches[0])
    ys = [[c / m for c in b] for b in batches]
    tot = sum(keep)
    mu = [sum(w * y[j] for w, y in zip(keep, ys)) / tot for j in range(k)]
    cov = [[sum(w * (y[a] - mu[a]) * (y[b] - mu[b]) for w, y in zip(keep, ys)) / tot for b in range(k)] for a in range(k)]
    gap = [[cov[a][b] - ((mu[a] if a == b else 0.0) - mu[a] * mu[b]) / m for b in range(k)] for a in range(k)]
    best, best_s = -math.inf, None
    for s in itertools.product((0, 1), repeat=k):
        v = sum(s[a] * gap[a][b] * s[b] for a in range(k) for b in range(k))
        if v > best + 1e-15:
            best, best_s = v, s
    z = [sum((y[j] - mu[j]) * best_s[j] for j in range(k)) for y in ys]
    f = [max(zi * zi - t0, 0.0) for zi in z]
    f_max = max(fi for fi, w in zip(f, keep) if w > 0)
    if f_max == 0.0:  # documented fallback: no offset
        f = [zi * zi for zi in z]
        f_max = max(fi for fi, w in zip(f, keep) if w > 0)
    if f_max == 0.0:  # every kept point at the mean in direction s: nothing to filter
        return mu, best, list(keep)
    new = [w * (1.0 - fi / f_max) if w > 0 else 0.0 for w, fi in zip(keep, f)]
    return mu, best, new


def expand(hist):
    keys = sorted(hist)
    return [list(k) for k in keys for _ in range(hist[k])]


def test_majorizer_check_and_update_match_per_batch_reference():
    batches = expand(TINY)
    counts, mult = robust.histogram_arrays(TINY, M_TINY)
    y = counts / M_TINY
    t0 = tail_offset(0.1, M_TINY)
    keep_b = [1.0] * len(batches)
    weight = mult.astype(float)
    for _ in range(2):  # two updates (threshold 0): the second from fractional weights
        mu_ref, val_ref, keep_ref = reference_step(batches, keep_b, M_TINY, t0)
        chk = majorizer_check(y, weight, M_TINY, threshold=0.0)
        assert chk.value == pytest.approx(val_ref, abs=1e-14)
        np.testing.assert_allclose(chk.mean, mu_ref, atol=1e-15)
        weight = filter_update(y, weight, chk.mean, chk.subset, t0)
        per_batch = np.repeat(weight / mult, mult)  # grouping is exact: one weight per vector
        np.testing.assert_allclose(per_batch, keep_ref, atol=1e-14)
        keep_b = keep_ref
    assert 0 < np.sum(weight) < mult.sum()  # the updates did discard something


def test_majorizer_check_trace_units():
    counts, mult = robust.histogram_arrays(TINY, M_TINY)
    chk = majorizer_check(counts / M_TINY, mult.astype(float), M_TINY, threshold=1.0, trace=True)
    # trace units >= max over sign vectors = 4 x subset value (Lemma 2.11), and <= 4 sinh(pi/2) x
    assert 4.0 * chk.value - 1e-12 <= chk.trace <= 4.0 * math.sinh(math.pi / 2) * chk.value + 1e-9
    assert chk.certified == (chk.value <= 1.0)


def test_filter_run_matches_per_batch_reference():
    eta, m = 0.1, M_TINY
    batches = expand(TINY)
    n, k = len(batches), 3
    thr = filter_threshold(k, n, m, eta)
    t0 = tail_offset(eta, m)
    keep, its = [1.0] * n, 0
    while True:  # reference loop of the filter
        mu, val, new = reference_step(batches, keep, m, t0)
        if val <= thr:
            status = "OK"
            break
        if 1.0 - sum(new) / n > 3 * eta:
            status = "OVERTRIM"
            break
        keep, its = new, its + 1
    res = subset_filter(TINY, m, eta)
    assert (res.status, res.iterations) == (status, its)
    assert its >= 1
    np.testing.assert_allclose(np.repeat(res.keep, res.multiplicity), keep, atol=1e-13)
    np.testing.assert_allclose(res.estimate, mu, atol=1e-13)
    assert res.discard == pytest.approx(1.0 - sum(keep) / n, abs=1e-13)


def test_filter_threshold_formula():
    # the filter's threshold: 2 eta L/m + (omega/m + omega^2) + 0.5 sqrt((k + ln(1/beta))/n)/m
    expected = 2 * 0.05 * math.log(20) / 50 + (0.1 / 50 + 0.01) + 0.5 * math.sqrt((4 + math.log(20)) / 900) / 50
    assert filter_threshold(4, 900, 50, 0.05, omega=0.1) == pytest.approx(expected, rel=1e-14)
    assert tail_offset(0.05, 50) == pytest.approx(math.log(40) / 100, rel=1e-14)


# ---------------------------------------------------------------------------------------------
# attacks at small size
#
# Tolerance: the filter's TV error must be <= 1.5 x rate + t_samp with rate = eta sqrt(ln(1/eta)/m)
# (1.5 is the measured worst-case filter constant 1.2-1.4, rounded up) and t_samp the
# sampling error of the clean mean: for each subset S the clean mean of S is an average of
# n_clean * m independent draws, so by Hoeffding and a union bound over the 2^k subsets,
# max_S |mean(S) - mu(S)| <= sqrt(ln(2^k / b) / (2 n_clean m)) with probability 1 - b; b = 1e-3.
# With k = 6, m = 200, n = 2000, eta = 0.1: rate = 0.0107, t_samp = 0.0039, tolerance 0.0200.

K, M, N, ETA = 6, 200, 2000, 0.1
MU = np.full(K, 1.0 / K)
V = np.array([1, -1] * (K // 2), dtype=float)  # balanced signs: the hidden subset is {v = +1}


def rate(eta, m):
    return eta * math.sqrt(math.log(1 / eta) / m)


def t_samp(n_clean, m, k, b=1e-3):
    return math.sqrt(math.log(2**k / b) / (2 * n_clean * m))


def attacked(attack, seed, eta=ETA, n=N, m=M):
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(m, MU, size=n)
    nb = int(eta * n)
    if attack == "A1":  # point mass on the rarest symbol (ties: the first)
        bad = np.zeros(K, dtype=np.int64)
        bad[np.argmin(MU)] = m
        counts[:nb] = bad
    elif attack == "A2":  # i.i.d. shifted on a hidden balanced subset, TV shift gamma = 0.4
        counts[:nb] = rng.multinomial(m, MU + 0.4 / (K / 2) * V, size=nb)
    elif attack == "A2-weak":  # gamma = 0.15: below detection, shifts the mean by ~ eta gamma
        counts[:nb] = rng.multinomial(m, MU + 0.15 / (K / 2) * V, size=nb)
    elif attack == "A4":  # coordinate camouflage, a = 5 standard deviations per coordinate
        sd = np.sqrt(MU * (1 - MU) / m)
        bad = np.round(m * (MU + 5.0 * sd * V)).astype(np.int64)
        bad[-1] = m - bad[:-1].sum()
        counts[:nb] = bad
    return counts


@pytest.mark.parametrize("attack", ["A1", "A2", "A4"])
def test_filter_within_rate_naive_three_times_worse(attack):
    tol = 1.5 * rate(ETA, M) + t_samp((1 - ETA) * N, M, K)
    for seed in range(3):
        counts = attacked(attack, seed)
        res = subset_filter(hist_of(counts), M, ETA)
        err, naive = tv(res.estimate, MU), tv(counts.mean(axis=0) / M, MU)
        assert res.status == "OK" and res.exact
        assert err <= tol, (attack, seed, err, tol)
        assert naive >= 3 * rate(ETA, M) and naive >= 3 * err, (attack, seed, naive, err)
        assert res.discard <= 2 * ETA


def test_undetected_shift_stays_within_rate():
    # a shift too small to see moves the mean by at most ~ eta gamma, inside the tolerance
    tol = 1.5 * rate(ETA, M) + t_samp((1 - ETA) * N, M, K)
    for seed in range(3):
        res = subset_filter(hist_of(attacked("A2-weak", seed)), M, ETA)
        assert res.status == "OK" and tv(res.estimate, MU) <= tol


def test_clean_data_is_certified_by_the_precheck():
    counts = attacked("none", 5)
    res = subset_filter(hist_of(counts), M, 0.05)
    assert (res.status, res.iterations, res.discard) == ("OK", 0, 0.0)
    np.testing.assert_allclose(res.estimate, counts.mean(axis=0) / M, atol=1e-15)


def test_overtrim_when_eta_underestimated():
    counts = attacked("A1", 0, eta=0.1)  # 10% point masses, but eta = 0.02 claimed: 3 eta = 6%
    res = subset_filter(hist_of(counts), M, 0.02)
    assert res.status == "OVERTRIM"
    assert res.discard <= 3 * 0.02
    assert subset_filter(hist_of(counts), M, 0.1).status == "OK"  # the same data, eta right


def test_heterogeneity_budgeted_is_not_trimmed():
    # A6: honest persons with their own mu_i ~ Dirichlet(kappa mu), kappa = 80: E TV(mu_i, mu) ~ 0.1
    rng = np.random.default_rng(21)
    mus = rng.dirichlet(80 * MU, size=N)
    omega = float(np.mean(0.5 * np.abs(mus - MU).sum(axis=1)))
    assert 0.08 <= omega <= 0.12
    counts = np.array([rng.multinomial(M, p) for p in mus])
    hist = hist_of(counts)
    res = subset_filter(hist, M, 0.05, omega=0.1)
    assert res.status == "OK" and res.discard <= 0.01
    assert tv(res.estimate, MU) <= 0.1  # error O(omega) (Cor 3.11); here it is sampling only
    # without the allowance the same honest persons are over-trimmed (Corollary 3.11)
    assert subset_filter(hist, M, 0.05, omega=0.0).status == "OVERTRIM"


def test_filter_sdp_path_above_enumeration():
    # k = 7 with exact_max_k = 4: the SDP bound and rounded directions drive the filter
    rng = np.random.default_rng(4)
    k, m, n, eta = 7, 100, 600, 0.1
    mu = np.full(k, 1.0 / k)
    counts = rng.multinomial(m, mu, size=n)
    counts[: int(eta * n)] = np.eye(k, dtype=np.int64)[0] * m
    res = subset_filter(hist_of(counts), m, eta, exact_max_k=4)
    assert res.status == "OK" and not res.exact
    assert tv(res.estimate, mu) <= 1.5 * rate(eta, m) + t_samp((1 - eta) * n, m, k)
    y, w = counts / m, np.ones(n)
    bound = majorizer_check(y, w, m, 0.0, exact_max_k=4)
    assert bound.value >= majorizer_check(y, w, m, 0.0).value - 1e-12  # upper bound on the exact value


# ---------------------------------------------------------------------------------------------
# validation


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(eta=0.0), "eta"),
        (dict(eta=0.2), "eta"),
        (dict(eta=0.05, omega=-0.1), "omega"),
        (dict(eta=0.05, beta=1.0), "beta"),
        (dict(eta=0.05, C_var=0.0), "C_var"),
    ],
)
def test_filter_rejects_bad_parameters(kwargs, match):
    with pytest.raises(InvalidParameterError, match=match):
        subset_filter(TINY, M_TINY, **kwargs)


def test_filter_rejects_bad_histograms():
    with pytest.raises(InvalidParameterError, match="summing to m"):
        subset_filter({(3, 3, 3): 2}, 10, 0.05)
    with pytest.raises(InvalidParameterError, match="non-empty"):
        subset_filter({}, 10, 0.05)
    with pytest.raises(InvalidParameterError, match="integers >= 1"):
        subset_filter({(5, 5): 0}, 10, 0.05)
    with pytest.raises(InvalidParameterError, match="symmetric"):
        max_subset_quadratic(np.array([[0.0, 1.0], [0.0, 0.0]]))
    with pytest.raises(InvalidParameterError, match="simplex"):
        majorizer_check(np.array([[0.5, 0.6]]), np.ones(1), 10, 0.0)
