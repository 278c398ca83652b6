"""Tumult Analytics anchor, run inside benchmarks/anchors/.tumult-venv (its own Python environment).

Not imported by the rest of the benchmark: ``tumult.py`` starts it as a subprocess::

    benchmarks/anchors/.tumult-venv/bin/python benchmarks/anchors/tumult_worker.py IN.npz OUT.json

IN.npz holds one row per (job, person): ``job`` (int64), ``value`` (float64, the person's mean mapped
affinely so the job's clamping bounds become [0, 1]), ``jobs`` (the public list of job keys) and
``epsilon``; optional ``quantile`` (a level q: ``quantile(value, q, low=0, high=1)`` instead of
``average``) or ``statistic`` (``variance`` or ``stdev`` on [0, 1]; ``sum`` on [-1, 1], the caller
having clamped and scaled the values by max(|lo|, |hi|)). A job is one (cell, seed, bounds) release.

Every job is answered by ONE Tumult query: ``Session.from_dataframe(..., protected_change=
AddRowsWithID("id"))`` over all rows (ids are distinct across jobs, so each person-row of a job is
its own privacy unit), ``enforce(MaxRowsPerID(1))``, ``groupby(KeySet.from_dict({"job": jobs}))``,
``average("value", low=0, high=1, mechanism="laplace")`` under ``PureDPBudget(epsilon)``.
With one row per ID each ID touches one group, so Tumult's L1 sensitivity is that of a single
ungrouped average: every group's release has the noise of ``average`` at the full epsilon on that
job's rows alone (parallel composition). This is how many (cell, seed) releases fit into one
``evaluate`` (each takes ~1 minute on this machine). Averages are affine-equivariant (clamp, sum
around the midpoint, count, Laplace with scale proportional to the range), so the caller maps each
answer back with ``lo + (hi - lo) * answer``.

OUT.json: ``{"estimates": {job: average or null}, "seconds": ..., "versions": {...}}``.
"""

from __future__ import annotations

import json
import os
import sys
import time


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    src, dst = argv
    t0 = time.time()
    import numpy as np
    import pandas as pd
    from pyspark.sql import SparkSession

    import tmlt.analytics as ta
    from tmlt.analytics import (
        AddRowsWithID,
        KeySet,
        MaxRowsPerID,
        PureDPBudget,
        QueryBuilder,
        Session,
    )

    z = np.load(src)
    job = z["job"].astype(np.int64)
    value = z["value"].astype(np.float64)
    jobs = [int(j) for j in z["jobs"]]
    eps = float(z["epsilon"])
    # distinct ids across jobs: a person-row of one job is never the same ID as one of another job
    ident = np.arange(job.size, dtype=np.int64)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master("local[1]")
        .appName("anchors-tumult")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.driver.memory", "4g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    pdf = pd.DataFrame({"id": ident, "job": job, "value": value})
    df = spark.createDataFrame(pdf)
    t1 = time.time()
    sess = Session.from_dataframe(
        privacy_budget=PureDPBudget(eps),
        source_id="persons",
        dataframe=df,
        protected_change=AddRowsWithID("id"),
    )
    grouped = QueryBuilder("persons").enforce(MaxRowsPerID(1)).groupby(KeySet.from_dict({"job": jobs}))
    q = float(z["quantile"]) if "quantile" in z.files else None
    statistic = str(z["statistic"]) if "statistic" in z.files else "average"
    if statistic == "variance":
        query = grouped.variance("value", low=0.0, high=1.0, name="avg", mechanism="laplace")
    elif statistic == "stdev":
        query = grouped.stdev("value", low=0.0, high=1.0, name="avg", mechanism="laplace")
    elif statistic == "sum":
        query = grouped.sum("value", low=-1.0, high=1.0, name="avg", mechanism="laplace")
    elif q is None:
        query = grouped.average("value", low=0.0, high=1.0, name="avg", mechanism="laplace")
    else:  # quantiles are affine-equivariant too (Tumult: the exponential mechanism over the clamped data)
        query = grouped.quantile("value", q, low=0.0, high=1.0, name="avg")
    ans = sess.evaluate(query, PureDPBudget(eps)).toPandas()
    t2 = time.time()
    est = {}
    for j, a in zip(ans["job"].tolist(), ans["avg"].tolist()):
        est[str(int(j))] = None if a is None or not np.isfinite(a) else float(a)
    import pyspark
    import tmlt.core

    out = {
        "estimates": est,
        "seconds": {"start": t1 - t0, "evaluate": t2 - t1, "total": time.time() - t0},
        "rows": int(job.size),
        "versions": {
            "tmlt.analytics": getattr(ta, "__version__", "?"),
            "tmlt.core": getattr(tmlt.core, "__version__", "?"),
            "pyspark": pyspark.__version__,
            "python": sys.version.split()[0],
        },
    }
    with open(dst, "w") as f:
        json.dump(out, f)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
