"""Deduplication states its retention, at every entry point, and a lagging lookup never slows
recovery.

A retention left unstated is never taken as forever: ``idempotent=True`` without
``key_retention`` is refused where an effect is declared (Effect, @effect, http_effect, the
agent-framework adapters, an MCP tools file), ``intentlog.FOREVER`` is accepted where the
service really keeps keys forever, and a crash judged past the stated retention escalates.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import intentlog
from intentlog import profiles
from intentlog.integrations.http import async_http_effect, http_effect
from intentlog.proxy._policy import parse_tools
from intentlog.testing import ReferenceService


def _send(key: str, **fields: Any) -> dict[str, Any]:
    return {"id": key}


def _refused(call: Any) -> intentlog.InvalidInput:
    with pytest.raises(intentlog.InvalidInput) as caught:
        call()
    return caught.value


def assert_names_the_fix(error: intentlog.InvalidInput, what: str) -> None:
    text = str(error)
    assert what in text and "key_retention" in text, text
    assert "intentlog.FOREVER" in text and "never taken as forever" in text
    assert "service=intentlog.profiles.X" in text and "profiles.STRIPE" in text
    assert error.option == "key_retention"


# -- the keywords --------------------------------------------------------------------------


def test_effect_without_a_retention_is_refused() -> None:
    error = _refused(lambda: intentlog.Effect("charge", _send, idempotent=True))
    assert_names_the_fix(error, "effect 'charge'")


def test_the_decorator_without_a_retention_is_refused() -> None:
    def charge(key: str, amount: int) -> dict[str, Any]:
        return {"id": key}

    error = _refused(lambda: intentlog.effect(idempotent=True)(charge))
    assert_names_the_fix(error, "effect 'charge'")


@pytest.mark.parametrize("build", [http_effect, async_http_effect])
def test_http_effect_without_a_retention_is_refused(build: Any) -> None:
    error = _refused(lambda: build("charge", "POST", "http://127.0.0.1:9/c", receipt=["id"],
                                   idempotent=True))  # fmt: skip
    assert_names_the_fix(error, "effect 'charge'")


def test_the_agent_framework_adapters_without_a_retention_are_refused(tmp_path: Path) -> None:
    from intentlog.integrations.langgraph import durable_tool
    from intentlog.integrations.openai_agents import durable_function_tool

    def pay(idempotency_key: str, amount: int) -> dict[str, Any]:
        """Charge an amount."""
        return {"id": idempotency_key}

    with intentlog.open(tmp_path / "j.db") as journal:
        for adapter in (durable_tool, durable_function_tool):
            error = _refused(lambda: adapter(journal, pay, idempotent=True))  # noqa: B023
            assert_names_the_fix(error, "'pay'")
            assert adapter(journal, pay, idempotent=True, key_retention=intentlog.FOREVER)


@pytest.mark.parametrize("forever", [intentlog.FOREVER, None])
def test_forever_is_accepted_where_it_is_written_out(forever: Any) -> None:
    day = timedelta(hours=24)
    effects = [
        intentlog.Effect("a", _send, idempotent=True, key_retention=forever or day),
        intentlog.effect(name="b", idempotent=True, key_retention=forever or day)(_send),
        http_effect("c", "POST", "http://127.0.0.1:9/c", receipt=["id"], idempotent=True,
                    key_retention=forever or day),
        async_http_effect("d", "POST", "http://127.0.0.1:9/d", receipt=["id"], idempotent=True,
                          key_retention=forever or day),
    ]  # fmt: skip
    for effect in effects:
        assert effect.policy.idempotent, effect
        if forever is None:
            assert effect.policy.key_retention == 86400.0
        else:
            assert effect.key_retention is intentlog.FOREVER
            assert effect.policy.key_retention is None  # the decision's "kept forever"
    # A stated forever is judged as such: a restart however late is covered.
    if forever is not None:
        assert intentlog.check(effects, restart_within=timedelta(days=3650)) == []


def test_a_retention_without_deduplication_or_one_lost_with_the_process_is_refused() -> None:
    error = _refused(lambda: intentlog.Effect("x", _send, key_retention=intentlog.FOREVER))
    assert "pass idempotent=True as well" in str(error)
    error = _refused(lambda: intentlog.Effect("x", _send, idempotent=True,
                                              key_retention=intentlog.PROCESS))  # fmt: skip
    assert "does not deduplicate across a crash" in str(error) and error.option == "key_retention"


@pytest.mark.parametrize(
    "retention", [120, timedelta(seconds=120), 120.0], ids=["int", "timedelta", "float"]
)
def test_a_retention_set_after_construction_is_kept_as_seconds(
    tmp_path: Path, retention: Any
) -> None:
    # An attribute set after construction takes any spelling the constructor takes; before,
    # anything but a float became None with idempotent still True: a stated FOREVER.
    charge = intentlog.Effect("charge", _send, idempotent=True, key_retention=60.0)
    charge.key_retention = retention
    assert charge.policy.idempotent and charge.policy.key_retention == 120.0
    # So a crash an hour old is past the retention: it is not resent.
    now = 10_000.0
    op = intentlog.Operation(
        key="k", task_id="t", effect="charge", fingerprint="f", state=intentlog.State.SUBMITTED,
        policy=charge.policy, created_at=now - 3600, updated_at=now - 3600, attempts=1,
        submitted_at=now - 3600, first_submitted_at=now - 3600,
    )  # fmt: skip
    decision = intentlog.decide(op, charge.policy, now, submitter_gone=True)
    assert decision.action is intentlog.Action.ESCALATE, decision


def test_an_attribute_set_after_construction_is_checked_when_the_effect_is_used(
    tmp_path: Path,
) -> None:
    charge = intentlog.Effect("charge", _send, idempotent=True, key_retention=60.0)
    charge.key_retention = intentlog.PROCESS
    error = _refused(lambda: charge.policy)
    assert "does not deduplicate across a crash" in str(error)
    for name, value in [("key_retention", -5), ("key_retention", "a day"), ("timeout", None),
                        ("timeout", 0), ("lookup_lag", float("nan"))]:  # fmt: skip
        charge = intentlog.Effect("charge", _send, idempotent=True, key_retention=60.0)
        setattr(charge, name, value)
        error = _refused(lambda: charge.policy)  # noqa: B023 - called at once
        assert name in str(error) and repr(value) in str(error), error
        assert error.option == name and "'charge'" in str(error)
        with intentlog.open(tmp_path / "j.db") as journal, journal.task("t") as task:
            with pytest.raises(intentlog.InvalidInput):
                task.run(charge)
            assert journal.operations("t") == []  # refused before anything was journaled
    charge = intentlog.Effect("charge", _send, idempotent=True, key_retention=60.0)
    charge.timeout = timedelta(seconds=5)
    assert charge.policy.timeout == 5.0
    charge.idempotent = False  # no longer deduplicates: the retention no longer counts
    assert not charge.policy.idempotent and charge.policy.key_retention == 60.0


def test_the_integrations_built_on_profiles_state_their_retention() -> None:
    # AWS, SMTP and NATS take no deduplication keywords: their services state it.
    s3 = intentlog.Effect("put", _send, service=profiles.S3_CONDITIONAL)
    sqs = intentlog.Effect("send", _send, service=profiles.SQS_FIFO)
    mail = intentlog.Effect("mail", _send, service=profiles.SMTP)
    nats = intentlog.Effect("pub", _send, service=profiles.nats_jetstream(120))
    assert s3.key_retention is intentlog.FOREVER and s3.policy.key_retention is None
    assert sqs.policy.key_retention == 300 and nats.policy.key_retention == 120
    assert not mail.policy.idempotent and mail.key_retention is None


# -- the MCP tools file --------------------------------------------------------------------


def test_a_tools_file_key_without_a_retention_is_refused_at_load() -> None:
    text = '[tools.create_payment]\nkey_argument = "idempotency_key"\ntimeout = "20s"\n'
    error = _refused(lambda: parse_tools(text, "tools.toml"))
    message = str(error)
    assert message.startswith("tools.toml:2: tool 'create_payment'"), message
    # The rule's text is the effects' (effect_contract), in the file's words.
    assert "deduplicates = true needs key_retention too" in message, message
    assert "never taken as forever" in message and 'key_retention = "forever"' in message
    assert 'profile = "NAME"' in message and "stripe" in message
    assert error.option == "key_retention" and error.tool == "create_payment"
    # A profile that states no retention does not give one either.
    shopify = '[tools.m]\nkey_argument = "k"\nprofile = "shopify_graphql"\n'
    assert "tool 'm'" in str(_refused(lambda: parse_tools(shopify)))
    # ... nor does an explicit deduplicates = true.
    explicit = '[tools.m]\nkey_argument = "k"\ndeduplicates = true\n'
    assert "tool 'm'" in str(_refused(lambda: parse_tools(explicit)))


def test_a_tools_file_states_forever_or_a_profile_or_no_key() -> None:
    parsed = parse_tools(
        textwrap.dedent(
            """
            [tools.put]
            key_argument = "name"
            key_retention = "forever"

            [tools.pay]
            key_argument = "idempotency_key"
            profile = "stripe"

            [tools.store]
            key_argument = "object"
            profile = "s3_conditional"

            [tools.set_flag]
            idempotent = true

            [tools.open_refund]
            key_argument = "reference"
            deduplicates = false
            """
        )
    )
    tools = parsed.tools
    assert tools["put"].deduplicates and tools["put"].retention is None  # a stated forever
    assert tools["pay"].retention == 86400.0
    assert tools["store"].deduplicates and tools["store"].retention is None
    assert tools["set_flag"].deduplicates and tools["set_flag"].key_argument is None
    assert not tools["open_refund"].deduplicates


# -- crash in flight, judged by the stated retention ---------------------------------------

CHILD = textwrap.dedent(
    """
    import json, sys
    import intentlog
    from intentlog.testing import payment_effect

    url, service, kind, retention = sys.argv[1:5]
    effect = payment_effect(
        service, "dedupe", timeout=0.2,
        key_retention=intentlog.FOREVER if retention == "forever" else float(retention),
    )
    # The in-flight window (0.3 s) is waited out before the retention is judged.
    with intentlog.open(url, max_wait=10) as journal, journal.task("order-1") as task:
        try:
            receipt = task.run(effect, amount=500)
        except intentlog.Error as exc:
            print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
        else:
            print(json.dumps({"receipt": receipt}))
    """
)


def run_child(tmp_path: Path, url: str, service: str, kind: str, retention: str,
              crash: str | None = None) -> subprocess.CompletedProcess[str]:  # fmt: skip
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {k: v for k, v in os.environ.items() if k != "INTENTLOG_CRASH"}
    if crash:
        env["INTENTLOG_CRASH"] = f"{crash}:charge"
    return subprocess.run(
        [sys.executable, str(script), url, service, kind, retention],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def only_op(url: str) -> intentlog.Operation:
    with intentlog.open(url) as journal:
        (op,) = journal.operations("order-1")
        return op


def test_a_crash_recorded_as_forever_is_judged_by_the_retention_stated_now(
    tmp_path: Path, journal_url: str
) -> None:
    # The service keeps a key for a millisecond. The first run was recorded with a key kept
    # forever (what an unstated retention used to mean); the restarted effect states the
    # real figure, and the stricter of the two says the key is gone: UNRESOLVED, not resent.
    with ReferenceService("dedupe", retention=0.001) as service:
        first = run_child(tmp_path, journal_url, service.url, "dedupe", "forever",
                          "after_remote_commit")  # fmt: skip
        assert first.returncode == -signal.SIGKILL, first.stderr
        assert only_op(journal_url).policy.key_retention is None  # recorded: forever
        assert len(service.truth()) == 1  # the service committed before the kill
        # 0.5 s, minus the margin (0.1 s slack + 0.2 s timeout + 5 %), ends before the
        # request's own in-flight window does: the decision cannot find the key still held.
        second = run_child(tmp_path, journal_url, service.url, "dedupe", "0.5")
        assert second.returncode == 0, second.stderr
        out = json.loads(second.stdout)
        assert out["error"] == "OutcomeUnknown", out
        assert "past its retention" in out["message"]
        assert list(service.truth().values()) == [1]  # applied once: nothing was resent
        op = only_op(journal_url)
        assert op.state is intentlog.State.UNRESOLVED and op.attempts == 1
