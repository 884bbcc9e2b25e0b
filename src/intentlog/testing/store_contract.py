"""The store contract as a test suite, for every backend: intentlog's own and yours.

A backend's authors run it from a test module of theirs::

    import pytest
    from intentlog.testing.store_contract import StoreContract

    class TestMyStore(StoreContract):
        @pytest.fixture
        def open_store(self, tmp_path):
            opened = []

            def open_one():
                opened.append(MyStore(tmp_path / "journal"))  # the same journal each call
                return opened[-1]

            yield open_one
            for store in opened:
                store.close()

An asyncio store is wrapped in :class:`BlockingStore` by ``open_one``: the suite is written
once, against the blocking calling convention, and runs the awaited primitives on an event
loop of its own. :func:`contract_failures` runs the same tests without pytest's collection
(to show that the suite catches a broken backend, say).
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import intentlog
from intentlog import Operation, Policy, State
from intentlog.stores import AsyncStore, Resolution, Store, TaskResolution, TaskUpdate

__all__ = [
    "TTL",
    "BlockingStore",
    "StoreContract",
    "contract_failures",
    "in_threads",
    "make_op",
]

TTL = 30.0


def make_op(store: Store, key: str = "k1", task_id: str = "t1", **changes: Any) -> Operation:
    now = store.now()
    op = Operation(
        key=key,
        task_id=task_id,
        effect="charge",
        fingerprint="f" * 64,
        state=State.SUBMITTED,
        policy=Policy(can_reconcile=True, timeout=5.0),
        created_at=now,
        updated_at=now,
        attempts=1,
        submitted_at=now,
        first_submitted_at=now,
        submitted_by="host:1:2:abcd",
        receipt={"nested": [1, "two", None]},
    )
    return op.replace(**changes)


def in_threads(target: Callable[..., object], calls: list[tuple[Any, ...]]) -> None:
    """Call ``target`` with each of ``calls``' arguments, each in a thread of its own, all
    started before any is waited for; return when all have."""
    threads = [threading.Thread(target=target, args=args) for args in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


class BlockingStore:
    """An :class:`AsyncStore` driven from blocking code: every primitive runs on an event
    loop of its own in a background thread, so the synchronous suite tests the async store.
    ``close`` closes the store (``aclose``) and stops the loop."""

    def __init__(self, store: AsyncStore) -> None:
        self._store = store
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if not inspect.iscoroutinefunction(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            done = asyncio.run_coroutine_threadsafe(attr(*args, **kwargs), self._loop)
            return done.result(timeout=60)

        return call

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._store.aclose(), self._loop).result(timeout=60)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


class StoreContract:
    """The contract's tests, for a backend's own test module to run: subclass this in a class
    named ``Test...`` and give it an ``open_store`` fixture that returns a function opening a
    new store object (its own connections) on one fresh, empty journal per test; close what it
    opened at teardown. ``store`` (one store from it) is provided here. An asyncio store runs
    through :class:`BlockingStore`."""

    @pytest.fixture
    def store(self, open_store: Callable[[], Store]) -> Store:
        return open_store()

    def test_claim_creates_then_compare_and_set_on_epoch(self, store: Store) -> None:
        first = store.claim_task("t1", "a", TTL, None)
        assert first is not None and first.epoch == 1 and first.owner == "a"
        assert store.claim_task("t1", "b", TTL, None) is None  # already exists
        assert store.claim_task("t1", "b", TTL, 7) is None  # wrong epoch
        second = store.claim_task("t1", "b", TTL, 1)
        assert second is not None and second.epoch == 2 and second.owner == "b"
        assert store.claim_task("t1", "c", TTL, 1) is None  # the loser of a race
        assert second.lease_expires == pytest.approx(store.now() + TTL, abs=2)

    def test_concurrent_claims_have_exactly_one_winner(self, store: Store) -> None:
        store.claim_task("t1", "seed", TTL, None)
        wins: list[str] = []

        def claim(name: str) -> None:
            if store.claim_task("t1", name, TTL, 1) is not None:
                wins.append(name)

        in_threads(claim, [(f"w{i}",) for i in range(8)])
        assert len(wins) == 1

    def test_fenced_task_write_refuses_a_stale_epoch(self, store: Store) -> None:
        store.claim_task("t1", "a", TTL, None)
        store.claim_task("t1", "b", TTL, 1)
        with pytest.raises(intentlog.LeaseLost) as info:
            store.write_task("t1", 1, TTL, TaskUpdate(next_step="x"))
        assert info.value.task_id == "t1"
        record = store.get_task("t1")
        assert record is not None and record.next_step is None  # nothing changed
        updated = store.write_task("t1", 2, TTL, TaskUpdate(next_step="x", state_json='{"a":1}'))
        assert updated.next_step == "x" and updated.state == {"a": 1}
        released = store.write_task("t1", 2, TTL, TaskUpdate(release=True))
        assert released.owner is None and released.lease_expires == 0

    def test_insert_op_is_insert_if_absent_and_fenced(self, store: Store) -> None:
        store.claim_task("t1", "a", TTL, None)
        op = make_op(store)
        stored, created = store.insert_op(op, 1, TTL)
        assert created and stored.version == 1 and stored.receipt == op.receipt
        again, created = store.insert_op(make_op(store, fingerprint="0" * 64), 1, TTL)
        assert not created and again.fingerprint == "f" * 64  # the first claim stands
        with pytest.raises(intentlog.LeaseLost):
            store.insert_op(make_op(store, key="k2"), 99, TTL)
        assert store.get_op("k2") is None

    def test_update_op_is_compare_and_set_on_version(self, store: Store) -> None:
        store.claim_task("t1", "a", TTL, None)
        stored, _ = store.insert_op(make_op(store), 1, TTL)
        confirmed = store.update_op(
            stored.replace(state=State.CONFIRMED, receipt={"id": 1}), 1, TTL
        )
        assert confirmed is not None and confirmed.version == 2
        stale = store.update_op(stored.replace(state=State.UNRESOLVED), 1, TTL)
        assert stale is None  # version moved on: nothing written
        current = store.get_op("k1")
        assert current is not None and current.state is State.CONFIRMED
        assert current.receipt == {"id": 1}

    def test_update_op_stores_the_whole_operation_given(self, store: Store) -> None:
        # A store may write only the fields an operation's ``changed`` names (the row at its
        # version holds the rest); whatever it writes, what it reads back is the whole
        # operation: after a chain of writes, and for one built by hand (``changed`` None).
        store.claim_task("t1", "a", TTL, None)
        stored, _ = store.insert_op(make_op(store), 1, TTL)
        resent = stored.replace(
            attempts=2, submitted_by="host:9:9:beef", lookup_failures=3, note="resent",
            policy=Policy(can_reconcile=True, timeout=9.0, service="acme"),
        )  # fmt: skip
        after_resend = store.update_op(resent, 1, TTL)
        assert after_resend is not None and store.get_op("k1") == resent.replace(version=2)
        done = after_resend.replace(state=State.CONFIRMED, receipt={"id": 7}, error=None)
        after_done = store.update_op(done, 1, TTL)
        assert after_done is not None and store.get_op("k1") == done.replace(version=3)
        fields = {f.name: getattr(after_done, f.name) for f in dataclasses.fields(Operation)}
        by_hand = Operation(**{**fields, "state": State.FAILED, "receipt": None, "attempts": 5,
                               "error": {"why": "x"}, "note": None, "lookup_failures": 0,
                               "policy": Policy(idempotent=True, key_retention=60.0)})  # fmt: skip
        assert by_hand.changed is None
        assert store.update_op(by_hand, 1, TTL) is not None
        assert store.get_op("k1") == by_hand.replace(version=4)

    def test_fenced_update_op_refuses_a_stale_epoch(self, store: Store) -> None:
        store.claim_task("t1", "a", TTL, None)
        stored, _ = store.insert_op(make_op(store), 1, TTL)
        store.claim_task("t1", "b", TTL, 1)
        with pytest.raises(intentlog.LeaseLost):
            store.update_op(stored.replace(state=State.CONFIRMED), 1, TTL)
        current = store.get_op("k1")
        assert current is not None and current.state is State.SUBMITTED

    def test_operator_update_writes_its_audit_record_atomically(self, store: Store) -> None:
        store.claim_task("t1", "a", TTL, None)
        stored, _ = store.insert_op(make_op(store), 1, TTL)
        audit = Resolution("k1", "t1", store.now(), State.SUBMITTED, State.FAILED, "no", None, "me")
        assert store.update_op(stored.replace(state=State.FAILED), None, TTL, audit) is not None
        assert [r.to_state for r in store.resolutions("k1")] == [State.FAILED]
        # a lost compare-and-set (another decision, at another time) writes no audit record
        later = dataclasses.replace(audit, at=audit.at + 1, to_state=State.CONFIRMED)
        assert store.update_op(stored.replace(state=State.CONFIRMED), None, TTL, later) is None
        assert len(store.resolutions()) == 1

    def test_listing_and_counting(self, store: Store) -> None:
        store.claim_task("t1", "a", TTL, None)
        store.claim_task("t2", "a", TTL, None)
        store.insert_op(make_op(store, "k1", "t1"), 1, TTL)
        store.insert_op(make_op(store, "k2", "t2", state=State.UNRESOLVED), 1, TTL)
        store.insert_op(make_op(store, "k3", "t2", state=State.CONFIRMED), 1, TTL)
        assert [o.key for o in store.list_ops(task_id="t2")] == ["k2", "k3"]
        assert [o.key for o in store.list_ops(states=[State.SUBMITTED, State.UNRESOLVED])] == [
            "k1",
            "k2",
        ]
        counts = store.count_ops()
        assert counts[State.SUBMITTED] == 1 and counts[State.CONFIRMED] == 1
        assert counts[State.PLANNED] == 0
        assert [t.task_id for t in store.list_tasks()] == ["t1", "t2"]

    def test_counts_follow_every_state_and_every_change(self, store: Store) -> None:
        store.claim_task("t1", "a", TTL, None)
        wanted = [State.PLANNED] * 2 + [State.SUBMITTED] * 3 + [State.CONFIRMED] * 4
        wanted += [State.FAILED] * 2 + [State.UNRESOLVED]
        ops = [
            store.insert_op(make_op(store, f"k{i}", state=s), 1, TTL)[0]
            for i, s in enumerate(wanted)
        ]
        expected = {state: wanted.count(state) for state in State}
        assert store.count_ops() == expected
        for op, to in ((ops[2], State.FAILED), (ops[3], State.CONFIRMED), (ops[9], State.PLANNED)):
            assert store.update_op(op.replace(state=to), 1, TTL) is not None
            expected[op.state] -= 1
            expected[to] += 1
            assert store.count_ops() == expected
        assert sum(store.count_ops().values()) == len(wanted)

    def test_delete_completed_keeps_anything_unsettled(self, store: Store) -> None:
        for task_id, state in (("done", State.CONFIRMED), ("open", State.UNRESOLVED)):
            store.claim_task(task_id, "a", TTL, None)
            store.insert_op(make_op(store, f"k-{task_id}", task_id, state=state), 1, TTL)
            store.write_task(task_id, 1, TTL, TaskUpdate(completed=True))
        store.claim_task("running", "a", TTL, None)
        removed = store.delete_completed(store.now() + 1)
        assert removed == 1
        assert store.get_task("done") is None and store.get_op("k-done") is None
        assert store.get_task("open") is not None and store.get_op("k-open") is not None
        assert store.get_task("running") is not None

    def test_fenced_writes_carry_other_operations_of_the_task(self, store: Store) -> None:
        store.claim_task("t1", "a", TTL, None)
        k1, _ = store.insert_op(make_op(store, "k1"), 1, TTL)
        confirmed = k1.replace(state=State.CONFIRMED, receipt={"id": "r1"})
        store.insert_op(make_op(store, "k2"), 1, TTL, also=[confirmed])
        first = store.get_op("k1")
        assert first is not None
        assert first.state is State.CONFIRMED  # rode along with the insert
        stale = k1.replace(state=State.UNRESOLVED)  # version 1 moved on: skipped
        store.write_task("t1", 1, TTL, TaskUpdate(next_step="n"), also=[stale])
        again = store.get_op("k1")
        assert again is not None
        assert again.receipt == {"id": "r1"}
        store.claim_task("t1", "b", TTL, 1)  # taken over: nothing of a stale write lands
        k2 = store.get_op("k2")
        assert k2 is not None
        with pytest.raises(intentlog.LeaseLost):
            store.write_task("t1", 1, TTL, TaskUpdate(), also=[k2.replace(state=State.FAILED)])
        with pytest.raises(intentlog.LeaseLost):
            store.insert_op(make_op(store, "k3"), 1, TTL, also=[k2.replace(state=State.FAILED)])
        after = store.get_op("k2")
        assert after is not None
        assert after.state is State.SUBMITTED
        assert store.get_op("k3") is None

    def test_claim_next_claims_only_the_kinds_asked_for(self, store: Store) -> None:
        for task_id, kind in (("a-1", "a"), ("b-1", "b"), ("a-2", "a")):
            assert store.create_task(task_id, kind, '{"n": 1}') is not None
        untouched = store.get_task("b-1")
        assert untouched is not None
        claimed = [store.claim_next("w1", TTL, ["a"]) for _ in range(2)]
        assert {c.task_id for c in claimed if c is not None} == {"a-1", "a-2"}
        for record in claimed:
            assert record is not None
            assert (record.kind, record.owner, record.epoch) == ("a", "w1", 1)
            assert record.lease_expires == pytest.approx(store.now() + TTL, abs=2)
        assert store.claim_next("w1", TTL, ["a"]) is None  # b-1 is runnable, but not an "a"
        assert store.claim_next("w1", TTL, []) is None  # no kinds: nothing to claim
        assert store.get_task("b-1") == untouched  # not claimed, not released, not touched
        other = store.claim_next("w2", TTL, ["c", "b"])
        assert other is not None and (other.task_id, other.owner, other.epoch) == ("b-1", "w2", 1)

    def test_concurrent_claim_next_hands_each_task_to_exactly_one_claimer(
        self, store: Store
    ) -> None:
        wanted = {f"a-{i}" for i in range(30)} | {f"c-{i}" for i in range(10)}
        for task_id in sorted(wanted):
            store.create_task(task_id, task_id[0], "null")
        for i in range(10):
            store.create_task(f"b-{i}", "b", "null")  # runnable, but no claimer runs "b"
        claims: list[tuple[str, str]] = []
        errors: list[BaseException] = []
        start = threading.Barrier(8)

        def claimer(name: str) -> None:
            try:
                start.wait()
                while (record := store.claim_next(name, TTL, ["a", "c"])) is not None:
                    claims.append((record.task_id, name))
            except BaseException as exc:  # reported below: a thread's failure must fail the test
                errors.append(exc)

        in_threads(claimer, [(f"w{i}",) for i in range(8)])
        assert errors == []
        assert sorted(task_id for task_id, _ in claims) == sorted(wanted)  # each exactly once
        for task_id, name in claims:
            record = store.get_task(task_id)
            assert record is not None and (record.owner, record.epoch) == (name, 1)
        for i in range(10):
            record = store.get_task(f"b-{i}")
            assert record is not None and (record.owner, record.epoch) == (None, 0)

    def test_create_task_is_insert_if_absent_unleased_at_epoch_zero(self, store: Store) -> None:
        created = store.create_task("t1", "pay", '{"amount": 5}')
        assert created is not None
        assert (created.task_id, created.kind, created.input) == ("t1", "pay", {"amount": 5})
        assert (created.epoch, created.owner, created.completed) == (0, None, False)
        assert created.lease_expires <= store.now()  # unleased: claimable at once
        assert (created.runs, created.last_error, created.next_step) == (0, None, None)
        assert store.get_task("t1") == created
        # An existing id: None, and nothing changes (not its kind, input, epoch or lease).
        assert store.create_task("t1", "refund", '{"amount": 6}') is None
        assert store.get_task("t1") == created
        # Nor does it take over a task leased through claim_task (journal.task()), which has no
        # kind: no worker may claim it.
        leased = store.claim_task("t2", "me", TTL, None)
        assert leased is not None
        assert store.create_task("t2", "pay", "null") is None
        assert store.get_task("t2") == leased
        assert store.claim_next("w", TTL, ["pay"]) is not None  # t1
        assert store.claim_next("w", TTL, ["pay"]) is None  # never t2
        assert store.get_task("t2") == leased

    def test_claim_next_waits_for_not_before_and_takes_the_task_due_first(
        self, store: Store
    ) -> None:
        for task_id in ("x", "y"):
            store.create_task(task_id, "k", "null")
        first = store.claim_next("w1", TTL, ["k"])
        assert first is not None and first.task_id == "x"  # created first, due first
        # The run fails: the worker releases the task with a backoff, as Worker does.
        later = store.now() + 0.5
        failed = TaskUpdate(failed="ValueError: boom", not_before=later, release=True)
        store.write_task("x", first.epoch, TTL, failed)
        second = store.claim_next("w2", TTL, ["k"])
        assert second is not None and second.task_id == "y"  # x is backing off
        assert store.claim_next("w2", TTL, ["k"]) is None
        while store.now() < later:
            time.sleep(0.05)
        again = store.claim_next("w2", TTL, ["k"])
        assert again is not None and again.task_id == "x"
        assert (again.epoch, again.owner, again.runs, again.last_error) == (
            2,
            "w2",
            1,
            "ValueError: boom",
        )

    def test_claim_next_takes_over_an_expired_lease_and_fences_the_old_holder(
        self, store: Store
    ) -> None:
        store.create_task("t1", "k", "null")
        held = store.claim_next("w1", TTL, ["k"])
        assert held is not None and held.epoch == 1
        assert store.claim_next("w2", TTL, ["k"]) is None  # a live lease is never taken
        # The holder stops renewing: a fenced write with ttl 0 leaves the lease expiring now.
        store.write_task("t1", 1, 0.0, TaskUpdate())
        time.sleep(0.01)
        taken = store.claim_next("w2", TTL, ["k"])
        assert taken is not None and (taken.epoch, taken.owner) == (2, "w2")
        with pytest.raises(intentlog.LeaseLost):  # the old holder's next write changes nothing
            store.write_task("t1", 1, TTL, TaskUpdate(next_step="late"))
        record = store.get_task("t1")
        assert record is not None and record.next_step is None and record.owner == "w2"

    def test_claim_next_parks_a_task_with_an_unresolved_operation(self, store: Store) -> None:
        for task_id in ("parked", "submitted", "done"):
            store.create_task(task_id, "k", "null")
            record = store.claim_next("w1", TTL, ["k"])
            assert record is not None and record.task_id == task_id
        unresolved, _ = store.insert_op(
            make_op(store, "k1", "parked", state=State.UNRESOLVED), 1, TTL
        )
        store.insert_op(make_op(store, "k2", "submitted"), 1, TTL)  # open, but no person needed
        store.write_task("done", 1, TTL, TaskUpdate(completed=True, release=True))
        for task_id in ("parked", "submitted"):
            store.write_task(task_id, 1, TTL, TaskUpdate(release=True))
        claimed = store.claim_next("w2", TTL, ["k"])
        assert claimed is not None and claimed.task_id == "submitted"
        assert store.claim_next("w2", TTL, ["k"]) is None  # parked, and complete
        # A person resolves it (an operator's write, not fenced): the task is runnable again.
        assert store.update_op(unresolved.replace(state=State.PLANNED), None, TTL) is not None
        resumed = store.claim_next("w2", TTL, ["k"])
        assert resumed is not None and (resumed.task_id, resumed.epoch) == ("parked", 2)

    def test_claimers_on_several_store_objects_never_get_the_same_task(
        self, open_store: Callable[[], Store]
    ) -> None:
        # Several workers: each its own store object (its own connections) on one journal, two
        # threads on each, racing to claim every task.
        stores = [open_store() for _ in range(4)]
        # Enough tasks that the race outlasts a thread switch (5 ms): a claim on SQLite does
        # not wait for the disk, and one thread could otherwise claim forty alone.
        wanted = {f"a-{i}" for i in range(400)}
        for task_id in sorted(wanted):
            stores[0].create_task(task_id, "a", "null")
        claims: list[tuple[str, str]] = []
        errors: list[BaseException] = []
        start = threading.Barrier(8)
        deadline = time.monotonic() + 60

        def claimer(store: Store, name: str) -> None:
            try:
                start.wait()
                # Until every task is claimed: on PostgreSQL a claim may pass over rows another
                # claimer holds locked for a moment (SKIP LOCKED) and find nothing now; a worker
                # polls again, and so does this.
                while len(claims) < len(wanted) and time.monotonic() < deadline:
                    record = store.claim_next(name, TTL, ["a"])
                    if record is None:
                        time.sleep(0.001)
                        continue
                    claims.append((record.task_id, name))
            except BaseException as exc:  # reported below: a thread's failure must fail the test
                errors.append(exc)

        in_threads(claimer, [(stores[i % 4], f"w{i}") for i in range(8)])
        assert errors == []
        assert sorted(task_id for task_id, _ in claims) == sorted(wanted)  # each exactly once
        for task_id, name in claims:
            record = stores[1].get_task(task_id)
            assert record is not None and (record.owner, record.epoch) == (name, 1)
        assert len({name for _, name in claims}) > 1  # they did race

    def test_a_task_audit_rides_in_the_fenced_task_write(self, store: Store) -> None:
        record = store.claim_task("t1", "w1", 30.0, None)
        assert record is not None
        ending = TaskResolution("t1", store.now(), "cancelled", "not needed", "alice")
        stale = TaskUpdate(completed=True, audit=ending)
        with pytest.raises(intentlog.LeaseLost):  # a refused write keeps no audit either
            store.write_task("t1", record.epoch + 1, 30.0, stale)
        assert store.task_resolutions("t1") == []
        done = store.write_task("t1", record.epoch, 30.0, TaskUpdate(completed=True, release=True,
                                                                     audit=ending))  # fmt: skip
        assert done.completed and done.owner is None
        assert store.task_resolutions("t1") == [ending]
        assert store.resolutions() == []  # the task's record is not an operation's resolution
        assert store.delete_completed(store.now() + 1) == 1
        assert store.task_resolutions("t1") == []  # collected with its task


def contract_failures(fresh_journal: Callable[[], Iterator[Callable[[], Store]]]) -> dict[str, str]:
    """Run every test of :class:`StoreContract` outside pytest: ``fresh_journal()`` is a
    generator function yielding an ``open_store`` for a new empty journal (cleaning up after
    its yield, like the fixture). Returns each failing test's name with its error; empty if
    the backend kept the whole contract."""
    suite = StoreContract()
    failures: dict[str, str] = {}
    for name in sorted(n for n in dir(StoreContract) if n.startswith("test_")):
        test = getattr(suite, name)
        journal = fresh_journal()
        open_store = next(journal)
        try:
            if "open_store" in inspect.signature(test).parameters:
                test(open_store)
            else:
                test(open_store())
        except Exception as exc:
            failures[name] = f"{type(exc).__name__}: {exc}"
        finally:
            next(journal, None)  # runs its cleanup, after its yield
    return failures
