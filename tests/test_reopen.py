"""A completed task that runs a new effect is open again before the intent is written.

The operations of a completed task are not among those ``pending()``, ``status`` and
``recover`` read: an operation written on a completed task and left in doubt by a crash or an
ambiguous error would be seen by nobody, and no person would be asked to settle it. Adapters
(the MCP proxy, the framework kernels) complete a task once every operation is settled, and a
later call of the same conversation runs on it again, so this is their everyday path.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

import intentlog

SENT: list[str] = []


@intentlog.effect(timeout=5)
def mail(key: str, to: str) -> dict[str, str]:
    SENT.append(to)
    raise ConnectionResetError("reset after the request was written")  # may have landed


@intentlog.effect(timeout=5)
async def amail(key: str, to: str) -> dict[str, str]:
    SENT.append(to)
    raise ConnectionResetError("reset after the request was written")


def test_an_operation_in_doubt_on_a_completed_task_is_seen_and_pages_a_person(
    journal_url: str,
) -> None:
    SENT.clear()
    with intentlog.open(journal_url) as journal:
        with journal.task("chat-7") as task:
            task.complete()
        with journal.task("chat-7") as task, pytest.raises(intentlog.OutcomeUnknown):
            task.run(mail, to="a@example.com")
        (pending,) = journal.pending()
        assert pending.state is intentlog.State.UNRESOLVED and pending.task_id == "chat-7"
        assert not journal.task_info("chat-7").record.completed
        (info,) = journal.attention()
        assert info.record.task_id == "chat-7"
    assert SENT == ["a@example.com"]
    status = subprocess.run(
        [sys.executable, "-m", "intentlog.cli", "--db", journal_url, "status"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert status.returncode == 3, status.stdout + status.stderr  # a person must act
    assert pending.key in status.stdout


def test_a_replay_on_a_completed_task_leaves_it_completed(journal_url: str) -> None:
    """Reading a recorded receipt again writes nothing: the task stays completed."""

    @intentlog.effect(idempotent=True, key_retention=3600, timeout=5)
    def charge(key: str, amount: int) -> dict[str, int]:
        return {"amount": amount}

    with intentlog.open(journal_url) as journal:
        with journal.task("order-1") as task:
            task.run(charge, amount=5)
            task.complete()
        with journal.task("order-1") as task:
            assert task.run(charge, amount=5) == {"amount": 5}
        assert journal.task_info("order-1").record.completed
        assert journal.attention() == []


def test_a_cancelled_task_journals_and_sends_nothing_new(journal_url: str) -> None:
    SENT.clear()
    with intentlog.open(journal_url) as journal:
        with journal.task("order-2") as task:
            pass
        journal.cancel("order-2", actor="ops@example.com", note="customer withdrew")
        with (
            journal.task("order-2") as task,
            pytest.raises(intentlog.InvalidInput, match=r"cancelled by ops@example\.com"),
        ):
            task.run(mail, to="b@example.com")
        assert journal.operations("order-2") == []
        assert journal.task_info("order-2").record.completed
    assert SENT == []


def test_the_asyncio_api_reopens_the_same_way(journal_url: str) -> None:
    SENT.clear()

    async def main() -> None:
        async with intentlog.open_async(journal_url) as journal:
            async with journal.task("chat-8") as task:
                await task.complete()
            async with journal.task("chat-8") as task:
                with pytest.raises(intentlog.OutcomeUnknown):
                    await task.run(amail, to="c@example.com")
            (pending,) = await journal.pending()
            assert pending.task_id == "chat-8"

    asyncio.run(main())
    assert SENT == ["c@example.com"]
