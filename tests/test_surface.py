"""The public surface's spellings, one per idea on every entry point: resolve's outcomes,
task.info(), Recovered.next_action, receipt= and key_retention=."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import intentlog
from intentlog import Action, Outcome, State
from intentlog.integrations.http import async_http_effect, http_effect
from intentlog.testing import ReferenceService, payment_effect


@pytest.fixture
def service(tmp_path: Path) -> Iterator[ReferenceService]:
    with ReferenceService("both", db_path=tmp_path / "service.db") as svc:
        yield svc


def unresolved(journal: intentlog.Journal, task_id: str = "t") -> str:
    """The key of a new UNRESOLVED operation (an ambiguous error on an effect that can
    neither deduplicate nor be asked)."""

    def mail(key: str) -> None:
        raise TimeoutError("no answer from the relay")

    with journal.task(task_id) as task, pytest.raises(intentlog.OutcomeUnknown) as caught:
        task.run(intentlog.Effect("mail", mail))
    assert caught.value.key is not None
    return caught.value.key


# -- resolve: an Outcome or its string -------------------------------------------------------


def test_outcome_is_a_str_enum_of_the_three_resolutions() -> None:
    assert [o.value for o in Outcome] == ["confirmed", "failed", "retry"]
    assert Outcome.RETRY == "retry" and Outcome("failed") is Outcome.FAILED
    assert "Outcome" in intentlog.__all__


@pytest.mark.parametrize("outcome", [Outcome.CONFIRMED, "confirmed"])
def test_resolve_takes_an_outcome_or_its_string(journal: intentlog.Journal, outcome: Any) -> None:
    key = unresolved(journal)
    op = journal.resolve(
        key, outcome, receipt={"id": "m-1"}, note="seen in the relay's log", accept_risk=True
    )
    assert (op.state, op.receipt) == (State.CONFIRMED, {"id": "m-1"})
    (audit,) = journal.resolutions(key)
    assert audit.to_state is State.CONFIRMED


def test_resolve_refuses_an_outcome_that_is_none_of_them(journal: intentlog.Journal) -> None:
    key = unresolved(journal)
    with pytest.raises(intentlog.InvalidInput, match="outcome must be one of"):
        journal.resolve(key, "done", accept_risk=True)  # type: ignore[arg-type]  # the point: not an Outcome
    assert journal.operation(key).state is State.UNRESOLVED


def test_async_resolve_takes_an_outcome(tmp_path: Path) -> None:
    with intentlog.open(tmp_path / "j.db") as journal:
        key = unresolved(journal)

    async def main() -> None:
        async with intentlog.open_async(tmp_path / "j.db") as journal:
            op = await journal.resolve(
                key, Outcome.RETRY, note="not in the relay's log", accept_risk=True
            )
            assert op.state is State.PLANNED

    asyncio.run(main())


# -- task.info(): the task's next action is read by a method -----------------------------------


def test_task_info_is_the_journal_s_task_info(journal: intentlog.Journal) -> None:
    noop = intentlog.Effect(
        "noop", lambda key: {"id": key}, idempotent=True, key_retention=intentlog.FOREVER
    )
    with journal.task("t") as task:
        assert task.info().next_action is Action.RESUME
        task.plan(noop)
        info = task.info()
        assert info.next_action is Action.SUBMIT
        assert info == journal.task_info("t")
        task.run(noop)
        task.complete()
        assert task.info().next_action is None


def test_async_task_info_is_the_journal_s_task_info(tmp_path: Path) -> None:
    async def main() -> None:
        async with intentlog.open_async(tmp_path / "j.db") as journal, journal.task("t") as task:
            await task.checkpoint(next_step="ship")
            info = await task.info()
            assert info.next_action is Action.RESUME
            assert info == await journal.task_info("t")

    asyncio.run(main())


# -- Recovered.next_action, as on Pending and TaskInfo -----------------------------------------


def test_recovered_names_its_action_next_action(tmp_path: Path) -> None:
    def charge(key: str, amount: int) -> None:
        raise TimeoutError("no answer")

    # Deduplicating, with a long request deadline: the ambiguous send waits (StillInFlight).
    effect = intentlog.Effect("charge", charge, idempotent=True, key_retention=3600, timeout=60)
    with intentlog.open(tmp_path / "j.db", max_wait=0, attempts_per_run=1) as journal:
        with journal.task("t") as task, pytest.raises(intentlog.StillInFlight):
            task.run(effect, amount=1)
        (report,) = journal.recover([effect])
    assert (report.state, report.next_action) == (State.SUBMITTED, Action.WAIT)
    assert not hasattr(report, "action")


# -- http_effect(receipt=...), as on Effect ---------------------------------------------------


def charge_once(path: Path, effect: intentlog.Effect) -> Any:
    with intentlog.open(path) as journal, journal.task("order") as task:
        return task.run(effect, amount=7)


def test_http_effect_takes_receipt(tmp_path: Path, service: ReferenceService) -> None:
    url = service.url + "/payments"
    effect = http_effect(
        "charge",
        "POST",
        url,
        receipt=["id", "amount"],
        idempotent=True,
        key_retention=intentlog.FOREVER,
    )
    assert effect.receipt == ["id", "amount"]
    receipt = charge_once(tmp_path / "j.db", effect)
    assert set(receipt) == {"id", "amount"} and receipt["amount"] == 7
    assert list(service.truth().values()) == [1]
    assert async_http_effect("charge", "POST", url, receipt=["id"]).receipt == ["id"]


def test_http_effect_refuses_no_receipt_and_any_other_name_for_it() -> None:
    url = "http://127.0.0.1:9/x"
    for build in (http_effect, async_http_effect):
        with pytest.raises(intentlog.InvalidInput, match="receipt must be a non-empty list"):
            build("x", "POST", url)
        with pytest.raises(TypeError, match="unexpected keyword argument 'receipt_fields'"):
            build("x", "POST", url, receipt_fields=["id"])  # type: ignore[call-arg]


# -- payment_effect(key_retention=...), as on Effect -------------------------------------------


def test_payment_effect_takes_key_retention(tmp_path: Path, service: ReferenceService) -> None:
    effect = payment_effect(service.url, "both", key_retention=3600)
    assert effect.policy.key_retention == 3600
    assert charge_once(tmp_path / "j.db", effect)["amount"] == 7
    assert list(service.truth().values()) == [1]
    with pytest.raises(TypeError, match="retention"):
        payment_effect(service.url, "both", retention=3600)  # type: ignore[call-arg]


# -- a tools file's key_retention, as on Effect ------------------------------------------------


def test_a_tools_file_takes_key_retention() -> None:
    from intentlog.proxy import parse_tools

    day = parse_tools('[tools.pay]\nkey_argument = "k"\nkey_retention = "24h"\n', "tools.toml")
    assert day.tools["pay"].retention == 86400.0 and day.tools["pay"].deduplicates
    forever = parse_tools('[tools.put]\nkey_argument = "k"\nkey_retention = "forever"\n')
    assert forever.tools["put"].deduplicates and forever.tools["put"].retention is None
    old = '[tools.pay]\nkey_argument = "k"\nretention = "24h"\n'
    with pytest.raises(intentlog.InvalidInput, match="unknown setting 'retention'") as caught:
        parse_tools(old, "tools.toml")
    assert str(caught.value).startswith("tools.toml:3:")
