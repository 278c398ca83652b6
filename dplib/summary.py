"""The person summary's sum: exact, order-independent and partially aggregable (numpy twin).

A person's mean of a value column is defined as follows (the Spark summarize pass,
:func:`spark_jobs.spark.summarize.summarize`, computes the same bits with native aggregates):

1. each usable value ``v`` (finite) is clamped to ``[-CLAMP, CLAMP]`` (``CLAMP`` = the largest
   double below ``2**98``, ~3.17e29) and mapped to the integer
   ``q(v) = sign(v) * floor(|v| * 2**SHIFT)`` (``SHIFT`` = 150): exact for ``|v| >= 2**-98``
   (~3.2e-30, every bit of a double that large sits above ``2**-150``); smaller magnitudes are
   truncated toward zero to a multiple of ``2**-150`` (~7e-46);
2. ``floor(|v| * 2**SHIFT) < 2**248`` is split into ``LIMBS`` = 8 limbs of ``LIMB_BITS`` = 31
   bits; the person's limb sums ``S_i = sum_v sign(v) * limb_i(v)`` are exact 64-bit integer
   sums (no overflow below 2**32 records per person) and ``sum_v q(v) = sum_i S_i 2**(31 i)``
   exactly. Integer sums do not depend on the order of the records, and Spark adds them with
   map-side partial aggregation (no ``collect_list``, no sort);
3. the exact integer ``N = sum_i S_i 2**(31 i)`` is written in its canonical digits: ``e_0 ..
   e_7`` in ``[0, 2**31)`` and the signed ``e_8 = floor(N / 2**248)`` (the carry chain
   ``t_i = S_i + c_(i-1)``, ``e_i = t_i mod 2**31``, ``c_i = floor(t_i / 2**31)``, ``e_8 = c_7``),
   and ``total = (((0.0 + e_8 2**98) + e_7 2**67) + ...) + e_0 2**(-150)`` in double arithmetic,
   high digit first (each ``float(e_i)`` is exact; multiplying by a power of two is exact); the
   mean is ``total / m``. The digits are a function of ``N`` alone, so any exact representation
   of the sum gives the same bits: the native aggregate (``spark_jobs/jvm``) keeps ``N`` in five
   base-``2**61`` slots in carry-save form (normalised once, when the total is read) instead of
   the eight limb sums.

So a person's mean depends only on the multiset of their own values, never on partitioning or
shuffle order (the last bits of an order-dependent mean could move a person across a histogram
bin edge and break the per-person sensitivity argument), and it is within a few units in the
last place of the exact mean of the clamped, truncated values.
"""

from __future__ import annotations

import math

import numpy as np

from dplib.errors import InvalidParameterError

#: Fixed-point position: a value contributes ``floor(|v| * 2**SHIFT)``.
SHIFT = 150
#: Limb width in bits and number of limbs (``LIMBS * LIMB_BITS = 248`` bits of magnitude).
LIMB_BITS = 31
LIMBS = 8
#: Values are clamped to ``[-CLAMP, CLAMP]``: the largest double below ``2**98``.
CLAMP = math.ldexp(2.0**53 - 1.0, 45)
#: Magnitudes below this contribute 0.
TINY = math.ldexp(1.0, -SHIFT)
_MASK = (1 << LIMB_BITS) - 1
#: Largest record cap ``max_records_per_person`` (the summarize pass keeps a person's capped
#: records with Spark's bounded ``min_by``, whose ``k`` is limited to this). The one declaration:
#: :func:`spark_jobs.spark.summarize.summarize` and the job's config read it here.
MAX_RECORDS_LIMIT = 100_000


def check_record_cap(cap):
    """The record cap ``max_records_per_person``: None (no cap) or an integer in
    ``[1, MAX_RECORDS_LIMIT]``, else :class:`InvalidParameterError`."""
    if cap is None:
        return None
    if isinstance(cap, bool) or not isinstance(cap, int) or not 1 <= cap <= MAX_RECORDS_LIMIT:
        raise InvalidParameterError(f"max_records_per_person must be an integer in [1, {MAX_RECORDS_LIMIT}], got {cap!r}")
    return cap


def limbs(values: np.ndarray) -> np.ndarray:
    """Signed limbs of each value, shape ``(n, LIMBS)`` int64 (module docstring, step 2).

    ``values`` must be finite (float64); they are clamped to ``[-CLAMP, CLAMP]`` here.
    """
    v = np.clip(np.asarray(values, dtype=np.float64), -CLAMP, CLAMP)
    if not np.all(np.isfinite(v)):
        raise ValueError("limbs() needs finite values")
    a = np.abs(v)
    big = a >= TINY
    f, x = np.frexp(np.where(big, a, 1.0))  # a = f 2**x, f in [0.5, 1): m = f 2**53 exactly
    m = (f * 2.0**53).astype(np.int64)
    sign = np.where(v < 0, -1, 1).astype(np.int64)
    out = np.zeros((v.size, LIMBS), dtype=np.int64)
    base = x.astype(np.int64) - 53 + SHIFT  # floor(|v| 2**SHIFT) = m shifted left by base
    for i in range(LIMBS):
        off = base - LIMB_BITS * i
        # bits that survive the mask only (no int64 overflow in the shift)
        left = np.left_shift(m & (_MASK >> np.clip(off, 0, LIMB_BITS)), np.clip(off, 0, LIMB_BITS))
        right = np.right_shift(m, np.clip(-off, 0, 63))
        limb = np.where(off >= 0, np.where(off < LIMB_BITS, left, 0), right) & _MASK
        out[:, i] = np.where(big, sign * limb, 0)
    return out


def canonical_digits(sums) -> list[int]:
    """Step 3: the canonical digits ``[e_0, ..., e_8]`` of ``N = sum_i sums[i] 2**(31 i)``
    (``e_0..e_7`` in ``[0, 2**31)``, ``e_8 = floor(N / 2**248)``), from the ``LIMBS`` limb sums."""
    n = sum(int(sums[i]) << (LIMB_BITS * i) for i in range(LIMBS))
    return [(n >> (LIMB_BITS * i)) & _MASK for i in range(LIMBS)] + [n >> (LIMB_BITS * LIMBS)]


def total_from_limb_sums(sums) -> float:
    """Step 3: the double ``total`` from the ``LIMBS`` exact limb sums (canonical digits, high
    digit first)."""
    t = 0.0
    for i, e in reversed(list(enumerate(canonical_digits(sums)))):
        t = t + float(e) * math.ldexp(1.0, LIMB_BITS * i - SHIFT)
    return t


def totals_from_limb_sums(sums: np.ndarray) -> np.ndarray:
    """:func:`total_from_limb_sums` of each row of ``sums`` (shape ``(n, LIMBS)`` int64, each
    below 2**32 records' worth: the int64 carry chain cannot overflow), shape ``(n,)``."""
    s = np.asarray(sums, dtype=np.int64)
    carry = np.zeros(s.shape[0], dtype=np.int64)
    digits = []
    for i in range(LIMBS):
        t = s[:, i] + carry
        digits.append(t & _MASK)  # two's complement: t mod 2**31
        carry = t >> LIMB_BITS  # arithmetic shift: floor(t / 2**31)
    digits.append(carry)
    total = np.zeros(s.shape[0], dtype=np.float64)
    for i in range(LIMBS, -1, -1):
        total = total + digits[i].astype(np.float64) * math.ldexp(1.0, LIMB_BITS * i - SHIFT)
    return total


def person_sums(values: np.ndarray, inverse: np.ndarray, n_persons: int) -> np.ndarray:
    """Per-person totals (step 3) of finite ``values`` grouped by ``inverse`` (person index of
    each value, in ``[0, n_persons)``); shape ``(n_persons,)`` float64 (0.0 for a person
    without values).

    Raises
    ------
    ValueError
        A non-finite value, or ``inverse`` of another length or outside ``[0, n_persons)``."""
    inv = np.asarray(inverse, dtype=np.int64)
    lim = limbs(values)
    if inv.shape != (lim.shape[0],) or (inv.size and (inv.min() < 0 or inv.max() >= n_persons)):
        raise ValueError("inverse must give a person index in [0, n_persons) for every value")
    sums = np.zeros((int(n_persons), LIMBS), dtype=np.int64)
    if inv.size:
        # exact int64 sums per person: sort by person, add each run (np.add.reduceat)
        order = np.argsort(inv, kind="stable")
        sorted_inv = inv[order]
        starts = np.flatnonzero(np.r_[True, sorted_inv[1:] != sorted_inv[:-1]])
        sums[sorted_inv[starts]] = np.add.reduceat(lim[order], starts, axis=0)
    return totals_from_limb_sums(sums)


def person_mean(values) -> float:
    """One person's mean of their usable values (non-finite dropped); NaN when none."""
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return math.nan
    return float(person_sums(v, np.zeros(v.size, dtype=np.int64), 1)[0] / v.size)
