"""Privacy-critical constants of BHS23 and the public plans of Algorithms 1, 5.1 and 5.2.

Every number here is a pure function of public inputs (epsilon, delta, the public number of rows
n, d, lambda0): a plan is built, checked and costed before any data is read, and a public
refusal (n below the gate, N < 1, epsilon/delta/lambda0 out of the proven range) raises
:class:`dplib.errors.ConfigError` before any budget is reserved.

Constants (Brown, Hopkins, Smith, COLT 2023, with the corrections of docs/privacy/stable_covariance.md,
"Constants actually used", where they differ from the paper):

====================  ==============================================================================
k (Alg 1)             ceil(6 ln(6/delta)/epsilon) + 4          (PTR at (epsilon/3, delta/6))
k (Alg 5.1)           ceil(4 ln(2/delta)/epsilon) + 4          (PTR at (epsilon/2, delta/2))
lambda_l, l=0..2k     lambda0 / (1 - l/(10k))                  (Eq. 49)
gamma (Alg 1)         (20/7) lambda0 / floor(n/2)              (corrected: lambda_good <= (10/7) lambda0)
Lambda_l, l=0..2k     lambda0 (1 - gamma)^(-l)                 (Eq. 67 with the corrected gamma)
M = |R|               6k + ceil(18 ln(16 n/delta))             (the paper's M)
c^2                   50 / ((1-gamma)^(2k+1) (1-k/n)^4) * (lambda0/n^2) * 18 ln(12/delta)/epsilon^2
N (Alg 5.1)           floor(n^2 epsilon^2 / (48 lambda0^2 ln(2/delta)))   (corrected: half the paper's)
gate (Alg 1)          n >= 20 k lambda0 and floor(n/2) >= 10 k lambda0
gate (Alg 5.1)        n >= 10 k lambda0 and N >= 1
====================  ==============================================================================

Rounding that touches privacy rounds toward safety: gamma and c^2 are moved up by one ulp, N
is computed with a downward nudge before the floor, and the gates compare exact rationals.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from scipy.stats import chi2

from dplib.budget import Budget, Charge
from dplib.errors import ConfigError, InvalidParameterError
from dplib.groups import ALL_PERSONS, GroupRange

ALGORITHM_MEAN = "bhs23-private-mean"
ALGORITHM_COV = "bhs23-private-covariance"
ALGORITHM_GAUSSIAN = "bhs23-gaussian"
ALGORITHM_VERSION = "1"

#: Constant of the noise multiplier c^2 (corrected: the paper's 25 rests on a false Corollary 37;
#: docs/privacy/stable_covariance.md, "Constants actually used").
C2_CONSTANT = 50.0
#: Denominator constant of Algorithm 5.1's N (corrected: half the paper's 24).
N_CONSTANT = 48.0
#: Smallest epsilon for which the Renyi-DP check of N covers Algorithm 5.1 (docs/privacy/stable_covariance.md).
MIN_EPSILON_COV = 0.01
#: Public lambda0 rule (docs/privacy/stable_covariance.md, "Public gates"): chi^2_d quantile at
#: 1 - LAMBDA0_TAIL / (n * M), times (1 + 3 sqrt(d / n)).
LAMBDA0_TAIL = 0.01


def _up(x: float) -> float:
    return math.nextafter(x, math.inf)


def _check_int(value: object, name: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"{name} must be an integer >= {low}, got {value!r}")
    return value


def _check_lambda0(value: object, low: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"lambda0 must be a real number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value) or value < low:
        raise ConfigError(f"lambda0 must be finite and >= {low:g} (proof precondition), got {value!r}")
    return value


def thresholds(lambda0: float, k: int) -> tuple[float, ...]:
    """Good-subset thresholds ``lambda_l = lambda0 / (1 - l/(10k))``, l = 0..2k (Eq. 49), ascending."""
    return tuple(lambda0 * (10 * k) / (10 * k - ell) for ell in range(2 * k + 1))


def core_thresholds(lambda0: float, gamma: float, k: int) -> tuple[float, ...]:
    """Core thresholds ``Lambda_l = lambda0 (1 - gamma)^(-l)``, l = 0..2k (Eq. 67), ascending."""
    return tuple(lambda0 * (1.0 - gamma) ** (-ell) for ell in range(2 * k + 1))


def ptr_threshold(epsilon: float, delta: float) -> float:
    """``tau = 2 ln((1-delta)/delta)/epsilon + 4`` of M_PTR (Claim 10)."""
    return 2.0 * math.log((1.0 - delta) / delta) / epsilon + 4.0


def k_for_ptr(epsilon_ptr: float, delta_ptr: float) -> int:
    """``k = ceil(2 ln(1/delta_ptr)/epsilon_ptr) + 4``: score k makes M_PTR fail with probability 1."""
    return math.ceil(2.0 * math.log(1.0 / delta_ptr) / epsilon_ptr) + 4


def reference_size(k: int, n: int, delta: float) -> int:
    """``M = 6k + ceil(18 ln(16 n / delta))`` (Algorithm 1; the paper's M)."""
    return 6 * k + math.ceil(18.0 * math.log(16.0 * n / delta))


def default_lambda0(d: int, n: int, tail_rows: float, floor: float) -> float:
    """Public lambda0 rule (docs/privacy/stable_covariance.md): ``chi2_d.isf(0.01/tail_rows) * (1 + 3 sqrt(d/n))``.

    ``tail_rows`` is ``n * M`` for Algorithm 1 and ``n`` for Algorithm 5.1; the result is at least
    ``floor`` (10 for Algorithm 1, 1 for 5.1). Accuracy only: any public lambda0 is private.
    """
    q = float(chi2.isf(LAMBDA0_TAIL / tail_rows, d))
    return max(floor, q * (1.0 + 3.0 * math.sqrt(d / n)))


def _check_budget(budget: object) -> Budget:
    if not isinstance(budget, Budget):
        raise ConfigError("budget must be a dplib.budget.Budget")
    return budget


@dataclass(frozen=True)
class PrivateMeanPlan:
    """Public plan of BHS23 Algorithm 1 (private mean released as N(mu_hat, c^2 Sigma_hat)).

    Parameters
    ----------
    budget : Budget
        (epsilon, delta) of the whole algorithm: epsilon in (0, 1), 0 < delta <= min(epsilon/10, 1e-3).
    n : int
        The public number of rows (persons) the algorithm runs on (n0 of the fixed-n model).
    d : int
        Dimension.
    lambda0 : float, optional
        Outlier threshold (>= 10). Default: :func:`default_lambda0` with ``tail_rows = n M``.
    group : GroupRange
        Persons charged.

    Raises
    ------
    ConfigError
        Bad epsilon/delta/lambda0/n/d, or n below the gate ``n >= 20 k lambda0``,
        ``floor(n/2) >= 10 k lambda0``. Raised on construction, before any budget is reserved.

    References
    ----------
    BHS23 Algorithm 1, Theorem 8, Lemma 15; the corrected constants of docs/privacy/stable_covariance.md.
    """

    budget: Budget
    n: int
    d: int
    lambda0: float | None = None
    group: GroupRange = ALL_PERSONS

    def __post_init__(self) -> None:
        b = _check_budget(self.budget)
        if not (b.epsilon < 1.0):
            raise ConfigError(f"epsilon must be in (0, 1) for BHS23 Algorithm 1, got {b.epsilon!r}")
        if not (0.0 < b.delta <= min(b.epsilon / 10.0, 1e-3)):
            raise ConfigError(f"delta must be in (0, min(epsilon/10, 1e-3)] for BHS23 Algorithm 1, got {b.delta!r}")
        _check_int(self.n, "n", 2)
        _check_int(self.d, "d", 1)
        lam = self.lambda0
        if lam is None:
            lam = default_lambda0(self.d, self.n, self.n * reference_size(self.k, self.n, b.delta), 10.0)
        object.__setattr__(self, "lambda0", _check_lambda0(lam, 10.0))
        gate = 20 * self.k * Fraction(self.lambda0)  # type: ignore[arg-type]  # lambda0 set in __post_init__
        if self.n < gate or self.m < gate / 2:
            raise ConfigError(
                f"BHS23 Algorithm 1 needs n >= 20 k lambda0 and floor(n/2) >= 10 k lambda0 "
                f"(= {float(gate):.0f} rows with k={self.k}, lambda0={self.lambda0:.4g}); the plan has n={self.n}"
            )
        # Claim 12 precondition (covariance change), implied by the gate with slack; checked anyway.
        gamma = self.gamma
        if 1.5 * gamma / (1.0 - gamma) > (2.0 / 3.0) * self.epsilon_part / math.log(2.0 / self.delta_part):
            raise ConfigError("BHS23 Algorithm 1: Claim 12 precondition fails for these n, lambda0, epsilon, delta")

    @property
    def epsilon_part(self) -> float:
        """epsilon' = epsilon/3 of each part (PTR, covariance change, mean change)."""
        return self.budget.epsilon / 3.0

    @property
    def delta_part(self) -> float:
        """delta' = delta/6."""
        return self.budget.delta / 6.0

    @property
    def k(self) -> int:
        return k_for_ptr(self.epsilon_part, self.delta_part)

    @property
    def m(self) -> int:
        """Number of pairs, floor(n/2)."""
        return self.n // 2

    @property
    def M(self) -> int:
        return reference_size(self.k, self.n, self.budget.delta)

    @property
    def gamma(self) -> float:
        """Covariance closeness (20/7) lambda0 / floor(n/2), rounded up."""
        return _up(20.0 * self.lambda0 / (7.0 * self.m))  # type: ignore[operator]  # lambda0 set in __post_init__

    @property
    def thresholds(self) -> tuple[float, ...]:
        return thresholds(self.lambda0, self.k)  # type: ignore[arg-type]  # lambda0 set in __post_init__

    @property
    def core_thresholds(self) -> tuple[float, ...]:
        return core_thresholds(self.lambda0, self.gamma, self.k)  # type: ignore[arg-type]  # lambda0 set in __post_init__

    @property
    def c2(self) -> float:
        """Noise multiplier c^2 (corrected constant 50), rounded up."""
        k, n, g = self.k, self.n, self.gamma
        bracket = C2_CONSTANT / ((1.0 - g) ** (2 * k + 1) * (1.0 - k / n) ** 4)
        return _up(_up(bracket * self.lambda0 / n**2) * 2.0 * math.log(2.0 / self.delta_part) / self.epsilon_part**2)  # type: ignore[operator]  # lambda0 set in __post_init__

    @property
    def ptr_budget(self) -> tuple[float, float]:
        return self.epsilon_part, self.delta_part

    def charges(self, prefix: str = "") -> list[Charge]:
        """One charge of the whole (epsilon, delta): the proof is one PTR-style argument."""
        return [Charge(f"{prefix}{ALGORITHM_MEAN}", self.budget, self.group)]

    def cost(self) -> Budget:
        return self.budget

    def describe(self) -> dict:
        return {
            "algorithm": ALGORITHM_MEAN, "version": ALGORITHM_VERSION, "epsilon": self.budget.epsilon,
            "delta": self.budget.delta, "n": self.n, "d": self.d, "lambda0": self.lambda0, "k": self.k,
            "reference_size": self.M, "gamma": self.gamma, "c2": self.c2, "c2_constant": C2_CONSTANT,
        }


@dataclass(frozen=True)
class PrivateCovariancePlan:
    """Public plan of BHS23 Algorithm 5.1 (private covariance of mean-zero rows, Wishart release).

    Parameters
    ----------
    budget : Budget
        epsilon in [0.01, 1), 0 < delta < epsilon/1000.
    n : int
        Public number of rows given to the algorithm (m = n: no pairing inside; Algorithm 5.2
        passes floor(n/2) paired rows).
    d : int
    lambda0 : float, optional
        >= 1; default :func:`default_lambda0` with ``tail_rows = n``.
    group : GroupRange

    Raises
    ------
    ConfigError
        Bad parameters, n < 10 k lambda0, or N < 1; before any budget is reserved.

    References
    ----------
    BHS23 Algorithm 5.1, Theorem 43, Claim 46; docs/privacy/stable_covariance.md (N with constant 48).
    """

    budget: Budget
    n: int
    d: int
    lambda0: float | None = None
    group: GroupRange = ALL_PERSONS

    def __post_init__(self) -> None:
        b = _check_budget(self.budget)
        if not (MIN_EPSILON_COV <= b.epsilon < 1.0):
            raise ConfigError(
                f"epsilon must be in [{MIN_EPSILON_COV}, 1) for BHS23 Algorithm 5.1 (range in which the "
                f"sample count N is verified), got {b.epsilon!r}"
            )
        if not (0.0 < b.delta < b.epsilon / 1000.0):
            raise ConfigError(f"delta must be in (0, epsilon/1000) for BHS23 Algorithm 5.1, got {b.delta!r}")
        _check_int(self.n, "n", 1)
        _check_int(self.d, "d", 1)
        lam = self.lambda0
        if lam is None:
            lam = default_lambda0(self.d, self.n, self.n, 1.0)
        object.__setattr__(self, "lambda0", _check_lambda0(lam, 1.0))
        gate = 10 * self.k * Fraction(self.lambda0)  # type: ignore[arg-type]  # lambda0 set in __post_init__
        if self.n < gate:
            raise ConfigError(
                f"BHS23 Algorithm 5.1 needs n >= 10 k lambda0 (= {float(gate):.0f} rows with k={self.k}, "
                f"lambda0={self.lambda0:.4g}); the plan has n={self.n}"
            )
        if self.N < 1:
            raise ConfigError("BHS23 Algorithm 5.1: the synthetic sample count N is < 1 for these n, epsilon, delta, lambda0")

    @property
    def k(self) -> int:
        return k_for_ptr(self.budget.epsilon / 2.0, self.budget.delta / 2.0)

    @property
    def m(self) -> int:
        return self.n

    @property
    def thresholds(self) -> tuple[float, ...]:
        return thresholds(self.lambda0, self.k)  # type: ignore[arg-type]  # lambda0 set in __post_init__

    @property
    def N(self) -> int:
        """Synthetic samples ``floor(n^2 eps^2 / (48 lambda0^2 ln(2/delta)))`` (corrected), rounded down."""
        e, dl = self.budget.epsilon, self.budget.delta
        raw = self.n**2 * e**2 / (N_CONSTANT * self.lambda0**2 * math.log(2.0 / dl))  # type: ignore[operator]  # lambda0 set in __post_init__
        return int(math.floor(math.nextafter(raw, 0.0)))

    @property
    def ptr_budget(self) -> tuple[float, float]:
        return self.budget.epsilon / 2.0, self.budget.delta / 2.0

    def charges(self, prefix: str = "") -> list[Charge]:
        return [Charge(f"{prefix}{ALGORITHM_COV}", self.budget, self.group)]

    def cost(self) -> Budget:
        return self.budget

    def describe(self) -> dict:
        return {
            "algorithm": ALGORITHM_COV, "version": ALGORITHM_VERSION, "epsilon": self.budget.epsilon,
            "delta": self.budget.delta, "n": self.n, "d": self.d, "lambda0": self.lambda0, "k": self.k,
            "synthetic_samples": self.N, "N_constant": N_CONSTANT,
        }


@dataclass(frozen=True)
class GaussianPlan:
    """Public plan of BHS23 Algorithm 5.2: Algorithm 1 on the n rows and Algorithm 5.1 on their
    floor(n/2) pairs, each with half of (epsilon, delta) (basic composition, Corollary 45).

    The paper's gate ``n >= 272 e^2 lambda0 ln(2/delta)/epsilon`` is an accuracy-side leftover;
    the gates of the two parts are what the privacy proofs need and are enforced.

    Raises
    ------
    ConfigError
        If either part's plan refuses (parameters or gate), before any budget is reserved.
    """

    budget: Budget
    n: int
    d: int
    lambda0: float | None = None
    lambda0_cov: float | None = None
    group: GroupRange = ALL_PERSONS

    def __post_init__(self) -> None:
        b = _check_budget(self.budget)
        half = Budget(b.epsilon / 2.0, b.delta / 2.0)
        _check_int(self.n, "n", 2)
        object.__setattr__(self, "mean_plan", PrivateMeanPlan(half, self.n, self.d, self.lambda0, self.group))
        object.__setattr__(
            self, "cov_plan", PrivateCovariancePlan(half, self.n // 2, self.d, self.lambda0_cov, self.group)
        )

    def charges(self, prefix: str = "") -> list[Charge]:
        return self.mean_plan.charges(prefix) + self.cov_plan.charges(prefix)  # type: ignore[attr-defined]  # set in __post_init__

    def cost(self) -> Budget:
        return self.budget

    def describe(self) -> dict:
        return {"algorithm": ALGORITHM_GAUSSIAN, "version": ALGORITHM_VERSION, "epsilon": self.budget.epsilon,
                "delta": self.budget.delta, "mean": self.mean_plan.describe(), "covariance": self.cov_plan.describe()}  # type: ignore[attr-defined]  # set in __post_init__


def minimum_rows_private_mean(epsilon: float, delta: float, d: int, lambda0: float | None = None) -> int:
    """Smallest n that :class:`PrivateMeanPlan` accepts with this lambda0 (default rule if None).

    With the default rule lambda0 depends (weakly) on n; the answer is the first n of the
    fixed-point iteration ``n <- ceil(20 k lambda0(n))`` (then stepped up) that the plan accepts.

    Raises
    ------
    ConfigError
        If epsilon or delta are outside Algorithm 1's range.
    """
    b = Budget(epsilon, delta)
    k = k_for_ptr(b.epsilon / 3.0, b.delta / 6.0)
    if isinstance(d, bool) or not isinstance(d, int) or d < 1:
        raise InvalidParameterError(f"d must be an integer >= 1, got {d!r}")

    def lam(n: int) -> float:
        return lambda0 if lambda0 is not None else default_lambda0(d, n, n * reference_size(k, n, delta), 10.0)

    n = 2 * math.ceil(10 * k * max(10.0, lam(1000)))
    for _ in range(50):
        nxt = 2 * math.ceil(10 * k * lam(n))
        if nxt == n:
            break
        n = nxt
    for _ in range(10000):
        try:
            PrivateMeanPlan(b, n, d, lambda0)
            return n
        except ConfigError:
            n += 1
    raise ConfigError("no n found for this (epsilon, delta, d, lambda0)")  # pragma: no cover
