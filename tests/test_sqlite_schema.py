"""The SQLite store's schema and write path: index use, what a write touches, point reads,
lone and concurrent writers; and the per-effect helpers (row values, keys, receipt checks)."""

from __future__ import annotations

import dataclasses
import inspect
import pickle
import sqlite3
import threading
import warnings
from pathlib import Path
from typing import Any

import pytest

import intentlog
from intentlog._errors import JournalError, LeaseLost
from intentlog._hygiene import (
    ReceiptWarning,
    _find_secrets,
    _holds_secret,
    _secret_value,
    check_safe,
    clean_receipt,
)
from intentlog._keys import canonical_json, derive_key, fingerprint
from intentlog._model import Operation, OperationChanges, Policy, State
from intentlog.stores._base import OP_COLUMNS, op_to_row, op_values
from intentlog.stores._group_commit import PlanWrite
from intentlog.stores._plan import Plan, Q
from intentlog.stores.sqlite import SQLiteStore
from intentlog.testing.store_contract import make_op

TTL = 30.0


def _op(store: SQLiteStore, key: str, task_id: str = "t1", **changes: Any) -> Operation:
    """The contract suite's operation, with a deduplicating policy and no receipt yet."""
    policy = Policy(idempotent=True, key_retention=60.0, timeout=5.0, lookup_lag=1.5)
    return make_op(store, key, task_id, **{"policy": policy, "receipt": None, **changes})


@pytest.fixture
def store(tmp_path: Path) -> Any:
    s = SQLiteStore(tmp_path / "journal.db")
    yield s
    s.close()


def _plan(store: SQLiteStore, sql: str) -> str:
    rows = store._reader.execute(f"EXPLAIN QUERY PLAN {sql}").fetchall()
    return " | ".join(r[3] for r in rows)


# -- indexes ---------------------------------------------------------------------------------


def _statement_of(store: SQLiteStore, call: Any) -> str:
    """The SELECT the store's reader runs for ``call()``, as SQLite traced it (with its
    parameters inlined, so it can be explained)."""
    seen: list[str] = []
    store._reader.set_trace_callback(seen.append)
    try:
        call()
    finally:
        store._reader.set_trace_callback(None)
    return next(sql for sql in seen if sql.lstrip().upper().startswith("SELECT"))


def test_open_operations_and_task_listing_are_read_through_their_indexes(
    store: SQLiteStore,
) -> None:
    # pending() on a big journal reads the live tasks through their partial index, then each
    # one's operations as a range of ids; list_ops(task_id=...) the task's range alone, in
    # its creation order (no sort). No scan of the operations anywhere.
    open_states = [s for s in State if s not in (State.CONFIRMED, State.FAILED)]
    plan = _plan(store, _statement_of(store, lambda: store.list_ops(states=open_states)))
    assert "tasks_live" in plan and "INTEGER PRIMARY KEY (rowid>? AND rowid<?)" in plan, plan
    assert "SCAN o" not in plan, plan
    plan = _plan(store, _statement_of(store, lambda: store.list_ops(task_id="t1")))
    assert "INTEGER PRIMARY KEY (rowid>? AND rowid<?)" in plan, plan
    assert "TEMP B-TREE" not in plan and "SCAN o" not in plan, plan


def test_a_task_completed_with_open_operations_keeps_them_pending(store: SQLiteStore) -> None:
    from intentlog.stores._base import TaskUpdate

    for task_id, settle in (("open", False), ("settled", True)):
        record = store.claim_task(task_id, "a", TTL, None)
        assert record is not None
        op, _ = store.insert_op(_op(store, f"{task_id}-k", task_id), record.epoch, TTL)
        done = op.replace(state=State.CONFIRMED, receipt={"id": 1})
        also = [done] if settle else []
        store.write_task(task_id, record.epoch, TTL, TaskUpdate(completed=True), also=also)
    open_states = [s for s in State if s not in (State.CONFIRMED, State.FAILED)]
    assert [op.key for op in store.list_ops(states=open_states)] == ["open-k"]
    assert [op.key for op in store.list_ops(states=[State.SUBMITTED])] == ["open-k"]
    counts = store.count_ops()
    assert counts[State.SUBMITTED] == 1 and counts[State.CONFIRMED] == 1
    flags = dict(store._reader.execute("SELECT task_id, unsettled FROM tasks").fetchall())
    assert flags == {"open": 1, "settled": 0}


def test_an_update_leaves_identity_columns_and_the_task_index_alone(
    store: SQLiteStore,
) -> None:
    record = store.claim_task("t1", "a", TTL, None)
    assert record is not None
    ops = [store.insert_op(_op(store, f"k{i}"), record.epoch, TTL)[0] for i in range(3)]
    # An update names only the columns that can change, so a caller's copy with another
    # creation time cannot reorder the task (and the index entry is not rewritten).
    moved = ops[0].replace(state=State.CONFIRMED, receipt={"id": 1}, created_at=1.0)
    assert store.update_op(moved, record.epoch, TTL) is not None
    stored = store.get_op("k0")
    assert stored is not None and stored.state is State.CONFIRMED and stored.receipt == {"id": 1}
    assert stored.created_at == ops[0].created_at
    assert [op.key for op in store.list_ops(task_id="t1")] == ["k0", "k1", "k2"]
    assert [op.key for op in store.list_ops(states=[State.SUBMITTED])] == ["k1", "k2"]
    check = store._reader.execute("PRAGMA integrity_check").fetchone()[0]
    assert check == "ok"


def _wal_frames(path: Path) -> int:
    wal = Path(f"{path}-wal")
    return (wal.stat().st_size - 32) // (4096 + 24) if wal.exists() else 0


def _pages_per_write(tmp_path: Path, payload: int = 0) -> tuple[int, int]:
    """Median WAL frames of a lone intent (fenced insert) and of its receipt (fenced
    compare-and-set) over 40 effects of one task, the WAL never checkpointed meanwhile."""
    store = SQLiteStore(tmp_path / "journal.db")
    try:
        store._conn.execute("PRAGMA wal_autocheckpoint = 0")  # the WAL only grows
        record = store.claim_task("t1", "a", TTL, None)
        assert record is not None
        intents, receipts = [], []
        for i in range(40):
            before = _wal_frames(tmp_path / "journal.db")
            op, _ = store.insert_op(_op(store, f"k{i:03d}", args={"x": "a" * payload}),
                                    record.epoch, TTL)  # fmt: skip
            middle = _wal_frames(tmp_path / "journal.db")
            done = op.replace(state=State.CONFIRMED, receipt={"id": f"ch_{i:09d}"})
            assert store.update_op(done, record.epoch, TTL) is not None
            intents.append(middle - before)
            receipts.append(_wal_frames(tmp_path / "journal.db") - middle)
        return sorted(intents)[20], sorted(receipts)[20]
    finally:
        store.close()


def test_an_intent_commit_writes_two_pages_and_a_receipt_one(tmp_path: Path) -> None:
    # The intent writes the row (clustered on its key) and the task index's leaf; the
    # receipt rewrites the row's leaf alone: no index names a column it changes. Rows that
    # do not split their page keep this exact.
    assert _pages_per_write(tmp_path) == (2, 1)


# -- reads and writes ------------------------------------------------------------------------


def test_point_reads_never_wait_for_a_write_and_see_only_commits(store: SQLiteStore) -> None:
    record = store.claim_task("t1", "a", TTL, None)
    assert record is not None
    store.insert_op(_op(store, "k0"), record.epoch, TTL)
    inside, release = threading.Event(), threading.Event()

    def slow_body(conn: sqlite3.Connection) -> None:
        conn.execute("UPDATE operations SET attempts = 99 WHERE key = 'k0'")
        inside.set()
        assert release.wait(10)

    writer = threading.Thread(target=store._commit, args=(slow_body,))
    writer.start()
    try:
        assert inside.wait(10)
        seen = store.get_op("k0")  # the write connection is busy: the reader answers
        assert seen is not None and seen.attempts == 1
        assert store.get_task("t1") is not None
    finally:
        release.set()
        writer.join()
    seen = store.get_op("k0")  # idle again: the write connection answers, after the commit
    assert seen is not None and seen.attempts == 99


def test_a_failing_write_is_rolled_back_and_raises_its_own_error(store: SQLiteStore) -> None:
    record = store.claim_task("t1", "a", TTL, None)
    assert record is not None

    class Boom(Exception):
        pass

    def body() -> Plan[None]:
        yield Q("UPDATE tasks SET next_step = 'x'")
        raise Boom

    commits = store.commits
    with pytest.raises(Boom):
        store._commit(PlanWrite(body()))
    assert store.commits == commits
    task = store.get_task("t1")
    assert task is not None and task.next_step is None
    assert not store._conn.in_transaction
    with pytest.raises(LeaseLost):
        store.insert_op(_op(store, "k0"), record.epoch + 1, TTL)
    assert store.get_op("k0") is None
    assert store.insert_op(_op(store, "k0"), record.epoch, TTL)[1] is True


def test_a_write_blocked_by_another_process_is_a_journal_error(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "journal.db", busy_timeout=0.05)
    other = sqlite3.connect(tmp_path / "journal.db", isolation_level=None)
    try:
        record = store.claim_task("t1", "a", TTL, None)
        assert record is not None
        other.execute("BEGIN IMMEDIATE")
        with pytest.raises(JournalError, match="journal write failed"):
            store.insert_op(_op(store, "k0"), record.epoch, TTL)
        other.execute("ROLLBACK")
        assert not store._conn.in_transaction
        assert store.insert_op(_op(store, "k0"), record.epoch, TTL)[1] is True
    finally:
        other.close()
        store.close()


def test_a_lone_intent_or_receipt_is_one_statement_committed_when_it_returns(
    tmp_path: Path,
) -> None:
    # No BEGIN and COMMIT around the fenced INSERT and the fenced UPDATE: SQLite autocommits
    # each. Another connection sees the write as soon as the call returns (it is committed),
    # and outcomes other than "one row changed" run the whole transaction.
    store = SQLiteStore(tmp_path / "journal.db")
    other = sqlite3.connect(tmp_path / "journal.db", isolation_level=None)
    statements: list[str] = []
    try:
        record = store.claim_task("t1", "a", TTL, None)
        assert record is not None
        store._conn.set_trace_callback(statements.append)
        commits = store.commits
        op, created = store.insert_op(_op(store, "k0"), record.epoch, TTL)
        assert created and op.version == 1
        assert [s.split()[0] for s in statements] == ["INSERT"]
        assert other.execute("SELECT version FROM operations WHERE key = 'k0'").fetchall() == [(1,)]
        statements.clear()
        done = store.update_op(op.replace(state=State.CONFIRMED), record.epoch, TTL)
        assert done is not None and done.version == 2
        assert [s.split()[0] for s in statements] == ["UPDATE"]
        assert other.execute("SELECT state FROM operations WHERE key = 'k0'").fetchall() == [
            ("CONFIRMED",)
        ]
        assert store.commits == commits + 2
        statements.clear()
        existing, created = store.insert_op(_op(store, "k0"), record.epoch, TTL)
        assert not created and existing.state is State.CONFIRMED
        assert statements[0].startswith("INSERT") and "BEGIN IMMEDIATE" in statements
        assert store.update_op(op.replace(state=State.FAILED), record.epoch, TTL) is None
        assert not store._conn.in_transaction
    finally:
        store._conn.set_trace_callback(None)
        other.close()
        store.close()


def test_a_lone_write_waits_for_another_writer_and_checks_the_fence_after_it(
    tmp_path: Path,
) -> None:
    # Another process holds the write lock and takes the task over meanwhile: the
    # autocommitted intent waits for it (the busy timeout, as BEGIN IMMEDIATE would), then
    # sees the new epoch and is refused. Nothing is written under the old lease.
    store = SQLiteStore(tmp_path / "journal.db")
    other = sqlite3.connect(tmp_path / "journal.db", isolation_level=None, check_same_thread=False)
    try:
        record = store.claim_task("t1", "a", TTL, None)
        assert record is not None
        other.execute("BEGIN IMMEDIATE")
        other.execute("UPDATE tasks SET epoch = epoch + 1, owner = 'b' WHERE task_id = 't1'")
        timer = threading.Timer(0.3, other.execute, args=("COMMIT",))
        timer.start()
        try:
            with pytest.raises(LeaseLost):
                store.insert_op(_op(store, "k0"), record.epoch, TTL)
        finally:
            timer.join()
        assert store.get_op("k0") is None
        op, created = store.insert_op(_op(store, "k0"), record.epoch + 1, TTL)
        assert created
        other.execute("BEGIN IMMEDIATE")
        other.execute("UPDATE operations SET version = 7 WHERE key = 'k0'")
        timer = threading.Timer(0.3, other.execute, args=("COMMIT",))
        timer.start()
        try:  # the compare-and-set waits too, then sees the version moved on
            moved = store.update_op(op.replace(state=State.CONFIRMED), record.epoch + 1, TTL)
            assert moved is None
        finally:
            timer.join()
        stored = store.get_op("k0")
        assert stored is not None and stored.version == 7 and stored.state is State.SUBMITTED
    finally:
        other.close()
        store.close()


def test_concurrent_writers_each_get_their_own_outcome(store: SQLiteStore) -> None:
    # Lone writers commit directly, contended ones share batches; either way every caller
    # gets its own result or error, and only after a commit that holds its write.
    n_threads, per_thread = 8, 40
    epochs = {}
    for t in range(n_threads):
        record = store.claim_task(f"t{t}", "a", TTL, None)
        assert record is not None
        epochs[t] = record.epoch
    errors: list[BaseException] = []
    refused: list[int] = []

    def work(t: int) -> None:
        try:
            for i in range(per_thread):
                epoch = epochs[t] + (1 if i % 10 == 9 else 0)  # every tenth write is stale
                try:
                    op, created = store.insert_op(_op(store, f"k{t}-{i}", f"t{t}"), epoch, TTL)
                except LeaseLost:
                    refused.append(t)
                    continue
                assert created
                done = op.replace(state=State.CONFIRMED, receipt={"t": t, "i": i})
                assert store.update_op(done, epochs[t], TTL) is not None
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(n_threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert len(refused) == n_threads * per_thread // 10
    counts = store.count_ops()
    assert counts[State.CONFIRMED] == n_threads * per_thread * 9 // 10
    assert counts[State.SUBMITTED] == 0
    for t in range(n_threads):
        ops = store.list_ops(task_id=f"t{t}")
        assert [op.key for op in ops] == [f"k{t}-{i}" for i in range(per_thread) if i % 10 != 9]
        assert all(op.receipt == {"t": t, "i": int(op.key.split("-")[1])} for op in ops)


def test_a_journal_used_by_threads_and_a_second_process_style_connection(
    tmp_path: Path,
) -> None:
    # Two store objects on one file (as two processes would be): point reads on an idle
    # write connection still see the other's commits.
    a = SQLiteStore(tmp_path / "journal.db")
    b = SQLiteStore(tmp_path / "journal.db")
    try:
        record = a.claim_task("t1", "a", TTL, None)
        assert record is not None
        assert b.get_op("k0") is None
        a.insert_op(_op(a, "k0"), record.epoch, TTL)
        seen = b.get_op("k0")
        assert seen is not None and seen.version == 1
        stored = b.update_op(seen.replace(state=State.CONFIRMED), record.epoch, TTL)
        assert stored is not None and stored.version == 2
        again = a.get_op("k0")
        assert again is not None and again.state is State.CONFIRMED and again.version == 2
    finally:
        a.close()
        b.close()


# -- per-effect helpers ----------------------------------------------------------------------


def test_op_values_are_op_to_row_in_column_order(store: SQLiteStore) -> None:
    ops = [
        _op(store, "k0"),
        _op(
            store,
            "k1",
            state=State.FAILED,
            receipt={"id": "ch_1", "ok": True, "ü": [1, None]},
            error={"message": "no", "type": "Rejected"},
            args={"amount": 5},
            note="operator",
            policy=Policy(),
            submitted_at=None,
            submitted_by=None,
        ),
        _op(store, "k2", receipt=0, error="", args=[]),
    ]
    for op in ops:
        for version in (1, 7):
            row = op_to_row(op, version)
            assert op_values(op, version) == tuple(row[c] for c in OP_COLUMNS)


def test_operation_replace() -> None:
    op = Operation(
        key="k",
        task_id="t",
        effect="e",
        fingerprint="f",
        state=State.SUBMITTED,
        policy=Policy(),
        created_at=1.0,
        updated_at=1.0,
    )
    new = op.replace(version=3, receipt={"a": 1}, state=State.CONFIRMED)
    assert op.version == 0 and op.receipt is None and op.state is State.SUBMITTED
    assert new == Operation(
        key="k",
        task_id="t",
        effect="e",
        fingerprint="f",
        state=State.CONFIRMED,
        policy=Policy(),
        created_at=1.0,
        updated_at=1.0,
        version=3,
        receipt={"a": 1},
    )
    assert pickle.loads(pickle.dumps(new)) == new
    with pytest.raises(TypeError, match="bogus"):
        op.replace(bogus=1)
    with pytest.raises(AttributeError):
        new.version = 4  # type: ignore[misc]


def test_keys_and_fingerprints_never_change() -> None:
    # Keys are sent to services as idempotency keys and stored in journals: a new version
    # of intentlog must derive exactly the same ones.
    canonical = canonical_json(
        {"amount": 500, "to": "zoë", "items": [1, 2.5, None, True], "meta": {"b": 1, "a": "\u2028"}}
    )
    assert canonical == (
        '{"amount":500,"items":[1,2.5,null,true],"meta":{"a":"\u2028","b":1},"to":"zoë"}'
    )
    assert fingerprint(canonical) == (
        "b7e2b2bce99849b835743d0b97218f43e9e4cad5e9fad58c6b7a758e46f2212e"
    )
    assert derive_key("order-42", "Charge Card!", canonical) == (
        "charge-card-a4d096b12fcd84b46f260ab95d934c27"
    )
    assert derive_key("t", "***", "{}") == "op-84058a222c5a0ed9cef39449a88989a2"
    with pytest.raises(intentlog.InvalidInput):
        canonical_json({"x": float("nan")})


SECRET_VALUES = [
    "Bearer abcdefgh1234",
    "  token abcdefgh",
    "BASIC QWxhZGRpbjpvcGVu",
    "-----BEGIN RSA PRIVATE KEY-----\nabc",
    "text before -----BEGIN PRIVATE KEY----- after",
    "eyJhbGciOiJI.eyJzdWIiOiIx.sig",
    "sk_live_abcdefgh1",
    "rk_test_12345678",
    "ghp_" + "a" * 16,
    "github_pat_" + "b" * 20,
    "xoxb-1234567890",
    "AKIA" + "A" * 16,
    "postgres://user:pw@host/db",
]
PLAIN_VALUES = [
    "",
    "ch_1",
    "bearer",
    "token abc",
    "a token abcdefghijk",  # not at the start
    "eyJ.a.b",
    "sk_live_abc",
    "AKIA" + "A" * 15,
    "https://host/path",
    "BEGIN PRIVATE KEY",
    "hello world " * 30,
]


@pytest.mark.parametrize("value", SECRET_VALUES + PLAIN_VALUES)
def test_secret_values_are_found_as_by_each_pattern(value: str) -> None:
    assert _secret_value(value) is (value in SECRET_VALUES)


@pytest.mark.parametrize(
    "value",
    [
        {"id": "ch_1", "ok": True},
        {"id": "ch_1", "api_key": "x"},
        {"id": "ch_1", "api_key": None, "password": ""},
        {"a": [{"b": ["sk_live_abcdefgh1"]}]},
        [1, 2.5, None, {"nested": {"accessToken": 0}}],
        ("tuple", {"Authorization": "Basic abc"}),
        {"max_tokens": 5, "signature_required": True},
        "Bearer abcdefgh1234",
        42,
    ],
)
def test_the_quick_secret_check_agrees_with_the_full_scan(value: Any) -> None:
    assert _holds_secret(value) is bool(_find_secrets(value, "receipt"))


def test_clean_receipt_fast_path_and_reductions() -> None:
    plain = {"id": "ch_1", "ok": True, "name": "zoë"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert clean_receipt(plain, effect="e", max_bytes=100) == (
            plain,
            '{"id":"ch_1","ok":true,"name":"zoë"}',
        )
    with pytest.warns(ReceiptWarning, match="receipt.token"):
        stored, text = clean_receipt({"token": "abc"}, effect="e", max_bytes=100)
    assert stored == {"token": "[redacted by intentlog]"} and "abc" not in text
    # Counted in UTF-8 bytes: 30 two-byte characters are 60 bytes, over a 50-byte limit.
    with pytest.warns(ReceiptWarning, match="too large|bytes as JSON"):
        stored, _ = clean_receipt("é" * 30, effect="e", max_bytes=50)
    assert stored["intentlog_note"] == "receipt was too large and was not stored"
    with pytest.warns(ReceiptWarning, match="not JSON"):
        stored, _ = clean_receipt({"x": "\ud800"}, effect="e", max_bytes=100)
    assert stored["intentlog_note"] == "receipt was not JSON data and was not stored"
    with pytest.raises(intentlog.UnsafeValue, match=r"state\.user\.password"):
        check_safe({"user": {"password": "x"}}, what="state", max_bytes=100)
    assert check_safe({"user": {"password": ""}}, what="state", max_bytes=100)


def test_effect_policy_follows_later_changes() -> None:
    charge = intentlog.Effect(
        "charge", lambda key, amount: {"id": key}, idempotent=True, key_retention=intentlog.FOREVER
    )
    first = charge.policy
    assert first is charge.policy  # cached while nothing changes
    assert not first.can_reconcile

    @charge.reconciler
    def lookup(key: str) -> intentlog.NotFound:
        return intentlog.NotFound()

    assert charge.policy.can_reconcile and charge.policy is not first
    charge.timeout = 5.0
    assert charge.policy.timeout == 5.0


def test_operation_init_takes_exactly_its_fields() -> None:
    # Operation's __init__ is written out (for speed): it must stay the dataclass's own.
    params = list(inspect.signature(Operation.__init__).parameters.values())[1:]
    fields = dataclasses.fields(Operation)
    assert [p.name for p in params] == [f.name for f in fields]
    for param, field in zip(params, fields, strict=True):
        expected = (
            inspect.Parameter.empty if field.default is dataclasses.MISSING else field.default
        )
        assert param.default == expected, field.name
    op = Operation("k", "t", "e", "f", State.PLANNED, Policy(), 1.0, 2.0, 3)
    assert (op.key, op.created_at, op.updated_at, op.version, op.note) == ("k", 1.0, 2.0, 3, None)
    assert vars(op) == {f.name: getattr(op, f.name) for f in fields}
    # replace()'s keywords are the fields too, each optional.
    assert list(OperationChanges.__annotations__) == [f.name for f in fields]
    assert OperationChanges.__optional_keys__ == {f.name for f in fields}


def test_a_version_6_journal_keeps_every_row_and_lists_the_same_open_operations(
    tmp_path: Path,
) -> None:
    # Migration 7 rebuilds operations (clustered on the key) and marks the completed tasks
    # that still hold open operations: every row comes through unchanged, and pending() reads
    # the same operations as the old index on state did, a completed task's included.
    from intentlog.stores import sqlite as sqlite_store

    path = tmp_path / "v6.db"
    conn = sqlite3.connect(path, isolation_level=None)
    for script in sqlite_store._MIGRATIONS[:6]:
        for statement in script.split(";"):
            if statement.strip():
                conn.execute(statement)
    conn.execute(f"PRAGMA application_id = {sqlite_store.APPLICATION_ID}")
    conn.execute("PRAGMA user_version = 6")
    rows = []
    for task_id, completed, state in (
        ("live", 0, State.SUBMITTED),
        ("live", 0, State.CONFIRMED),
        ("done", 1, State.CONFIRMED),
        ("done-open", 1, State.UNRESOLVED),
        ("done-open", 1, State.SUBMITTED),
    ):
        conn.execute(
            "INSERT OR IGNORE INTO tasks (task_id, epoch, lease_expires, state, completed,"
            " created_at, updated_at) VALUES (?, 1, 0, 'null', ?, 1, 1)",
            (task_id, completed),
        )
        op = Operation(
            key=f"{task_id}-{len(rows)}", task_id=task_id, effect="charge", fingerprint="f" * 64,
            state=state, policy=Policy(idempotent=True, key_retention=60.0, timeout=5.0),
            created_at=10.0 + len(rows), updated_at=11.0, args={"i": len(rows)},
            receipt={"id": 1} if state is State.CONFIRMED else None,
        )  # fmt: skip
        # Version 6 had every column but the approval (migration 8), which comes back NULL.
        values = op_values(op, 3)[:-1]
        conn.execute(
            f"INSERT INTO operations ({', '.join(OP_COLUMNS[:-1])})"
            f" VALUES ({', '.join('?' for _ in OP_COLUMNS[:-1])})",
            values,
        )
        rows.append((*values, None))
    conn.close()
    store = SQLiteStore(path)
    try:
        stored = store._reader.execute(
            f"SELECT {', '.join(OP_COLUMNS)} FROM operations ORDER BY created_at"
        ).fetchall()
        assert [tuple(r) for r in stored] == rows
        open_states = [s for s in State if s not in (State.CONFIRMED, State.FAILED)]
        assert [op.key for op in store.list_ops(states=open_states)] == [
            "live-0", "done-open-3", "done-open-4",
        ]  # fmt: skip
        assert store.count_ops()[State.CONFIRMED] == 2
        assert store._reader.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        version = store._reader.execute("PRAGMA user_version").fetchone()[0]
        assert version == sqlite_store.SCHEMA_VERSION == 8
    finally:
        store.close()


def test_a_task_whose_range_of_ids_is_full_is_refused_clearly(store: SQLiteStore) -> None:
    # A task's operations take ids seq << 24 on: the 2**24-th is refused, nothing written,
    # and the next task's range is never entered.
    from intentlog.stores.sqlite import OPS_PER_TASK

    first = store.claim_task("t1", "a", TTL, None)
    second = store.claim_task("t2", "a", TTL, None)
    assert first is not None and second is not None
    seq = store._conn.execute("SELECT seq FROM tasks WHERE task_id = 't1'").fetchone()[0]
    last = (seq << 24) + OPS_PER_TASK - 1
    row = op_values(_op(store, "last"), 1)
    store._conn.execute(
        f"INSERT INTO operations (id, placed, {', '.join(OP_COLUMNS)})"
        f" VALUES (?, 1, {', '.join('?' for _ in OP_COLUMNS)})",
        (last, *row),
    )
    with pytest.raises(JournalError, match="already holds 16,777,216 operations"):
        store.insert_op(_op(store, "one-more"), first.epoch, TTL)
    assert store.get_op("one-more") is None
    store.insert_op(_op(store, "theirs", task_id="t2"), second.epoch, TTL)
    assert [op.key for op in store.list_ops(task_id="t2")] == ["theirs"]
    assert [op.key for op in store.list_ops(task_id="t1")] == ["last"]


def test_an_older_workers_insert_into_a_migrated_journal_fails_before_anything_is_sent(
    store: SQLiteStore,
) -> None:
    # A worker of schema 6, still running when its journal is migrated, inserts without an id
    # (SQLite would place the row outside its task's range): its statement, verbatim, is
    # refused, and nothing is written.
    record = store.claim_task("t1", "a", TTL, None)
    assert record is not None
    older = (
        f"INSERT INTO operations ({', '.join(OP_COLUMNS)})"
        f" SELECT {', '.join('?' for _ in OP_COLUMNS)} WHERE TRUE"
        " AND EXISTS (SELECT 1 FROM tasks WHERE task_id = ? AND epoch = ?)"
        " ON CONFLICT (key) DO NOTHING"
    )
    values = (*op_values(_op(store, "old"), 1), "t1", record.epoch)
    with pytest.raises(
        sqlite3.IntegrityError, match=r"NOT NULL constraint failed: operations\.placed"
    ):
        store._conn.execute(older, values)
    assert store.get_op("old") is None
    assert store.insert_op(_op(store, "new"), record.epoch, TTL)[1] is True


def test_an_operation_knows_which_fields_may_differ_from_its_stored_row() -> None:
    built = Operation("k", "t", "e", "f", State.SUBMITTED, Policy(), 1.0, 1.0, 1)
    assert built.changed is None  # by hand: nothing is known, so everything may differ
    assert built.replace(note="x").changed is None  # and it stays unknown
    stored = built.as_stored(2)
    assert (
        stored.changed == frozenset() and stored.version == 2 and stored == built.replace(version=2)
    )
    done = stored.replace(state=State.CONFIRMED, receipt={"id": 1}).replace(updated_at=3.0)
    assert done.changed == {"state", "receipt", "updated_at"}
    assert stored.changed == frozenset()  # replace never changes the original
    assert done.replace(version=7).changed is None  # another version's row: unknown
    assert done == Operation(
        "k", "t", "e", "f", State.CONFIRMED, Policy(), 1.0, 3.0, 2, receipt={"id": 1}
    )  # equality is the fields' alone


def test_a_receipt_write_names_only_what_it_changes(tmp_path: Path) -> None:
    # A confirmation rewrites the row but binds only its state, version, time and receipt:
    # binding the other 16 columns was most of a receipt write's CPU in SQLite.
    with intentlog.open(tmp_path / "j.db") as journal:
        store = journal.store
        store.claim_task("t1", "a", TTL, None)
        stored, _ = store.insert_op(make_op(store), 1, TTL)
        seen: list[str] = []
        store._conn.set_trace_callback(seen.append)
        try:
            done = stored.replace(state=State.CONFIRMED, updated_at=store.now(), receipt={"id": 1})
            assert store.update_op(done, 1, TTL) == done.replace(version=2)
        finally:
            store._conn.set_trace_callback(None)
        (update,) = [s for s in seen if s.startswith("UPDATE operations")]
        assigned = update.split(" SET ", 1)[1].split(" WHERE ", 1)[0]
        assert [a.split(" = ")[0] for a in assigned.split(", ")] == [
            "state", "version", "updated_at", "receipt"
        ]  # fmt: skip


class _InterruptedAt:
    """A connection that raises KeyboardInterrupt once, as the signal would, when ``sql``
    is about to run (the leader of a group commit interrupted at that statement)."""

    def __init__(self, conn: sqlite3.Connection, sql: str) -> None:
        self._conn, self._sql = conn, sql

    @property
    def in_transaction(self) -> bool:
        return self._conn.in_transaction

    def execute(self, sql: str, params: Any = ()) -> sqlite3.Cursor:
        if sql == self._sql:
            self._sql = ""
            raise KeyboardInterrupt
        return self._conn.execute(sql, params)


def test_a_batch_interrupted_before_its_commit_tells_no_writer_it_is_durable(
    tmp_path: Path,
) -> None:
    from intentlog.stores._group_commit import GroupCommit, WriteRequest

    conn = sqlite3.connect(tmp_path / "t.db", isolation_level=None, check_same_thread=False)
    conn.execute("CREATE TABLE t (x INTEGER)")

    def insert(x: int) -> Plan[None]:
        yield Q("INSERT INTO t VALUES (?)", (x,))

    writer = GroupCommit(_InterruptedAt(conn, "COMMIT"))  # type: ignore[arg-type]
    batch = [WriteRequest(PlanWrite(insert(1))), WriteRequest(PlanWrite(insert(2)))]
    with pytest.raises(KeyboardInterrupt):
        writer.run_batch(batch)
    assert all(r.done and isinstance(r.error, JournalError) for r in batch)
    assert "interrupted" in str(batch[1].error)
    assert not conn.in_transaction
    assert conn.execute("SELECT count(*) FROM t").fetchone()[0] == 0  # rolled back
    assert writer.commits == 0
