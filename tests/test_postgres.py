"""The journal on a real PostgreSQL server: end to end, two pools racing, fencing, concurrent
migrations, lost connections, the clock, and a worker killed with SIGKILL.

Each test works in a schema of its own (conftest ``pg_url``). Without a server the tests skip,
except where CI=true: there they fail.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

import intentlog
from conftest import with_query
from intentlog import Action, State
from intentlog.stores._base import TaskUpdate
from intentlog.stores.postgres import SCHEMA_VERSION
from remote import Remote

SUPPORT = Path(__file__).parent / "support"
ALL_VERSIONS = [(v,) for v in range(1, SCHEMA_VERSION + 1)]


def counting_effect(name: str = "charge") -> tuple[intentlog.Effect, list[str]]:
    """A deduplicating effect that records every key it was sent."""
    sent: list[str] = []

    def submit(key: str, amount: int) -> dict[str, Any]:
        sent.append(key)
        return {"id": f"pay-{len(sent)}", "amount": amount, "detail": [1.25, "été", None, {}]}

    return intentlog.Effect(name, submit, idempotent=True, key_retention=3600), sent


def postgres_store(url: str, **options: Any) -> Any:
    from intentlog.stores.postgres import PostgresStore

    return PostgresStore(url, **options)


def all_at_once(*calls: Callable[[], Any]) -> list[Any]:
    """Run the calls in threads released together; each one's result or exception."""
    barrier = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)

    def run(index: int, call: Callable[[], Any]) -> None:
        barrier.wait()
        try:
            results[index] = call()
        except Exception as exc:
            results[index] = exc

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def terminate(admin: Any, where: str, value: str) -> int:
    """Kill the server backends whose ``where`` (application_name or usename) is ``value``,
    and wait until they are gone."""
    sql = f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE {where} = %s"
    killed = len(admin.execute(sql, (value,)).fetchall())
    for _ in range(100):
        left = admin.execute(f"SELECT count(*) FROM pg_stat_activity WHERE {where} = %s", (value,))
        if left.fetchone()[0] == 0:
            break
        time.sleep(0.05)
    return killed


def test_journal_end_to_end(pg_url: str) -> None:
    charge, sent = counting_effect()

    def lost(key: str, amount: int) -> None:
        raise ConnectionResetError("connection reset by peer")

    blind = intentlog.Effect("blind", lost)  # can neither deduplicate nor reconcile
    with intentlog.open(pg_url, max_wait=5.0) as journal:
        with journal.task("order-1") as task:
            receipt = task.run(charge, amount=500)
            assert task.run(charge, amount=500) == receipt  # replayed, not sent again
            task.checkpoint(next_step="ship", state={"charge": receipt["id"]})
            task.complete()
        assert len(sent) == 1

        with journal.task("order-2") as task, pytest.raises(intentlog.OutcomeUnknown) as info:
            task.run(blind, amount=7)
        (pending,) = journal.pending()
        assert pending.key == info.value.key and pending.next_action is Action.ESCALATE
        journal.resolve(
            pending.key,
            "confirmed",
            receipt={"id": "seen"},
            note="in the dashboard",
            accept_risk=True,
        )  # fresh: its request may still land
        assert journal.pending() == []
        assert [r.to_state for r in journal.resolutions(pending.key)] == [State.CONFIRMED]
        with journal.task("order-2") as task:
            assert task.run(blind, amount=7) == {"id": "seen"}
            task.complete()

    with intentlog.open(pg_url) as journal:  # all of it is durable, receipts exactly as sent
        record = journal.task_info("order-1").record
        assert record.completed and record.next_step == "ship"
        assert record.state == {"charge": receipt["id"]}
        (op,) = journal.operations("order-1")
        assert op.state is State.CONFIRMED and op.receipt == receipt and op.key == sent[0]
        assert journal.counts()[State.CONFIRMED] == 2
        assert journal.gc(0) == 2 and journal.tasks() == [] and journal.resolutions() == []


def test_two_pools_racing_for_one_task_have_one_winner(pg_url: str) -> None:
    with intentlog.open(pg_url) as first, intentlog.open(pg_url) as second:
        for task_id in ("race-1", "race-2", "race-3", "race-4", "race-5"):
            results = all_at_once(
                lambda: first.task(task_id, wait=0),  # noqa: B023 - called in this iteration
                lambda: second.task(task_id, wait=0),  # noqa: B023
            )
            busy = [r for r in results if isinstance(r, intentlog.TaskBusy)]
            winners = [r for r in results if not isinstance(r, Exception)]
            assert len(busy) == 1 and len(winners) == 1, results
            assert winners[0].epoch == 1
            winners[0].close()


def test_a_stale_epoch_cannot_write(pg_url: str) -> None:
    charge, sent = counting_effect()
    with intentlog.open(pg_url) as journal, journal.task("t1") as task:
        # Another worker takes the task over, as after our lease expired.
        taken = journal.store.claim_task("t1", "elsewhere:1:1:abcd", 30.0, task.epoch)
        assert taken is not None and taken.epoch == task.epoch + 1
        with pytest.raises(intentlog.LeaseLost):
            task.checkpoint(next_step="mine")
        with pytest.raises(intentlog.LeaseLost):
            task.run(charge, amount=1)
        with pytest.raises(intentlog.LeaseLost):
            journal.store.write_task("t1", task.epoch, 30.0, TaskUpdate(next_step="mine"))
        assert sent == [] and journal.operations("t1") == []
        record = journal.store.get_task("t1")
        assert record is not None and record.next_step is None
        assert record.owner == "elsewhere:1:1:abcd"


def test_lazy_receipts_on_postgres(pg_url: str) -> None:
    sent: list[str] = []

    def submit(key: str, n: int) -> dict[str, Any]:
        sent.append(key)
        return {"id": key, "n": n}

    lazy = intentlog.Effect(
        "lazy", submit, idempotent=True, key_retention=intentlog.FOREVER, lazy_receipt=True
    )
    with intentlog.open(pg_url) as journal:
        with journal.task("t1") as task:
            receipts = [task.run(lazy, n=n) for n in range(3)]
            task.complete()
        ops = journal.operations("t1")
        assert [op.state for op in ops] == [State.CONFIRMED] * 3
        assert [op.receipt for op in ops] == receipts and len(sent) == 3


def test_concurrent_first_starts_migrate_once(pg_url: str, pg_admin: Any, pg_schema: str) -> None:
    schemas = [f"{pg_schema}_{i}" for i in range(3)]
    try:
        for schema in schemas:
            url = pg_url.replace(f"schema={pg_schema}", f"schema={schema}")
            results = all_at_once(*[lambda: postgres_store(url)] * 4)  # noqa: B023
            stores = [r for r in results if not isinstance(r, Exception)]
            errors = [r for r in results if isinstance(r, Exception)]
            try:
                assert errors == [] and len(stores) == 4
                versions = pg_admin.execute(
                    f'SELECT version FROM "{schema}".schema_version ORDER BY 1'
                )
                assert versions.fetchall() == ALL_VERSIONS  # each step applied once
                stores[0].claim_task("t", "a", 30.0, None)
                assert stores[3].get_task("t") is not None  # one journal
            finally:
                for store in stores:
                    store.close()
    finally:
        for schema in schemas:
            pg_admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def test_a_newer_schema_is_refused_and_left_alone(
    pg_url: str, pg_admin: Any, pg_schema: str
) -> None:
    intentlog.open(pg_url).close()
    pg_admin.execute(f'INSERT INTO "{pg_schema}".schema_version VALUES (99, 0)')
    with pytest.raises(intentlog.SchemaTooNew, match="schema 99"):
        intentlog.open(pg_url)
    rows = pg_admin.execute(f'SELECT version FROM "{pg_schema}".schema_version ORDER BY 1')
    assert rows.fetchall() == [*ALL_VERSIONS, (99,)]


def test_a_schema_holding_other_tables_is_refused(
    pg_url: str, pg_admin: Any, pg_schema: str
) -> None:
    pg_admin.execute(f'CREATE SCHEMA "{pg_schema}"')
    pg_admin.execute(f'CREATE TABLE "{pg_schema}".tasks (id integer)')
    with pytest.raises(intentlog.JournalCorrupt, match="not an intentlog journal"):
        intentlog.open(pg_url)
    found = pg_admin.execute("SELECT to_regclass(%s)", (f'"{pg_schema}".schema_version',))
    assert found.fetchone() == (None,)  # the migration rolled back as a whole


def test_passwords_are_masked(pg_url: str) -> None:
    parts = urlsplit(pg_url)
    if parts.password:  # the server needs the real one: check that it is masked
        secret, url = parts.password, pg_url
    else:  # trust authentication ignores a password: add one to check
        secret = "s3cr%40t"
        netloc = parts.netloc.replace("@", f":{secret}@", 1)
        url = urlunsplit(parts._replace(netloc=netloc))
    for candidate in (url, with_query(url, password="other-s3cret")):
        with intentlog.open(candidate) as journal:
            shown = f"{journal.url} {journal!r} {journal.store!r}"
            assert secret not in shown and "s3cr@t" not in shown and "other-s3cret" not in shown
            assert ":***@" in journal.url
    for broken in ("postgresql://u:s3cret@127.0.0.1:1/db", "postgresql://u:s3cret@h/db?x=a b"):
        with pytest.raises(intentlog.JournalError) as info:
            intentlog.open(broken)
        assert "s3cret" not in str(info.value) and "u:***@" in str(info.value)


def test_lost_connections_are_replaced_or_reported(pg_url: str, pg_admin: Any) -> None:
    app = f"intentlog-test-{uuid.uuid4().hex[:8]}"
    charge, sent = counting_effect()
    with intentlog.open(with_query(pg_url, application_name=app), max_wait=5.0) as journal:
        with journal.task("t1") as task:
            task.run(charge, amount=1)
            for amount in (2, 3):
                assert terminate(pg_admin, "application_name", app) >= 1
                # A raw psycopg error would escape this and fail the test.
                with contextlib.suppress(intentlog.JournalError):
                    task.run(charge, amount=amount)
            assert terminate(pg_admin, "application_name", app) >= 1
            ops = journal.operations("t1")  # reads recover on fresh connections
            assert set(sent) <= {op.key for op in ops}  # nothing was sent without its intent
            assert all(op.state is State.CONFIRMED for op in ops if op.key in sent)
            task.checkpoint(next_step="after")
        assert journal.task_info("t1").record.next_step == "after"


@pytest.fixture
def pg_role(pg_admin: Any, pg_schema: str) -> Iterator[str]:
    """A login role of its own, so a test can lock it out of the server."""
    role = f"{pg_schema}_role"
    try:
        pg_admin.execute(f'CREATE ROLE "{role}" LOGIN')
    except Exception as exc:  # a server we may not create roles on
        pytest.skip(f"cannot create a role on the test server: {exc}")
    database = pg_admin.execute("SELECT current_database()").fetchone()[0]
    pg_admin.execute(f'GRANT CREATE ON DATABASE "{database}" TO "{role}"')
    yield role
    terminate(pg_admin, "usename", role)
    pg_admin.execute(f'DROP SCHEMA IF EXISTS "{pg_schema}" CASCADE')
    pg_admin.execute(f'DROP OWNED BY "{role}"')
    pg_admin.execute(f'DROP ROLE "{role}"')


def test_an_intent_the_journal_cannot_record_is_never_sent(
    pg_url: str, pg_admin: Any, pg_role: str
) -> None:
    parts = urlsplit(pg_url)
    url = urlunsplit(parts._replace(netloc=f"{pg_role}@{parts.netloc.rpartition('@')[2]}"))
    charge, sent = counting_effect()
    journal = intentlog.Journal(postgres_store(url, timeout=1.0), max_wait=5.0)
    with journal, journal.task("t1") as task:
        task.run(charge, amount=1)
        pg_admin.execute(f'ALTER ROLE "{pg_role}" NOLOGIN')  # no new connection gets in
        terminate(pg_admin, "usename", pg_role)
        with pytest.raises(intentlog.JournalError):
            task.run(charge, amount=2)
        assert len(sent) == 1  # the intent was not recorded, so nothing was sent
        pg_admin.execute(f'ALTER ROLE "{pg_role}" LOGIN')
        for _ in range(40):  # the pool reconnects with a backoff
            try:
                task.run(charge, amount=2)
                break
            except intentlog.JournalError:
                time.sleep(0.25)
        assert len(sent) == 2 and len(set(sent)) == 2
        assert [op.state for op in task.operations()] == [State.CONFIRMED] * 2


def test_a_connection_lost_during_commit_raises_and_sends_nothing(
    pg_url: str, pg_admin: Any, pg_schema: str
) -> None:
    charge, sent = counting_effect("doomed")
    with intentlog.open(pg_url, max_wait=5.0) as journal, journal.task("t1") as task:
        # A deferred trigger runs inside COMMIT: it kills its own backend there, so the client
        # loses the connection with the COMMIT in flight.
        pg_admin.execute(
            f'CREATE FUNCTION "{pg_schema}".die() RETURNS trigger LANGUAGE plpgsql AS $$'
            " BEGIN PERFORM pg_terminate_backend(pg_backend_pid()); PERFORM pg_sleep(5);"
            " RETURN NULL; END $$"
        )
        pg_admin.execute(
            f'CREATE CONSTRAINT TRIGGER die AFTER INSERT ON "{pg_schema}".operations'
            f' DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION "{pg_schema}".die()'
        )
        with pytest.raises(intentlog.JournalError, match="while committing"):
            task.run(charge, amount=1)
        assert sent == []  # the outcome of the intent was unknown: nothing was sent
        pg_admin.execute(f'DROP TRIGGER die ON "{pg_schema}".operations')
        assert task.run(charge, amount=1)["id"] == "pay-1"
        assert len(sent) == 1
        (op,) = task.operations()
        assert op.state is State.CONFIRMED


def test_values_postgres_cannot_store_are_refused_cleanly(pg_url: str) -> None:
    with intentlog.open(pg_url) as journal, journal.task("t1") as task:
        with pytest.raises(intentlog.InvalidInput, match="next_step"):
            task.checkpoint(next_step="a\x00b")
        task.checkpoint(next_step="fine")
        assert task.next_step == "fine"


def test_the_store_clock_is_the_database_clock(pg_url: str, pg_admin: Any) -> None:
    store = postgres_store(pg_url)
    try:
        assert abs(store.now() - time.time()) < 5
        row = pg_admin.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
        assert abs(store.now() - row[0]) < 1
    finally:
        store.close()


def test_the_core_does_not_import_psycopg() -> None:
    code = "import sys, intentlog, intentlog.cli; print([m for m in sys.modules if 'psycopg' in m])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_without_psycopg_opening_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)  # import psycopg now fails
    monkeypatch.delitem(sys.modules, "intentlog.stores.postgres", raising=False)
    with pytest.raises(intentlog.InvalidInput, match=r"pip install 'intentlog\[postgres\]'"):
        intentlog.open("postgresql://nobody@127.0.0.1:1/nothing")


@pytest.mark.parametrize("kind", ["reconcilable", "dedupe"])
def test_killed_after_remote_commit_recovers_on_postgres(
    pg_url: str, tmp_path: Path, kind: str
) -> None:
    remote_path = str(tmp_path / "remote.db")

    def child(crash: str | None = None) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "PYTHONPATH": str(SUPPORT)}
        env.pop("INTENTLOG_CRASH", None)
        if crash:
            env["INTENTLOG_CRASH"] = crash
        script = [sys.executable, str(SUPPORT / "crash_child.py"), pg_url, remote_path, kind]
        return subprocess.run(script, env=env, capture_output=True, text=True, timeout=60)

    first = child("after_remote_commit")
    assert first.returncode == -signal.SIGKILL, first.stderr
    remote = Remote(remote_path)
    assert remote.count() == 1  # the service committed before the kill
    with intentlog.open(pg_url) as journal:
        (op,) = journal.operations("order-1")
        assert op.state is State.SUBMITTED  # the receipt was not written

    second = child()
    assert second.returncode == 0, second.stderr
    receipt = json.loads(second.stdout)
    assert remote.count() == 1, "the effect was applied twice"
    assert receipt["id"] == remote.ids()[0]
    with intentlog.open(pg_url) as journal:
        (op,) = journal.operations("order-1")
        assert op.state is State.CONFIRMED and op.receipt == receipt
