"""The asyncio journal on PostgreSQL: psycopg's async connections, nothing on the thread pool,
lost connections retried or reported, and one round trip per write.

The behavioural tests of ``test_async.py``, the store contract and the SIGKILL test run on this
store too (their ``journal_url`` and ``store`` fixtures); these are what only it has.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import Any

import pytest

import intentlog
from conftest import with_query
from intentlog import State
from test_postgres import counting_effect, terminate


def test_async_lost_connections_are_retried_or_reported(pg_url: str, pg_admin: Any) -> None:
    app = f"intentlog-test-{uuid.uuid4().hex[:8]}"
    charge, sent = counting_effect()

    async def main() -> None:
        url = with_query(pg_url, application_name=app)
        async with intentlog.open_async(url, max_wait=5.0) as journal:
            async with journal.task("t1") as task:
                await task.run(charge, amount=1)
                for amount in (2, 3):
                    assert terminate(pg_admin, "application_name", app) >= 1
                    # A raw psycopg error would escape this and fail the test.
                    with contextlib.suppress(intentlog.JournalError):
                        await task.run(charge, amount=amount)
                assert terminate(pg_admin, "application_name", app) >= 1
                ops = await journal.operations("t1")  # reads recover on fresh connections
                assert set(sent) <= {op.key for op in ops}  # nothing sent without its intent
                assert all(op.state is State.CONFIRMED for op in ops if op.key in sent)
                await task.checkpoint(next_step="after")
            assert (await journal.task_info("t1")).record.next_step == "after"

    asyncio.run(main())


@pytest.mark.parametrize("asynchronous", [False, True])
def test_one_round_trip_per_write(pg_url: str, asynchronous: bool) -> None:
    """A first run of an effect on a fresh task: the intent and the receipt, one statement
    each, and nothing else (the key is not read first, the fence is in the statement)."""
    from intentlog.stores.postgres import AsyncPostgresStore, PostgresStore

    charge, sent = counting_effect()
    statements: list[str] = []
    seen: list[str] = []
    store = AsyncPostgresStore(pg_url) if asynchronous else PostgresStore(pg_url)
    # every statement of every primitive passes through the executor's trace
    store.executor.trace = lambda _, __, query: statements.append(query.sql.split()[0])

    if asynchronous:

        async def main() -> None:
            async with intentlog.AsyncJournal(store) as journal, journal.task("t") as task:
                await task.run(charge, amount=1)
                statements.clear()
                await task.run(charge, amount=2)
                await task.run(charge, amount=3)
                seen.extend(statements)

        asyncio.run(main())
    else:
        with intentlog.Journal(store) as journal, journal.task("t") as task:  # type: ignore[arg-type]
            task.run(charge, amount=1)
            statements.clear()
            task.run(charge, amount=2)
            task.run(charge, amount=3)
            seen.extend(statements)
    assert seen == ["WITH"] * 4  # per effect: the fenced intent, the fenced receipt
    assert len(sent) == 3
