"""Grouped statistics at scale: 10^5 groups, 10^7 records, against a plain Spark
``groupBy(group, person)`` aggregation in the same run.

Data (generated in Spark once, Parquet under ``--data-dir``): ``records`` records of
``records / 100`` persons (record ``i`` belongs to person ``i % persons``); person ``p`` is in
``1 + xxhash(p) % 20`` groups (1-20) and its records cycle through them; a group is
``xxhash(p, slot) % groups``; the value is a group effect ``(g % 1000) / 100`` plus N(0, 1).

Timed, in one process and one Spark session: (a) the plain per-(group, person) mean,
``groupBy(grp, person).agg(avg(x))`` written to the ``noop`` sink; (b) our whole release job with
two grouped statistics over every one of the ``groups`` public keys, L0 = 5: the person-level mean
per group and the person count per group (production noise; ledger off). Prints wall times, the
ratio, the number of Spark aggregations the grouped runs used and the release statuses.

    python -m benchmarks.grouped_scale [--records 1e7] [--groups 1e5] [--master local[2]]

Not part of ``make test``.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import time


def _num(s: str) -> int:
    return int(float(s))


def ensure_data(spark, root: str, records: int, groups: int) -> str:
    from pyspark.sql import functions as F

    path = os.path.join(root, f"grouped_r{records}_g{groups}_v1")
    if os.path.exists(os.path.join(path, "_SUCCESS")):
        return path
    persons = max(1, records // 100)
    df = spark.range(0, records, 1, max(2, records // 4_000_000))
    p = F.col("id") % F.lit(persons)
    n_groups = F.lit(1) + F.pmod(F.xxhash64(p, F.lit(3)), F.lit(20))
    slot = F.col("id") % n_groups
    grp = F.pmod(F.xxhash64(p, slot, F.lit(5)), F.lit(groups))
    df = df.select(F.concat(F.lit("u"), p.cast("string")).alias("person"), grp.alias("grp"),
                   ((grp % F.lit(1000)) / F.lit(100.0) + F.randn(7)).alias("x"))
    df.write.mode("overwrite").parquet(path)
    return path


class _Count(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(f"{time.strftime('%H:%M:%S')} {record.getMessage()}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=_num, default=10**7)
    ap.add_argument("--groups", type=_num, default=10**5)
    ap.add_argument("--l0", type=int, default=5)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--driver-memory", default="8g")
    ap.add_argument("--data-dir", default="build/scale-data")
    ap.add_argument("--out", default="build/grouped-scale")
    args = ap.parse_args(argv)

    from pyspark.sql import functions as F

    from spark_jobs.config import parse_config
    from spark_jobs.job import run_job
    from spark_jobs.spark.session import build_session

    spark = build_session(args.master, "grouped-scale", {"spark.driver.memory": args.driver_memory,
                                                         "spark.sql.shuffle.partitions": "8"}, "WARN")
    t0 = time.time()
    path = ensure_data(spark, args.data_dir, args.records, args.groups)
    print(f"data: {path} ({args.records:,} records, {args.groups:,} groups; {time.time() - t0:.0f} s)")

    t0 = time.time()
    spark.read.parquet(path).groupBy("grp", "person").agg(F.avg("x")).write.format("noop").mode("overwrite").save()
    plain = time.time() - t0
    print(f"plain groupBy(grp, person).agg(avg(x)) -> noop: {plain:.1f} s")

    keys = [[str(g)] for g in range(args.groups)]
    grouped = {"group_by": ["grp"], "max_groups_per_person": args.l0, "groups": {"keys": keys}}
    cfg = parse_config({
        "job_name": "grouped-scale", "input": {"path": os.path.abspath(path), "format": "parquet"},
        "privacy_unit": {"column": "person"}, "budget": {"epsilon": 1.0, "delta": 1e-6},
        "statistics": [
            {"name": "mean_by_group", "kind": "mean", "columns": ["x"], "share": 0.5, **grouped},
            {"name": "persons_by_group", "kind": "count", "columns": ["x"], "share": 0.5, **grouped},
        ],
        "output": {"path": os.path.abspath(args.out)}, "ledger": {"enabled": False},
    })
    handler = _Count()
    for name in ("person_dp.grouping", "person_dp.job"):
        lg = logging.getLogger(name)
        lg.setLevel(logging.INFO)
        lg.addHandler(handler)
    t0 = time.time()
    result = run_job(cfg, spark=spark)
    ours = time.time() - t0
    statuses: dict = {}
    for r in result.rows:
        statuses.setdefault(r.statistic, {}).setdefault(r.status, 0)
        statuses[r.statistic][r.status] += 1
    aggs = [m for m in handler.lines if re.search(r"group\(s\) released in \d+ aggregation", m)]
    print(f"our release job (2 grouped statistics x {args.groups:,} groups): {ours:.1f} s "
          f"= {ours / plain:.1f}x the plain pass")
    for line in handler.lines:
        print(f"  log: {line}")
    del aggs
    for name, st in statuses.items():
        print(f"  {name}: {st}")
    spark.stop()


if __name__ == "__main__":
    main()
