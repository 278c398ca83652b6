"""Synthetic records at scale, generated inside Spark (no driver-side data) and kept as Parquet.

One file set per (records, persons, skew), written once under ``--data-dir`` and reused by
later runs (the folder name holds the parameters and a format version). Columns:

- ``person`` (string ``"u<index>"``): the privacy unit.
  ``uniform``: record ``i`` belongs to person ``i % persons`` (every person has
  ``records / persons`` records, +-1). ``zipf``: person ``floor((persons + 1) ** u) - 1`` for a
  hash-uniform ``u`` in [0, 1), i.e. ``P(person = j)`` proportional to ``log((j + 2) / (j + 1))``
  ~ ``1 / j`` (Zipf with exponent 1): person 0 holds ~``log 2 / log(persons + 1)`` of all records
  (5% at 10^6 persons) and many high indices hold none.
- ``x0`` ... ``x7`` (double): a person effect ``(j % 100) / 10`` plus ``N(0, 1 + j % 5)`` noise
  (``j`` = person index), so person means differ and spreads differ.
- ``cat`` (string ``"c0"`` ... ``"c19"``, 20 values): Zipf-like over the 20 values (``c0`` most
  frequent), drawn per record from a second hash.

Everything is a deterministic function of the record index (``xxhash64`` with fixed seeds and
``randn`` with fixed seeds over a fixed number of ``spark.range`` partitions).
"""

from __future__ import annotations

import os

FORMAT_VERSION = 1
D = 8
K = 20
SKEWS = ("uniform", "zipf")


def dataset_dir(root: str, records: int, persons: int, skew: str) -> str:
    """Folder of one generated dataset (``<root>/r<records>_p<persons>_<skew>_v<version>``)."""
    return os.path.join(root, f"r{records}_p{persons}_{skew}_v{FORMAT_VERSION}")


def _unit(seed: int):
    """A hash-uniform double in [0, 1) per record (53 bits of ``xxhash64(id, seed)``)."""
    from pyspark.sql import functions as F

    bits = F.shiftright(F.xxhash64(F.col("id"), F.lit(seed)), 11)  # signed 53-bit
    return (bits + F.lit(2**52)).cast("double") / F.lit(float(2**53))


def ensure_dataset(spark, root: str, records: int, persons: int, skew: str) -> str:
    """Write the dataset once (if its ``_SUCCESS`` marker is missing); returns its path."""
    from pyspark.sql import functions as F

    if skew not in SKEWS:
        raise ValueError(f"skew must be one of {SKEWS}, got {skew!r}")
    if not (1 <= persons <= records):
        raise ValueError(f"persons must be in [1, records], got {persons} for {records} records")
    path = dataset_dir(root, records, persons, skew)
    if os.path.exists(os.path.join(path, "_SUCCESS")):
        return path
    parts = max(2, records // 4_000_000)  # ~4M records (~330 MB) per file
    ids = spark.range(0, records, 1, parts)
    if skew == "uniform":
        pidx = F.col("id") % F.lit(persons)
    else:
        pidx = F.floor(F.pow(F.lit(float(persons + 1)), _unit(11))).cast("long") - F.lit(1)
        pidx = F.least(F.greatest(pidx, F.lit(0)), F.lit(persons - 1))
    df = ids.select(F.col("id"), pidx.alias("_j"))
    cat_idx = F.least(F.floor(F.pow(F.lit(float(K + 1)), _unit(23))).cast("long") - F.lit(1), F.lit(K - 1))
    cols = [F.concat(F.lit("u"), F.col("_j").cast("string")).alias("person")]
    for j in range(D):
        effect = (F.col("_j") % F.lit(100)).cast("double") / F.lit(10.0)
        spread = F.lit(1.0) + (F.col("_j") % F.lit(5)).cast("double")
        cols.append((effect + spread * F.randn(100 + j)).alias(f"x{j}"))
    cols.append(F.concat(F.lit("c"), cat_idx.cast("string")).alias("cat"))
    df.select(*cols).write.mode("overwrite").parquet(path)
    return path
