"""P3 (docs/privacy/distribution.md, "P3: robust and private"): the exact output distribution on
neighbouring tiny datasets (all grid probabilities, max ratio <= e^epsilon), a deliberately
broken score failing that same test, each premise of the score's sensitivity bound against its
counterexample (kept-mass
normalisation, integer discards, a data-dependent tau_cov, the gap's units, raw solver output),
the grid and neighbourhood, n0 and padding through the whole estimator, abort on solver failure,
and the cost before any data."""

from __future__ import annotations

import itertools
import math

import cvxpy as cp
import numpy as np
import pytest

from dplib.budget import Accountant, Budget
from dplib.distribution import p3
from dplib.distribution.batches import NumpyBatches
from dplib.distribution.frc import FRC
from dplib.distribution.private import DistributionPlan, private_distribution
from dplib.distribution.robust import SolverError, sigma_matrix
from dplib.errors import BudgetExceededError, InvalidParameterError
from dplib.mechanisms import SeededNoise

M, G, ALPHA, TAU, EPS = 10, 10, 0.2, 0.01, 1.0


def hist_of(counts):
    c, mult = np.unique(np.asarray(counts), axis=0, return_counts=True)
    return {tuple(int(v) for v in r): int(w) for r, w in zip(c, mult)}


def output_distribution(counts, epsilon=EPS):
    s = p3.p3_scores(hist_of(counts), M, G, ALPHA, TAU)
    return s, p3.p3_probabilities(s.alpha_scores, epsilon)


def max_log_ratio(p, q):
    return float(np.max(np.abs(np.log(p) - np.log(q))))


BASE = [[5, 3, 2], [6, 2, 2], [4, 4, 2], [5, 2, 3], [7, 2, 1], [5, 3, 2], [3, 4, 3], [6, 3, 1]]
NEIGHBOURS = [
    (3, [0, 0, 10]),  # a point mass on the rarest symbol (attack A7)
    (0, [10, 0, 0]),
    (6, [0, 10, 0]),
]


#: Closeness radii (l1): none, one grid step (2/G), two grid steps.
RADII = (0.0, 2.0 / G, 4.0 / G)


@pytest.fixture(scope="module")
def base_scores():
    return output_distribution(BASE)


@pytest.fixture(scope="module")
def neighbour_scores():
    """{i: (scores, probabilities)} of BASE with batch i replaced as in NEIGHBOURS (computed once)."""
    out = {}
    for i, new in NEIGHBOURS:
        other = [list(r) for r in BASE]
        other[i] = new
        out[i] = output_distribution(other)
    return out


@pytest.mark.parametrize("i, new", NEIGHBOURS)
def test_exact_output_distribution_ratio_within_e_epsilon(base_scores, neighbour_scores, i, new):
    s, p = base_scores
    s2, q = neighbour_scores[i]
    # the certified scores move by at most 1 + g everywhere (replace-one, n fixed) ...
    assert np.max(np.abs(s.upper - s2.upper)) <= 1 + p3.SANDWICH_GAP
    assert np.max(np.abs(s.alpha_scores - s2.alpha_scores)) <= 1 + p3.SANDWICH_GAP
    # ... so every output probability moves by at most e^epsilon
    assert max_log_ratio(p, q) <= EPS + 1e-12
    assert np.isclose(p.sum(), 1) and p.size == math.comb(G + 2, 2)


@pytest.mark.parametrize("radius", RADII)
def test_exact_ratio_within_e_epsilon_for_every_closeness_radius(base_scores, neighbour_scores, radius):
    """The closeness radius is a public choice: for each radius (0 = the certified score itself,
    one and two grid steps) the neighbourhood minimum of the certified scores moves by <= 1 + g
    on every neighbour, and the exact output distributions stay within e^epsilon."""
    s, _ = base_scores
    s_r = p3.neighbourhood_min(s.grid, s.upper, G, radius)
    p = p3.p3_probabilities(s_r, EPS)
    for i, _ in NEIGHBOURS:
        s2, _ = neighbour_scores[i]
        s2_r = p3.neighbourhood_min(s2.grid, s2.upper, G, radius)
        assert np.max(np.abs(s_r - s2_r)) <= 1 + p3.SANDWICH_GAP
        assert max_log_ratio(p, p3.p3_probabilities(s2_r, EPS)) <= EPS + 1e-12


def test_radius_zero_is_the_score_and_a_larger_radius_flattens_it(base_scores):
    """Radius 0 (and anything below one grid step, 2/G in l1) leaves the scores unchanged; a
    larger radius spreads the output: the expected l1 distance of the output to the data's mean
    (computed from the exact distributions) grows from radius 0 to two grid steps."""
    s, _ = base_scores
    for r in (0.0, 1.9 / G):
        assert np.array_equal(p3.neighbourhood_min(s.grid, s.upper, G, r), s.upper)
    assert not np.array_equal(p3.neighbourhood_min(s.grid, s.upper, G, 2.0 / G), s.upper)
    ybar = np.mean(np.array(BASE) / M, axis=0)
    dist = np.abs(s.grid / G - ybar).sum(axis=1)
    spread = [float(p3.p3_probabilities(p3.neighbourhood_min(s.grid, s.upper, G, r), EPS) @ dist) for r in (0.0, 4.0 / G)]
    assert spread[0] < spread[1]


def test_broken_exponent_fails_the_ratio_test(base_scores, neighbour_scores):
    """The same exact test with a broken mechanism: exp(-epsilon S) instead of exp(-epsilon S/2)
    (docs/privacy/distribution.md) exceeds e^epsilon on a neighbour pair, so the test above has power."""
    s, _ = base_scores
    s2, _ = neighbour_scores[3]
    p = p3.p3_probabilities(s.alpha_scores, 2 * EPS)  # = exp(-EPS S / (1+g)): the broken exponent
    q = p3.p3_probabilities(s2.alpha_scores, 2 * EPS)
    assert max_log_ratio(p, q) > EPS * 1.2


def kept_mass_score(hist, m, nu, tau):
    """The WRONG variant (docs/privacy/distribution.md, P3): covariance about nu normalised by the kept mass (the
    filter's C_w form), no repair point: ``sum x_g z z^T / sum x - Sigma(nu) <= Diag(lambda)``
    (multiplied through by sum x, with Lambda = (sum x) lambda)."""
    counts, mult = zip(*sorted(hist.items()))
    y = np.array(counts, float) / m
    n = sum(mult)
    a = np.array(mult) / n
    z = y - nu
    om, big_l = cp.Variable(len(a)), cp.Variable(len(nu))
    x = cp.multiply(a, om)
    lhs = cp.sum(x) * sigma_matrix(nu, m) + cp.diag(big_l) - sum(x[g] * np.outer(z[g], z[g]) for g in range(len(a)))
    prob = cp.Problem(cp.Minimize(1 - cp.sum(x)), [om >= 0, om <= 1, cp.sum(big_l) <= tau * cp.sum(x), (lhs + lhs.T) / 2 >> 0])
    prob.solve(solver="CLARABEL")
    return n * prob.value


def test_premise_covariance_normalised_by_n_with_repair_point():
    """Counterexample (docs/privacy/distribution.md, P3): replacing one (5,3,2) by (7,2,1) moves the kept-mass score
    4.0 -> 7.2 (sensitivity broken) while the FRC score moves 0.78; and an exponential mechanism
    on the kept-mass score fails the exact ratio test where the FRC's passes."""
    nu = np.array([0.5, 0.3, 0.2])
    h, h2 = {(5, 3, 2): 5, (7, 2, 1): 15}, {(5, 3, 2): 4, (7, 2, 1): 16}
    assert kept_mass_score(h, 10, nu, 0.01) == pytest.approx(4.0, abs=1e-4)
    assert kept_mass_score(h2, 10, nu, 0.01) == pytest.approx(7.2, abs=1e-4)
    frc_move = 20 * (FRC(h2, 10, 0.01).certify(nu).upper - FRC(h, 10, 0.01).certify(nu).upper)
    assert abs(frc_move) <= 1
    # exact output distributions on a 3-point candidate set containing nu (data-independent)
    cands = [nu, np.array([0.6, 0.25, 0.15]), np.array([0.7, 0.2, 0.1])]
    wrong = [np.array([kept_mass_score(hh, 10, v, 0.01) for v in cands]) for hh in (h, h2)]
    right = [np.array([20 * FRC(hh, 10, 0.01).certify(v).upper for v in cands]) for hh in (h, h2)]
    eps = 1.0
    pw = [p3.p3_probabilities(w, eps) for w in wrong]
    pr = [p3.p3_probabilities(r, eps) for r in right]
    assert max_log_ratio(*pw) > eps
    assert max_log_ratio(*pr) <= eps


def integer_score_k2(cs, m, q, tau):
    """Fewest whole batches to discard (repair point kept) so that nu = (q, 1-q) is certified,
    k = 2 (certificate iff the repair atom is in [0, 1] and var <= q(1-q)/m + tau/4), by
    enumeration of subsets."""
    p = np.array(cs) / m
    n = len(p)
    for t in range(n + 1):
        for kept in itertools.combinations(range(n), n - t):
            pk = p[list(kept)]
            d = t / n
            if t == 0:
                if abs(pk.sum() / n - q) > 1e-12:
                    continue
                v = ((pk - q) ** 2).sum() / n
            else:
                r = (q - pk.sum() / n) / d
                if not -1e-12 <= r <= 1 + 1e-12:
                    continue
                v = ((pk - q) ** 2).sum() / n + d * (r - q) ** 2
            if v <= q * (1 - q) / m + tau / 4 + 1e-12:
                return t
    return n


def test_premise_fractional_not_integer_discards():
    """Integer discards (docs/privacy/distribution.md, P3) moved a score 0 -> 2 under one removal. Instance (found by
    search, k = 2, m = 2, nu = (1/2, 1/2), tau = 0.01): batches with 0, 1, 1, 2 draws of the
    first category; removing one '1' batch. The fractional score moves by < 1 ((n-1)/n bound)."""
    cs, m, q, tau = [0, 1, 1, 2], 2, 0.5, 0.01
    assert integer_score_k2(cs, m, q, tau) == 0
    assert integer_score_k2([0, 1, 2], m, q, tau) == 2
    frac = [len(x) * FRC(hist_of([[c, m - c] for c in x]), m, tau).certify([q, 1 - q]).upper for x in (cs, [0, 1, 2])]
    assert abs(frac[1] - frac[0]) <= 3 / 4 + 1e-6


def test_premise_tau_public_and_fixed():
    """A tau_cov computed from the data breaks the bound. Eight moderate outliers (7,3,0) need
    discards at the public tau; an extreme batch (0,0,10) inflates a data-dependent tau (the
    data's own majorizer trace at nu) so that fewer are discarded; replacing the extreme batch
    by a clean one moves that score by ~1.5 > 1, while with tau fixed the same replacement moves
    the score by <= 1 (found by a small search over outlier counts and positions)."""
    from dplib.distribution.robust import min_trace_majorizer

    nu = np.array([0.5, 0.3, 0.2])
    clean = [[5, 3, 2]] * 10 + [[6, 2, 2], [4, 3, 3], [5, 4, 1], [6, 3, 1], [4, 4, 2]] * 2
    y_data = clean + [[7, 3, 0]] * 8 + [[0, 0, 10]]
    y_nb = clean + [[7, 3, 0]] * 8 + [[5, 3, 2]]
    tau = 0.004

    def data_tau(counts):  # a data-dependent tau: the data's own certificate trace at nu
        z = np.array(counts, float) / 10 - nu
        return max(min_trace_majorizer(z.T @ z / len(z) - sigma_matrix(nu, 10)), tau)

    s_fixed = [len(c) * FRC(hist_of(c), 10, tau).certify(nu).upper for c in (y_data, y_nb)]
    s_data = [len(c) * FRC(hist_of(c), 10, data_tau(c)).certify(nu).upper for c in (y_data, y_nb)]
    assert abs(s_fixed[1] - s_fixed[0]) <= 1 + 1e-6
    assert abs(s_data[1] - s_data[0]) > 1.3


@pytest.mark.filterwarnings("ignore:Solution may be inaccurate")
def test_premise_certified_scores_with_gap_in_batch_units(base_scores):
    """(a) Raw solver output is not a certified score: SCS at a loose tolerance returns values
    outside the verified bracket. (b) The gap must be in batch units: if the bracket were only
    required to be narrower than g in *discard* units (n g batches), an adversarial choice of
    values inside such brackets breaks the ratio bound that the batch-unit gap keeps."""
    s, _ = base_scores
    frc = FRC(hist_of(BASE), M, TAU)
    prob = frc._problem(TAU)[0]
    outside = 0
    for row in s.grid[::6]:
        nu = row / G
        cert = frc.certify(nu)
        frc._run(nu, TAU, "CLARABEL")  # set the parameters
        prob.solve(solver="SCS", eps_abs=1e-2, eps_rel=1e-2, max_iters=50)
        outside += not (cert.lower - 1e-9 <= prob.value <= cert.upper + 1e-9)
    assert outside > 0
    # (b) exact scores with sensitivity exactly 1 (attainable): S = (0, 1, ..., 1) and
    # S' = (1, 0, ..., 0); certified values may sit anywhere in [S, S + width]. The worst choice,
    # S_up = S + width (0, 1, ..., 1) and S'_up = S' + width (1, 0, ..., 0), gives a log ratio
    # at point 0 that tends to epsilon (1 + width) / (1 + g): within epsilon iff width <= g.
    n_pts, n = 5000, 200
    exact = np.ones(n_pts)
    exact[0] = 0.0
    exact_nb = 1.0 - exact
    for width, ok in ((p3.SANDWICH_GAP, True), (n * p3.SANDWICH_GAP, False)):  # batch vs discard units
        pa = p3.p3_probabilities(exact + width * exact, EPS)
        pb = p3.p3_probabilities(exact_nb + width * exact_nb, EPS)
        assert (max_log_ratio(pa, pb) <= EPS + 1e-12) == ok


def test_grid_and_neighbourhood_against_brute_force():
    grid = p3.simplex_grid(3, 6)
    assert grid.shape == (28, 3) and np.all(grid.sum(axis=1) == 6) and len({tuple(r) for r in grid}) == 28
    rng = np.random.default_rng(0)
    scores = rng.uniform(0, 5, size=len(grid))
    got = p3.neighbourhood_min(grid, scores, 6, 0.5)  # l1 radius 0.5 = 3 grid units
    ref = np.array([min(scores[j] for j in range(len(grid)) if np.abs(grid[i] - grid[j]).sum() <= 3) for i in range(len(grid))])
    assert np.array_equal(got, ref)
    assert p3.grid_resolution(3, 0.06) == 100 and p3.grid_size(3, 100) == 5151
    e = p3.eta_priv(0.05, 400)
    assert 1.5 * e * math.sqrt(math.log(1 / e) / 400) <= 0.05 / 4 + 1e-12 and e <= 0.05
    e2 = p3.eta_priv(0.01, 100)
    assert 1.5 * e2 * math.sqrt(math.log(1 / e2) / 100) == pytest.approx(0.01 / 4, rel=1e-6)


def small_backend(counts, seed=0):
    rng = np.random.default_rng(seed)
    return NumpyBatches.from_counts(np.asarray(counts), rng.integers(0, 2**32, size=len(counts)), M)


def p3_plan(epsilon=4.0, **kw):
    return DistributionPlan(Budget(epsilon), ("a", "b"), M, "P3", alpha=ALPHA, grid_resolution=G, **kw)


def test_cost_before_data_and_stages():
    plan = p3_plan(2.0)
    ch = plan.charges()
    assert [c.stage for c in ch] == ["person count (n0)", "P3 exponential mechanism"]
    assert ch[0].budget == Budget(0.2) and ch[1].budget.epsilon == pytest.approx(1.8)
    assert plan.cost() == Budget(2.0)
    assert p3_plan(2.0, p3_n_mode="public_as_in_paper").charges()[0].budget == Budget(2.0)
    acc = Accountant(Budget(2.0 * (1 - 1e-9)))
    with pytest.raises(BudgetExceededError):
        private_distribution(small_backend(BASE), plan, SeededNoise(0), acc)
    assert acc.charges == []
    with pytest.raises(InvalidParameterError, match="k <= 5"):
        DistributionPlan(Budget(1.0), tuple("abcde"), M, "P3")
    with pytest.raises(InvalidParameterError, match="grid points"):
        DistributionPlan(Budget(1.0), ("a", "b", "c"), M, "P3", alpha=0.01)
    with pytest.raises(InvalidParameterError, match="p3_n_mode"):
        DistributionPlan(Budget(1.0), ("a", "b"), M, "P3", p3_n_mode="exact")


@pytest.mark.parametrize("bad", [-0.1, 2.5, float("nan"), float("inf"), True, "0"])
def test_closeness_radius_validated_before_data(bad):
    with pytest.raises(InvalidParameterError, match="closeness_radius"):
        p3_plan(closeness_radius=bad)


def test_count_share_sets_the_stage_budgets():
    plan = p3_plan(2.0, p3_count_share=0.25)
    ch = plan.charges()
    assert ch[0].budget == Budget(0.5) and ch[1].budget.epsilon == pytest.approx(1.5)
    assert plan.cost() == Budget(2.0)
    assert p3_plan(2.0).charges()[0].budget == Budget(0.2)  # default share 0.1
    for bad in (0.0, 1.0, 1.5, float("nan"), None):
        with pytest.raises(InvalidParameterError, match="p3_count_share"):
            p3_plan(p3_count_share=bad)


@pytest.mark.parametrize("radius", [0.0, 4.0 / G])
def test_estimator_uses_the_plans_closeness_radius(monkeypatch, radius):
    """The release's scores are the neighbourhood minimum at the plan's radius (default 0), and
    the radius is released as a public parameter."""
    seen = {}
    real = p3.p3_scores

    def spy(hist, m, grid_res, r, *args, **kwargs):
        seen["r"] = r
        out = real(hist, m, grid_res, r, *args, **kwargs)
        seen["alpha_scores"], seen["upper"], seen["grid"] = out.alpha_scores, out.upper, out.grid
        return out

    monkeypatch.setattr(p3, "p3_scores", spy)
    kw = {} if radius == 0.0 else {"closeness_radius": radius}
    rel = private_distribution(small_backend(BASE), p3_plan(p3_n_mode="public_as_in_paper", **kw), SeededNoise(0))
    assert seen["r"] == radius and rel.parameters["closeness_radius"] == radius
    assert np.array_equal(seen["alpha_scores"], p3.neighbourhood_min(seen["grid"], seen["upper"], G, radius))


def test_n0_selection_and_padding_through_the_estimator(monkeypatch):
    """The estimator scores exactly n0 batches: the n0 of smallest (group hash, counts), padded
    with the all-OTHER batch when fewer persons exist."""
    seen = {}
    real = p3.p3_scores

    def spy(hist, *args, **kwargs):
        seen["hist"] = dict(hist)
        return real(hist, *args, **kwargs)

    monkeypatch.setattr(p3, "p3_scores", spy)
    be = small_backend(BASE, seed=1)
    # padding: huge epsilon for the count makes n0 = floor(8 + noise - b ln 10) with b tiny -> 7 or 8;
    # force padding by a backend with fewer persons than the lower bound below
    monkeypatch.setattr("dplib.fixed_n.lower_bound", lambda *a, **k: 11)
    rel = private_distribution(be, p3_plan(), SeededNoise(3))
    h = seen["hist"]
    assert sum(h.values()) == 11 and h[(0, 0, M)] == 3  # 8 persons + 3 dummies (none of BASE is all-OTHER)
    assert rel.parameters["n0"] == 11 and rel.parameters["dummy_batch"] == "all m draws in OTHER"
    assert rel.error_bar is None and rel.noise_scale is None and rel.status == "OK"
    assert np.all(rel.estimate >= 0) and math.isclose(rel.estimate.sum(), 1.0)
    assert set(np.round(rel.estimate * G, 9)) <= set(range(G + 1))  # a grid point
    # selection: n0 = 5 < 8 persons -> the 5 smallest (group, counts)
    monkeypatch.setattr("dplib.fixed_n.lower_bound", lambda *a, **k: 5)
    private_distribution(be, p3_plan(), SeededNoise(3))
    order = np.lexsort(tuple(be.counts[:, j] for j in (2, 1, 0)) + (be.group,))
    assert seen["hist"] == hist_of(be.counts[order[:5]])
    # n public as in the paper: all persons, no count stage
    rel = private_distribution(be, p3_plan(p3_n_mode="public_as_in_paper"), SeededNoise(3))
    assert seen["hist"] == hist_of(BASE) and "n0" not in rel.parameters


def test_solver_failure_aborts_after_charging(monkeypatch):
    def broken(self, *args, **kwargs):
        raise cp.error.SolverError("injected")

    monkeypatch.setattr(cp.Problem, "solve", broken)
    plan = p3_plan()
    acc = Accountant(plan.budget)
    with pytest.raises(SolverError):
        private_distribution(small_backend(BASE), plan, SeededNoise(0), acc)
    assert [c.stage for c in acc.charges] == ["person count (n0)", "P3 exponential mechanism"]


def test_sampler_follows_the_exact_distribution(base_scores):
    """Seeded Gumbel-max draws against the exact probabilities: chi-square goodness of fit over
    the 6 most likely points plus the rest (alpha = 0.001; power: a 30% error in epsilon is
    rejected)."""
    from scipy import stats

    s, p = base_scores
    draws = 4000
    rng = np.random.default_rng(11)
    idx = np.array([p3.p3_sample(s.alpha_scores, EPS, SeededNoise(rng)) for _ in range(draws)])
    top = np.argsort(p)[::-1][:6]

    def chi2_p(probs):
        exp = np.append(probs[top], 1 - probs[top].sum()) * draws
        obs = np.append([np.sum(idx == t) for t in top], draws - np.isin(idx, top).sum())
        return stats.chisquare(obs, exp).pvalue

    assert chi2_p(p) > 0.001
    assert chi2_p(p3.p3_probabilities(s.alpha_scores, 1.3 * EPS)) < 0.001


def test_the_utility_bound_holds_and_flags_too_few_persons(base_scores):
    """em_score_bound (McSherry-Talwar at 90%) against the exact output distribution of real P3
    scores: the mass beyond best + bound is at most 10% (and the bound is not vacuous: beyond
    half of it the mass is larger than beyond it). A release whose bound reaches a quarter of the
    persons scored is flagged ``uninformative`` and says so (a new user's P3 at 74 persons, epsilon
    0.27: total variation 0.375, status OK, nothing said); one with room is not."""
    s, p = base_scores
    bound = p3.em_score_bound(EPS, s.alpha_scores.size)
    best = float(np.min(s.alpha_scores))
    tail = float(np.sum(p[s.alpha_scores > best + bound]))
    assert tail <= 0.1
    assert float(np.sum(p[s.alpha_scores > best + bound / 2])) > tail
    few = private_distribution(small_backend(BASE), p3_plan(0.5), SeededNoise(0))
    assert few.parameters["uninformative"] is True
    assert few.parameters["em_score_bound_90_batches"] >= 0.25 * few.parameters["persons_scored"]
    assert "WARNING (uninformative)" in few.error_covers
    many = np.repeat(np.asarray(BASE), 100, axis=0)  # 800 persons at epsilon 4
    rel = private_distribution(small_backend(many), p3_plan(4.0), SeededNoise(0))
    assert rel.parameters["uninformative"] is False and "WARNING" not in rel.error_covers
    assert rel.parameters["em_score_bound_90_batches"] < 0.25 * rel.parameters["persons_scored"]
