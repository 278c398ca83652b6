"""A multivariate mean whose DP person count picks joint or coordinate-wise estimation.

A library estimator, NOT what ``kind: multivariate_mean`` runs (that is the joint scale-free
multivariate mean): tried as the default on 2026-12-06 and reverted the same day, when a new
user's trial on five real panels found the coordinate-wise branch releasing nothing where columns
spread over several octaves (pbcseq d = 7, 304 patients, and mathpnl d = 6, 550 districts:
INSUFFICIENT_DATA in 10 of 10 runs; Chem97 d = 4 at epsilon 0.3: 4 of 4) while the joint
estimator's pooled range retries release there. On columns within about one octave (the synthetic
cells below) it is an order of magnitude more accurate than the joint estimator at d = 10 and 1,000
persons. benchmarks/anchors/README.md has both measurements.

The scale-free multivariate mean (:mod:`dplib.mean.scale_free_multivariate`) splits its early
stages over the d coordinates and makes one joint Gaussian release; below a few thousand persons
at d = 10 its per-coordinate ranges and scales rest on almost nothing and its releases are useless
(anchors benchmark, 2026-12-06, epsilon 1, 30 seeds: Gaussian d = 10, 1,000 persons, median l2
error 7.98 against 0.121 for PipelineDP given the data's own bounds; wagepan's 545 persons at
d = 4: 31.9 against 8.78). There, d univariate scale-free means (:mod:`dplib.mean.scale_free`,
each at epsilon / d) are an order of magnitude better (the same cells, 20 seeds: 0.68 and 10.4);
above it the joint release wins (d = 10 at 10,000 persons: 0.0148 against 0.0411 coordinate-wise).
Which side a dataset is on is known only from the data, so:

====  ========================  ===========================  ====================================
 #    stage                      budget                       what
====  ========================  ===========================  ====================================
 1    person count               ``COUNT_SHARE`` of epsilon   Laplace count of the persons with a
                                                              value of every column (sens. 1)
 2a   coordinate-wise, when      the rest: (eps', delta) / d  the univariate scale-free mean of
      count x eps' / d <         per coordinate               each column, on the persons with a
      ``COORDINATE_N_EPS``                                    value of every column
 2b   joint, otherwise           the rest (eps', delta)       the scale-free multivariate mean
====  ========================  ===========================  ====================================

Privacy: (epsilon, delta)-DP under add/remove one person. Stage 1 is (epsilon_1, 0)-DP; the choice
is a public function of the plan and the DP count (post-processing); branch 2a is d estimators at
(eps', delta) / d each on the same persons (basic composition: (eps', delta)), branch 2b is
(eps', delta)-DP; adaptive sequential composition gives (epsilon_1 + eps', delta) = the budget.
Restricting every coordinate to the persons with a value of every column is a function of each
person's own summary (a person's presence changes the restricted data by at most that person),
so each univariate estimator's guarantee holds on it. See docs/privacy/multivariate_mean.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from dplib.budget import Accountant, Budget, Charge, composed_cost
from dplib.errors import InvalidParameterError
from dplib.groups import ALL_PERSONS, GroupRange
from dplib.count import STAGE_COUNT, PersonCountPlan, person_count
from dplib.mechanisms import NoiseSource
from dplib.mean.multivariate import VectorMeanRelease
from dplib.mean.params import check_moment_order
from dplib.mean.scale_free import ScaleFreeMeanPlan, scale_free_person_mean
from dplib.mean.scale_free_multivariate import ScaleFreeMultivariatePlan, scale_free_multivariate_mean
from dplib.mean.univariate import ERROR_LEVEL, STATUS_INSUFFICIENT, STATUS_OK
from dplib.seam import Aggregates

ALGORITHM = "multivariate-mean/auto"
ALGORITHM_VERSION = "2"  # 2: the coordinate-wise branch runs the scale-free mean version 16 (the clipped-persons check)
#: The release's ``algorithm`` when the coordinate-wise branch ran.
COORDINATE_ALGORITHM = "multivariate-mean/coordinate-wise scale-free (agarwal2024 univariate per column)"
STAGE_REST = "multivariate mean (joint or coordinate-wise, chosen from the DP count)"
CHOSEN_JOINT, CHOSEN_COORDINATES = "joint", "coordinate-wise"
#: Share of epsilon spent on the person count that chooses the branch (Laplace scale 1 / (0.02 eps):
#: 50 persons at epsilon 1, small beside the threshold's ~200 d / eps).
COUNT_SHARE = 0.02
#: The coordinate-wise branch runs when the DP count x the branch's epsilon / d is below this (each
#: univariate mean then sees ~this many persons x epsilon). Measured (numpy twins, 20 seeds, epsilon
#: 1, median l2 error joint / coordinate-wise): persons x eps / d = 100 (d = 10, 1,000 persons):
#: Gaussian 7.98 / 0.68 (m = 1), 1.42 / 0.13 (m = 10), uniform 6.29 / 0.86, 1.94 / 0.12, Lomax 2.5
#: 3.86 / 0.63, 5.86 / 0.18, Lomax 1.5 15.1 / 3.8, 9.1 / 1.7; 136 (wagepan, d = 4, 545 persons): 31.9
#: / 10.4; 250 (d = 4, 1,000 persons): Gaussian 0.084 / 0.073, 0.040 / 0.029, uniform 0.079 / 0.137,
#: 0.049 / 0.029, Lomax 2.5 0.18 / 0.31, 0.060 / 0.057, Lomax 1.5 1.15 / 1.71, 0.39 / 0.65 (mixed);
#: 1,000 and up (d = 10 or 4 at 10,000 persons, flights, nlswork, RandHIE at d = 4): the joint
#: release better in every cell (e.g. Gaussian d = 10 0.0148 / 0.0411).
COORDINATE_N_EPS = 200.0


@dataclass(frozen=True)
class AutoMultivariateMeanPlan:
    """Public plan of :func:`auto_multivariate_mean`.

    Parameters
    ----------
    budget : Budget
        The statistic's (epsilon, delta); delta > 0 (both branches are approximate DP).
    d : int
        Number of columns (>= 1).
    k : float or None
        Optional cap on the tail's degrees of freedom, passed to either branch.
    group : GroupRange

    Raises
    ------
    InvalidParameterError
        Bad budget (delta 0), d or k.
    """

    budget: Budget
    d: int
    k: float | None = None
    group: GroupRange = ALL_PERSONS

    def __post_init__(self) -> None:
        if not isinstance(self.budget, Budget):
            raise InvalidParameterError("budget must be a dplib.budget.Budget")
        if self.k is not None:
            object.__setattr__(self, "k", check_moment_order(self.k))
        self.joint_plan()  # d >= 1, delta > 0

    @property
    def count_budget(self) -> Budget:
        return Budget(self.budget.epsilon * COUNT_SHARE, 0.0)

    @property
    def rest_budget(self) -> Budget:
        return Budget(self.budget.epsilon * (1.0 - COUNT_SHARE), self.budget.delta)

    def joint_plan(self) -> ScaleFreeMultivariatePlan:
        """Branch 2b: the scale-free multivariate mean on the rest of the budget."""
        return ScaleFreeMultivariatePlan(self.rest_budget, self.d, k=self.k, group=self.group)

    def coordinate_plan(self) -> ScaleFreeMeanPlan:
        """Branch 2a: one coordinate's univariate scale-free mean, at the rest / d."""
        rest = self.rest_budget
        return ScaleFreeMeanPlan(budget=Budget(rest.epsilon / self.d, rest.delta / self.d), k=self.k, group=self.group)

    def coordinate_wise(self, noisy_persons: float) -> bool:
        """The choice (post-processing of the DP count): coordinate-wise below COORDINATE_N_EPS."""
        return bool(self.d >= 2 and noisy_persons * self.rest_budget.epsilon / self.d < COORDINATE_N_EPS)

    def charges(self, prefix: str = "") -> list[Charge]:
        """Nominal charges: the count, then the chosen branch (its own stages are charged as they run)."""
        return [Charge(f"{prefix}{STAGE_COUNT}", self.count_budget, self.group),
                Charge(f"{prefix}{STAGE_REST}", self.rest_budget, self.group)]

    def cost(self) -> Budget:
        eps, delta = composed_cost(self.charges())
        return Budget(eps, delta)

    def describe(self) -> dict:
        return {
            "composition": ("sequential: a DP person count, then either d univariate scale-free means at "
                            "(epsilon, delta) / d each or one joint scale-free multivariate mean; every stage reads "
                            "all persons with a value of every column"),
            "count_epsilon": self.count_budget.epsilon,
            "coordinate_wise_below_persons_x_epsilon_per_column": COORDINATE_N_EPS,
            "d": self.d, "tail_nu_cap": self.k,
        }


def _coordinate_release(view, columns: list[str], plan: AutoMultivariateMeanPlan, noise: NoiseSource,
                        accountant: Accountant, stage_prefix: str, params: dict) -> tuple[VectorMeanRelease, list]:
    cplan = plan.coordinate_plan()
    rels = []
    for col in columns:
        rels.append(scale_free_person_mean(view, col, cplan, noise, accountant, f"{stage_prefix}{col}: "))
        if rels[-1].status != STATUS_OK:
            # a DP outcome stopped the vector: the columns after it never start and are not charged
            break
    per = {col: r.parameters for col, r in zip(columns, rels)}
    stages = [{"stage": f"{col}: {s['stage']}", "epsilon": s["epsilon"], "delta": s["delta"]}
              for col, r in zip(columns, rels) for s in r.parameters.get("stages", [])]
    flagged = [col for col, r in zip(columns, rels) if r.parameters.get("tail_flag")]
    params.update({"coordinates": per, "coordinate_stages": stages, "tail_flag": bool(flagged)})
    if len(rels) < len(columns) or rels[-1].status != STATUS_OK:
        col = columns[len(rels) - 1]
        covers = (f"none: the univariate scale-free mean of {col} released no value (too few persons with a value of "
                  "every column for the scale-free estimator at epsilon / d; the columns after it were not run or "
                  "charged): more persons or epsilon, fewer columns at a time, or declare options.scales")
        return VectorMeanRelease(STATUS_INSUFFICIENT, None, None, ERROR_LEVEL, covers, None, 0.0, 0.0, params), rels
    estimate = np.array([float(r.estimate) for r in rels if r.estimate is not None])
    bars = [r.error_bar for r in rels]
    error_bar = None if any(b is None for b in bars) else np.array(bars, dtype=float)
    # each coordinate's estimate is c + S~ / N~: its noise sd about sqrt(2) x its sum's Laplace scale / N~
    noise_sd = np.array([math.sqrt(2.0) * float(r.noise_scale or 0.0) / max(float(r.parameters.get("noisy_person_count") or 1.0), 1.0)
                         for r in rels])
    params["noise_sd"] = [float(v) for v in noise_sd]
    params["coordinate_error_bars"] = [None if b is None else float(b) for b in bars]
    if error_bar is None:
        covers = ("nothing: the univariate scale-free mean of " + ", ".join(c for c, b in zip(columns, bars) if b is None)
                  + " has no error bar (see parameters.coordinates)")
    else:
        covers = ("per coordinate, the exact dataset statistic at 90% (each coordinate's own bar: Laplace noise of its "
                  f"fine stage and a DP bound on its clipping bias; d = {len(columns)} univariate scale-free means at "
                  "epsilon / d each, on the persons with a value of every column)")
    if flagged:
        covers += ("; WARNING (tail_flag): the bar of " + ", ".join(flagged) + " rests on a tail assumption its "
                   "deviation profile could not confirm at this budget (few persons x epsilon per column; "
                   "parameters.coordinates says why)")
    return VectorMeanRelease(STATUS_OK, estimate, error_bar, ERROR_LEVEL, covers, noise_sd, 0.0, 0.0, params), rels


def auto_multivariate_mean(
    backend: Aggregates,
    columns: Sequence[str],
    plan: AutoMultivariateMeanPlan,
    noise: NoiseSource,
    accountant: Accountant | None = None,
    stage_prefix: str = "",
) -> VectorMeanRelease:
    """Private mean over persons of each person's mean vector of ``columns``, with no bounds:
    coordinate-wise univariate scale-free means on small data, the joint scale-free multivariate
    mean above (module docstring).

    Parameters
    ----------
    backend : Aggregates
        Exact aggregates over person summaries, with ``complete_cases(columns)`` (both backends
        here): every stage of either branch reads only the persons with a value of every column.
    columns : sequence of str
        d distinct value columns.
    plan : AutoMultivariateMeanPlan
    noise : NoiseSource
    accountant : Accountant, optional
        Checked for the whole plan first; every stage charged before its noise.
    stage_prefix : str

    Returns
    -------
    VectorMeanRelease
        Estimate (d,) in data units; ``error_bar`` (d,) per-coordinate 90% half-widths or None;
        ``parameters["estimator_choice"]`` says which branch ran and why (the DP count).

    Raises
    ------
    BudgetExceededError
        Before any charge, if the plan does not fit the accountant.
    InvalidParameterError
        Before any charge: columns not d distinct names the backend holds, or a backend without
        ``complete_cases``.

    Privacy
    -------
    (epsilon, delta)-DP under add/remove one person (module docstring).
    """
    columns = list(columns)
    if len(columns) != plan.d or len(set(columns)) != plan.d:
        raise InvalidParameterError(f"the plan is for d={plan.d} distinct columns, got {columns}")
    check = getattr(backend, "check_columns", None)
    if check is not None:
        check(columns)
    complete = getattr(backend, "complete_cases", None)
    if complete is None:  # before any charge: a backend that cannot restrict every question to them
        raise InvalidParameterError(
            "auto_multivariate_mean needs a backend with complete_cases(columns) (the persons with a value of every "
            "column); use scale_free_multivariate_mean on other backends (e.g. per group)")
    accountant = accountant if accountant is not None else Accountant(plan.budget)
    accountant.check(plan.charges(stage_prefix))
    view = complete(columns)
    start = len(accountant.charges)
    # the library's person count (charged before its Laplace draw) over the complete cases
    counted = person_count(view, columns, PersonCountPlan(plan.count_budget, plan.group), noise, accountant, stage_prefix)
    n_noisy = float(counted.estimate[0])
    count_stage = {"stage": STAGE_COUNT, "epsilon": plan.count_budget.epsilon, "delta": 0.0}
    choice: dict[str, object] = {"noisy_person_count": round(n_noisy, 1),
                                 "threshold_persons_x_epsilon_per_column": COORDINATE_N_EPS}
    if plan.coordinate_wise(n_noisy):
        choice.update(chosen=CHOSEN_COORDINATES, reason=(
            f"DP person count x epsilon / d = {n_noisy * plan.rest_budget.epsilon / plan.d:.0f} is below "
            f"{COORDINATE_N_EPS:.0f}: d univariate scale-free means at (epsilon, delta) / d each"))
        params = {**plan.describe(), "estimator_choice": choice}
        rel, _ = _coordinate_release(view, columns, plan, noise, accountant, stage_prefix, params)
        params["stages"] = [count_stage, *params.pop("coordinate_stages")]
    else:
        choice.update(chosen=CHOSEN_JOINT, reason=(
            f"DP person count x epsilon / d = {n_noisy * plan.rest_budget.epsilon / plan.d:.0f} is at least "
            f"{COORDINATE_N_EPS:.0f}" if plan.d >= 2 else "d = 1"))
        rel = scale_free_multivariate_mean(view, columns, plan.joint_plan(), noise, accountant, stage_prefix)
        params = {**rel.parameters, "estimator_choice": choice}
        params["stages"] = [count_stage, *params.get("stages", [])]
    eps, delta = composed_cost(accountant.charges[start:])
    return VectorMeanRelease(rel.status, rel.estimate, rel.error_bar, rel.error_level, rel.error_covers,
                             rel.noise_scale, eps, delta, params, rel.norm_model)
