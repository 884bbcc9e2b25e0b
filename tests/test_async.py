"""The asyncio API: same behaviour as the sync one, group commit, and misuse made loud."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import intentlog
from intentlog import Action, State
from intentlog._decide import send_slack
from intentlog.stores.sqlite_async import AsyncSQLiteStore
from remote import Remote, make_effect


def arun(coro: Any) -> Any:
    return asyncio.run(coro)


def test_run_replay_and_receipt(tmp_path: Path, journal_url: str) -> None:
    sent: list[str] = []

    @intentlog.effect(idempotent=True, key_retention=intentlog.FOREVER)
    async def charge(key: str, amount: int) -> dict[str, Any]:
        await asyncio.sleep(0)
        sent.append(key)
        return {"id": f"ch_{len(sent)}", "amount": amount}

    async def main() -> None:
        async with intentlog.open_async(journal_url) as journal:
            async with journal.task("t") as task:
                first = await task.run(charge, amount=5)
                assert await task.run(charge, 5) == first
                await task.checkpoint(next_step="ship", state={"charge": first["id"]})
                assert (await task.info()).next_action is Action.RESUME
                await task.complete()
            again = await journal.task("t")
            assert again.completed
            assert again.next_step == "ship"
            await again.close()
            assert (await journal.counts())[State.CONFIRMED] == 1

    arun(main())
    assert len(sent) == 1


def test_sync_effects_run_off_the_loop_and_recover_after_a_kill_like_state(
    tmp_path: Path, journal_url: str
) -> None:
    remote = Remote(str(tmp_path / "remote.db"))
    charge = make_effect("reconcilable", remote)

    async def main() -> Any:
        async with (
            intentlog.open_async(journal_url) as journal,
            journal.task("t") as task,
        ):
            assert threading.current_thread() is threading.main_thread()
            return await task.run(charge, amount=7)

    receipt = arun(main())
    assert remote.count() == 1
    assert receipt["id"] == remote.ids()[0]


def test_async_errors_match_the_sync_api(tmp_path: Path, journal_url: str) -> None:
    async def refuse(key: str) -> None:
        raise intentlog.Rejected("declined")

    async def flaky(key: str) -> None:
        raise TimeoutError("no answer")

    async def main() -> None:
        async with intentlog.open_async(journal_url) as journal:
            async with journal.task("t") as task:
                with pytest.raises(intentlog.Rejected, match="declined"):
                    await task.run(
                        intentlog.Effect(
                            "refuse", refuse, idempotent=True, key_retention=intentlog.FOREVER
                        )
                    )
                with pytest.raises(intentlog.OutcomeUnknown):
                    await task.run(intentlog.Effect("flaky", flaky))
                ok = intentlog.Effect(
                    "ok", lambda key: {"ok": True}, idempotent=True, key_retention=intentlog.FOREVER
                )
                assert await task.run(ok, key="k") == {"ok": True}
                with pytest.raises(intentlog.KeyConflict):
                    await task.run(
                        intentlog.Effect(
                            "other", refuse, idempotent=True, key_retention=intentlog.FOREVER
                        ),
                        key="k",
                    )
            pending = await journal.pending()
            assert [p.next_action for p in pending] == [Action.ESCALATE]
            resolved = await journal.resolve(
                pending[0].key, "failed", note="bounced", accept_risk=True
            )
            assert resolved.state is State.FAILED
            assert len(await journal.resolutions()) == 1

    arun(main())


def test_async_recover_with_an_async_reconciler(tmp_path: Path, journal_url: str) -> None:
    async def submit(key: str) -> None:
        raise ConnectionError("dropped after commit")

    async def lookup(key: str) -> intentlog.Found:
        return intentlog.Found({"id": "found-1"})

    effect = intentlog.Effect("pay", submit, reconcile=lookup, timeout=30)

    async def main() -> None:
        async with intentlog.open_async(journal_url, max_wait=0) as journal:
            # the first lookup already finds it: run returns the receipt from the lookup
            async with journal.task("t") as task:
                assert await task.run(effect) == {"id": "found-1"}
            (op,) = await journal.operations("t")
            assert op.state is State.CONFIRMED

    arun(main())


def test_misuse_is_loud(tmp_path: Path) -> None:
    @intentlog.effect
    async def async_effect(key: str) -> int:
        return 1

    with intentlog.open(tmp_path / "j.db") as journal, journal.task("t") as task:
        with pytest.raises(intentlog.InvalidInput, match="open_async"):
            task.run(async_effect)
        assert task.operations() == []  # refused before any intent was written

    async def main() -> None:
        journal = intentlog.open_async(tmp_path / "a.db")
        try:
            with pytest.raises(TypeError, match="async with"), journal.task("t"):
                pass
            with pytest.raises(TypeError, match="async with"), journal:
                pass
            sync = intentlog.open(tmp_path / "s.db")
            with pytest.warns(intentlog.BlockingCallWarning, match="open_async"):
                handle = sync.task("t")
            handle.close()
            sync.close()
        finally:
            await journal.aclose()

    arun(main())


def test_group_commit_many_async_tasks_share_commits(tmp_path: Path) -> None:
    @intentlog.effect(idempotent=True, key_retention=intentlog.FOREVER)
    async def charge(key: str, n: int) -> dict[str, int]:
        await asyncio.sleep(0.001)
        return {"n": n}

    async def main() -> tuple[int, int]:
        async with intentlog.open_async(tmp_path / "j.db") as journal:

            async def one(i: int) -> None:
                async with journal.task(f"t{i}") as task:
                    for step in range(3):
                        assert await task.run(charge, n=i * 10 + step) == {"n": i * 10 + step}
                    await task.complete()

            before = journal.store.commits
            await asyncio.gather(*(one(i) for i in range(64)))
            counts = await journal.counts()
            return journal.store.commits - before, counts[State.CONFIRMED]

    commits, confirmed = arun(main())
    writes = 64 * (1 + 3 * 2 + 1)  # claim, intent + receipt per effect, complete
    assert confirmed == 64 * 3
    assert commits < writes / 2, (commits, writes)  # shared commits


def test_group_commit_threads_on_the_sync_journal(tmp_path: Path) -> None:
    effect = intentlog.Effect(
        "e", lambda key, n: {"n": n}, idempotent=True, key_retention=intentlog.FOREVER
    )
    with intentlog.open(tmp_path / "j.db") as journal:
        errors: list[BaseException] = []

        def work(i: int) -> None:
            try:
                with journal.task(f"t{i}") as task:
                    for step in range(5):
                        task.run(effect, n=step)
                    task.complete()
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        before = journal.store.commits
        threads = [threading.Thread(target=work, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert journal.counts()[State.CONFIRMED] == 16 * 5
        assert journal.store.commits - before < 16 * (1 + 5 * 2 + 1)


def test_a_failing_write_in_a_shared_commit_fails_alone(tmp_path: Path) -> None:
    # One writer's compare-and-set loses inside a batch; the others still commit.
    from intentlog.stores.sqlite import SQLiteStore

    store = SQLiteStore(tmp_path / "j.db")
    try:
        store.claim_task("a", "o", 30, None)
        results: list[Any] = []
        barrier = threading.Barrier(8)

        def claim(i: int) -> None:
            barrier.wait()
            results.append(store.claim_task("a", f"w{i}", 30, 1))

        threads = [threading.Thread(target=claim, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len([r for r in results if r is not None]) == 1
        record = store.get_task("a")
        assert record is not None
        assert record.epoch == 2
    finally:
        store.close()


def test_journal_io_needs_neither_the_loop_nor_the_pool(journal_url: str) -> None:
    """The async stores do their I/O off the event loop and off the journal's thread pool:
    with the pool's only thread held by a blocking effect, another task still runs; and on
    SQLite no statement runs on the loop's thread."""
    from intentlog.stores._async_store import AsyncStore

    released = threading.Event()
    statement_threads: set[str] = set()

    def blocker(key: str) -> dict[str, Any]:
        return {"released": released.wait(20)}

    async def quick(key: str) -> dict[str, Any]:
        return {"ok": key}

    blocking = intentlog.Effect("block", blocker, idempotent=True, key_retention=intentlog.FOREVER)
    fast = intentlog.Effect("quick", quick, idempotent=True, key_retention=intentlog.FOREVER)

    async def main() -> Any:
        async with intentlog.open_async(journal_url, workers=1) as journal:
            assert isinstance(journal.store, AsyncStore)
            inner = getattr(journal.store.executor, "sync", None)  # SQLite's, not PostgreSQL's
            for conn in (getattr(inner, "conn", None), getattr(inner, "reader", None)):
                if conn is not None:  # SQLite: record the thread of every statement
                    trace = lambda _: statement_threads.add(threading.current_thread().name)  # noqa: E731
                    conn.set_trace_callback(trace)

            async def held() -> Any:
                async with journal.task("held") as task:
                    return await task.run(blocking)

            async def other() -> None:
                async with journal.task("other") as task:
                    await task.run(fast)
                    await task.checkpoint(next_step="done")
                assert (await journal.counts())[State.CONFIRMED] >= 1
                released.set()

            receipt, _ = await asyncio.gather(held(), other())
            return receipt

    # With journal I/O on the pool, "other" would wait for the blocked thread, which would
    # give up after 20 s and answer False: the answer shows the order, without a stopwatch.
    assert arun(main()) == {"released": True}
    if "postgres" not in journal_url:
        assert statement_threads, "the trace saw no statement"
        assert threading.main_thread().name not in statement_threads, statement_threads


def test_a_closed_async_journal_refuses_work(tmp_path: Path) -> None:
    async def main() -> None:
        journal = intentlog.open_async(tmp_path / "j.db")
        async with journal.task("t") as task:
            await task.checkpoint(next_step="a")
        await journal.aclose()
        with pytest.raises(intentlog.JournalError, match="closed"):
            await journal.start("kind", "t2")
        with pytest.raises(intentlog.JournalError, match="closed"):
            await journal.operations()

    arun(main())


def test_async_sqlite_store_survives_a_loop_that_closed_with_a_write_pending(
    tmp_path: Path,
) -> None:
    """Several event loops may use one store. A loop that goes away while one of its writes
    is queued (asyncio.run returning, a cancelled request) leaves nobody to wake: the writer
    thread must go on serving every other loop."""
    path = tmp_path / "journal.db"
    store = AsyncSQLiteStore(path)
    # Another connection holds the write lock, so the writer thread's batch waits for it.
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")

    async def abandon_a_write() -> None:
        asyncio.get_running_loop().create_task(store.create_task("a", "kind", "null"))
        await asyncio.sleep(0.05)  # queued; asyncio.run then cancels it and closes the loop

    asyncio.run(abandon_a_write())
    blocker.execute("COMMIT")  # the writer commits "a" and tries to wake the closed loop
    blocker.close()
    with contextlib.closing(sqlite3.connect(path)) as reader:  # wait until it has committed
        while reader.execute("SELECT 1 FROM tasks WHERE task_id = 'a'").fetchone() is None:
            time.sleep(0.01)

    async def write_from_a_live_loop() -> Any:
        return await asyncio.wait_for(store.create_task("b", "kind", "null"), 30)

    try:
        created = asyncio.run(write_from_a_live_loop())
    except TimeoutError:
        created = None
    finally:
        asyncio.run(store.aclose())
    assert created is not None, "a write on a live loop never completed: the writer thread died"


@pytest.mark.filterwarnings("ignore::intentlog.BlockingCallWarning")
def test_async_journal_renews_leases_on_a_second_event_loop(tmp_path: Path) -> None:
    """A journal can outlive an event loop (asyncio.run, then another): handles opened on the
    next loop are renewed too, so no other worker can take an open, working task over."""
    path = tmp_path / "journal.db"
    journal = intentlog.open_async(path, lease_ttl=2.0)

    async def first() -> None:
        async with journal.task("first") as task:
            await task.checkpoint(next_step="done")

    async def second() -> tuple[int, BaseException | None]:
        async with journal.task("second") as task:
            with intentlog.open(path) as other:
                # Past the moment the lease would have expired had it not been renewed (a
                # renewal every third of the lease), by the store's clock.
                expires = other.task_info("second").record.lease_expires
                while other.store.now() <= expires + 0.1:
                    await asyncio.sleep(0.05)
                try:
                    taken = other.task("second", wait=0)
                    epoch = taken.epoch
                    taken.close()
                except intentlog.TaskBusy:
                    epoch = task.epoch  # still ours: renewed, as it should be
            try:
                await task.checkpoint(next_step="still mine")
                lost = None
            except intentlog.LeaseLost as exc:
                lost = exc
            return epoch, lost

    asyncio.run(first())
    try:
        epoch, lost = asyncio.run(second())
    finally:
        asyncio.run(journal.aclose())
    assert (epoch, lost) == (1, None), "an open handle's lease was not renewed and was taken"


def test_a_claim_that_commits_after_the_caller_gave_up_is_given_back(tmp_path: Path) -> None:
    """A timeout around journal.task() may cancel the caller while its claim is being
    committed. The claim then commits with no handle to hold it: the journal releases it, so
    the task can be taken again at once instead of after the lease expires."""
    path = tmp_path / "journal.db"

    async def main() -> int:
        async with intentlog.open_async(path, lease_ttl=60) as journal:
            # Another connection holds the write lock: the claim waits in the writer thread.
            blocker = sqlite3.connect(path, isolation_level=None)
            blocker.execute("BEGIN IMMEDIATE")
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(journal.task("t")._open(), 0.2)
            blocker.execute("COMMIT")  # now the claim commits, after the caller gave up
            blocker.close()
            for _ in range(3000):  # a bound for a hang only: it breaks once given back
                with contextlib.suppress(intentlog.InvalidInput):  # not claimed yet
                    info = await journal.task_info("t")
                    if info.record.epoch == 1 and info.record.owner is None:
                        break  # claimed, then given back
                await asyncio.sleep(0.02)
            async with journal.task("t", wait=0) as task:  # no TaskBusy for 60 s
                return task.epoch

    assert arun(main()) == 2


def test_a_sync_submit_that_waited_for_a_thread_leaves_within_its_recorded_window(
    journal_url: str,
) -> None:
    """A synchronous submit on an asyncio journal runs in the journal's pool, and may wait
    there behind other tasks' blocking calls after the flow checked that its recorded send
    was fresh. The request must still leave within ``send_slack`` of the send the journal
    records (the in-flight window a person and every other worker rely on): one that waited
    longer is stamped again before it leaves, never sent on the stale stamp."""
    sent: dict[str, float] = {}
    key = "b-charge"

    async def main() -> intentlog.Operation:
        async with intentlog.open_async(journal_url, workers=1, max_wait=30.0) as journal:
            store = journal.store
            started, queued = asyncio.Event(), asyncio.Event()
            loop = asyncio.get_running_loop()

            def hold_the_pool(key: str) -> dict[str, Any]:
                # The pool's one thread, held until the charge's send, queued behind it, is
                # recorded and then stale (observed in the journal and on its clock).
                loop.call_soon_threadsafe(started.set)
                asyncio.run_coroutine_threadsafe(queued.wait(), loop).result(30)
                op = asyncio.run_coroutine_threadsafe(store.get_op(key), loop).result(30)
                assert op is not None and op.submitted_at is not None
                while store.now() <= op.submitted_at + send_slack(op.policy) + 0.05:
                    time.sleep(0.01)
                return {"held": True}

            def charge(given: str, amount: int) -> dict[str, Any]:
                sent[given] = store.now()  # the request leaves now
                return {"id": given, "amount": amount}

            holder = intentlog.Effect("hold", hold_the_pool, idempotent=True,
                                      key_retention=intentlog.FOREVER, timeout=30.0)  # fmt: skip
            pay = intentlog.Effect("charge", charge, idempotent=True,
                                   key_retention=intentlog.FOREVER, timeout=0.4)  # fmt: skip

            async def held() -> None:
                async with journal.task("a") as task:
                    await task.run(holder)

            async def paid() -> None:
                await started.wait()  # the pool's one thread is taken
                async with journal.task("b") as task:
                    run = asyncio.ensure_future(task.run(pay, amount=7, key=key))
                    while not await journal.operations("b"):
                        await asyncio.sleep(0.01)
                    queued.set()  # its intent is recorded: its send waits for the thread
                    await run

            await asyncio.gather(held(), paid())
            return await journal.operation(key)

    op = arun(main())
    assert op.state is State.CONFIRMED and op.submitted_at is not None
    assert sent[op.key] - op.submitted_at <= send_slack(op.policy), (
        f"sent {sent[op.key] - op.submitted_at:.3f}s after its recorded send"
    )
