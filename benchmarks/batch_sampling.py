"""Wall time of the per-person batch plans (``spark_jobs.batches.person_batches``) on synthetic
records, against a plain ``groupBy(person, category).count()`` measured in the same run.

    .venv/bin/python benchmarks/batch_sampling.py --records 1000000 --persons 20000 --m 20

Records: ``person = id % persons`` (string), a category drawn from 12 values (10 in the public
list, 2 unknown -> OTHER) by a hash of the id, and two more columns (an int flight number, a
string); written to Parquet once, then each plan runs ``--repeats`` times on the same file
(first run discarded as warm-up if ``--repeats`` > 1). Each timing forces the whole plan with an
aggregate over the result (no collect of person rows). Numbers are for the local machine only.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--persons", type=int, default=20_000)
    ap.add_argument("--m", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--master", default="local[2]")
    args = ap.parse_args()

    from pyspark.sql import functions as F

    from spark_jobs.batches import person_batches
    from spark_jobs.session import build_session

    spark = build_session(args.master, "batch-bench", {"spark.sql.shuffle.partitions": "8"})
    cats = [f"C{i}" for i in range(10)]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "records.parquet")
        (
            spark.range(args.records)
            .select(
                (F.col("id") % args.persons).cast("string").alias("person"),
                F.concat(F.lit("C"), (F.abs(F.xxhash64("id")) % 12).cast("string")).alias("category"),
                (F.col("id") % 7).cast("int").alias("flight"),
                F.concat(F.lit("r"), (F.col("id") % 1000).cast("string")).alias("note"),
            )
            .write.parquet(path)
        )
        salt = "ab" * 32

        def run_plan(name: str):
            df = spark.read.parquet(path)
            if name == "groupBy(person, category).count()":
                out = df.groupBy("person", "category").count().agg(F.sum("count"))
            elif name == "keys only (shared prelude)":
                from spark_jobs.batches import _keyed_records

                rec = _keyed_records(df, "person", "category", cats, salt, None, ("",))
                out = rec.agg(F.count(F.lit(1)), F.max("_k1"))
            else:
                b = person_batches(df, "person", "category", cats, args.m, salt, plan=name)
                out = b.agg(F.count(F.lit(1)), F.sum(F.col("counts")[0]))
            t = time.perf_counter()
            out.collect()
            return time.perf_counter() - t

        print(f"records={args.records:,} persons={args.persons:,} (~{args.records // args.persons} records each) "
              f"m={args.m} k={len(cats) + 1} master={args.master}")
        for name in ("groupBy(person, category).count()", "keys only (shared prelude)", "collect", "window"):
            times = [run_plan(name) for _ in range(args.repeats)]
            kept = times[1:] if len(times) > 1 else times
            print(f"  {name:<36} median {statistics.median(kept):6.2f} s  (runs: {', '.join(f'{x:.2f}' for x in times)})")
    spark.stop()


if __name__ == "__main__":
    main()
