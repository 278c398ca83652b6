"""Wall time of the per-person batch plans (``spark_jobs.spark.batches.person_batches``) on synthetic
records, against a plain ``groupBy(person, category).count()`` measured in the same run.

    .venv/bin/python benchmarks/batch_sampling.py --records 1000000 --persons 100000 --m 5 --repeats 4
    .venv/bin/python benchmarks/batch_sampling.py --records 10000000 --persons 1000000 --m 5 --repeats 4 \\
        --plans bottomk,window

Records (generated inside Spark from ``spark.range``, written to Parquet once, every plan reads
the same file): ``person = pmod(xxhash64(id), persons)`` as a string (records per person are
Binomial, mean ``records / persons``), a category drawn from ``k + 2`` values by a hash of the id
(``k - 1`` in the public list, 3 unknown -> OTHER, so ``k`` coordinates), and two more columns (an
int "flight" with 7 values, a string "note" with 1000 values), which makes exact duplicate rows
rare but present. ``spark.sql.shuffle.partitions`` = 8.

The plans run interleaved (baseline, plan 1, plan 2, ..., then again) ``--repeats`` times; the
first round is a warm-up and is left out of the medians. Every timing forces the whole plan with
one aggregate over its output (``count`` and a sum of one coordinate): no person row reaches the
driver. The ratio is median(plan) / median(baseline) of the same run; the per-round ratios are
printed too, since the machine is shared and absolute times drift between rounds.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time

BASELINE = "groupBy(person, category).count()"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--persons", type=int, default=100_000)
    ap.add_argument("--m", type=int, default=5)
    ap.add_argument("--k", type=int, default=20, help="coordinates incl. OTHER")
    ap.add_argument("--repeats", type=int, default=4, help="rounds, the first one is a warm-up")
    ap.add_argument("--plans", default="bottomk,window,collect")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--driver-memory", default="4g")
    args = ap.parse_args()

    from pyspark.sql import functions as F

    from spark_jobs.spark.batches import person_batches
    from spark_jobs.spark.session import build_session

    spark = build_session(
        args.master, "batch-bench", {"spark.sql.shuffle.partitions": "8", "spark.driver.memory": args.driver_memory}
    )
    cats = [f"C{i}" for i in range(args.k - 1)]
    plans = [p for p in args.plans.split(",") if p]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "records.parquet")
        (
            spark.range(args.records)
            .select(
                F.pmod(F.xxhash64("id", F.lit(7)), F.lit(args.persons)).cast("string").alias("person"),
                F.concat(F.lit("C"), F.pmod(F.xxhash64("id", F.lit(11)), F.lit(args.k + 2)).cast("string")).alias("category"),
                (F.col("id") % 7).cast("int").alias("flight"),
                F.concat(F.lit("r"), (F.col("id") % 1000).cast("string")).alias("note"),
            )
            .write.parquet(path)
        )
        salt = "ab" * 32

        def run(name: str) -> float:
            df = spark.read.parquet(path)
            if name == BASELINE:
                out = df.groupBy("person", "category").count().agg(F.count(F.lit(1)), F.sum("count"))
            else:
                b = person_batches(df, "person", "category", cats, args.m, salt, null_values=("",), plan=name)
                out = b.agg(F.count(F.lit(1)), F.sum(F.col("counts")[0]))
            t = time.perf_counter()
            out.collect()
            return time.perf_counter() - t

        names = [BASELINE] + plans
        times: dict[str, list[float]] = {n: [] for n in names}
        for r in range(args.repeats):
            for n in names:
                times[n].append(run(n))
            print(f"  round {r + 1}: " + ", ".join(f"{n.split('(')[0]} {times[n][-1]:.2f}" for n in names), flush=True)
        print(
            f"records={args.records:,} persons={args.persons:,} (~{args.records / args.persons:.0f} records each) "
            f"m={args.m} k={args.k} master={args.master} cpus={os.cpu_count()} {platform.machine()} "
            f"load average at end {os.getloadavg()[0]:.1f}"
        )
        kept = {n: (t[1:] if len(t) > 1 else t) for n, t in times.items()}
        base = statistics.median(kept[BASELINE])
        print("| plan | median s | ratio to baseline | per-round ratios | runs (s, first = warm-up) |")
        print("|---|---|---|---|---|")
        for n in names:
            med = statistics.median(kept[n])
            rounds = [a / b for a, b in zip(kept[n], kept[BASELINE])]
            print(
                f"| {n} | {med:.2f} | {med / base:.2f} | {', '.join(f'{x:.2f}' for x in rounds)} | "
                f"{', '.join(f'{x:.2f}' for x in times[n])} |"
            )


if __name__ == "__main__":
    main()
