"""BHS23 Algorithms 1, 5.1 and 5.2: private mean, private covariance, Gaussian learning.

Each entry point takes a backend (:mod:`dplib.covariance.backend`) whose rows are already in the
keyed random order, a public plan (:mod:`dplib.covariance.params`) that was validated and costed
before any data was read, an injected noise source and an optional accountant. The order is:
check the backend matches the plan (public shapes), check and **charge** the budget, compute the
non-private building blocks, run the PTR check, draw the noise.

FAIL is a first-class DP outcome: a :class:`BHSRelease` with ``status == "FAIL"``, no estimate,
and the budget charged. It carries no reason, score, count or pass number. The number of
passes goes only to :class:`Diagnostics` (benchmarks and debug-level metrics, never a release).

Not floating-point hardened: see :mod:`dplib.covariance.sampling`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from dplib.budget import Accountant
from dplib.covariance.backend import NumpyCovarianceBackend
from dplib.covariance.params import (
    ALGORITHM_COV,
    ALGORITHM_GAUSSIAN,
    ALGORITHM_MEAN,
    GaussianPlan,
    PrivateCovariancePlan,
    PrivateMeanPlan,
)
from dplib.covariance.sampling import gaussian_draw, ptr, wishart_release
from dplib.covariance.stable import stable_covariance, stable_mean
from dplib.errors import ConfigError, InputDataError
from dplib.groups import new_salt
from dplib.mechanisms.noise import NoiseSource
from dplib.seam import CovarianceBackend

STATUS_OK = "OK"
STATUS_FAIL = "FAIL"
HARDENING_NOTE = "not floating-point hardened (float64 transform of secure standard normals)"


@dataclass(frozen=True)
class BHSRelease:
    """What BHS23 releases; every field is DP or public.

    Attributes
    ----------
    algorithm : str
    status : "OK" or "FAIL"
    mean : ndarray (d,) or None
        Algorithm 1 / 5.2 estimate, data units.
    covariance : ndarray (d, d) or None
        Algorithm 5.1 / 5.2 estimate (symmetric PSD), squared data units.
    epsilon, delta : float
        The budget charged (also on FAIL).
    parameters : dict
        The public plan (lambda0, k, M, c^2, N, ...).
    noise_source : str
    hardening : str
    """

    algorithm: str
    status: str
    mean: np.ndarray | None
    covariance: np.ndarray | None
    epsilon: float
    delta: float
    parameters: dict
    noise_source: str
    hardening: str = HARDENING_NOTE

    @property
    def failed(self) -> bool:
        return self.status == STATUS_FAIL


@dataclass
class Diagnostics:
    """Debug-only by-products. NEVER release or log above debug level: the number of passes
    depends on the data. ``internals`` (scores, mu_hat, Sigma_hat) is filled only when a test asks
    for it (``keep_internals=True``)."""

    passes: int = 0
    internals: dict | None = None


@dataclass
class Outcome:
    """What a BHS23 run returns: the release (the only private output: estimate or FAIL) and
    operator diagnostics (pass count; internals only with ``keep_internals``, for tests) that must
    never be released or logged above DEBUG."""

    release: BHSRelease
    diagnostics: Diagnostics = field(default_factory=Diagnostics)


def _check_backend(backend: CovarianceBackend, n: int, m: int, d: int, what: str) -> None:
    if backend.d != d:
        raise InputDataError(f"{what}: the plan is for d={d} columns, the data have d={backend.d}")
    if backend.n != n or backend.m != m:
        raise ConfigError(f"{what}: the plan's public number of rows does not match the rows given")


def _charge(plan, accountant: Accountant | None, stage_prefix: str) -> Accountant:
    accountant = accountant if accountant is not None else Accountant(plan.budget)
    charges = plan.charges(stage_prefix)
    accountant.check(charges)
    for c in charges:
        accountant.charge(c.stage, c.budget, c.group)
    return accountant


def _mean_core(backend, plan: PrivateMeanPlan, noise: NoiseSource, internals: dict | None) -> np.ndarray | None:
    """Algorithm 1 steps 4-6 after the charge; returns mu_tilde or None (FAIL)."""
    k = plan.k
    sc = stable_covariance(backend, plan.thresholds, k)
    score2, mu_hat = k, None
    if sc.score < k:  # score1 = k makes the PTR fail with probability 1 (k >= tau)
        sm = stable_mean(backend, sc.sigma_hat, plan.core_thresholds, k, plan.M)  # type: ignore[arg-type]  # not None when score < k
        score2, mu_hat = sm.score, sm.mu_hat
    score = max(sc.score, score2)
    if internals is not None:
        internals.update(score1=sc.score, score2=score2, sigma_hat=sc.sigma_hat, mu_hat=mu_hat, c2=plan.c2)
    if not ptr(score, *plan.ptr_budget, noise):
        return None
    return gaussian_draw(mu_hat, sc.sigma_hat, math.sqrt(plan.c2), noise)  # type: ignore[arg-type]  # the PTR fails when score = k (both None)


def _cov_core(backend, plan: PrivateCovariancePlan, noise: NoiseSource, internals: dict | None) -> np.ndarray | None:
    """Algorithm 5.1 steps 3-4 after the charge; returns Sigma_tilde or None (FAIL)."""
    sc = stable_covariance(backend, plan.thresholds, plan.k)
    if internals is not None:
        internals.update(score_cov=sc.score, sigma_hat_cov=sc.sigma_hat, N=plan.N)
    if not ptr(sc.score, *plan.ptr_budget, noise):
        return None
    return wishart_release(sc.sigma_hat, plan.N, noise)  # type: ignore[arg-type]  # the PTR fails when score = k (None)


def _passes(backend, before: int) -> int:
    return getattr(backend, "passes", before) - before


def private_mean(
    backend: CovarianceBackend,
    plan: PrivateMeanPlan,
    noise: NoiseSource,
    accountant: Accountant | None = None,
    stage_prefix: str = "",
    keep_internals: bool = False,
) -> Outcome:
    """BHS23 Algorithm 1: private mean released as a draw of N(mu_hat, c^2 Sigma_hat), or FAIL.

    Parameters
    ----------
    backend : CovarianceBackend
        n rows in keyed random order and their floor(n/2) pairs (``NumpyCovarianceBackend.from_data``
        or the Spark backend); n = ``plan.n``, the public number of persons (n0).
    plan : PrivateMeanPlan
    noise : NoiseSource
        Standard normals for the PTR coin and the Gaussian draw.
    accountant : Accountant, optional
        Charged ``plan.budget`` before any data-dependent step; default limited to ``plan.budget``.
    keep_internals : bool
        Tests only: copy scores, mu_hat, Sigma_hat into ``Outcome.diagnostics.internals``.

    Returns
    -------
    Outcome
        ``release.mean`` of shape (d,) (data units) or ``status == "FAIL"``.

    Raises
    ------
    InputDataError, ConfigError
        Backend shape different from the plan; before the charge.
    BudgetExceededError
        Before anything runs, if the plan does not fit the accountant.

    Privacy
    -------
    (epsilon, delta)-DP under substitution of one row with n fixed (Theorem 8 / Lemma 15 with
    the corrected constants of docs/privacy/stable_covariance.md): PTR (epsilon/3, delta/6) on
    max(score1, score2); covariance change and mean change (epsilon/3, delta/6) each;
    unrepresentative R delta/6. Person-level under add/remove via the fixed-n0 rule
    (docs/privacy/stable_covariance.md, "Person level"). Not floating-point hardened.

    References
    ----------
    Brown, Hopkins, Smith (COLT 2023), Algorithm 1, Theorem 8, Lemmas 9-15.
    """
    _check_backend(backend, plan.n, plan.m, plan.d, ALGORITHM_MEAN)
    before = getattr(backend, "passes", 0)
    _charge(plan, accountant, stage_prefix)
    internals: dict | None = {} if keep_internals else None
    mu = _mean_core(backend, plan, noise, internals)
    release = BHSRelease(
        ALGORITHM_MEAN, STATUS_OK if mu is not None else STATUS_FAIL, mu, None,
        plan.budget.epsilon, plan.budget.delta, plan.describe(), noise.name,
    )
    return Outcome(release, Diagnostics(_passes(backend, before), internals))


def private_covariance(
    backend: CovarianceBackend,
    plan: PrivateCovariancePlan,
    noise: NoiseSource,
    accountant: Accountant | None = None,
    stage_prefix: str = "",
    keep_internals: bool = False,
) -> Outcome:
    """BHS23 Algorithm 5.1: private covariance of mean-zero rows, released as the empirical
    second moment of N synthetic draws from N(0, Sigma_hat) (a scaled Wishart), or FAIL.

    Parameters
    ----------
    backend : CovarianceBackend
        Covariance rows (n = ``plan.n`` mean-zero rows, e.g. ``from_data(y, salt, paired=False)``).
    plan : PrivateCovariancePlan
    noise, accountant, stage_prefix, keep_internals : as :func:`private_mean`.

    Returns
    -------
    Outcome
        ``release.covariance`` of shape (d, d), symmetric PSD, or FAIL.

    Privacy
    -------
    (epsilon, delta)-DP under substitution with n fixed: PTR (epsilon/2, delta/2) on the
    2-sensitive score; N-fold Gaussian sampling (epsilon/2, delta/2) with the corrected N of
    docs/privacy/stable_covariance.md (constant 48). Not floating-point hardened.

    References
    ----------
    BHS23 Algorithm 5.1, Theorem 43, Claim 46; docs/privacy/stable_covariance.md.
    """
    _check_backend(backend, backend.n, plan.n, plan.d, ALGORITHM_COV)
    before = getattr(backend, "passes", 0)
    _charge(plan, accountant, stage_prefix)
    internals: dict | None = {} if keep_internals else None
    cov = _cov_core(backend, plan, noise, internals)
    release = BHSRelease(
        ALGORITHM_COV, STATUS_OK if cov is not None else STATUS_FAIL, None, cov,
        plan.budget.epsilon, plan.budget.delta, plan.describe(), noise.name,
    )
    return Outcome(release, Diagnostics(_passes(backend, before), internals))


def private_gaussian(
    backend: CovarianceBackend,
    plan: GaussianPlan,
    noise: NoiseSource,
    accountant: Accountant | None = None,
    stage_prefix: str = "",
    keep_internals: bool = False,
) -> Outcome:
    """BHS23 Algorithm 5.2: (mu_tilde, Sigma_tilde) from Algorithm 1 on the n rows and
    Algorithm 5.1 on their floor(n/2) pairs (same keyed order), or FAIL if either fails.

    Privacy
    -------
    Basic composition (Corollary 45): each part at half of (epsilon, delta), both charged
    before either runs. Not floating-point hardened.

    References
    ----------
    BHS23 Algorithm 5.2, Corollary 45.
    """
    mp, cp = plan.mean_plan, plan.cov_plan  # type: ignore[attr-defined]  # set in GaussianPlan.__post_init__
    _check_backend(backend, mp.n, mp.m, mp.d, ALGORITHM_GAUSSIAN)
    before = getattr(backend, "passes", 0)
    _charge(plan, accountant, stage_prefix)
    internals: dict | None = {} if keep_internals else None
    mu = _mean_core(backend, mp, noise, internals)
    cov = _cov_core(backend, cp, noise, internals) if mu is not None else None
    ok = mu is not None and cov is not None
    release = BHSRelease(
        ALGORITHM_GAUSSIAN, STATUS_OK if ok else STATUS_FAIL, mu if ok else None, cov if ok else None,
        plan.budget.epsilon, plan.budget.delta, plan.describe(), noise.name,
    )
    return Outcome(release, Diagnostics(_passes(backend, before), internals))


def numpy_backend(x: object, salt_hex: str | None = None, ids=None, paired: bool = True) -> NumpyCovarianceBackend:
    """In-memory backend over person vectors ``x`` (n, d), in the keyed random order of a fresh
    (or given) salt; ``paired=False`` for Algorithm 5.1 on given mean-zero rows."""
    return NumpyCovarianceBackend.from_data(x, salt_hex if salt_hex is not None else new_salt(), ids, paired)
