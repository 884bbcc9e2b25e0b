"""The ambient task and ``@intentlog.journaled``: a function called like the plain function it
is, journaled under the task a ``with journal.task(...)`` block made current.

What each effect applied is counted at the service's own record (tests/support/remote.py, a SQLite
database of its own), not by what the caller believes; the crash tests kill a real child
process (tests/support/ambient_child.py) with SIGKILL.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

import intentlog
from intentlog import State
from intentlog._cli_load import load_effects
from remote import Remote

SUPPORT = Path(__file__).parent / "support"


@pytest.fixture
def remote(tmp_path: Path) -> Remote:
    return Remote(str(tmp_path / "remote.db"))


def deduplicated(remote: Remote) -> Any:
    """A charge whose service deduplicates on the key (and can be asked), journaled."""

    @intentlog.journaled(idempotent=True, key_retention=3600)
    def charge(amount: int, currency: str = "eur") -> dict[str, Any]:
        """Charge the card."""
        return remote.apply(intentlog.current_key(), amount, dedupe=True)

    charge.reconciler(remote.lookup)
    return charge


# -- the function keeps its own face ---------------------------------------------------------


def test_signature_name_and_doc_are_the_functions_own() -> None:
    def plain(amount: int, currency: str = "eur", *, note: str | None = None) -> dict[str, Any]:
        """Charge the card."""
        return {}

    async def plain_async(to: str, /, subject: str) -> dict[str, Any]:
        """Send a mail."""
        return {}

    for fn in (plain, plain_async):
        wrapped: Any = intentlog.journaled(idempotent=True, key_retention=60)(fn)
        assert inspect.signature(wrapped) == inspect.signature(fn)
        assert (wrapped.__name__, wrapped.__qualname__) == (fn.__name__, fn.__qualname__)
        assert (wrapped.__doc__, wrapped.__module__) == (fn.__doc__, fn.__module__)
        assert wrapped.__wrapped__ is fn
        assert inspect.iscoroutinefunction(wrapped) is inspect.iscoroutinefunction(fn)
        assert isinstance(wrapped.effect, intentlog.Effect)
        assert wrapped.effect.name == fn.__name__
    assert intentlog.journaled(plain).effect.policy.idempotent is False  # bare: no promise


def test_the_key_parameter_is_left_out_of_the_signature_callers_see() -> None:
    def send(to: str, *, idempotency_key: str = "") -> dict[str, Any]:
        return {}

    wrapped = intentlog.journaled(send)
    assert list(inspect.signature(wrapped).parameters) == ["to"]
    assert list(inspect.signature(send).parameters) == ["to", "idempotency_key"]


def test_effect_options_are_checked_as_effect_checks_them() -> None:
    with pytest.raises(TypeError, match="key_retension"):
        intentlog.journaled(idempotent=True, key_retension=60)  # type: ignore[call-overload]
    with pytest.raises(intentlog.InvalidInput, match="key_retention"):
        intentlog.journaled(idempotent=True)(lambda amount: {})

    def takes_key_by_position(idempotency_key: str, /, amount: int) -> None:
        pass

    with pytest.raises(intentlog.InvalidInput, match="'idempotency_key' receives the operation"):
        intentlog.journaled(takes_key_by_position)
    once = intentlog.journaled(key_parameter=None)(takes_key_by_position)
    for not_plain in (once, once.effect, 42):
        with pytest.raises(intentlog.InvalidInput, match="decorates a plain function"):
            intentlog.journaled(not_plain)


# -- journaled as task.run, under the current task -------------------------------------------


def test_a_call_is_journaled_as_task_run_with_the_same_key(
    journal_url: str, remote: Remote
) -> None:
    charge = deduplicated(remote)
    with intentlog.open(journal_url, max_wait=5.0) as journal:
        with journal.task("order-42") as task:
            receipt = charge(amount=500)
            assert receipt == remote.lookup(intentlog.current_task().operations()[0].key).receipt
            # The same operation, however it is called: by position, by name, or explicitly
            # through task.run with the function's effect.
            assert charge(500) == charge(500, "eur") == receipt
            assert task.run(charge.effect, amount=500) == receipt
            task.complete()
        (op,) = journal.operations("order-42")
    assert (op.state, op.receipt, op.effect) == (State.CONFIRMED, receipt, "charge")
    assert remote.count() == 1  # the service's own record: applied once


def test_the_function_gets_the_key_only_where_it_asks(journal: intentlog.Journal) -> None:
    got: list[tuple[Any, ...]] = []

    @intentlog.journaled(idempotent=True, key_retention=60)
    def plain(amount: int, **extra: Any) -> dict[str, Any]:
        got.append(("plain", amount, extra))
        return {"n": 1}

    @intentlog.journaled(idempotent=True, key_retention=60)
    def by_parameter(amount: int, idempotency_key: str = "", note: str = "") -> dict[str, Any]:
        got.append(("by_parameter", amount, idempotency_key, note, intentlog.current_key()))
        return {"n": 2}

    @intentlog.journaled(idempotent=True, key_retention=60, key_parameter="token")
    def named_token(amount: int, token: str = "") -> dict[str, Any]:
        got.append(("named_token", amount, token))
        return {"n": 3}

    @intentlog.journaled(idempotent=True, key_retention=60, key_parameter=None)
    def no_key_parameter(amount: int, idempotency_key: str) -> dict[str, Any]:
        got.append(("no_key_parameter", amount, idempotency_key))
        return {"n": 4}

    with journal.task("t") as task:
        plain(1)
        by_parameter(2, "memo")  # positional: 'memo' is note, as the caller sees the function
        named_token(amount=3)
        no_key_parameter(4, idempotency_key="the caller's own")  # an ordinary argument
        keys = {op.effect: op.key for op in task.operations()}
    assert got == [
        ("plain", 1, {}),
        ("by_parameter", 2, keys["by_parameter"], "memo", keys["by_parameter"]),
        ("named_token", 3, keys["named_token"]),
        ("no_key_parameter", 4, "the caller's own"),
    ]
    with pytest.raises(intentlog.NoCurrentTask, match=r"current_key\(\)"):
        intentlog.current_key()
    with journal.task("t"), pytest.raises(intentlog.NoCurrentTask, match=r"current_key\(\)"):
        intentlog.current_key()  # in a task, but no operation is being submitted


def test_a_caller_cannot_pass_the_key_parameter(journal: intentlog.Journal) -> None:
    @intentlog.journaled(idempotent=True, key_retention=60)
    def send(to: str, idempotency_key: str = "") -> dict[str, Any]:
        return {"to": to}

    with journal.task("t"), pytest.raises(intentlog.InvalidInput, match="idempotency_key"):
        send("a@example.com", idempotency_key="mine")  # type: ignore[call-arg]
    assert journal.operations("t") == []


def test_a_parameter_named_key_is_an_ordinary_argument(journal: intentlog.Journal) -> None:
    # An S3 object's key, say: task.run's own key= keyword is not in the way.
    @intentlog.journaled(idempotent=True, key_retention=60)
    def put_object(bucket: str, key: str) -> dict[str, Any]:
        return {"bucket": bucket, "key": key, "operation": intentlog.current_key()}

    with journal.task("t"):
        receipt = put_object("b", key="photos/1.jpg")
    assert receipt["key"] == "photos/1.jpg"
    assert receipt["operation"] == journal.operations("t")[0].key != "photos/1.jpg"


def test_with_key_sends_a_call_meant_twice_and_replays_each(
    journal: intentlog.Journal, remote: Remote
) -> None:
    charge = deduplicated(remote)
    with journal.task("t") as task:
        first = charge(amount=500)
        second = charge.with_key("order-42-second-charge")(amount=500)
        assert charge.with_key("order-42-second-charge")(amount=500) == second  # replayed
        with pytest.raises(intentlog.KeyConflict):
            charge.with_key("order-42-second-charge")(amount=9)  # a key names one call
        keys = [op.key for op in task.operations()]
    assert first != second and remote.count() == 2
    assert keys[1] == "order-42-second-charge"
    with pytest.raises(intentlog.InvalidInput, match="key"):
        charge.with_key("")


# -- outside a task: a clear error, nothing journaled or sent ---------------------------------


def test_outside_a_task_the_call_fails_clearly_and_sends_nothing(
    journal: intentlog.Journal, remote: Remote
) -> None:
    charge = deduplicated(remote)
    with pytest.raises(intentlog.NoCurrentTask) as caught:
        charge(amount=500)
    message = str(caught.value)
    assert "charge()" in message and "with journal.task(" in message
    assert "nothing was journaled or sent" in message
    with journal.task("t"):
        pass
    with pytest.raises(intentlog.NoCurrentTask):  # after the block: no task again
        charge(amount=500)
    with pytest.raises(intentlog.NoCurrentTask, match="no intentlog task is current"):
        intentlog.current_task()
    assert journal.operations() == [] and remote.count() == 0


def test_a_journaled_body_may_call_another_each_its_own_operation(
    journal: intentlog.Journal, remote: Remote
) -> None:
    charge = deduplicated(remote)
    keys: list[str] = []

    @intentlog.journaled(idempotent=True, key_retention=60)
    def checkout(amount: int) -> dict[str, Any]:
        keys.append(intentlog.current_key())
        paid = charge(amount=amount)  # an operation of the same task, while this one is sent
        keys.append(intentlog.current_key())  # this operation's key again
        return {"paid": paid["id"]}

    with journal.task("t"):
        receipt = checkout(amount=5)
        assert checkout(amount=5) == receipt  # replayed: the body does not run again
    ops = {op.effect: op for op in journal.operations("t")}
    assert keys == [ops["checkout"].key] * 2
    assert receipt == {"paid": ops["charge"].receipt["id"]} and remote.count() == 1


def test_a_task_handle_not_entered_is_not_current(journal: intentlog.Journal) -> None:
    task = journal.task("t")  # leased, but no block made it current
    try:
        with pytest.raises(intentlog.NoCurrentTask):
            intentlog.current_task()
    finally:
        task.close()


def test_nested_blocks_the_inner_task_wins_and_the_outer_comes_back(
    journal: intentlog.Journal, remote: Remote
) -> None:
    charge = deduplicated(remote)
    with journal.task("outer") as outer:
        charge(amount=1)
        with journal.task("inner") as inner:
            assert intentlog.current_task() is inner
            charge(amount=2)
        assert intentlog.current_task() is outer
        charge(amount=3)
        with pytest.raises(RuntimeError, match="boom"), journal.task("failing"):
            raise RuntimeError("boom")  # an error leaving the block restores the outer too
        assert intentlog.current_task() is outer
    placed = {op.receipt["amount"]: op.task_id for op in journal.operations()}
    assert placed == {1: "outer", 2: "inner", 3: "outer"}
    assert remote.count() == 3


def test_a_worker_runs_a_task_function_under_its_task(tmp_path: Path, remote: Remote) -> None:
    charge = deduplicated(remote)
    registry = intentlog.Registry(effects=[charge])  # a journaled function is accepted as is
    assert registry.effects == {"charge": charge.effect}

    @registry.task("order")
    def order(task: intentlog.Task, input: Any) -> None:
        assert intentlog.current_task() is task
        charge(amount=input["amount"])

    with intentlog.open(tmp_path / "j.db") as journal:
        journal.start("order", "order-7", {"amount": 70})
        worker = intentlog.Worker(journal, registry)
        assert worker.run_once() and worker.completed == 1
        (op,) = journal.operations("order-7")
    assert op.state is State.CONFIRMED and remote.count() == 1


def test_the_cli_finds_the_effects_of_journaled_functions(tmp_path: Path) -> None:
    (tmp_path / "billing_fns.py").write_text(
        "import intentlog\n\n"
        "@intentlog.journaled(idempotent=True, key_retention=60)\n"
        "def refund(amount: int) -> dict:\n"
        "    return {'amount': amount}\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        (found,) = load_effects(["billing_fns"])
        assert found.name == "refund"
        assert load_effects(["billing_fns:refund"]) == [found]
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("billing_fns", None)


# -- threads: a task is current only in the thread that opened it -----------------------------


def test_a_task_does_not_leak_into_another_thread(
    journal: intentlog.Journal, remote: Remote
) -> None:
    charge = deduplicated(remote)
    seen: list[BaseException | None] = []

    def call() -> None:
        try:
            charge(amount=1)
            seen.append(None)
        except intentlog.NoCurrentTask as exc:
            seen.append(exc)

    with journal.task("t"):
        thread = threading.Thread(target=call)
        thread.start()
        thread.join()
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pool.submit(call).result()
    assert len(seen) == 2 and all(isinstance(e, intentlog.NoCurrentTask) for e in seen)
    assert journal.operations() == [] and remote.count() == 0


def test_threads_each_with_a_task_of_their_own_stay_apart(tmp_path: Path, remote: Remote) -> None:
    charge = deduplicated(remote)
    both_inside = threading.Barrier(2, timeout=30)
    errors: list[BaseException] = []

    def worker(task_id: str, amount: int) -> None:
        try:
            with intentlog.open(tmp_path / "j.db") as journal, journal.task(task_id):
                both_inside.wait()  # both blocks are open at once before either calls
                charge(amount=amount)
                both_inside.wait()
                assert intentlog.current_task().id == task_id
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(f"t{i}", i)) for i in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    with intentlog.open(tmp_path / "j.db") as journal:
        placed = {op.task_id: op.receipt["amount"] for op in journal.operations()}
    assert placed == {"t1": 1, "t2": 2} and remote.count() == 2


# -- asyncio ---------------------------------------------------------------------------------


def async_charge(remote: Remote) -> Any:
    @intentlog.journaled(idempotent=True, key_retention=3600)
    async def charge(amount: int, *, idempotency_key: str = "") -> dict[str, Any]:
        """Charge the card, on the loop."""
        await asyncio.sleep(0)
        return remote.apply(idempotency_key, amount, dedupe=True)

    charge.reconciler(remote.lookup)
    return charge


def test_an_async_function_is_awaited_under_async_with(journal_url: str, remote: Remote) -> None:
    charge = async_charge(remote)

    async def main() -> tuple[Any, list[intentlog.Operation]]:
        async with intentlog.open_async(journal_url, max_wait=5.0) as journal:
            async with journal.task("order-42") as task:
                assert intentlog.current_task() is task
                receipt = await charge(amount=500)
                assert await charge(500) == receipt  # the same operation: replayed
                assert await task.run(charge.effect, amount=500) == receipt
                await task.complete()
            with pytest.raises(intentlog.NoCurrentTask, match=r"charge\(\)"):
                await charge(amount=500)
            return receipt, await journal.operations("order-42")

    receipt, (op,) = asyncio.run(main())
    assert (op.state, op.receipt) == (State.CONFIRMED, receipt)
    assert remote.count() == 1


def test_asyncio_tasks_see_only_the_task_of_the_block_they_started_in(
    tmp_path: Path, remote: Remote
) -> None:
    charge = async_charge(remote)

    async def main() -> dict[str, Any]:
        outcome: dict[str, Any] = {}
        async with intentlog.open_async(tmp_path / "j.db") as journal:
            opened = asyncio.Event()
            done = asyncio.Event()

            async def started_before() -> None:
                await opened.wait()  # runs while the block below is open, in its own context
                try:
                    outcome["before"] = await charge(amount=1)
                except Exception as exc:
                    outcome["before"] = exc
                finally:
                    done.set()

            async def own_block(task_id: str, amount: int) -> None:
                async with journal.task(task_id):
                    await opened.wait()
                    outcome[task_id] = await charge(amount=amount)

            before = asyncio.create_task(started_before())
            async with journal.task("t") as task:
                others = asyncio.gather(own_block("a", 2), own_block("b", 3))
                opened.set()
                await done.wait()
                # A child task created inside the block starts with a copy of its context.
                child = asyncio.create_task(charge(amount=4))
                outcome["child"] = await child
                assert intentlog.current_task() is task
                await others
                late = asyncio.Event()

                async def outlives_the_block() -> None:
                    await late.wait()
                    try:
                        outcome["late"] = await charge(amount=5)
                    except Exception as exc:
                        outcome["late"] = exc

                left_over = asyncio.create_task(outlives_the_block())
            late.set()
            await asyncio.gather(before, left_over)
            outcome["ops"] = {
                op.receipt["amount"]: op.task_id
                for op in await journal.operations()
                if op.receipt is not None
            }
        return outcome

    outcome = asyncio.run(main())
    assert isinstance(outcome["before"], intentlog.NoCurrentTask)
    assert outcome["ops"] == {2: "a", 3: "b", 4: "t"}
    # A task created in the block and still running after it: the lease was given back.
    assert isinstance(outcome["late"], intentlog.InvalidInput)
    assert "handle is closed" in str(outcome["late"])
    assert remote.count() == 3


def test_a_plain_function_under_an_async_task_runs_from_a_thread(
    journal_url: str, remote: Remote
) -> None:
    in_body: list[Any] = []

    @intentlog.journaled(idempotent=True, key_retention=3600)
    def charge(amount: int) -> dict[str, Any]:
        # The body runs in the journal's thread pool: the key answers, the task is not current.
        try:
            in_body.append(intentlog.current_task())
        except intentlog.NoCurrentTask as exc:
            in_body.append(exc)
        return remote.apply(intentlog.current_key(), amount, dedupe=True)

    async def main() -> tuple[Any, Any, list[intentlog.Operation]]:
        async with intentlog.open_async(journal_url) as journal:
            async with journal.task("t"):
                with pytest.raises(intentlog.InvalidInput, match="to_thread") as on_loop:
                    charge(amount=1)  # on the loop it would block it: refused, nothing sent
                receipt = await asyncio.to_thread(charge, amount=2)
                assert await asyncio.to_thread(charge, amount=2) == receipt  # replayed
            return on_loop.value, receipt, await journal.operations("t")

    error, receipt, ops = asyncio.run(main())
    assert "nothing was journaled or sent" in str(error)
    assert [(op.state, op.receipt) for op in ops] == [(State.CONFIRMED, receipt)]
    assert remote.count() == 1 and receipt["amount"] == 2
    assert remote.lookup(ops[0].key).receipt == receipt  # sent with the operation's key
    assert len(in_body) == 1 and isinstance(in_body[0], intentlog.NoCurrentTask)


def test_an_async_function_under_a_sync_task_is_refused(
    journal: intentlog.Journal, remote: Remote
) -> None:
    charge = async_charge(remote)
    with journal.task("t"), pytest.raises(intentlog.InvalidInput, match="needs an async task"):
        asyncio.run(charge(amount=1))
    assert journal.operations() == [] and remote.count() == 0


# -- a crash: the replay gives the recorded receipt -------------------------------------------


def run_child(
    url: str, remote: Remote, kind: str, mode: str, crash: str | None = None
) -> subprocess.CompletedProcess[str]:
    # tests/ for remote.py, before whatever the caller's path already held.
    path = os.pathsep.join(p for p in (str(SUPPORT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    env.pop("INTENTLOG_CRASH", None)
    if crash:
        env["INTENTLOG_CRASH"] = crash
    return subprocess.run(
        [sys.executable, str(SUPPORT / "ambient_child.py"), url, remote.path, kind, mode],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(params=["sync", "async"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.mark.parametrize("kind", ["reconcilable", "dedupe"])
def test_killed_after_the_service_applied_it_the_rerun_returns_its_receipt(
    journal_url: str, remote: Remote, mode: str, kind: str
) -> None:
    first = run_child(journal_url, remote, kind, mode, "after_remote_commit")
    assert first.returncode == -signal.SIGKILL, first.stderr
    assert remote.count() == 1  # the service applied it; the receipt was not written

    second = run_child(journal_url, remote, kind, mode)
    assert second.returncode == 0, second.stderr
    receipt = json.loads(second.stdout)
    assert remote.count() == 1, "the effect was applied twice"
    assert receipt["id"] == remote.ids()[0]  # the service's own record of the one charge
    with intentlog.open(journal_url) as journal:
        (op,) = journal.operations("order-1")
    assert (op.state, op.receipt) == (State.CONFIRMED, receipt)


def test_killed_after_the_receipt_the_rerun_sends_nothing(
    journal_url: str, remote: Remote, mode: str
) -> None:
    first = run_child(journal_url, remote, "neither", mode, "after_confirm")
    assert first.returncode == -signal.SIGKILL, first.stderr
    second = run_child(journal_url, remote, "neither", mode)
    assert second.returncode == 0, second.stderr
    assert json.loads(second.stdout)["id"] == remote.ids()[0]
    assert remote.count() == 1


def test_killed_in_flight_to_a_service_that_can_do_neither_is_unresolved(
    tmp_path: Path, remote: Remote, mode: str
) -> None:
    url = str(tmp_path / "journal.db")
    first = run_child(url, remote, "neither", mode, "after_remote_commit")
    assert first.returncode == -signal.SIGKILL, first.stderr
    second = run_child(url, remote, "neither", mode)
    assert second.returncode == 3, second.stderr  # UNRESOLVED: never a blind resend
    assert remote.count() == 1
