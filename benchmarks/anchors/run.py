"""Entry point: python -m benchmarks.anchors [--quick|--full] [--tumult] [--json out.jsonl] [--seeds N] [--cells REGEX]"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np

from benchmarks.anchors import anchors as A
from benchmarks.anchors import data as D
from benchmarks.anchors import ours as O
from benchmarks.anchors import report as R
from benchmarks.anchors import tumult as T

#: PipelineDP's LocalBackend costs ~20 us per row and aggregate here: per cell, PipelineDP method and
#: bound choice it runs on as many seeds as fit in this many rows (at least 3, at most --seeds).
PDP_ROWS = {"quick": 600_000, "full": 150_000}


def _v(pkg: str) -> str:
    try:
        return version(pkg)
    except PackageNotFoundError:
        return "not installed"


def header(args, cells, have_pdp: bool, tumult_msg: str) -> dict:
    meta = {
        "epsilon": args.epsilon, "delta": args.delta, "seeds": args.seeds, "grid": ("full+big" if args.big else "full") if args.full else "quick",
        "python": platform.python_version(), "numpy": np.__version__, "pipeline-dp": _v("pipeline-dp"),
        "python-dp": _v("python-dp"), "opendp": _v("opendp"), "tumult": tumult_msg,
        "machine": f"{platform.machine()} {os.cpu_count()} cores",
    }
    print(f"anchors benchmark: {len(cells)} cells, {args.seeds} seeds, epsilon = {args.epsilon}, delta = {args.delta}")
    print("  " + ", ".join(f"{k} {meta[k]}" for k in ("python", "numpy", "pipeline-dp", "python-dp", "opendp")))
    print(f"  machine: {meta['machine']}; estimand: mean over persons of each person's mean (per coordinate)")
    print(f"  ours: {O.UNIVARIATE} / {O.MULTIVARIATE}, SeededNoise; error bar: {O.BAR_NOTE}")
    print("  anchors get one row per person (its mean), contribution bound 1, NON-private bounds:")
    print("    p1/p99 = 1st/99th percentile of the person means; 10x = midpoint +- 5 (p99 - p1)")
    if have_pdp:
        print("    pdp     : PipelineDP MEAN, Laplace, eps/2 count + eps/2 centred clamped sum, LocalBackend,"
              f" on as many seeds as fit in {args.pdp_rows:,} rows per cell (>= 3); noise not seeded")
        print("    pdp-coord (d > 1): d x MEAN under one NaiveBudgetAccountant(eps): eps/d per coordinate, Laplace")
        print("    pdp-vec   (d > 1): COUNT Laplace eps/2 + VECTOR_SUM Gaussian (eps/2, delta), L2 clip at the p99 norm"
              " of (mean - coordinate-wise median) (10x: 10 x that), centred by us at the median (PipelineDP 0.3.1:"
              " Laplace only with L1/Linf norms)")
    else:
        print("    pdp     : SKIPPED, pipeline-dp not installed (.venv/bin/python -m pip install -e '.[bench]')")
    print("    opendp  : then_count >> then_laplace (eps/2) and a centred clamped sum >> then_laplace (eps/2), sum on"
          " an i64 grid of (hi-lo)/2^21 (OpenDP's float sum of unknown size charges hi - lo); d = 1 cells only")
    print(f"    tumult  : {tumult_msg}")
    print("  error = |released - exact| (d = 1) / l2 norm (d > 1). A release that is not OK counts as the cell's worst"
          " error: max(largest finite error of any method in the cell, ||exact|| + ||max - min of the person means||)")
    return meta


def pdp_seeds(rows_per_seed: int, seeds: int, budget: int) -> int:
    return int(min(seeds, max(3, budget // max(rows_per_seed, 1))))


def run_cell(cell: D.Cell, args, have_pdp: bool, tjobs: T.TumultJobs | None) -> R.CellResult:
    t_cell = time.time()
    res = R.CellResult(cell)
    eps, delta = args.epsilon, args.delta
    for seed in range(args.seeds):
        x = D.person_means(cell, seed)
        n, d = x.shape
        exact = x.mean(axis=0)
        res.exact[seed] = exact
        res.info["n"] = n
        res.worst_floor = max(res.worst_floor, float(np.linalg.norm(exact) + np.linalg.norm(x.max(0) - x.min(0))))
        err = lambda est: float(np.linalg.norm(np.atleast_1d(est) - exact))  # noqa: E731
        noise_seed = 1_000_003 * seed + cell.key() % 1_000_003

        t = time.time()
        o = O.ours_univariate(x[:, 0], eps, delta, noise_seed) if d == 1 else O.ours_multivariate(x, eps, delta, noise_seed)
        ok = o["status"] == "OK"
        res.add("ours", R.Run(seed, o["status"], o["estimate"], err(o["estimate"]) if ok else math.nan,
                              o["error_bar"], o["flagged"], time.time() - t, {"params": o["params"]}))

        for kind in A.BOUNDS:
            lo, hi = A.bounds(x, kind)
            if d == 1:
                if have_pdp and seed < pdp_seeds(n, args.seeds, args.pdp_rows):
                    t = time.time()
                    est = A.pipelinedp_mean(x, lo, hi, eps)[0]
                    res.add(f"pdp {kind}", R.Run(seed, "OK", est, err(est), seconds=time.time() - t,
                                                 extra={"bounds": [lo[0], hi[0]]}))
                t = time.time()
                est = A.opendp_mean(x[:, 0], float(lo[0]), float(hi[0]), eps)
                res.add(f"opendp {kind}", R.Run(seed, "OK", est, err(est), seconds=time.time() - t,
                                                extra={"bounds": [lo[0], hi[0]]}))
                if tjobs is not None and seed < args.tumult_seeds and n <= args.tumult_max_n:
                    tjobs.add((cell, seed, kind), x[:, 0], float(lo[0]), float(hi[0]))
            elif have_pdp:
                if seed < pdp_seeds(d * n, args.seeds, args.pdp_rows):
                    t = time.time()
                    est = A.pipelinedp_mean(x, lo, hi, eps)
                    res.add(f"pdp-coord {kind}", R.Run(seed, "OK", est, err(est), seconds=time.time() - t,
                                                       extra={"bounds": [lo, hi]}))
                if seed < pdp_seeds(2 * n, args.seeds, args.pdp_rows):
                    center, radius = A.vector_clip(x, kind)
                    t = time.time()
                    est = A.pipelinedp_vector(x, center, radius, eps, delta)
                    res.add(f"pdp-vec {kind}", R.Run(seed, "OK", est, err(est), seconds=time.time() - t,
                                                     extra={"bounds": [center, radius]}))
    if cell.kind == "real":
        res.info.update(D.panel_person_means(cell.dist, cell.columns)[1])
    res.seconds = time.time() - t_cell
    return res


def apply_tumult(results: list[R.CellResult], est: dict) -> None:
    by_cell = {r.cell: r for r in results}
    for (cell, seed, kind), v in est.items():
        r = by_cell[cell]
        ok = v is not None and math.isfinite(v)
        e = float(abs(v - r.exact[seed][0])) if ok else math.nan
        r.add(f"tumult {kind}", R.Run(seed, "OK" if ok else "NO_OUTPUT", v, e))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.anchors", description=__doc__)
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--quick", action="store_true", help="a handful of cells, 5 seeds (default)")
    g.add_argument("--full", action="store_true", help="the full grid, 30 seeds")
    ap.add_argument("--big", action="store_true", help="with --full: add the n = 10^5 multivariate cells")
    ap.add_argument("--seeds", type=int, help="seeds per cell (default 5 quick, 30 full)")
    ap.add_argument("--cells", help="regex on cell names, e.g. 'lomax|flights'")
    ap.add_argument("--json", help="write one JSON line per (cell, method) here")
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--delta", type=float, default=1e-6)
    ap.add_argument("--tumult", action="store_true", help="also run the Tumult anchor (needs its venv)")
    ap.add_argument("--tumult-seeds", type=int, default=5, help="Tumult runs on the first N seeds (default 5)")
    ap.add_argument("--tumult-max-n", type=int, default=10**4, help="Tumult runs on d = 1 cells with n <= this")
    ap.add_argument("--setup-tumult", action="store_true", help="create benchmarks/anchors/.tumult-venv and exit")
    ap.add_argument("--pdp-rows", type=int, help="PipelineDP rows per cell, method and bounds (default 600k quick, 150k full)")
    ap.add_argument("--list", action="store_true", help="print the cells and exit")
    args = ap.parse_args(argv)
    if args.setup_tumult:
        return T.setup()
    args.seeds = args.seeds or (30 if args.full else 5)
    args.pdp_rows = args.pdp_rows or PDP_ROWS["full" if args.full else "quick"]
    cells = D.select(D.full_cells(args.big) if args.full else D.quick_cells(), args.cells)
    if args.list:
        print("\n".join(c.name for c in cells))
        return 0
    try:
        import pipeline_dp  # noqa: F401

        have_pdp = True
    except ImportError:
        have_pdp = False
    tjobs, tumult_msg = None, "not requested (--tumult)"
    if args.tumult:
        ok, msg = T.available()
        if ok:
            tjobs = T.TumultJobs(args.epsilon)
            tumult_msg = (f"{msg}; average(low, high), Laplace, AddRowsWithID + MaxRowsPerID(1), first "
                          f"{args.tumult_seeds} seeds of the d = 1 cells with n <= {args.tumult_max_n:,}, all jobs in one"
                          " grouped evaluate (see tumult_worker.py)")
        else:
            tumult_msg = f"SKIPPED: {msg}"
    meta = header(args, cells, have_pdp, tumult_msg)
    t0 = time.time()
    results = []
    for cell in cells:
        try:
            r = run_cell(cell, args, have_pdp, tjobs)
        except D.MissingPanel as e:
            print(f"  skip {cell.name}: {e}", flush=True)
            continue
        results.append(r)
        s = r.stats("ours")
        print(f"  done {cell.name:<30} n={r.info['n']:<7} {r.seconds:6.1f}s  ours median {R.fmt(s['median'])}"
              f"  best p1/p99 {R.fmt(r.best_anchor('p1/p99')[1])}  best 10x {R.fmt(r.best_anchor('10x')[1])}", flush=True)
    if tjobs is not None and tjobs.keys:
        log = Path(args.json).with_suffix(".tumult.log") if args.json else Path("/tmp/anchors-tumult.log")
        print(f"  tumult: {len(tjobs.keys)} releases, {tjobs.rows:,} rows, one worker process (log: {log}) ...", flush=True)
        try:
            est, info = tjobs.run(log)
            apply_tumult(results, est)
            meta["tumult_run"] = info
            print(f"  tumult: done in {info['wall_seconds']:.0f}s (worker: {info['worker_seconds']})", flush=True)
        except RuntimeError as e:
            print(f"  tumult: FAILED: {e}", flush=True)
            meta["tumult_run"] = {"error": str(e)}
    R.print_tables(results)
    R.print_targets(results)
    if args.json:
        R.write_json(args.json, results, meta)
        print(f"\nwrote {args.json}")
    print(f"\n({time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
