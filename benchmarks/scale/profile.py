"""Step-by-step profiles of the product's passes (benchmarks/README.md, "Scale", profiles).

    python -m benchmarks.scale.profile {summarize,batches,capped,job} [--data DIR] [--d 1|8] [--repeats 3]

``--data`` is a dataset written by ``benchmarks.scale.run`` (default: 10^7 records, 10^5 persons,
uniform, under build/scale-data). Each step adds one piece of the pass to the step above and is
forced with a ``noop`` write (``ops.force``); steps alternate within each repetition; printed:
median seconds and the ratio to the plain baseline of the first row, as Markdown rows.
``job`` runs the release job of ``benchmarks.scale.ops`` twice with the job's INFO log
(timestamps in ms) and one plain d = 8 pass. Not part of ``make test``.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time

from benchmarks.scale import ops

DEFAULT_DATA = "build/scale-data/r10000000_p100000_uniform_v1"


def _summarize_steps(df, d):
    from pyspark.sql import functions as F

    from spark_jobs.spark import summarize as S

    cols = ops.VALUE_COLUMNS[:d]
    names = [f"_u{i}" for i in range(d)]

    def raw():
        rows = df.select(F.col("person").alias("_pid"), *[F.col(c).alias(n) for c, n in zip(cols, names)])
        return S._limb_sums(rows, cols, names)

    def usable():
        rows = df.select(F.col("person").cast("string").alias("_pid"), *[S._usable(c).alias(n) for c, n in zip(cols, names)])
        return S._limb_sums(rows, cols, names)

    return {
        f"plain per-person count/sum/avg d={d}": lambda: ops.plain_person(df, d),
        "limb sums of the raw columns (no record rules)": raw,
        "+ record rules (NaN/inf dropped, clamp)": usable,
        "+ id rules, group index (= summarize pass)": lambda: ops.summarize_pass(df, d),
    }


def _batches_steps(df, m):
    from pyspark.sql import functions as F

    from spark_jobs.spark import batches as B
    from spark_jobs.spark import keys as K

    def counted():
        return B._category_counts(df, "person", "cat", ops.CATEGORIES, ops.SALT, ("NA", ""))

    def keyed():
        return K.with_record_key(K.number_copies(counted().repartition("_pid"), ["_pid", "_label", "_cat"]), ops.SALT)

    return {
        "plain groupBy(person, cat).count()": lambda: ops.plain_person_category(df),
        "+ JSON label, partial count of (person, label, cat)": counted,
        "+ SHA-256 label, exchange by person": lambda: counted().groupBy("_pid").agg(F.sum("_cnt"), F.max("_label")),
        "+ copies, SHA-256 key per record": keyed,
        f"+ min_by (= batches pass, m={m})": lambda: ops.batches_pass(df, m),
    }


def _capped_steps(df, cap):
    from pyspark.sql import functions as F

    from dplib.groups import derive_salt
    from spark_jobs.spark import summarize as S
    from spark_jobs.spark.keys import number_copies, with_record_key

    salt = derive_salt(ops.SALT, S.CAP_SALT_TAG)

    def rec(label=True):
        cols = [F.col("person").cast("string").alias("_pid")]
        if label:
            cols.append(F.sha2(F.to_json(F.struct("x0")), 256).alias("_label"))
        cols.append(F.struct(S._usable("x0").alias("_v0")).alias("_rec"))
        return df.select(*cols).repartition("_pid")

    def counted():
        return rec().groupBy("_pid", "_label", "_rec").agg(F.count(F.lit(1)).alias("_cnt"))

    return {
        "plain per-person count/sum/avg d=1": lambda: ops.plain_person(df, 1),
        "select + shuffle by person": lambda: rec(False),
        "+ SHA-256 label of the JSON of the value columns": rec,
        "+ hash-aggregated count of identical (person, label, values)": counted,
        "+ copies, SHA-256 key per record": lambda: with_record_key(number_copies(counted(), ["_pid", "_label", "_rec"]), salt, keep=("_rec",)),
        f"+ min_by keeping R={cap}, limb sums (= capped summarize)": lambda: ops.summarize_pass(df, 1, cap=cap),
    }


def _time_steps(steps, repeats):
    times = {k: [] for k in steps}
    for _ in range(repeats):
        for name, fn in steps.items():
            t0 = time.perf_counter()
            ops.force(fn())
            times[name].append(time.perf_counter() - t0)
    base = statistics.median(next(iter(times.values())))
    print("| step (each adds to the one above) | median s | / first row |\n|---|---|---|")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"| {name} | {med:.2f} | {med / base:.2f}x |", flush=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["summarize", "batches", "capped", "job"])
    ap.add_argument("--data", default=DEFAULT_DATA)
    ap.add_argument("--d", type=int, default=1, choices=[1, 8])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--m", type=int, default=10)
    ap.add_argument("--cap", type=int, default=10)
    args = ap.parse_args(argv)

    from spark_jobs.spark.session import build_session

    spark = build_session("local[2]", "scale-profile", {"spark.driver.memory": "8g", "spark.sql.shuffle.partitions": "8"})
    spark.sparkContext.setLogLevel("ERROR")
    df = spark.read.parquet(args.data)
    ops.force(ops.plain_person(df, 1))  # warm-up
    if args.what == "job":
        logging.basicConfig(level=logging.INFO, format="%(relativeCreated)8.0f ms %(name)s %(message)s")
        logging.getLogger("py4j").setLevel(logging.WARNING)
        for _ in range(2):
            t0 = time.perf_counter()
            ops.run_release_job(spark, args.data, tempfile.mkdtemp(prefix="scale-profile-"), args.m)
            print(f"release job: {time.perf_counter() - t0:.2f} s", flush=True)
        t0 = time.perf_counter()
        ops.force(ops.plain_person(df, 8))
        print(f"plain per-person d=8: {time.perf_counter() - t0:.2f} s", flush=True)
        return
    steps = {"summarize": lambda: _summarize_steps(df, args.d), "batches": lambda: _batches_steps(df, args.m),
             "capped": lambda: _capped_steps(df, args.cap)}[args.what]()
    _time_steps(steps, args.repeats)


if __name__ == "__main__":
    main()
