"""Per-group quantiles of the person means: ours (`kind: quantile` with `group_by`) beside Tumult
Analytics run for real (issue 21: "count and quantile within 1.5x of Tumult's").

Same data, L0 bounds, key sets and exact statistics as `benchmarks/grouped_anchors.py` (one row per
(person, group): the person's mean there). Ours: the numpy twin of the grouped Spark path
(`run_grouped_numpy`, seeded noise and a salt per seed; no user range). Tumult Analytics 0.21 (its
own venv; `anchors/tumult_grouped_worker.py`): `enforce(MaxGroupsPerID(g, L0))`,
`enforce(MaxRowsPerGroupPerID(g, 1))`, `groupby(KeySet).quantile(value, q, low, high)` under
`PureDPBudget(1)`, with each group's values mapped affinely so that the group's non-private
[p1, p99] become [0, 1] (its best case). Exact statistic: the group's q-quantile of the person means
of ALL its persons (`numpy.quantile(..., method="inverted_cdf")`), before L0 truncation. Errors over
groups x seeds: |value error| median / p90, rank error |F_g(estimate) - q| median, ratio of the
value medians; a release that is not OK counts as an infinite error (and a rank error of 1).

Run: `.venv/bin/python -m benchmarks.grouped_quantile [--seeds 20] [--cells REGEX] [--q 0.5,0.9]`.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.grouped_anchors import (
    CELLS, EPSILON, TUMULT_WORKER, FastGroupedInput, cell_data, cell_group_by, key_json, truth,
)
from dplib.mechanisms import SeededNoise
from spark_jobs.config import parse_config
from spark_jobs.grouping import run_grouped_numpy

DEFAULT_CELLS = "flights origin|flights carrier|flights month x origin L0=12|gaussian G=10$|lomax1.5 G=10$"


def config(q: float, by, l0: int, keys):
    return parse_config({
        "job_name": "grouped-quantile", "input": {"path": "x", "format": "parquet"},
        "privacy_unit": {"column": "pid"}, "budget": {"epsilon": EPSILON, "delta": 0.0},
        "statistics": [{"name": "q", "kind": "quantile", "columns": ["v"], "share": 1.0, "group_by": list(by),
                        "max_groups_per_person": l0, "groups": {"keys": [list(k) for k in keys]},
                        "options": {"q": q}}],
        "output": {"path": "o"}, "ledger": {"enabled": False},
    })


def exact_quantiles(d, q: float) -> tuple[np.ndarray, list]:
    G = len(d.keys)
    out, sorted_vals = np.full(G, np.nan), [None] * G
    order = np.argsort(d.group, kind="stable")
    bounds = np.searchsorted(d.group[order], np.arange(G + 1))
    for g in range(G):
        v = np.sort(d.value[order[bounds[g]:bounds[g + 1]]])
        sorted_vals[g] = v
        if v.size:
            out[g] = float(np.quantile(v, q, method="inverted_cdf"))
    return out, sorted_vals


def rank_err(sorted_vals, est: float, q: float) -> float:
    if sorted_vals is None or sorted_vals.size == 0 or not np.isfinite(est):
        return 1.0
    return abs(np.searchsorted(sorted_vals, est, side="right") / sorted_vals.size - q)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--cells", default=DEFAULT_CELLS)
    ap.add_argument("--q", default="0.5,0.9")
    ap.add_argument("--no-tumult", action="store_true")
    args = ap.parse_args()
    qs = [float(v) for v in args.q.split(",")]
    cells = [c for c in CELLS if re.search(args.cells, c.name)]
    from benchmarks.anchors import tumult

    use_tumult, msg = (False, "disabled") if args.no_tumult else tumult.available()
    print(f"grouped quantiles, epsilon {EPSILON}, {args.seeds} seeds; Tumult: {msg}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="grouped-quantile-"))
    results: dict = {}
    tq: dict = {}  # (cell, q) -> query rows for Tumult
    t_ours = 0.0
    for cell in cells:
        by = cell_group_by(cell)
        seeds = min(args.seeds, cell.seeds) if cell.seeds else args.seeds
        for s in range(seeds):
            d = cell_data(cell, s)
            t = truth(d)
            kjs = [key_json(k) for k in d.keys]
            kpos = {k: i for i, k in enumerate(kjs)}
            for q in qs:
                ex, sv = exact_quantiles(d, q)
                t0 = time.perf_counter()
                src = FastGroupedInput([f"p{p}" for p in d.person], [kjs[g] for g in d.group], {"v": d.value},
                                       f"{hash((cell.name, s, q)) & (2**256 - 1):064x}", cell.l0, public=kjs)
                cfg = config(q, by, cell.l0, d.keys)
                rels = run_grouped_numpy(cfg, cfg.statistics[0], src, SeededNoise([cell.key(), s, int(q * 100)]))
                t_ours += time.perf_counter() - t0
                est = np.full(len(kjs), np.nan)
                for r in rels:
                    if r.release.status == "OK":
                        est[kpos[key_json([r.key[c] for c in by])]] = r.release.estimate[0]
                acc = results.setdefault((cell.name, q), {"ours": [], "ours_rank": [], "tumult": [],
                                                          "tumult_rank": [], "fails": 0, "groups": 0})
                for g in range(len(kjs)):
                    if not np.isfinite(ex[g]):
                        continue
                    acc["groups"] += 1
                    ok = np.isfinite(est[g])
                    acc["fails"] += int(not ok)
                    acc["ours"].append(abs(est[g] - ex[g]) if ok else np.inf)
                    acc["ours_rank"].append(rank_err(sv[g], est[g], q))
                if use_tumult:
                    job = tq.setdefault((cell.name, q), {"ids": [], "gs": [], "vals": [], "jobs": [], "id_next": 0,
                                                          "g_next": 0, "l0": cell.l0})
                    G = len(kjs)
                    job["ids"].append(d.person + job["id_next"])
                    job["gs"].append(d.group + job["g_next"])
                    job["vals"].append((d.value - t.lo[d.group]) / (t.hi[d.group] - t.lo[d.group]))
                    job["jobs"].append((s, job["g_next"], G, t.lo, t.hi, ex, sv))
                    job["id_next"] += int(d.person.max()) + 1
                    job["g_next"] += G
        print(f"  ours done: {cell.name}", flush=True)
    if use_tumult and tq:
        import pyarrow as pa
        import pyarrow.parquet as pq

        from benchmarks.anchors.tumult import PYTHON, worker_env

        spec = {"epsilon": EPSILON, "out_dir": str(work), "queries": []}
        names = list(tq)
        for i, key in enumerate(names):
            job = tq[key]
            path = work / f"q{i}.parquet"
            pq.write_table(pa.table({"id": np.concatenate(job["ids"]).astype(np.int64),
                                     "g": np.concatenate(job["gs"]).astype(np.int64),
                                     "value": np.concatenate(job["vals"]).astype(np.float64)}), path)
            spec["queries"].append({"name": f"q{i}", "parquet": str(path), "l0": job["l0"], "n_keys": job["g_next"],
                                    "aggs": [f"quantile:{key[1]}"]})
        (work / "spec.json").write_text(json.dumps(spec))
        env = worker_env()
        t0 = time.time()
        with open(work / "tumult.log", "w") as log:
            r = subprocess.run([str(PYTHON), str(TUMULT_WORKER), str(work / "spec.json")], stdout=log, stderr=log,
                               env=env)
        if r.returncode != 0:
            raise RuntimeError(f"Tumult worker failed; see {work / 'tumult.log'}")
        print(f"Tumult: {time.time() - t0:.0f} s", flush=True)
        for i, key in enumerate(names):
            job = tq[key]
            z = np.load(work / f"q{i}.quantile:{key[1]}.npz")
            a = np.full(job["g_next"], np.nan)
            a[z["g"]] = z["value"]
            acc = results[key]
            for s, g0, G, lo, hi, ex, sv in job["jobs"]:
                est = lo + (hi - lo) * a[g0:g0 + G]
                for g in range(G):
                    if not np.isfinite(ex[g]):
                        continue
                    acc["tumult"].append(abs(est[g] - ex[g]) if np.isfinite(est[g]) else np.inf)
                    acc["tumult_rank"].append(rank_err(sv[g], est[g], key[1]))
    print(f"\nours: {t_ours:.0f} s\n")
    print("| cell | q | groups x seeds | ours abs error median / p90 | Tumult [p1, p99] | ours / Tumult | "
          "rank error ours / Tumult (median) | ours not OK |")
    print("|---|---|---|---|---|---|---|---|")
    for (name, q), acc in results.items():
        o = np.array(acc["ours"])
        tu = np.array(acc["tumult"]) if acc["tumult"] else np.array([np.nan])
        ratio = np.median(o) / np.median(tu) if acc["tumult"] else float("nan")
        print(f"| {name} | {q:g} | {acc['groups']} | {np.median(o):.3g} / {np.percentile(o, 90):.3g} | "
              f"{np.median(tu):.3g} / {np.percentile(tu, 90):.3g} | {ratio:.2f} | "
              f"{np.median(acc['ours_rank']):.4f} / {np.median(acc['tumult_rank']) if acc['tumult_rank'] else float('nan'):.4f} | "
              f"{acc['fails']}/{acc['groups']} |")


if __name__ == "__main__":
    main()
