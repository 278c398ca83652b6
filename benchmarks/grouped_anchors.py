"""Per-group person-level MEAN and COUNT: ours (``group_by``) against Tumult Analytics and PipelineDP.

Same data, epsilon = 1 on the one statistic (delta = 1e-6 for ours, which uses it in the mean's
shared range stage), the same L0 bound (``max_groups_per_person``), a public key set. The
anchors (settings pinned by the grouped-statistics issue) get ONE ROW PER (person, group), the
person's mean in that group, and:

* Tumult Analytics 0.21 (its own venv, pyspark 3.5; ``anchors/tumult_grouped_worker.py``):
  ``enforce(MaxGroupsPerID(g, L0))``, ``enforce(MaxRowsPerGroupPerID(g, 1))``, a public
  ``KeySet``, ``average(value, low, high, mechanism="laplace")`` and ``count(mechanism="laplace")``
  (after the two constraints: persons per group), each under ``PureDPBudget(1)``.
* PipelineDP 0.3.1 (``LocalBackend``): ``Metrics.MEAN`` and ``Metrics.PRIVACY_ID_COUNT``, each
  alone under ``NaiveBudgetAccountant(1, 0)``, ``NoiseKind.LAPLACE``,
  ``max_partitions_contributed=L0``, ``max_contributions_per_partition=1``, public partitions.
* Bounds PER GROUP at the non-private [p1, p99] of that group's person means (their best case).
  Neither anchor takes per-group bounds in one query, so each group's values are mapped affinely
  to [0, 1] by its own bounds, averaged in [0, 1] with bounds (0, 1), and mapped back (averages
  are affine-equivariant: clamp, sum, count, Laplace with scale proportional to the range).
* Ours: ``kind: mean`` / ``kind: count`` with ``group_by``, ``groups: {keys: ...}`` and
  ``max_groups_per_person: L0`` through :class:`spark_jobs.grouping.NumpyGroupedInput` and
  :func:`spark_jobs.grouping.run_grouped_numpy` (the numpy twin of the Spark path: the same
  keyed-hash L0 bound, the same per-group estimators), ``SeededNoise`` per seed, a salt per seed.
  Side table: ``groups: {select: private}`` (Laplace partition selection) on flights cells.

Many (cell, seed) releases share one Tumult evaluate per cell (the IDs and group ids of each seed
are distinct, so each seed's release gets exactly the noise it would get alone); all cells run in
one worker process (one Spark session).

The exact per-group statistic (what every error is measured against): the mean over ALL persons
with records in the group of each person's mean in that group (before any L0 truncation); the
count is the number of such persons. Groups of the key set with no person are left out of the
mean's errors and kept (exact 0) in the count's.

Cells: nycflights13 (privacy unit tailnum, value arr_delay, records with NaN arr_delay dropped;
fixed data, seeds vary the noise and our salt): per origin (3 groups, L0 = 3), per carrier (16,
L0 = 1), per month x origin (36, L0 = 12 and 24). Synthetic (fresh data every seed): G groups, each
person in k ~ U{1..min(20, G)} groups drawn uniformly, L0 = 5; the person's mean in group g is
``c_g + N(0, 1)`` (Gaussian) or ``c_g + Lomax(1.5)`` (heavy tail, infinite variance), with
``c_g ~ U(0, 10)`` fixed per cell.

    python -m benchmarks.grouped_anchors                      # every cell, default seeds (~1 h)
    python -m benchmarks.grouped_anchors --cells flights --seeds 30 --no-tumult

Not part of ``make test`` (needs ``pip install -e '.[bench]'`` and, for Tumult,
``python -m benchmarks.anchors --setup-tumult``). Results: ``benchmarks/results/grouped_anchors.md``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import tempfile
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dplib.aggregates import NumpyAggregates
from dplib.grouped import NumpyGroupedAggregates
from dplib.mechanisms import SeededNoise
from spark_jobs.config import parse_config
from spark_jobs.grouping import NumpyGroupedInput, key_json, run_grouped_numpy

EPSILON = 1.0
DELTA = 1e-6
BIG = 1e300  # a failed release's |error| (an infinite error that percentiles can interpolate)
HERE = Path(__file__).resolve().parent
TUMULT_WORKER = HERE / "anchors" / "tumult_grouped_worker.py"


# ---------------------------------------------------------------------------------------------
# Cells and data
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GCell:
    name: str
    source: str  # "flights" | "gaussian" | "lomax1.5" | "uniform40" (integers 0..39, no group centres)
    l0: int
    by: tuple[str, ...] = ()  # flights: the group_by columns
    n_groups: int = 0  # synthetic
    persons: int = 0  # synthetic
    seeds: int | None = None  # None: --seeds
    tumult_seeds: int | None = None  # None: the cell's seeds
    kmax: int = 20  # synthetic: groups per person drawn from 1..min(kmax, n_groups)

    @property
    def light_tailed(self) -> bool:
        return self.source != "lomax1.5"

    def key(self) -> int:
        return zlib.crc32(self.name.encode())


CELLS = [
    GCell("flights origin", "flights", 3, by=("origin",)),
    GCell("flights carrier", "flights", 1, by=("carrier",)),
    GCell("flights month x origin L0=12", "flights", 12, by=("month", "origin")),
    GCell("flights month x origin L0=24", "flights", 24, by=("month", "origin")),
    GCell("gaussian G=10", "gaussian", 5, n_groups=10, persons=2_000),
    GCell("lomax1.5 G=10", "lomax1.5", 5, n_groups=10, persons=2_000),
    GCell("gaussian G=1e3", "gaussian", 5, n_groups=1_000, persons=30_000, seeds=10),
    GCell("lomax1.5 G=1e3", "lomax1.5", 5, n_groups=1_000, persons=30_000, seeds=10),
    GCell("gaussian G=1e5", "gaussian", 5, n_groups=100_000, persons=100_000, seeds=1),
    # small, spread data: 600 persons in one of 3 groups, person means on the integers 0..39 (five
    # octaves: before the shared stages' pooled retry every group was INSUFFICIENT_DATA)
    GCell("uniform0-39 G=3 n=600", "uniform40", 1, n_groups=3, persons=600, kmax=1),
]
#: flights cells of the side table (ours with groups: {select: private})
PRIVATE_SELECTION = ("flights origin", "flights carrier", "flights month x origin L0=12")


@dataclass
class Data:
    """One row per (person, group): person index, group index (into ``keys``), the person's mean."""

    person: np.ndarray
    group: np.ndarray
    value: np.ndarray
    keys: list[tuple[str, ...]]
    facts: dict = field(default_factory=dict)


_FLIGHTS: dict = {}


def flights_data(by: tuple[str, ...]) -> Data:
    if by not in _FLIGHTS:
        from benchmarks.anchors.data import _panel_frame

        df = _panel_frame("flights")[["tailnum", *by, "arr_delay"]].dropna()
        pg = df.groupby(["tailnum", *by], sort=True)["arr_delay"].mean().reset_index()
        key_frame = pg[list(by)].drop_duplicates().sort_values(list(by))
        keys = [tuple(str(v) for v in row) for row in key_frame.itertuples(index=False)]
        kpos = {k: i for i, k in enumerate(keys)}
        group = np.array([kpos[tuple(str(v) for v in row)] for row in pg[list(by)].itertuples(index=False)])
        person = pg["tailnum"].astype("category").cat.codes.to_numpy().astype(np.int64)
        k = np.bincount(person)
        facts = {"persons": int(person.max() + 1), "rows": int(len(pg)),
                 "groups_per_person": {q: float(np.percentile(k, q)) for q in (50, 90, 99)},
                 "groups_per_person_max": int(k.max())}
        _FLIGHTS[by] = Data(person, group, pg["arr_delay"].to_numpy(dtype=np.float64), keys, facts)
    return _FLIGHTS[by]


def centres(cell: GCell) -> np.ndarray:
    return np.random.default_rng([2027, cell.key()]).uniform(0.0, 10.0, cell.n_groups)


def synthetic_data(cell: GCell, seed: int) -> Data:
    rng = np.random.default_rng([2026, cell.key(), seed])
    G, n = cell.n_groups, cell.persons
    kmax = min(cell.kmax, G)
    k = rng.integers(1, kmax + 1, n)
    person = np.repeat(np.arange(n, dtype=np.int64), k)
    if G <= 64:  # a uniform k-subset per person: the first k of a random permutation
        perm = np.argsort(rng.random((n, G)), axis=1)
        group = perm[np.arange(G)[None, :] < k[:, None]]
    else:
        group = np.concatenate([rng.choice(G, int(kk), replace=False) for kk in k]).astype(np.int64)
    if cell.source == "uniform40":
        value = rng.integers(0, 40, person.size).astype(np.float64)
        return Data(person, group.astype(np.int64), value, [(f"g{i}",) for i in range(G)],
                    {"persons": n, "rows": int(person.size)})
    if cell.source == "gaussian":
        noise = rng.standard_normal(person.size)
    else:
        noise = rng.pareto(float(cell.source[len("lomax"):]), person.size)
    value = centres(cell)[group] + noise
    keys = [(f"g{i}",) for i in range(G)]
    return Data(person, group.astype(np.int64), value, keys, {"persons": n, "rows": int(person.size)})


def cell_data(cell: GCell, seed: int) -> Data:
    return flights_data(cell.by) if cell.source == "flights" else synthetic_data(cell, seed)


def group_percentiles(group: np.ndarray, value: np.ndarray, G: int, qs=(1.0, 99.0)) -> np.ndarray:
    """(G, len(qs)) per-group percentiles (numpy's linear interpolation); NaN for empty groups."""
    order = np.lexsort((value, group))
    g, v = group[order], value[order]
    counts = np.bincount(g, minlength=G)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    out = np.full((G, len(qs)), np.nan)
    has = counts > 0
    for j, q in enumerate(qs):
        pos = (counts[has] - 1) * q / 100.0
        lo = np.floor(pos).astype(np.int64)
        hi = np.minimum(lo + 1, counts[has] - 1)
        frac = pos - lo
        a, b = v[starts[has] + lo], v[starts[has] + hi]
        out[has, j] = a + (b - a) * frac
    return out


@dataclass
class Truth:
    mean: np.ndarray  # (G,), NaN for empty groups
    count: np.ndarray  # (G,)
    lo: np.ndarray
    hi: np.ndarray
    clamp_bias: np.ndarray  # mean of clip(y, lo, hi) - mean(y) over all persons of the group


def truth(d: Data) -> Truth:
    G = len(d.keys)
    cnt = np.bincount(d.group, minlength=G).astype(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.bincount(d.group, d.value, minlength=G) / cnt
    pc = group_percentiles(d.group, d.value, G)
    lo, hi = pc[:, 0], pc[:, 1]
    width = np.maximum(hi - lo, 1e-9 * np.maximum(1.0, np.abs(lo)))  # a degenerate group (one person)
    mid = (lo + hi) / 2.0
    lo, hi = mid - width / 2.0, mid + width / 2.0
    lo = np.where(np.isfinite(lo), lo, 0.0)
    hi = np.where(np.isfinite(hi), hi, 1.0)
    clipped = np.clip(d.value, lo[d.group], hi[d.group])
    with np.errstate(invalid="ignore", divide="ignore"):
        cb = np.bincount(d.group, clipped, minlength=G) / cnt - mean
    return Truth(mean, cnt, lo, hi, cb)


# ---------------------------------------------------------------------------------------------
# Ours
# ---------------------------------------------------------------------------------------------


class FastGroupedInput(NumpyGroupedInput):
    """:class:`NumpyGroupedInput` without its two O(keys x rows) steps (hours at 10^5 keys): the
    public-key filter (``np.isin`` on object arrays loops over the keys) is done with a set before
    the parent sees the rows, and ``backend`` groups rows by sorting instead of masking all rows once
    per key. Same kept rows, same per-group arrays, in the same row order."""

    def __init__(self, persons, keys, values, salt_hex: str, l0: int, public: list[str] | None = None) -> None:
        keys = [str(k) for k in keys]
        if public is not None:
            pub = set(public)
            keep = np.fromiter((k in pub for k in keys), dtype=bool, count=len(keys))
            persons = [p for p, k in zip(persons, keep) if k]
            keys = [k for k, m in zip(keys, keep) if m]
            values = {c: np.asarray(v, dtype=float)[keep] for c, v in values.items()}
        super().__init__(persons, keys, values, salt_hex, l0, public=None)
        self._public = public

    def backend(self, keys: list[str] | None = None, first_only: bool = False):
        keys = self.public_keys() if keys is None else keys
        pos = {k: i for i, k in enumerate(keys)}
        idx = np.fromiter((pos.get(k, -1) for k in self._keys), dtype=np.int64, count=len(self._keys))
        if first_only:
            idx = np.where(self._first, idx, -1)
        order = np.argsort(idx, kind="stable")
        bounds = np.searchsorted(idx[order], np.arange(len(keys) + 1))
        out = {}
        for gid in range(len(keys)):
            rows = order[bounds[gid]:bounds[gid + 1]]
            out[gid] = NumpyAggregates({c: v[rows] for c, v in self._vals.items()}, self._gi[rows])
        return NumpyGroupedAggregates(out)

    def kept(self) -> tuple[np.ndarray, np.ndarray]:
        """(key JSON, value) of each (person, key) row kept by the L0 bound (benchmark diagnostics)."""
        return self._keys, self._vals["v"]


def our_config(kind: str, by: tuple[str, ...], l0: int, keys: list[tuple[str, ...]] | None):
    groups = {"select": "private"} if keys is None else {"keys": [list(k) for k in keys]}
    return parse_config({
        "job_name": "grouped-anchors", "input": {"path": "x", "format": "parquet"},
        "privacy_unit": {"column": "pid"}, "budget": {"epsilon": EPSILON, "delta": DELTA},
        "statistics": [{"name": kind, "kind": kind, "columns": ["v"], "share": 1.0, "group_by": list(by),
                        "max_groups_per_person": l0, "groups": groups}],
        "output": {"path": "o"}, "ledger": {"enabled": False},
    })


def cell_group_by(cell: GCell) -> tuple[str, ...]:
    return cell.by if cell.source == "flights" else ("g",)


def run_ours(cell: GCell, d: Data, seed: int, private: bool = False) -> dict:
    """Both statistics of ours for one (cell, seed): per key, estimate / bar / status and the
    mean's parameters; ``kept_*`` the per-key exact statistics of the rows the L0 bound kept."""
    t0 = time.perf_counter()
    G = len(d.keys)
    kjs = [key_json(k) for k in d.keys]
    salt = hashlib.sha256(f"grouped-anchors:{cell.name}:{seed}".encode()).hexdigest()
    src = FastGroupedInput([f"p{p}" for p in d.person], [kjs[g] for g in d.group], {"v": d.value}, salt, cell.l0,
                           public=None if private else kjs)
    t_build = time.perf_counter() - t0
    by = cell_group_by(cell)
    out: dict = {"build_seconds": t_build}
    kpos = {k: i for i, k in enumerate(kjs)}
    kk, kv = src.kept()
    kg = np.fromiter((kpos[k] for k in kk), dtype=np.int64, count=len(kk))
    kc = np.bincount(kg, minlength=G).astype(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        out["kept_mean"] = np.bincount(kg, kv, minlength=G) / kc
    out["kept_count"] = kc
    out["_kept"] = (kg, kv)
    for s, kind in enumerate(("mean", "count")):
        t1 = time.perf_counter()
        cfg = our_config(kind, by, cell.l0, None if private else d.keys)
        rels = run_grouped_numpy(cfg, cfg.statistics[0], src, SeededNoise([cell.key(), seed, s, int(private)]))
        est = np.full(G, np.nan)
        bar = np.full(G, np.nan)
        status = np.full(G, "NOT_RELEASED", dtype=object)
        params: list = [None] * G
        for r in rels:
            g = kpos[key_json([r.key[c] for c in by])]
            status[g] = r.release.status
            if r.release.estimate is not None:
                est[g] = r.release.estimate[0]
            if r.release.error_bar is not None:
                bar[g] = r.release.error_bar[0]
            params[g] = r.release.parameters
        out[kind] = {"estimate": est, "bar": bar, "status": status, "params": params,
                     "seconds": time.perf_counter() - t1}
    out["seconds"] = time.perf_counter() - t0
    return out


def our_decomposition(run: dict, G: int) -> dict:
    """Split our mean's error into the fine stage's noise (estimate - the exact clipped mean at the
    released centre and radius), the clipping bias (clipped - kept mean) and what the L0 bound
    dropped (kept mean - all persons' mean); per key, NaN where nothing was released."""
    kg, kv = run["_kept"]
    c = np.array([np.nan if p is None or "coarse_center" not in p else p["coarse_center"] for p in run["mean"]["params"]])
    rho = np.array([np.nan if p is None or "clipping_radius" not in p else p["clipping_radius"]
                    for p in run["mean"]["params"]])
    cg, rg = c[kg], rho[kg]
    clipped = cg + np.clip(kv - cg, -rg, rg)
    ok = np.isfinite(clipped)
    with np.errstate(invalid="ignore", divide="ignore"):
        cm = np.bincount(kg[ok], clipped[ok], minlength=G) / np.bincount(kg[ok], minlength=G)
    cm = np.where(np.isfinite(rho), cm, np.nan)

    def param(name):
        return np.array([np.nan if p is None or p.get(name) is None else float(p[name]) for p in run["mean"]["params"]])

    return {"noise": run["mean"]["estimate"] - cm, "clip": cm - run["kept_mean"], "radius": rho,
            "centre_off": c - run["kept_mean"], "floor": rho <= param("bin_width") / 4.0 * (1 + 1e-9),
            "bias_bound": param("clipping_bias_bound"), "n_eps": run["kept_count"] * param("fine_epsilon")}


# ---------------------------------------------------------------------------------------------
# PipelineDP
# ---------------------------------------------------------------------------------------------


def run_pipelinedp(cell: GCell, d: Data, t: Truth) -> dict:
    import pipeline_dp as pdp

    G = len(d.keys)
    scaled = (d.value - t.lo[d.group]) / (t.hi[d.group] - t.lo[d.group])
    rows = list(zip(d.person.tolist(), d.group.tolist(), scaled.tolist()))
    ex = pdp.DataExtractors(privacy_id_extractor=lambda r: r[0], partition_extractor=lambda r: r[1],
                            value_extractor=lambda r: r[2])
    out = {}
    for metric, attr in ((pdp.Metrics.MEAN, "mean"), (pdp.Metrics.PRIVACY_ID_COUNT, "privacy_id_count")):
        t0 = time.perf_counter()
        acc = pdp.NaiveBudgetAccountant(total_epsilon=EPSILON, total_delta=0.0)
        engine = pdp.DPEngine(acc, pdp.LocalBackend())
        extra = {"min_value": 0.0, "max_value": 1.0} if attr == "mean" else {}
        params = pdp.AggregateParams(metrics=[metric], noise_kind=pdp.NoiseKind.LAPLACE,
                                     max_partitions_contributed=cell.l0, max_contributions_per_partition=1, **extra)
        res = engine.aggregate(rows, params, ex, public_partitions=list(range(G)))
        acc.compute_budgets()
        est = np.full(G, np.nan)
        for g, m in res:
            est[g] = getattr(m, attr)
        if attr == "mean":
            est = t.lo + (t.hi - t.lo) * est
        out["mean" if attr == "mean" else "count"] = est
        out[f"{attr}_seconds"] = time.perf_counter() - t0
    return out


# ---------------------------------------------------------------------------------------------
# Tumult
# ---------------------------------------------------------------------------------------------


class TumultGrouped:
    """Collects (cell, seed) jobs per cell; ``run`` answers all cells in one worker process."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.cells: dict[str, dict] = {}

    def add(self, cell: GCell, seed: int, d: Data, t: Truth) -> None:
        q = self.cells.setdefault(cell.name, {"l0": cell.l0, "ids": [], "gs": [], "vals": [], "jobs": [],
                                              "id_next": 0, "g_next": 0})
        G = len(d.keys)
        q["ids"].append(d.person + q["id_next"])
        q["gs"].append(d.group + q["g_next"])
        q["vals"].append((d.value - t.lo[d.group]) / (t.hi[d.group] - t.lo[d.group]))
        q["jobs"].append((seed, q["g_next"], G, t.lo, t.hi))
        q["id_next"] += int(d.person.max()) + 1
        q["g_next"] += G

    def run(self, log_path: Path) -> tuple[dict, dict]:
        """Returns ({(cell name, seed): {"mean": (G,), "count": (G,)}}, worker result JSON)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        from benchmarks.anchors.tumult import PYTHON, worker_env

        spec = {"epsilon": EPSILON, "out_dir": str(self.workdir), "queries": []}
        for i, (name, q) in enumerate(self.cells.items()):
            path = self.workdir / f"q{i}.parquet"
            pq.write_table(pa.table({"id": np.concatenate(q["ids"]).astype(np.int64),
                                     "g": np.concatenate(q["gs"]).astype(np.int64),
                                     "value": np.concatenate(q["vals"]).astype(np.float64)}), path)
            spec["queries"].append({"name": f"q{i}", "parquet": str(path), "l0": q["l0"], "n_keys": q["g_next"],
                                    "aggs": ["average", "count"]})
        (self.workdir / "spec.json").write_text(json.dumps(spec))
        env = worker_env()
        with open(log_path, "w") as log:
            r = subprocess.run([str(PYTHON), str(TUMULT_WORKER), str(self.workdir / "spec.json")], stdout=log,
                               stderr=log, env=env)
        if r.returncode != 0:
            raise RuntimeError(f"Tumult worker failed (exit {r.returncode}); see {log_path}")
        result = json.loads((self.workdir / "result.json").read_text())
        out = {}
        for i, (name, q) in enumerate(self.cells.items()):
            ans = {}
            for agg in ("average", "count"):
                z = np.load(self.workdir / f"q{i}.{agg}.npz")
                a = np.full(q["g_next"], np.nan)
                a[z["g"]] = z["value"]
                ans[agg] = a
            for seed, g0, G, lo, hi in q["jobs"]:
                out[(name, seed)] = {"mean": lo + (hi - lo) * ans["average"][g0:g0 + G],
                                     "count": ans["count"][g0:g0 + G]}
            result["queries"][name] = result["queries"].pop(f"q{i}")
        return out, result


# ---------------------------------------------------------------------------------------------
# Summaries
# ---------------------------------------------------------------------------------------------


def pct(x: np.ndarray, q: float) -> float:
    """Percentile over the non-NaN entries (BIG stands for a failure's infinite error)."""
    x = np.asarray(x, dtype=float)
    x = x[~np.isnan(x)]
    return float(np.percentile(x, q)) if x.size else float("nan")


def share(x) -> float:
    x = np.asarray(x, dtype=float)
    return float(x.mean()) if x.size else float("nan")


def fmt(v: float) -> str:
    if not np.isfinite(v):
        return "-"
    if v >= BIG / 10:
        return "inf"
    return f"{v:.3g}"


def abs_errors(est: np.ndarray, exact: np.ndarray) -> np.ndarray:
    e = np.abs(est - exact)
    return np.where(np.isfinite(e), e, BIG)


@dataclass
class Acc:
    """Per (cell, statistic, method): every (group, seed) of the cell."""

    err: list = field(default_factory=list)
    fails: int = 0
    total: int = 0
    ratio_bar: list = field(default_factory=list)
    covered: list = field(default_factory=list)
    covered_kept: list = field(default_factory=list)
    seconds: float = 0.0
    seeds: int = 0

    def add(self, est, exact, ok=None, bar=None, kept=None):
        m = np.isfinite(exact)
        est, exact = est[m], exact[m]
        ok = np.isfinite(est) if ok is None else (ok[m] & np.isfinite(est))
        err = np.where(ok, abs_errors(est, exact), BIG)
        self.err.append(err)
        self.fails += int((~ok).sum())
        self.total += int(m.sum())
        if bar is not None:
            b = bar[m]
            good = ok & np.isfinite(b) & (b > 0)
            self.ratio_bar.append(np.where(good, err / np.where(good, b, 1.0), BIG))
            self.covered.append(good & (err <= b))
            kk = np.abs(est - kept[m])
            self.covered_kept.append(good & np.isfinite(kk) & (kk <= np.where(good, b, 0.0)))

    def cat(self, name):
        v = getattr(self, name)
        return np.concatenate(v) if v else np.zeros(0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=20, help="seeds per cell (cells with their own number keep it)")
    ap.add_argument("--cells", default=None, help="regex on cell names")
    ap.add_argument("--no-tumult", action="store_true")
    ap.add_argument("--no-pdp", action="store_true")
    ap.add_argument("--no-private", action="store_true", help="skip the groups: {select: private} side table")
    ap.add_argument("--max-seeds", type=int, default=None, help="cap every cell's seeds (quick runs)")
    ap.add_argument("--json", default=None, help="write the per-cell summaries here")
    args = ap.parse_args()
    cells = [c for c in CELLS if not args.cells or re.search(args.cells, c.name)]
    from benchmarks.anchors import tumult

    use_tumult, msg = (False, "disabled") if args.no_tumult else tumult.available()
    print(f"epsilon = {EPSILON}, delta = {DELTA} (ours); Tumult: {msg}", flush=True)
    t_start = time.time()
    tmp = tempfile.TemporaryDirectory(prefix="grouped-anchors-")
    tj = TumultGrouped(Path(tmp.name))
    accs: dict = {}  # (cell, stat, method) -> Acc
    diag: dict = {}  # cell -> lists of our diagnostics
    per_key_cov: dict = {}  # cell -> (G,) covered counts over seeds (mean)
    priv: dict = {}
    truths: dict = {}
    facts: dict = {}
    for cell in cells:
        seeds = cell.seeds if cell.seeds is not None else args.seeds
        if args.max_seeds:
            seeds = min(seeds, args.max_seeds)
        t_seeds = seeds if cell.tumult_seeds is None else min(seeds, cell.tumult_seeds)
        for st in ("mean", "count"):
            for m in ("ours", "pipelinedp", "tumult"):
                accs[(cell.name, st, m)] = Acc()
        dg = diag.setdefault(cell.name, {k: [] for k in ("kept", "bar", "noise", "clip", "trunc", "flag", "radius",
                                                         "err", "anchor_clamp", "status", "width", "centre_off",
                                                         "floor", "bias_bound", "n_eps")})
        t_cell = time.time()
        for seed in range(seeds):
            d = cell_data(cell, seed)
            t = truth(d)
            G = len(d.keys)
            facts[cell.name] = {"groups": G, **d.facts,
                                "persons_per_group_median": float(np.median(t.count)),
                                "persons_per_group_min": int(t.count.min())}
            truths[(cell.name, seed)] = t
            r = run_ours(cell, d, seed)
            a = accs[(cell.name, "mean", "ours")]
            ok = r["mean"]["status"] == "OK"
            a.add(r["mean"]["estimate"], t.mean, ok, r["mean"]["bar"], r["kept_mean"])
            a.seconds += r["build_seconds"] + r["mean"]["seconds"]
            a.seeds += 1
            c = accs[(cell.name, "count", "ours")]
            c.add(r["count"]["estimate"], t.count, r["count"]["status"] == "OK", r["count"]["bar"], r["kept_count"])
            c.seconds += r["count"]["seconds"]
            c.seeds += 1
            dec = our_decomposition(r, G)
            m = np.isfinite(t.mean)
            dg["kept"].append(r["kept_count"][m])
            dg["bar"].append(r["mean"]["bar"][m])
            dg["noise"].append(dec["noise"][m])
            dg["clip"].append(dec["clip"][m])
            dg["trunc"].append((r["kept_mean"] - t.mean)[m])
            dg["radius"].append(dec["radius"][m])
            dg["flag"].append(np.array([bool(p and p.get("tail_flag")) for p in r["mean"]["params"]])[m])
            dg["err"].append(np.where(ok, abs_errors(r["mean"]["estimate"], t.mean), BIG)[m])
            dg["anchor_clamp"].append(t.clamp_bias[m])
            dg["status"].append(r["mean"]["status"][m])
            dg["width"].append((t.hi - t.lo)[m])
            for k in ("centre_off", "floor", "bias_bound", "n_eps"):
                dg[k].append(dec[k][m])
            cov = ok & (np.abs(r["mean"]["estimate"] - t.mean) <= r["mean"]["bar"])
            per_key_cov.setdefault(cell.name, np.zeros(G))
            per_key_cov[cell.name] += cov
            if not args.no_pdp:
                p = run_pipelinedp(cell, d, t)
                accs[(cell.name, "mean", "pipelinedp")].add(p["mean"], t.mean)
                accs[(cell.name, "mean", "pipelinedp")].seconds += p["mean_seconds"]
                accs[(cell.name, "mean", "pipelinedp")].seeds += 1
                accs[(cell.name, "count", "pipelinedp")].add(p["count"], t.count)
                accs[(cell.name, "count", "pipelinedp")].seconds += p["privacy_id_count_seconds"]
                accs[(cell.name, "count", "pipelinedp")].seeds += 1
            if use_tumult and seed < t_seeds:
                tj.add(cell, seed, d, t)
            if cell.source == "flights" and cell.name in PRIVATE_SELECTION and not args.no_private:
                rp = run_ours(cell, d, seed, private=True)
                pv = priv.setdefault(cell.name, {"mean": Acc(), "count": Acc(), "released": 0, "present": 0,
                                                 "extra": 0})
                present = t.count > 0
                rel = rp["mean"]["status"] != "NOT_RELEASED"
                pv["released"] += int((rel & present).sum())
                pv["present"] += int(present.sum())
                pv["extra"] += int((rel & ~present).sum())
                for st, exact, kept in (("mean", t.mean, rp["kept_mean"]), ("count", t.count, rp["kept_count"])):
                    relm = rp[st]["status"] != "NOT_RELEASED"
                    ex = np.where(relm, exact, np.nan)
                    pv[st].add(rp[st]["estimate"], ex, rp[st]["status"] == "OK", rp[st]["bar"], kept)
                pv.setdefault("seconds", 0.0)
                pv["seconds"] += rp["seconds"]
        print(f"{cell.name}: {seeds} seeds, {time.time() - t_cell:.0f} s (ours + PipelineDP)", flush=True)
    tumult_info = None
    if use_tumult and tj.cells:
        t0 = time.time()
        log = Path(os.environ.get("GROUPED_ANCHORS_TUMULT_LOG", "/tmp/grouped-anchors-tumult.log"))
        ans, tumult_info = tj.run(log)
        print(f"Tumult: {len(ans)} (cell, seed) jobs in one worker, {time.time() - t0:.0f} s", flush=True)
        for (name, seed), v in ans.items():
            t = truths[(name, seed)]
            am, ac = accs[(name, "mean", "tumult")], accs[(name, "count", "tumult")]
            am.add(v["mean"], t.mean)
            ac.add(v["count"], t.count)
            am.seeds += 1
            ac.seeds += 1
        for name, q in tumult_info["queries"].items():
            accs[(name, "mean", "tumult")].seconds = q["average_seconds"]
            accs[(name, "count", "tumult")].seconds = q["count_seconds"]
    report(cells, accs, diag, per_key_cov, priv, facts, tumult_info, args)
    print(f"\n({time.time() - t_start:.0f} s)")
    tmp.cleanup()


def report(cells, accs, diag, per_key_cov, priv, facts, tumult_info, args) -> None:
    methods = ("ours", "tumult", "pipelinedp")
    summary: dict = {}
    for st in ("mean", "count"):
        print(f"\n### Per-group {st.upper()}: |error| median / p90 over groups x seeds (failures as inf)\n")
        print("| cell | groups | L0 | seeds (ours / Tumult) | ours | Tumult | PipelineDP | ours / Tumult | "
              "ours / PDP | ours err/bar median | ours coverage (all / kept) | fail ours / Tumult / PDP | "
              "seconds ours / Tumult / PDP |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for cell in cells:
            a = {m: accs[(cell.name, st, m)] for m in methods}
            med = {m: pct(a[m].cat("err"), 50) for m in methods}
            p90 = {m: pct(a[m].cat("err"), 90) for m in methods}
            ratio = {m: (med["ours"] / med[m] if a[m].total and med[m] > 0 else float("nan")) for m in methods}
            rb = a["ours"].cat("ratio_bar")
            cov = a["ours"].cat("covered")
            covk = a["ours"].cat("covered_kept")
            fails = " / ".join(f"{a[m].fails}/{a[m].total}" if a[m].total else "-" for m in methods)
            secs = " / ".join(f"{a[m].seconds:.1f}" if a[m].seeds else "-" for m in methods)
            cells_txt = " | ".join(f"{fmt(med[m])} / {fmt(p90[m])}" if a[m].total else "-" for m in methods)
            print(f"| {cell.name} | {facts[cell.name]['groups']} | {cell.l0} | {a['ours'].seeds} / "
                  f"{a['tumult'].seeds or '-'} | {cells_txt} | {fmt(ratio['tumult'])} | {fmt(ratio['pipelinedp'])} | "
                  f"{fmt(pct(rb, 50))} | {share(cov):.2f} / {share(covk):.2f} | {fails} | {secs} |")
            summary[(cell.name, st)] = {m: {"median": med[m], "p90": p90[m], "fails": a[m].fails, "n": a[m].total,
                                            "seconds": a[m].seconds, "seeds": a[m].seeds} for m in methods}
            summary[(cell.name, st)]["ours"].update({"coverage": float(cov.mean()) if cov.size else None,
                                                     "coverage_kept": float(covk.mean()) if covk.size else None,
                                                     "err_over_bar_median": pct(rb, 50)})
    print("\n### Our mean, why: medians over groups x seeds (persons kept per group by the L0 bound; our 90% "
          "bar; |fine-stage noise| = |estimate - exact clipped mean at our centre and radius|; |clipping bias|; "
          "|L0 truncation| = |kept persons' mean - all persons' mean|; the anchors' own clamping bias at "
          "[p1, p99] on all persons; our radius / the [p1, p99] width)\n")
    print("| cell | kept persons p10 / median | kept x fine eps | bar | abs error | abs noise | abs clip bias | "
          "abs truncation | anchor abs clamp bias | abs(centre - mean) / (p99 - p1) | radius / (p99 - p1) | "
          "radius at grid floor | clip bias > its bound | tail_flag | not OK |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for cell in cells:
        dg = {k: np.concatenate(v) for k, v in diag[cell.name].items()}
        ok = dg["status"] == "OK"
        dishonest = ok & (np.abs(dg["clip"]) > dg["bias_bound"])
        print(f"| {cell.name} | {fmt(pct(dg['kept'], 10))} / {fmt(pct(dg['kept'], 50))} | {fmt(pct(dg['n_eps'], 50))} | "
              f"{fmt(pct(dg['bar'][ok], 50))} | {fmt(pct(dg['err'], 50))} | "
              f"{fmt(pct(np.abs(dg['noise'][ok]), 50))} | {fmt(pct(np.abs(dg['clip'][ok]), 50))} | "
              f"{fmt(pct(np.abs(dg['trunc']), 50))} | {fmt(pct(np.abs(dg['anchor_clamp']), 50))} | "
              f"{fmt(pct(np.abs(dg['centre_off'][ok]) / dg['width'][ok], 50))} | "
              f"{fmt(pct(dg['radius'][ok] / dg['width'][ok], 50))} | {dg['floor'][ok].mean():.2f} | "
              f"{dishonest.sum() / max(ok.sum(), 1):.2f} | {dg['flag'].mean():.2f} | {(~ok).mean():.3f} |")
    print("\n### Our mean by persons kept per group (|error| median, ours / Tumult where Tumult ran)\n")
    print("| cell | kept persons | share of groups | ours abs error | ours bar | coverage |")
    print("|---|---|---|---|---|---|")
    for cell in cells:
        dg = {k: np.concatenate(v) for k, v in diag[cell.name].items()}
        edges = [0, 10, 30, 100, 300, 1000, np.inf]
        for lo, hi in zip(edges[:-1], edges[1:]):
            m = (dg["kept"] >= lo) & (dg["kept"] < hi)
            if not m.any():
                continue
            okm = m & (dg["status"] == "OK")
            cov = (okm & (dg["err"] <= np.where(np.isfinite(dg["bar"]), dg["bar"], -1))).sum() / m.sum()
            print(f"| {cell.name} | [{lo}, {hi}) | {m.mean():.2f} | {fmt(pct(dg['err'][m], 50))} | "
                  f"{fmt(pct(dg['bar'][okm], 50))} | {cov:.2f} |")
    for cell in cells:
        if cell.source == "flights" and cell.n_groups == 0 and facts[cell.name]["groups"] <= 16:
            seeds = accs[(cell.name, "mean", "ours")].seeds
            cov = per_key_cov[cell.name] / max(seeds, 1)
            print(f"\n{cell.name}: share of seeds whose key lies within our 90% bar (mean): "
                  + ", ".join(f"{k}: {c:.2f}" for k, c in zip([key_json(k) for k in flights_data(cell.by).keys], cov)))
    if priv:
        print("\n### Side table: ours with groups: {select: private} (Laplace partition selection, 10% of the budget)\n")
        print("| cell | keys released / present (over seeds) | keys released that nobody holds | mean abs error median / "
              "p90 (released keys) | mean coverage | count abs error median / p90 | seconds |")
        print("|---|---|---|---|---|---|---|")
        for name, pv in priv.items():
            em, ec = pv["mean"].cat("err"), pv["count"].cat("err")
            print(f"| {name} | {pv['released']}/{pv['present']} ({pv['released'] / max(pv['present'], 1):.2f}) | "
                  f"{pv['extra']} | {fmt(pct(em, 50))} / {fmt(pct(em, 90))} | {share(pv['mean'].cat('covered')):.2f} | "
                  f"{fmt(pct(ec, 50))} / {fmt(pct(ec, 90))} | {pv['seconds']:.1f} |")
    print("\nData:")
    for cell in cells:
        print(f"  {cell.name}: {json.dumps(facts[cell.name])}")
    if tumult_info:
        print(f"\nTumult worker: {json.dumps(tumult_info)}")
    if args.json:
        Path(args.json).write_text(json.dumps({f"{k[0]}|{k[1]}": v for k, v in summary.items()}, indent=1))


if __name__ == "__main__":
    main()
