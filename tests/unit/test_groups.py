"""Keyed-hash group indices and fixed hash ranges."""

from __future__ import annotations

import hashlib
import math
from fractions import Fraction

import numpy as np
import pytest

from dplib.errors import InvalidParameterError
from dplib.groups import ALL_PERSONS, GroupRange, group_index, in_range, new_salt

SALT = "0123456789abcdef" * 4  # 64 hex characters


def _reference_index(salt_hex: str, pid: object) -> int:
    digest = hashlib.sha256((salt_hex + str(pid)).encode("utf-8")).hexdigest()
    return int(digest[:8], 16)


def test_group_index_matches_hand_written_sha256():
    ids = [0, 1, 42, -7, 10**12, "alice", "bob", "ünïcode", "", "1.5", 3.25]
    got = group_index(ids, SALT)
    assert got.dtype == np.int64
    assert got.shape == (len(ids),)
    assert [int(v) for v in got] == [_reference_index(SALT, pid) for pid in ids]


def test_group_index_known_value():
    # Fixed digest, independent of any code in dplib: sha256(SALT + "alice")[:8].
    expected = int(hashlib.sha256(("0123456789abcdef" * 4 + "alice").encode()).hexdigest()[:8], 16)
    assert int(group_index(["alice"], SALT)[0]) == expected


def test_group_index_values_in_hash_space():
    ids = list(range(5000))
    idx = group_index(ids, new_salt())
    assert idx.min() >= 0
    assert idx.max() < 2**32
    # 5000 uniform 32-bit values: the min is below 2**32 / 100 and the max above 99% of the
    # space except with probability 2 * 0.99**5000 ~ 3e-22.
    assert idx.min() < 2**32 // 100
    assert idx.max() > 99 * (2**32 // 100)


def test_group_index_depends_on_salt():
    ids = list(range(200))
    a = group_index(ids, SALT)
    b = group_index(ids, "f" * 64)
    assert np.mean(a == b) < 0.05


def test_adding_or_removing_one_id_moves_nobody_else():
    rng = np.random.default_rng(1)
    ids = [f"person-{i}" for i in rng.permutation(300)]
    base = group_index(ids, SALT)
    added = group_index(ids + ["newcomer"], SALT)
    assert np.array_equal(added[:-1], base)
    for drop in (0, 17, 299):
        removed = group_index(ids[:drop] + ids[drop + 1 :], SALT)
        assert np.array_equal(removed, np.delete(base, drop))


@pytest.mark.parametrize("salt", ["", "abc", "0" * 63, "0" * 65])
def test_group_index_rejects_bad_salt_length(salt):
    with pytest.raises(InvalidParameterError, match="salt"):
        group_index([1, 2], salt)


def test_new_salt_is_64_hex_chars_and_fresh():
    s1, s2 = new_salt(), new_salt()
    assert len(s1) == 64 and int(s1, 16) >= 0
    assert s1 != s2


# --------------------------------------------------------------------------------------------
# GroupRange
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "lo, hi",
    [(-0.1, 0.5), (0.5, 0.5), (0.6, 0.5), (0.0, 1.0000001), (math.nan, 0.5), (0.0, math.nan), (0.0, math.inf)],
)
def test_group_range_validation(lo, hi):
    with pytest.raises(InvalidParameterError):
        GroupRange(lo, hi)


def test_group_range_fraction():
    assert GroupRange(0.25, 0.75).fraction == 0.5
    assert ALL_PERSONS.fraction == 1.0


@pytest.mark.parametrize(
    "parent, fractions",
    [
        (ALL_PERSONS, [1, 1]),
        (ALL_PERSONS, [0.25, 0.75]),
        (ALL_PERSONS, [1, 1, 1]),
        (GroupRange(0.1, 0.7), [3, 1, 2, 5]),
        (GroupRange(0.25, 1.0), [0.5, 0.5]),
        (GroupRange(0.0, 1e-3), [1] * 7),
    ],
)
def test_split_is_contiguous_disjoint_and_covers_parent(parent, fractions):
    parts = parent.split(fractions)
    assert len(parts) == len(fractions)
    assert parts[0].lo == parent.lo
    assert parts[-1].hi == parent.hi
    for a, b in zip(parts[:-1], parts[1:]):
        assert a.hi == b.lo  # exact: no gap, no overlap
    total = sum(fractions)
    for p, f in zip(parts, fractions):
        assert p.fraction == pytest.approx((parent.hi - parent.lo) * f / total, rel=1e-9)
    # Every integer index of the parent is in exactly one part.
    rng = np.random.default_rng(0)
    plo, phi = math.floor(parent.lo * 2**32), math.floor(parent.hi * 2**32)
    probes = np.concatenate(
        [rng.integers(plo, phi, size=2000), [plo, phi - 1]]
        + [np.array([math.floor(p.lo * 2**32) + d for d in (-1, 0, 1)]) for p in parts]
    )
    probes = probes[(probes >= plo) & (probes < phi)].astype(np.int64)
    hits = np.sum([in_range(probes, p) for p in parts], axis=0)
    assert np.all(hits == 1)
    assert np.all(in_range(probes, parent))


@pytest.mark.parametrize("fractions", [[], [0, 1], [-1, 2], [1, -0.5]])
def test_split_rejects_bad_fractions(fractions):
    with pytest.raises(InvalidParameterError):
        ALL_PERSONS.split(fractions)


@pytest.mark.parametrize("lo, hi", [(0.0, 1.0), (0.25, 0.75), (0.1, 0.3), (1 / 3, 2 / 3), (0.0, 1e-9)])
def test_in_range_bounds(lo, hi):
    g = GroupRange(lo, hi)
    lo_int = math.floor(Fraction(lo) * 2**32)
    hi_int = math.floor(Fraction(hi) * 2**32)
    idx = np.array([lo_int - 1, lo_int, lo_int + 1, hi_int - 1, hi_int, hi_int + 1], dtype=np.int64)
    expected = (idx >= lo_int) & (idx < hi_int)
    assert np.array_equal(in_range(idx, g), expected)
    assert g.bounds == (lo_int, hi_int)


def test_all_persons_holds_the_whole_hash_space():
    idx = np.array([0, 1, 2**31, 2**32 - 1], dtype=np.int64)
    assert np.all(in_range(idx, ALL_PERSONS))


def test_derive_salt_is_a_keyed_hash_per_label():
    """One salt per use (BHS23 orders per statistic): hand-written SHA-256, deterministic,
    different labels and different run salts give different salts, and the result is a salt."""
    import hashlib

    from dplib.groups import derive_salt, is_salt

    a, b = "ab" * 32, "cd" * 32
    assert derive_salt(a, "cov") == hashlib.sha256((a + ":derive:cov").encode()).hexdigest()
    assert is_salt(derive_salt(a, "cov"))
    assert len({derive_salt(a, "cov"), derive_salt(a, "mu"), derive_salt(b, "cov"), a}) == 4
    with pytest.raises(InvalidParameterError):
        derive_salt("not a salt", "cov")
