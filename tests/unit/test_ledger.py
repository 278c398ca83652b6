"""The privacy ledger (delta-rs, no Spark): boundary arithmetic, refusals that write nothing,
and two processes racing for the last budget (a real concurrent-commit conflict and retry)."""

from __future__ import annotations

import multiprocessing as mp

import pytest

from dplib.budget import Budget
from dplib.errors import BudgetExceededError
from spark_jobs.ledger import Ledger, spent_is_consistent


@pytest.fixture
def ledger(tmp_path):
    led = Ledger(str(tmp_path / "ledger"))
    led.set_limit("pop", Budget(1.0, 1e-6))
    return led


def test_exact_limit_passes_hair_more_fails(ledger):
    ledger.reserve("pop", "a", "job", Budget(0.25, 0.25e-6))
    ledger.reserve("pop", "b", "job", Budget(0.75, 0.75e-6))  # exactly the limit
    before = ledger.rows()
    with pytest.raises(BudgetExceededError, match=r"limit \(epsilon=1, delta=1e-06\), spent \(epsilon=1"):
        ledger.reserve("pop", "c", "job", Budget(1e-9, 0.0))
    assert ledger.rows() == before  # a refusal writes nothing
    assert spent_is_consistent(ledger, "pop")


def test_hair_over_on_first_charge(ledger):
    with pytest.raises(BudgetExceededError):
        ledger.reserve("pop", "a", "job", Budget(1.0 * (1 + 1e-9), 0.0))


def test_delta_alone_exceeding_fails(ledger):
    with pytest.raises(BudgetExceededError, match="requested \\(epsilon=0.1, delta=2e-06\\)"):
        ledger.reserve("pop", "a", "job", Budget(0.1, 2e-6))
    assert ledger.population("pop").spent_epsilon == 0.0


def test_no_limit_refuses(tmp_path):
    led = Ledger(str(tmp_path / "l2"))
    with pytest.raises(BudgetExceededError, match="no budget is set for population 'x'"):
        led.reserve("x", "a", "job", Budget(0.1, 0.0))


def _reserved_by(ledger, run_id, owner):
    """Rewrite the owner of a reserved entry (simulates a reservation made by another process)."""
    rows = [{**r, "owner": owner} for r in ledger.rows() if r["kind"] == "entry" and r["run_id"] == run_id]
    ledger._merge(ledger._table(), rows)


def test_retry_of_a_run_id_abandons_the_old_attempt(ledger):
    ledger.reserve("pop", "r", "job", Budget(0.3, 0.0))
    # the first attempt's process died (a pid that cannot exist on this host)
    import socket

    _reserved_by(ledger, "r", f"{socket.gethostname()}:999999999")
    ledger.reserve("pop", "r", "job", Budget(0.3, 0.0))
    entries = sorted((e["attempt"], e["status"]) for e in ledger.entries("pop", "r"))
    assert entries == [(1, "abandoned"), (2, "reserved")]
    assert ledger.population("pop").spent_epsilon == pytest.approx(0.6)  # both stay spent
    assert ledger.reconcile("pop", {"r"}) == 1
    assert sorted((e["attempt"], e["status"]) for e in ledger.entries("pop", "r")) == [(1, "abandoned"), (2, "released")]


def test_a_retry_refused_for_room_names_its_own_abandoned_attempts(ledger):
    """A new user's run crashed after reserving 0.6 of a 1.0 limit; its retry (same run id) was
    refused for lack of room with "spent 0.6" and nothing saying that the 0.6 was its own dead
    attempt. The refusal now says so (and still writes nothing)."""
    import socket

    ledger.reserve("pop", "r", "job", Budget(0.6, 0.0))
    _reserved_by(ledger, "r", f"{socket.gethostname()}:999999999")
    before = ledger.rows()
    with pytest.raises(BudgetExceededError, match=r"epsilon=0\.6 and delta=0 are this run id's own 1 earlier attempt\(s\)"):
        ledger.reserve("pop", "r", "job", Budget(0.6, 0.0))
    assert ledger.rows() == before
    with pytest.raises(BudgetExceededError) as other:  # another run id: no such clause
        ledger.reserve("pop", "s", "job", Budget(0.6, 0.0))
    assert "earlier attempt" not in str(other.value)


def test_set_limit_keeps_spent(ledger):
    ledger.reserve("pop", "a", "job", Budget(0.5, 0.0))
    ledger.set_limit("pop", Budget(2.0, 1e-5))
    pop = ledger.population("pop")
    assert (pop.limit_epsilon, pop.spent_epsilon) == (2.0, 0.5)


def _racer(path, barrier, name, out):
    led = Ledger(path)
    barrier.wait()  # both try to reserve at the same moment
    try:
        res = led.reserve("pop", name, "job", Budget(0.6, 0.0))
        out.put((name, "ok", res.conflicts))
    except BudgetExceededError:
        out.put((name, "refused", None))


@pytest.mark.parametrize("round_", range(4))
def test_two_processes_race_for_room_for_one(tmp_path, round_):
    path = str(tmp_path / "ledger")
    Ledger(path).set_limit("pop", Budget(1.0, 0.0))
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_racer, args=(path, barrier, n, out)) for n in ("p1", "p2")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    results = sorted(out.get(timeout=5) for _ in procs)
    outcomes = sorted(r[1] for r in results)
    assert outcomes == ["ok", "refused"], results
    led = Ledger(path)
    assert led.population("pop").spent_epsilon == pytest.approx(0.6)
    assert spent_is_consistent(led, "pop")


def test_a_conflict_and_retry_really_happen(tmp_path):
    """Force the race: many processes reserve small amounts at once; the commits collide, the
    losers re-read and retry, and every reservation lands exactly once."""
    path = str(tmp_path / "ledger")
    Ledger(path).set_limit("pop", Budget(100.0, 0.0))
    ctx = mp.get_context("spawn")
    n = 4
    barrier, out = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_small_racer, args=(path, barrier, f"r{i}", out)) for i in range(n)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    results = [out.get(timeout=5) for _ in procs]
    assert all(r[1] == "ok" for r in results)
    assert sum(r[2] for r in results) >= 1, "no concurrent-commit conflict happened"
    led = Ledger(path)
    assert led.population("pop").spent_epsilon == pytest.approx(0.1 * n)
    assert spent_is_consistent(led, "pop")


def _small_racer(path, barrier, name, out):
    led = Ledger(path)
    barrier.wait()
    res = led.reserve("pop", name, "job", Budget(0.1, 0.0))
    out.put((name, "ok", res.conflicts))


def test_same_run_id_in_progress_or_released_is_refused(ledger):
    from spark_jobs.ledger import RunInProgressError

    ledger.reserve("pop", "r", "job", Budget(0.3, 0.0))
    _reserved_by(ledger, "r", "another-host:1234")  # alive elsewhere, as far as we can tell
    with pytest.raises(RunInProgressError, match="in progress"):
        ledger.reserve("pop", "r", "job", Budget(0.3, 0.0))
    ledger.mark("pop", "r", 1, "released")
    with pytest.raises(RunInProgressError, match="already released"):
        ledger.reserve("pop", "r", "job", Budget(0.3, 0.0))
    # a final state is never changed back
    ledger.mark("pop", "r", 1, "abandoned")
    assert [e["status"] for e in ledger.entries("pop", "r")] == ["released"]
    assert ledger.population("pop").spent_epsilon == pytest.approx(0.3)


def test_initial_limit_never_overwrites_an_operator_limit(ledger):
    ledger.set_limit("pop", Budget(5.0, 0.0), only_if_absent=True)
    assert ledger.population("pop").limit_epsilon == 1.0
    ledger.set_limit("new", Budget(5.0, 0.0), only_if_absent=True)
    assert ledger.population("new").limit_epsilon == 5.0


def test_two_snapshots_of_one_version_conflict(tmp_path):
    """Deterministic form of the race: two writers build from the same table version; the
    second commit is refused by Delta's optimistic concurrency (CommitFailedError)."""
    from deltalake.exceptions import CommitFailedError

    from spark_jobs.ledger import LEDGER_SCHEMA, _row

    led = Ledger(str(tmp_path / "ledger"))
    led.set_limit("pop", Budget(1.0, 0.0))
    a, b = led._table(), led._table()

    def row(spent):
        return _row(kind="population", population="pop", limit_epsilon=1.0, limit_delta=0.0,
                    spent_epsilon=spent, spent_delta=0.0)

    led._merge(a, [row(0.6)])
    with pytest.raises(CommitFailedError):
        led._merge(b, [row(0.6)])
    assert led.population("pop").spent_epsilon == 0.6
    assert LEDGER_SCHEMA.field("owner") is not None


@pytest.mark.parametrize("order", [(0.5, 100.0), (100.0, 0.5)], ids=["small first", "large first"])
def test_two_rows_of_one_population_give_one_answer(tmp_path, order):
    """Issue 20, defect 4: racing creators of a new population left two budget rows and the limit
    that applied depended on file order (seen: 0.5 and 100). Now the smaller limit wins whatever
    the order, and the next commit writes one value into both rows."""
    import pyarrow as pa
    from deltalake import write_deltalake

    from spark_jobs.ledger import LEDGER_SCHEMA, _row

    path = str(tmp_path / "ledger")
    for limit in order:  # two separate commits, as two racing creators
        row = _row(kind="population", population="p", limit_epsilon=limit, limit_delta=1e-5,
                   spent_epsilon=0.0, spent_delta=0.0)
        write_deltalake(path, pa.Table.from_pylist([row], schema=LEDGER_SCHEMA), mode="append")
    led = Ledger(path)
    pop = led.population("p")
    assert (pop.limit_epsilon, pop.spent_epsilon) == (0.5, 0.0)
    with pytest.raises(BudgetExceededError):
        led.reserve("p", "r1", "job", Budget(0.6, 0.0))
    led.reserve("p", "r2", "job", Budget(0.4, 0.0))
    rows = [r for r in led.rows() if r["kind"] == "population"]
    assert len(rows) == 2 and {(r["limit_epsilon"], r["spent_epsilon"]) for r in rows} == {(0.5, 0.4)}
    assert spent_is_consistent(led, "p")
