"""How the PostgreSQL store writes an operation, on a real server: the fence that locks the
task row without writing it, racing a real takeover held open on another connection.

Each test works in a schema of its own (conftest ``pg_url``). Without a server the tests skip,
except where CI=true: there they fail.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import intentlog
from intentlog import State
from intentlog._model import Operation, Policy
from intentlog.testing.store_contract import make_op as contract_op

TTL = 30.0


@pytest.fixture
def store(pg_url: str) -> Iterator[Any]:
    from intentlog.stores.postgres import PostgresStore

    store = PostgresStore(pg_url)
    yield store
    store.close()


def make_op(store: Any, key: str, task_id: str = "t1") -> Operation:
    """An intent of an idempotent effect, without a receipt yet."""
    policy = Policy(idempotent=True, timeout=5.0)
    return contract_op(store, key, task_id, policy=policy, state=State.SUBMITTED, receipt=None)


def started(call: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """``call`` running in a thread; the list receives its result or exception."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(call())
        except Exception as exc:
            out.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def wait_until_blocked(admin: Any, schema: str) -> None:
    """Until a statement on ``schema`` waits for a row lock held by another transaction."""
    sql = (
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        " AND position(%s IN query) > 0"
    )
    deadline = time.monotonic() + 10
    while admin.execute(sql, (f'"{schema}"',)).fetchone()[0] == 0:
        assert time.monotonic() < deadline, "the write never waited for the takeover"
        time.sleep(0.02)


@pytest.fixture
def takeover(store: Any) -> Iterator[Callable[[int], Any]]:
    """Starts the store's own claim_task statement (epoch -> epoch + 1) in a transaction left
    open on a connection of its own; returns that connection, to commit or roll back."""
    import psycopg

    conns: list[Any] = []

    def begin(epoch: int) -> Any:
        conn = psycopg.connect(store.executor._conninfo)  # a transaction, not autocommit
        conns.append(conn)
        query = next(store.plans.plan_claim_task("t1", "elsewhere:9:9:beef", TTL, epoch))
        rows = conn.execute(store.executor.sql(query.sql), query.params).fetchall()
        assert len(rows) == 1  # the claim holds the task row's lock, uncommitted
        return conn

    yield begin
    for conn in conns:
        conn.close()


@pytest.mark.parametrize("write", ["insert_op", "update_op"])
def test_an_operation_write_racing_a_takeover_fails_with_lease_lost(
    store: Any, takeover: Callable[[int], Any], pg_admin: Any, pg_schema: str, write: str
) -> None:
    task = store.claim_task("t1", "me:1:1:abcd", TTL, None)
    assert task is not None and task.epoch == 1
    existing, created = store.insert_op(make_op(store, "k-old"), 1, TTL)
    assert created
    claim = takeover(1)
    if write == "insert_op":
        thread, out = started(lambda: store.insert_op(make_op(store, "k-new"), 1, TTL))
    else:
        done = existing.replace(state=State.CONFIRMED, receipt={"id": 1})
        thread, out = started(lambda: store.update_op(done, 1, TTL))
    # The fence waits for the takeover's row lock: it neither writes nor fails meanwhile.
    wait_until_blocked(pg_admin, pg_schema)
    assert thread.is_alive() and out == []
    claim.commit()
    thread.join(10)
    assert len(out) == 1 and isinstance(out[0], intentlog.LeaseLost), out
    assert store.get_op("k-new") is None
    stored = store.get_op("k-old")
    assert stored is not None and (stored.state, stored.version) == (State.SUBMITTED, 1)
    record = store.get_task("t1")
    assert record is not None and (record.epoch, record.owner) == (2, "elsewhere:9:9:beef")


def test_an_operation_write_waiting_on_a_takeover_that_rolls_back_goes_through(
    store: Any, takeover: Callable[[int], Any], pg_admin: Any, pg_schema: str
) -> None:
    assert store.claim_task("t1", "me:1:1:abcd", TTL, None) is not None
    claim = takeover(1)
    thread, out = started(lambda: store.insert_op(make_op(store, "k1"), 1, TTL))
    wait_until_blocked(pg_admin, pg_schema)
    claim.rollback()
    thread.join(10)
    assert len(out) == 1 and out[0][1] is True, out
    stored = store.get_op("k1")
    assert stored is not None and stored.state is State.SUBMITTED


def test_a_takeover_waits_for_an_operation_write_holding_the_fence(
    store: Any, pg_url: str, pg_admin: Any, pg_schema: str
) -> None:
    """The other order: while a fenced write's transaction holds the task's shared lock, a
    claim waits, and sees the committed operation once it has the task."""
    import psycopg

    assert store.claim_task("t1", "me:1:1:abcd", TTL, None) is not None
    with psycopg.connect(store.executor._conninfo) as writer:
        # The fence of the write, as the store's statement takes it, left uncommitted.
        query = next(store.plans.plan_insert_op(make_op(store, "k1"), 1, TTL, ()))
        assert writer.execute(store.executor.sql(query.sql), query.params).fetchall()
        thread, out = started(lambda: store.claim_task("t1", "elsewhere:9:9:beef", TTL, 1))
        wait_until_blocked(pg_admin, pg_schema)
        assert thread.is_alive() and out == []
        writer.commit()
        thread.join(10)
    assert len(out) == 1 and out[0] is not None and out[0].epoch == 2, out
    assert store.get_op("k1") is not None


def test_the_fence_writes_no_new_version_of_the_task_row(
    store: Any, pg_admin: Any, pg_schema: str
) -> None:
    task = store.claim_task("t1", "me:1:1:abcd", TTL, None)
    assert task is not None
    where = f'SELECT ctid, xmin::text FROM "{pg_schema}".tasks WHERE task_id = %s'
    before = pg_admin.execute(where, ("t1",)).fetchone()
    for n in range(5):
        op, created = store.insert_op(make_op(store, f"k{n}"), task.epoch, TTL)
        assert created
        assert store.update_op(op.replace(state=State.CONFIRMED, receipt={"n": n}), 1, TTL)
    # The same tuple, created by the same transaction: the task row was only locked.
    assert pg_admin.execute(where, ("t1",)).fetchone() == before


def table_stats(admin: Any, schema: str, table: str, settled: Callable[[Any], bool]) -> Any:
    """The table's row counters, once ``settled`` says the server has published them (a
    backend reports its counters when idle or when it exits, not at commit)."""
    sql = (
        "SELECT n_tup_ins, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables"
        " WHERE schemaname = %s AND relname = %s"
    )
    deadline = time.monotonic() + 20
    while True:
        admin.execute("SELECT pg_stat_clear_snapshot()")
        row = admin.execute(sql, (schema, table)).fetchone()
        if settled(row) or time.monotonic() > deadline:
            return row
        time.sleep(0.1)


def test_the_receipt_write_is_a_hot_update(pg_url: str, pg_admin: Any, pg_schema: str) -> None:
    """SUBMITTED -> CONFIRMED changes no indexed column, and the page has room for the new
    version: PostgreSQL updates the row in place (HOT), with no new index entry."""
    effect = intentlog.Effect(
        "charge",
        lambda key, n: {"id": f"ch_{n}", "n": n, "pad": "x" * 40},
        idempotent=True,
        key_retention=intentlog.FOREVER,
    )
    n = 400  # some 15 pages of operations: HOT must hold page after page, not only on the first
    with intentlog.open(pg_url) as journal, journal.task("t1") as task:
        for i in range(n):
            task.run(effect, n=i)
    stats = table_stats(pg_admin, pg_schema, "operations", lambda row: row and row[0] >= n)
    assert stats == (n, n, n)  # every one of the n receipt writes was HOT
    size = "SELECT pg_relation_size(%s) / current_setting('block_size')::int"
    pages = pg_admin.execute(size, (f'"{pg_schema}".operations',)).fetchone()[0]
    assert pages >= 10  # so it did hold page after page


def test_a_version_4_journal_migrates_with_its_open_operations_listed(
    pg_url: str, pg_admin: Any, pg_schema: str
) -> None:
    from intentlog.stores._pg import MIGRATIONS, RECORD_VERSION, VERSION_TABLE

    s = f'"{pg_schema}"'
    pg_admin.execute(f"CREATE SCHEMA {s}")
    pg_admin.execute(VERSION_TABLE.replace("{s}", s))
    for number, step in enumerate(MIGRATIONS[:4], start=1):
        for statement in filter(str.strip, step.split(";")):
            pg_admin.execute(statement.replace("{s}", s))
        pg_admin.execute(RECORD_VERSION.replace("{s}", s), (number,))
    # What a version-4 writer left: a parked task (an UNRESOLVED operation), an operation in
    # flight, and settled ones.
    old_insert = (
        f"INSERT INTO {s}.operations (key, task_id, effect, fingerprint, state, version,"
        " can_reconcile, idempotent, timeout, lookup_lag, created_at, updated_at, attempts,"
        " lookup_failures) VALUES (%s, %s, 'charge', 'f', %s, 1, false, true, 5, 0, %s, 0, 1, 0)"
    )
    states = {"a": "UNRESOLVED", "b": "SUBMITTED", "c": "CONFIRMED", "d": "FAILED"}
    for n, (key, state) in enumerate(states.items()):
        pg_admin.execute(old_insert, (key, f"t-{key}", state, n))
    for key in states:
        pg_admin.execute(
            f"INSERT INTO {s}.tasks (task_id, epoch, lease_expires, state, created_at,"
            " updated_at, kind, input) VALUES (%s, 0, 0, 'null', 0, 0, 'k', '{}')",
            (f"t-{key}",),
        )
    with intentlog.open(pg_url) as journal:
        assert [(p.key, p.state) for p in journal.pending()] == [
            ("a", State.UNRESOLVED),
            ("b", State.SUBMITTED),
        ]
        store = journal.store
        claimed = [store.claim_next("w", TTL, ["k"]) for _ in range(4)]
        assert {c.task_id for c in claimed if c is not None} == {"t-b", "t-c", "t-d"}
        # A receipt written now leaves the list; the settled ones were never in it.
        op = store.get_op("b")
        assert op is not None
        assert store.update_op(op.replace(state=State.CONFIRMED, receipt={}), None, TTL)
        listed = pg_admin.execute(f"SELECT key FROM {s}.open_operations ORDER BY 1")
        assert listed.fetchall() == [("a",)]
    # A writer of version 4 would not keep the list: its insert is refused, writing nothing.
    import psycopg

    with pytest.raises(psycopg.errors.NotNullViolation):
        pg_admin.execute(old_insert, ("e", "t-e", "SUBMITTED", 9))
    assert pg_admin.execute(f"SELECT count(*) FROM {s}.operations").fetchone() == (4,)


def test_the_open_list_follows_every_change_of_state(
    store: Any, pg_admin: Any, pg_schema: str
) -> None:
    """claim_next reads the list's copy of the state: it must follow an operation that
    becomes UNRESOLVED after its insert, and one an operator then settles."""
    from intentlog.stores._base import Resolution, TaskUpdate

    assert store.create_task("t1", "k", "{}") is not None
    task = store.claim_next("w", TTL, ["k"])
    assert task is not None
    op, _ = store.insert_op(make_op(store, "k1"), task.epoch, TTL)
    parked = store.update_op(op.replace(state=State.UNRESOLVED), task.epoch, TTL)
    assert parked is not None
    store.write_task("t1", task.epoch, TTL, TaskUpdate(release=True))
    listed = f'SELECT key, state FROM "{pg_schema}".open_operations'
    assert pg_admin.execute(listed).fetchall() == [("k1", "UNRESOLVED")]
    assert store.claim_next("w", TTL, ["k"]) is None  # parked
    now = store.now()
    audit = Resolution("k1", "t1", now, State.UNRESOLVED, State.CONFIRMED, None, {}, "me")
    settled = store.update_op(parked.replace(state=State.CONFIRMED), None, TTL, audit)
    assert settled is not None
    assert pg_admin.execute(listed).fetchall() == []
    claimed = store.claim_next("w", TTL, ["k"])
    assert claimed is not None and claimed.task_id == "t1"
