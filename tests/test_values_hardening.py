"""Values on their way into the journal: receipts that cannot be kept, texts no store takes,
values nested too deep, and notes that hold credentials. On SQLite and PostgreSQL, with the
reference service's own record counting what was applied."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import intentlog
from intentlog._hygiene import check_text, describe, reduce_receipt, scrub_text, storable
from intentlog._keys import MAX_DEPTH, canonical_json, nested_deeper
from intentlog.cli import cli
from intentlog.testing import ReferenceService, payment_effect

State = intentlog.State


@pytest.fixture
def service(tmp_path: Path) -> Iterator[ReferenceService]:
    with ReferenceService("both", db_path=tmp_path / "service.db") as svc:
        yield svc


def nested(depth: int, leaf: Any = 1) -> Any:
    """A list nested ``depth`` levels deep around ``leaf``."""
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


def nested_dicts(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = {"child": value}
    return value


class BadRepr:
    def __repr__(self) -> str:
        raise RuntimeError("no repr for you")

    __str__ = __repr__


class RaisingMapping(dict[str, Any]):
    """A dict whose items() (what the JSON encoder asks a dict subclass for) raises."""

    def items(self) -> Any:
        raise RuntimeError("items are gone")

    def __repr__(self) -> str:
        raise RuntimeError("and so is repr")


def circular() -> Any:
    value: list[Any] = []
    value.append(value)
    return value


class Calls:
    """How often submit was called, per key (the service's record counts applications)."""

    def __init__(self) -> None:
        self.keys: list[str] = []


def reshaped(
    service: ReferenceService, name: str, shape: Callable[[], Any], calls: Calls, **options: Any
) -> intentlog.Effect:
    """An effect that really pays at the reference service, then answers with ``shape()``."""
    pay = payment_effect(service.url, "both", name=name)

    def submit(key: str, amount: int) -> Any:
        calls.keys.append(key)
        pay.submit(key, amount=amount)  # applied and committed by the service
        return shape()

    return intentlog.Effect(name, submit, idempotent=True, key_retention=3600, **options)


# -- 1. a receipt that cannot be described costs nothing ---------------------------------------

BAD_RECEIPTS: dict[str, Callable[[], Any]] = {
    "nested-5000": lambda: nested(5000),
    "dicts-150": lambda: nested_dicts(150),
    "int-5000-digits": lambda: {"n": 10**5000},
    "repr-raises": BadRepr,
    "repr-raises-inside": lambda: {"id": "x", "obj": BadRepr()},
    "tuple-keys": lambda: {(1, 2): "a"},
    "circular": circular,
    "items-raise": lambda: RaisingMapping(id="x"),
    "nan": lambda: {"amount": float("nan")},
}


@pytest.mark.parametrize("lazy", [False, True], ids=["eager", "lazy"])
@pytest.mark.parametrize("shape", list(BAD_RECEIPTS), ids=list(BAD_RECEIPTS))
def test_a_receipt_that_cannot_be_kept_still_confirms(
    journal_url: str, service: ReferenceService, shape: str, lazy: bool
) -> None:
    calls = Calls()
    effect = reshaped(service, "charge", BAD_RECEIPTS[shape], calls, lazy_receipt=lazy)
    with intentlog.open(journal_url) as journal:
        with journal.task("order-1") as task:
            with pytest.warns(intentlog.ReceiptWarning):
                first = task.run(effect, amount=5)
            assert isinstance(first, dict) and "intentlog_note" in first
            assert first["type"]
        (op,) = journal.operations("order-1")
        assert op.state is State.CONFIRMED
        assert op.receipt == first
        with journal.task("order-1") as task:  # a replay: the stored note, nothing sent
            assert task.run(effect, amount=5) == first
    assert calls.keys == [op.key]
    assert service.truth() == {op.key: 1}


def test_the_note_says_what_it_can(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        deep, _, dropped = reduce_receipt(nested_dicts(150), effect="e", max_bytes=1 << 16)
        assert deep["intentlog_note"] == f"receipt nested more than {MAX_DEPTH} levels deep and " \
            "was not stored"  # fmt: skip
        assert deep["bytes"] > 0 and len(deep["sha256"]) == 64
        assert len(dropped) == 1 and "levels deep" in dropped[0]
        not_json, text, _ = reduce_receipt({"n": 10**5000}, effect="e", max_bytes=1 << 16)
    assert not_json["type"] == "dict" and "4300" in not_json["error"]
    assert "repr_sha256" not in not_json  # its repr fails too: no digest, and no error raised
    assert json.loads(text) == not_json
    obj, _, _ = reduce_receipt(object(), effect="e", max_bytes=1 << 16)
    assert len(obj["repr_sha256"]) == 64


def test_a_receipt_warning_made_an_error_still_leaves_it_confirmed(
    journal_url: str, service: ReferenceService
) -> None:
    """A test suite that turns ReceiptWarning into an error sees the error, and the journal
    still has the confirmation: the warning comes once the receipt is durable."""
    calls = Calls()
    effect = reshaped(service, "charge", BadRepr, calls)
    with intentlog.open(journal_url) as journal:
        with journal.task("order-1") as task, warnings.catch_warnings():
            warnings.simplefilter("error", intentlog.ReceiptWarning)
            with pytest.raises(intentlog.ReceiptWarning):
                task.run(effect, amount=5)
        (op,) = journal.operations("order-1")
        assert op.state is State.CONFIRMED and "intentlog_note" in op.receipt
        with journal.task("order-1") as task:
            assert task.run(effect, amount=5) == op.receipt
    assert service.truth() == {op.key: 1} and len(calls.keys) == 1


def test_a_bad_receipt_found_by_a_lookup_still_confirms(
    journal_url: str, service: ReferenceService
) -> None:
    pay = payment_effect(service.url, "both", name="charge")
    sent: list[str] = []

    def submit(key: str, amount: int) -> Any:
        sent.append(key)
        pay.submit(key, amount=amount)
        raise ConnectionResetError("the answer was lost")

    def reconcile(key: str) -> Any:
        assert pay.reconcile is not None
        found = pay.reconcile(key)
        return intentlog.Found(nested(5000)) if isinstance(found, intentlog.Found) else found

    effect = intentlog.Effect("charge", submit, reconcile=reconcile, timeout=5)
    with intentlog.open(journal_url) as journal, journal.task("order-1") as task:
        with pytest.warns(intentlog.ReceiptWarning, match="levels deep"):
            first = task.run(effect, amount=5)
        (op,) = journal.operations("order-1")
        assert op.state is State.CONFIRMED and op.receipt == first and "intentlog_note" in first
    assert service.truth() == {op.key: 1} and sent == [op.key]


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no str")

    def __repr__(self) -> str:
        raise RuntimeError("no repr")


def test_a_receipt_selector_that_raises_the_unprintable(
    journal_url: str, service: ReferenceService
) -> None:
    def selector(result: Any) -> Any:
        raise Unprintable()

    calls = Calls()
    effect = reshaped(service, "charge", lambda: {"id": "x"}, calls, receipt=selector)
    with intentlog.open(journal_url) as journal, journal.task("order-1") as task:
        with pytest.warns(intentlog.ReceiptWarning, match="Unprintable"):
            first = task.run(effect, amount=5)
        (op,) = journal.operations("order-1")
        assert op.state is State.CONFIRMED and op.receipt == first
        assert first == {"intentlog_note": "receipt selector raised Unprintable"}
    assert service.truth() == {op.key: 1}


# -- 2. every text is storable, so a definite refusal is never lost ----------------------------

HOSTILE = "card declined \ud800 by \udcff issuer\x00 (code 51)"
CLEANED = "card declined \\ud800 by \\udcff issuer\\x00 (code 51)"


class UnprintableRejection(intentlog.Rejected):
    def __str__(self) -> str:
        raise RuntimeError("no str")


@pytest.mark.parametrize(
    "refusal",
    [
        lambda: intentlog.Rejected(HOSTILE),
        lambda: intentlog.KeyConflict(HOSTILE),
        lambda: UnprintableRejection("never shown"),
    ],
    ids=["rejected", "key-conflict", "str-raises"],
)
def test_a_refusal_with_unstorable_text_is_failed_and_replayed(
    journal_url: str, refusal: Callable[[], intentlog.Error]
) -> None:
    sent: list[str] = []

    def submit(key: str) -> Any:
        sent.append(key)
        raise refusal()

    effect = intentlog.Effect("charge", submit, idempotent=True, key_retention=intentlog.FOREVER)
    error_type = type(refusal())
    replayed: type[intentlog.Error] = intentlog.Rejected
    if error_type is intentlog.KeyConflict:
        replayed = intentlog.KeyConflict  # a replay raises what the first run raised
    with intentlog.open(journal_url) as journal:
        with journal.task("order-1") as task, pytest.raises(error_type):
            task.run(effect)
        (op,) = journal.operations("order-1")
        assert op.state is State.FAILED
        message = op.error["message"]
        if error_type is UnprintableRejection:
            assert message == "<UnprintableRejection that cannot be shown as text>"
        else:
            assert message == CLEANED
        with (
            journal.task("order-1") as task,
            pytest.raises(replayed) as replay,
        ):
            task.run(effect)
        assert message in str(replay.value) and "FAILED" in str(replay.value)
        assert journal.pending() == []
    assert sent == [op.key]  # a definite "not applied" is never sent again


@pytest.mark.parametrize("how", ["indeterminate", "lookup-raises"])
def test_an_unresolved_note_from_hostile_lookup_text_is_stored(journal_url: str, how: str) -> None:
    def submit(key: str) -> Any:
        raise ConnectionResetError("answer lost")

    def reconcile(key: str) -> Any:
        if how == "indeterminate":
            return intentlog.Indeterminate(HOSTILE)
        raise LookupError(HOSTILE)

    effect = intentlog.Effect("charge", submit, reconcile=reconcile)
    with intentlog.open(journal_url, lookup_limit=1) as journal:
        with journal.task("order-1") as task, pytest.raises(intentlog.OutcomeUnknown):
            task.run(effect)
        (op,) = journal.operations("order-1")
        assert op.state is State.UNRESOLVED
        assert op.note is not None and CLEANED in op.note
        (pending,) = journal.pending()
        assert pending.next_action is intentlog.Action.ESCALATE


def test_a_task_failure_with_unstorable_text_is_recorded(journal_url: str) -> None:
    registry = intentlog.Registry()

    @registry.task("hostile")
    def hostile(task: intentlog.Task, input: Any) -> None:
        raise ValueError(HOSTILE)

    with intentlog.open(journal_url) as journal:
        journal.start("hostile", "job-1", {"n": 1})
        worker = intentlog.Worker(journal, registry, poll=0.01)
        assert worker.run_once() is True
        (record,) = journal.tasks()
        assert record.last_error == f"ValueError: {CLEANED}"
        assert worker.failed == 1


def test_scrub_text_is_total_and_storable() -> None:
    assert storable(HOSTILE) == CLEANED
    assert storable("plain é ✓") == "plain é ✓"
    assert scrub_text(HOSTILE + " Bearer abcdefgh123456") == CLEANED + " Bearer ***"
    assert scrub_text(HOSTILE * 500, limit=100).endswith("...")
    assert len(scrub_text(HOSTILE * 500, limit=100)) == 100
    assert describe(Unprintable()) == "<Unprintable that cannot be shown as text>"
    assert scrub_text(Unprintable()) == "<Unprintable that cannot be shown as text>"  # type: ignore[arg-type]


# -- 3. a first run and a replay see the same value --------------------------------------------

ODD = {1: ("a", 2), "t": (1, (2, 3)), None: True, 2.5: [()]}
STORED = {"1": ["a", 2], "t": [1, [2, 3]], "null": True, "2.5": [[]]}


@pytest.mark.parametrize("lazy", [False, True], ids=["eager", "lazy"])
def test_first_run_and_replay_return_the_stored_value(
    journal_url: str, service: ReferenceService, lazy: bool
) -> None:
    calls = Calls()
    effect = reshaped(service, "charge", lambda: dict(ODD), calls, lazy_receipt=lazy)
    with intentlog.open(journal_url) as journal:
        with journal.task("order-1") as task:
            first = task.run(effect, amount=5)
            assert first == STORED and type(first["t"]) is list
            first["t"].append("changed by the caller")  # must not change what is written
            task.checkpoint(next_step="ship")  # a lazy receipt is written here
        (op,) = journal.operations("order-1")
        with journal.task("order-1") as task:
            replay = task.run(effect, amount=5)
    assert op.receipt == STORED and replay == STORED
    assert service.truth() == {op.key: 1} and len(calls.keys) == 1


def test_a_receipt_found_by_a_lookup_is_the_stored_value(
    journal_url: str, service: ReferenceService
) -> None:
    pay = payment_effect(service.url, "both", name="charge")

    def submit(key: str, amount: int) -> Any:
        pay.submit(key, amount=amount)
        raise ConnectionResetError("the answer was lost")

    def reconcile(key: str) -> Any:
        return intentlog.Found(dict(ODD))

    effect = intentlog.Effect("charge", submit, reconcile=reconcile, timeout=5)
    with intentlog.open(journal_url) as journal:
        with journal.task("order-1") as task:
            first = task.run(effect, amount=5)
        with journal.task("order-1") as task:
            assert task.run(effect, amount=5) == first == STORED
        (op,) = journal.operations("order-1")
        assert op.receipt == STORED
    assert service.truth() == {op.key: 1}


def test_a_plain_receipt_is_returned_as_an_equal_new_value() -> None:
    plain = {"id": "ch_1", "ok": True, "n": [1, 2.5, None], "name": "zoë"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        stored, text, dropped = reduce_receipt(plain, effect="e", max_bytes=1000)
    assert stored == plain and stored is not plain and dropped == []
    assert text == json.dumps(plain, ensure_ascii=False, separators=(",", ":"))


# -- 4. nesting is bounded ---------------------------------------------------------------------


@pytest.mark.parametrize("depth", [MAX_DEPTH + 50, 5000])
def test_deep_arguments_are_refused_before_anything_is_written(
    journal_url: str, depth: int
) -> None:
    sent: list[str] = []
    effect = intentlog.Effect(
        "charge",
        lambda key, data: sent.append(key),
        idempotent=True,
        key_retention=intentlog.FOREVER,
    )
    with intentlog.open(journal_url) as journal:
        with journal.task("order-1") as task:
            with pytest.raises(intentlog.InvalidInput) as refused:
                task.run(effect, data=nested(depth))
            assert "arguments of effect 'charge'" in str(refused.value)
            assert f"{MAX_DEPTH} levels" in str(refused.value)
            with pytest.raises(intentlog.InvalidInput, match="arguments of effect 'charge'"):
                task.plan(effect, data=nested(depth))
            task.run(effect, data=nested(MAX_DEPTH - 2))  # within the bound: fine
        assert [op.state for op in journal.operations("order-1")] == [State.CONFIRMED]
    assert len(sent) == 1


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 5000])
def test_deep_state_is_refused_and_the_checkpoint_stays(journal_url: str, depth: int) -> None:
    with intentlog.open(journal_url) as journal:
        with journal.task("order-1") as task:
            task.checkpoint(next_step="pay", state={"ok": nested(MAX_DEPTH - 1)})
            with pytest.raises(intentlog.InvalidInput, match=f"state nests more than {MAX_DEPTH}"):
                task.checkpoint(next_step="ship", state=nested(depth))
            with pytest.raises(intentlog.InvalidInput, match="state nests"):
                task.complete(state=nested(depth))
        with journal.task("order-1") as task:
            assert task.next_step == "pay" and task.state == {"ok": nested(MAX_DEPTH - 1)}


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 5000])
def test_deep_task_input_is_refused(journal_url: str, depth: int) -> None:
    with intentlog.open(journal_url) as journal:
        with pytest.raises(intentlog.InvalidInput, match=f"input nests more than {MAX_DEPTH}"):
            journal.start("order", "order-1", nested(depth))
        assert journal.tasks() == []
        assert journal.start("order", "order-2", nested(MAX_DEPTH)) is True


def test_a_deep_receipt_from_an_operator_is_refused(journal_url: str) -> None:
    def submit(key: str) -> Any:
        raise ConnectionResetError("answer lost")

    with intentlog.open(journal_url) as journal:
        with journal.task("mail-1") as task, pytest.raises(intentlog.OutcomeUnknown):
            task.run(intentlog.Effect("mail", submit))
        (op,) = journal.operations("mail-1")
        with pytest.raises(intentlog.InvalidInput, match="receipt nests"):
            journal.resolve(op.key, "confirmed", receipt=nested(5000), accept_risk=True)
        assert journal.operation(op.key) == op and journal.resolutions(op.key) == []


def test_the_depth_bound_itself() -> None:
    assert not nested_deeper(nested(MAX_DEPTH), MAX_DEPTH, 10_000)
    assert nested_deeper(nested(MAX_DEPTH + 1), MAX_DEPTH, 10_000)
    assert not nested_deeper({"a": [1, {"b": 2}], "c": "x" * 500}, MAX_DEPTH, 600)
    assert canonical_json(nested(MAX_DEPTH)) == "[" * MAX_DEPTH + "1" + "]" * MAX_DEPTH
    with pytest.raises(intentlog.InvalidInput, match="x nests more than"):
        canonical_json({"a": nested(MAX_DEPTH)}, what="x")


# -- 5. a resolve note passes the hygiene of state ---------------------------------------------

SECRET_NOTES = [
    "Bearer abc123def456ghi789",
    "seen in the dashboard; the call used Bearer 9f8e7d6c5b4a3f2e",
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PSR5L",
    "checked with password: hunter22",
    "db was postgresql://ops:s3cr3t@db.internal/pay",
    "refunded with sk_live_abcdefgh12345678",
]
FINE_NOTES = [
    "token rotation done, see ticket 42",
    "seen in the dashboard",
    "basic check passed\nby ops",
    "max_tokens limit hit",
]


def make_unresolved(journal: intentlog.Journal) -> intentlog.Operation:
    def submit(key: str) -> Any:
        raise ConnectionResetError("connection lost before the reply")

    with journal.task("mail-1") as task, pytest.raises(intentlog.OutcomeUnknown):
        task.run(intentlog.Effect("mail", submit))
    (op,) = journal.operations("mail-1")
    assert op.state is State.UNRESOLVED
    return op


@pytest.mark.parametrize("note", SECRET_NOTES)
def test_a_note_with_a_credential_is_refused(journal_url: str, note: str) -> None:
    with intentlog.open(journal_url) as journal:
        op = make_unresolved(journal)
        for outcome in ("confirmed", "failed", "retry"):
            with pytest.raises(intentlog.UnsafeValue) as refused:
                journal.resolve(op.key, outcome, note=note, accept_risk=True)
            assert refused.value.path == "note" and refused.value.key == op.key
            assert "credential" in str(refused.value) and note not in str(refused.value)
        assert journal.operation(op.key) == op and journal.resolutions(op.key) == []


@pytest.mark.parametrize("note", FINE_NOTES)
def test_an_ordinary_note_is_kept(journal_url: str, note: str) -> None:
    with intentlog.open(journal_url) as journal:
        op = make_unresolved(journal)
        assert journal.resolve(op.key, "failed", note=note, accept_risk=True).note == note
        assert journal.resolutions(op.key)[0].note == note


def test_a_note_that_is_not_text_is_refused(journal_url: str) -> None:
    with intentlog.open(journal_url) as journal:
        op = make_unresolved(journal)
        with pytest.raises(intentlog.InvalidInput, match=r"note holds \\udcff at position 5"):
            journal.resolve(op.key, "retry", note="seen \udcff", accept_risk=True)
        assert journal.operation(op.key) == op and journal.resolutions(op.key) == []


def test_the_cli_refuses_a_credential_note(journal_url: str) -> None:
    with intentlog.open(journal_url) as journal:
        op = make_unresolved(journal)
    note = "paid, auth header was Bearer 9f8e7d6c5b4a3f2e1d0c"
    argv = ["--db", journal_url, "resolve", op.key, "--confirmed", "--note", note]
    result = CliRunner().invoke(cli, argv, prog_name="intentlog")
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert result.exit_code == 1
    assert result.stderr.startswith("error: note looks like it holds a credential")
    assert "9f8e7d6c5b4a3f2e1d0c" not in result.output
    shown = CliRunner().invoke(cli, ["--db", journal_url, "show", "mail-1", "--json"])
    assert shown.exit_code == 0 and "9f8e7d6c5b4a3f2e1d0c" not in shown.output
    with intentlog.open(journal_url) as journal:
        assert journal.operation(op.key) == op and journal.resolutions(op.key) == []


def test_check_text_directly() -> None:
    assert check_text("all good", what="note") == "all good"
    with pytest.raises(intentlog.InvalidInput, match=r"\\x00"):
        check_text("a\x00b", what="note")


# -- the async journal runs the same protocol ---------------------------------------------------


def test_the_async_journal_keeps_bad_receipts_and_hostile_refusals(journal_url: str) -> None:
    import asyncio

    async def deep(key: str) -> Any:
        return nested(5000)

    async def odd(key: str) -> Any:
        return dict(ODD)

    async def refuse(key: str) -> Any:
        raise intentlog.Rejected(HOSTILE)

    effects = [
        intentlog.Effect(f.__name__, f, idempotent=True, key_retention=intentlog.FOREVER)
        for f in (deep, odd, refuse)
    ]

    async def main() -> None:
        async with intentlog.open_async(journal_url) as journal:
            for replay in (False, True):
                async with journal.task("order-1") as task:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore", intentlog.ReceiptWarning)
                        assert "intentlog_note" in await task.run(effects[0])
                    assert await task.run(effects[1]) == STORED
                    with pytest.raises(intentlog.Rejected) as refused:
                        await task.run(effects[2])
                    assert (CLEANED in str(refused.value)) is replay  # the stored message
            states = [op.state for op in await journal.operations("order-1")]
            assert states == [State.CONFIRMED, State.CONFIRMED, State.FAILED]

    asyncio.run(main())


# -- names that no store can keep as text -------------------------------------------------

UNSTORABLE_NAMES = ["bad\ud800name", "nul\x00name", "tab\tname", " padded", ""]


@pytest.mark.parametrize("name", UNSTORABLE_NAMES)
def test_an_effect_name_that_cannot_be_stored_is_refused(name: str) -> None:
    with pytest.raises(intentlog.InvalidInput, match="effect name"):
        intentlog.Effect(name, lambda key: {"id": 1})


@pytest.mark.parametrize("kind", UNSTORABLE_NAMES)
def test_a_task_kind_that_cannot_be_stored_is_refused(journal_url: str, kind: str) -> None:
    with intentlog.open(journal_url) as journal:
        with pytest.raises(intentlog.InvalidInput, match="task kind"):
            journal.start(kind, "order-9", {"n": 1})
        assert journal.tasks() == []  # nothing was written


@pytest.mark.parametrize("step", ["ship\ud800", "ship\x00", "ship\n"])
def test_a_next_step_that_cannot_be_stored_is_refused(journal_url: str, step: str) -> None:
    with intentlog.open(journal_url) as journal:
        with journal.task("order-1") as task:
            task.checkpoint(next_step="pack")
            with pytest.raises(intentlog.InvalidInput, match="next_step"):
                task.checkpoint(next_step=step)
        assert journal.task_info("order-1").record.next_step == "pack"


@pytest.mark.parametrize("option", ["--receipt", "--input"])
def test_the_cli_refuses_json_nested_beyond_the_parser(tmp_path: Path, option: str) -> None:
    deep = "[" * 20_000 + "]" * 20_000  # far beyond the JSON parser's recursion
    db = str(tmp_path / "journal.db")
    with intentlog.open(db):
        pass
    args = (
        ["resolve", "some-key", "--confirmed", "--receipt", deep]
        if option == "--receipt"
        else ["start", "order", "order-1", "--input", deep]
    )
    proc = subprocess.run(
        [sys.executable, "-m", "intentlog.cli", "--db", db, *args],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert f"{option} is nested too deeply" in proc.stderr and "Traceback" not in proc.stderr
