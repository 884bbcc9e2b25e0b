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

TTL = 30.0


@pytest.fixture
def store(pg_url: str) -> Iterator[Any]:
    from intentlog.stores.postgres import PostgresStore

    store = PostgresStore(pg_url)
    yield store
    store.close()


def make_op(store: Any, key: str, task_id: str = "t1") -> Operation:
    now = store.now()
    return Operation(
        key=key,
        task_id=task_id,
        effect="charge",
        fingerprint="f" * 64,
        state=State.SUBMITTED,
        policy=Policy(idempotent=True, timeout=5.0),
        created_at=now,
        updated_at=now,
        attempts=1,
        submitted_at=now,
        first_submitted_at=now,
        submitted_by="host:1:2:abcd",
    )


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
        conn = psycopg.connect(store._conninfo)  # a transaction, not autocommit
        conns.append(conn)
        query = next(store.plan_claim_task("t1", "elsewhere:9:9:beef", TTL, epoch))
        rows = conn.execute(store.sql(query.sql), query.params).fetchall()
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
    with psycopg.connect(store._conninfo) as writer:
        # The fence of the write, as the store's statement takes it, left uncommitted.
        query = next(store.plan_insert_op(make_op(store, "k1"), 1, TTL, ()))
        assert writer.execute(store.sql(query.sql), query.params).fetchall()
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
