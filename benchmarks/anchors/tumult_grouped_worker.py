"""Tumult Analytics anchor for per-group statistics, run inside benchmarks/anchors/.tumult-venv.

Not imported by the rest of the benchmarks: ``benchmarks/grouped_anchors.py`` starts it as a
subprocess::

    benchmarks/anchors/.tumult-venv/bin/python benchmarks/anchors/tumult_grouped_worker.py SPEC.json

SPEC.json: ``{"epsilon": eps, "out_dir": dir, "queries": [{"name", "parquet", "l0", "n_keys",
"aggs"}]}``. Each query's parquet file holds one row per (person, group) of many jobs: ``id``
(int64, the person; ids are distinct across jobs, so a person of one (cell, seed) is never the
same privacy ID as one of another), ``g`` (int64, the group: distinct across jobs, keys
``0 .. n_keys - 1``) and ``value`` (float64, the person's mean in the group mapped affinely so
that the group's clamping bounds become [0, 1]).

Per query: one ``Session.from_dataframe(..., protected_change=AddRowsWithID("id"))`` with
``PureDPBudget(eps * len(aggs))`` and, per aggregation, one evaluate of::

    QueryBuilder(src).enforce(MaxGroupsPerID("g", l0)).enforce(MaxRowsPerGroupPerID("g", 1))
        .groupby(KeySet.from_dataframe(<g = 0 .. n_keys - 1>))
        .average("value", low=0, high=1, mechanism="laplace")      # or .count(mechanism="laplace")

under ``PureDPBudget(eps)``: each ID keeps at most ``l0`` groups (Tumult's own truncation) and one
row per group, so the L1 sensitivity is ``l0`` times that of one row: every job gets the noise it
would get alone (its IDs touch only its own groups). The count after the two constraints is the
number of persons per group. Answers are written to ``<out_dir>/<name>.<agg>.npz`` (``g``,
``value``; NaN where Tumult returns none).

A query with ``"truncation": "rows"`` (``benchmarks/distribution_anchors.py``: counts of records per
category) holds one row per record and runs ``enforce(MaxRowsPerID(l0)).groupby(keys).count()``
instead: each ID keeps at most ``l0`` records (Tumult's own sampling), L1 sensitivity ``l0``.
An aggregation ``"quantile:<q>"`` runs ``.quantile("value", q, low=0, high=1)`` per group
(``benchmarks/grouped_quantile.py``).

Prints nothing but Spark's log; writes ``<out_dir>/result.json``: per query and aggregation the
wall seconds of the evaluate, plus Spark start time and the versions.
"""

from __future__ import annotations

import json
import os
import sys
import time


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    t0 = time.time()
    spec = json.loads(open(argv[0]).read())
    import numpy as np
    import pyspark
    import tmlt.analytics as ta
    import tmlt.core
    from pyspark.sql import SparkSession
    from tmlt.analytics import (
        AddRowsWithID,
        KeySet,
        MaxGroupsPerID,
        MaxRowsPerGroupPerID,
        MaxRowsPerID,
        PureDPBudget,
        QueryBuilder,
        Session,
    )

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master("local[1]")
        .appName("grouped-anchors-tumult")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.driver.memory", "6g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    eps = float(spec["epsilon"])
    out_dir = spec["out_dir"]
    result: dict = {"spark_start": time.time() - t0, "queries": {}}
    for q in spec["queries"]:
        name, l0, aggs = q["name"], int(q["l0"]), list(q["aggs"])
        t1 = time.time()
        df = spark.read.parquet(q["parquet"])
        keys = KeySet.from_dataframe(spark.range(int(q["n_keys"])).withColumnRenamed("id", "g"))
        sess = Session.from_dataframe(privacy_budget=PureDPBudget(eps * len(aggs)), source_id=name, dataframe=df,
                                      protected_change=AddRowsWithID("id"))
        info = {"session_seconds": time.time() - t1}
        for agg in aggs:
            t2 = time.time()
            if q.get("truncation", "groups") == "rows":
                base = QueryBuilder(name).enforce(MaxRowsPerID(l0)).groupby(keys)
            else:
                base = (QueryBuilder(name).enforce(MaxGroupsPerID("g", l0)).enforce(MaxRowsPerGroupPerID("g", 1))
                        .groupby(keys))
            if agg == "average":
                query = base.average("value", low=0.0, high=1.0, name="out", mechanism="laplace")
            elif agg == "count":
                query = base.count(name="out", mechanism="laplace")
            elif agg.startswith("quantile:"):  # e.g. "quantile:0.5": the exponential mechanism on [0, 1]
                query = base.quantile("value", float(agg.split(":", 1)[1]), low=0.0, high=1.0, name="out")
            else:
                raise ValueError(f"unknown aggregation {agg!r}")
            ans = sess.evaluate(query, PureDPBudget(eps)).toPandas()
            g = ans["g"].to_numpy(dtype=np.int64)
            v = ans["out"].to_numpy(dtype=np.float64, na_value=np.nan)
            np.savez(os.path.join(out_dir, f"{name}.{agg}.npz"), g=g, value=v)
            info[f"{agg}_seconds"] = time.time() - t2
        result["queries"][name] = info
    result["total_seconds"] = time.time() - t0
    result["versions"] = {"tmlt.analytics": getattr(ta, "__version__", "?"),
                          "tmlt.core": getattr(tmlt.core, "__version__", "?"),
                          "pyspark": pyspark.__version__, "python": sys.version.split()[0]}
    with open(os.path.join(out_dir, "result.json"), "w") as f:
        json.dump(result, f)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
