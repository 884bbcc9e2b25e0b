"""The workers' seam: ``journal.claim(kinds)`` and ``task.release(...)``, sync and async."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest

import intentlog


def test_claim_leases_the_next_runnable_task_of_a_kind(journal_url: str) -> None:
    with intentlog.open(journal_url) as journal, intentlog.open(journal_url) as other:
        assert journal.claim(["pay"]) is None  # nothing started
        journal.start("pay", "a", {"n": 1})
        journal.start("mail", "m")
        assert journal.claim([]) is None and journal.claim(["ship"]) is None
        task = journal.claim(["pay"])
        assert task is not None
        assert (task.id, task.record.kind, task.record.input, task.record.runs) == (
            "a",
            "pay",
            {"n": 1},
            0,
        )
        assert journal.claim(["pay"]) is None  # leased: nobody else gets it
        with pytest.raises(intentlog.TaskBusy):
            other.task("a", wait=0)
        assert other.task_info("m").record.owner is None  # another kind: untouched
        task.checkpoint("charged", {"n": 1})
        task.complete()
        assert journal.claim(["pay"]) is None  # complete
        assert journal.task_info("a").record.completed


def test_release_records_a_failure_and_when_to_try_again(journal_url: str) -> None:
    with intentlog.open(journal_url) as journal:
        journal.start("pay", "a")
        task = journal.claim(["pay"])
        assert task is not None
        with pytest.raises(intentlog.InvalidInput, match="not both"):
            task.release(retry_in=1, not_before=journal.store.now())
        with pytest.raises(intentlog.InvalidInput, match="retry_in"):
            task.release(retry_in=-1)
        with pytest.raises(intentlog.InvalidInput, match="not_before"):
            task.release(not_before=float("nan"))
        before = journal.store.now()
        task.release(failed="ValueError: token=sk_live_abcdef1234567890", retry_in=3600)
        record = journal.task_info("a").record
        assert (record.owner, record.runs, record.completed) == (None, 1, False)
        assert record.last_error is not None and "sk_live_abcdef1234567890" not in record.last_error
        assert record.last_error.startswith("ValueError: token=")
        assert before + 3600 <= record.not_before <= journal.store.now() + 3600
        assert journal.claim(["pay"]) is None  # not before then
        task.release(failed="again")  # a closed handle: nothing more is written
        assert journal.task_info("a").record == record
        with pytest.raises(intentlog.InvalidInput, match="closed"):
            task.checkpoint("more")

        journal.start("pay", "b")
        task = journal.claim(["pay"])
        assert task is not None and task.id == "b"
        task.release(not_before=journal.store.now())  # no failure: runs stays 0
        again = journal.claim(["pay"])
        assert again is not None and again.id == "b"
        assert (again.epoch, again.record.runs, again.record.last_error) == (2, 0, None)
        again.close()


def test_a_claimed_lease_is_renewed_and_a_lost_one_releases_nothing(journal_url: str) -> None:
    with (
        intentlog.open(journal_url, lease_ttl=0.6) as journal,
        intentlog.open(journal_url) as other,
    ):
        journal.start("pay", "a")
        task = journal.claim(["pay"])
        assert task is not None
        time.sleep(1.2)  # two lease lifetimes: only renewal keeps it
        with pytest.raises(intentlog.TaskBusy):
            other.task("a", wait=0)
        # Taken over (as a worker that found the lease expired would): the epoch moves on.
        taken = other.store.claim_task("a", "elsewhere:1:1:abcd", 30.0, task.epoch)
        assert taken is not None
        task.release(failed="too late", retry_in=60)  # quietly writes nothing
        record = other.task_info("a").record
        assert (record.owner, record.runs, record.last_error) == ("elsewhere:1:1:abcd", 0, None)


def test_concurrent_claimers_never_get_the_same_task(journal_url: str) -> None:
    claimed: list[str] = []
    with intentlog.open(journal_url) as journal:
        for i in range(30):
            journal.start("pay", f"t-{i}")

        def claimer() -> None:
            with intentlog.open(journal_url) as mine:
                while (task := mine.claim(["pay"])) is not None:
                    claimed.append(task.id)
                    task.complete()

        threads = [threading.Thread(target=claimer) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert sorted(claimed) == sorted(f"t-{i}" for i in range(30))


def test_a_claim_wants_a_collection_of_kinds(tmp_path: Path) -> None:
    with intentlog.open(tmp_path / "j.db") as journal:
        with pytest.raises(intentlog.InvalidInput, match="not one string"):
            journal.claim("pay")
        with pytest.raises(intentlog.InvalidInput, match="must be a string"):
            journal.claim([1])  # type: ignore[list-item]


def test_the_async_journal_claims_and_releases_the_same_way(journal_url: str) -> None:
    async def main() -> None:
        async with intentlog.open_async(journal_url) as journal:
            assert await journal.claim(["pay"]) is None
            await journal.start("pay", "a", {"n": 2})
            task = await journal.claim(["pay"])
            assert task is not None and task.record.input == {"n": 2}
            assert await journal.claim(["pay"]) is None
            await task.release(failed="boom", retry_in=timedelta(hours=1))
            record = (await journal.task_info("a")).record
            assert (record.owner, record.runs, record.last_error) == (None, 1, "boom")
            assert await journal.claim(["pay"]) is None
            await journal.start("pay", "b")
            task = await journal.claim(("pay",))
            assert task is not None and task.id == "b"
            await task.complete()
            assert (await journal.task_info("b")).record.completed

    asyncio.run(main())


def test_an_async_claim_that_commits_after_the_caller_gave_up_is_given_back(
    tmp_path: Path,
) -> None:
    path = tmp_path / "journal.db"

    async def main() -> int:
        async with intentlog.open_async(path, lease_ttl=60) as journal:
            await journal.start("pay", "t")
            # Another connection holds the write lock: the claim waits in the writer thread.
            blocker = sqlite3.connect(path, isolation_level=None)
            blocker.execute("BEGIN IMMEDIATE")
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(journal.claim(["pay"]), 0.2)
            blocker.execute("COMMIT")  # now the claim commits, after the caller gave up
            blocker.close()
            for _ in range(3000):  # a bound for a hang only: it breaks once given back
                record = (await journal.task_info("t")).record
                if record.epoch == 1 and record.owner is None:
                    break  # claimed, then given back
                await asyncio.sleep(0.02)
            task = await journal.claim(["pay"])  # at once, not after 60 s
            assert task is not None
            await task.close()
            return task.epoch

    assert asyncio.run(main()) == 2
