"""The store contract suite (:mod:`intentlog.testing.store_contract`) on every backend, each
opened through its public module and the public ``intentlog.stores`` only; and the proof that
the suite can fail: a backend with one deliberately wrong plan does not pass it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from intentlog.stores import Plan, PlanStore, Q, Store
from intentlog.testing.store_contract import BlockingStore, StoreContract, contract_failures


class TestEveryBackend(StoreContract):
    @pytest.fixture(params=["sqlite", "sqlite-async", "postgres", "postgres-async"])
    def open_store(
        self, request: pytest.FixtureRequest, tmp_path: Path
    ) -> Iterator[Callable[[], Store]]:
        """Each call a new store object (its own connections) on the same fresh journal."""
        url = ""
        if request.param.startswith("postgres"):
            url = request.getfixturevalue("pg_url")  # skips (or fails in CI) without a server
        opened: list[Any] = []

        def open_one() -> Store:
            from intentlog.stores.postgres import AsyncPostgresStore, PostgresStore
            from intentlog.stores.sqlite import SQLiteStore
            from intentlog.stores.sqlite_async import AsyncSQLiteStore

            path = tmp_path / "contract.db"
            store: Any = {
                "sqlite": lambda: SQLiteStore(path),
                "sqlite-async": lambda: BlockingStore(AsyncSQLiteStore(path)),
                "postgres": lambda: PostgresStore(url),
                "postgres-async": lambda: BlockingStore(AsyncPostgresStore(url)),
            }[request.param]()
            opened.append(store)
            return store  # type: ignore[no-any-return]

        yield open_one
        for store in opened:
            store.close()


def test_the_suite_fails_a_backend_whose_claim_is_not_a_compare_and_set(
    pg_url: str, pg_schema: str, pg_admin: Any
) -> None:
    """The PostgreSQL backend with one wrong plan: its claim takes the lease whatever the
    epoch (no compare-and-set). The suite must catch it, and only where a claim matters."""
    from intentlog.stores.postgres import PostgresStore

    class Careless(PostgresStore):
        def __init__(self, url: str) -> None:
            super().__init__(url)
            right = self.plans.plan_claim_task

            def claim(task_id: str, owner: str, ttl: float, epoch: int | None) -> Plan[Any]:
                if epoch is None:
                    return (yield from right(task_id, owner, ttl, epoch))
                sql = (
                    "UPDATE {s}.tasks SET epoch = epoch + 1, owner = %s WHERE task_id = %s"
                    " RETURNING *"
                )
                yield Q(sql, (owner, task_id))  # no "AND epoch = %s": the deliberate fault
                return (yield from self.plans.plan_get_task(task_id))

            self.plans.plan_claim_task = claim  # type: ignore[method-assign]

    journals = iter(range(1000))

    def fresh_journal() -> Iterator[Callable[[], Store]]:
        number = next(journals)  # a schema of its own: pg_url's name, numbered
        url, schema = f"{pg_url}_{number}", f"{pg_schema}_{number}"
        opened: list[PlanStore] = []

        def open_one() -> Store:
            opened.append(Careless(url))
            return opened[-1]

        yield open_one
        for store in opened:
            store.close()
        pg_admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')

    failures = contract_failures(fresh_journal)
    assert "test_claim_creates_then_compare_and_set_on_epoch" in failures, failures
    assert "test_concurrent_claims_have_exactly_one_winner" in failures, failures
    assert "test_insert_op_is_insert_if_absent_and_fenced" not in failures, failures


def test_the_suite_fails_a_backend_whose_update_is_not_a_compare_and_set(tmp_path: Path) -> None:
    """The SQLite backend with one wrong plan: its operation update ignores the version it
    was read at (a lost update). The suite must catch it where versions matter."""
    from intentlog.stores.sqlite import SQLitePlans, SQLiteStore

    class LastWriterWins(SQLitePlans):
        def plan_update_op(
            self, op: Any, epoch: Any, ttl: float, resolution: Any, also: Any
        ) -> Any:
            stored = yield Q("SELECT version FROM operations WHERE key = ?", (op.key,))
            if not stored.rows:
                return None
            moved = op.replace(version=stored.rows[0][0])  # the deliberate fault
            return (yield from self._update_op(*self._cas(moved, epoch), moved, epoch))

        def _cas(self, op: Any, epoch: Any) -> tuple[str, tuple[Any, ...]]:
            from intentlog.stores.sqlite import _update_op_statement

            return _update_op_statement(op, epoch)

    journals = iter(range(1000))

    def fresh_journal() -> Iterator[Callable[[], Store]]:
        path = tmp_path / f"journal-{next(journals)}.db"
        opened: list[SQLiteStore] = []

        def open_one() -> Store:
            store = SQLiteStore(path)
            store.plans = LastWriterWins(store.now)
            opened.append(store)
            return store

        yield open_one
        for store in opened:
            store.close()

    failures = contract_failures(fresh_journal)
    assert "test_update_op_is_compare_and_set_on_version" in failures, failures
    assert "test_claim_creates_then_compare_and_set_on_epoch" not in failures, failures
