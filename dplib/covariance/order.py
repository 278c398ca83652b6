"""Data-independent random order, pairing and reference set of BHS23 (Pair, Algorithm 1 step 3).

The pairing ``y_i = (x_a - x_b)/sqrt(2)`` and the reference set R need the rows in a uniformly
random order drawn by the mechanism, independent of the data values. Both come from a keyed hash
with a per-run secret salt (64 hex characters from :func:`dplib.groups.new_salt`):

- order key of a row: the first 32 hex characters (128 bits) of
  ``SHA-256(salt || ":bhs23-order:" || str(key))``, where ``key`` is the person id (or the row
  position when no ids are given); rows are sorted by it (ties have probability about
  n^2 / 2^129 < 2e-23 at n = 1e8 — a 64-bit key's n^2 / 2^65 would not be negligible against
  delta at large n — and keep input order);
- pairs: consecutive rows of that order, (0, 1), (2, 3), ...; with odd n the last row is in no
  pair (StableMean still uses it);
- R: M distinct positions of the ordered rows, ``int(SHA-256(salt || ":bhs23-reference:" || j), 16)
  mod n`` for j = 0, 1, ... skipping repeats (a uniform M-subset; modulo bias < n / 2^256).

A fixed, public or reused salt does not give a random order. Never log or store the salt.
"""

from __future__ import annotations

import hashlib
import math
from typing import Iterable

import numpy as np

from dplib.errors import InvalidParameterError
from dplib.groups import is_salt

ORDER_TAG = ":bhs23-order:"
REFERENCE_TAG = ":bhs23-reference:"
ORDER_HEX_CHARS = 32


def _check_salt(salt_hex: str) -> None:
    if not is_salt(salt_hex):
        raise InvalidParameterError("salt_hex must be 64 lowercase hex characters (dplib.groups.new_salt())")


def order_keys(keys: Iterable[object], salt_hex: str) -> np.ndarray:
    """Order keys of row keys (person ids or positions): 128-bit keys as fixed-width lowercase
    hex strings (their string order is their numeric order, as Spark sorts them), shape ``(n,)``."""
    _check_salt(salt_hex)
    prefix = salt_hex + ORDER_TAG
    out = [hashlib.sha256((prefix + str(key)).encode("utf-8")).hexdigest()[:ORDER_HEX_CHARS] for key in keys]
    return np.asarray(out, dtype=f"<U{ORDER_HEX_CHARS}")


def random_order(n: int, salt_hex: str, ids: Iterable[object] | None = None) -> np.ndarray:
    """Permutation ``order`` (shape ``(n,)``) such that ``x[order]`` is in the keyed random order.

    Parameters
    ----------
    n : int
        Number of rows.
    salt_hex : str
        Per-run secret salt.
    ids : iterable of n person ids, optional
        Hashed instead of the row positions (the Spark path hashes person ids).
    """
    keys = range(n) if ids is None else list(ids)
    k = order_keys(keys, salt_hex)
    if k.shape[0] != n:
        raise InvalidParameterError(f"ids must have one entry per row ({n}), got {k.shape[0]}")
    return np.argsort(k, kind="stable")


def pair(x_ordered: np.ndarray) -> np.ndarray:
    """BHS23's Pair(x) on rows already in random order: ``y_i = (x_{2i} - x_{2i+1}) / sqrt(2)``.

    Returns shape ``(floor(n/2), d)``. If the rows are iid N(mu, Sigma), the pairs are iid N(0, Sigma).
    """
    m = x_ordered.shape[0] // 2
    return (x_ordered[0 : 2 * m : 2] - x_ordered[1 : 2 * m : 2]) / math.sqrt(2.0)


def reference_positions(n: int, M: int, salt_hex: str) -> np.ndarray:
    """M distinct positions in ``[0, n)`` (sorted), uniform over M-subsets, from the salt only.

    Raises
    ------
    InvalidParameterError
        If M > n.
    """
    _check_salt(salt_hex)
    if M > n:
        raise InvalidParameterError(f"the reference set size M must be <= n, got M={M}")
    prefix = salt_hex + REFERENCE_TAG
    chosen: set[int] = set()
    j = 0
    while len(chosen) < M:
        chosen.add(int(hashlib.sha256((prefix + str(j)).encode("utf-8")).hexdigest(), 16) % n)
        j += 1
    return np.array(sorted(chosen), dtype=np.int64)
