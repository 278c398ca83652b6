"""The release job: records -> person summaries -> private estimates -> Delta ``releases``.

Python API::

    from spark_jobs.config import load_config
    from spark_jobs.job import run_job, plan_job
    cfg = load_config("conf/examples/flights.yaml")
    print(plan_job(cfg).render())          # the privacy plan; reads no data
    result = run_job(cfg)                  # one Delta commit of releases
    for row in result.rows: print(row.statistic, row.estimate, row.error_bar)

Order of work (verify, then charge, then release): validate the config and its whole privacy
plan against the budget -> build the mechanisms whose parameters are public (e.g. P3's OpenDP
noisy-max) -> read and validate the input schema -> reserve the budget -> summarize (one Spark pass,
cached) -> per statistic: charge each stage to the accountant, then draw its noise -> write
all release rows in one Delta commit. A failure before the commit writes nothing.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

from dplib.budget import Accountant, Budget, Charge, composed_cost
from dplib.groups import new_salt
from dplib.mechanisms import NoiseSource, production_noise
from spark_jobs.config import JobConfig
from spark_jobs.delta import read_delta
from spark_jobs.grouping import GroupRelease, describe as describe_statistic, run_grouped
from spark_jobs.grouping import statistic_plan as _statistic_plan
from spark_jobs.kinds import Release, RunContext, StatisticConfigBase, kind_of
from spark_jobs.ledger import Ledger
from spark_jobs.paths import absolute, check_output_paths
from spark_jobs.provenance import code_version
from spark_jobs.release import RELEASES_LONG_TABLE, RELEASES_TABLE, ReleaseRow, to_json

log = logging.getLogger("person_dp.job")
#: Parameters whose truth flags a release row (``flagged``): a tail the bar assumes, an L0 bound
#: that truncated persons, an exponential mechanism whose guarantee is too loose to inform.
FLAG_KEYS = ("tail_flag", "l0_truncated", "uninformative")
#: Said (dry run, log) when ``ledger.path`` is not set: the default ledger sits under the output
#: path, so a job on the same population that writes elsewhere keeps a separate budget.
DEFAULT_LEDGER_WARNING = (
    "ledger.path is not set, so this job's ledger is <output.path>/privacy_ledger: another job on "
    "the same persons that writes to a different output path keeps a SEPARATE budget for them (the "
    "spends do not add up). Set ledger.path to one table shared by every job on these persons."
)

#: Called at named points of :func:`run_job` ("before_reserve", "after_reserve",
#: "before_release_commit", "after_release_commit"); tests pass one to inject a crash or a barrier.
Checkpoint = Callable[[str], None]


def statistic_plan(cfg: JobConfig, stat: StatisticConfigBase):
    """The public plan of one statistic, from the config alone (its kind decides; a
    ``group_by`` statistic gets a :class:`spark_jobs.grouping.GroupedPlan`)."""
    return _statistic_plan(stat, cfg)


@dataclass(frozen=True)
class JobPlan:
    """The whole run's privacy plan: every stage, its persons and its budget."""

    config: JobConfig
    plans: dict[str, Any]
    charges: list[Charge]

    @property
    def cost(self) -> tuple[float, float]:
        return composed_cost(self.charges)

    def render(self) -> str:
        """Human-readable plan (what ``--dry-run`` prints)."""
        cfg = self.config
        eps, delta = self.cost
        lines = [
            f"job {cfg.job_name}: privacy unit = {cfg.privacy_unit.column!r} "
            f"(neighbours: add/remove all records of one person)",
            f"input: {cfg.input.path} ({cfg.input.format})",
            f"budget: epsilon={cfg.budget.epsilon:g}, delta={cfg.budget.delta:g}, mode={cfg.budget.budget_mode}",
            "stages (persons = fixed range of a keyed hash of the id):",
        ]
        for c in self.charges:
            lines.append(
                f"  - {c.stage:<48} persons {str(c.group):<12} epsilon={c.budget.epsilon:.4g} delta={c.budget.delta:.3g}"
            )
        stats = {s.name: s for s in cfg.statistics}
        for name, p in self.plans.items():
            lines.append(describe_statistic(stats[name], p))
        lines.append(f"total cost (composed): epsilon={eps:.6g}, delta={delta:.3g}")
        cap = cfg.summary.max_records_per_person
        if cap is not None:
            # statistics that read no per-person summary draw their own records (e.g. m per person)
            own = [s.name for s in cfg.statistics if not kind_of(s).value_columns(s)]
            lines.append(f"record cap: at most {cap} records per person (a salted uniform draw) for every statistic"
                         + (f" except {', '.join(own)}: it draws its own records per person (options.m) "
                            "and does not read the cap" if own else ""))
        if cfg.ledger.enabled:
            lines.append(f"spent from population {cfg.population()!r} in ledger {cfg.ledger_path()}")
            if not cfg.ledger.path:
                lines.append("WARNING: " + DEFAULT_LEDGER_WARNING)
        else:
            lines.append("ledger disabled: no lifetime budget is kept (experiments only)")
        lines.append(f"output: {cfg.output.path}/releases (Delta)")
        return "\n".join(lines)


def prepare_mechanisms(job_plan: JobPlan, noise: NoiseSource) -> dict[str, dict]:
    """Build every mechanism whose parameters are public, per statistic: what a plan's
    ``prepare(noise)`` returns (plans without one need nothing built ahead). :func:`run_job`
    calls this before the ledger reservation, so a mechanism that cannot be built with this
    noise source (e.g. an OpenDP constructor refusing its domain) fails before any budget is
    spent. Reads no data.

    Raises
    ------
    InvalidParameterError
        A mechanism cannot be built (the message names it).
    """
    return {name: p.prepare(noise) for name, p in job_plan.plans.items() if hasattr(p, "prepare")}


def plan_job(cfg: JobConfig) -> JobPlan:
    """Build and check the privacy plan from the config alone (reads no data).

    Raises
    ------
    BudgetExceededError
        If the composed plan exceeds the configured budget.
    InvalidParameterError
        If a statistic's parameters are invalid.
    """
    plans = {s.name: statistic_plan(cfg, s) for s in cfg.statistics}
    charges: list[Charge] = []
    for name, p in plans.items():
        charges.extend(p.charges(prefix=f"{name}: "))
    Accountant(Budget(cfg.budget.epsilon, cfg.budget.delta)).check(charges)
    return JobPlan(cfg, plans, charges)


@dataclass
class JobResult:
    """What a run released: the rows written and where."""

    run_id: str
    table_path: str
    rows: list[ReleaseRow] = field(default_factory=list)
    epsilon_spent: float = 0.0
    delta_spent: float = 0.0
    reused: bool = False  # True: a keyed run that had already released; nothing was spent


def stored_release(table_path: str, run_id: str) -> list[ReleaseRow]:
    """Release rows of ``run_id`` already in the releases table (read without Spark)."""
    try:
        rows = read_delta(table_path, {"run_id": run_id}).to_pylist()
    except FileNotFoundError:
        return []
    out = []
    for r in sorted(rows, key=lambda r: (r["statistic"], str(r.get("group_key")))):
        if isinstance(r.get("group_key"), list):  # arrow maps read as (key, value) pairs
            r = {**r, "group_key": dict(r["group_key"])}
        out.append(ReleaseRow(**r))
    return out


def released_run_ids(table_path: str, job_name: str) -> set[str]:
    """Run ids of ``job_name`` with rows in the releases table."""
    try:
        return set(read_delta(table_path, {"job_name": job_name}, ["run_id"]).column("run_id").to_pylist())
    except FileNotFoundError:
        return set()


def capped_estimand_note(cfg: JobConfig, stat: StatisticConfigBase) -> str:
    """What a record cap does to a statistic's estimand (public: the config): the statistics that read
    the shared per-person summary are over at most ``summary.max_records_per_person`` records of each
    person (a salted uniform draw), and their bars do not cover what the cap changes; "" without a cap
    or for a statistic that draws its own records."""
    cap = cfg.summary.max_records_per_person
    if cap is None or not kind_of(stat).value_columns(stat):
        return ""
    return (f"; each person's records capped at {cap} (summary.max_records_per_person, a salted uniform draw): "
            "the statistic of the kept records")


def release_row(cfg: JobConfig, stat: StatisticConfigBase, rel: Release, *, run_id: str, lineage, created,
                noise: NoiseSource, run_key: str | None = None, group_key: dict[str, str] | None = None,
                config_hash: str | None = None) -> ReleaseRow:
    """One ``releases`` row: the run's lineage and config fields plus one statistic's release.

    ``run_key`` (the caller's idempotency key, e.g. Airflow's run id; public) goes into the
    parameters, so that a release can be found from the key as well as from its hashed run id."""
    parameters = rel.parameters if run_key is None else {**rel.parameters, "run_key": run_key}
    return ReleaseRow(
        run_id=run_id,
        job_name=cfg.job_name,
        dataset=cfg.input.dataset or cfg.input.path,
        input_path=lineage.path,
        input_format=lineage.format,
        input_delta_version=lineage.delta_version,
        input_fingerprint=lineage.fingerprint,
        privacy_unit=cfg.privacy_unit.column,
        statistic=stat.name,
        kind=stat.kind,
        columns=list(stat.columns),
        estimand=rel.estimand + capped_estimand_note(cfg, stat),
        algorithm=rel.algorithm,
        algorithm_version=rel.algorithm_version,
        status=rel.status,
        estimate=rel.estimate,
        estimate_shape=list(rel.estimate_shape),
        epsilon=rel.epsilon,
        delta=rel.delta,
        neighbouring="add/remove all records of one person",
        noise_scale=rel.noise_scale,
        noise_source=noise.name,
        error_bar=rel.error_bar,
        error_level=rel.error_level,
        error_covers=rel.error_covers,
        parameters=to_json(parameters),
        config_hash=config_hash or cfg.config_hash(),
        code_version=code_version(),
        created_at=created,
        flagged=any(bool(parameters.get(k)) for k in FLAG_KEYS) if any(k in parameters for k in FLAG_KEYS) else None,
        group_key=group_key,
    )


def sync_long_table(spark, output_path: str, committed: tuple[str, list[ReleaseRow]] | None = None) -> int:
    """Write the ``releases_long`` rows of every run in ``releases`` that has none yet (the run
    just committed, and any whose long rows a crash lost). Returns the number of runs written.

    ``committed``: (run id, rows) of the run just committed, to take its rows from memory rather
    than read them back (2 x 10^5 grouped rows: 16 s); any other missing run is read back."""
    from spark_jobs.spark.releases import write_long  # lazy: Spark

    base = output_path.rstrip("/")
    table = f"{base}/{RELEASES_TABLE}"
    try:
        released = set(read_delta(table, None, ["run_id"]).column("run_id").to_pylist())
    except FileNotFoundError:
        return 0
    try:
        done = set(read_delta(f"{base}/{RELEASES_LONG_TABLE}", None, ["run_id"]).column("run_id").to_pylist())
    except FileNotFoundError:
        done = set()
    missing = sorted(released - done)
    rows = [r for rid in missing
            for r in (committed[1] if committed is not None and rid == committed[0] else stored_release(table, rid))]
    if rows:
        write_long(spark, rows, output_path)
        log.info("releases_long: %d run(s) written", len(missing))
    return len(missing)


def _grouping_signature(stat, plan) -> tuple:
    """Statistics with the same group columns, key set and L0 bound share one per-(person,
    group) summary (the L0 choice depends only on these, the salt and the person's keys)."""
    return (tuple(stat.group_by), plan.keys, plan.l0)


class _GroupedInputs:
    """The per-(person, group) summaries of a run, one per grouping signature, built on first
    use (one Spark pass each, over the value columns of every statistic sharing it)."""

    def __init__(self, cfg, plans, records, salt, label_columns, input_cls) -> None:
        self._cfg, self._plans, self._records, self._salt = cfg, plans, records, salt
        self._labels, self._cls = label_columns, input_cls
        self._sources: dict[tuple, Any] = {}
        self._columns: dict[tuple, list[str]] = {}
        self._derived: dict[tuple, dict] = {}
        for s in cfg.statistics:
            if s.group_by is not None:
                sig = _grouping_signature(s, plans[s.name])
                cols = self._columns.setdefault(sig, [])
                cols += [c for c in kind_of(s).value_columns(s) if c not in cols]
                self._derived.setdefault(sig, {}).update(kind_of(s).derived_columns(s))

    def source(self, stat):
        sig = _grouping_signature(stat, self._plans[stat.name])
        if sig not in self._sources:
            cfg, plan = self._cfg, self._plans[stat.name]
            self._sources[sig] = self._cls(
                self._records, cfg.privacy_unit.column, cfg.privacy_unit.null_values, list(stat.group_by),
                plan.keys and [list(k) for k in plan.keys], plan.l0, self._columns[sig], self._salt,
                m_min=cfg.summary.m_min, max_records_per_person=cfg.summary.max_records_per_person,
                label_columns=self._labels, derived=self._derived[sig],
            )
        return self._sources[sig]

    def unpersist(self) -> None:
        for src in self._sources.values():
            src.unpersist()


def _run_grouped(stat, plan, ctx, inputs: _GroupedInputs, decode_key) -> list[GroupRelease]:
    """One ``group_by`` statistic over its (shared, cached) per-(person, group) summary:
    :func:`spark_jobs.grouping.run_grouped`."""
    source = inputs.source(stat)
    return run_grouped(stat, plan, ctx, source.person_counts, source.pooled, source.public_keys, source.backend,
                       lambda k: decode_key(k, stat.group_by), source.l0_over_count)


def run_job(
    cfg: JobConfig,
    *,
    spark=None,
    noise: NoiseSource | None = None,
    run_id: str | None = None,
    checkpoint: Checkpoint | None = None,
) -> JobResult:
    """Run the release job end to end.

    Parameters
    ----------
    cfg : JobConfig
    spark : SparkSession, optional
        Default: :func:`spark_jobs.spark.session.build_session` from ``cfg.spark``.
    noise : NoiseSource, optional
        Default: the secure OpenDP source. Tests may pass ``SeededNoise``; such rows are marked
        ``noise_source = "seeded-numpy (NOT for release)"``.
    run_id : str, optional
        A run key (the scheduler's run id, or a partition key). The run id is then a hash of
        (job name, run key, config hash): re-running it returns the stored release and spends
        nothing. Default: a new UUID4 (every run is a new release).
    checkpoint : callable, optional
        Called with the name of each point of the run ("before_reserve", "after_reserve",
        "before_release_commit", "after_release_commit"); tests inject crashes and barriers here.

    Returns
    -------
    JobResult

    Raises
    ------
    ConfigError, InputDataError, BudgetExceededError
        Before any noise is drawn or anything is written (a budget refusal gives the
        population's limit, spent and requested budget).
    InvalidParameterError
        Before the reservation, when a mechanism with public parameters cannot be built
        (:func:`prepare_mechanisms`).

    Privacy
    -------
    (epsilon, delta)-DP overall under add/remove of one person (``cfg.budget``): statistics
    compose sequentially by their shares; the stages of each statistic as its plan says
    (``JobPlan.render``).
    """
    # lazy: keeps pyspark out of the Spark-free imports (plan_job, the CLI's dry run, Airflow parsing)
    from spark_jobs.spark import io as sio  # lazy: Spark
    from spark_jobs.spark.aggregates import SparkAggregates  # lazy: Spark
    from spark_jobs.spark.grouping import SparkGroupedInput, decode_key  # lazy: Spark
    from spark_jobs.spark.releases import write_releases  # lazy: Spark
    from spark_jobs.spark.session import build_session  # lazy: Spark
    from spark_jobs.spark.summarize import summarize  # lazy: Spark

    point = checkpoint or (lambda name: None)
    t0 = time.monotonic()
    job_plan = plan_job(cfg)
    noise = noise if noise is not None else production_noise()
    prepared = prepare_mechanisms(job_plan, noise)  # public parameters only: before any reservation
    keyed = run_id is not None
    run_key = run_id  # the caller's key (e.g. Airflow's run id): public, kept in the release
    run_id = cfg.run_id_for(run_id) if keyed else str(uuid.uuid4())
    log.info("run %s: plan checked, cost epsilon=%.6g delta=%.3g", run_id, *job_plan.cost)
    output_path = absolute(cfg.output.path)
    table_path = output_path.rstrip("/") + "/releases"
    check_output_paths(cfg)  # a local output or ledger path that cannot be created: refused before any charge

    ledger = Ledger(absolute(cfg.ledger_path())) if cfg.ledger.enabled else None
    if ledger is not None and not cfg.ledger.path:
        log.warning("run %s: %s", run_id, DEFAULT_LEDGER_WARNING)
    population = cfg.population()
    if ledger is not None:
        # a crash between a release commit and its ledger update is repaired here
        fixed = ledger.reconcile(population, released_run_ids(table_path, cfg.job_name))
        if fixed:
            log.info("ledger reconciled: %d entr%s marked released", fixed, "y" if fixed == 1 else "ies")
        if cfg.ledger.initial_limit is not None:
            lim = cfg.ledger.initial_limit
            pop = ledger.set_limit(population, Budget(lim.epsilon, lim.delta), only_if_absent=True)
            if (pop.limit_epsilon, pop.limit_delta) != (lim.epsilon, lim.delta):
                # the config's initial_limit only creates a population: say so when it differs (a new
                # user changed it after the first run and read nothing about it being ignored)
                log.warning("run %s: ledger.initial_limit (epsilon=%g delta=%g) is ignored: population %r already "
                            "exists with limit epsilon=%g delta=%g; change it with person-dp budget set",
                            run_id, lim.epsilon, lim.delta, population, pop.limit_epsilon, pop.limit_delta)
    if keyed:
        stored = stored_release(table_path, run_id)
        if stored:
            log.info("run %s already released: returning the stored release, spending nothing", run_id)
            return JobResult(run_id, table_path, stored, 0.0, 0.0, reused=True)

    if spark is None:
        spark = build_session(cfg.spark.master, cfg.spark.app_name, cfg.spark.conf, cfg.spark.log_level)
    columns = cfg.value_columns()
    input_path = absolute(cfg.input.path)
    records = sio.read_records(spark, input_path, cfg.input.format, cfg.input.csv_options)
    sio.validate_schema(records, cfg.privacy_unit.column, columns, cfg.input.format)
    sio.check_columns_present(records.columns, cfg.categorical_columns())
    sio.check_category_types(records.schema, cfg)
    if cfg.input.format == "parquet":
        # every file's footer, not only the one Spark took its schema from (before the reservation)
        files = records.inputFiles()
        sio.check_parquet_files(files, cfg.privacy_unit.column, columns, cfg.categorical_columns())
        if any(not sio.is_local(f) for f in files):
            sio.check_remote_parquet_types(spark, input_path)
    sio.check_not_empty(records, cfg.input.path)
    lineage = sio.lineage(spark, records, input_path, cfg.input.format)
    if cfg.privacy_unit.normalize:
        records = sio.normalize_ids(records, cfg.privacy_unit.column, cfg.privacy_unit.null_values)
    log.info("input validated (%s, %s)", cfg.input.path, cfg.input.format)

    # Verify, then charge, then release: reserve the whole run's budget before any noise.
    reservation = None
    if ledger is not None:
        cost = Budget(*job_plan.cost) if job_plan.cost[0] > 0 else Budget(cfg.budget.epsilon, cfg.budget.delta)
        point("before_reserve")
        reservation = ledger.reserve(population, run_id, cfg.job_name, cost)
        log.info("ledger: reserved epsilon=%g delta=%g for run %s (attempt %d) from population %r",
                 cost.epsilon, cost.delta, run_id, reservation.attempt, population)
        point("after_reserve")

    salt = new_salt()
    # One per-person summary for every statistic that reads numeric columns (kept with the person
    # id when a kind orders persons by a key of it).
    keep_id = any(kind_of(s).needs_person_id(s) for s in cfg.statistics if s.group_by is None)
    shared = cfg.summary_columns()
    summary = (
        summarize(
            records, cfg.privacy_unit.column, shared, salt, cfg.summary.m_min, cfg.privacy_unit.null_values,
            max_records_per_person=cfg.summary.max_records_per_person, label_columns=columns,
            keep_id=keep_id,
        ).persist()
        if shared
        else None
    )
    grouped_inputs = _GroupedInputs(cfg, job_plan.plans, records, salt, columns, SparkGroupedInput)
    try:
        # the run may never spend more than it reserved
        accountant = Accountant(reservation.budget if reservation is not None else Budget(cfg.budget.epsilon, cfg.budget.delta))
        ctx = RunContext(
            cfg=cfg, records=records, summary=summary,
            aggregates=SparkAggregates(summary) if summary is not None else None,
            salt=salt, noise=noise, accountant=accountant, prepared=prepared,
        )
        rows: list[ReleaseRow] = []
        chash = cfg.config_hash()  # once: a grouped statistic may write 10^5 rows
        created = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
        for i, stat in enumerate(cfg.statistics, 1):
            t1 = time.monotonic()
            if stat.group_by is None:
                released = [GroupRelease({}, kind_of(stat).run(stat, job_plan.plans[stat.name], ctx))]
            else:
                released = _run_grouped(stat, job_plan.plans[stat.name], ctx, grouped_inputs, decode_key)
            for g in released:
                rows.append(release_row(cfg, stat, g.release, run_id=run_id, lineage=lineage, created=created,
                                        noise=noise, run_key=run_key, group_key=g.key or None, config_hash=chash))
            statuses = sorted({g.release.status for g in released})
            log.info("statistic %d/%d %s: %s%s", i, len(cfg.statistics), stat.name, "/".join(statuses) or "no groups",
                     "" if stat.group_by is None else f" ({len(released)} group row(s))")
            log.debug("statistic %s took %.1fs", stat.name, time.monotonic() - t1)
        point("before_release_commit")
        table = write_releases(spark, rows, output_path)
        point("after_release_commit")
        try:  # derived from the committed releases: a failure here loses nothing (rebuilt next run)
            sync_long_table(spark, output_path, (run_id, rows))
        except Exception as err:  # noqa: BLE001 - reported, and repaired by the next run
            log.error("releases_long not updated (%s); the next run of a job writing to %s rebuilds it",
                      type(err).__name__, output_path)
    finally:
        if summary is not None:
            summary.unpersist()
        grouped_inputs.unpersist()
    eps, delta = accountant.cost()
    if ledger is not None and reservation is not None:
        # the realised cost: stages that a DP outcome stopped (a range that released nothing, a
        # retry that was not needed) were never charged and are refunded; nothing else is
        refund = ledger.settle(population, run_id, reservation.attempt, eps, delta)
        if refund[0] > 0 or refund[1] > 0:
            log.info("ledger: refunded epsilon=%g delta=%g of stages that never ran", *refund)
    log.info(
        "run %s: %d release row(s) committed to %s (spent epsilon=%.6g delta=%.3g)",
        run_id, len(rows), table, eps, delta,
    )
    # Wall-clock times depend on the data and are not DP: DEBUG level only.
    log.debug("run %s took %.1fs", run_id, time.monotonic() - t0)
    return JobResult(run_id, table, rows, eps, delta)
