"""Scale benchmark runner: the product's Spark passes against plain Spark (and DuckDB), in one run.

    python -m benchmarks.scale.run --sizes 1e6,1e7 [--skews uniform,zipf] [--repeats 3]
        [--passes summarize1,summarize8,batches,capped] [--cap 10] [--job] [--sql-path]
        [--memory-persons 1e5,1e6,1e7 --memory-records 1e7] [--data-dir build/scale-data]

For each size (records; persons = records / --records-per-person) and skew it writes the
synthetic records once (``benchmarks/scale/data.py``; reused by later runs), then times, with
``--repeats`` interleaved repetitions (the order of product and baseline alternates), each pass
against its own plain baseline in the same session:

- summarize pass (d = 1 and d = 8) vs plain ``groupBy(person)`` count/sum/mean (target <= 1.3x);
- m-draws batches of ``cat`` vs plain ``groupBy(person, cat).count()`` (target <= 1.5x);
- record capping (``capped``: the summarize pass d = 1 with ``max_records_per_person = --cap``)
  vs the plain ``groupBy(person)`` d = 1 (target <= 1.5x);
- with ``--job``: the whole release job (univariate mean + multivariate mean d = 8 +
  distribution, ``spark_jobs.job.run_job`` writing Delta to a temp folder) vs one plain pass
  (the d = 8 per-person aggregation; target <= 2x);
- DuckDB (2 threads) on the same Parquet: the two plain aggregations, as a single-machine reference.

The product passes use the native aggregates when the jar is built (``make native``; the header
line says which); ``--sql-path`` also times every pass on the pure Spark SQL fallback
(``PERSON_DP_NATIVE=0``) against the same baseline, in the same session.

``--memory-persons``: the driver's peak RSS (Python and JVM) for a job of the mean estimators on
``--memory-records`` records spread uniformly over that many persons, each in a fresh process
(``benchmarks/scale/memprobe.py``; target: flat within +-10%).

Reported: medians (seconds), records/s, and the ratio of medians product / baseline (with the
median of the per-repetition ratios beside it). Wall times on a shared machine are noisy; the
ratios, measured within one run, are what the targets are about.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks.scale import ops
from benchmarks.scale.data import ensure_dataset


def _num(s: str) -> int:
    return int(float(s))


def _sql_path(fn):
    """``fn`` run with the native aggregates switched off (spark_jobs/spark/native.py)."""
    def run():
        from spark_jobs.spark.native import ENV_SWITCH

        old = os.environ.get(ENV_SWITCH)
        os.environ[ENV_SWITCH] = "0"
        try:
            return fn()
        finally:
            if old is None:
                os.environ.pop(ENV_SWITCH, None)
            else:
                os.environ[ENV_SWITCH] = old
    return run


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def compare(name: str, base_name: str, base_fn, op_fn, repeats: int, target: float | None, records: int) -> dict:
    """Interleaved timings of ``op_fn`` and ``base_fn``; medians and ratios."""
    tb, to = [], []
    for r in range(repeats):
        if r % 2 == 0:
            tb.append(_timed(base_fn))
            to.append(_timed(op_fn))
        else:
            to.append(_timed(op_fn))
            tb.append(_timed(base_fn))
    mb, mo = statistics.median(tb), statistics.median(to)
    return {
        "op": name, "baseline": base_name, "op_s": mo, "base_s": mb, "ratio": mo / mb,
        "ratio_of_runs": statistics.median(o / b for o, b in zip(to, tb)), "target": target,
        "op_runs": to, "base_runs": tb, "op_rps": records / mo, "base_rps": records / mb,
    }


def duckdb_times(path: str, repeats: int, threads: int) -> dict[str, float]:
    import duckdb

    con = duckdb.connect()
    con.execute(f"SET threads = {threads}")
    out = {}
    for name, sql in ops.duckdb_queries(path, 8).items():
        con.execute(sql).fetchall()  # warm-up (file cache)
        out[name] = statistics.median(_timed(lambda: con.execute(sql).fetchall()) for _ in range(repeats))
    con.close()
    return out


def fmt_row(r: dict) -> str:
    tgt = "" if r["target"] is None else (f"<= {r['target']:g}: " + ("met" if r["ratio"] <= r["target"] else "MISSED"))
    return (
        f"| {r['case']} | {r['op']} | {r['op_s']:.2f} | {r['baseline']} | {r['base_s']:.2f} | "
        f"**{r['ratio']:.2f}x** ({r['ratio_of_runs']:.2f}) | {r['op_rps'] / 1e6:.2f} M | {tgt} |"
    )


def memory_rows(args, root: str, spark) -> list[dict]:
    rows = []
    for persons in args.memory_persons:
        path = ensure_dataset(spark, root, args.memory_records, persons, "uniform")
        rows.append({"persons": persons, "path": path})
    spark.stop()  # the probes start their own sessions
    env = dict(os.environ)
    for r in rows:
        with tempfile.TemporaryDirectory() as out:
            cmd = [sys.executable, "-m", "benchmarks.scale.memprobe", "--data", r["path"], "--out", out,
                   "--master", args.memory_master]
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
            line = [x for x in proc.stdout.splitlines() if x.startswith("MEMPROBE ")]
            if proc.returncode != 0 or not line:
                raise RuntimeError(f"memprobe failed for {r['persons']} persons:\n{proc.stderr[-3000:]}")
            r.update(json.loads(line[0][len("MEMPROBE "):]))
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=lambda s: [_num(x) for x in s.split(",") if x], default=[10**6])
    ap.add_argument("--records-per-person", type=_num, default=100)
    ap.add_argument("--skews", type=lambda s: s.split(","), default=["uniform", "zipf"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--m", type=int, default=10, help="draws per person of the batches and the job")
    ap.add_argument("--job", action="store_true", help="also time the whole release job")
    ap.add_argument("--passes", type=lambda s: [x for x in s.split(",") if x],
                    default=["summarize1", "summarize8", "batches", "capped"],
                    help="comma list of summarize1, summarize8, batches, capped (empty: none)")
    ap.add_argument("--cap", type=int, default=10, help="max_records_per_person of the capped pass")
    ap.add_argument("--sql-path", action="store_true",
                    help="also time each pass on the pure Spark SQL path (PERSON_DP_NATIVE=0), in the same session")
    ap.add_argument("--no-duckdb", action="store_true")
    ap.add_argument("--memory-persons", type=lambda s: [_num(x) for x in s.split(",") if x], default=[])
    ap.add_argument("--memory-records", type=_num, default=10**7)
    ap.add_argument("--memory-master", default="local-cluster[2,1,3072]")
    ap.add_argument("--data-dir", default="build/scale-data")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--driver-memory", default="8g")
    ap.add_argument("--json", default=None, help="append result rows as JSON lines to this file")
    args = ap.parse_args(argv)

    from spark_jobs.spark.session import build_session

    root = os.path.abspath(args.data_dir)
    os.makedirs(root, exist_ok=True)
    spark = build_session(args.master, "scale-bench", {
        "spark.driver.memory": args.driver_memory, "spark.sql.shuffle.partitions": "8",
    })
    spark.sparkContext.setLogLevel("ERROR")
    from spark_jobs.spark.native import enabled as native_enabled

    print(f"# scale benchmark: master={args.master}, cores={os.cpu_count()}, repeats={args.repeats}, "
          f"m={args.m}, native aggregates: {'yes' if native_enabled(spark) else 'NO (SQL path)'}, "
          f"{time.strftime('%Y-%m-%d %H:%M:%S')}", flush=True)
    rows, duck = [], []
    for records in args.sizes:
        persons = max(1, records // args.records_per_person)
        for skew in args.skews:
            t = time.perf_counter()
            path = ensure_dataset(spark, root, records, persons, skew)
            case = f"{records:.0e} rec, {persons:.0e} persons, {skew}"
            print(f"## {case} (data ready in {time.perf_counter() - t:.0f} s: {path})", flush=True)
            df = spark.read.parquet(path)
            plan = []
            for d in (1, 8):
                if f"summarize{d}" in args.passes:
                    plan.append((f"summarize d={d}", f"plain per-person d={d}",
                                 lambda d=d: ops.force(ops.plain_person(df, d)),
                                 lambda d=d: ops.force(ops.summarize_pass(df, d)), 1.3))
            if "batches" in args.passes:
                plan.append((f"batches m={args.m}", "plain person x category",
                             lambda: ops.force(ops.plain_person_category(df)),
                             lambda: ops.force(ops.batches_pass(df, args.m)), 1.5))
            if "capped" in args.passes:
                plan.append((f"capped summarize d=1 R={args.cap}", "plain per-person d=1",
                             lambda: ops.force(ops.plain_person(df, 1)),
                             lambda: ops.force(ops.summarize_pass(df, 1, args.cap)), 1.5))
            if args.job:
                tmp = tempfile.mkdtemp(prefix="scale-job-")
                counter = iter(range(10**6))
                plan.append(("release job (3 statistics)", "plain per-person d=8",
                             lambda: ops.force(ops.plain_person(df, 8)),
                             lambda: ops.run_release_job(spark, path, os.path.join(tmp, str(next(counter))), args.m), 2.0))
            ops.force(ops.plain_person(df, 1))  # warm-up: JIT, file cache
            if args.sql_path:
                plan += [(f"{name} (SQL path)", base, bfn, _sql_path(ofn), target) for name, base, bfn, ofn, target in plan
                         if not name.startswith("release job")]
            for name, base, bfn, ofn, target in plan:
                r = compare(name, base, bfn, ofn, args.repeats, target, records)
                r["case"] = case
                rows.append(r)
                print(fmt_row(r), flush=True)
                if args.json:
                    with open(args.json, "a") as fh:
                        fh.write(json.dumps(r) + "\n")
            if args.job:
                shutil.rmtree(tmp, ignore_errors=True)
            if not args.no_duckdb:
                for name, secs in duckdb_times(path, args.repeats, 2).items():
                    duck.append((case, name, secs, records / secs))
                    print(f"| {case} | DuckDB {name} | {secs:.2f} s | {records / secs / 1e6:.1f} M rec/s |", flush=True)

    print("\n| case | product pass | median s | plain Spark baseline | median s | ratio (median of per-run ratios) | product records/s | target |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(fmt_row(r))
    if duck:
        print("\n| case | DuckDB (2 threads) | median s | records/s |\n|---|---|---|---|")
        for case, name, secs, rps in duck:
            print(f"| {case} | {name} | {secs:.2f} | {rps / 1e6:.1f} M |")
    if args.memory_persons:
        mem = memory_rows(args, root, spark)
        print(f"\n| persons ({args.memory_records:.0e} records) | job s | Python peak RSS MB | driver JVM peak RSS MB |")
        print("|---|---|---|---|")
        for r in mem:
            print(f"| {r['persons']:.0e} | {r['seconds']:.1f} | {r['python_peak_mb']:.0f} | {r['jvm_peak_mb']:.0f} |")
        for key in ("python_peak_mb", "jvm_peak_mb"):
            vals = [r[key] for r in mem]
            print(f"{key}: max/min = {max(vals) / min(vals):.3f} (target <= 1.10 across persons)")
        if args.json:
            with open(args.json, "a") as fh:
                for r in mem:
                    fh.write(json.dumps({"memory": r}) + "\n")
    else:
        spark.stop()


if __name__ == "__main__":
    main()
