"""Checks before a run that spend nothing and start no Spark: for schedulers (Airflow's first
tasks) and ``person-dp validate`` / ``person-dp budget check``.

- :func:`check_input_schema`: the input's schema, read from the file footers (pyarrow) or the
  Delta log (delta-rs), converted to Spark types and checked by the job's own rules
  (:func:`spark_jobs.spark.io.validate_schema`), plus "holds at least one row".
- :func:`ledger_room`: does the population have room for this run's composed cost? Read-only and
  advisory: the job's atomic reservation is what guarantees the ledger cannot overspend; this
  only fails early, before a cluster job is submitted.

Messages name the config field or column and never give a count, sum, salt or seed.
"""

from __future__ import annotations

import os

from dataclasses import dataclass
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.dataset as ds
from deltalake import DeltaTable

from dplib.budget import REL_TOL, Budget
from dplib.errors import BudgetExceededError, InputDataError
from spark_jobs.config import JobConfig
from spark_jobs.job import plan_job, stored_release
from spark_jobs.ledger import Ledger
from spark_jobs.paths import absolute, check_output_paths  # noqa: F401  (re-exported: validate, dry run)
from spark_jobs.spark import io as sio  # its pyspark imports are lazy: no JVM, no pyspark here


def _local(path: str) -> bool:
    return urlparse(path).scheme in ("", "file")


def check_input_schema(cfg: JobConfig, need_row: bool = True) -> str:
    """Check the input's columns and types as the job will (without Spark), and that it holds a row.

    ``need_row=False`` (``run --dry-run``) reads metadata only: no row is read, so an empty input
    is not detected, and a local input that does not exist yet is noted, not refused. Returns a one-line summary. Remote URIs (``s3a://``, ``hdfs://`` ...) are not read here: the
    job checks them itself before any budget is spent.

    Raises
    ------
    InputDataError
        Missing path, unreadable input, missing column or unusable type (naming the column), or
        an input without a single row.
    """
    path, fmt = absolute(cfg.input.path), cfg.input.format
    if not need_row and _local(path) and not os.path.exists(urlparse(path).path or path):
        return f"input {cfg.input.path} not found: its schema is not checked (the run checks it)"
    if not _local(path):
        return f"input.path {cfg.input.path!r} is remote: its schema is checked by the job, before any budget is spent"
    try:
        if fmt == "delta":
            table = DeltaTable(path)
            schema = table.schema().to_arrow()
            schema = pa.schema(schema) if not isinstance(schema, pa.Schema) else schema
            dataset = ds.dataset(table.file_uris(), format="parquet", schema=schema)
        elif fmt == "parquet":
            dataset = ds.dataset(path, format="parquet")
            schema = dataset.schema
        else:  # csv: every column is read as a string, as the job does
            opts = {"header": "true", **cfg.input.csv_options}
            header = str(opts["header"]).lower() == "true"
            fmt_csv = ds.CsvFileFormat(
                parse_options=pcsv.ParseOptions(delimiter=opts.get("sep", opts.get("delimiter", ","))),
                read_options=pcsv.ReadOptions(autogenerate_column_names=not header),
            )
            dataset = ds.dataset(path, format=fmt_csv)
            names = dataset.schema.names if header else [f"_c{i}" for i in range(len(dataset.schema.names))]
            schema = pa.schema([(n, pa.string()) for n in names])
        spark_schema = sio.spark_schema_from_arrow(schema)
    except (InputDataError, ModuleNotFoundError):  # a missing extra (pyspark's type rules): the CLI names it
        raise
    except Exception as err:  # missing path, not a Delta table, unreadable file: name the field
        msg = str(err).splitlines()[0][:300] if str(err) else type(err).__name__
        raise InputDataError(f"cannot read input.path {cfg.input.path!r} as {fmt}: {msg}") from err

    class _Schema:  # what validate_schema reads of a DataFrame
        pass

    frame = _Schema()
    frame.schema = spark_schema
    sio.validate_schema(frame, cfg.privacy_unit.column, cfg.value_columns(), fmt)
    sio.check_columns_present(spark_schema.names, cfg.categorical_columns())
    sio.check_category_types(spark_schema, cfg)
    if fmt == "parquet":
        sio.check_parquet_files(dataset.files, cfg.privacy_unit.column, cfg.value_columns(), cfg.categorical_columns())
    if need_row and dataset.head(1).num_rows == 0:
        raise InputDataError(f"input.path {cfg.input.path!r} holds no rows")
    cols = list(dict.fromkeys([cfg.privacy_unit.column] + cfg.value_columns() + cfg.categorical_columns()))
    return f"input {cfg.input.path} ({fmt}): columns {cols} present with usable types"


@dataclass(frozen=True)
class RoomCheck:
    """Outcome of :func:`ledger_room` (only raised errors mean "no room")."""

    run_id: str | None
    already_released: bool
    requested: Budget
    message: str


def run_cost(cfg: JobConfig) -> Budget:
    """What a run of ``cfg`` reserves in the ledger (as :func:`spark_jobs.job.run_job` does)."""
    cost = plan_job(cfg).cost
    return Budget(*cost) if cost[0] > 0 else Budget(cfg.budget.epsilon, cfg.budget.delta)


def ledger_room(cfg: JobConfig, run_key: str | None = None) -> RoomCheck:
    """Check, without writing, that the ledger has room for one run of ``cfg``.

    A keyed run (``run_key``, e.g. Airflow's run id) that already released needs no room: re-running
    it returns the stored release and spends nothing.

    Raises
    ------
    BudgetExceededError
        The population has no limit (and the config sets no ``ledger.initial_limit``), or spent +
        requested would exceed the limit in epsilon or delta (message: limit, spent, requested).
    ConfigError
        If the config or its privacy plan is invalid.
    """
    request = run_cost(cfg)
    run_id = cfg.run_id_for(run_key)
    if not cfg.ledger.enabled:
        return RoomCheck(run_id, False, request, "ledger disabled: no lifetime budget is kept")
    if run_id is not None:
        table = absolute(cfg.output.path).rstrip("/") + "/releases"
        if stored_release(table, run_id):
            return RoomCheck(run_id, True, request,
                             f"run {run_id} has already released: a re-run returns the stored release and spends nothing")
    population = cfg.population()
    ledger = Ledger(absolute(cfg.ledger_path()))
    cur = ledger.population(population)
    if cur is None:
        lim = cfg.ledger.initial_limit
        if lim is None:
            raise BudgetExceededError(
                f"no budget is set for population {population!r} in ledger {ledger.path} and the config has no "
                f"ledger.initial_limit; an operator sets one with: person-dp budget set --ledger {ledger.path} "
                f"--population {population} --epsilon E --delta D"
            )
        limit, spent = Budget(lim.epsilon, lim.delta), (0.0, 0.0)
    else:
        limit, spent = Budget(cur.limit_epsilon, cur.limit_delta), (cur.spent_epsilon, cur.spent_delta)
    new_e, new_d = spent[0] + request.epsilon, spent[1] + request.delta
    if not (new_e <= limit.epsilon * (1 + REL_TOL) and new_d <= limit.delta * (1 + REL_TOL)):
        raise BudgetExceededError(
            f"population {population!r} has not enough budget left: limit (epsilon={limit.epsilon:g}, "
            f"delta={limit.delta:g}), spent (epsilon={spent[0]:g}, delta={spent[1]:g}), "
            f"requested (epsilon={request.epsilon:g}, delta={request.delta:g})"
        )
    ignored = ""
    lim = cfg.ledger.initial_limit
    if cur is not None and lim is not None and (lim.epsilon, lim.delta) != (cur.limit_epsilon, cur.limit_delta):
        ignored = (f"; ledger.initial_limit (epsilon={lim.epsilon:g}, delta={lim.delta:g}) is ignored: the population "
                   "exists (change its limit with person-dp budget set)")
    return RoomCheck(
        run_id, False, request,
        f"population {population!r} has room: limit (epsilon={limit.epsilon:g}, delta={limit.delta:g}), "
        f"spent (epsilon={spent[0]:g}, delta={spent[1]:g}), requested (epsilon={request.epsilon:g}, "
        f"delta={request.delta:g}){ignored}",
    )
