"""Fractional-repair certificate (FRC) and the convex-concave search over the mean.

Ours, after Kamath, Majid, Moitra, Mouzakis, Ullman: the certificate replaces the pseudo-expectation
of Algorithm 3.1 by a probability measure with a repair point (its accuracy argument mirrors
Lemma 3.8; tau_cov with the heterogeneity allowance of Corollary 3.11). Derivation and premises:
docs/privacy/distribution.md, "P3: robust and private" and "Robust building blocks".

**Nothing here is differentially private.** The minimal discard, the kept weights and the CCP
estimate are functions of the exact data: library functions for trusted analysis and the score
inside P3 (:mod:`dplib.distribution.p3`, which releases only an exponential-mechanism draw).

The FRC for a fixed candidate mean ``nu``. Batches are grouped by distinct count
vector ``c_g`` (``g = 1..D``, multiplicity ``n_g``, ``a_g = n_g / n``, ``y_g = c_g / m``,
``z_g = y_g - nu``); one kept fraction ``omega_g in [0, 1]`` per group (grouping is exact for a
fixed ``nu``: the program is convex and symmetric within a group). With ``x_g = a_g omega_g``::

    minimise    d = 1 - sum_g x_g                         (discarded mass)
    subject to  0 <= omega <= 1
                nu - sum_g x_g y_g >= 0                   (the repair point lies in the simplex)
                sum_j lambda_j <= tau_cov                 (trace units)
                [[Diag(lambda) + Sigma(nu) - A, s], [s^T, d]] >= 0   ((k+1) x (k+1) LMI)

with ``A = sum_g x_g z_g z_g^T``, ``s = sum_g x_g z_g``, ``Sigma(nu) = (diag(nu) - nu nu^T)/m``.
The LMI is the Schur form of ``Cov(P) - Sigma(nu) <= Diag(lambda)`` for the probability measure
``P`` that puts mass ``x_g`` at ``y_g`` and the discarded mass ``d`` at one repair point, so
that its mean is exactly ``nu``: the covariance is normalised by ``n`` with the repair point,
**never by the kept mass** (the kept-mass form has no sensitivity bound; docs/privacy/distribution.md, P3).

Certified values: :meth:`FRC.certify` brackets the exact
optimum ``d*`` of the program (exact rational data ``c_g / m``, ``n_g / n``, ``nu``) between
``lower`` (weak duality, evaluated at the solver's dual point made exactly feasible) and
``upper`` (the solver's primal point shrunk and checked exactly by an eigenvalue test), with
float rounding bounded by explicit margins. Neither bound trusts the solver's tolerance.
"""

from __future__ import annotations

import itertools
import logging
import math
from dataclasses import dataclass, field
from typing import Literal, Mapping, Sequence

import numpy as np

from dplib.distribution.batches import check_batch_size
from dplib.distribution.robust import STATUS_OK, STATUS_OVERTRIM, SolverError, histogram_arrays, sigma_matrix
from dplib.distribution.simplex import project_to_simplex
from dplib.errors import InvalidParameterError

log = logging.getLogger(__name__)

#: Discard above OVERTRIM_FACTOR * eta gives status OVERTRIM (the filter's safeguard:
#: eta underestimated, or heterogeneity not budgeted, Corollary 3.11).
OVERTRIM_FACTOR = 3.0
#: Relative float-rounding margin of the certified bounds. Every bound is moved by this fraction
#: of the magnitude of the terms it sums (float64 rounding of sums of <= 10^6 terms is below
#: 1e-10 relative); it costs ~1e-9 batches in a score.
REL_MARGIN = 1e-9
#: The primal point is computed at tau_cov (1 - TAU_SLACK); the slack is spread back over lambda
#: so that the verified LMI has room for the solver's own feasibility error.
TAU_SLACK = 1e-6
#: Shrink factors tried on the solver's kept fractions until the LMI verifies (an exact
#: eigenvalue check of the LMI after a tiny shrink).
SHRINKS = (0.0, 1e-7, 1e-6, 1e-5, 1e-4)
#: Kept fractions below these floors are also tried at 0 (the solver leaves ~1e-10 on batches
#: that the repair constraint excludes at a face of the simplex; dropping kept mass is again a
#: move into the repair atom).
KEEP_FLOORS = (0.0, 1e-9, 1e-7)
#: Solvers tried in order by :meth:`FRC.certify` (Clarabel first; SCS as the retry).
CERTIFY_SOLVERS = ("CLARABEL", "SCS")
#: Attempts of :meth:`FRC.certify`: each solver warm (cvxpy reuses its cached solver object
#: across candidate means), then each again from a fresh solver object. The cached path depends
#: on the previous solves; it failed in both solvers on 2 of ~60,000 benchmark grid points that
#: a fresh solve certified (benchmarks/p3_vs_p0.py). Any attempt's bracket is verified, so which
#: one succeeds never changes the guarantee S0 <= S_up <= S0 + g.
CERTIFY_ATTEMPTS = tuple((solver, warm) for warm in (True, False) for solver in CERTIFY_SOLVERS)
_EPS = float(np.finfo(np.float64).eps)
#: Ranges of the certificate's rates, the inputs of :func:`tau_cov`: ``name -> (low, high, low
#: end included)``, every range open at ``high``. The one declaration: P3's plan
#: (:class:`dplib.distribution.private.DistributionPlan`) checks its eta and omega here.
RATE_LIMITS = {"eta": (0.0, 0.5, False), "omega": (0.0, 1.0, True), "beta": (0.0, 1.0, False)}


def check_rate(name: str, value) -> float:
    """``value`` of the rate ``name`` ("eta", "omega" or "beta") inside :data:`RATE_LIMITS`,
    as a float, else :class:`InvalidParameterError` naming it and its range."""
    lo, hi, closed = RATE_LIMITS[name]
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (ok and (lo <= value if closed else lo < value) and value < hi):
        raise InvalidParameterError(f"{name} must be a number in {'[' if closed else '('}{lo:g}, {hi:g}), got {value!r}")
    return float(value)


def check_rates(eta: float, omega: float, beta: float) -> None:
    """:func:`check_rate` of each of eta, omega and beta."""
    for name, value in (("eta", eta), ("omega", omega), ("beta", beta)):
        check_rate(name, value)


def tau_cov(k: int, n: float, m: int, eta: float, omega: float = 0.0, beta: float = 0.05, C_tau: float = 2.0) -> float:
    """Certificate trace budget in **trace units** (Algorithm 4.1 step 6, with the heterogeneity allowance of
    Corollary 3.11; constants ours):
    ``C_tau eta ln(1/eta) / m + 2 sqrt((k + ln(1/beta)) / n) / m + 4 (omega / m + omega^2)``.

    The middle term is the null (sampling) term of clean data; the last the heterogeneity
    allowance (``C_het = 4`` in trace units). As a function of ``n`` it is non-increasing with
    ``n tau`` non-decreasing (the condition of the add/remove bound, docs/privacy/distribution.md). In P3 every input
    is public (``n`` is the fixed public number of batches).

    Raises
    ------
    InvalidParameterError
        k < 2, n < 1, m < 1, eta not in (0, 0.5), omega not in [0, 1), beta not in (0, 1),
        C_tau <= 0.
    """
    m = check_batch_size(m)
    checks = (
        (isinstance(k, (int, np.integer)) and k >= 2, "k", k),
        (isinstance(n, (int, float, np.integer)) and math.isfinite(n) and n >= 1, "n", n),
        (isinstance(C_tau, (int, float)) and math.isfinite(C_tau) and C_tau > 0, "C_tau", C_tau),
    )
    for ok, name, value in checks:
        if not ok or isinstance(value, bool):
            raise InvalidParameterError(f"{name} out of range for tau_cov, got {value!r}")
    check_rates(eta, omega, beta)
    return (
        C_tau * eta * math.log(1.0 / eta) / m
        + 2.0 * math.sqrt((k + math.log(1.0 / beta)) / n) / m
        + 4.0 * (omega / m + omega**2)
    )


@dataclass(frozen=True)
class FRCSolution:
    """One raw FRC solve at ``nu`` (solver output, not certified).

    Attributes
    ----------
    nu : ndarray (k,)
    discard : float
        The solver's minimal discarded fraction ``d`` (raw; see :meth:`FRC.certify`).
    keep : ndarray (D,)
        Kept fraction ``omega_g`` of each distinct count vector (rows of :attr:`FRC.counts`).
    lam : ndarray (k,)
        Diagonal majorizer (trace units).
    status : str
        The solver's status.
    """

    nu: np.ndarray
    discard: float
    keep: np.ndarray
    lam: np.ndarray
    status: str


@dataclass(frozen=True)
class CertifiedDiscard:
    """Verified bracket ``lower <= d* <= upper`` of the exact minimal discard at ``nu``
    (fractions of the batches; multiply by ``n`` for batch units). ``solver`` names the solver
    whose primal and dual points gave it; ``dual`` is that dual point ``(u, kappa, Z)`` (the
    arguments of :meth:`FRC.dual_lower`, which turns it into a verified lower bound at **any**
    candidate mean: weak duality holds for every dual point, so it also bounds the discard at
    other ``nu``; used by benchmarks to skip grid points whose score is provably high)."""

    lower: float
    upper: float
    solver: str
    dual: tuple | None = field(default=None, compare=False, repr=False)

    def gap(self, n: float) -> float:
        """``n (upper - lower)``: the bracket's width in batch units."""
        return float(n) * (self.upper - self.lower)


def _check_nu(nu: Sequence[float], k: int) -> np.ndarray:
    v = np.asarray(nu, dtype=np.float64)
    if v.shape != (k,) or not np.all(np.isfinite(v)) or np.any(v < 0) or abs(math.fsum(v) - 1.0) > 1e-9:
        raise InvalidParameterError(f"nu must be a point of the simplex with {k} coordinates, got {nu!r}")
    return v


class FRC:
    """The FRC of one histogram of distinct count vectors, solved at many candidate means.

    Built once (cvxpy compile, DPP parameters ``nu``, ``nu nu^T``, ``Sigma(nu)``); :meth:`solve`
    and :meth:`certify` then re-solve without recompiling.

    Parameters
    ----------
    hist : mapping {tuple of k int: int}
        Persons per distinct count vector (each vector sums to ``m``); D entries.
    m : int
        Draws per batch.
    tau : float
        Trace budget ``tau_cov`` (trace units, :func:`tau_cov`); public and fixed (docs/privacy/distribution.md, P3).
    solver : {"CLARABEL", "SCS"}, default "CLARABEL"
        First solver of :meth:`solve`.

    Attributes
    ----------
    counts : ndarray (D, k) int64, sorted lexicographically
    multiplicity : ndarray (D,) int64
    n : int
        Number of batches ``sum multiplicity``.

    Raises
    ------
    InvalidParameterError
        Bad histogram, ``m`` or ``tau`` (``tau`` must be > 0: near 1e-7 certification fails).

    Privacy
    -------
    None (non-private). Under replace-one with ``n`` fixed, the exact ``n d*(nu)`` has
    sensitivity <= 1 (docs/privacy/distribution.md: zero the replaced batch and merge its mass into the
    repair atom); P3 relies on it through :meth:`certify`.
    """

    def __init__(self, hist: Mapping[tuple[int, ...], int], m: int, tau: float, solver: str = "CLARABEL") -> None:
        self.m = check_batch_size(m)
        if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not math.isfinite(tau) or not tau > 0:
            raise InvalidParameterError(f"tau (tau_cov, trace units) must be finite and > 0, got {tau!r}")
        if solver not in CERTIFY_SOLVERS:
            raise InvalidParameterError(f"solver must be one of {CERTIFY_SOLVERS}, got {solver!r}")
        self.tau = float(tau)
        self.solver = solver
        self.counts, self.multiplicity = histogram_arrays(hist, self.m)
        self.n = int(self.multiplicity.sum())
        self.k = self.counts.shape[1]
        self.y = self.counts.astype(np.float64) / float(self.m)
        self.a = self.multiplicity.astype(np.float64) / float(self.n)
        self._problems: dict[float, tuple] = {}

    def _problem(self, tau: float):
        """The parametrised cvxpy problem at trace budget ``tau`` (compiled once, cached)."""
        if tau in self._problems:
            return self._problems[tau]
        import cvxpy as cp  # lazy: a ~2 s import that only the solves need

        D, k, y, a = self.y.shape[0], self.k, self.y, self.a
        yy = np.einsum("gi,gj->gij", y, y).reshape(D, k * k)
        nu = cp.Parameter(k)
        nunu = cp.Parameter((k, k))
        sig = cp.Parameter((k, k))
        om, lam = cp.Variable(D), cp.Variable(k)
        x = cp.multiply(a, om)
        sx = cp.sum(x)
        t = y.T @ x
        col = lambda v: cp.reshape(v, (k, 1), order="C")  # noqa: E731
        row = lambda v: cp.reshape(v, (1, k), order="C")  # noqa: E731
        big_a = cp.reshape(yy.T @ x, (k, k), order="C") - col(t) @ row(nu) - col(nu) @ row(t) + sx * nunu
        s, d = t - sx * nu, 1 - sx
        top = cp.diag(lam) + sig - big_a
        top = (top + top.T) / 2
        lmi = cp.bmat([[top, col(s)], [row(s), cp.reshape(d, (1, 1), order="C")]])
        cons = [om >= 0, om <= 1, cp.sum(lam) <= tau, nu - t >= 0, lmi >> 0]
        prob = cp.Problem(cp.Minimize(d), cons)
        self._problems[tau] = (prob, nu, nunu, sig, om, lam, cons)
        return self._problems[tau]

    def _run(self, nu: np.ndarray, tau: float, solver: str, warm_start: bool = True):
        import cvxpy as cp  # lazy: as in _problem

        prob, p_nu, p_nunu, p_sig, om, lam, cons = self._problem(tau)
        p_nu.value, p_nunu.value, p_sig.value = nu, np.outer(nu, nu), sigma_matrix(nu, self.m)
        try:
            if solver == "SCS":
                prob.solve(solver="SCS", eps_abs=1e-9, eps_rel=1e-9, max_iters=200_000, warm_start=warm_start)
            else:
                prob.solve(solver="CLARABEL", warm_start=warm_start)
        except cp.error.SolverError as exc:
            raise SolverError(f"FRC ({solver}) failed in the solver") from exc
        if om.value is None or lam.value is None or prob.status not in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE):
            raise SolverError(f"FRC ({solver}) returned status {prob.status!r}")
        return prob, om, lam, cons

    def solve(self, nu: Sequence[float], solver: str | None = None) -> FRCSolution:
        """Raw minimal discard at ``nu`` (solver tolerance; for analysis, not for P3).

        Raises
        ------
        InvalidParameterError
            ``nu`` not on the simplex.
        SolverError
            The solver fails or returns no optimal point.
        """
        v = _check_nu(nu, self.k)
        prob, om, lam, _ = self._run(v, self.tau, solver or self.solver)
        keep = np.clip(np.asarray(om.value, dtype=np.float64), 0.0, 1.0)
        return FRCSolution(v, float(prob.value), keep, np.asarray(lam.value, dtype=np.float64), str(prob.status))

    # -- certified bounds -----------------------------------------------------------------------

    def primal_upper(self, nu: np.ndarray, keep: np.ndarray, lam: np.ndarray) -> float | None:
        """Verified upper bound on ``d*(nu)`` from a candidate ``(keep, lam)``, or None.

        ``lam`` is raised uniformly to use the whole budget ``tau``; ``keep`` is clipped to
        [0, 1], its entries below a floor of :data:`KEEP_FLOORS` zeroed, so are the groups that
        no feasible point can keep (``y_gj > 0`` where ``nu_j = 0``: the repair constraint
        forces ``x_g = 0`` there; a solver leaves ~1e-6 on them at some faces of the simplex
        grid, which made the check fail and a P3 release abort), and it is shrunk by
        the factors of :data:`SHRINKS` (moving kept mass into the repair
        atom never increases the covariance) until every constraint holds with a
        margin of :data:`REL_MARGIN` times its terms' magnitude: ``d > 0`` and the Schur
        complement ``Diag(lam) + Sigma(nu) - A - s s^T / d`` has its smallest eigenvalue above
        the margin (which covers the eigenvalue solver's backward error, <= k eps ||.||), the
        repair mass ``nu - sum x_g y_g`` is non-negative, ``sum(lam) <= tau``.
        """
        k = self.k
        lam = np.asarray(lam, dtype=np.float64)
        room = self.tau * (1.0 - 4.0 * REL_MARGIN) - math.fsum(lam)
        lam = lam + room / k
        if not math.fsum(lam) <= self.tau * (1.0 - REL_MARGIN):
            return None
        sig = sigma_matrix(nu, self.m)
        z = self.y - nu[None, :]
        clipped = np.clip(np.asarray(keep, dtype=np.float64), 0.0, 1.0)
        face = nu <= 0.0
        clipped = np.where(np.any(self.y[:, face] > 0.0, axis=1), 0.0, clipped) if face.any() else clipped
        for floor, shrink in itertools.product(KEEP_FLOORS, SHRINKS):
            x = self.a * np.where(clipped < floor, 0.0, clipped) * (1.0 - shrink)
            d = 1.0 - math.fsum(x)
            if not d > 8.0 * REL_MARGIN:
                continue
            yx = self.y.T @ x
            if np.any(nu - yx < REL_MARGIN * (nu + yx)):
                continue
            s = z.T @ x
            big_a = (z * x[:, None]).T @ z
            ss = np.outer(s, s) / d
            schur = np.diag(lam) + sig - big_a - ss
            schur = (schur + schur.T) / 2.0
            mag = np.abs(np.diag(lam)).sum() + np.abs(sig).sum() + (np.abs(z) * x[:, None]).T @ np.abs(z) + np.abs(ss)
            margin = REL_MARGIN * float(np.sum(mag)) + 16.0 * (k + 1) * _EPS * float(np.abs(schur).sum())
            if float(np.linalg.eigvalsh(schur).min()) >= margin:
                return min(1.0, d + REL_MARGIN)
        return None

    def dual_lower(self, nu: np.ndarray, u: np.ndarray, kappa: float, zmat: np.ndarray) -> float:
        """Verified lower bound on ``d*(nu)`` from any dual point (weak duality), clamped at 0.

        For ``Z >= 0`` ((k+1) x (k+1)), ``u >= 0`` (k), ``kappa >= 0`` and every feasible
        ``(omega, lambda)``, subtracting the non-negative terms ``<Z, M(omega, lambda)>``,
        ``u^T (nu - sum x_g y_g)`` and ``kappa (tau - sum lambda)`` from ``d`` gives
        ``d >= 1 - <Z, M0> - u^T nu - kappa tau + sum_g omega_g c_g + sum_j lambda_j (kappa - Z_jj)``
        with ``M0 = [[Sigma(nu), 0], [0, 1]]`` and
        ``c_g = a_g (-1 + z_g^T Z11 z_g - 2 z_g^T Z12 + Z22 + u^T y_g)``. The last two sums are
        bounded below over the box ``omega in [0, 1]^D`` and the box that feasibility implies
        for ``lambda``: ``lambda_j >= -Sigma_jj`` (the LMI's diagonal) and, with
        ``sum lambda <= tau``, ``lambda_j <= tau + sum_{i != j} Sigma_ii``. The solver's ``Z`` is
        symmetrised and shifted by its most negative eigenvalue (plus the eigenvalue error) to
        be exactly PSD; negative ``u``, ``kappa`` are set to 0. Rounding: minus
        :data:`REL_MARGIN` times the sum of the terms' magnitudes.
        """
        k = self.k
        zm = (np.asarray(zmat, dtype=np.float64) + np.asarray(zmat, dtype=np.float64).T) / 2.0
        if zm.shape != (k + 1, k + 1) or not np.all(np.isfinite(zm)):
            return 0.0
        e_min = float(np.linalg.eigvalsh(zm).min())
        zm = zm + (max(0.0, -e_min) + 16.0 * (k + 1) * _EPS * float(np.abs(zm).sum())) * np.eye(k + 1)
        u = np.maximum(np.nan_to_num(np.asarray(u, dtype=np.float64), nan=0.0), 0.0)
        kappa = max(0.0, float(kappa) if math.isfinite(float(kappa)) else 0.0)
        sig = sigma_matrix(nu, self.m)
        z11, z12, z22 = zm[:k, :k], zm[:k, k], zm[k, k]
        z = self.y - nu[None, :]
        quad = np.einsum("gi,ij,gj->g", z, z11, z)
        c = self.a * (-1.0 + quad - 2.0 * (z @ z12) + z22 + self.y @ u)
        c_mag = self.a * (1.0 + np.einsum("gi,ij,gj->g", np.abs(z), np.abs(z11), np.abs(z)) + 2.0 * (np.abs(z) @ np.abs(z12))
                          + abs(z22) + self.y @ u)
        sig_d = np.diag(sig)
        lo = -sig_d * (1.0 + REL_MARGIN)
        hi = (self.tau + (sig_d.sum() - sig_d)) * (1.0 + REL_MARGIN)
        slope = kappa - np.diag(z11)
        lam_term = np.minimum(slope * lo, slope * hi)
        terms = [1.0, -float(np.sum(z11 * sig)), -z22, -float(u @ nu), -kappa * self.tau,
                 float(np.minimum(c, 0.0).sum()), float(lam_term.sum())]
        mag = (1.0 + float(np.sum(np.abs(z11 * sig))) + abs(z22) + float(u @ nu) + kappa * self.tau + float(c_mag.sum())
               + float(np.abs(lam_term).sum() + np.abs(slope).sum() * float(np.abs(hi).max())))
        value = math.fsum(terms) - REL_MARGIN * mag
        return max(0.0, value)

    def certify(self, nu: Sequence[float], max_gap: float | None = None) -> CertifiedDiscard:
        """Verified bracket of the exact minimal discard at ``nu`` (P3's sandwich ``S0 <= S_up <= S0 + g``).

        Tries the attempts of :data:`CERTIFY_ATTEMPTS` in order (Clarabel, SCS, then both again
        from fresh solver objects) and returns the first bracket
        whose width in batch units ``n (upper - lower)`` is at most ``max_gap`` (any width when
        None). The choice of solver depends on the data only through this check, and the caller
        aborts (no release) when no solver certifies: a failure is never mapped to a score.

        Raises
        ------
        InvalidParameterError
            ``nu`` not on the simplex.
        SolverError
            No solver produced a verified bracket within ``max_gap``.
        """
        v = _check_nu(nu, self.k)
        tau_s = self.tau * (1.0 - TAU_SLACK)
        failures = []
        for solver, warm in CERTIFY_ATTEMPTS:
            try:
                prob, om, lam, cons = self._run(v, tau_s, solver, warm)
            except SolverError as exc:
                failures.append(str(exc))
                continue
            upper = self.primal_upper(v, om.value, lam.value)
            if upper is None:  # the trivial certificate: discard everything (always feasible)
                upper = self.primal_upper(v, np.zeros(self.y.shape[0]), np.full(self.k, self.tau / self.k))
            if upper is None:
                failures.append(f"{solver}: primal point not verified")
                continue
            # the dual point comes from the problem at tau_s; the bound is evaluated with tau
            # itself (kappa tau term), so it bounds the optimum at tau
            dual = tuple(np.array(c.dual_value, dtype=np.float64) for c in (cons[3], cons[2], cons[4]))  # copies
            lower = self.dual_lower(v, *dual)  # type: ignore[arg-type]  # 0-d arrays act as floats
            cert = CertifiedDiscard(min(lower, upper), upper, solver, dual)
            if max_gap is None or cert.gap(self.n) <= max_gap:
                return cert
            failures.append(f"{solver}: bracket wider than the allowed gap")
        # which solver failed how depends on the data: DEBUG only, never in the message
        log.debug("FRC certification failed: %s", "; ".join(failures))
        raise SolverError(
            "FRC certification failed with every solver: the release is aborted as an incident "
            "(budget stays spent; the DP guarantee holds conditional on no abort; details at DEBUG level)"
        )


# ----------------------------------------------------------------------------------------------
# library functions


@dataclass(frozen=True)
class FRCResult:
    """Output of :func:`frc_min_discard` (**non-private**: never released).

    Attributes
    ----------
    nu : ndarray (k,)
    discard : float
        Minimal discarded fraction (certified upper bound of the bracket).
    discard_lower : float
        Certified lower bound.
    keep : ndarray (D,)
        Kept fraction per distinct count vector (raw solver point).
    counts, multiplicity : ndarrays (D, k), (D,)
    tau : float
        Trace budget used.
    status : {"OK", "OVERTRIM"}
        OVERTRIM when ``discard > 3 eta``: no certificate of ``nu`` keeps the batches an
        eta-corruption allows (eta underestimated, heterogeneity not budgeted, or ``nu`` far).
    """

    nu: np.ndarray
    discard: float
    discard_lower: float
    keep: np.ndarray
    counts: np.ndarray
    multiplicity: np.ndarray
    tau: float
    status: Literal["OK", "OVERTRIM"]


def frc_min_discard(
    hist: Mapping[tuple[int, ...], int],
    m: int,
    nu: Sequence[float],
    eta: float,
    omega: float = 0.0,
    beta: float = 0.05,
    C_tau: float = 2.0,
    tau: float | None = None,
) -> FRCResult:
    """Minimal fractional discard that certifies the candidate mean ``nu``.

    Parameters
    ----------
    hist : mapping {tuple of k int: int}
        Persons per distinct count vector (``BatchAggregates.histogram``).
    m : int
        Draws per batch.
    nu : sequence of k float
        Candidate mean (a simplex point).
    eta : float in (0, 0.5)
        Corruption bound: in ``tau_cov`` and the OVERTRIM rule.
    omega : float in [0, 1), default 0
        Heterogeneity allowance (Corollary 3.11): ``+ 4 (omega/m + omega^2)`` in tau_cov.
    beta : float, default 0.05
        Failure probability of the null term.
    C_tau : float, default 2
    tau : float, optional
        Override the trace budget (trace units).

    Returns
    -------
    FRCResult

    Raises
    ------
    InvalidParameterError
        Bad histogram or parameters.
    SolverError
        The solvers fail to produce a verified bracket.

    Privacy
    -------
    None (non-private library function).

    Accuracy
    --------
    Any certificate with discard ``<= eta_0`` on eta_0-good data has TV error
    O(eta_0 sqrt(ln(1/eta_0)/m)) (+ O(omega)) (our derivation, mirroring the proof of Lemma 3.8;
    docs/privacy/distribution.md).
    """
    m = check_batch_size(m)
    check_rates(eta, omega, beta)
    counts, mult = histogram_arrays(hist, m)
    k, n = counts.shape[1], int(mult.sum())
    t = tau_cov(k, n, m, eta, omega, beta, C_tau) if tau is None else tau
    frc = FRC(hist, m, t)
    cert = frc.certify(nu)
    sol = frc.solve(nu)
    status: Literal["OK", "OVERTRIM"] = STATUS_OVERTRIM if cert.upper > OVERTRIM_FACTOR * eta else STATUS_OK
    return FRCResult(_check_nu(nu, k), cert.upper, cert.lower, sol.keep, frc.counts, frc.multiplicity, t, status)


@dataclass(frozen=True)
class CCPResult:
    """Output of :func:`ccp_search` (**non-private**: never released).

    Attributes
    ----------
    estimate : ndarray (k,)
        The certified mean ``nu`` of the last iterate, on the simplex.
    discard : float
        Its discarded fraction (every iterate is a genuine FRC certificate of its own mean).
    discards : list of float
        Discard per iteration (non-increasing).
    keep : ndarray (D,)
        Kept fractions of the last iterate.
    iterations : int
    tau : float
    status : {"OK", "OVERTRIM"}
        OVERTRIM when the final discard exceeds ``3 eta``.
    """

    estimate: np.ndarray
    discard: float
    discards: list
    keep: np.ndarray
    iterations: int
    tau: float
    status: Literal["OK", "OVERTRIM"]


def ccp_search(
    hist: Mapping[tuple[int, ...], int],
    m: int,
    eta: float,
    omega: float = 0.0,
    beta: float = 0.05,
    C_tau: float = 2.0,
    *,
    start: Sequence[float] | None = None,
    max_iter: int = 10,
    tol: float = 1e-4,
    solver: str = "CLARABEL",
) -> CCPResult:
    """Convex-concave search over the candidate mean.

    Jointly in ``(omega, rho, lambda)`` with ``nu = sum_g x_g y_g + rho``, ``rho >= 0``,
    ``1^T rho = d``: minimise ``d`` subject to the Schur form
    ``[[T, rho], [rho^T, d]] >= 0``, ``T = Diag(lambda) + diag(nu)/m + (1 - 1/m)(nu_0 nu^T +
    nu nu_0^T - nu_0 nu_0^T) - sum_g x_g y_g y_g^T``, ``sum lambda <= tau_cov``. The affine
    minorant of ``nu nu^T`` at ``nu_0`` makes it a convex **inner** approximation: every iterate
    is a genuine certificate of its own ``nu``. Then ``nu_0 <- nu`` until the discard improves
    by less than ``tol`` (typically 3 iterations). Always feasible (``d = 1``, ``rho = nu_0``).

    Parameters
    ----------
    hist, m, eta, omega, beta, C_tau
        As :func:`frc_min_discard`.
    start : sequence of k float, optional
        ``nu_0``; default the naive mean (or pass the filter's output).
    max_iter : int, default 10
    tol : float, default 1e-4
    solver : {"CLARABEL", "SCS"}

    Returns
    -------
    CCPResult

    Raises
    ------
    InvalidParameterError
        Bad inputs.
    SolverError
        A CCP step fails in the solver.

    Privacy
    -------
    None (non-private library function).
    """
    import cvxpy as cp  # lazy: a ~2 s import that only the solves need

    m = check_batch_size(m)
    check_rates(eta, omega, beta)
    if isinstance(max_iter, bool) or not isinstance(max_iter, int) or max_iter < 1:
        raise InvalidParameterError(f"max_iter must be an integer >= 1, got {max_iter!r}")
    if solver not in CERTIFY_SOLVERS:
        raise InvalidParameterError(f"solver must be one of {CERTIFY_SOLVERS}, got {solver!r}")
    counts, mult = histogram_arrays(hist, m)
    D, k = counts.shape
    n = int(mult.sum())
    y = counts.astype(np.float64) / m
    a = mult.astype(np.float64) / n
    t = tau_cov(k, n, m, eta, omega, beta, C_tau)
    nu0 = _check_nu(start, k) if start is not None else a @ y
    yy = np.einsum("gi,gj->gij", y, y).reshape(D, k * k)
    p_nu0 = cp.Parameter(k)
    om, lam, rho = cp.Variable(D), cp.Variable(k), cp.Variable(k)
    x = cp.multiply(a, om)
    d = 1 - cp.sum(x)
    nu = y.T @ x + rho
    col = lambda v: cp.reshape(v, (k, 1), order="C")  # noqa: E731
    row = lambda v: cp.reshape(v, (1, k), order="C")  # noqa: E731
    lin = col(p_nu0) @ row(nu) + col(nu) @ row(p_nu0)
    top = cp.diag(lam) + cp.diag(nu) / m + (1 - 1 / m) * lin - cp.reshape(yy.T @ x, (k, k), order="C")
    top = (top + top.T) / 2
    nn0 = cp.Parameter((k, k))
    lmi = cp.bmat([[top - (1 - 1 / m) * nn0, col(rho)], [row(rho), cp.reshape(d, (1, 1), order="C")]])
    prob = cp.Problem(cp.Minimize(d), [om >= 0, om <= 1, rho >= 0, cp.sum(rho) == d, cp.sum(lam) <= t, lmi >> 0])
    discards: list[float] = []
    est, keep = nu0, np.zeros(D)
    for it in range(max_iter):
        p_nu0.value, nn0.value = nu0, np.outer(nu0, nu0)
        try:
            prob.solve(solver=solver)
        except cp.error.SolverError as exc:
            raise SolverError(f"CCP step ({solver}) failed in the solver") from exc
        if om.value is None or prob.status not in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE):
            raise SolverError(f"CCP step ({solver}) returned status {prob.status!r}")
        cur = float(prob.value)
        est = project_to_simplex(np.asarray(nu.value, dtype=np.float64))
        keep = np.clip(np.asarray(om.value, dtype=np.float64), 0.0, 1.0)
        improved = not discards or discards[-1] - cur > tol
        discards.append(max(0.0, cur))
        nu0 = est
        if not improved:
            break
    final = discards[-1]
    status: Literal["OK", "OVERTRIM"] = STATUS_OVERTRIM if final > OVERTRIM_FACTOR * eta else STATUS_OK
    return CCPResult(est, final, discards, keep, len(discards), t, status)
