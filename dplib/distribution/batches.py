"""Per-person batches of a categorical column, and their exact sufficient statistics.

A person's *batch* is exactly ``m`` of their records, drawn uniformly without replacement, read
through a **public, fixed** category list: category ``j`` (0-based) is ``categories[j]``; a value
not in the list, or null, is ``OTHER``, the last index ``k - 1`` (``k = len(categories) + 1``).
The batch's count vector ``c_i`` (shape ``(k,)``, integers, ``sum(c_i) == m``) is all the
estimators see (the batch model of Kamath, Majid, Moitra, Mouzakis, Ullman; docs/privacy/distribution.md,
"From records to one count vector per person").

Sampling rule (both backends)
-----------------------------
Each record gets a *label*: a string fixed by the record alone (Spark: the JSON of the record's
columns; the caller chooses the columns; the job's default is the category column alone).
Records with the same person and label are numbered ``j = 0, 1, ...``; which of them gets which
number does not matter, because the batch reads only their category, which the label fixes (with
every column as the label they are identical records; with the category alone, records of one
category, interchangeable for the count vector). The
record's order key is ``SHA-256(salt || person || "\\x1f" || SHA-256(label) || ":" || j)`` with
the run's secret 256-bit salt; the person keeps the ``m`` records of smallest key. The string
hashed is unambiguous (the label hash has a fixed length, ``j`` is the trailing digits, the salt
has a fixed length), so distinct records hash distinct strings.

Why this is uniform and ignores the category: for any fixed records, the keys of one person's
records are (modelling SHA-256 keyed by a secret random salt as a random function) independent
uniform values, whatever the labels say, so their order is a uniformly random permutation and
the kept ``m`` records are a uniform subset; the category may be part of the label because a
label only *names* the record, it never orders it. Three rules that look similar are wrong:
ordering by a data field ("first m by time" correlates with the category); hashing
the content **without** the duplicate number ``j`` (exact duplicates tie and are kept or dropped
together, which under-represents categories that occur in duplicated rows: a person with records
{A, A, B} and m = 1 would give A with probability 1/2, not 2/3); and numbering records by their
position in a file or partition (``monotonically_increasing_id``), which depends on how the data
is laid out and so is not a function of the person's own records. The key is also a function of
the person's own records and the salt only, so adding or removing another person changes no
one's batch (add/remove neighbours change one batch).

Keys are compared as two 60-bit integers (the first 30 hex digits of the digest) and then by the
category index: two of one person's M records tie on 120 bits with probability below
M^2 * 2^-121, the only event in which the category could break a tie, provided the label
includes the category (the Spark plan always adds it: two records with one label and different
categories would otherwise share a key).

Persons with fewer than ``m`` records (policy ``drop``, the only one implemented): they have no
batch and are left out of every statistic, person by person. Under add/remove neighbouring
(docs/privacy/distribution.md) this is a per-person rule (a person's presence still changes at most one batch), and
the number of persons is never treated as public, so dropping is exact. The estimand is then the
distribution of the persons with at least ``m`` records. Padding with a filler category
(:mod:`dplib.fixed_n`) is only needed when n must be public (replace-one proofs, P3); it is not implemented here.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import numpy as np

from dplib.aggregates import exact_unit_sums
from dplib.errors import InvalidParameterError
from dplib.groups import GroupRange, group_index, in_range, is_salt

#: Name of the catch-all category, always the last index. Reserved: a category list may not use it.
OTHER = "OTHER"
#: Separator between the person id and the label hash in the record key.
KEY_SEPARATOR = "\x1f"
#: Hex digits per integer of the record order key (60 bits each, two integers).
KEY_HEX_DIGITS = 15
#: Fixed-point bits of clipped deviations (as :data:`dplib.aggregates.QUANT_BITS`).
QUANT_BITS = 30
QUANT_SCALE = float(2**QUANT_BITS)
#: Policies for persons with fewer than m records.
SHORT_PERSON_POLICIES = ("drop",)


def check_categories(categories: Sequence[str]) -> tuple[str, ...]:
    """Validate a public category list; returns it as a tuple of str.

    Raises
    ------
    InvalidParameterError
        If ``categories`` is empty, not a sequence of non-empty strings, has a repeated entry,
        or uses the reserved name ``OTHER``.
    """
    if isinstance(categories, (str, bytes)) or not isinstance(categories, Sequence):
        raise InvalidParameterError(f"categories must be a list of strings, got {type(categories).__name__}")
    cats = tuple(categories)
    if not cats:
        raise InvalidParameterError("categories must list at least one category (OTHER is added automatically)")
    bad = [c for c in cats if not isinstance(c, str) or c == ""]
    if bad:
        raise InvalidParameterError(f"categories must be non-empty strings, got {bad[:5]!r}")
    dup = sorted({c for c in cats if cats.count(c) > 1})
    if dup:
        raise InvalidParameterError(f"categories must be distinct; repeated: {dup[:10]!r}")
    if OTHER in cats:
        raise InvalidParameterError(f"categories may not contain {OTHER!r}: it is reserved for unknown values")
    return cats


def check_batch_size(m: object) -> int:
    """Validate the batch size ``m`` (draws per person): an integer >= 1.

    Raises
    ------
    InvalidParameterError
    """
    if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or int(m) < 1:
        raise InvalidParameterError(f"m (draws per person) must be an integer >= 1, got {m!r}")
    return int(m)


def category_names(categories: Sequence[str]) -> list[str]:
    """The ``k`` names of the estimate's coordinates: the categories, then ``OTHER``."""
    return list(check_categories(categories)) + [OTHER]


def numeric_categories(categories: Sequence[str], integer: bool) -> list[tuple[float, int]]:
    """The listed categories as the numbers a numeric category column is matched against, with
    their index: ``[(value, index), ...]``. ``integer``: the column is an integer type, so each
    category must be an integer written without a decimal point (``"3"``, ``"-2"``); otherwise
    each must be a finite number (``"3"``, ``"3.0"`` and ``"2.5"`` all work). A value matches the
    category whose number it equals (``3.0`` matches ``"3"``), record by record, never by scanning.

    Raises
    ------
    InvalidParameterError
        Categories that cannot be such numbers (named, with the expected format), or two
        categories that are the same number (e.g. ``"3"`` and ``"3.0"``).
    """
    cats = check_categories(categories)
    out: list[tuple[float, int]] = []
    bad: list[str] = []
    seen: dict[float, str] = {}
    for i, c in enumerate(cats):
        if c != c.strip():  # matched by number, shown as written: no hidden spaces in a label
            bad.append(c)
            continue
        try:
            v = float(int(c, 10)) if integer else float(c)
        except ValueError:
            bad.append(c)
            continue
        if not math.isfinite(v) or (integer and abs(v) >= 2.0**63):
            bad.append(c)
            continue
        v = v + 0.0  # -0.0 and 0.0 are one category
        if v in seen:
            raise InvalidParameterError(f"categories {seen[v]!r} and {c!r} are the same number: list it once")
        seen[v] = c
        out.append((v, i))
    if bad:
        want = ("integers such as '3' or '-2', without spaces" if integer
                else "finite numbers such as '3' or '2.5', without spaces")
        raise InvalidParameterError(f"categories {bad[:5]} cannot match a numeric column: expected {want}")
    return out


def category_index(values: Iterable[object], categories: Sequence[str]) -> np.ndarray:
    """Index of each value in the public list, ``k - 1`` (OTHER) for a value not in the list or a
    missing one (None, NaN). A floating value matches the category that is the same number
    (``3.0`` matches ``"3"`` and ``"3.0"``; the Spark plan matches a floating column the same way);
    any other value matches by its text (``str(value)``). Shape ``(n_records,)``, int64."""
    cats = check_categories(categories)
    lookup = {c: i for i, c in enumerate(cats)}
    numbers: dict[float, int] = {}
    for i, c in enumerate(cats):
        try:
            num = float(c)
        except ValueError:
            continue
        if math.isfinite(num):
            numbers.setdefault(num + 0.0, i)
    other = len(cats)
    out = []
    for v in values:
        if v is None or (isinstance(v, (float, np.floating)) and math.isnan(v)):
            out.append(other)
        elif isinstance(v, (float, np.floating)):
            out.append(numbers.get(float(v) + 0.0, other))
        else:
            out.append(lookup.get(str(v), other))
    return np.asarray(out, dtype=np.int64)


def record_keys(person_ids: Sequence[object], labels: Sequence[str], salt_hex: str) -> np.ndarray:
    """Order keys of records, shape ``(n_records, 2)`` int64 (the reference of the Spark plan).

    ``labels[r]`` names record ``r`` (see the module docstring); duplicates of (person, label)
    are numbered in order of appearance, which is immaterial because they are identical.
    """
    if not is_salt(salt_hex):
        raise InvalidParameterError("salt_hex must be 64 lowercase hex characters")
    seen: dict[tuple[str, str], int] = {}
    out = np.empty((len(labels), 2), dtype=np.int64)
    for r, (pid, label) in enumerate(zip(person_ids, labels)):
        pid, label_hash = str(pid), hashlib.sha256(label.encode("utf-8")).hexdigest()
        j = seen.get((pid, label_hash), 0)
        seen[(pid, label_hash)] = j + 1
        digest = hashlib.sha256(f"{salt_hex}{pid}{KEY_SEPARATOR}{label_hash}:{j}".encode("utf-8")).hexdigest()
        out[r, 0] = int(digest[:KEY_HEX_DIGITS], 16)
        out[r, 1] = int(digest[KEY_HEX_DIGITS : 2 * KEY_HEX_DIGITS], 16)
    return out


@dataclass(frozen=True)
class BatchMoments:
    """Exact one-pass sufficient statistics of the count vectors of one group of persons.

    Attributes
    ----------
    n : int
        Persons (batches).
    sum_counts : tuple of k int
        ``sum_i c_i``.
    sum_outer : tuple of k tuples of k int
        ``sum_i c_i c_i^T``. Python integers: exact, no overflow.
    """

    n: int
    sum_counts: tuple[int, ...]
    sum_outer: tuple[tuple[int, ...], ...]


def check_clip(center: np.ndarray, radius: float, norm: str, k: int) -> np.ndarray:
    """Validate clip arguments; returns the centre as float64 of shape ``(k,)``."""
    c = np.asarray(center, dtype=np.float64)
    if c.shape != (k,) or not np.all(np.isfinite(c)):
        raise InvalidParameterError(f"center must be {k} finite numbers, got shape {c.shape}")
    if not (isinstance(radius, (int, float)) and math.isfinite(radius) and radius > 0):
        raise InvalidParameterError(f"radius must be finite and > 0, got {radius!r}")
    if norm not in ("l1", "l2"):
        raise InvalidParameterError(f"norm must be 'l1' or 'l2', got {norm!r}")
    return c


def clipped_units(counts: np.ndarray, m: int, center: np.ndarray, radius: float, norm: str) -> np.ndarray:
    """Fixed-point clipped deviations of per-person distributions, shape ``(n, k)`` int64.

    ``y_i = c_i / m``; ``dev = y_i - center``; the norm of ``dev`` is summed left to right (l1:
    ``|dev_j|``; l2: ``dev_j^2`` then sqrt); ``dev`` is scaled by ``radius / norm`` when
    ``norm > radius``; each coordinate becomes ``rint(dev_j / radius * 2**30)``. Every operation
    is one IEEE-754 double operation in a fixed order, so the Spark backend gives the same
    integers. One person's term has, in data units, l1 norm at most
    ``radius * (1 + k / 2**31)`` (after float rounding of ~k ulp, absorbed by
    :func:`dplib.mechanisms.inflate`) and l2 norm at most ``radius * (1 + sqrt(k) / 2**31)``.
    """
    counts = np.asarray(counts)
    dev = counts.astype(np.float64) / float(m) - center[None, :]
    if norm == "l1":
        size = np.cumsum(np.abs(dev), axis=1)[:, -1]  # sequential sum, as Spark's aggregate()
    else:
        size = np.sqrt(np.cumsum(dev * dev, axis=1)[:, -1])
    factor = np.where(size > radius, radius / np.where(size > 0, size, 1.0), 1.0)
    clipped = dev * factor[:, None]
    return np.rint(clipped / radius * QUANT_SCALE).astype(np.int64)


def clipped_sum_l1_sensitivity(radius: float, k: int) -> float:
    """l1 sensitivity (add/remove) of the fixed-point l1-clipped sum in data units, before
    :func:`dplib.mechanisms.inflate`: ``radius * (1 + k / 2**31)`` (half a unit per coordinate)."""
    return float(radius) * (1.0 + k / 2.0 ** (QUANT_BITS + 1))


def clipped_sum_l2_sensitivity(radius: float, k: int) -> float:
    """l2 sensitivity (add/remove) of the fixed-point l2-clipped sum in data units, before
    :func:`dplib.mechanisms.inflate`: ``radius * (1 + sqrt(k) / 2**31)``."""
    return float(radius) * (1.0 + math.sqrt(k) / 2.0 ** (QUANT_BITS + 1))


class NumpyBatches:
    """The numpy twin of the Spark batch plan: the same batches and statistics from arrays.

    Parameters
    ----------
    person_ids : sequence, shape (n_records,)
        Person of each record (None: no person; the record is dropped).
    values : sequence, shape (n_records,)
        The categorical column.
    labels : sequence of str, shape (n_records,)
        Each record's label (Spark: ``to_json(struct(<label columns>))``).
    categories : sequence of str
        The public category list (OTHER is appended).
    m : int
        Draws per person.
    salt_hex : str
        The run's salt (64 hex characters).

    Attributes
    ----------
    counts : ndarray (n, k) int64
        One count vector per person with at least m records, rows sum to m.
    group : ndarray (n,) int64
        Group index of each such person (:func:`dplib.groups.group_index`).

    Raises
    ------
    InvalidParameterError
        Bad categories, m, salt, or arrays of different lengths.
    """

    def __init__(
        self,
        person_ids: Sequence[object],
        values: Sequence[object],
        labels: Sequence[str],
        categories: Sequence[str],
        m: int,
        salt_hex: str,
    ) -> None:
        cats = check_categories(categories)
        self.m = check_batch_size(m)
        self.k = len(cats) + 1
        if not (len(person_ids) == len(values) == len(labels)):
            raise InvalidParameterError("person_ids, values and labels must have the same length")
        keep = [i for i, p in enumerate(person_ids) if p is not None]
        pids = [str(person_ids[i]) for i in keep]
        idx = category_index([values[i] for i in keep], cats)
        keys = record_keys(pids, [labels[i] for i in keep], salt_hex)
        by_person: dict[str, list[tuple[int, int, int]]] = {}
        for p, (k1, k2), c in zip(pids, keys, idx):
            by_person.setdefault(p, []).append((int(k1), int(k2), int(c)))
        persons, rows = [], []
        for p, recs in by_person.items():
            if len(recs) < self.m:
                continue  # policy "drop"
            recs.sort()
            row = np.zeros(self.k, dtype=np.int64)
            for _, _, c in recs[: self.m]:
                row[c] += 1
            persons.append(p)
            rows.append(row)
        self.counts = np.array(rows, dtype=np.int64).reshape(len(rows), self.k)
        self.group = group_index(persons, salt_hex) if persons else np.zeros(0, dtype=np.int64)
        self._persons = persons

    @classmethod
    def from_counts(cls, counts: np.ndarray, group: np.ndarray, m: int) -> "NumpyBatches":
        """A backend over given count vectors (tests, simulations): ``counts`` (n, k) with rows
        summing to ``m``; ``group`` (n,) group indices in ``[0, 2**32)``."""
        counts = np.asarray(counts, dtype=np.int64)
        m = check_batch_size(m)
        if counts.ndim != 2 or counts.shape[1] < 2 or np.any(counts < 0) or np.any(counts.sum(axis=1) != m):
            raise InvalidParameterError("counts must be (n, k >= 2) non-negative integers with rows summing to m")
        obj = cls.__new__(cls)
        obj.m, obj.k = m, counts.shape[1]
        obj.counts = counts
        obj.group = np.asarray(group, dtype=np.int64)
        obj._persons = []
        return obj

    def per_person(self) -> Mapping[str, np.ndarray]:
        """Count vector of each person id (tests only; never for a release)."""
        return dict(zip(self._persons, self.counts))

    def _rows(self, group: GroupRange) -> np.ndarray:
        return self.counts[in_range(self.group, group)]

    def sums(self, group: GroupRange) -> tuple[int, tuple[int, ...]]:
        c = self._rows(group)
        return int(c.shape[0]), tuple(exact_unit_sums(c))

    def moments(self, group: GroupRange) -> BatchMoments:
        c = self._rows(group)
        n = int(c.shape[0])
        sum_counts = tuple(exact_unit_sums(c))
        outer = [[0] * self.k for _ in range(self.k)]
        for a in range(self.k):
            for b in range(a, self.k):
                (v,) = exact_unit_sums((c[:, a] * c[:, b])[:, None])
                outer[a][b] = outer[b][a] = int(v)
        return BatchMoments(n, sum_counts, tuple(tuple(r) for r in outer))

    def histogram(self, group: GroupRange) -> dict[tuple[int, ...], int]:
        return _histogram(self._rows(group))

    def ranked_histogram(self, group: GroupRange, n0: int) -> dict[tuple[int, ...], int]:
        if isinstance(n0, bool) or not isinstance(n0, (int, np.integer)) or n0 < 1:
            raise InvalidParameterError(f"n0 must be an integer >= 1, got {n0!r}")
        mask = in_range(self.group, group)
        c, g = self.counts[mask], self.group[mask]
        order = np.lexsort(tuple(c[:, j] for j in range(self.k - 1, -1, -1)) + (g,))
        return _histogram(c[order[: int(n0)]])

    def clipped_sum(self, center: np.ndarray, radius: float, norm: str, group: GroupRange) -> tuple[np.ndarray, int]:
        center = check_clip(center, radius, norm, self.k)
        c = self._rows(group)
        units = clipped_units(c, self.m, center, float(radius), norm)
        total = exact_unit_sums(units)
        return np.array([float(t) for t in total]) * (float(radius) / QUANT_SCALE), int(c.shape[0])


def _histogram(c: np.ndarray) -> dict[tuple[int, ...], int]:
    """Persons per distinct row of ``c`` (n, k)."""
    if c.shape[0] == 0:
        return {}
    uniq, cnt = np.unique(c, axis=0, return_counts=True)
    return {tuple(int(x) for x in u): int(n) for u, n in zip(uniq, cnt)}


def moments_from_histogram(hist: Mapping[tuple[int, ...], int], k: int) -> BatchMoments:
    """n, sum c and sum c c^T from a histogram of distinct count vectors (exact integers)."""
    n = sum(hist.values())
    s = [0] * k
    o = [[0] * k for _ in range(k)]
    for vec, w in hist.items():
        for a in range(k):
            s[a] += w * vec[a]
            for b in range(k):
                o[a][b] += w * vec[a] * vec[b]
    return BatchMoments(int(n), tuple(s), tuple(tuple(r) for r in o))
