"""The covariance of person means at any size: BHS23 above its gate, the clipped estimator below.

BHS23's stable covariance (:mod:`dplib.covariance.person`, Brown, Hopkins, Smith 2023, Algorithm
5.1 on pairs) needs no bounds at all and is robust to outliers, but its gate asks for on the order
of 10^5 persons at d = 4 and epsilon < 1; below it, it can only release FAIL. The clip-and-noise
estimator (:mod:`dplib.covariance.clipped`, CoinPress-style: Biswas, Dong, Kamath, Ullman 2020)
releases from a few thousand persons. This module picks between them from a DP person count:

====  ====================  =================================  ===================================
 #    stage                  budget                             what
====  ====================  =================================  ===================================
 1    person count (n0)      ``COUNT_EPSILON_SHARE`` epsilon    Laplace count, then the DP lower
                                                                bound n0 (``P[n0 > n] <= beta``),
                                                                exactly BHS23's own count stage
 2a   BHS23 (n0 passes       the rest and all of delta          BHS23 on exactly n0 persons
      its gate)                                                 (:func:`person_statistic_at_n0`)
 2b   clipped (otherwise)    the rest and all of delta          the clipped covariance
====  ====================  =================================  ===================================

Privacy: (epsilon, delta)-DP under add/remove one person. Stage 1 is epsilon_1-DP; the choice is a
public function of the plan and the DP n0 (post-processing); whichever branch runs is
(epsilon - epsilon_1, delta)-DP; adaptive sequential composition. When BHS23's parameters are
outside its proven range at this budget (e.g. epsilon >= 1), stage 2a is impossible and the
choice is public before any data is read (the count still runs and is reported; it costs the
clipped branch 2% of epsilon). With ``bhs=False`` (``estimator: clipped``) BHS23 never runs and the
count only picks the clipped estimator's layout (small-data below ``SMALL_DATA_N_EPS``): without it
the large-data layout at 1,000 persons in mixed units put one column's variance 100-700x off in
16 of 300 runs (benchmarks/results/covariance_clipped.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dplib.budget import Accountant, Budget, Charge, composed_cost
from dplib.covariance.clipped import ALGORITHM as CLIPPED_ALGORITHM
from dplib.covariance.clipped import SMALL_DATA_N_EPS, ClippedCovariancePlan, clipped_covariance
from dplib.covariance.person import (
    COUNT_EPSILON_SHARE,
    KINDS,
    STAGE_COUNT,
    PersonBHSPlan,
    check_dummy,
    person_statistic_at_n0,
)
from dplib.covariance.private import STATUS_FAIL
from dplib.errors import ConfigError, InvalidParameterError
from dplib.fixed_n import check_beta, release_lower_bound
from dplib.groups import ALL_PERSONS, GroupRange
from dplib.mechanisms import NoiseSource
from dplib.seam import Aggregates

ALGORITHM = "covariance/auto (BHS23 above its gate, clipped below)"
STAGE_REST = "covariance (BHS23 or clipped, chosen from the DP count)"
STAGE_REST_CLIPPED = "covariance (clipped, its layout chosen from the DP count)"
CHOSEN_BHS, CHOSEN_CLIPPED = "bhs23", "clipped"
CLIPPED_ASKED = "the clipped estimator was asked for (estimator: clipped); the DP count picks its layout"


@dataclass(frozen=True)
class AutoCovariancePlan:
    """Public plan of :func:`auto_covariance`.

    Parameters
    ----------
    budget : Budget
        The statistic's (epsilon, delta); delta > 0.
    d : int
        Number of columns (>= 2).
    lambda0 : float, optional
        BHS23's outlier threshold (public); default the library's rule at n0.
    beta : float in (0, 0.5)
        ``P[n0 > n] <= beta`` (BHS23's padding probability).
    dummy : tuple of d floats, optional
        BHS23's public padding vector (default zeros).
    group : GroupRange
    bhs : bool
        False: never BHS23 (``estimator: clipped``): the DP count only picks the clipped
        estimator's layout (small-data below ``SMALL_DATA_N_EPS``), and it is read from the
        aggregates seam (no person vectors needed: the plan can run per group).

    Raises
    ------
    InvalidParameterError
        Bad budget (delta 0), d, beta or dummy. BHS23 parameters outside its proven range are
        not an error: the plan then always runs the clipped estimator (``bhs_unavailable`` says why).
    """

    budget: Budget
    d: int
    lambda0: float | None = None
    beta: float = 0.05
    dummy: tuple | None = None
    group: GroupRange = ALL_PERSONS
    bhs: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.budget, Budget):
            raise InvalidParameterError("budget must be a dplib.budget.Budget")
        self.clipped_plan()  # d >= 2, delta > 0
        check_beta(self.beta)
        check_dummy(self.dummy, self.d)
        if not isinstance(self.bhs, bool):
            raise InvalidParameterError(f"bhs must be a bool, got {self.bhs!r}")
        if self.lambda0 is not None and not (isinstance(self.lambda0, (int, float)) and not isinstance(self.lambda0, bool)
                                             and math.isfinite(self.lambda0) and self.lambda0 > 0):
            raise InvalidParameterError(f"lambda0 must be a finite number > 0, got {self.lambda0!r}")

    @property
    def count_budget(self) -> Budget:
        return Budget(self.budget.epsilon * COUNT_EPSILON_SHARE, 0.0)

    @property
    def rest_budget(self) -> Budget:
        return Budget(self.budget.epsilon * (1.0 - COUNT_EPSILON_SHARE), self.budget.delta)

    def bhs_plan(self) -> PersonBHSPlan | None:
        """BHS23's plan on the whole budget (its count stage is stage 1), or None when its
        parameters are outside the proven range at this budget, or the plan never runs it (public)."""
        if not self.bhs:
            return None
        try:
            return PersonBHSPlan("covariance", self.budget, self.d, self.lambda0, None, self.beta, self.dummy,
                                 None, self.group)
        except ConfigError:
            return None

    def bhs_unavailable(self) -> str | None:
        """Why BHS23 can never run here (public), or None."""
        if not self.bhs:
            return CLIPPED_ASKED
        try:
            PersonBHSPlan("covariance", self.budget, self.d, self.lambda0, None, self.beta, self.dummy, None, self.group)
            return None
        except ConfigError as err:
            return " ".join(str(err).split())

    def clipped_plan(self, noisy_persons: float | None = None) -> ClippedCovariancePlan:
        """The clipped branch's plan; its small-data layout when ``noisy_persons`` (the DP person
        count, post-processing) times the branch's epsilon is below SMALL_DATA_N_EPS."""
        small = noisy_persons is not None and noisy_persons * self.rest_budget.epsilon < SMALL_DATA_N_EPS
        return ClippedCovariancePlan(self.rest_budget, self.d, group=self.group, small_data=small)

    def bhs_minimum_persons(self) -> int | None:
        """The smallest DP n0 BHS23's gate accepts at this budget, or None when unavailable."""
        bhs = self.bhs_plan()
        return None if bhs is None else bhs.minimum_persons()

    def charges(self, prefix: str = "") -> list[Charge]:
        """Nominal charges: the count, then the chosen branch (its own stages are charged as they run)."""
        return [Charge(f"{prefix}{STAGE_COUNT}", self.count_budget, self.group),
                Charge(f"{prefix}{STAGE_REST if self.bhs else STAGE_REST_CLIPPED}", self.rest_budget, self.group)]

    def cost(self) -> Budget:
        return self.budget

    def describe(self) -> dict:
        return {
            "composition": "sequential: a DP person count, then BHS23 or the clipped estimator",
            "count_epsilon": self.count_budget.epsilon, "beta": self.beta, "d": self.d, "lambda0": self.lambda0,
            "bhs23_minimum_persons": self.bhs_minimum_persons(), "bhs23_unavailable": self.bhs_unavailable(),
        }


@dataclass(frozen=True)
class AutoCovarianceRelease:
    """What :func:`auto_covariance` released: ``covariance`` (d, d) or None, ``status`` (OK,
    INSUFFICIENT_DATA, FAIL), ``algorithm`` (the branch that ran), ``error_covers``, the composed
    ``epsilon`` and ``delta`` charged, ``parameters`` (``estimator_choice`` says which and why),
    ``error_bar`` (d, d) per-entry half-widths at ``error_level`` (the clipped branch) or None."""

    status: str
    covariance: np.ndarray | None
    algorithm: str
    error_covers: str
    epsilon: float
    delta: float
    parameters: dict
    error_bar: np.ndarray | None = None
    error_level: float = 0.0


def auto_covariance(
    aggregates: Aggregates,
    vectors,
    columns: list[str],
    plan: AutoCovariancePlan,
    noise: NoiseSource,
    accountant: Accountant | None = None,
    stage_prefix: str = "",
) -> AutoCovarianceRelease:
    """The DP covariance of the person means of ``columns``: BHS23 when the DP lower bound n0 on the
    person count passes its gate, else the clipped estimator.

    Parameters
    ----------
    aggregates : Aggregates
        The clipped branch's backend.
    vectors : NumpyPersonVectors or SparkPersonVectors or None
        The person vectors: ``count()`` (exact, never logged) and BHS23's ``backend(...)``. None
        only with ``plan.bhs`` False: the count is then ``aggregates.count(columns, plan.group)``.
    columns : list of str
    plan : AutoCovariancePlan
    noise : NoiseSource
    accountant : Accountant, optional
        Checked for the whole plan first; every stage charged before its noise.

    Returns
    -------
    AutoCovarianceRelease

    Raises
    ------
    BudgetExceededError
        Before any charge, if the plan does not fit the accountant.

    Privacy
    -------
    (epsilon, delta)-DP under add/remove one person (module docstring).
    """
    if vectors is None and plan.bhs:
        raise InvalidParameterError("auto_covariance needs the person vectors unless the plan never runs BHS23")
    accountant = accountant if accountant is not None else Accountant(plan.budget)
    accountant.check(plan.charges(stage_prefix))
    start = len(accountant.charges)
    bhs = plan.bhs_plan()
    need = None if bhs is None else bhs.minimum_persons()
    accountant.charge(f"{stage_prefix}{STAGE_COUNT}", plan.count_budget, plan.group)
    exact = vectors.count() if vectors is not None else aggregates.count(columns, plan.group)
    fixed = release_lower_bound(exact, plan.count_budget.epsilon, plan.beta, noise)
    choice: dict[str, object] = {"n0": fixed.n0, "noisy_person_count": fixed.noisy_count, "beta": plan.beta,
              "bhs23_minimum_persons": need}
    if vectors is not None and bhs is not None and need is not None and fixed.n0 >= need:
        out = person_statistic_at_n0(vectors, bhs, fixed, exact, noise, accountant, stage_prefix)
        del exact
        rel = out.release
        choice.update(chosen=CHOSEN_BHS, reason=f"the DP lower bound n0 = {fixed.n0} passes BHS23's gate ({need})")
        eps, delta = composed_cost(accountant.charges[start:])
        cov = None if rel.failed or rel.covariance is None else np.asarray(rel.covariance, dtype=float)
        status = rel.status
        params = {**rel.parameters, "estimator_choice": choice}
        if status == STATUS_FAIL:
            params["fail_reason"] = (
                "BHS23's propose-test-release check did not pass (a DP outcome: a noisy distance to "
                "instability at half the budget); nothing is released. Usually many persons are outliers at "
                "lambda0, or the person vectors are nearly degenerate")
        return AutoCovarianceRelease(status, cov, KINDS["covariance"],
                                     "none: BHS23 releases a Wishart draw; no error bar", eps, delta, params)
    del exact
    why = (plan.bhs_unavailable() if bhs is None
           else f"the DP lower bound n0 = {fixed.n0} is below BHS23's gate ({need} persons at this budget)")
    choice.update(chosen=CHOSEN_CLIPPED, reason=why)
    cplan = plan.clipped_plan(fixed.noisy_count)
    choice["small_data_layout"] = cplan.small_data
    crel = clipped_covariance(aggregates, columns, cplan, noise, accountant, stage_prefix)
    eps, delta = composed_cost(accountant.charges[start:])
    params = {**crel.parameters, "estimator_choice": choice}
    # the branch's listed stages, after the count that chose it (they then add up to the statistic's)
    count = {"stage": STAGE_COUNT, "epsilon": plan.count_budget.epsilon, "delta": plan.count_budget.delta}
    params["stages"] = [count, *params.get("stages", [])]
    return AutoCovarianceRelease(crel.status, crel.covariance, CLIPPED_ALGORITHM, crel.error_covers, eps, delta,
                                 params, crel.error_bar, crel.error_level)
