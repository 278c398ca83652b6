"""Unit tests of the fractional-repair certificate and the CCP search (:mod:`dplib.distribution.frc`;
docs/privacy/distribution.md): the FRC's minimal discard against a brute-force grid search (k = 2,
where the certificate reduces to a variance bound) and against an independent per-batch
formulation (k = 3: second moments about 0, explicit repair variables, no grouping, SCS); the
verified bracket; solver failure; OVERTRIM and the heterogeneity allowance; CCP. Non-private
library code."""

from __future__ import annotations

import math

import cvxpy as cp
import numpy as np
import pytest

from dplib.distribution.frc import FRC, ccp_search, frc_min_discard, tau_cov
from dplib.distribution.robust import SolverError, sigma_matrix
from dplib.errors import InvalidParameterError


def hist_of(counts):
    c, mult = np.unique(np.asarray(counts), axis=0, return_counts=True)
    return {tuple(int(v) for v in r): int(w) for r, w in zip(c, mult)}


def brute_force_k2(hist, m, q, tau, steps=1200):
    """Minimal discard for k = 2 by grid search over the kept masses of (at most) two groups.

    For k = 2, Cov(P) - Sigma(nu) = (v - q(1-q)/m) J with J = [[1,-1],[-1,1]], and the least
    trace of a diagonal majorizer of c J is 4 max(c, 0); so a certificate exists iff the repair
    atom r = (q - sum x p)/d lies in [0, 1] and the variance v of the first coordinate under P
    is at most q(1-q)/m + tau/4."""
    (c1, n1), (c2, n2) = sorted(hist.items())
    n = n1 + n2
    p1, p2 = c1[0] / m, c2[0] / m
    x1 = np.linspace(0, n1 / n, steps + 1)[:, None]
    x2 = np.linspace(0, n2 / n, steps + 1)[None, :]
    d = 1 - x1 - x2
    with np.errstate(divide="ignore", invalid="ignore"):
        s = x1 * (p1 - q) + x2 * (p2 - q)
        r = (q - x1 * p1 - x2 * p2) / d
        v = x1 * (p1 - q) ** 2 + x2 * (p2 - q) ** 2 + np.where(d > 0, s * s / d, 0.0)
    ok = (v <= q * (1 - q) / m + tau / 4 + 1e-15) & (((r >= -1e-15) & (r <= 1 + 1e-15)) | ((d <= 1e-15) & (np.abs(s) < 1e-15)))
    return float(d[ok].min())


@pytest.mark.parametrize(
    "hist, m, q, tau",
    [
        ({(3, 7): 6, (9, 1): 2}, 10, 0.4, 0.01),
        ({(5, 5): 3, (0, 10): 5}, 10, 0.5, 0.004),
        ({(2, 6): 7, (8, 0): 1}, 8, 0.3, 0.02),
    ],
)
def test_min_discard_k2_against_grid_brute_force(hist, m, q, tau):
    frc = FRC(hist, m, tau)
    cert = frc.certify([q, 1 - q])
    ref = brute_force_k2(hist, m, q, tau)
    # grid step 1/steps of each group's mass: the grid optimum is within (n_g/n)/1200 of the exact one
    assert cert.lower <= ref + 1e-9
    assert ref - 2.0 / 1200 <= cert.upper <= ref + 1e-7
    assert frc.solve([q, 1 - q]).discard == pytest.approx(ref, abs=2.0 / 1200)


def per_batch_reference(counts, m, nu, tau):
    """Independent formulation: one weight per batch (no grouping), explicit repair mass rho and
    second moment R = rho rho^T / d (Schur), moments about 0, mean constraint explicit; SCS."""
    y = np.asarray(counts, dtype=float) / m
    n, k = y.shape
    w, lam, rho = cp.Variable(n), cp.Variable(k), cp.Variable(k)
    rr = cp.Variable((k, k), symmetric=True)
    d = 1 - cp.sum(w) / n
    second = sum((w[i] / n) * np.outer(y[i], y[i]) for i in range(n)) + rr
    cov_gap = second - np.outer(nu, nu) - sigma_matrix(nu, m)
    cons = [w >= 0, w <= 1, rho >= 0, y.T @ w / n + rho == nu, cp.sum(lam) <= tau,
            cp.bmat([[rr, cp.reshape(rho, (k, 1), order="C")], [cp.reshape(rho, (1, k), order="C"), cp.reshape(d, (1, 1), order="C")]]) >> 0,
            cp.diag(lam) - cov_gap >> 0]
    prob = cp.Problem(cp.Minimize(d), cons)
    prob.solve(solver="SCS", eps_abs=1e-8, eps_rel=1e-8, max_iters=100000)
    return float(prob.value)


def test_min_discard_k3_against_per_batch_formulation():
    rng = np.random.default_rng(4)
    m, mu = 10, np.array([0.5, 0.3, 0.2])
    counts = np.vstack([rng.multinomial(m, mu, size=9), [[0, 0, 10], [0, 1, 9]]])
    hist = hist_of(counts)
    frc = FRC(hist, m, 0.01)
    for nu in ([0.5, 0.3, 0.2], [0.4, 0.3, 0.3], [0.6, 0.2, 0.2]):
        cert = frc.certify(nu)
        ref = per_batch_reference(counts, m, np.array(nu), 0.01)
        assert cert.lower - 1e-6 <= ref <= cert.upper + 1e-6, (nu, cert, ref)
        assert cert.gap(frc.n) < 1e-3


def test_spec_counterexample_frc_moves_078():
    """The kept-mass counterexample (docs/privacy/distribution.md, P3): nu = (.5,.3,.2), m = 10,
    five (5,3,2) and fifteen (7,2,1), tau = 0.01: replacing one (5,3,2) by (7,2,1) moves the FRC
    score by 0.78 (the kept-mass form by 3.2)."""
    nu = [0.5, 0.3, 0.2]
    a = FRC({(5, 3, 2): 5, (7, 2, 1): 15}, 10, 0.01).certify(nu)
    b = FRC({(5, 3, 2): 4, (7, 2, 1): 16}, 10, 0.01).certify(nu)
    assert 20 * (b.upper - a.upper) == pytest.approx(0.78, abs=0.005)
    assert 20 * (b.lower - a.lower) == pytest.approx(0.78, abs=0.005)


def test_bracket_contains_the_raw_optimum_and_is_narrow():
    rng = np.random.default_rng(1)
    m = 50
    counts = rng.multinomial(m, [0.4, 0.35, 0.25], size=60)
    frc = FRC(hist_of(counts), m, tau_cov(3, 60, m, 0.05))
    for nu in rng.dirichlet([8, 7, 5], size=5):
        cert = frc.certify(nu)
        raw = frc.solve(nu).discard
        assert cert.lower <= raw + 1e-7 and raw <= cert.upper + 1e-7
        assert cert.gap(frc.n) <= 1e-3
    corner = frc.certify([0.0, 0.0, 1.0])  # no batch fits below a corner: everything is discarded
    assert corner.upper == pytest.approx(1.0) and corner.lower == pytest.approx(1.0, abs=1e-5)


def test_solver_failure_raises(monkeypatch):
    frc = FRC({(3, 7): 6, (9, 1): 2}, 10, 0.01)

    def broken(self, *args, **kwargs):
        raise cp.error.SolverError("injected")

    monkeypatch.setattr(cp.Problem, "solve", broken)
    with pytest.raises(SolverError, match="failed in the solver"):
        frc.solve([0.4, 0.6])
    with pytest.raises(SolverError, match="certification failed"):
        frc.certify([0.4, 0.6])


def test_certify_retries_from_fresh_solver_objects(monkeypatch):
    """When the warm (cached solver object) path fails in both solvers, certify retries each
    solver from a fresh object; the bracket is then the same as a fresh solve's, and every
    attempt was made in the documented order."""
    frc = FRC({(3, 7): 6, (9, 1): 2, (5, 5): 4}, 10, 0.01)
    ref = frc.certify([0.4, 0.6])
    real = cp.Problem.solve
    calls = []

    def warm_fails(self, *args, **kwargs):
        calls.append((kwargs.get("solver"), kwargs.get("warm_start")))
        if kwargs.get("warm_start", True):
            raise cp.error.SolverError("injected: cached solver object")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(cp.Problem, "solve", warm_fails)
    cert = frc.certify([0.4, 0.6], max_gap=0.01)
    assert calls == [("CLARABEL", True), ("SCS", True), ("CLARABEL", False)]
    assert cert.solver == "CLARABEL" and cert.upper == pytest.approx(ref.upper, abs=1e-7)
    assert cert.lower == pytest.approx(ref.lower, abs=1e-7)


def test_unusable_status_raises(monkeypatch, caplog):
    """An unusable solver status aborts; the statuses (data-dependent) go to DEBUG, never into
    the exception's message."""
    frc = FRC({(3, 7): 6, (9, 1): 2}, 10, 0.01)

    def infeasible(self, *args, **kwargs):
        self._status = "infeasible"
        return math.inf

    monkeypatch.setattr(cp.Problem, "solve", infeasible)
    monkeypatch.setattr(cp.Problem, "status", property(lambda self: "infeasible"))
    with caplog.at_level("DEBUG", logger="dplib.distribution.frc"):
        with pytest.raises(SolverError, match="aborted as an incident") as err:
            frc.certify([0.4, 0.6])
    assert "status" not in str(err.value) and "infeasible" not in str(err.value)
    assert "infeasible" in caplog.text


def heterogeneous(rng, n, m, mu, concentration):
    return np.array([rng.multinomial(m, rng.dirichlet(concentration * mu)) for _ in range(n)])


def test_overtrim_without_heterogeneity_allowance_ok_with_it():
    """Honest heterogeneous persons (Corollary 3.11, attack A6): with omega = 0 the certificate of the
    true mean discards more than 3 eta (OVERTRIM); with omega budgeted it does not."""
    rng = np.random.default_rng(2)
    m, mu = 200, np.array([0.5, 0.3, 0.2])
    counts = heterogeneous(rng, 150, m, mu, 30.0)  # E ||mu_i - mu||_TV ~ 0.07
    hist = hist_of(counts)
    eta = 0.02
    tight = frc_min_discard(hist, m, mu, eta)
    assert tight.status == "OVERTRIM" and tight.discard > 3 * eta
    loose = frc_min_discard(hist, m, mu, eta, omega=0.1)
    assert loose.status == "OK" and loose.discard <= 3 * eta
    assert loose.tau == pytest.approx(tau_cov(3, 150, m, eta) + 4 * (0.1 / m + 0.01))


def test_ccp_recovers_from_point_mass_attack():
    """Attack A1: eta n batches all on the rarest symbol. Every CCP iterate is a
    certificate of its own mean (re-certified by the FRC at the output), the discard is
    non-increasing, and the error is far below the naive mean's."""
    rng = np.random.default_rng(3)
    m, n, eta = 50, 400, 0.1
    mu = np.array([0.5, 0.3, 0.2])
    bad = int(eta * n)
    counts = np.vstack([rng.multinomial(m, mu, size=n - bad), np.tile([0, 0, m], (bad, 1))])
    hist = hist_of(counts)
    naive = counts.sum(axis=0) / (n * m)
    res = ccp_search(hist, m, eta)
    assert all(b <= a + 1e-6 for a, b in zip(res.discards, res.discards[1:]))
    tv = 0.5 * np.abs(res.estimate - mu).sum()
    assert tv < 0.5 * 0.5 * np.abs(naive - mu).sum()
    assert tv < 3 * eta * math.sqrt(math.log(1 / eta) / m)
    frc = FRC(hist, m, res.tau)
    assert frc.certify(res.estimate).lower <= res.discard + 1e-5
    assert res.status == "OK"


def test_tau_cov_monotone_in_n_and_validates():
    """tau_cov non-increasing in n, n tau_cov non-decreasing (the add/remove bound)."""
    taus = [tau_cov(4, n, 30, 0.05, 0.01) for n in range(1, 400)]
    assert all(b <= a for a, b in zip(taus, taus[1:]))
    assert all((n + 1) * b >= n * a for n, (a, b) in enumerate(zip(taus, taus[1:]), start=1))
    for bad in (dict(eta=0.0), dict(eta=0.5), dict(omega=-0.1), dict(beta=1.0), dict(k=1), dict(n=0)):
        kw = dict(k=3, n=10, m=5, eta=0.05) | bad
        with pytest.raises(InvalidParameterError):
            tau_cov(**kw)
    with pytest.raises(InvalidParameterError, match="tau"):
        FRC({(1, 1): 2}, 2, 0.0)
    with pytest.raises(InvalidParameterError, match="nu"):
        FRC({(1, 1): 2}, 2, 0.1).certify([0.7, 0.7])


def test_primal_check_at_a_face_ignores_solver_residue_on_excluded_groups():
    """At a grid point on a face of the simplex (nu_3 = 0) no feasible point keeps a batch with a
    draw in category 3 (the repair mass nu - sum x_g y_g must stay >= 0). Residue of 1e-5 that
    a solver may leave on those groups must not defeat the exact check (it used to fall back to
    the trivial certificate, upper = 1, and the bracket failed the gap: a P3 abort). The bound
    found equals the one from the clean point and stays above the verified lower bound."""
    rng = np.random.default_rng(3)
    counts = rng.multinomial(40, [0.5, 0.45, 0.05], size=30)
    c, mult = np.unique(counts, axis=0, return_counts=True)
    frc = FRC({tuple(int(v) for v in r): int(w) for r, w in zip(c, mult)}, 40, 0.004)
    nu = np.array([0.5, 0.5, 0.0])
    cert = frc.certify(nu)
    sol = frc.solve(nu)
    excluded = frc.counts[:, 2] > 0
    assert excluded.any() and (~excluded).any()
    clean = frc.primal_upper(nu, np.where(excluded, 0.0, sol.keep), sol.lam)
    noisy = frc.primal_upper(nu, np.where(excluded, 1e-5, sol.keep), sol.lam)
    assert clean is not None and noisy == clean
    assert cert.lower <= noisy < 1.0 and frc.n * (cert.upper - cert.lower) <= 0.01
