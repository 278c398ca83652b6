"""The privacy ledger: a Delta table that keeps every protected population's lifetime budget.

One table, read and written with delta-rs (``deltalake``; no Spark, no JVM), two kinds of rows:

- ``kind = 'population'``: one row per protected population (the persons behind a source, named
  in the config: Monday's and Tuesday's partitions are the same people): ``limit_epsilon``,
  ``limit_delta`` (set by an operator, ``person-dp budget set``), ``spent_epsilon``,
  ``spent_delta``.
- ``kind = 'entry'``: one row per reservation: ``run_id``, ``attempt``, ``epsilon``, ``delta``,
  ``status`` (``reserved`` -> ``released``, or ``abandoned`` when a retry of the same run id
  found no release), ``job_name``.

**Reserving** (:meth:`Ledger.reserve`) is one Delta commit (a MERGE whose source holds the
population row's new spent values and the new entry) made against the table version the check
was read from: the check ``spent + requested <= limit`` (epsilon and delta both) happens on that
version, and Delta's optimistic concurrency refuses the commit if any other transaction
committed since (delta-rs ``CommitFailedError``); we then re-read and retry. Two runs can never
both pass the check on the same spent value, so the ledger cannot overspend. A reservation stays
spent even if the run fails later (its noise may have been drawn).

**Order of commits in a run** (``spark_jobs.job.run_job``): (1) ledger: reserve (entry
``reserved``); (2) releases table: the release rows, one commit; (3) ledger: entry -> ``released``.
A crash after (1) leaves the budget spent and no release: a retry with the same run id finds no
release, marks the old entry ``abandoned`` (still spent) and reserves again. A crash after (2)
leaves a ``reserved`` entry whose release exists: :meth:`Ledger.reconcile` (run at the start of
every job) marks it ``released`` from the releases table, and a retry with the same run id
returns the stored release and spends nothing.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import os
import socket
import time
from dataclasses import dataclass

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError, TableNotFoundError

from dplib.budget import REL_TOL, Budget
from dplib.errors import BudgetExceededError, ConfigError, DPError
from spark_jobs.delta import scan_table


class LedgerBusyError(DPError):
    """The ledger saw too many concurrent commits in a row; retrying later is safe."""


class RunInProgressError(DPError):
    """Another process holds a live reservation for this run id."""


def current_owner() -> str:
    """``host:pid`` of this process (recorded with each reservation)."""
    return f"{socket.gethostname()}:{os.getpid()}"


def _owner_is_dead(owner: str | None) -> bool:
    """True if ``owner`` is a process of this host that no longer runs (a crashed run)."""
    if not owner or ":" not in owner:
        return True
    host, pid = owner.rsplit(":", 1)
    if host != socket.gethostname():
        return False
    try:
        if int(pid) == os.getpid():
            return True  # an earlier attempt in this very process, which has failed
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, ValueError):
        return False
    return False

log = logging.getLogger("person_dp.ledger")

LEDGER_SCHEMA = pa.schema(
    [
        ("kind", pa.string()),
        ("population", pa.string()),
        ("limit_epsilon", pa.float64()),
        ("limit_delta", pa.float64()),
        ("spent_epsilon", pa.float64()),
        ("spent_delta", pa.float64()),
        ("run_id", pa.string()),
        ("attempt", pa.int64()),
        ("job_name", pa.string()),
        ("epsilon", pa.float64()),
        ("delta", pa.float64()),
        ("status", pa.string()),
        ("owner", pa.string()),
        ("updated_at", pa.timestamp("us")),
    ]
)
MAX_RETRIES = 50


@dataclass(frozen=True)
class PopulationBudget:
    """Limit and spent budget of one protected population."""

    population: str
    limit_epsilon: float
    limit_delta: float
    spent_epsilon: float
    spent_delta: float

    @property
    def remaining(self) -> tuple[float, float]:
        return self.limit_epsilon - self.spent_epsilon, self.limit_delta - self.spent_delta


@dataclass(frozen=True)
class Reservation:
    """A committed reservation; ``conflicts`` counts concurrent-commit retries it needed."""

    population: str
    run_id: str
    attempt: int
    budget: Budget
    conflicts: int


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


def _row(**kw) -> dict:
    base = {f.name: None for f in LEDGER_SCHEMA}
    base.update(kw)
    base["updated_at"] = _now()
    return base


def _sql_str(value: str) -> str:
    return "'" + str(value).replace("'", "''") + "'"


class Ledger:
    """The ledger Delta table at ``path`` (created on first write).

    Raises
    ------
    BudgetExceededError
        From :meth:`reserve` when spent + requested would exceed the limit (message gives limit,
        spent and requested), or when the population has no limit set.
    """

    def __init__(self, path: str) -> None:
        self.path = path

    # ----- reading ------------------------------------------------------------------------
    def _table(self):
        try:
            return DeltaTable(self.path)
        except TableNotFoundError:
            return None

    def rows(self, table=None) -> list[dict]:
        """All ledger rows as dicts (empty if the table does not exist)."""
        t = table if table is not None else self._table()
        if t is None:
            return []
        # delta-rs's own scan of this snapshot: deletion vectors and column mapping honoured
        # (spark_jobs.delta.read_delta)
        return scan_table(t).select(LEDGER_SCHEMA.names).cast(LEDGER_SCHEMA).to_pylist()

    def population(self, name: str, table=None) -> PopulationBudget | None:
        """The population's limit and spent budget, or None.

        Racing creators of a new population can both commit their row (an insert-only MERGE
        commits like an append). The rule is then deterministic, whatever the file order: the
        smaller limit wins and the larger spent counts (each in epsilon and delta); the next
        commit on the population (a MERGE matching both rows) writes that one value into both.
        """
        rows = [r for r in self.rows(table) if r["kind"] == "population" and r["population"] == name]
        if not rows:
            return None
        return PopulationBudget(
            name,
            min(r["limit_epsilon"] for r in rows),
            min(r["limit_delta"] for r in rows),
            max(r["spent_epsilon"] for r in rows),
            max(r["spent_delta"] for r in rows),
        )

    def entries(self, population: str | None = None, run_id: str | None = None) -> list[dict]:
        out = [r for r in self.rows() if r["kind"] == "entry"]
        if population is not None:
            out = [r for r in out if r["population"] == population]
        if run_id is not None:
            out = [r for r in out if r["run_id"] == run_id]
        return out

    # ----- writing ------------------------------------------------------------------------
    def _merge(self, table, source_rows: list[dict]) -> dict:
        """One MERGE commit: update the matched population / entry rows, insert new ones."""
        src = pa.Table.from_pylist(source_rows, schema=LEDGER_SCHEMA)
        cols = [f.name for f in LEDGER_SCHEMA]
        pred = (
            "t.kind = s.kind AND t.population = s.population AND "
            "((t.kind = 'population') OR (t.run_id = s.run_id AND t.attempt = s.attempt))"
        )
        return (
            table.merge(source=src, predicate=pred, source_alias="s", target_alias="t")
            .when_matched_update_all()
            .when_not_matched_insert(updates={c: f"s.{c}" for c in cols})
            .execute()
        )

    def _commit(self, build) -> tuple[object, int]:
        """Run ``build(table) -> source rows or None`` and MERGE them, retrying on conflicts.
        Returns (build's result, number of conflicts)."""
        conflicts = 0
        for _ in range(MAX_RETRIES):
            table = self._table()
            result, rows = build(table)
            if not rows:
                return result, conflicts
            try:
                if table is None:
                    write_deltalake(self.path, pa.Table.from_pylist(rows, schema=LEDGER_SCHEMA), mode="error")
                else:
                    self._merge(table, rows)
                return result, conflicts
            except (CommitFailedError, FileExistsError) as err:
                conflicts += 1
                log.info("ledger: concurrent commit, re-reading and retrying (%s)", type(err).__name__)
                time.sleep(0.05 * conflicts)
            except Exception as err:  # delta-rs raises a generic error when the table was created concurrently
                if "already exists" in str(err).lower():
                    conflicts += 1
                    continue
                raise
        raise LedgerBusyError(f"ledger {self.path}: too many concurrent commits in a row; try again")

    def set_limit(self, population: str, limit: Budget, only_if_absent: bool = False) -> PopulationBudget:
        """Set (or create) a population's lifetime limit. Spent budget is kept.

        ``only_if_absent``: create the population with this limit only if it has none; decided on
        the same table version that is committed, so an operator's concurrent change wins.
        """
        if not population:
            raise ConfigError("population must be a non-empty name")

        def build(table):
            cur = self.population(population, table)
            if only_if_absent and cur is not None:
                return cur, None
            spent_e, spent_d = (cur.spent_epsilon, cur.spent_delta) if cur else (0.0, 0.0)
            row = _row(kind="population", population=population, limit_epsilon=limit.epsilon,
                       limit_delta=limit.delta, spent_epsilon=spent_e, spent_delta=spent_d)
            return PopulationBudget(population, limit.epsilon, limit.delta, spent_e, spent_d), [row]

        result, _ = self._commit(build)
        return result

    def reserve(self, population: str, run_id: str, job_name: str, request: Budget) -> Reservation:
        """Reserve ``request`` for ``run_id`` before any noise is drawn (one atomic commit).

        Raises
        ------
        BudgetExceededError
            If the population has no limit, or spent + request exceeds the limit in epsilon or
            in delta. Nothing is written then.
        """

        def build(table):
            cur = self.population(population, table)
            if cur is None:
                raise BudgetExceededError(
                    f"no budget is set for population {population!r} in ledger {self.path}; an operator "
                    f"sets one with: person-dp budget set --ledger {self.path} --population {population} "
                    "--epsilon E --delta D"
                )
            previous = [r for r in self.rows(table) if r["kind"] == "entry" and r["population"] == population
                        and r["run_id"] == run_id]
            if any(r["status"] == "released" for r in previous):
                raise RunInProgressError(f"run {run_id} has already released; its stored release is final")
            live = [r for r in previous if r["status"] == "reserved" and not _owner_is_dead(r["owner"])]
            if live:
                raise RunInProgressError(
                    f"run {run_id} is in progress ({live[0]['owner']}); retry when it has finished or died"
                )
            new_e, new_d = cur.spent_epsilon + request.epsilon, cur.spent_delta + request.delta
            fits = new_e <= cur.limit_epsilon * (1 + REL_TOL) and new_d <= cur.limit_delta * (1 + REL_TOL)
            if not fits:  # written so that a NaN anywhere refuses
                own = [r for r in previous if r["status"] == "abandoned"
                       or (r["status"] == "reserved" and _owner_is_dead(r["owner"]))]
                mine = (
                    f"; of the spent, epsilon={sum(r['epsilon'] for r in own):g} and delta={sum(r['delta'] for r in own):g} "
                    f"are this run id's own {len(own)} earlier attempt(s) that stopped after reserving (their noise may "
                    f"have been drawn, so their budget stays spent; `person-dp budget show --ledger {self.path} --entries` lists them)"
                ) if own else ""
                raise BudgetExceededError(
                    f"population {population!r} has not enough budget left: limit (epsilon={cur.limit_epsilon:g}, "
                    f"delta={cur.limit_delta:g}), spent (epsilon={cur.spent_epsilon:g}, delta={cur.spent_delta:g}), "
                    f"requested (epsilon={request.epsilon:g}, delta={request.delta:g}){mine}"
                )
            attempt = 1 + max((r["attempt"] for r in previous), default=0)
            rows = [
                _row(kind="population", population=population, limit_epsilon=cur.limit_epsilon,
                     limit_delta=cur.limit_delta, spent_epsilon=new_e, spent_delta=new_d),
                _row(kind="entry", population=population, run_id=run_id, attempt=attempt, job_name=job_name,
                     epsilon=request.epsilon, delta=request.delta, status="reserved", owner=current_owner()),
            ]
            # earlier attempts of this run id whose process died: abandoned (their budget stays spent)
            for r in previous:
                if r["status"] == "reserved":
                    rows.append({**r, "status": "abandoned", "updated_at": _now()})
            return attempt, rows

        attempt, conflicts = self._commit(build)
        return Reservation(population, run_id, attempt, request, conflicts)

    def mark(self, population: str, run_id: str, attempt: int, status: str) -> None:
        """Move a ``reserved`` entry to ``status`` (``released`` / ``abandoned``); other states
        are final and left alone."""

        def build(table):
            rows = [r for r in self.rows(table) if r["kind"] == "entry" and r["population"] == population
                    and r["run_id"] == run_id and r["attempt"] == attempt and r["status"] == "reserved"]
            return None, [{**r, "status": status, "updated_at": _now()} for r in rows]

        self._commit(build)

    def settle(self, population: str, run_id: str, attempt: int, epsilon: float, delta: float) -> tuple[float, float]:
        """Mark a ``reserved`` entry ``released`` and refund what the run did not spend.

        ``(epsilon, delta)`` is the run's realised composed cost: stages that never started
        because an earlier DP outcome (or the public plan) stopped a statistic are not charged.
        Which stages ran depends only on DP outputs, so the refunded amount is post-processing.
        The entry keeps the realised cost and the population's spent budget drops by the
        difference, in one commit. Returns the refund ``(epsilon, delta)`` (0 if the entry is not
        ``reserved`` any more).
        """

        def build(table):
            entries = [r for r in self.rows(table) if r["kind"] == "entry" and r["population"] == population
                       and r["run_id"] == run_id and r["attempt"] == attempt and r["status"] == "reserved"]
            if not entries:
                return (0.0, 0.0), []
            entry = entries[0]
            spent_e = min(max(float(epsilon), 0.0), entry["epsilon"])
            spent_d = min(max(float(delta), 0.0), entry["delta"])
            refund = (entry["epsilon"] - spent_e, entry["delta"] - spent_d)
            rows = [{**entry, "status": "released", "epsilon": spent_e, "delta": spent_d, "updated_at": _now()}]
            cur = self.population(population, table)
            if cur is not None and (refund[0] > 0 or refund[1] > 0):
                rows.append(_row(kind="population", population=population, limit_epsilon=cur.limit_epsilon,
                                 limit_delta=cur.limit_delta, spent_epsilon=max(cur.spent_epsilon - refund[0], 0.0),
                                 spent_delta=max(cur.spent_delta - refund[1], 0.0)))
            return refund, rows

        refund, _ = self._commit(build)
        return refund

    def reconcile(self, population: str, released_run_ids: set[str]) -> int:
        """Mark ``reserved`` entries whose run id has rows in the releases table as ``released``
        (a crash between the release commit and the ledger update). Returns how many changed."""

        def build(table):
            rows = [
                {**r, "status": "released", "updated_at": _now()}
                for r in self.rows(table)
                if r["kind"] == "entry" and r["population"] == population and r["status"] == "reserved"
                and r["run_id"] in released_run_ids
            ]
            # only the newest attempt of a run id is the one that released
            newest: dict[str, dict] = {}
            for r in rows:
                if r["run_id"] not in newest or r["attempt"] > newest[r["run_id"]]["attempt"]:
                    newest[r["run_id"]] = r
            return len(newest), list(newest.values())

        changed, _ = self._commit(build)
        return int(changed or 0)


def spent_is_consistent(ledger: Ledger, population: str) -> bool:
    """True if the population's spent budget equals the sum of its entries (any status)."""
    pop = ledger.population(population)
    if pop is None:
        return True
    entries = ledger.entries(population)
    eps = math.fsum(r["epsilon"] for r in entries)
    dlt = math.fsum(r["delta"] for r in entries)
    return math.isclose(eps, pop.spent_epsilon, rel_tol=1e-9, abs_tol=1e-12) and math.isclose(
        dlt, pop.spent_delta, rel_tol=1e-9, abs_tol=1e-15
    )
