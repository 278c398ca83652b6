"""Array-level entry points: run the person-level mean on numpy arrays, no Spark needed."""

from __future__ import annotations

import unicodedata
from typing import Sequence

import numpy as np

from dplib.aggregates import NumpyAggregates
from dplib.budget import Accountant, Budget
from dplib.errors import InputDataError, InvalidParameterError
from dplib.groups import group_index, new_salt
from dplib.mean.scale_free import ScaleFreeMeanPlan, scale_free_person_mean
from dplib.mean.univariate import MeanRelease, UnivariateMeanPlan, univariate_person_mean
from dplib.mechanisms import NoiseSource, production_noise
from dplib.summary import person_sums


#: Id values treated as missing, as the Spark job's default ``privacy_unit.null_values``.
NULL_IDS = ("", "NA", "null", "NULL", "None")


def normalize_id(pid: object) -> str:
    """The normalised form of a person id (config ``privacy_unit.normalize``): Unicode NFC, case
    folded, surrounding whitespace of any kind stripped. The same function runs in the Spark job."""
    return unicodedata.normalize("NFC", str(pid)).casefold().strip()


def _is_person(pid: object, null_values: Sequence[str]) -> bool:
    if pid is None or (isinstance(pid, float) and not np.isfinite(pid)):
        return False
    # spaces only, as Spark's trim() in the job: a tab or a non-breaking space is part of the id in both
    return str(pid).strip(" ") not in null_values


def person_means(
    values: np.ndarray, person_ids: Sequence[object], m_min: int = 1, null_values: Sequence[str] = NULL_IDS,
    normalize: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Reduce records to one mean per person (docs/privacy/person_level_mean.md, "From records to one
    item per person").

    Parameters
    ----------
    values : ndarray, shape (n_records,)
        Record values. NaN / +-inf records are dropped before averaging.
    person_ids : sequence, length n_records
        The privacy unit of each record. None, NaN and ids equal after trimming to one of
        ``null_values`` are dropped (no person to attribute them to), as in the Spark job.
    m_min : int, default 1
        Persons with fewer usable records are dropped.
    normalize : bool, default False
        Normalise the kept ids with :func:`normalize_id` (as the job's ``privacy_unit.normalize``):
        spelling variants of one id become one person. Missing ids are decided on the raw id first.

    Returns
    -------
    (ids of shape (n_persons,), means of shape (n_persons,)): sorted ids; each mean is
    :mod:`dplib.summary`'s exact sum (values clamped to ``+-CLAMP`` ~3.17e29) over the count,
    the same bits as the Spark summarize pass.

    Raises
    ------
    InputDataError
        If the lengths differ.
    """
    vals = np.asarray(values, dtype=np.float64)
    ids = np.asarray(list(person_ids), dtype=object)
    if vals.shape != ids.shape:
        raise InputDataError("values and person_ids must have the same length")
    keep = np.isfinite(vals) & np.array([_is_person(pid, null_values) for pid in ids], dtype=bool)
    vals, ids = vals[keep], ids[keep].astype(str)
    if normalize:
        ids = np.array([normalize_id(p) for p in ids], dtype=object).astype(str)
    uniq, inverse, counts = np.unique(ids, return_inverse=True, return_counts=True)
    # the Spark summarize pass's exact fixed-point sum, bit for bit (values clamped to +-CLAMP)
    means = person_sums(vals, inverse, uniq.size) / np.maximum(counts, 1)
    ok = counts >= int(m_min)
    return uniq[ok], means[ok]


def person_level_mean(
    values: np.ndarray,
    person_ids: Sequence[object],
    *,
    epsilon: float,
    delta: float = 1e-6,
    scale: float | None = None,
    k: float | None = None,
    range_bound: float | None = None,
    budget_mode: str = "sequential",
    m_min: int = 1,
    noise: NoiseSource | None = None,
    salt_hex: str | None = None,
) -> MeanRelease:
    """Private mean over persons of each person's mean, from record-level arrays.

    Parameters
    ----------
    values : ndarray, shape (n_records,)
        One value per record; non-finite records are dropped.
    person_ids : sequence, length n_records
        Privacy unit of each record.
    epsilon, delta : float
        Budget of this release (add/remove one person). With a declared ``scale``, delta = 0
        needs ``range_bound``; the scale-free estimator at delta = 0 uses a public exponent range.
    scale : float, optional
        None (default): the scale-free estimator (:mod:`dplib.mean.scale_free`) finds range,
        centre and radius privately. A number: the declared public scale of the person means,
        data units, for the paper's estimator (:mod:`dplib.mean.univariate`).
    k, range_bound, budget_mode, m_min :
        See :class:`~dplib.mean.univariate.UnivariateMeanPlan` (``range_bound`` and
        ``budget_mode`` only with a scale; the scale-free estimator is always sequential).
    noise : NoiseSource, optional
        Default: the secure OpenDP source. Pass ``SeededNoise(seed)`` only in tests.
    salt_hex : str, optional
        Salt of the group hash; default a fresh CSPRNG salt. Never reuse a salt across releases.

    Returns
    -------
    MeanRelease

    Privacy
    -------
    (epsilon, delta)-DP under add/remove of one person's records (see
    :func:`~dplib.mean.scale_free.scale_free_person_mean` and
    :func:`~dplib.mean.univariate.univariate_person_mean`; docs/privacy/person_level_mean.md).

    References
    ----------
    Agarwal et al. 2024, Algorithm 1, Lemma 3.12, Theorem 3.14 (Sections 3.3-3.4).
    """
    budget = Budget(epsilon, delta)
    plan: UnivariateMeanPlan | ScaleFreeMeanPlan
    if scale is None:
        if budget_mode != "sequential":
            raise InvalidParameterError(
                "the scale-free mean composes its stages sequentially on all persons; "
                f"budget_mode={budget_mode!r} applies only with a declared scale"
            )
        plan = ScaleFreeMeanPlan(budget=budget, k=k)
    else:
        plan = UnivariateMeanPlan(
            budget=budget, scale=scale, k=4.0 if k is None else k, m=1, range_bound=range_bound, budget_mode=budget_mode  # type: ignore[arg-type]
        )
    ids, means = person_means(values, person_ids, m_min=m_min)
    salt = salt_hex if salt_hex is not None else new_salt()
    backend = NumpyAggregates({"value": means}, group_index(ids, salt))
    noise = noise if noise is not None else production_noise()
    if isinstance(plan, ScaleFreeMeanPlan):
        return scale_free_person_mean(backend, "value", plan, noise, Accountant(budget))
    return univariate_person_mean(backend, "value", plan, noise, Accountant(budget))
