"""Accuracy of the demo release over seeded runs (not part of `make test`).

Runs the real job (Spark, conf/examples/flights.yaml) N times with seeded noise and a fresh salt
each time, and compares each released mean with the exact value computed here with pandas.

    .venv/bin/python benchmarks/demo_accuracy.py [--runs 20] [--config conf/examples/flights.yaml]

Prints, per statistic: the exact value, median and 90th-percentile absolute error, the share of
runs within 2 minutes, and how often the 90% error bar covered the exact value.
"""

from __future__ import annotations

import argparse
import logging
import tempfile

import numpy as np
import pandas as pd


def exact_value(records: pd.DataFrame, unit: str, col: str, null_ids) -> tuple[float, int]:
    d = records[records[unit].notna() & ~records[unit].astype(str).str.strip().isin(list(null_ids))]
    d = d[np.isfinite(d[col].astype(float))]
    per = d.groupby(unit)[col].mean()
    return float(per.mean()), int(per.size)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--config", default="conf/examples/flights.yaml")
    ap.add_argument("--set", action="append", default=[], help="config override, e.g. statistics.0.options.scale=30")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)

    from dplib.mechanisms import SeededNoise
    from spark_jobs.config import load_config
    from spark_jobs.job import run_job
    from spark_jobs.spark.session import build_session

    out = tempfile.mkdtemp(prefix="demo-accuracy-")
    cfg = load_config(args.config, args.set + [f"output.path={out}"])
    records = pd.read_parquet(cfg.input.path)
    spark = build_session(cfg.spark.master, "demo-accuracy", cfg.spark.conf)
    results: dict[str, list[tuple[float, float]]] = {s.name: [] for s in cfg.statistics}
    for seed in range(args.runs):
        res = run_job(cfg, spark=spark, noise=SeededNoise(seed), run_id=f"accuracy-{seed}")
        for row in res.rows:
            if row.status == "OK":
                results[row.statistic].append((row.estimate[0], row.error_bar[0]))
            else:
                results[row.statistic].append((float("nan"), float("nan")))
    print(f"\n{args.runs} seeded runs of {args.config} {' '.join(args.set)} (fresh salt each run), "
          f"eps={cfg.budget.epsilon}, delta={cfg.budget.delta}")
    print(f"{'statistic':<18}{'exact':>9}{'persons':>9}{'median |err|':>14}{'p90 |err|':>11}"
          f"{'max |err|':>11}{'<= 2 min':>10}{'bar covers':>12}{'median bar':>12}")
    for stat in cfg.statistics:
        exact, n = exact_value(records, cfg.privacy_unit.column, stat.columns[0], cfg.privacy_unit.null_values)
        est = np.array([e for e, _ in results[stat.name]])
        bar = np.array([b for _, b in results[stat.name]])
        err = np.abs(est - exact)
        print(f"{stat.name:<18}{exact:>9.3f}{n:>9d}{np.nanmedian(err):>14.3f}{np.nanpercentile(err, 90):>11.3f}"
              f"{np.nanmax(err):>11.3f}{np.mean(err <= 2.0):>10.0%}{np.mean(err <= bar):>12.0%}{np.nanmedian(bar):>12.3f}")
    spark.stop()


if __name__ == "__main__":
    main()
