"""BHS23 at person level: exactly n0 person vectors (DP lower bound, keyed-hash rank, padding).

BHS23's proofs are for substitution of one row with the number of rows n public (its
Definition 2). The project's neighbours add or remove a person and the person count is private.
The bridge (docs/privacy/stable_covariance.md, "Person level"; :mod:`dplib.fixed_n`):

1. **Person vectors.** One row per person: the person's mean of the d columns
   (``spark_jobs.spark.vectors.person_vectors``; a function of that person's records only).
2. **n0.** The person count is released with the Laplace mechanism at
   ``epsilon_count = COUNT_EPSILON_SHARE * epsilon`` and turned into a lower confidence bound
   ``n0`` (:func:`dplib.fixed_n.release_lower_bound`; ``P[n0 > n] <= beta``).
3. **Selection and order in one sort.** Every person gets the key
   ``SHA-256(salt || ":bhs23-order:" || "p:" || id)`` (64 bits), every dummy ``j`` the key of
   ``"d:" || j``; all rows are sorted by (key, vector) and the first n0 are kept, *in that
   order*: it is both the selection by keyed-hash rank and the uniformly random order that
   pairing and the reference set need (Pair). Why one sort suffices: the keys are i.i.d.
   uniform given a fresh secret salt, so given the selected set S the order of S is uniform and
   independent of the vectors; the output law is ``E_S[A(S)]`` with A the algorithm with a
   fresh random order. Coupling the keys of add/remove neighbours, the selected multisets are
   equal or differ by one substitution (the added person replaces the n0-th row, a person or
   a dummy), and BHS23's substitution guarantee applies to every coupled pair; averaging over
   the coupling gives the add/remove guarantee, conditioned on n0 (adaptive composition).
4. **Padding.** With fewer than n0 persons (probability <= beta), ``n0 - n`` copies of a fixed
   public dummy vector fill the set; never a refusal that depends on the exact count.
5. **Gate.** The algorithm's gate (n0 >= 20 k lambda0, ...) is checked on the DP n0: if n0 is
   below it the statistic is released as FAIL, with its budget charged (a FAIL that depends
   only on a DP value leaks nothing further). A config whose *declared* public
   ``expected_persons`` is below the gate is refused before any budget is reserved.

The dummy vector (default: the zero vector, or a public vector from the config). Identical
dummies paired with each other give pair rows y = 0: score 0, never outliers, no contribution to
the Gram matrix, so they shrink Sigma_hat by their share of the pairs; paired with a person they
give y = (x - dummy)/sqrt 2, an outlier when the dummy is far from the data (each costs about
one score unit); in StableMean they are outliers unless they make up most of R. All of this
happens only with probability <= beta, costs accuracy or gives FAIL, and never privacy: the
dummy is public and fixed before any data is read. All rows identical => singular Gram => FAIL.

Heterogeneous records: a person mean over m_i records has covariance
Sigma_rec / m_i; different m_i make the person vectors a scale mixture, which raises scores
and FAIL rates but never changes privacy (each row depends on its own person only).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from dplib.budget import Accountant, Budget, Charge
from dplib.covariance.backend import VALUE_BOUND, NumpyCovarianceBackend, check_rows
from dplib.covariance.order import order_keys, pair
from dplib.covariance.params import (
    ALGORITHM_COV,
    ALGORITHM_GAUSSIAN,
    ALGORITHM_MEAN,
    GaussianPlan,
    PrivateCovariancePlan,
    PrivateMeanPlan,
)
from dplib.covariance.private import STATUS_FAIL, BHSRelease, Diagnostics, Outcome, private_covariance, private_gaussian, private_mean
from dplib.errors import ConfigError, InputDataError, InvalidParameterError
from dplib.fixed_n import FixedN, check_beta, release_lower_bound
from dplib.groups import ALL_PERSONS, GroupRange
from dplib.mechanisms.noise import NoiseSource

PERSON_PREFIX = "p:"
DUMMY_PREFIX = "d:"
#: Share of the statistic's epsilon spent on the person count (n0). Accuracy only: with
#: epsilon = 0.5 and beta = 0.05 the Laplace margin is about 230 persons, far below the gate.
COUNT_EPSILON_SHARE = 0.02
STAGE_COUNT = "person count (n0)"
#: Config kinds -> algorithm.
KINDS = {"mean_affine": ALGORITHM_MEAN, "covariance": ALGORITHM_COV, "gaussian": ALGORITHM_GAUSSIAN}
_HUGE_N = 10**15


def check_dummy(dummy: object, d: int) -> np.ndarray:
    """The public dummy vector as a finite float array ``(d,)`` within ``+-VALUE_BOUND``.

    Raises
    ------
    InvalidParameterError
        Wrong length, non-numeric or non-finite entries.
    """
    if dummy is None:
        return np.zeros(d)
    try:
        v = np.asarray(dummy, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError) as exc:
        raise InvalidParameterError("dummy must be a list of d numbers") from exc
    if v.size != d or not np.all(np.isfinite(v)) or np.any(np.abs(v) > VALUE_BOUND):
        raise InvalidParameterError(f"dummy must be {d} finite numbers within +-{VALUE_BOUND:g}, got {dummy!r}")
    return v


def select_rows(ids: Sequence[object], x: np.ndarray, salt_hex: str, n0: int, dummy: np.ndarray) -> np.ndarray:
    """The n0 rows of smallest (key, vector) among the persons and ``max(0, n0 - n)`` dummies,
    in that order, shape ``(n0, d)`` (numpy twin of ``SparkPersonVectors.backend``)."""
    arr = check_rows(x)
    n, d = arr.shape
    if len(ids) != n:
        raise InputDataError(f"ids must have one entry per row ({n}), got {len(ids)}")
    pad = max(0, int(n0) - n)
    keys = order_keys([PERSON_PREFIX + str(i) for i in ids] + [DUMMY_PREFIX + str(j) for j in range(pad)], salt_hex)
    rows = np.vstack([arr, np.tile(check_dummy(dummy, d), (pad, 1))])
    order = np.lexsort(tuple(rows[:, j] for j in range(d - 1, -1, -1)) + (keys,))
    return rows[order[: int(n0)]]


class NumpyPersonVectors:
    """Person vectors in memory (ids and an ``(n, d)`` array): the numpy twin of
    ``spark_jobs.spark.vectors.SparkPersonVectors``."""

    def __init__(self, ids: Sequence[object], x: object, salt_hex: str) -> None:
        self._x = check_rows(x)
        self._ids = list(ids)
        if len(self._ids) != self._x.shape[0]:
            raise InputDataError("ids must have one entry per person vector")
        self._salt = salt_hex
        self.d = self._x.shape[1]

    def count(self) -> int:
        return self._x.shape[0]

    def backend(self, n0: int, dummy: np.ndarray, count: int) -> NumpyCovarianceBackend:
        xo = select_rows(self._ids, self._x, self._salt, n0, dummy)
        return NumpyCovarianceBackend(pair(xo), xo, self._salt)


@dataclass(frozen=True)
class PersonBHSPlan:
    """Public plan of a person-level BHS23 statistic (config kinds ``mean_affine``,
    ``covariance``, ``gaussian``).

    Parameters
    ----------
    kind : "mean_affine", "covariance" or "gaussian"
        Algorithm 1; Algorithm 5.1 on the floor(n0/2) pairs of the person vectors (as in 5.2);
        Algorithm 5.2.
    budget : Budget
        The statistic's (epsilon, delta): ``COUNT_EPSILON_SHARE * epsilon`` for n0, the rest and
        all of delta for the algorithm (whose epsilon must be < 1).
    d : int
    lambda0, lambda0_cov : float, optional
        Outlier thresholds (public); default :func:`dplib.covariance.params.default_lambda0` at n0.
    beta : float in (0, 0.5)
        ``P[n0 > n] <= beta`` (padding probability).
    dummy : sequence of d floats, optional
        Public dummy vector (default zeros).
    expected_persons : int, optional
        A public, declared person count: refused before any budget if below the gate.
    group : GroupRange

    Raises
    ------
    ConfigError
        Parameters outside the algorithm's proven range, or ``expected_persons`` below the gate
        (the message gives the smallest n0 the gate accepts, from public inputs only).
    InvalidParameterError
        Bad kind, beta or dummy.
    """

    kind: str
    budget: Budget
    d: int
    lambda0: float | None = None
    lambda0_cov: float | None = None
    beta: float = 0.05
    dummy: tuple | None = None
    expected_persons: int | None = None
    group: GroupRange = ALL_PERSONS

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InvalidParameterError(f"kind must be one of {sorted(KINDS)}, got {self.kind!r}")
        if not isinstance(self.budget, Budget):
            raise ConfigError("budget must be a dplib.budget.Budget")
        check_beta(self.beta)
        if isinstance(self.d, bool) or not isinstance(self.d, int) or self.d < 1:
            raise InvalidParameterError(f"d must be an integer >= 1, got {self.d!r}")
        object.__setattr__(self, "dummy", tuple(float(v) for v in check_dummy(self.dummy, self.d)))
        self.algorithm_plan(_HUGE_N)  # parameter ranges (epsilon < 1, delta, lambda0): raises ConfigError
        if self.expected_persons is not None:
            if isinstance(self.expected_persons, bool) or not isinstance(self.expected_persons, int) or self.expected_persons < 1:
                raise InvalidParameterError(f"expected_persons must be an integer >= 1, got {self.expected_persons!r}")
            need = self.minimum_persons()
            if self.expected_persons < need:
                raise ConfigError(
                    f"{KINDS[self.kind]} needs at least {need} persons (the DP lower bound n0 must pass the gate "
                    f"n >= 20 k lambda0 / 10 k lambda0 at epsilon={self.algorithm_budget.epsilon:.4g}, "
                    f"delta={self.budget.delta:g}, d={self.d}); expected_persons={self.expected_persons}"
                )

    @property
    def count_budget(self) -> Budget:
        return Budget(self.budget.epsilon * COUNT_EPSILON_SHARE, 0.0)

    @property
    def algorithm_budget(self) -> Budget:
        return Budget(self.budget.epsilon * (1.0 - COUNT_EPSILON_SHARE), self.budget.delta)

    def algorithm_plan(self, n0: int):
        """The algorithm's plan on n0 rows; raises ConfigError when n0 is below its gate."""
        b = self.algorithm_budget
        if self.kind == "mean_affine":
            return PrivateMeanPlan(b, n0, self.d, self.lambda0, self.group)
        if self.kind == "covariance":
            return PrivateCovariancePlan(b, n0 // 2, self.d, self.lambda0, self.group)
        return GaussianPlan(b, n0, self.d, self.lambda0, self.lambda0_cov, self.group)

    def accepts(self, n0: int) -> bool:
        try:
            self.algorithm_plan(n0)
            return True
        except ConfigError:
            return False

    def minimum_persons(self) -> int:
        """Smallest n0 the gate accepts (bisection; public inputs only)."""
        lo, hi = 2, 4
        while not self.accepts(hi):
            lo, hi = hi, hi * 2
            if hi > _HUGE_N:  # pragma: no cover - excluded by the construction check
                raise ConfigError("no person count passes the gate for these parameters")
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if self.accepts(mid) else (mid, hi)
        return hi

    def algorithm_charges(self, prefix: str = "") -> list[Charge]:
        b = self.algorithm_budget
        if self.kind == "gaussian":
            half = Budget(b.epsilon / 2.0, b.delta / 2.0)
            return [Charge(f"{prefix}{ALGORITHM_MEAN}", half, self.group), Charge(f"{prefix}{ALGORITHM_COV}", half, self.group)]
        return [Charge(f"{prefix}{KINDS[self.kind]}", b, self.group)]

    def charges(self, prefix: str = "") -> list[Charge]:
        """The count then the algorithm (sequential on the same persons): the cost before data."""
        return [Charge(f"{prefix}{STAGE_COUNT}", self.count_budget, self.group)] + self.algorithm_charges(prefix)

    def cost(self) -> Budget:
        return self.budget

    def describe(self) -> dict:
        return {
            "kind": self.kind, "algorithm": KINDS[self.kind], "epsilon": self.budget.epsilon, "delta": self.budget.delta,
            "count_epsilon": self.count_budget.epsilon, "beta": self.beta, "d": self.d,
            "lambda0": self.lambda0, "lambda0_cov": self.lambda0_cov, "dummy": list(self.dummy),  # type: ignore[arg-type]  # dummy set in __post_init__
            "selection": "n0 persons of smallest keyed hash (fresh secret salt), padded with the public dummy",
        }


@dataclass
class PersonOutcome(Outcome):
    """:class:`Outcome` plus the DP n0 (public once released)."""

    n0: int = 0


def private_person_statistic(
    source,
    plan: PersonBHSPlan,
    noise: NoiseSource,
    accountant: Accountant | None = None,
    stage_prefix: str = "",
    keep_internals: bool = False,
) -> PersonOutcome:
    """Person-level BHS23 (Algorithm 1, 5.1 on pairs, or 5.2) on exactly n0 person vectors.

    Parameters
    ----------
    source : NumpyPersonVectors or spark_jobs.spark.vectors.SparkPersonVectors
        ``count()`` (exact, never logged) and ``backend(n0, dummy, count)``.
    plan : PersonBHSPlan
    noise : NoiseSource
        Laplace count, PTR coin, Gaussian and Wishart draws, in that order.
    accountant : Accountant, optional
        Checked for the whole plan first; the count is charged before its noise, the algorithm
        before anything data-dependent of it.

    Returns
    -------
    PersonOutcome
        ``release`` (OK or FAIL; ``parameters`` include n0 and the noisy count, both DP) and
        the DP ``n0``. FAIL when n0 is below the gate (charged) or when the PTR fails.

    Privacy
    -------
    (epsilon, delta)-DP under add/remove of one person: the count (epsilon_count, 0) by the
    Laplace mechanism, then, given n0, the algorithm's substitution guarantee on the n0 selected
    rows (module docstring), sequential composition. Not floating-point hardened.

    References
    ----------
    BHS23 Algorithms 1, 5.1, 5.2; docs/privacy/stable_covariance.md, "Person level" (fixed n0).
    """
    accountant = accountant if accountant is not None else Accountant(plan.budget)
    accountant.check(plan.charges(stage_prefix))
    c = plan.charges(stage_prefix)[0]
    accountant.charge(c.stage, c.budget, c.group)
    exact = source.count()
    fixed = release_lower_bound(exact, plan.count_budget.epsilon, plan.beta, noise)
    return person_statistic_at_n0(source, plan, fixed, exact, noise, accountant, stage_prefix, keep_internals)


def person_statistic_at_n0(
    source,
    plan: PersonBHSPlan,
    fixed: FixedN,
    exact: int,
    noise: NoiseSource,
    accountant: Accountant,
    stage_prefix: str = "",
    keep_internals: bool = False,
) -> PersonOutcome:
    """The rest of :func:`private_person_statistic` once its count stage has run: ``fixed`` is the
    released count (``plan.count_budget`` already charged on ``accountant``), ``exact`` the exact
    person count the backend pads to (never logged or returned). Used by the automatic covariance
    estimator (:mod:`dplib.covariance.auto`), whose choice reads the same DP count."""
    n0 = fixed.n0
    params = {
        **plan.describe(), "n0": n0, "noisy_person_count": fixed.noisy_count, "count_laplace_scale": fixed.laplace_scale,
    }
    try:
        inner = plan.algorithm_plan(n0)
    except ConfigError:
        for ch in plan.algorithm_charges(stage_prefix):
            accountant.charge(ch.stage, ch.budget, ch.group)
        release = BHSRelease(
            KINDS[plan.kind], STATUS_FAIL, None, None, plan.budget.epsilon, plan.budget.delta,
            {**params, "gate": "n0 below the gate (public given the DP n0)"}, noise.name,
        )
        return PersonOutcome(release, Diagnostics(), n0=n0)
    backend = source.backend(n0, np.asarray(plan.dummy), exact)
    del exact
    try:
        run = {"mean_affine": private_mean, "covariance": private_covariance, "gaussian": private_gaussian}[plan.kind]
        out = run(backend, inner, noise, accountant, stage_prefix, keep_internals)  # type: ignore[operator]  # three release functions of one call signature
    finally:
        if hasattr(backend, "close"):
            backend.close()
    release = replace(
        out.release, algorithm=KINDS[plan.kind], epsilon=plan.budget.epsilon, delta=plan.budget.delta,
        parameters={**params, "algorithm_parameters": out.release.parameters},
    )
    return PersonOutcome(release, out.diagnostics, n0=n0)

