"""One view, one truth: a task's next action follows from its operations' decided next
actions in every face (library, ``status``, ``show``, text and JSON, the console), and
``show`` says when arguments were not kept. Real SQLite journals, real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import intentlog
from console_support import running_console, task_path
from intentlog import Action, State
from intentlog._decide import task_action

# A mail through a service that can neither deduplicate nor be asked, interrupted with
# Ctrl-C (SIGINT) while the request is in flight: the operation stays SUBMITTED, its
# process is gone, and nothing automatic can tell whether it landed.
_CHILD = textwrap.dedent(
    """
    import signal, sys, time
    import intentlog

    # A process started in the background by a non-interactive shell inherits SIGINT
    # ignored, and Python then installs no KeyboardInterrupt handler: put Ctrl-C back.
    signal.signal(signal.SIGINT, signal.default_int_handler)

    def send(key, **kwargs):
        print("sending", flush=True)
        time.sleep(60)  # the request in flight, until Ctrl-C

    MAIL = intentlog.Effect("send_mail", send)
    with intentlog.open(sys.argv[1]) as journal, journal.task("order-1") as task:
        task.run(MAIL, to="ana@example.com")
    """
)


def _cli(db: Path, *args: str, columns: int = 100) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": str(columns)}
    return subprocess.run(
        [sys.executable, "-m", "intentlog.cli", "--db", str(db), *args],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A journal whose one task's mail was interrupted mid-send by Ctrl-C; its key."""
    where = tmp_path_factory.mktemp("interrupted")
    script, db = where / "child.py", where / "journal.db"
    script.write_text(_CHILD)
    child = subprocess.Popen(
        [sys.executable, str(script), str(db)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert child.stdout is not None
    assert child.stdout.readline() == "sending\n"
    child.send_signal(signal.SIGINT)
    _, err = child.communicate(timeout=60)
    assert child.returncode != 0 and "KeyboardInterrupt" in err, err
    with intentlog.open(db) as journal:
        (op,) = journal.operations("order-1")
    assert op.state is State.SUBMITTED
    return db, op.key


def test_the_library_escalates_the_task_with_its_operation(interrupted: tuple[Path, str]) -> None:
    db, key = interrupted
    with intentlog.open(db) as journal:
        (pending,) = journal.pending()
        info = journal.task_info("order-1")
        (listed,) = journal.attention()
    assert (pending.key, pending.state, pending.next_action) == (key, State.SUBMITTED,
                                                                 Action.ESCALATE)  # fmt: skip
    assert info.next_action is Action.ESCALATE  # was RECONCILE: the states alone
    assert listed.next_action is Action.ESCALATE
    assert info.outlook is not None and info.outlook.doer.value == "person"
    # Named by its state: it is SUBMITTED, not (yet) UNRESOLVED.
    assert f"operation {key} is in doubt" in info.outlook.reason
    assert "UNRESOLVED" not in info.outlook.reason


def test_status_shows_one_next_action(interrupted: tuple[Path, str]) -> None:
    db, key = interrupted
    done = _cli(db, "status")
    assert done.returncode == 3, done.stdout + done.stderr
    out = done.stdout
    op_row = next(line for line in out.splitlines() if line.endswith(key))
    task_row = next(line for line in out.splitlines() if line.startswith("order-1  ") and
                    "person" in line)  # fmt: skip
    assert op_row.split()[2:4] == ["SUBMITTED", "ESCALATE"]
    assert task_row.split()[1:3] == ["ESCALATE", "person"]
    assert "RECONCILE" not in out and "is UNRESOLVED" not in out
    # One step for the person, named as the rows name it; not "complete or cancel" as well.
    assert "needs a person: resolve the ESCALATE operations:" in out
    assert "complete or cancel" not in out

    doc = json.loads(_cli(db, "status", "--json").stdout)
    (item,) = doc["pending"]
    (task,) = doc["tasks"]
    assert (item["state"], item["next_action"]) == ("SUBMITTED", "ESCALATE")
    assert (task["next_action"], task["who"]) == ("ESCALATE", "person")
    assert doc["needs_person"] is True


def test_show_shows_one_next_action(interrupted: tuple[Path, str]) -> None:
    db, _ = interrupted
    shown = _cli(db, "show", "order-1")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert "next action   ESCALATE" in lines
    assert "  next     ESCALATE" in lines
    assert "RECONCILE" not in shown.stdout and "is UNRESOLVED" not in shown.stdout

    doc = json.loads(_cli(db, "show", "order-1", "--json").stdout)
    (op,) = doc["operations"]
    assert doc["task"]["next_action"] == op["next_action"] == "ESCALATE"


def test_the_console_shows_the_same_next_action(interrupted: tuple[Path, str]) -> None:
    db, _ = interrupted
    with running_console(str(db), "--read-only") as console, console.client() as client:
        page = client.get(task_path("order-1"))
        overview = client.get("/")
    assert page.status_code == 200 and overview.status_code == 200
    assert "<tr><th>Next action</th><td><strong>ESCALATE</strong></td></tr>" in page.text
    assert "RECONCILE" not in page.text and "RECONCILE" not in overview.text
    # Listed once, as needing a person; not again among the tasks nobody works on.
    assert 'id="idle"' not in overview.text


def _boom(key: str, **kwargs: Any) -> Any:
    raise ConnectionError("connection reset by peer")


def _ok(key: str, **kwargs: Any) -> Any:
    return {"id": f"ok-{kwargs['n']}"}


def test_every_task_s_next_action_follows_its_operations_decisions(tmp_path: Path) -> None:
    """The faces against the decision, over one journal with a task in each situation."""
    db = tmp_path / "journal.db"
    neither = intentlog.Effect("mail", _boom, timeout=0.01)
    dedupes = intentlog.Effect("publish", _boom, idempotent=True,
                               key_retention=intentlog.FOREVER, timeout=30)  # fmt: skip
    ok = intentlog.Effect("ok", _ok, idempotent=True, key_retention=intentlog.FOREVER)
    with intentlog.open(db, max_wait=0, attempts_per_run=1) as journal:
        with journal.task("unresolved") as task, pytest.raises(intentlog.OutcomeUnknown):
            task.run(neither, n=1)
        with journal.task("waiting") as task, pytest.raises(intentlog.StillInFlight):
            task.run(dedupes, n=2)
        with journal.task("planned") as task:
            task.run(ok, n=3)
            task.plan(ok, n=4)
        with journal.task("done") as task:
            task.run(ok, n=5)
            task.complete()
    with intentlog.open(db) as journal:
        decided: dict[str, list[Action]] = {}
        for p in journal.pending():
            decided.setdefault(p.task_id, []).append(p.next_action)
        expected = {}
        for task_id in ("unresolved", "waiting", "planned", "done"):
            info = journal.task_info(task_id)
            states = [op.state for op in info.operations]
            expected[task_id] = task_action(states, info.record.completed, decided.get(task_id, []))
            assert info.next_action is expected[task_id], task_id
    assert expected == {"unresolved": Action.ESCALATE, "waiting": Action.RECONCILE,
                        "planned": Action.SUBMIT, "done": None}  # fmt: skip
    doc = json.loads(_cli(db, "status", "--json").stdout)
    assert {t["task_id"]: t["next_action"] for t in doc["tasks"]} == {
        t: a.value for t, a in expected.items() if a is not None
    }
    for task_id, action in expected.items():
        shown = json.loads(_cli(db, "show", task_id, "--json").stdout)["task"]
        assert shown["next_action"] == (action.value if action else None), task_id


@pytest.mark.parametrize(
    ("states", "decided", "expected"),
    [
        ([State.SUBMITTED], [Action.ESCALATE], Action.ESCALATE),  # nothing can settle it
        ([State.SUBMITTED], [Action.WAIT], Action.RECONCILE),
        ([State.SUBMITTED], [Action.RECONCILE], Action.RECONCILE),
        ([State.SUBMITTED, State.PLANNED], [Action.SUBMIT, Action.SUBMIT], Action.RECONCILE),
        ([State.PLANNED], [Action.ESCALATE], Action.ESCALATE),  # a retry now judged risky
        ([State.UNRESOLVED], [], Action.ESCALATE),  # the states alone, as a task handle has
        ([State.SUBMITTED], [], Action.RECONCILE),
    ],
)
def test_task_action_takes_the_decided_actions(
    states: list[State], decided: list[Action], expected: Action
) -> None:
    assert task_action(states, False, decided) is expected
    assert task_action(iter(states), False, iter(decided)) is expected  # read once


# -- show says when the arguments were not kept ----------------------------------------------


def test_show_says_the_arguments_were_not_stored(tmp_path: Path) -> None:
    db = tmp_path / "journal.db"
    plain = intentlog.Effect("ok", _ok, idempotent=True, key_retention=intentlog.FOREVER)
    kept = intentlog.Effect("kept", _ok, idempotent=True, key_retention=intentlog.FOREVER,
                            store_args=True)  # fmt: skip
    with intentlog.open(db) as journal, journal.task("order-1") as task:
        task.run(plain, n=1)
        task.run(kept, n=2)
        plain_op, kept_op = journal.operations("order-1")
    shown = _cli(db, "show", "order-1")
    assert shown.returncode == 0, shown.stderr
    args = [line.split(None, 1)[1] for line in shown.stdout.splitlines()
            if line.startswith("  args ")]  # fmt: skip
    assert args == [
        f"not stored (store_args=False); fingerprint {plain_op.fingerprint[:16]}...",
        '{"n": 2}',
    ]
    assert "args     -" not in shown.stdout

    doc = json.loads(_cli(db, "show", "order-1", "--json").stdout)
    first, second = doc["operations"]
    assert (first["args"], first["args_stored"]) == (None, False)
    assert first["fingerprint"] == plain_op.fingerprint and len(first["fingerprint"]) == 64
    assert (second["args"], second["args_stored"]) == ({"n": 2}, True)
    assert second["fingerprint"] == kept_op.fingerprint
