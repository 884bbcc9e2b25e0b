"""Every write statement of the PostgreSQL store names the one task it touches (its id bound
as a parameter of the statement), so the journal can live on a database sharded by task id;
the statements that span tasks are the ones docs/deploy.md lists. Recorded through the
executor's ``trace`` hook over the whole contract suite, on the real server."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

from intentlog.stores import PlanMethod, Q, Store
from intentlog.testing.store_contract import contract_failures

#: The write primitives that act on one task, and how to find that task in their arguments.
ONE_TASK: dict[str, Callable[[tuple[Any, ...]], str]] = {
    "plan_claim_task": lambda args: args[0],
    "plan_write_task": lambda args: args[0],
    "plan_create_task": lambda args: args[0],
    "plan_insert_op": lambda args: args[0].task_id,
    "plan_update_op": lambda args: args[0].task_id,
}
#: Writes chosen by a read across tasks (docs/deploy.md, "Sharding by task id").
SPANNING_WRITES = {"plan_claim_next"}
WRITE_WORDS = ("INSERT INTO", "UPDATE ", "DELETE FROM")
# The condition of each UPDATE or DELETE in a statement (CTEs included): it must say which
# task, not only which key (a key alone would need every shard to be asked).
CONDITIONS = re.compile(r"(?:UPDATE|DELETE FROM) \{s\}\.\w+.*? WHERE (.*?)(?: RETURNING|\)|$)")


def is_write(sql: str) -> bool:
    return any(word in sql.upper() for word in WRITE_WORDS)


def test_every_write_statement_names_its_one_task(
    pg_url: str, pg_schema: str, pg_admin: Any
) -> None:
    from intentlog.stores.postgres import PostgresStore

    seen: list[tuple[str, tuple[Any, ...], Q]] = []

    def trace(method: PlanMethod[Any], args: tuple[Any, ...], query: Q) -> None:
        seen.append((method.__name__, args, query))

    journals = iter(range(1000))

    def fresh_journal() -> Iterator[Callable[[], Store]]:
        number = next(journals)
        url, schema = f"{pg_url}_{number}", f"{pg_schema}_{number}"
        opened: list[PostgresStore] = []

        def open_one() -> Store:
            opened.append(PostgresStore(url))
            opened[-1].executor.trace = trace
            return opened[-1]

        yield open_one
        for store in opened:
            store.close()
        pg_admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')

    assert contract_failures(fresh_journal) == {}
    writes = [(name, args, q) for name, args, q in seen if is_write(q.sql)]
    problems = []
    for name, args, query in writes:
        params = list(query.params)
        if name in ONE_TASK:
            conditions = CONDITIONS.findall(query.sql)
            if ONE_TASK[name](args) not in params or not all("task_id = " in c for c in conditions):
                problems.append(f"{name}: {query.sql} {params}")
        elif name == "plan_delete_completed":
            # gc: one statement per collected task, naming only that task
            if len(set(params)) != 1 or "task_id = %s" not in query.sql:
                problems.append(f"{name}: {query.sql} {params}")
        elif name not in SPANNING_WRITES:
            problems.append(f"{name} writes, and is neither listed nor checked: {query.sql}")
    assert problems == []
    # The run did exercise every write, the lazy receipts riding along and an operator's
    # write with its audit record included.
    assert {name for name, _, _ in writes} == {*ONE_TASK, *SPANNING_WRITES, "plan_delete_completed"}
    assert any("also0" in q.sql for _, _, q in writes)
    assert any("INSERT INTO {s}.resolutions" in q.sql for _, _, q in writes)
