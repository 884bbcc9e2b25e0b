"""intentlog.integrations.nats against the real nats-server (JetStream) on 127.0.0.1:4222.

Every test makes streams with unique names and subjects and deletes them afterwards. Where
no server answers the tests skip, except with CI=true, where they must run and so fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import intentlog

SUPPORT = Path(__file__).parent / "support"
NATS_URL = os.environ.get("INTENTLOG_TEST_NATS", "nats://127.0.0.1:4222")


@functools.cache
def _nats_problem() -> str | None:
    try:
        import nats
    except ImportError:
        return "nats-py is not installed (pip install 'intentlog[nats]')"

    async def probe() -> None:
        nc = await nats.connect(NATS_URL, connect_timeout=2, max_reconnect_attempts=0)
        try:
            await nc.jetstream().account_info()
        finally:
            await nc.close()

    try:
        asyncio.run(probe())
    except Exception as exc:
        return f"no NATS server with JetStream answers at {NATS_URL}: {type(exc).__name__} {exc}"
    return None


def need_nats() -> None:
    """Skip where no server answers, but fail where CI=true: there these tests must run."""
    problem = _nats_problem()
    if problem is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"{problem} (CI=true: NATS tests must run, not skip)", pytrace=False)
    pytest.skip(problem)


@contextlib.asynccontextmanager
async def connected() -> AsyncIterator[Any]:
    import nats

    nc = await nats.connect(NATS_URL, connect_timeout=2, max_reconnect_attempts=0)
    try:
        yield nc
    finally:
        await nc.close()


@dataclasses.dataclass(frozen=True)
class Stream:
    name: str
    subject: str  # the effect publishes here; the stream also takes <subject>.>
    window: float


async def messages(stream: Stream) -> list[tuple[int, str | None]]:
    """(sequence, Nats-Msg-Id) of every message in the stream."""
    from nats.js.errors import NotFoundError

    async with connected() as nc:
        js = nc.jetstream()
        state = (await js.stream_info(stream.name)).state
        found = []
        for seq in range(state.first_seq or 1, (state.last_seq or 0) + 1):
            with contextlib.suppress(NotFoundError):  # deleted
                msg = await js.get_msg(stream.name, seq=seq)
                found.append((seq, (msg.headers or {}).get("Nats-Msg-Id")))
        return found


@pytest.fixture
def make_stream() -> Iterator[Callable[..., Stream]]:
    need_nats()
    from nats.js.api import StreamConfig

    made: list[Stream] = []

    def make(window: float = 60.0, **config: Any) -> Stream:
        tag = uuid.uuid4().hex[:12]
        stream = Stream(f"INTENTLOG_{tag.upper()}", f"intentlog.test.{tag}", window)

        async def add() -> None:
            async with connected() as nc:
                await nc.jetstream().add_stream(
                    StreamConfig(
                        name=stream.name,
                        subjects=[stream.subject, stream.subject + ".>"],
                        duplicate_window=window,
                        **config,
                    )
                )

        asyncio.run(add())
        made.append(stream)
        return stream

    yield make

    async def delete() -> None:
        async with connected() as nc:
            for stream in made:
                with contextlib.suppress(Exception):
                    await nc.jetstream().delete_stream(stream.name)

    if made:
        asyncio.run(delete())


async def effect_and(
    stream: Stream, fn: Callable[[intentlog.Effect, Any], Any], **settings: Any
) -> Any:
    """Build the effect on a fresh connection and run ``await fn(effect, js)``."""
    from intentlog.integrations.nats import publish_effect

    async with connected() as nc:
        options: dict[str, Any] = {"name": "announce", "stream": stream.name, "timeout": 1.0}
        effect = await publish_effect(nc, stream.subject, **{**options, **settings})
        return await fn(effect, nc.jetstream())


async def run_task(path: Path, effect: intentlog.Effect, task_id: str = "t", **args: Any) -> Any:
    async with (
        intentlog.open_async(path, max_wait=15) as journal,
        journal.task(task_id) as task,
    ):
        return await task.run(effect, **args)


def test_publish_receipt_retention_and_replay(
    tmp_path: Path, make_stream: Callable[..., Stream]
) -> None:
    stream = make_stream(window=42.0)

    async def go(effect: intentlog.Effect, js: Any) -> None:
        assert effect.key_retention == 42.0 and effect.idempotent and effect.is_async
        assert effect.reconcile is not None  # lookup="scan" by default
        first = await run_task(tmp_path / "j.db", effect, order=7)
        again = await run_task(tmp_path / "j.db", effect, order=7)
        assert first == again == {"stream": stream.name, "seq": 1, "duplicate": False}
        other = await run_task(tmp_path / "j.db", effect, json=[1, 2])
        assert other["seq"] == 2
        msg = await js.get_msg(stream.name, seq=2)
        assert json.loads(msg.data) == [1, 2] and msg.subject == stream.subject

    asyncio.run(effect_and(stream, go))
    assert [seq for seq, _ in asyncio.run(messages(stream))] == [1, 2]


def test_stream_found_by_subject_and_errors(make_stream: Callable[..., Stream]) -> None:
    stream = make_stream()
    from intentlog.integrations.nats import publish_effect

    async def go() -> None:
        async with connected() as nc:
            effect = await publish_effect(nc.jetstream(), stream.subject, name="x")
            assert effect.key_retention == 60.0
            for subject, kwargs, message in [
                ("intentlog.nobody.takes.this", {}, "no a stream that takes"),
                (stream.subject, {"stream": "NO_SUCH_STREAM"}, "no stream 'NO_SUCH_STREAM'"),
                (stream.subject + ".*", {}, "not a literal NATS subject"),
                (stream.subject, {"lookup": "index"}, "lookup must be one of"),
                (stream.subject, {"scan_limit": 0}, "scan_limit"),
            ]:
                with pytest.raises(intentlog.InvalidInput, match=message):
                    await publish_effect(nc, subject, name="x", **kwargs)
            with pytest.raises(intentlog.InvalidInput, match="Client or JetStreamContext"):
                await publish_effect(object(), stream.subject, name="x")  # type: ignore[arg-type]

    asyncio.run(go())


@pytest.mark.parametrize("lookup", ["scan", "subject"])
def test_lookup_finds_denies_and_doubts(
    tmp_path: Path, make_stream: Callable[..., Stream], lookup: str
) -> None:
    stream = make_stream()

    async def go(effect: intentlog.Effect, js: Any) -> None:
        assert effect.reconcile is not None
        for i in range(5):  # other publishers' messages around ours
            await js.publish(stream.subject, b"{}", headers={"Nats-Msg-Id": f"other-{i}"})
        receipt = await run_task(tmp_path / "j.db", effect, order=1)
        await js.publish(stream.subject, b"{}", headers={"Nats-Msg-Id": "other-last"})
        (op,) = await asyncio.to_thread(_operations, tmp_path / "j.db")
        found = await effect.reconcile(op.key)
        assert found == intentlog.Found({**receipt, "duplicate": True})
        assert receipt["seq"] == 6
        assert await effect.reconcile("never-sent") == intentlog.NotFound()
        # Once the stream has removed a message, a miss proves nothing any more.
        await js.delete_msg(stream.name, 2)
        doubt = await effect.reconcile("never-sent")
        assert isinstance(doubt, intentlog.Indeterminate) and "removed" in doubt.reason
        assert await effect.reconcile(op.key) == found

    asyncio.run(effect_and(stream, go, lookup=lookup))


def _operations(path: Path) -> list[intentlog.Operation]:
    with intentlog.open(path) as journal:
        return journal.operations()


def test_scan_is_bounded(make_stream: Callable[..., Stream]) -> None:
    stream = make_stream()

    async def go(effect: intentlog.Effect, js: Any) -> None:
        for i in range(6):
            await js.publish(stream.subject, b"{}", headers={"Nats-Msg-Id": f"m-{i}"})
        assert effect.reconcile is not None
        assert await effect.reconcile("m-2") == intentlog.Found(
            {"stream": stream.name, "seq": 3, "duplicate": True}
        )
        result = await effect.reconcile("m-absent")
        assert isinstance(result, intentlog.Indeterminate) and "scan_limit" in result.reason

    asyncio.run(effect_and(stream, go, scan_limit=4))


def test_error_ack_is_rejected(tmp_path: Path, make_stream: Callable[..., Stream]) -> None:
    from nats.js.api import DiscardPolicy

    stream = make_stream(max_msgs=1, discard=DiscardPolicy.NEW)

    async def go(effect: intentlog.Effect, js: Any) -> None:
        await run_task(tmp_path / "j.db", effect, order=1)
        with pytest.raises(intentlog.Rejected, match="maximum messages"):
            await run_task(tmp_path / "j.db", effect, order=2)
        ops = await asyncio.to_thread(_operations, tmp_path / "j.db")
        assert [op.state for op in ops] == [intentlog.State.CONFIRMED, intentlog.State.FAILED]

    asyncio.run(effect_and(stream, go))
    assert len(asyncio.run(messages(stream))) == 1


def test_key_that_is_no_subject_token(tmp_path: Path, make_stream: Callable[..., Stream]) -> None:
    stream = make_stream()

    async def go(effect: intentlog.Effect, js: Any) -> None:
        receipt = await run_task(tmp_path / "j.db", effect, order=1)
        msg = await js.get_msg(stream.name, seq=receipt["seq"])
        assert msg.subject.startswith(stream.subject + ".announce-")  # <subject>.<key>
        with pytest.raises(intentlog.Rejected, match="cannot end a subject"):
            await run_task(tmp_path / "j.db", effect, key="order>7", order=2)
        assert (await run_task(tmp_path / "j.db", effect, key="order.8", order=3))["seq"] == 2

    asyncio.run(effect_and(stream, go, lookup="subject"))
    assert len(asyncio.run(messages(stream))) == 2


def test_no_stream_listening_is_ambiguous(
    tmp_path: Path, make_stream: Callable[..., Stream]
) -> None:
    from intentlog.integrations.nats import AmbiguousResponse

    stream = make_stream()

    async def go(effect: intentlog.Effect, js: Any) -> None:
        await js.delete_stream(stream.name)  # nobody takes the subject now: 503 no responders
        with pytest.raises(AmbiguousResponse, match="no responders"):
            await run_task(tmp_path / "j.db", effect, order=1)
        (op,) = await asyncio.to_thread(_operations, tmp_path / "j.db")
        assert op.state is intentlog.State.SUBMITTED  # never FAILED on a doubt

    asyncio.run(effect_and(stream, go, lookup=None))


# -- SIGKILL after the publish, before the receipt -------------------------------------------


def child(
    tmp_path: Path, stream: Stream, crash: str | None, lookup: str | None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(SUPPORT)}
    env.pop("INTENTLOG_CRASH", None)
    if crash:
        env["INTENTLOG_CRASH"] = crash
    config = {"url": NATS_URL, "stream": stream.name, "subject": stream.subject,
              "lookup": lookup, "task": "order-7", "timeout": 0.5}  # fmt: skip
    return subprocess.run(
        [sys.executable, str(SUPPORT / "integration_workflows.py"), "nats", str(tmp_path / "j.db"),
         json.dumps(config)],
        env=env, capture_output=True, text=True, timeout=90,
    )  # fmt: skip


def receipt_of(run: subprocess.CompletedProcess[str]) -> Any:
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])["receipt"]


@pytest.mark.parametrize("point", ["after_send", "after_remote_commit"])
def test_restart_inside_window_republishes_deduplicated(
    tmp_path: Path, make_stream: Callable[..., Stream], point: str
) -> None:
    stream = make_stream(window=30.0)
    assert child(tmp_path, stream, f"{point}:announce", None).returncode == -signal.SIGKILL
    receipt = receipt_of(child(tmp_path, stream, None, None))
    # the stream had it: the same key again was deduplicated, with the first sequence
    assert receipt == {"stream": stream.name, "seq": 1, "duplicate": True}
    assert [seq for seq, _ in asyncio.run(messages(stream))] == [1]


def test_restart_past_window_without_lookup_is_unresolved(
    tmp_path: Path, make_stream: Callable[..., Stream]
) -> None:
    stream = make_stream(window=1.0)
    assert child(tmp_path, stream, "after_remote_commit:announce", None).returncode == -9
    time.sleep(1.2)  # the stream has forgotten the id: a publish now would be a duplicate
    second = child(tmp_path, stream, None, None)
    assert second.returncode == 3, second.stderr
    with intentlog.open(tmp_path / "j.db") as journal:
        (pending,) = journal.pending()
        assert pending.state is intentlog.State.UNRESOLVED
        assert pending.next_action is intentlog.Action.ESCALATE and "retention" in pending.reason
    assert len(asyncio.run(messages(stream))) == 1


@pytest.mark.parametrize("lookup", ["scan", "subject"])
def test_restart_past_window_with_lookup_confirms(
    tmp_path: Path, make_stream: Callable[..., Stream], lookup: str
) -> None:
    stream = make_stream(window=1.0)
    first = child(tmp_path, stream, "after_remote_commit:announce", lookup)
    assert first.returncode == -signal.SIGKILL
    time.sleep(1.2)
    receipt = receipt_of(child(tmp_path, stream, None, lookup))
    assert receipt == {"stream": stream.name, "seq": 1, "duplicate": True}
    assert len(asyncio.run(messages(stream))) == 1
    with intentlog.open(tmp_path / "j.db") as journal:
        (op,) = journal.operations()
        assert op.state is intentlog.State.CONFIRMED and op.attempts == 1  # found, not resent


def test_killed_before_sending_past_window(
    tmp_path: Path, make_stream: Callable[..., Stream]
) -> None:
    # SUBMITTED is durable, nothing was sent. The lookup proves it (the stream never removed
    # anything), so it is published; without a lookup, past the window, nothing can say.
    stream = make_stream(window=1.0)
    assert child(tmp_path, stream, "after_submit_mark:announce", "scan").returncode == -9
    time.sleep(1.2)
    assert receipt_of(child(tmp_path, stream, None, "scan"))["seq"] == 1
    assert len(asyncio.run(messages(stream))) == 1

    other = make_stream(window=1.0)
    (tmp_path / "x").mkdir()
    assert child(tmp_path / "x", other, "after_submit_mark:announce", None).returncode == -9
    time.sleep(1.2)
    assert child(tmp_path / "x", other, None, None).returncode == 3
    assert asyncio.run(messages(other)) == []


def test_missing_nats_names_the_extra() -> None:
    code = (
        "import asyncio, sys; sys.modules['nats'] = None\n"
        "from intentlog.integrations.nats import publish_effect\n"
        "asyncio.run(publish_effect(None, 'a', name='x'))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 1 and "pip install 'intentlog[nats]'" in run.stderr


def test_docs_nats_section_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    need_nats()
    from integration_workflows import run_doc_section

    monkeypatch.chdir(tmp_path)
    assert run_doc_section("NATS JetStream") >= 1
    capsys.readouterr()


# -- the stream's window changed while the worker was down (judged by the stricter) ----------


def changed_window(stream: Stream, window: float) -> None:
    async def update() -> None:
        async with connected() as nc:
            js = nc.jetstream()
            config = (await js.stream_info(stream.name)).config
            config.duplicate_window = window
            await js.update_stream(config)
            assert (await js.stream_info(stream.name)).config.duplicate_window == window

    asyncio.run(update())


def worker(tmp_path: Path, stream: Stream, crash: str | None) -> subprocess.CompletedProcess[str]:
    """A worker that builds its effect anew (reading the window as it is now) and prints the
    contract it read before it runs the task."""
    env = {**os.environ, "PYTHONPATH": str(SUPPORT)}
    env.pop("INTENTLOG_CRASH", None)
    if crash:
        env["INTENTLOG_CRASH"] = crash
    config = {"url": NATS_URL, "stream": stream.name, "subject": stream.subject, "timeout": 0.5}
    return subprocess.run(
        [sys.executable, str(SUPPORT / "service_workers.py"), "nats", str(tmp_path / "j.db"),
         json.dumps(config)],
        env=env, capture_output=True, text=True, timeout=90,
    )  # fmt: skip


def live_policy(run: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    return dict(json.loads(run.stdout.splitlines()[0])["policy"])


def cli_status(tmp_path: Path) -> tuple[int, dict[str, Any]]:
    run = subprocess.run(
        [sys.executable, "-m", "intentlog.cli", "--db", str(tmp_path / "j.db"), "status",
         "--json"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    return run.returncode, json.loads(run.stdout)


def views(tmp_path: Path) -> tuple[intentlog.Pending, dict[str, Any], int]:
    """The one pending operation as pending() sees it, and as `intentlog status` does."""
    with intentlog.open(tmp_path / "j.db") as journal:
        (pending,) = journal.pending()
    code, status = cli_status(tmp_path)
    (item,) = status["pending"]
    assert item["key"] == pending.key
    return pending, item, code


def wait_until(moment: float) -> None:
    """Sleep until the (SQLite store's) clock has passed ``moment``."""
    while time.time() <= moment:
        time.sleep(max(moment - time.time(), 0.01))


def test_window_raised_while_down_is_judged_by_the_recorded_one(
    tmp_path: Path, make_stream: Callable[..., Stream]
) -> None:
    stream = make_stream(window=2.0)
    assert worker(tmp_path, stream, "after_remote_commit:announce").returncode == -9
    (op,) = _operations(tmp_path / "j.db")
    assert op.state is intentlog.State.SUBMITTED and op.policy.key_retention == 2.0
    assert op.first_submitted_at is not None
    wait_until(op.first_submitted_at + 2.5)  # the stream has forgotten the id by now
    changed_window(stream, 60.0)
    # pending() and the CLI judge by the recorded 2 s: past it, nothing can be resent.
    pending, item, code = views(tmp_path)
    assert pending.next_action is intentlog.Action.ESCALATE and "retention" in pending.reason
    assert (item["next_action"], code) == ("ESCALATE", 3)
    restarted = worker(tmp_path, stream, None)
    assert live_policy(restarted)["key_retention"] == 60.0  # the worker read the raised window
    assert restarted.returncode == 3, restarted.stdout + restarted.stderr  # and still escalated
    pending, item, code = views(tmp_path)
    assert pending.state is intentlog.State.UNRESOLVED
    assert pending.next_action is intentlog.Action.ESCALATE and "retention" in pending.reason
    assert (item["state"], item["next_action"], code) == ("UNRESOLVED", "ESCALATE", 3)
    (op,) = _operations(tmp_path / "j.db")
    assert op.attempts == 1 and op.policy.key_retention == 2.0  # never loosened
    assert len(asyncio.run(messages(stream))) == 1


def test_window_lowered_while_down_is_judged_by_the_live_one(
    tmp_path: Path, make_stream: Callable[..., Stream]
) -> None:
    stream = make_stream(window=60.0)
    assert worker(tmp_path, stream, "after_remote_commit:announce").returncode == -9
    (op,) = _operations(tmp_path / "j.db")
    assert op.policy.key_retention == 60.0 and op.first_submitted_at is not None
    changed_window(stream, 1.0)
    wait_until(op.first_submitted_at + 1.5)  # past the lowered window: the id is forgotten
    restarted = worker(tmp_path, stream, None)
    assert live_policy(restarted)["key_retention"] == 1.0
    assert restarted.returncode == 3, restarted.stdout + restarted.stderr
    pending, item, code = views(tmp_path)
    assert pending.state is intentlog.State.UNRESOLVED and "retention" in pending.reason
    assert (item["state"], item["next_action"], code) == ("UNRESOLVED", "ESCALATE", 3)
    assert len(asyncio.run(messages(stream))) == 1


def test_effect_declares_the_jetstream_contract(make_stream: Callable[..., Stream]) -> None:
    from intentlog import profiles

    stream = make_stream(window=42.0)

    async def go(effect: intentlog.Effect, js: Any) -> None:
        assert effect.service == profiles.nats_jetstream(42.0, timeout=1.0)
        assert effect.policy.service == "nats-jetstream" and effect.policy.key_retention == 42.0

    asyncio.run(effect_and(stream, go))

    async def without_lookup(effect: intentlog.Effect, js: Any) -> None:
        assert effect.service is not None and effect.service.lookup is None
        assert effect.reconcile is None and effect.key_retention == 42.0

    asyncio.run(effect_and(stream, without_lookup, lookup=None, lookup_lag=0.5))
