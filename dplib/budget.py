"""Privacy budgets, person groups and the accountant.

Privacy model (docs/privacy/person_level_mean.md, "Neighbouring relation"): neighbouring
datasets differ by adding or removing all records of one person. Persons are split into disjoint
groups by **fixed ranges** of a keyed hash of their id (see :mod:`dplib.groups`); a stage that
reads only the persons of one range is charged only on that range. The composed cost of a set of charges is therefore

    cost = max over points x of the hash space of  sum of the charges whose range holds x,

taken for epsilon and delta separately (basic composition within a range, parallel composition
across disjoint ranges). Both components must stay within the limit: epsilon and delta are
compared as a pair, never epsilon alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from dplib.errors import BudgetExceededError, InvalidParameterError
from dplib.groups import ALL_PERSONS, GroupRange

#: Relative slack allowed when comparing a composed cost with a limit. It only absorbs float
#: rounding of shares that sum to one (1/3 + 1/3 + 1/3); a charge larger than the limit by more
#: than one part in 10^12 is refused.
REL_TOL = 1e-12


def _check_epsilon(value: float, name: str = "epsilon") -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidParameterError(f"{name} must be a real number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value) or value <= 0.0:
        raise InvalidParameterError(f"{name} must be finite and > 0, got {value!r}")
    return value


def _check_delta(value: float, name: str = "delta") -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidParameterError(f"{name} must be a real number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value) or not (0.0 <= value < 1.0):
        raise InvalidParameterError(f"{name} must be in [0, 1), got {value!r}")
    return value


@dataclass(frozen=True)
class Budget:
    """An (epsilon, delta) differential-privacy budget. Immutable.

    Parameters
    ----------
    epsilon : float
        Privacy-loss bound, finite and > 0.
    delta : float, default 0.0
        Failure probability, in [0, 1). 0 means pure DP.

    Raises
    ------
    InvalidParameterError
        If epsilon is not finite and positive, or delta is outside [0, 1).
    """

    epsilon: float
    delta: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", _check_epsilon(self.epsilon))
        object.__setattr__(self, "delta", _check_delta(self.delta))

    def scaled(self, fraction: float) -> "Budget":
        """Return ``(fraction * epsilon, fraction * delta)``; ``fraction`` in (0, 1]."""
        if isinstance(fraction, bool) or not (isinstance(fraction, (int, float)) and 0.0 < float(fraction) <= 1.0):
            raise InvalidParameterError(f"budget fraction must be in (0, 1], got {fraction!r}")
        return Budget(self.epsilon * fraction, self.delta * fraction)

    def fits_within(self, limit: "Budget") -> bool:
        """True if both epsilon and delta are at most the limit's (up to :data:`REL_TOL`)."""
        return self.epsilon <= limit.epsilon * (1 + REL_TOL) and self.delta <= limit.delta * (
            1 + REL_TOL
        )

    def __str__(self) -> str:
        return f"(epsilon={self.epsilon:.6g}, delta={self.delta:.3g})"


@dataclass(frozen=True)
class Charge:
    """One recorded charge: a stage name, the budget it spent and the persons it read."""

    stage: str
    budget: Budget
    group: GroupRange = ALL_PERSONS


def composed_cost(charges: list[Charge] | tuple[Charge, ...]) -> tuple[float, float]:
    """Composed (epsilon, delta) of a list of charges under add/remove neighbouring.

    Sequential (basic) composition within a hash range, parallel composition across disjoint
    ranges: the maximum over elementary segments of the summed charges, for epsilon and delta
    separately. Returns ``(0.0, 0.0)`` for no charges.
    """
    if not charges:
        return 0.0, 0.0
    g0 = charges[0].group
    if all(c.group is g0 or c.group == g0 for c in charges):
        # one hash range (every charge of an ungrouped statistic, or of one group): one segment
        return math.fsum(c.budget.epsilon for c in charges), math.fsum(c.budget.delta for c in charges)
    cuts = sorted({c.group.lo for c in charges} | {c.group.hi for c in charges})
    eps_max = 0.0
    delta_max = 0.0
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        mid = (lo + hi) / 2.0
        inside = [c.budget for c in charges if c.group.lo <= mid < c.group.hi]
        eps_max = max(eps_max, math.fsum(b.epsilon for b in inside))
        delta_max = max(delta_max, math.fsum(b.delta for b in inside))
    return eps_max, delta_max


@dataclass
class Accountant:
    """Keeps every charge of one run and refuses any charge that would overspend its limit.

    Verify, then charge, then release: an estimator calls :meth:`charge` *before* it draws the
    noise of a stage. A refused charge records nothing.

    Parameters
    ----------
    limit : Budget
        The most the run may spend, composed as described in the module docstring.

    Raises
    ------
    BudgetExceededError
        From :meth:`charge`, when the composed cost with the new charge exceeds ``limit``
        in epsilon or in delta.
    """

    limit: Budget
    charges: list[Charge] = field(default_factory=list)

    def cost(self) -> tuple[float, float]:
        """The composed (epsilon, delta) spent so far."""
        return composed_cost(self.charges)

    def cost_with(self, extra: list[Charge]) -> tuple[float, float]:
        """The composed cost if ``extra`` were charged too (nothing is recorded)."""
        return composed_cost(list(self.charges) + list(extra))

    def check(self, extra: list[Charge]) -> None:
        """Raise :class:`BudgetExceededError` if charging ``extra`` would overspend."""
        eps, delta = self.cost_with(extra)
        if eps > self.limit.epsilon * (1 + REL_TOL) or delta > self.limit.delta * (1 + REL_TOL):
            stages = ", ".join(c.stage for c in extra)
            raise BudgetExceededError(
                f"charging [{stages}] would bring the composed cost to (epsilon={eps:.6g}, "
                f"delta={delta:.3g}), over the limit {self.limit}"
            )

    def charge(self, stage: str, budget: Budget, group: GroupRange = ALL_PERSONS) -> Charge:
        """Record a charge of ``budget`` on the persons of ``group`` for ``stage``."""
        new = Charge(stage, budget, group)
        self.check([new])
        self.charges.append(new)
        return new
