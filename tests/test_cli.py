"""The intentlog CLI against real SQLite journals, in-process (CliRunner) and as a subprocess."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

import intentlog
from intentlog._decide import in_flight_until
from intentlog.cli import cli, main, mask

# -- effects used to put operations into each state ----------------------------------------


def _unreachable(key: str, **kwargs: Any) -> Any:
    raise ConnectionError("connection reset by peer")


def _ok(key: str, **kwargs: Any) -> Any:
    return {"id": f"ok-{kwargs.get('n', 0)}"}


def _lookup_down(key: str) -> intentlog.Found:
    raise RuntimeError("lookup service down")


EMAIL = intentlog.Effect("send_email", _unreachable)  # neither reconcilable nor idempotent
EMAIL_QUICK = intentlog.Effect("send_email", _unreachable, timeout=0.05)  # the same, short
# A short deadline, so that a recovery's NotFound is trusted at once (the stricter of the
# recorded and the live deadline counts).
CHARGE = intentlog.Effect("charge", _unreachable, reconcile=_lookup_down, timeout=0.001)
PUBLISH = intentlog.Effect(
    "publish", _unreachable, idempotent=True, key_retention=intentlog.FOREVER
)  # dedups, cannot reconcile
OK = intentlog.Effect("ok", _ok, idempotent=True, key_retention=intentlog.FOREVER)


@pytest.fixture
def db(tmp_path: Path) -> str:
    """An empty journal file."""
    path = str(tmp_path / "journal.db")
    with intentlog.open(path):
        pass
    return path


def make_unresolved(db: str, task_id: str = "order-1") -> str:
    """An UNRESOLVED operation: the send failed ambiguously and nothing can settle it; its
    request can no longer land (a resolve needs no confirmation for that)."""
    with intentlog.open(db) as journal, journal.task(task_id) as task:
        with pytest.raises(intentlog.OutcomeUnknown):
            task.run(EMAIL_QUICK, to="a@example.com")
        key = journal.operations(task_id)[0].key
    wait_out_the_request(db, key)
    return key


def make_submitted(db: str, effect: intentlog.Effect = CHARGE, task_id: str = "order-2") -> str:
    """A SUBMITTED operation whose send failed ambiguously and could not be settled yet.

    CHARGE: the lookup fails too and the next lookup is beyond max_wait (StillInFlight).
    PUBLISH: the service deduplicates, but a resend waits out the request's deadline, which
    is beyond max_wait (StillInFlight).
    """
    with intentlog.open(db, max_wait=0, attempts_per_run=1, lookup_limit=100) as journal:
        with journal.task(task_id) as task, pytest.raises(intentlog.StillInFlight):
            task.run(effect, amount=500)
        op = journal.operations(task_id)[0]
    assert op.state is intentlog.State.SUBMITTED
    return op.key


def wait_out_the_request(db: str, key: str) -> None:
    """Until the operation's latest request can no longer land (its in-flight window)."""
    with intentlog.open(db) as journal:
        op = journal.operation(key)
        while journal.store.now() < in_flight_until(op, op.policy):
            time.sleep(0.01)


def invoke(db: str | None, *args: str, env: dict[str, str] | None = None) -> Result:
    """Run the CLI in-process; an exit code of 1 must come from a handled error."""
    argv = ["--db", db, *args] if db is not None else list(args)
    result = CliRunner(env=env).invoke(cli, argv, prog_name="intentlog")
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def op_state(db: str, key: str) -> intentlog.State:
    with intentlog.open(db) as journal:
        return journal.operation(key).state


# -- status ----------------------------------------------------------------------------------


def test_status_empty_journal_exits_0(db: str) -> None:
    result = invoke(db, "status")
    assert result.exit_code == 0, result.output
    assert "nothing needs attention" in result.stdout
    for state in intentlog.State:
        assert state.value in result.stdout
    data = json.loads(invoke(db, "status", "--json").stdout)
    assert data["counts"] == {s.value: 0 for s in intentlog.State}
    assert data["pending"] == [] and data["tasks"] == [] and data["needs_person"] is False


def test_status_unresolved_needs_a_person(db: str) -> None:
    key = make_unresolved(db)
    result = invoke(db, "status")
    assert result.exit_code == 3, result.output
    assert "ESCALATE" in result.stdout and key in result.stdout and "order-1" in result.stdout
    # Everything fits but the journal's URL, never split: on the first line, and in the
    # command to paste, printed whole on a line of its own.
    lines = result.stdout.splitlines()
    url = lines[0].removeprefix("journal  ")
    assert all(len(line) <= 100 for line in lines if url not in line), result.stdout
    assert any(line.startswith("  intentlog --db ") and " resolve KEY " in line for line in lines)

    result = invoke(db, "status", "--json")
    assert result.exit_code == 3
    data = json.loads(result.stdout)
    assert data["needs_person"] is True
    assert data["journal"].startswith("sqlite:///") and data["journal"].endswith("journal.db")
    assert data["counts"]["UNRESOLVED"] == 1 and data["counts"]["PLANNED"] == 0
    [item] = data["pending"]
    assert item["key"] == key and item["task_id"] == "order-1" and item["effect"] == "send_email"
    assert (item["state"], item["next_action"]) == ("UNRESOLVED", "ESCALATE")
    [listed] = data["tasks"]
    assert listed.pop("who") == "person" and key in listed.pop("why")
    assert [listed] == [
        {
            "task_id": "order-1",
            "next_step": None,
            "epoch": 1,
            "kind": None,
            "runs": 0,
            "last_error": None,
            "next_action": "ESCALATE",
            "holder_alive": False,
            "not_before": None,
        }
    ]


def test_status_wait_shows_seconds_and_exits_4(db: str) -> None:
    key = make_submitted(db, PUBLISH)
    data = json.loads(invoke(db, "status", "--json").stdout)
    [item] = data["pending"]
    assert item["key"] == key and item["next_action"] == "WAIT"
    assert 0 < item["wait_seconds"] <= 31  # the request may run for slack + `timeout` seconds
    result = invoke(db, "status")
    assert result.exit_code == 4, result.output
    assert "WAIT" in result.stdout and re.search(r"\bWAIT\s+\d+(\.\d)? s\b", result.stdout)


def test_status_abandoned_task_needs_a_person(db: str) -> None:
    # No worker runs a task without a kind: only its program, or a person who completes or
    # cancels it. Nothing automatic will, so it is not "work remains" (4) but a person's (3).
    with intentlog.open(db) as journal, journal.task("crawl") as task:
        task.checkpoint(next_step="page-2", state={"page": 2})
    result = invoke(db, "status")
    assert result.exit_code == 3, result.output
    assert "never completed it" in result.stdout
    assert "RESUME at page-2" in result.stdout
    data = json.loads(invoke(db, "status", "--json").stdout)
    assert data["pending"] == [] and data["tasks"][0]["task_id"] == "crawl"
    assert "intentlog complete crawl" in data["tasks"][0]["why"]


# -- resolve and show ------------------------------------------------------------------------


def test_resolve_confirmed_then_show_has_the_resolution(db: str) -> None:
    key = make_unresolved(db)
    result = invoke(db, "resolve", key, "--confirmed", "--receipt", '{"id": "x"}', "--note", "seen")
    assert result.exit_code == 0, result.output
    assert f"{key}: CONFIRMED" in result.stdout and "RESUME" in result.stdout
    assert op_state(db, key) is intentlog.State.CONFIRMED

    data = json.loads(invoke(db, "show", "order-1", "--json").stdout)
    assert data["task"]["task_id"] == "order-1" and data["task"]["next_action"] == "RESUME"
    [op] = data["operations"]
    assert op["state"] == "CONFIRMED" and op["receipt"] == {"id": "x"} and op["note"] == "seen"
    assert op["created_at"].endswith("Z") and "T" in op["created_at"]
    [res] = op["resolutions"]
    assert (res["from_state"], res["to_state"]) == ("UNRESOLVED", "CONFIRMED")
    assert res["note"] == "seen" and res["receipt"] == {"id": "x"}

    text = invoke(db, "show", "order-1").stdout
    assert "UNRESOLVED -> CONFIRMED" in text and '{"id": "x"}' in text

    # The task runs again: it gets the resolved receipt, sends nothing, and completes.
    with intentlog.open(db) as journal, journal.task("order-1") as task:
        assert task.run(EMAIL, to="a@example.com") == {"id": "x"}
        task.complete()
    assert invoke(db, "status").exit_code == 0


def test_resolve_retry_makes_it_planned(db: str) -> None:
    key = make_unresolved(db)
    result = invoke(db, "resolve", key, "--retry", "--confirm", "retry send_email", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["key"] == key and data["state"] == "PLANNED"
    assert data["task_next_action"] == "SUBMIT"
    status = invoke(db, "status", "--json")
    assert status.exit_code == 3  # no worker runs this task: its program must send it again
    assert json.loads(status.stdout)["pending"][0]["next_action"] == "SUBMIT"


def test_resolve_failed(db: str) -> None:
    key = make_unresolved(db)
    result = invoke(db, "resolve", key, "--failed", "--note", "not in the outbox")
    assert result.exit_code == 0, result.output
    assert op_state(db, key) is intentlog.State.FAILED


def test_resolve_unknown_key(db: str) -> None:
    result = invoke(db, "resolve", "no-such-key", "--failed")
    assert result.exit_code == 1
    assert result.stderr.startswith("error: no operation with key 'no-such-key'")


@pytest.mark.parametrize("flags", [[], ["--confirmed", "--failed"], ["--failed", "--retry"]])
def test_resolve_needs_exactly_one_outcome(db: str, flags: list[str]) -> None:
    key = make_unresolved(db)
    result = invoke(db, "resolve", key, *flags)
    assert result.exit_code == 2
    assert "exactly one of --confirmed, --failed, --retry" in result.stderr
    assert op_state(db, key) is intentlog.State.UNRESOLVED


def test_resolve_bad_receipt_json(db: str) -> None:
    key = make_unresolved(db)
    result = invoke(db, "resolve", key, "--confirmed", "--receipt", "{not json")
    assert result.exit_code == 1
    assert result.stderr.startswith("error: --receipt is not valid JSON")
    assert op_state(db, key) is intentlog.State.UNRESOLVED


def test_resolve_refuses_a_secret_in_the_receipt(db: str) -> None:
    key = make_unresolved(db)
    result = invoke(db, "resolve", key, "--confirmed", "--receipt", '{"token": "abc"}')
    assert result.exit_code == 1
    assert result.stderr.startswith("error: receipt.token") and "credential" in result.stderr
    assert "abc" not in result.output
    with intentlog.open(db) as journal:
        op = journal.operation(key)
        assert op.state is intentlog.State.UNRESOLVED and op.receipt is None
        assert journal.resolutions(key) == []


def test_resolve_an_outcome_that_does_not_fit(db: str) -> None:
    key = make_unresolved(db)
    assert invoke(db, "resolve", key, "--confirmed").exit_code == 0
    result = invoke(db, "resolve", key, "--retry")
    assert result.exit_code == 1
    assert "is CONFIRMED" in result.stderr
    assert op_state(db, key) is intentlog.State.CONFIRMED


def test_show_unknown_task(db: str) -> None:
    result = invoke(db, "show", "nope")
    assert result.exit_code == 1
    assert result.stderr.startswith("error: no task 'nope'")


def test_show_text(db: str) -> None:
    key = make_submitted(db)
    result = invoke(db, "show", "order-2")
    assert result.exit_code == 0, result.output
    assert key in result.stdout and "SUBMITTED" in result.stdout and "RECONCILE" in result.stdout


# -- recover ---------------------------------------------------------------------------------


@pytest.fixture
def effects_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Write an effects module into tmp_path (the working directory) and forget it after."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    written: list[str] = []

    def write(name: str, body: str) -> str:
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))
        written.append(name)
        return name

    yield write
    for name in written:
        sys.modules.pop(name, None)


def test_recover_confirms_a_submitted_operation(db: str, effects_module: Any) -> None:
    key = make_submitted(db)
    module = effects_module(
        "shop_effects_found",
        """
        import intentlog

        def charge_submit(key, amount):
            raise AssertionError("recover must never send")

        def lookup(key):
            return intentlog.Found({"id": "r1"})

        charge = intentlog.Effect("charge", charge_submit, reconcile=lookup)
        """,
    )
    result = invoke(db, "recover", "--effects", module)
    assert result.exit_code == 0, result.output
    assert key in result.stdout and "CONFIRMED" in result.stdout and "1 CONFIRMED" in result.stdout
    with intentlog.open(db) as journal:
        op = journal.operation(key)
    assert op.state is intentlog.State.CONFIRMED and op.receipt == {"id": "r1"}
    assert invoke(db, "recover", "--effects", f"{module}:charge").stdout.startswith("no SUBMITTED")


def test_recover_not_found_leaves_it_for_the_task(db: str, effects_module: Any) -> None:
    key = make_submitted(db)
    module = effects_module(
        "shop_effects_notfound",
        """
        import intentlog

        EFFECTS = [
            intentlog.Effect(
                "charge", lambda key, amount: None, reconcile=lambda key: intentlog.NotFound(),
                timeout=0.001,
            )
        ]
        """,
    )
    wait_out_the_request(db, key)
    result = invoke(db, "recover", "--effects", f"{module}:EFFECTS", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["effects"] == ["charge"] and data["needs_person"] is False
    [item] = data["recovered"]
    assert item["key"] == key and item["state"] == "SUBMITTED" and item["next_action"] == "SUBMIT"
    assert op_state(db, key) is intentlog.State.SUBMITTED


def test_recover_unresolved_exits_3(db: str, effects_module: Any) -> None:
    key = make_submitted(db)
    # At recovery time the effect can neither reconcile nor deduplicate, and its short request
    # timeout has passed: nothing can settle the outcome.
    module = effects_module(
        "shop_effects_blind",
        """
        import intentlog

        charge = intentlog.Effect("charge", lambda key, amount: None, timeout=0.001)
        """,
    )
    wait_out_the_request(db, key)
    result = invoke(db, "recover", "--effects", module)
    assert result.exit_code == 3, result.output
    assert "UNRESOLVED" in result.stdout and "needs a person" in result.stdout
    assert op_state(db, key) is intentlog.State.UNRESOLVED


def test_recover_module_errors(db: str, effects_module: Any) -> None:
    empty = effects_module("no_effects_here", "VALUE = 1\n")
    broken = effects_module("broken_effects", "import does_not_exist_anywhere\n")
    cases = {
        empty: "no intentlog.Effect found in module 'no_effects_here'",
        broken: "cannot import effects module 'broken_effects'",
        "missing_module_xyz": "cannot import effects module 'missing_module_xyz'",
        f"{empty}:VALUE": "is not an intentlog.Effect",
        f"{empty}:nothing": "has no attribute 'nothing'",
    }
    for spec, message in cases.items():
        result = invoke(db, "recover", "--effects", spec)
        assert result.exit_code == 1, spec
        assert result.stderr.startswith("error: ") and message in result.stderr, result.stderr
    assert invoke(db, "recover").exit_code == 2  # --effects is required


# -- gc --------------------------------------------------------------------------------------


def test_gc_removes_only_settled_completed_tasks(db: str) -> None:
    with intentlog.open(db) as journal:
        with journal.task("done") as task:
            task.run(OK, n=1)
            task.complete()
        with journal.task("unfinished") as task:
            task.run(OK, n=2)
            task.checkpoint(next_step="ship")
        with journal.task("stuck") as task:
            with pytest.raises(intentlog.OutcomeUnknown):
                task.run(EMAIL, to="b@example.com")
            task.complete()
    time.sleep(0.01)
    result = invoke(db, "gc", "--older-than", "1d")
    assert result.exit_code == 0 and "removed 0 " in result.stdout

    result = invoke(db, "gc", "--older-than", "0s")
    assert result.exit_code == 0, result.output
    assert "removed 1 " in result.stdout
    with intentlog.open(db) as journal:
        assert {t.task_id for t in journal.tasks()} == {"unfinished", "stuck"}
        assert journal.operations("done") == []


@pytest.mark.parametrize(
    ("value", "seconds"), [("30d", 2592000), ("12h", 43200), ("45m", 2700), ("90s", 90), ("15", 15)]
)
def test_gc_durations(db: str, value: str, seconds: float) -> None:
    result = invoke(db, "gc", "--older-than", value, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {
        "journal": json.loads(invoke(db, "status", "--json").stdout)["journal"],
        "older_than_seconds": seconds,
        "removed": 0,
    }


@pytest.mark.parametrize("value", ["3x", "-5", "d", "1.5.2h"])
def test_gc_bad_duration_is_a_usage_error(db: str, value: str) -> None:
    result = invoke(db, "gc", "--older-than", value)
    assert result.exit_code == 2
    assert "--older-than" in result.stderr


# -- help, errors, masking -------------------------------------------------------------------


@pytest.mark.parametrize(
    "command", [[], ["status"], ["show"], ["resolve"], ["recover"], ["gc"], ["console"]]
)
def test_every_help_has_an_example(command: list[str]) -> None:
    result = invoke(None, *command, "--help")
    assert result.exit_code == 0
    assert "Example:" in result.stdout and "intentlog" in result.stdout


def test_status_help_documents_exit_codes() -> None:
    text = invoke(None, "status", "--help").stdout
    for code in ("0", "1", "2", "3", "4"):
        assert f"  {code}  " in text


@pytest.mark.parametrize(
    "url", ["postgresql://u:secret@localhost/db", "sqlite://u:secret@localhost/db"]
)
def test_password_is_never_printed(url: str) -> None:
    result = invoke(url, "status")
    assert result.exit_code == 1
    assert result.stderr.startswith("error: ")
    assert "secret" not in result.output
    env_result = invoke(None, "status", env={"INTENTLOG_URL": url})
    assert env_result.exit_code == 1 and "secret" not in env_result.output


def test_mask() -> None:
    assert mask("at postgresql://u:pw@h/db now") == "at postgresql://u:***@h/db now"
    assert mask("x", "postgresql://u:p%40ss@h/db") == "x"
    assert mask("got p%40ss", "postgresql://u:p%40ss@h/db") == "got ***"


def test_missing_journal_is_not_created(tmp_path: Path) -> None:
    path = tmp_path / "typo.db"
    result = invoke(str(path), "status")
    assert result.exit_code == 1
    assert "no journal at" in result.stderr and not path.exists()


def test_not_a_journal(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("hello")
    result = invoke(str(path), "status")
    assert result.exit_code == 1
    assert result.stderr.startswith("error: ") and "not a SQLite file" in result.stderr


def test_main_entry_point(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--db", db, "status", "--json"])
    assert exc.value.code == 0
    assert json.loads(capsys.readouterr().out)["needs_person"] is False


# -- as a real process -----------------------------------------------------------------------


def run_cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "INTENTLOG_URL": url}
    return subprocess.run(
        [sys.executable, "-m", "intentlog.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_subprocess_status_and_resolve(db: str) -> None:
    assert run_cli(db, "status").returncode == 0
    key = make_unresolved(db)
    proc = run_cli(db, "status", "--json")
    assert proc.returncode == 3, proc.stderr
    assert json.loads(proc.stdout)["needs_person"] is True
    proc = run_cli(db, "resolve", key, "--confirmed", "--receipt", '{"id": "x"}', "--note", "seen")
    assert proc.returncode == 0, proc.stderr
    assert "CONFIRMED" in proc.stdout
    assert op_state(db, key) is intentlog.State.CONFIRMED
    proc = run_cli(db, "status")
    assert proc.returncode == 3  # the task still has to resume, and no worker runs it
    assert "RESUME" in proc.stdout


def test_subprocess_errors_and_masking(db: str) -> None:
    proc = run_cli("postgresql://u:secret@localhost/db", "status")
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: ") and "secret" not in proc.stderr + proc.stdout
    proc = run_cli(db, "resolve", "nope", "--retry")
    assert proc.returncode == 1 and "error: no operation with key 'nope'" in proc.stderr
    proc = run_cli(db, "gc", "--older-than", "soon")
    assert proc.returncode == 2 and "--older-than" in proc.stderr
    proc = run_cli(db, "--help")
    assert proc.returncode == 0 and proc.stdout.startswith("Usage: intentlog")


# -- --db and --json on either side of the command -------------------------------------------


def invoke_argv(*argv: str, env: dict[str, str] | None = None) -> Result:
    result = CliRunner(env=env).invoke(cli, list(argv), prog_name="intentlog")
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def orders(db: str, *command: str) -> dict[str, list[str]]:
    """The same command with --db and --json before it, after it, and split around it."""
    return {
        "before": ["--db", db, "--json", *command],
        "after": [*command, "--db", db, "--json"],
        "split": ["--json", *command, "--db", db],
    }


def _json_runs(db: str, *command: str) -> dict[str, Any]:
    runs = {}
    for order, argv in orders(db, *command).items():
        result = invoke_argv(*argv)
        assert result.exit_code in (0, 3, 4), (order, result.output)
        runs[order] = json.loads(result.stdout)
    return runs


def test_status_and_show_take_db_and_json_on_either_side(db: str) -> None:
    make_unresolved(db)
    for command in (["status"], ["show", "order-1"]):
        runs = _json_runs(db, *command)
        assert runs["before"] == runs["after"] == runs["split"], command
        assert runs["before"]["journal"].endswith("journal.db")


def test_resolve_takes_db_and_json_on_either_side(db: str) -> None:
    for order in ("before", "after", "split"):
        key = make_unresolved(db, task_id=f"order-{order}")
        result = invoke_argv(
            *orders(db, "resolve", key, "--retry", "--confirm", "retry send_email")[order]
        )
        assert result.exit_code == 0, (order, result.output)
        assert json.loads(result.stdout)["state"] == "PLANNED"
        assert op_state(db, key) is intentlog.State.PLANNED


def test_gc_start_and_recover_take_db_and_json_on_either_side(db: str, effects_module: Any) -> None:
    for order, argv in orders(db, "gc", "--older-than", "30d").items():
        result = invoke_argv(*argv)
        assert result.exit_code == 0, (order, result.output)
        assert json.loads(result.stdout)["removed"] == 0
    for order, argv in orders(db, "start", "kind", "t-before").items():
        argv = [a.replace("t-before", f"t-{order}") for a in argv]
        result = invoke_argv(*argv)
        assert result.exit_code == 0, (order, result.output)
        assert json.loads(result.stdout) == {"task": f"t-{order}", "kind": "kind", "created": True}
    module = effects_module(
        "either_side_effects", "import intentlog\nE = intentlog.Effect('e', print)\n"
    )
    for order, argv in orders(db, "recover", "--effects", module).items():
        result = invoke_argv(*argv)
        assert result.exit_code == 0, (order, result.output)
        assert json.loads(result.stdout)["effects"] == ["e"]
    with intentlog.open(db) as journal:
        assert {t.task_id for t in journal.tasks()} == {"t-before", "t-after", "t-split"}


def test_worker_takes_db_and_json_on_either_side(db: str, effects_module: Any) -> None:
    module = effects_module(
        "either_side_app",
        """
        import intentlog

        registry = intentlog.Registry()

        @registry.task("noop")
        def noop(task, input):
            task.checkpoint(next_step="done", state=input)
        """,
    )
    for order, argv in orders(db, "worker", "--app", f"{module}:registry").items():
        with intentlog.open(db) as journal:
            journal.start("noop", f"job-{order}", {"n": 1})
        result = invoke_argv(*argv, "--exit-when-idle", "--poll", "0.05")
        assert result.exit_code == 0, (order, result.output)
        assert json.loads(result.stdout) == {"completed": 1, "parked": 0, "failed": 0}
    with intentlog.open(db) as journal:
        assert all(journal.task_info(f"job-{o}").record.completed for o in orders(db))


def test_demo_takes_json_on_either_side(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[bool] = []

    def run_demo(directory: Any, *, as_json: bool) -> int:
        seen.append(as_json)
        return 0

    import intentlog.demo._run  # the demo itself runs in tests/test_demo.py; here, its options

    monkeypatch.setattr(intentlog.demo._run, "run_demo", run_demo)
    for argv in (["--json", "demo"], ["demo", "--json"], ["demo"]):
        assert invoke_argv(*argv).exit_code == 0
    assert seen == [True, True, False]


def test_the_command_s_db_wins_over_the_group_s_and_the_environment(
    db: str, tmp_path: Path
) -> None:
    missing = str(tmp_path / "missing.db")
    result = invoke_argv("--db", missing, "status", "--db", db, "--json")
    assert result.exit_code == 0, result.output
    result = invoke_argv("status", "--db", db, env={"INTENTLOG_URL": missing})
    assert result.exit_code == 0, result.output
    result = invoke_argv("--db", db, "status", env={"INTENTLOG_URL": missing})
    assert result.exit_code == 0, result.output
    result = invoke_argv("status", env={"INTENTLOG_URL": missing})
    assert result.exit_code == 1 and "no journal at" in result.stderr
    # an error names the journal the command really used, its password masked
    result = invoke_argv("--db", db, "status", "--db", "postgresql://u:secret@127.0.0.1:9/x")
    assert result.exit_code == 1 and "secret" not in result.output


def test_subprocess_options_after_the_command(db: str) -> None:
    make_unresolved(db)
    env = {k: v for k, v in os.environ.items() if k != "INTENTLOG_URL"}
    proc = subprocess.run(
        [sys.executable, "-m", "intentlog.cli", "status", "--db", db, "--json"],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 3, proc.stderr
    assert json.loads(proc.stdout)["needs_person"] is True


@pytest.mark.parametrize(
    "argv",
    [
        ["worker", "--app", "m:r", "--poll", "nan"],
        ["worker", "--app", "m:r", "--lease-ttl", "nan"],
        ["worker", "--app", "m:r", "--poll", "inf"],
        ["recover", "--effects", "m", "--wait", "nan"],
        ["recover", "--effects", "m", "--wait", "inf"],
    ],
    ids=" ".join,
)
def test_nan_and_inf_seconds_are_usage_errors(db: str, argv: list[str]) -> None:
    result = invoke(db, *argv)
    assert result.exit_code == 2, result.output
    option = next(a for a in argv if a.startswith("--") and a not in ("--app", "--effects"))
    assert option in result.stderr and "not a finite number of seconds" in result.stderr
