"""Driver peak memory of one release job of the mean estimators, in a fresh process.

    python -m benchmarks.scale.memprobe --data DIR --out DIR [--master local-cluster[2,1,3072]]

Prints one JSON line: ``python_peak_mb`` (this process's peak RSS, ``resource.getrusage``) and
``jvm_peak_mb`` (the driver JVM's ``VmHWM`` from ``/proc/<pid>/status``), plus the job's wall time.
Under ``local-cluster`` the executors are separate JVMs, so the JVM figure is the driver's alone;
under ``local[N]`` the one JVM also runs the executors' tasks (shuffle buffers, cached blocks).
"""

from __future__ import annotations

import argparse
import json
import resource
import time


def jvm_peak_mb(spark) -> float:
    """Peak resident set (VmHWM) of the driver JVM, in MB."""
    pid = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    raise RuntimeError("VmHWM not found")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--master", default="local-cluster[2,1,3072]")
    ap.add_argument("--driver-memory", default="4g")
    args = ap.parse_args()

    from benchmarks.scale.ops import run_release_job
    from spark_jobs.spark.session import build_session

    spark = build_session(args.master, "scale-memprobe", {
        "spark.driver.memory": args.driver_memory, "spark.sql.shuffle.partitions": "8",
    })
    spark.sparkContext.setLogLevel("ERROR")
    t = time.perf_counter()
    res = run_release_job(spark, args.data, args.out, m=1, kinds=("mean", "multivariate_mean"))
    secs = time.perf_counter() - t
    out = {
        "seconds": secs,
        "status": [r.status for r in res.rows],
        "python_peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        "jvm_peak_mb": jvm_peak_mb(spark),
    }
    spark.stop()
    print("MEMPROBE " + json.dumps(out))


if __name__ == "__main__":
    main()
