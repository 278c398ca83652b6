"""Wall time of the same person-level mean in ours, Tumult Analytics and PipelineDP on Spark.

    python -m benchmarks.scale.anchors_speed --sizes 1e6,1e7 [--skew uniform] [--repeats 2]
        [--no-tumult] [--no-pdp] [--data-dir build/scale-data]

One mean of ``x0`` over the scale benchmark's synthetic records (``benchmarks/scale/data.py``;
100 records per person by default), epsilon 1, each tool as a user would run it:

- **ours**: ``spark_jobs.job.run_job`` with one ``kind: mean`` statistic (no bounds; delta 1e-6),
  Delta written to a temp folder, ledger off; the shared session (``local[2]``).
- **plain Spark** (the baseline of every ratio): ``groupBy(person)`` mean, then the mean of those,
  in the same session.
- **PipelineDP 0.3.1** (``SparkRDDBackend`` on the same session's SparkContext): ``Metrics.MEAN``,
  one public partition, ``max_partitions_contributed = 1``, ``max_contributions_per_partition =
  records per person``, bounds [-20, 30] (the data's person means lie in [0, 10], record noise sd
  <= 5), Laplace, ``NaiveBudgetAccountant(1, 0)``.
- **Tumult Analytics 0.21.0** (its own venv with pyspark 3.5.9, ``python -m benchmarks.anchors
  --setup-tumult``; a subprocess with its own ``local[2]`` session, ``anchors/tumult_speed_worker.py``):
  ``AddRowsWithID("person")``, ``MaxRowsPerID(records per person)``, ``average("x0", -20, 30)``
  under ``PureDPBudget(1)``. Its time excludes its JVM start (reported separately).

The anchors compute a record-level mean with each person's records capped (their person-level
option); ours the mean of person means. Same data, same epsilon, same machine; one untimed read
of the files first, then medians of ``--repeats`` runs with the order of plain / ours / PipelineDP
rotating (Tumult runs in its own process afterwards, its repeats in one session).
Not part of ``make test``; results in ``benchmarks/results/scale.md``.
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
from pathlib import Path

from benchmarks.anchors.tumult import PYTHON as TUMULT_PY
from benchmarks.anchors.tumult import worker_env
from benchmarks.scale.run import _num

HERE = Path(__file__).resolve().parent
TUMULT_WORKER = HERE.parent / "anchors" / "tumult_speed_worker.py"
LOW, HIGH = -20.0, 30.0


def ours(spark, path: str) -> float:
    from spark_jobs.config import parse_config
    from spark_jobs.job import run_job

    out = tempfile.mkdtemp(prefix="anchors-speed-")
    try:
        cfg = parse_config({
            "job_name": "anchors-speed", "input": {"path": path, "format": "parquet"},
            "privacy_unit": {"column": "person"}, "budget": {"epsilon": 1.0, "delta": 1e-6},
            "statistics": [{"name": "m", "kind": "mean", "columns": ["x0"], "share": 1.0}],
            "output": {"path": out}, "ledger": {"enabled": False},
        })
        t0 = time.perf_counter()
        res = run_job(cfg, spark=spark)
        dt = time.perf_counter() - t0
        assert res.rows and res.rows[0].status == "OK", res.rows
        return dt
    finally:
        shutil.rmtree(out, ignore_errors=True)


def plain(spark, path: str) -> float:
    from pyspark.sql import functions as F

    t0 = time.perf_counter()
    spark.read.parquet(path).groupBy("person").agg(F.mean("x0").alias("m")).agg(F.mean("m")).collect()
    return time.perf_counter() - t0


def pipelinedp(spark, path: str, per_person: int) -> float:
    import pipeline_dp

    t0 = time.perf_counter()
    rdd = spark.read.parquet(path).select("person", "x0").rdd.map(tuple)
    acc = pipeline_dp.NaiveBudgetAccountant(total_epsilon=1.0, total_delta=0.0)
    engine = pipeline_dp.DPEngine(acc, pipeline_dp.SparkRDDBackend(spark.sparkContext))
    params = pipeline_dp.AggregateParams(
        metrics=[pipeline_dp.Metrics.MEAN], noise_kind=pipeline_dp.NoiseKind.LAPLACE, max_partitions_contributed=1,
        max_contributions_per_partition=per_person, min_value=LOW, max_value=HIGH)
    ext = pipeline_dp.DataExtractors(privacy_id_extractor=lambda r: r[0], partition_extractor=lambda r: 0,
                                     value_extractor=lambda r: r[1])
    result = engine.aggregate(rdd, params, ext, public_partitions=[0])
    acc.compute_budgets()
    got = result.collect()
    dt = time.perf_counter() - t0
    assert len(got) == 1, got
    return dt


def tumult(path: str, per_person: int, repeats: int) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="tumult-speed-"))
    out, log = tmp / "out.json", tmp / "worker.log"
    cmd = [str(TUMULT_PY), str(TUMULT_WORKER), path, str(per_person), str(LOW), str(HIGH), str(repeats), str(out)]
    with open(log, "w") as f:  # Tumult's own pyspark 3.5 and Python workers (never this venv's pyspark 4)
        r = subprocess.run(cmd, stdout=f, stderr=f, env=worker_env())
    if r.returncode != 0 or not out.exists():
        raise RuntimeError(f"Tumult worker failed (exit {r.returncode}); see {log} (kept)")
    result = json.loads(out.read_text())
    shutil.rmtree(tmp, ignore_errors=True)
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1e6,1e7", help="records, comma-separated")
    ap.add_argument("--records-per-person", type=_num, default=100)
    ap.add_argument("--skew", default="uniform")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--no-tumult", action="store_true")
    ap.add_argument("--no-pdp", action="store_true")
    ap.add_argument("--data-dir", default="build/scale-data")
    ap.add_argument("--driver-memory", default="8g")
    args = ap.parse_args(argv)

    import importlib.util

    if not args.no_pdp and importlib.util.find_spec("pipeline_dp") is None:
        print("# PipelineDP not installed (pip install -e '.[bench]'): its column is left out", flush=True)
        args.no_pdp = True
    if not args.no_tumult and not TUMULT_PY.exists():
        print("# no Tumult venv (python -m benchmarks.anchors --setup-tumult): its column is left out", flush=True)
        args.no_tumult = True
    from benchmarks.scale.data import ensure_dataset
    from spark_jobs.spark.session import build_session

    spark = build_session("local[2]", "anchors-speed", {"spark.driver.memory": args.driver_memory})
    spark.sparkContext.setLogLevel("ERROR")
    print(f"# anchors speed: local[2], cores={os.cpu_count()}, repeats={args.repeats}, "
          f"{time.strftime('%Y-%m-%d %H:%M:%S')}", flush=True)
    print("| records | persons | plain Spark s | ours s | PipelineDP s | Tumult s (+ JVM start) | ours / plain | "
          "PipelineDP / ours | Tumult / ours |")
    print("|---|---|---|---|---|---|---|---|---|")
    for records in (_num(s) for s in args.sizes.split(",")):
        persons = max(1, records // args.records_per_person)
        path = ensure_dataset(spark, os.path.abspath(args.data_dir), records, persons, args.skew)
        plain(spark, path)  # untimed: the first read of the files (OS cache, Spark's listing) for no one
        t_plain, t_ours, t_pdp = [], [], []
        for rep in range(args.repeats):
            runs = [("plain", lambda: t_plain.append(plain(spark, path))),
                    ("ours", lambda: t_ours.append(ours(spark, path)))]
            if not args.no_pdp:
                runs.append(("pdp", lambda: t_pdp.append(pipelinedp(spark, path, args.records_per_person))))
            for _, run in runs[rep % len(runs):] + runs[:rep % len(runs)]:  # the order rotates
                run()
        tm = None if args.no_tumult else tumult(path, args.records_per_person, args.repeats)
        p, o = statistics.median(t_plain), statistics.median(t_ours)
        d = statistics.median(t_pdp) if t_pdp else None
        t = statistics.median(tm["seconds"]) if tm else None
        fmt = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
        ratio = lambda a, b: "-" if a is None or b is None else f"{a / b:.2f}"  # noqa: E731
        tcell = "-" if tm is None else f"{t:.1f} (+{tm['start_seconds']:.0f})"
        print(f"| {records:.0e} | {persons:.0e} | {p:.1f} | {o:.1f} | {fmt(d)} | {tcell} | {o / p:.2f} | "
              f"{ratio(d, o)} | {ratio(t, o)} |", flush=True)
        print(f"  raw: plain {t_plain}, ours {t_ours}, pdp {t_pdp}, tumult {tm}", file=sys.stderr, flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
