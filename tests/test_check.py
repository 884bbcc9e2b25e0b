"""intentlog.check and `intentlog check`: can the effects' services cover a restart interval?

The check must agree with the decision itself: an effect is flagged for its retention exactly
when the decision, judging a crash in flight at that restart, would no longer resend.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import intentlog
from intentlog import profiles
from intentlog._decide import in_flight_until, retention_margin
from intentlog._model import Action, Operation, State
from intentlog.cli import cli

ROOT = Path(__file__).resolve().parent.parent


def _send(key: str, **kwargs: Any) -> Any:
    return {"id": key}


def _ask(key: str) -> intentlog.NotFound:
    return intentlog.NotFound()


def nats(window: float, *, reconcile: bool = False) -> intentlog.Effect:
    return intentlog.Effect(
        "publish", _send, _ask if reconcile else None, service=profiles.nats_jetstream(window)
    )


def submitted(effect: intentlog.Effect, at: float) -> Operation:
    return Operation(key="k", task_id="t", effect=effect.name, fingerprint="-",
                     state=State.SUBMITTED, policy=effect.policy, created_at=at, updated_at=at,
                     submitted_at=at, first_submitted_at=at, submitted_by="dead")  # fmt: skip


# -- the Python API ------------------------------------------------------------------------


def retention(found: list[intentlog.Finding]) -> list[intentlog.Finding]:
    return [f for f in found if f.kind == "retention"]


def test_a_short_retention_without_a_lookup_is_a_problem() -> None:
    found = intentlog.check([nats(120)], restart_within=3600)
    [finding] = retention(found)
    assert finding.effect == "publish" and finding.service == "nats-jetstream"
    assert finding.kind == "retention" and finding.problem and not finding.accepted
    # 2 min minus (1 s slack + 5 s timeout + 5 % of 2 min) leaves 1 min 48 s.
    assert "kept 2 min" in finding.message and "leaves 1 min 48 s" in finding.message
    assert "restart within 1 h" in finding.message and "UNRESOLVED" in finding.message
    # JetStream can be asked (the stream holds the message): without a reconciler, a note.
    [note] = [f for f in found if f.kind == "no_reconciler"]
    assert not note.problem and "can be asked by reference" in note.message


@pytest.mark.parametrize("window", [30.0, 120.0, 300.0, 86400.0])
def test_the_check_flags_a_retention_exactly_where_the_decision_stops_resending(
    window: float,
) -> None:
    effect = nats(window)
    usable = window - retention_margin(effect.policy)
    start = 1_000_000.0
    op = submitted(effect, start)
    for within in (usable - 1, usable - 0.001, usable, usable + 0.001, usable + 60):
        if start + within < in_flight_until(op, effect.policy):
            continue  # still in flight: the decision waits, whatever the retention
        decision = intentlog.decide(op, effect.policy, start + within, submitter_gone=True)
        flagged = bool(retention(intentlog.check([effect], restart_within=within)))
        assert flagged == (decision.mark is State.UNRESOLVED), (window, within, decision)
        assert flagged != (decision.action is Action.SUBMIT)


def test_a_short_retention_with_a_reconciler_is_a_note() -> None:
    [finding] = intentlog.check([nats(120, reconcile=True)], restart_within=timedelta(hours=1))
    assert finding.kind == "retention" and not finding.problem
    assert "reconciler settles" in finding.message


def test_an_effect_that_can_neither_deduplicate_nor_be_asked_is_a_problem() -> None:
    mail = intentlog.Effect("send_mail", _send, service=profiles.SMTP)
    bare = intentlog.Effect("notify", _send)  # declared with no keywords: neither
    found = intentlog.check([mail, bare], restart_within=0)
    assert [(f.effect, f.kind, f.problem) for f in found] == [
        ("send_mail", "unresolvable", True),
        ("notify", "unresolvable", True),
    ]
    assert found[0].service == "smtp" and found[1].service is None
    assert "each crash while a request is in flight ends UNRESOLVED" in found[0].message


def test_accepting_an_effect_keeps_its_finding_as_a_note() -> None:
    mail = intentlog.Effect("send_mail", _send, service=profiles.SMTP)
    [finding] = intentlog.check([mail], restart_within=60, accept=["send_mail"])
    assert finding.accepted and not finding.problem and finding.message.endswith("(accepted)")
    [again] = intentlog.check([mail], restart_within=60, accept="send_mail")
    assert again == finding


def test_a_service_kept_only_in_process_or_askable_without_a_reconciler() -> None:
    cache = intentlog.Service("cache", key=intentlog.KeyPlace.header("Idempotency-Key"),
                              retention=intentlog.PROCESS)  # fmt: skip
    volatile = intentlog.Effect("volatile", _send, service=cache)
    chat = intentlog.Effect("post", _send, service=profiles.SLACK)
    pay = intentlog.Effect("pay", _send, service=profiles.STRIPE)
    found = {f.effect: f for f in intentlog.check([volatile, chat, pay], restart_within=3600)}
    assert found["volatile"].kind == "unresolvable" and "process lives" in found["volatile"].message
    assert found["post"].kind == "unresolvable" and "register a reconciler" in found["post"].message
    # Stripe keeps keys a day: a restart within an hour is covered, and only the missing
    # reconciler is worth a note.
    assert found["pay"].kind == "no_reconciler" and not found["pay"].problem


def test_effects_that_settle_every_crash_give_no_finding() -> None:
    forever = intentlog.Effect("put", _send, _ask, service=profiles.S3_CONDITIONAL)
    asked = intentlog.Effect("ask", _send, _ask)
    kept = intentlog.Effect("kept", _send, idempotent=True, key_retention=intentlog.FOREVER)
    assert intentlog.check([forever, asked, kept], restart_within=timedelta(days=365)) == []
    pay = intentlog.Effect("pay", _send, _ask, service=profiles.STRIPE)
    assert intentlog.check([pay], restart_within=timedelta(hours=1)) == []
    assert intentlog.check([], restart_within=60) == []


def test_deduplication_without_a_stated_retention_is_never_taken_as_forever() -> None:
    # The case of a 30-day outage: once, idempotent=True alone was judged as keeping the key
    # forever and the check found nothing. Now it cannot be declared, and the retention
    # the user states is judged.
    with pytest.raises(intentlog.InvalidInput, match="key_retention") as caught:
        intentlog.Effect("charge", _send, idempotent=True)
    assert caught.value.option == "key_retention"
    assert "intentlog.FOREVER" in str(caught.value) and "profiles.STRIPE" in str(caught.value)
    day = intentlog.Effect("charge", _send, idempotent=True, key_retention=timedelta(hours=24))
    [finding] = intentlog.check([day], restart_within=timedelta(days=30))
    assert (finding.kind, finding.problem) == ("retention", True)
    assert "does not cover a restart within 30 days" in finding.message


@pytest.mark.parametrize("reconcile", [False, True])
def test_a_service_that_takes_a_key_but_states_no_retention_is_reported(reconcile: bool) -> None:
    mine = intentlog.Service("mine", key=intentlog.KeyPlace.header("Idempotency-Key"))
    effects = [
        intentlog.Effect("graphql", _send, _ask if reconcile else None,
                         service=profiles.SHOPIFY_GRAPHQL),
        intentlog.Effect("mine", _send, _ask if reconcile else None, service=mine),
    ]  # fmt: skip
    found = intentlog.check(effects, restart_within=60)
    assert [(f.effect, f.kind, f.problem) for f in found] == [
        ("graphql", "unstated_retention", not reconcile),
        ("mine", "unstated_retention", not reconcile),
    ]
    for f in found:
        assert "states no retention" in f.message and "NOT deduplicating" in f.message
        assert "service.replace(retention=...)" in f.message and "intentlog.FOREVER" in f.message
    assert "body '@idempotent(key:)'" in found[0].message
    assert "header 'Idempotency-Key'" in found[1].message
    # ... and the decision agrees: such an effect never resends.
    assert not effects[0].policy.idempotent and not effects[1].policy.idempotent


def test_an_effect_made_idempotent_after_it_was_declared_counts_as_not_deduplicating() -> None:
    effect = intentlog.Effect("notify", _send)
    effect.idempotent = True  # a retention was never stated
    assert not effect.policy.idempotent
    [finding] = intentlog.check([effect], restart_within=60)
    assert (finding.kind, finding.problem) == ("unstated_retention", True)
    assert "idempotent=True without key_retention" in finding.message


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"restart_within": -1}, "restart_within"),
        ({"restart_within": float("inf")}, "restart_within"),
        ({"restart_within": "1h"}, "restart_within"),
        ({"restart_within": None}, "restart_within"),
        ({"restart_within": 60, "accept": ["nope"]}, "accept names no effect.*nope"),
    ],
)
def test_bad_input_is_a_clear_error(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(intentlog.InvalidInput, match=match):
        intentlog.check([nats(120)], **kwargs)


def test_only_effects_are_checked() -> None:
    with pytest.raises(intentlog.InvalidInput, match=r"intentlog\.Effect"):
        intentlog.check([profiles.STRIPE], restart_within=60)  # type: ignore[list-item]


# -- the command line ----------------------------------------------------------------------

SHORT = textwrap.dedent(
    """
    import intentlog
    from intentlog import profiles

    def publish(key, subject, data):
        raise NotImplementedError

    publish_event = intentlog.Effect("publish_event", publish, service=profiles.nats_jetstream())
    """
)


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A working directory whose modules `--effects` can import, removed again afterwards."""
    monkeypatch.chdir(tmp_path)
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        if getattr(sys.modules[name], "__file__", None) and str(tmp_path) in str(
            sys.modules[name].__file__
        ):
            del sys.modules[name]


def invoke(*args: str) -> Any:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_cli_on_the_demos_effects() -> None:
    result = invoke("check", "--effects", "intentlog.demo:EFFECTS", "--restart-within", "1h")
    assert result.exit_code == 3, result.output
    lines = result.output.splitlines()
    assert lines[0].split() == ["EFFECT", "SERVICE", "VERDICT", "WHY"]
    assert lines[1].split()[:3] == ["charge", "-", "ok"]
    assert lines[3].split()[:3] == ["send_mail", "-", "PROBLEM"]
    assert "3 effect(s) checked for a restart within 1 h: 1 problem(s), 0 note(s)" in result.output
    accepted = invoke("check", "--effects", "intentlog.demo:EFFECTS",
                      "--restart-within", "3600", "--accept", "send_mail")  # fmt: skip
    assert accepted.exit_code == 0, accepted.output
    assert "0 problem(s), 1 note(s)" in accepted.output


def test_cli_json(workdir: Path) -> None:
    (workdir / "short_mod.py").write_text(SHORT)
    result = invoke("check", "--effects", "short_mod", "--restart-within", "15m", "--json")
    assert result.exit_code == 3
    doc = json.loads(result.output)
    assert doc["restart_within_seconds"] == 900 and doc["problems"] == 1
    assert doc["effects"] == [{
        "effect": "publish_event", "service": "nats-jetstream", "deduplicates": True,
        "key_retention_seconds": 120.0, "can_reconcile": False,
        "summary": "deduplicates (2 min)",
    }]  # fmt: skip
    assert [(f["kind"], f["problem"]) for f in doc["findings"]] == [
        ("retention", True),
        ("no_reconciler", False),
    ]
    ok = invoke("check", "--effects", "short_mod", "--restart-within", "90s", "--json")
    assert ok.exit_code == 0
    assert [f["kind"] for f in json.loads(ok.output)["findings"]] == ["no_reconciler"]


@pytest.mark.parametrize(
    ("value", "code", "says"),
    [
        ("90s", 0, "note"),
        ("1.5", 0, "note"),
        ("2d", 3, "PROBLEM"),
        ("1h30m", 2, "is not a duration"),
        ("-5", 2, "is not a duration"),
        ("soon", 2, "is not a duration"),
    ],
)
def test_cli_durations(workdir: Path, value: str, code: int, says: str) -> None:
    (workdir / "short_mod.py").write_text(SHORT)
    result = CliRunner().invoke(cli, ["check", "--effects", "short_mod", "--restart-within", value])
    assert result.exit_code == code, result.output
    assert says in result.output


def test_cli_usage_and_import_errors(workdir: Path) -> None:
    (workdir / "short_mod.py").write_text(SHORT)
    missing = CliRunner().invoke(cli, ["check", "--effects", "short_mod"])
    assert missing.exit_code == 2 and "--restart-within" in missing.output
    wrong = CliRunner().invoke(cli, ["check", "--effects", "short_mod", "--restart-within",
                                     "1h", "--accept", "publish_evnt"])  # fmt: skip
    assert wrong.exit_code == 2 and "names no effect: publish_evnt" in wrong.output
    gone = CliRunner().invoke(cli, ["check", "--effects", "no_such_mod", "--restart-within", "1h"])
    assert gone.exit_code == 1 and "cannot import effects module 'no_such_mod'" in gone.output


def test_cli_reports_an_effect_without_a_stated_retention_as_an_error(workdir: Path) -> None:
    (workdir / "old_mod.py").write_text(textwrap.dedent("""
        import intentlog

        @intentlog.effect(idempotent=True)
        def charge(key, amount):
            raise NotImplementedError
        """))  # fmt: skip
    result = CliRunner().invoke(cli, ["check", "--effects", "old_mod", "--restart-within", "1h"])
    assert result.exit_code == 1, result.output
    assert "cannot import effects module 'old_mod': InvalidInput: effect 'charge'" in result.output
    assert "key_retention" in result.output and "intentlog.FOREVER" in result.output
    assert "Traceback" not in result.output


def test_cli_needs_no_journal(tmp_path: Path) -> None:
    """A real process, as CI runs it: no journal anywhere, nothing created."""
    env = {**os.environ, "INTENTLOG_URL": str(tmp_path / "absent.db")}
    run = subprocess.run(
        [sys.executable, "-m", "intentlog.cli", "check", "--effects",
         "intentlog.demo:EFFECTS", "--restart-within", "1h"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 3, run.stderr
    assert "send_mail" in run.stdout and "PROBLEM" in run.stdout
    assert list(tmp_path.iterdir()) == []


# -- workers log the same at start -----------------------------------------------------------

APP = textwrap.dedent(
    """
    import intentlog
    from intentlog import profiles

    def send(key, **kwargs):
        return {"id": key}

    mail = intentlog.Effect("send_mail", send, service=profiles.SMTP)
    publish = intentlog.Effect("publish", send, service=profiles.nats_jetstream(60))
    ledger = intentlog.Effect("ledger", send, service=profiles.S3_CONDITIONAL)
    registry = intentlog.Registry(effects=[mail, publish, ledger])
    """
)


def test_the_worker_command_logs_the_findings_at_start(tmp_path: Path) -> None:
    (tmp_path / "check_app.py").write_text(APP)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "INTENTLOG_URL": str(tmp_path / "j.db")}
    env.pop("INTENTLOG_CRASH", None)
    run = subprocess.run(
        [sys.executable, "-m", "intentlog.cli", "worker", "--app", "check_app:registry",
         "--lease-ttl", "120", "--exit-when-idle"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    lines = [line for line in run.stderr.splitlines() if line.startswith("intentlog check:")]
    assert len(lines) == 3, run.stderr
    assert lines[0].startswith("intentlog check: problem: effect 'send_mail': can neither")
    # A 60 s window minus its margin (1 + 5 + 3 s) does not cover a 120 s lease.
    assert lines[1].startswith("intentlog check: problem: effect 'publish': keys are kept 1 min;")
    assert lines[2].startswith("intentlog check: note: effect 'publish': its service can be")
    assert all(line.endswith("(checked against the 2 min lease)") for line in lines)


def test_workers_sharing_a_registry_log_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    mail = intentlog.Effect("send_mail", _send, service=profiles.SMTP)
    registry = intentlog.Registry(effects=[mail])
    with intentlog.open(str(tmp_path / "j.db")) as journal:
        workers = [intentlog.Worker(journal, registry) for _ in range(3)]
        with caplog.at_level(logging.WARNING, logger="intentlog.worker"):
            for worker in workers:
                worker.run(exit_when_idle=True)
            intentlog.Worker(journal, intentlog.Registry(effects=[mail])).run(exit_when_idle=True)
    logged = [r.getMessage() for r in caplog.records if r.name == "intentlog.worker"]
    assert len(logged) == 2, logged  # once for each registry
    assert all("effect 'send_mail': can neither" in m for m in logged)


# -- docs/services.md shows real output ----------------------------------------------------


def console_runs(text: str) -> list[tuple[list[str], list[str], int | None]]:
    """Each ``$ intentlog ...`` of the doc's console blocks: its arguments, the output shown
    under it and the exit code a following ``$ echo $?`` shows."""
    runs: list[tuple[list[str], list[str], int | None]] = []
    language = None
    for line in text.splitlines():
        if line.startswith("```"):
            language = line[3:].strip() if language is None else None
            continue
        if language != "console":
            continue
        if line.startswith("$ intentlog "):
            runs.append((shlex.split(line[len("$ intentlog ") :]), [], None))
        elif line == "$ echo $?":
            runs[-1] = (runs[-1][0], runs[-1][1], -1)
        elif runs and runs[-1][2] == -1:
            runs[-1] = (runs[-1][0], runs[-1][1], int(line))
        elif runs:
            runs[-1][1].append(line)
    return runs


def test_the_output_shown_in_docs_services_is_real(workdir: Path) -> None:
    text = (ROOT / "docs" / "services.md").read_text()
    for block in re.findall(r"```python\n(# file: (\w+)\.py\n.*?)```", text, re.S):
        (workdir / f"{block[1]}.py").write_text(block[0])
    runs = console_runs(text)
    assert len(runs) >= 4 and all(code is not None for _, _, code in runs)
    checked = set()
    for args, shown, code in runs:
        # The docs show output at 100 columns (as the doc-block test runs it).
        result = CliRunner().invoke(cli, args, terminal_width=100, env={"COLUMNS": "100"})
        real = [line.rstrip() for line in result.output.rstrip("\n").splitlines()]
        assert real == shown, f"intentlog {' '.join(args)}:\n{result.output}"
        assert result.exit_code == code, f"intentlog {' '.join(args)}: exit {result.exit_code}"
        checked.add(code)
    assert checked == {0, 3}
