"""Tumult Analytics' timing for ``benchmarks/scale/anchors_speed.py``, run inside
benchmarks/anchors/.tumult-venv (pyspark 3.5)::

    .tumult-venv/bin/python tumult_speed_worker.py PARQUET PER_PERSON LOW HIGH REPEATS OUT.json

A ``local[2]`` session; per repeat: read the Parquet, ``Session.from_dataframe`` with
``AddRowsWithID("person")``, ``enforce(MaxRowsPerID(PER_PERSON))``, ``average("x0", LOW, HIGH)``
under ``PureDPBudget(1)``, ``evaluate`` and collect. OUT.json: ``{"seconds": [...],
"start_seconds": ..., "estimates": [...], "versions": {...}}``.
"""

from __future__ import annotations

import json
import sys
import time


def main(argv: list[str]) -> int:
    path, per_person, low, high, repeats, out = argv
    t0 = time.perf_counter()
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("tumult-speed")
             .config("spark.driver.memory", "8g").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "8").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    import tmlt.analytics
    from tmlt.analytics import AddRowsWithID, MaxRowsPerID, PureDPBudget, QueryBuilder, Session

    start = time.perf_counter() - t0
    seconds, estimates = [], []
    for _ in range(int(repeats)):
        t1 = time.perf_counter()
        df = spark.read.parquet(path).select("person", "x0")
        sess = Session.from_dataframe(privacy_budget=PureDPBudget(1.0), source_id="r", dataframe=df,
                                      protected_change=AddRowsWithID("person"))
        q = QueryBuilder("r").enforce(MaxRowsPerID(int(per_person))).average("x0", float(low), float(high))
        rows = sess.evaluate(q, PureDPBudget(1.0)).collect()
        seconds.append(time.perf_counter() - t1)
        estimates.append(float(rows[0][0]))
    with open(out, "w") as f:
        json.dump({"seconds": seconds, "start_seconds": start, "estimates": estimates,
                   "versions": {"tmlt.analytics": getattr(tmlt.analytics, "__version__", "?"),
                                "pyspark": spark.version}}, f)
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
