"""Disjoint groups of persons from fixed ranges of a keyed hash.

A person's group index is ``h = int(SHA-256(salt_hex || str(person_id))[:8 hex], 16)``, an integer
in ``[0, 2**32)``. ``salt_hex`` is 64 hex characters drawn per run from the OS CSPRNG, so the
concatenation is unambiguous. A stage reads the persons whose ``h`` falls in a fixed range
``[floor(lo * 2**32), floor(hi * 2**32))``. A person's group depends only on (salt, id): adding
or removing one person moves nobody else, which is what makes parallel composition across
ranges valid under add/remove neighbouring (docs/privacy/person_level_mean.md). Ranks, ``ntile`` or equal-size splits
would not be.

Spark computes the same function natively (``sha2(concat(salt, id), 256)``), see
``spark_jobs.spark.summarize``; :func:`group_index` is the numpy/hashlib reference.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from typing import Iterable

import numpy as np

from dplib.errors import InvalidParameterError

#: Size of the hash space of group indices.
HASH_SPACE = 2**32
#: Number of hex characters of the SHA-256 digest used for the group index.
HASH_HEX_CHARS = 8


@dataclass(frozen=True)
class GroupRange:
    """A fixed range ``[lo, hi)`` of the hash space, as fractions in [0, 1].

    Raises
    ------
    InvalidParameterError
        If not ``0 <= lo < hi <= 1``.
    """

    lo: float
    hi: float

    def __post_init__(self) -> None:
        if not (0.0 <= self.lo < self.hi <= 1.0):
            raise InvalidParameterError(
                f"a group range needs 0 <= lo < hi <= 1, got [{self.lo!r}, {self.hi!r})"
            )

    @property
    def bounds(self) -> tuple[int, int]:
        """Integer bounds ``[lo_int, hi_int)`` on the group index."""
        return int(self.lo * HASH_SPACE), int(self.hi * HASH_SPACE)

    @property
    def fraction(self) -> float:
        """Expected fraction of persons in the range (public; the realised one is private)."""
        return self.hi - self.lo

    def split(self, fractions: Iterable[float]) -> list["GroupRange"]:
        """Cut this range into consecutive sub-ranges with the given relative sizes."""
        fr = [float(f) for f in fractions]
        if not fr or any(f <= 0 for f in fr):
            raise InvalidParameterError(f"split fractions must be positive, got {fr!r}")
        total = sum(fr)
        out, start = [], self.lo
        for i, f in enumerate(fr):
            end = self.hi if i == len(fr) - 1 else start + (self.hi - self.lo) * f / total
            out.append(GroupRange(start, end))
            start = end
        return out

    def __str__(self) -> str:
        return f"[{self.lo:.4g}, {self.hi:.4g})"


#: The whole hash space: every person.
ALL_PERSONS = GroupRange(0.0, 1.0)


def new_salt() -> str:
    """A fresh 256-bit salt from the OS CSPRNG, as 64 hex characters. Never log or store it."""
    return secrets.token_hex(32)


def derive_salt(salt_hex: str, label: str) -> str:
    """A salt for one use of the run's salt: ``SHA-256(salt || ":derive:" || label)`` as 64 hex
    characters. Statistics that each need their own random order (BHS23) derive one per
    statistic name, so their orders are independent (as functions of a secret salt)."""
    if not is_salt(salt_hex):
        raise InvalidParameterError("salt_hex must be 64 lowercase hex characters")
    return hashlib.sha256((salt_hex + ":derive:" + str(label)).encode("utf-8")).hexdigest()


def is_salt(salt_hex: object) -> bool:
    """True if ``salt_hex`` is 64 lowercase hex characters (the form :func:`new_salt` returns)."""
    return isinstance(salt_hex, str) and len(salt_hex) == 64 and all(ch in "0123456789abcdef" for ch in salt_hex)


def group_index(person_ids: Iterable[object], salt_hex: str) -> np.ndarray:
    """Group indices of person ids, shape ``(n,)``, dtype int64, values in ``[0, 2**32)``.

    The reference implementation of the keyed hash that Spark computes in
    ``spark_jobs.spark.summarize``: ``int(sha256((salt_hex + str(id)).encode()).hexdigest()[:8], 16)``.
    """
    if not is_salt(salt_hex):
        raise InvalidParameterError("salt_hex must be 64 lowercase hex characters")
    out = [
        int(hashlib.sha256((salt_hex + str(pid)).encode("utf-8")).hexdigest()[:HASH_HEX_CHARS], 16)
        for pid in person_ids
    ]
    return np.asarray(out, dtype=np.int64)


def in_range(index: np.ndarray, group: GroupRange) -> np.ndarray:
    """Boolean mask of the group indices that fall in ``group``."""
    lo, hi = group.bounds
    return (index >= lo) & (index < hi)
