"""A distribution over public categories from each person's whole category shares.

Every record of a person counts: person ``i`` with ``M_i`` records, ``c_ij`` of them in category
``j`` (public list, OTHER last, as :mod:`dplib.distribution.batches`), contributes its share vector
``y_i = c_i / M_i`` (non-negative, summing to 1). The estimand is the person-level distribution
``mean_i y_i`` (every person with at least one record weighted equally). The release is

    S~ = sum_i q(y_i) + Lap(b)^k,  estimate = Pi(S~)

with ``q`` a fixed-point rounding (units of ``2^-30``, round half to even: exact integer sums, the
same in numpy and Spark) and ``Pi`` the l1-nearest simplex point (``max(v, 0) / sum``; scale-free,
so no separate count is needed). This is the add/remove analogue of a vector sum with l1 bound 1
(what a user would build from PipelineDP's VECTOR_SUM), and of the batch estimator P0 with the whole
batch instead of ``m`` draws: no record is dropped and no person with few records is left out.

Privacy: add/remove one person changes ``sum_i q(y_i)`` by ``q(y_i)``, whose l1 norm is at most
``1 + k 2^-31`` (each coordinate rounds by at most half a unit); Laplace with that sensitivity
(inflated for the float conversion) on every coordinate: epsilon-DP (pure). Nothing else reads
the data. ``docs/privacy/distribution.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy.stats import norm as normal_dist

from dplib.aggregates import exact_unit_sums
from dplib.budget import Accountant, Budget, Charge, composed_cost
from dplib.distribution.batches import category_index, category_names, check_categories
from dplib.distribution.private import ERROR_LEVEL, STATUS_OK, DistributionRelease
from dplib.distribution.simplex import bounded, project_to_simplex
from dplib.errors import InvalidParameterError
from dplib.groups import ALL_PERSONS, GroupRange, group_index, in_range
from dplib.mechanisms import NoiseSource, clamp_exact, inflate, laplace_mechanism
from dplib.seam import ShareAggregates

ALGORITHM = "person-share-distribution"
ALGORITHM_VERSION = "1"
STAGE_SHARES = "share sum"
#: Fixed-point bits of a share (units of 2^-SHARE_BITS).
SHARE_BITS = 30
SHARE_SCALE = float(2**SHARE_BITS)


def share_units(counts: np.ndarray) -> np.ndarray:
    """Per-person fixed-point shares: ``round_half_even(c_ij / M_i * 2^30)`` as int64, shape (n, k).

    ``counts`` (n, k) non-negative integers, every row with a positive total. The division and
    the power-of-two product are the same IEEE operations as the Spark plan's.
    """
    c = np.asarray(counts, dtype=np.float64)
    total = c.sum(axis=1, keepdims=True)
    return np.rint(c / total * SHARE_SCALE).astype(np.int64)


def share_sum_sensitivity(k: int) -> float:
    """l1 sensitivity of ``sum_i q(y_i)`` (persons units) under add/remove: ``1 + k 2^-31``."""
    return 1.0 + k / (2.0 * SHARE_SCALE)


class NumpyShares:
    """The numpy twin: per-person shares from record arrays.

    Parameters
    ----------
    person_ids : sequence (n_records,)
        Person of each record (None: the record is dropped).
    values : sequence (n_records,)
        The categorical column (compared as strings with the public list).
    categories : sequence of str
        Public category list (OTHER appended).
    salt_hex : str
        The run's salt (group indices as the Spark job computes them).
    """

    def __init__(self, person_ids: Sequence[object], values: Sequence[object], categories: Sequence[str], salt_hex: str):
        cats = check_categories(categories)
        self.k = len(cats) + 1
        if len(person_ids) != len(values):
            raise InvalidParameterError("person_ids and values must have the same length")
        keep = [i for i, p in enumerate(person_ids) if p is not None]
        pids = [str(person_ids[i]) for i in keep]
        idx = category_index([values[i] for i in keep], cats)
        persons = sorted(set(pids))
        pos = {p: i for i, p in enumerate(persons)}
        counts = np.zeros((len(persons), self.k), dtype=np.int64)
        for p, c in zip(pids, idx):
            counts[pos[p], int(c)] += 1
        self.counts = counts
        self.group = group_index(persons, salt_hex) if persons else np.zeros(0, dtype=np.int64)

    @classmethod
    def from_counts(cls, counts: np.ndarray, group: np.ndarray) -> "NumpyShares":
        """Over given per-person category counts (n, k) (every row total > 0) and group indices."""
        counts = np.asarray(counts, dtype=np.int64)
        if counts.ndim != 2 or counts.shape[1] < 2 or np.any(counts < 0) or np.any(counts.sum(axis=1) <= 0):
            raise InvalidParameterError("counts must be (n, k >= 2) non-negative integers, every row total > 0")
        obj = cls.__new__(cls)
        obj.k = counts.shape[1]
        obj.counts = counts
        obj.group = np.asarray(group, dtype=np.int64)
        return obj

    def share_sums(self, group: GroupRange) -> tuple[int, tuple[int, ...]]:
        rows = self.counts[in_range(self.group, group)]
        if rows.shape[0] == 0:
            return 0, tuple(0 for _ in range(self.k))
        return int(rows.shape[0]), tuple(exact_unit_sums(share_units(rows)))


@dataclass(frozen=True)
class SharePlan:
    """Public plan of the share-sum distribution.

    Parameters
    ----------
    budget : Budget
        (epsilon, delta); only epsilon is spent (pure DP).
    categories : sequence of str
        Public categories; ``k = len(categories) + 1`` (OTHER last).
    group : GroupRange
    """

    budget: Budget
    categories: tuple[str, ...]
    group: GroupRange = ALL_PERSONS

    def __post_init__(self) -> None:
        if not isinstance(self.budget, Budget):
            raise InvalidParameterError("budget must be a dplib.budget.Budget")
        object.__setattr__(self, "categories", check_categories(self.categories))

    @property
    def k(self) -> int:
        return len(self.categories) + 1

    def charges(self, prefix: str = "") -> list[Charge]:
        return [Charge(f"{prefix}{STAGE_SHARES}", Budget(self.budget.epsilon, 0.0), self.group)]

    def cost(self) -> Budget:
        eps, delta = composed_cost(self.charges())
        return Budget(eps, delta)

    def describe(self) -> dict:
        return {
            "estimator": "shares",
            "estimator_name": "Laplace on the sum of each person's category shares over all records (pure epsilon)",
            "categories": category_names(self.categories),
            "k": self.k,
            "short_persons": "none dropped: every person with a record counts, weighted equally",
            "stages": [{"stage": STAGE_SHARES, "epsilon": self.budget.epsilon, "delta": 0.0}],
        }


def share_error_bar(estimate: np.ndarray, scale: float, n_noisy: float, level: float = ERROR_LEVEL) -> np.ndarray:
    """Per-category half-width of a ``level`` interval of ``(e_j - p_j sum_l e_l) / n`` for iid
    Laplace(scale) ``e``, at the DP estimate ``p`` and DP count ``n`` (post-processing of DP and
    public values; no randomness).

    Normal approximation with the exact variance ``2 scale^2 ((1 - p_j)^2 + p_j^2 (k - 1))``: at
    90% the Laplace quantile ``scale ln 10`` (2.30 scale) and the normal one (2.33 scale) agree
    to 1.5% even when one term dominates, and sums of several are closer to normal.
    """
    p = np.asarray(estimate, dtype=np.float64)
    k = p.size
    sd = math.sqrt(2.0) * scale * np.sqrt((1.0 - p) ** 2 + p**2 * (k - 1))
    z = float(normal_dist.ppf(0.5 + level / 2.0))
    return z * sd / max(n_noisy, 1.0)


def share_distribution(
    backend: ShareAggregates,
    plan: SharePlan,
    noise: NoiseSource,
    accountant: Accountant | None = None,
    stage_prefix: str = "",
) -> DistributionRelease:
    """Private person-level distribution over the public categories from whole category shares.

    Parameters
    ----------
    backend : ShareAggregates
        Exact sums of per-person fixed-point shares, with the plan's ``k``.
    plan : SharePlan
    noise : NoiseSource
    accountant : Accountant, optional
        Checked, then charged before the data is read; default: limited to ``plan.budget``.

    Returns
    -------
    DistributionRelease
        Estimate of shape (k,) on the simplex; a per-category 90% error bar for the exact
        person-level distribution (the Laplace noise is the only error before the projection:
        every record of every person is read); ``noise_scale`` the Laplace scale in persons.

    Raises
    ------
    InvalidParameterError
        The backend's k differs from the plan's (before any charge).
    BudgetExceededError
        Before any charge, if the plan does not fit the accountant.

    Privacy
    -------
    epsilon-DP under add/remove one person (l1 sensitivity ``1 + k 2^-31``, see the module
    docstring); the projection, the count and the bar are post-processing.
    """
    if backend.k != plan.k:
        raise InvalidParameterError(f"the plan is for k={plan.k} categories; the shares have k={backend.k}")
    accountant = accountant if accountant is not None else Accountant(plan.budget)
    (charge,) = plan.charges(stage_prefix)
    accountant.check([charge])
    start = len(accountant.charges)
    accountant.charge(charge.stage, charge.budget, charge.group)
    _, units = backend.share_sums(plan.group)
    exact = clamp_exact(np.array([float(u) for u in units]) / SHARE_SCALE)
    noisy, scale = laplace_mechanism(exact, inflate(share_sum_sensitivity(plan.k)), charge.budget.epsilon, noise)
    del exact, units
    noisy = bounded(noisy)
    estimate = project_to_simplex(noisy)
    n_noisy = float(math.fsum(noisy))
    bar = share_error_bar(estimate, scale, n_noisy)
    eps, delta = composed_cost(accountant.charges[start:])
    params = plan.describe()
    params.update({"noisy_person_count": round(n_noisy, 1)})
    covers = (
        "the exact person-level distribution (mean over persons of each person's category shares over all "
        "their records), per category at 90%: the Laplace noise, the only error before the projection"
    )
    return DistributionRelease(
        STATUS_OK, estimate, category_names(plan.categories), bar, ERROR_LEVEL, covers, float(scale), eps, delta, params
    )
