"""The person-level mean with declared public bounds (``kind: mean`` with ``options.bounds``).

For columns whose limits are a public fact, not a guess from the data: a 0/1 indicator (a
person's mean is their share of records with it), a rating on a fixed scale, a percentage. Each
person's mean of their records is clamped into ``[lower, upper]``; the centred sum of the clamped
means about the midpoint and a weighted person count are released with Laplace noise under all of
epsilon; the estimate is the midpoint plus the noisy sum over the noisy count. One stage, every
person, every record of each person (no record cap of its own: a person's records are averaged
first; a job's ``summary.max_records_per_person`` still applies, as to every statistic).

Why: the scale-free estimator (:mod:`dplib.mean.scale_free`) finds its range, centre and radius
privately and reads a power-law tail off a deviation profile; on two atoms (the person means of
a 0/1 column, many at exactly 0 and 1) that reads badly. Measured (numpy, 60 seeds, a new user's
PSID panel of 595 persons at epsilon 1): 4-61x the error of the clamped mean below, several
releases at ~0 with no bar where 44-89% of persons are 0.

Privacy: epsilon-DP (delta unused) under add/remove of one person with all their records: the
clamped centred sum moves by at most ``(upper - lower) / 2`` and the weighted count by ``w``
(l1 sensitivity ``(upper - lower) / 2 + w``, inflated by the float-rounding margin), both public;
that holds for widths of at least MIN_WIDTH (the fixed-point sum's unit must be a normal double),
which :func:`check_bounds` enforces.
The bounds come from the config, never from the data. ``docs/privacy/person_level_mean.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dplib.budget import Accountant, Budget, Charge, composed_cost
from dplib.errors import InvalidParameterError
from dplib.groups import ALL_PERSONS, GroupRange
from dplib.mean.error_bars import ERROR_LEVEL
from dplib.mean.univariate import STATUS_OK, MeanRelease, centred_clip_and_noise, count_weight
from dplib.mechanisms import NoiseSource, inflate
from dplib.seam import Aggregates

ALGORITHM = "bounded person-level mean (declared public bounds; Laplace on the centred clamped sum and the count)"
ALGORITHM_VERSION = "1"
STAGE_FINE = "clip-and-noise (declared bounds)"
#: Bounds must lie within +-MAX_ABS_BOUND: person means are clamped to about +-3.17e29 in the
#: summary (:data:`dplib.summary.CLAMP`), so wider bounds mean nothing and only move the centre.
MAX_ABS_BOUND = 1e29
#: Narrowest bounds accepted: the backends turn their fixed-point sum back into data units with
#: the factor radius / 2^30, which must stay a normal double, else one person could move the sum by
#: up to ~2x the radius (a privacy review: bounds [0, 5.3e-315] gave 1.6x the declared epsilon).
MIN_WIDTH = 1e-290
#: The Laplace scale (radius + count weight) / epsilon must stay below this: beyond it the
#: mechanism or the bar fails after the charge (epsilon 1e-8 on bounds of width 1e29).
MAX_NOISE_SCALE = 1e250


def check_bounds(bounds) -> tuple[float, float]:
    """``(lower, upper)`` as floats, or InvalidParameterError naming what is wrong (finite numbers,
    ``lower < upper``, width at most MAX_WIDTH). Public inputs only."""
    try:
        lower, upper = (float(b) for b in bounds)
    except (TypeError, ValueError):
        raise InvalidParameterError(f"bounds must be two numbers [lower, upper], got {bounds!r}") from None
    if not (math.isfinite(lower) and math.isfinite(upper)):
        raise InvalidParameterError(f"bounds must be finite, got [{lower!r}, {upper!r}]")
    if not lower < upper:
        raise InvalidParameterError(f"bounds need lower < upper, got [{lower!r}, {upper!r}]")
    if max(abs(lower), abs(upper)) > MAX_ABS_BOUND:
        raise InvalidParameterError(
            f"bounds must lie within +-{MAX_ABS_BOUND:g} (person means are clamped near +-3.2e29), got "
            f"[{lower!r}, {upper!r}]")
    if not (upper - lower) >= MIN_WIDTH:
        raise InvalidParameterError(f"bounds narrower than {MIN_WIDTH:g} (got [{lower!r}, {upper!r}]): rescale the column")
    return lower, upper


@dataclass(frozen=True)
class BoundedMeanPlan:
    """Public plan of the bounded mean, fixed before any data is read.

    Parameters
    ----------
    budget : Budget
        epsilon > 0 is spent on the one stage; delta is not used (pure DP).
    lower, upper : float
        Declared public bounds of a person's mean (data units), ``lower < upper``.
    group : GroupRange
        Persons the statistic reads (default: all).
    """

    budget: Budget
    lower: float
    upper: float
    group: GroupRange = ALL_PERSONS

    def __post_init__(self) -> None:
        lower, upper = check_bounds((self.lower, self.upper))
        object.__setattr__(self, "lower", lower)
        object.__setattr__(self, "upper", upper)
        if not (math.isfinite(self.budget.epsilon) and self.budget.epsilon > 0):
            raise InvalidParameterError(f"epsilon must be finite and > 0, got {self.budget.epsilon!r}")
        if not inflate(self.radius + self.count_weight) / self.budget.epsilon <= MAX_NOISE_SCALE:
            raise InvalidParameterError(
                f"bounds [{self.lower:g}, {self.upper:g}] at epsilon {self.budget.epsilon:g} give a Laplace scale above "
                f"{MAX_NOISE_SCALE:g}: narrower bounds or a larger epsilon")

    @property
    def center(self) -> float:
        return self.lower / 2.0 + self.upper / 2.0

    @property
    def radius(self) -> float:
        return self.upper / 2.0 - self.lower / 2.0

    @property
    def count_weight(self) -> float:
        """Weight ``w`` of the count (accuracy only: public): :func:`count_weight` with the
        working guess ``|mean - midpoint| = radius / 2``."""
        return count_weight(self.radius, self.radius / 2.0)

    def charges(self, prefix: str = "") -> list[Charge]:
        """The one charge, before any data is read."""
        return [Charge(f"{prefix}{STAGE_FINE}", Budget(self.budget.epsilon, 0.0), self.group)]

    def cost(self) -> Budget:
        return Budget(self.budget.epsilon, 0.0)

    def describe(self) -> dict:
        """Public parameters, JSON-friendly."""
        return {
            "bounds": [self.lower, self.upper],
            "clipping_center": self.center,
            "clipping_radius": self.radius,
            "count_weight": self.count_weight,
            "fine_epsilon": self.budget.epsilon,
        }


def bounded_person_mean(
    backend: Aggregates,
    column: str,
    plan: BoundedMeanPlan,
    noise: NoiseSource,
    accountant: Accountant | None = None,
    stage_prefix: str = "",
) -> MeanRelease:
    """Private mean over persons of each person's mean of ``column``, clamped into declared bounds.

    Parameters
    ----------
    backend : Aggregates
        Exact aggregates over person summaries (numpy or Spark backend).
    column : str
        The value column; a person's value is the mean of their usable records of it.
    plan : BoundedMeanPlan
    noise : NoiseSource
        :class:`~dplib.mechanisms.SecureNoise` for releases; ``SeededNoise`` in tests.
    accountant : Accountant, optional
        Charged before the noise is drawn. Default: a fresh one limited to ``plan.budget``.

    Returns
    -------
    MeanRelease
        Estimate of shape () in data units (status OK always: a noisy count below 1 is read as 1)
        with a 90% bar for the exact mean of the clamped person means (the Laplace noise of the
        sum and the count); ``parameters["noisy_person_count"]`` is DP.

    Raises
    ------
    BudgetExceededError
        If the accountant cannot cover the stage (before any data is read).

    Privacy
    -------
    epsilon-DP under add/remove of one person (all their records): l1 sensitivity
    ``(upper - lower) / 2 + w`` of (centred clamped sum, w x count). The bounds are public.
    """
    accountant = accountant if accountant is not None else Accountant(plan.budget)
    (fine_charge,) = plan.charges(stage_prefix)
    accountant.check([fine_charge])
    start = len(accountant.charges)
    params = plan.describe()
    c, rho, w = plan.center, plan.radius, plan.count_weight
    accountant.charge(fine_charge.stage, fine_charge.budget, fine_charge.group)
    fine = centred_clip_and_noise(backend, column, c, rho, w, plan.group, plan.budget.epsilon, noise)
    half = fine.noise_quantile(w)
    # the estimate stays inside the bounds (post-processing): noise past them is no information
    estimate = min(max(fine.estimate, plan.lower), plan.upper)
    eps, delta = composed_cost(accountant.charges[start:])
    params.update({"noisy_person_count": round(fine.n_noisy, 1), "person_count_noise_scale": fine.scale / w,
                   "tail_flag": False})  # no tail assumption: the bounds are declared
    return MeanRelease(
        status=STATUS_OK,
        estimate=float(estimate),
        error_bar=float(half),
        error_level=ERROR_LEVEL,
        error_covers=(
            f"the exact mean over persons of each person's mean clamped into the declared bounds [{plan.lower:g}, "
            f"{plan.upper:g}], at 90%: the Laplace noise of the sum and the count. The bounds are declared, not "
            "checked: persons whose mean lies outside them count at the bound (no bar covers that)"
        ),
        noise_scale=fine.scale,
        epsilon=eps,
        delta=delta,
        parameters=params,
    )
