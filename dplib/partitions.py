"""Private partition selection: which group keys of a ``group_by`` may be released at all.

When the group keys are not public, the set of keys present in the data is itself private (a key
held by one person reveals that person). :func:`select_partitions` releases a key only when its
noisy person count clears a threshold: **Laplace thresholding** (Korolova, Kenthapadi, Mishra,
Ntoulas 2009, "Releasing search queries and clicks privately", Thm 1; Wilson, Zhang, Lam,
Desfontaines, Simmons-Marengo, Gipson 2020, "Differentially private SQL with bounded user
contribution", Sec. 3.2, with the per-key budget split over the L0 bound as there).

Mechanism. Each person contributes to at most ``L0`` keys (``max_groups_per_person``, enforced
before counting by a keyed-hash choice that depends only on the person's records and the run's
salt). Per key, with ``eps' = epsilon / L0`` and ``delta' = delta / L0``: release the key iff
``c + Lap(1 / eps') > tau`` with ``tau = 1 + ln(1 / (2 delta')) / eps'``, where ``c`` is the
number of persons holding the key.

Privacy (add/remove one person, who holds at most L0 keys). A key whose count is ``c >= 1`` in
both neighbours: its count changes by at most 1, the Laplace count is eps'-DP and the decision is
post-processing. A key held only by the added person (count 1 vs absent): it is released with
probability ``P(1 + Lap(1/eps') > tau) = exp(-(tau - 1) eps') / 2 = delta'``. So each key's
decision is (eps', delta')-DP, keys the person does not hold are unchanged, and the person's
at most L0 keys compose to (epsilon, delta). Only the decisions leave: the noisy counts do not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Hashable, Mapping

import numpy as np

from dplib.budget import Accountant, Budget, Charge
from dplib.errors import InvalidParameterError
from dplib.mechanisms import NoiseSource

ALGORITHM = "laplace-partition-selection"
ALGORITHM_VERSION = "1"
STAGE_SELECTION = "partition selection"
#: Largest L0 bound accepted (a person in more groups keeps a keyed-hash choice of this many).
MAX_L0 = 10_000


def check_l0(l0) -> int:
    """Validate the L0 bound (groups per person): an integer in [1, MAX_L0]."""
    if isinstance(l0, bool) or not isinstance(l0, int) or not (1 <= l0 <= MAX_L0):
        raise InvalidParameterError(f"max_groups_per_person must be an integer in [1, {MAX_L0}], got {l0!r}")
    return l0


@dataclass(frozen=True)
class PartitionSelectionPlan:
    """Laplace thresholding over keys, each person in at most ``l0`` keys.

    Parameters
    ----------
    budget : Budget
        The selection's whole (epsilon, delta); delta must be > 0 (no key could be released
        under pure DP without a public key set).
    l0 : int
        The bound on keys per person.

    Raises
    ------
    InvalidParameterError
        delta = 0, or a bad ``l0``.
    """

    budget: Budget
    l0: int

    def __post_init__(self) -> None:
        check_l0(self.l0)
        if self.budget.delta <= 0:
            raise InvalidParameterError(
                "private group selection needs delta > 0 (budget.delta); with delta = 0 list the keys "
                "(groups: {keys: [...]})"
            )

    @property
    def key_epsilon(self) -> float:
        return self.budget.epsilon / self.l0

    @property
    def key_delta(self) -> float:
        return self.budget.delta / self.l0

    @property
    def scale(self) -> float:
        """Laplace scale of each key's count (sensitivity 1 per key)."""
        return 1.0 / self.key_epsilon

    @property
    def threshold(self) -> float:
        """``tau = 1 + ln(1 / (2 delta')) / eps'``: a key of one person passes w.p. ``delta'``."""
        return 1.0 + math.log(1.0 / (2.0 * self.key_delta)) / self.key_epsilon

    def release_probability(self, count: int) -> float:
        """Probability that a key held by ``count`` persons is released (public closed form)."""
        x = self.threshold - count
        return 0.5 * math.exp(-x / self.scale) if x >= 0 else 1.0 - 0.5 * math.exp(x / self.scale)

    def charges(self, prefix: str = "") -> list[Charge]:
        return [Charge(prefix + STAGE_SELECTION, self.budget)]

    def describe(self) -> dict:
        return {
            "selection": ALGORITHM,
            "selection_epsilon": self.budget.epsilon,
            "selection_delta": self.budget.delta,
            "selection_threshold": self.threshold,
            "selection_scale": self.scale,
        }


def select_partitions(
    counts: Mapping[Hashable, int],
    plan: PartitionSelectionPlan,
    noise: NoiseSource,
    accountant: Accountant | None = None,
    stage_prefix: str = "",
) -> list:
    """The keys released by Laplace thresholding, in the order of ``counts``.

    Parameters
    ----------
    counts : mapping key -> int
        Exact number of persons per key (after the L0 bound), keys with at least one person.
        Read only here; never logged.
    plan : PartitionSelectionPlan
    noise : NoiseSource
    accountant : Accountant, optional
        Charged ``plan.budget`` before any noise is drawn.

    Returns
    -------
    list
        The released keys (a DP output).

    Privacy
    -------
    (epsilon, delta)-DP under add/remove of one person holding at most ``plan.l0`` keys (module
    docstring).
    """
    if accountant is not None:
        accountant.charge(stage_prefix + STAGE_SELECTION, plan.budget)
    keys = list(counts)
    if not keys:
        return []
    exact = np.array([float(counts[k]) for k in keys])
    if np.any(exact < 0) or not np.all(np.isfinite(exact)):
        raise InvalidParameterError("person counts must be finite and >= 0")
    noisy = noise.add_laplace(exact, plan.scale)
    return [k for k, v in zip(keys, noisy) if v > plan.threshold]
