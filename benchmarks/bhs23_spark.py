"""BHS23 on Spark: wall time of the person-level path vs one plain Spark Gram pass, same run.

    # synthetic records for conf/examples/synthetic_bhs23.yaml (2 records per person, d = 3):
    python benchmarks/bhs23_spark.py generate --persons 400000 --out build/data/bhs23_synthetic.parquet
    # the measurement (1e6 persons, d = 10, generated inside Spark; medians of --repeats):
    python benchmarks/bhs23_spark.py bench --persons 1000000 --d 10 --repeats 3

``bench`` times (a) one plain Spark aggregation of the Gram matrix (built-in ``sum`` of the
d(d+1)/2 products) and (b) Algorithm 1 through ``spark_jobs.spark.vectors`` (keyed sort, pair rows,
Gram pass, score passes, core pass) on the same cached person vectors, and prints the ratio and
the number of data passes (a benchmark-only figure: it depends on the data and is never released).
Seeded noise: NOT for release.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def generate(persons: int, out: str, seed: int = 1) -> None:
    import os

    import pandas as pd

    rng = np.random.default_rng(seed)
    a = np.array([[2.0, 0.0, 0.0], [1.5, 0.5, 0.0], [-1.0, 3.0, 0.2]])
    recs = rng.standard_normal((persons, 2, 3)) @ a.T + [100.0, -7.0, 0.5]
    pdf = pd.DataFrame({"person": np.repeat([f"p{i}" for i in range(persons)], 2),
                        "x1": recs[:, :, 0].ravel(), "x2": recs[:, :, 1].ravel(), "x3": recs[:, :, 2].ravel()})
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    pdf.to_parquet(out, index=False)
    print(f"wrote {2 * persons} records of {persons} persons to {out}")


def bench(persons: int, d: int, repeats: int) -> None:
    from pyspark.sql import functions as F

    from dplib.budget import Budget
    from dplib.covariance.params import PrivateMeanPlan
    from dplib.covariance.private import private_mean
    from dplib.groups import new_salt
    from dplib.mechanisms import SeededNoise
    from spark_jobs.spark.vectors import SparkPersonVectors
    from spark_jobs.spark.session import build_session

    spark = build_session("local[2]", "bhs23-bench", {"spark.sql.shuffle.partitions": "8"})
    cols = [f"c{j}" for j in range(d)]
    df = spark.range(persons).select(
        F.concat(F.lit("p"), F.col("id").cast("string")).alias("_pid"),
        *[(F.randn(100 + j) * (1 + j) + 10.0 * j).alias(c) for j, c in enumerate(cols)],
    ).persist()
    df.count()
    plan = PrivateMeanPlan(Budget(0.9, 1e-6), persons, d)
    base, bhs, passes = [], [], []
    for r in range(repeats):
        t0 = time.perf_counter()
        df.agg(*[F.sum(F.col(a) * F.col(b)) for i, a in enumerate(cols) for b in cols[i:]]).collect()
        base.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        backend = SparkPersonVectors(df, cols, new_salt()).backend(persons, np.zeros(d), persons)
        out = private_mean(backend, plan, SeededNoise(r))
        backend.close()
        bhs.append(time.perf_counter() - t0)
        passes.append(out.diagnostics.passes)
        print(f"repeat {r}: gram pass {base[-1]:.1f} s, BHS23 {bhs[-1]:.1f} s, passes {passes[-1]}, {out.release.status}")
    mb, mh = statistics.median(base), statistics.median(bhs)
    print(f"n={persons} d={d} k={plan.k} M={plan.M} lambda0={plan.lambda0:.1f}: median gram pass {mb:.1f} s, "
          f"median BHS23 {mh:.1f} s, ratio {mh / mb:.1f}, passes {passes}")
    spark.stop()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate")
    g.add_argument("--persons", type=int, default=400000)
    g.add_argument("--out", default="build/data/bhs23_synthetic.parquet")
    b = sub.add_parser("bench")
    b.add_argument("--persons", type=int, default=1000000)
    b.add_argument("--d", type=int, default=10)
    b.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    generate(a.persons, a.out) if a.cmd == "generate" else bench(a.persons, a.d, a.repeats)
