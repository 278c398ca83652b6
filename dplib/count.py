"""The number of persons, released with the Laplace mechanism (pure epsilon-DP).

Add/remove one person changes the number of persons with a value of every column by at most 1
(a person is one row of the per-person summary), so the l1 sensitivity is 1: the textbook
Laplace mechanism (Dwork, McSherry, Nissim, Smith 2006). No bound is needed from the user.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from dplib.budget import Accountant, Budget, Charge, composed_cost
from dplib.errors import InvalidParameterError
from dplib.groups import ALL_PERSONS, GroupRange
from dplib.mechanisms import NoiseSource
from dplib.mechanisms.basic import clamp_exact, inflate, laplace_mechanism
from dplib.seam import Aggregates

ALGORITHM = "laplace-person-count"
ALGORITHM_VERSION = "1"
STAGE_COUNT = "count"
STATUS_OK = "OK"
ERROR_LEVEL = 0.9


@dataclass(frozen=True)
class PersonCountPlan:
    """Public plan of a person count: one Laplace stage on ``group`` (pure epsilon; delta unused).

    Raises
    ------
    InvalidParameterError
        If ``budget`` is not a :class:`~dplib.budget.Budget`.
    """

    budget: Budget
    group: GroupRange = ALL_PERSONS

    def __post_init__(self) -> None:
        if not isinstance(self.budget, Budget):
            raise InvalidParameterError("budget must be a dplib.budget.Budget")

    def charges(self, prefix: str = "") -> list[Charge]:
        return [Charge(f"{prefix}{STAGE_COUNT}", Budget(self.budget.epsilon, 0.0), self.group)]


@dataclass(frozen=True)
class CountRelease:
    """A released person count. ``estimate``: shape (1,), a non-negative integer (as float);
    ``error_bar``: shape (1,), half-width of a ``error_level`` interval for the exact count (the
    Laplace quantile plus 0.5 for the rounding); ``noise_scale``: the Laplace scale, persons."""

    status: str
    estimate: np.ndarray
    error_bar: np.ndarray
    error_level: float
    error_covers: str
    noise_scale: float
    epsilon: float
    delta: float
    parameters: dict = field(default_factory=dict)


def laplace_error_bar(scale: float, level: float = ERROR_LEVEL) -> float:
    """Half-width ``b ln(1 / (1 - level))`` of the central ``level`` interval of Laplace(b)."""
    return scale * math.log(1.0 / (1.0 - level))


def person_count(
    backend: Aggregates,
    columns: Sequence[str],
    plan: PersonCountPlan,
    noise: NoiseSource,
    accountant: Accountant | None = None,
    stage_prefix: str = "",
) -> CountRelease:
    """The DP number of persons with a value of every one of ``columns``.

    Parameters
    ----------
    backend : Aggregates
        The seam (:class:`dplib.aggregates.NumpyAggregates` or the Spark twin); only ``count``
        is asked.
    columns : sequence of str
    plan : PersonCountPlan
    noise : NoiseSource
    accountant : Accountant, optional
        Checked, then charged before the count is read; default: limited to ``plan.budget``.

    Returns
    -------
    CountRelease

    Raises
    ------
    BudgetExceededError
        Before any charge, if the plan does not fit the accountant.

    Privacy
    -------
    epsilon-DP under add/remove one person: l1 sensitivity 1 (inflated by the library's float
    margin); rounding and clamping at 0 are post-processing.
    """
    accountant = accountant if accountant is not None else Accountant(plan.budget)
    (charge,) = plan.charges(stage_prefix)
    accountant.check([charge])
    start = len(accountant.charges)
    accountant.charge(charge.stage, charge.budget, charge.group)
    exact = clamp_exact(np.array([float(backend.count(list(columns), plan.group))]))
    noisy, scale = laplace_mechanism(exact, inflate(1.0), charge.budget.epsilon, noise)
    del exact
    estimate = np.array([max(0.0, float(np.rint(noisy[0])))])
    bar = np.array([laplace_error_bar(scale) + 0.5])
    eps, delta = composed_cost(accountant.charges[start:])
    covers = "the exact number of persons, at 90%: the Laplace noise (exact quantile) and the rounding"
    params = {"stages": [{"stage": STAGE_COUNT, "epsilon": charge.budget.epsilon, "delta": 0.0}],
              "sensitivity": 1.0}
    return CountRelease(STATUS_OK, estimate, bar, ERROR_LEVEL, covers, float(scale), eps, delta, params)
