"""``intentlog console`` as a real process over real HTTP: the token, CSRF, read-only mode,
escaping, the secret hygiene on receipts, who resolved what, and the retry confirmation."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

import intentlog
from console_support import (
    CHARGE,
    EMAIL,
    csrf_of,
    make_unresolved,
    running_console,
    task_path,
)
from intentlog._view import headroom
from intentlog.stores._base import Resolution

SCRIPT = "<script>alert(1)</script>"
ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"


@pytest.fixture
def db(tmp_path: Path) -> str:
    """A journal file with one UNRESOLVED operation in task order-1."""
    path = str(tmp_path / "journal.db")
    make_unresolved(path)
    return path


def only_op(url: str, task_id: str = "order-1") -> intentlog.Operation:
    with intentlog.open(url) as journal:
        (op,) = journal.operations(task_id)
        return op


def resolutions(url: str) -> list[Resolution]:
    with intentlog.open(url) as journal:
        return journal.resolutions()


def post_resolve(client: httpx.Client, task_id: str, key: str, **fields: str) -> httpx.Response:
    """Fill and send the resolve form of ``key`` as shown on its task page."""
    page = client.get(task_path(task_id))
    assert page.status_code == 200, page.text
    shown = re.search(rf'id="resolve-{re.escape(key)}".*?name="seen" value="([^"]+)"', page.text,
                      re.DOTALL)  # fmt: skip
    assert shown, f"no resolve form for {key}"
    data = {"csrf": csrf_of(page.text), "key": key, "seen": shown[1], **fields}
    return client.post("/resolve", data=data)


# -- the main flow, on SQLite and PostgreSQL ---------------------------------------------------


def test_a_person_resolves_an_unresolved_operation(journal_url: str) -> None:
    key = make_unresolved(journal_url)
    with running_console(journal_url) as console, console.client() as client:
        overview = client.get("/")
        assert overview.status_code == 200
        assert "Needs a person (1)" in overview.text
        assert f'href="{task_path("order-1")}#op-{key}"' in overview.text
        page = client.get(task_path("order-1"))
        assert "ESCALATE" in page.text and "cannot be asked" in page.text
        assert "Nobody has resolved it by hand." in page.text
        response = post_resolve(
            client, "order-1", key, outcome="confirmed", receipt='{"id": "em_1"}',
            note="in the relay's log", actor="alice@ops",
        )  # fmt: skip
        assert response.status_code == 303
        assert response.headers["location"] == f"{task_path('order-1')}#op-{key}"
        page = client.get(response.headers["location"])
        assert "alice@ops" in page.text and "in the relay&#39;s log" in page.text
        assert "UNRESOLVED &rarr; CONFIRMED" in page.text
        assert "Needs a person (0)" in client.get("/").text
    op = only_op(journal_url)
    assert (op.state, op.receipt, op.note) == (intentlog.State.CONFIRMED, {"id": "em_1"},
                                               "in the relay's log")  # fmt: skip
    (audit,) = resolutions(journal_url)
    assert (audit.actor, audit.from_state, audit.to_state) == (
        "alice@ops", intentlog.State.UNRESOLVED, intentlog.State.CONFIRMED,
    )  # fmt: skip


# -- the token ---------------------------------------------------------------------------------


def test_every_request_needs_the_token(db: str) -> None:
    with running_console(db) as console:
        assert console.token and len(console.token) >= 40
        with httpx.Client(base_url=console.base, timeout=60.0) as anonymous:
            for path in ("/", task_path("order-1"), "/console.css", "/metrics", "/nowhere"):
                response = anonymous.get(path)
                assert response.status_code == 401, path
                assert response.headers["www-authenticate"] == "Bearer"
            assert anonymous.post("/resolve", data={"key": "x"}).status_code == 401
            wrong = "x" * len(console.token)
            assert anonymous.get(f"/?token={wrong}").status_code == 403
            assert (
                anonymous.get("/", headers={"Authorization": f"Bearer {wrong}"}).status_code == 403
            )
            forged = f"intentlog_console_{console.base.rsplit(':', 1)[1]}=abc.def"
            assert anonymous.get("/", headers={"Cookie": forged}).status_code == 403
            bearer = anonymous.get("/", headers={"Authorization": f"Bearer {console.token}"})
            assert bearer.status_code == 200 and "Needs a person (1)" in bearer.text
            for response in (bearer, anonymous.get("/")):
                headers = response.headers
                assert headers["x-frame-options"] == "DENY"
                assert "script-src 'none'" in headers["content-security-policy"]
                assert "frame-ancestors 'none'" in headers["content-security-policy"]
                assert headers["cache-control"] == "no-store"
    assert sum(console.token in line for line in console.lines) == 1  # printed once, at start


def test_the_token_visit_becomes_a_session_cookie(db: str) -> None:
    with running_console(db) as console, httpx.Client(base_url=console.base) as client:
        assert console.token is not None
        response = client.get(f"/task/order-1?token={console.token}&x=1")
        assert response.status_code == 303
        assert response.headers["location"] == "/task/order-1?x=1"  # the token leaves the URL
        cookie = response.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/" in cookie
        assert console.token not in cookie
        page = client.get("/task/order-1")
        assert page.status_code == 200 and "order-1" in page.text


def test_a_token_from_the_environment_is_used_and_not_printed(db: str) -> None:
    token = "an-operator-chosen-token-0123456789"
    env = {"MY_CONSOLE_TOKEN": token}
    with running_console(db, "--token-env", "MY_CONSOLE_TOKEN", env=env) as console:
        assert console.token is None and console.login == "/"
        assert not any(token in line for line in console.lines)
        assert "token from $MY_CONSOLE_TOKEN" in "".join(console.lines)
        with httpx.Client(base_url=console.base) as client:
            assert client.get("/").status_code == 401
            assert client.get(f"/?token={token}").status_code == 303
            assert client.get("/").status_code == 200


def console_exit(db: str, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "intentlog.cli", "console", "--db", db, *args]
    child_env = {k: v for k, v in os.environ.items() if k != "INTENTLOG_CONSOLE_TOKEN"}
    return subprocess.run(
        command, env={**child_env, **env}, capture_output=True, text=True, timeout=120
    )


def test_listening_beyond_loopback_needs_a_token_from_the_environment(db: str) -> None:
    result = console_exit(db, "--host", "0.0.0.0", "--port", "0", env={})
    assert result.returncode == 2, result.stderr
    assert "refusing to listen on 0.0.0.0" in result.stderr
    assert "INTENTLOG_CONSOLE_TOKEN" in result.stderr
    exposed = ("--host", "0.0.0.0", "--port", "0", "--token-env", "T")
    result = console_exit(db, *exposed, env={"T": "short"})
    assert result.returncode == 2 and "$T: the token must be at least 16" in result.stderr
    result = console_exit(str(Path(db).with_name("missing.db")), "--port", "0", env={})
    assert result.returncode == 1 and "no journal at" in result.stderr
    assert not Path(db).with_name("missing.db").exists()


# -- CSRF and read-only ------------------------------------------------------------------------


def test_a_post_without_the_sessions_csrf_token_is_refused(db: str) -> None:
    key = only_op(db).key
    fields = {"key": key, "outcome": "failed", "actor": "mallory"}
    with running_console(db) as console, console.client() as client, console.client() as other:
        assert client.post("/resolve", data=fields).status_code == 403
        assert client.post("/resolve", data={**fields, "csrf": "0" * 64}).status_code == 403
        # Another session's token is not this session's.
        theirs = csrf_of(other.get(task_path("order-1")).text)
        assert client.post("/resolve", data={**fields, "csrf": theirs}).status_code == 403
        refused = client.post("/resolve", data=fields)
        assert "CSRF token is missing or wrong" in refused.text
        # Token-authenticated requests have a CSRF token of their own too.
        bearer = {"Authorization": f"Bearer {console.token}"}
        assert client.post("/resolve", data=fields, headers=bearer).status_code == 403
    assert only_op(db).state is intentlog.State.UNRESOLVED and resolutions(db) == []


def test_read_only_shows_no_forms_and_refuses_posts(db: str) -> None:
    key = only_op(db).key
    with running_console(db, "--read-only") as console, console.client() as client:
        page = client.get(task_path("order-1"))
        assert page.status_code == 200 and "read-only" in page.text
        assert "<form" not in page.text and 'name="csrf"' not in page.text
        response = client.post("/resolve", data={"key": key, "outcome": "failed", "actor": "a"})
        assert response.status_code == 403 and "read-only" in response.text
    assert only_op(db).state is intentlog.State.UNRESOLVED and resolutions(db) == []


# -- escaping and hygiene ----------------------------------------------------------------------


def test_what_services_and_agents_wrote_is_shown_as_text(tmp_path: Path) -> None:
    db = str(tmp_path / "journal.db")
    key = make_unresolved(db, SCRIPT)
    with running_console(db) as console, console.client() as client:
        overview = client.get("/").text
        assert ESCAPED in overview and SCRIPT not in overview
        response = post_resolve(
            client, SCRIPT, key, outcome="confirmed", receipt=f'{{"memo": "{SCRIPT}"}}',
            note=f"note {SCRIPT}", actor="alice",
        )  # fmt: skip
        assert response.status_code == 303
        page = client.get(response.headers["location"])
        assert page.status_code == 200
        assert "<script" not in page.text.lower()
        assert f'Task <span class="task-id">{ESCAPED}</span>' in page.text
        assert f"&#34;memo&#34;: &#34;{ESCAPED}&#34;" in page.text  # the receipt
        assert f"note {ESCAPED}" in page.text
    assert only_op(db, SCRIPT).receipt == {"memo": SCRIPT}


def test_a_receipt_holding_a_secret_is_refused_and_nothing_is_written(db: str) -> None:
    key = only_op(db).key
    secret = "sk_live_4eC39HqLyjWDarjtT1zdp7dc"
    with running_console(db) as console, console.client() as client:
        response = post_resolve(
            client, "order-1", key, outcome="confirmed", receipt=f'{{"api_key": "{secret}"}}',
            note="from the dashboard", actor="alice",
        )  # fmt: skip
        assert response.status_code == 400
        assert "Nothing was written: receipt.api_key looks like a credential" in response.text
        assert secret not in response.text  # not echoed back into the form
        assert 'value="alice"' in response.text  # the rest of the form is kept
        bad = post_resolve(client, "order-1", key, outcome="confirmed", receipt="{oops",
                           actor="alice")  # fmt: skip
        assert bad.status_code == 400 and "the receipt is not valid JSON" in bad.text
        nested = post_resolve(client, "order-1", key, outcome="confirmed",
                              receipt="[" * 200 + "]" * 200, actor="alice")  # fmt: skip
        assert nested.status_code == 400 and "Nothing was written" in nested.text
    assert only_op(db).state is intentlog.State.UNRESOLVED and resolutions(db) == []


# -- who resolved it, and the retry confirmation -----------------------------------------------


def test_each_outcome_records_who_resolved_it(tmp_path: Path) -> None:
    db = str(tmp_path / "journal.db")
    keys = {outcome: make_unresolved(db, f"t-{outcome}") for outcome in ("confirmed", "failed")}
    keys["retry"] = make_unresolved(db, "t-retry", CHARGE, amount=5)  # can be asked
    with running_console(db) as console, console.client() as client:
        no_name = post_resolve(client, "t-failed", keys["failed"], outcome="failed")
        assert no_name.status_code == 400 and "Your name is needed" in no_name.text
        token_name = post_resolve(client, "t-failed", keys["failed"], outcome="failed",
                                  actor="sk_live_4eC39HqLyjWDarjtT1zdp7dc")  # fmt: skip
        assert token_name.status_code == 400 and "actor looks like a credential" in token_name.text
        for outcome, key in keys.items():
            actor = f"{outcome}-person@ops"
            typed = {"confirm": "retry charge"} if outcome == "retry" else {}  # no dedupe
            response = post_resolve(client, f"t-{outcome}", key, outcome=outcome, actor=actor,
                                    **typed)  # fmt: skip
            assert response.status_code == 303, response.text
            assert actor in client.get(response.headers["location"]).text
    with intentlog.open(db) as journal:
        found = {r.key: (r.actor, r.to_state) for r in journal.resolutions()}
    assert found == {
        keys["confirmed"]: ("confirmed-person@ops", intentlog.State.CONFIRMED),
        keys["failed"]: ("failed-person@ops", intentlog.State.FAILED),
        keys["retry"]: ("retry-person@ops", intentlog.State.PLANNED),
    }


def test_a_retry_that_may_apply_twice_needs_the_phrase(db: str) -> None:
    key = only_op(db).key
    with running_console(db) as console, console.client() as client:
        page = client.get(task_path("order-1")).text
        assert "a retry applies it twice" in page
        assert '<code class="phrase">retry send_email</code>' in page
        for typed in ({}, {"confirm": "retry"}, {"confirm": "retry charge"}):
            response = post_resolve(client, "order-1", key, outcome="retry", actor="bob", **typed)
            assert response.status_code == 400
            assert "Not retried." in response.text and "“retry send_email”" in response.text
        assert resolutions(db) == [] and only_op(db).state is intentlog.State.UNRESOLVED
        response = post_resolve(
            client, "order-1", key, outcome="retry", actor="bob", confirm="retry send_email"
        )
        assert response.status_code == 303
    assert only_op(db).state is intentlog.State.PLANNED
    assert [r.actor for r in resolutions(db)] == ["bob"]


def test_a_retry_of_an_effect_that_can_be_asked_still_needs_the_phrase(tmp_path: Path) -> None:
    # One rule for every face: without deduplication a retry may apply it twice, whether or
    # not the service could have been asked; the warning says to ask it first.
    db = str(tmp_path / "journal.db")
    key = make_unresolved(db, "t-1", CHARGE, amount=5)
    with running_console(db) as console, console.client() as client:
        page = client.get(task_path("t-1")).text
        assert "Ask the service first that it did not land" in page
        assert '<code class="phrase">retry charge</code>' in page
        refused = post_resolve(client, "t-1", key, outcome="retry", actor="bob")
        assert refused.status_code == 400 and "Not retried." in refused.text
        response = post_resolve(client, "t-1", key, outcome="retry", actor="bob",
                                confirm="retry charge")  # fmt: skip
        assert response.status_code == 303


# -- the overview's facts ----------------------------------------------------------------------


def _ok(key: str, **kwargs: object) -> dict[str, str]:
    return {"id": "ok"}


def test_the_overview_shows_headroom_and_leases(tmp_path: Path) -> None:
    db = str(tmp_path / "journal.db")
    kept = intentlog.Effect("publish", _ok, idempotent=True, key_retention=3600)
    forever = intentlog.Effect("put", _ok, idempotent=True, key_retention=intentlog.FOREVER)
    with intentlog.open(db) as journal, journal.task("done") as task:
        task.run(kept)
        task.run(forever)
        task.complete()
    make_unresolved(db, "stuck")
    with running_console(db) as console, console.client() as client:
        with intentlog.open(db) as journal, journal.task("held") as held:
            page = client.get("/").text
            epoch = held.epoch
        assert "1 h" in page and "the whole retention (nothing in flight)" in page
        assert "forever (the service keeps keys for good)" in page
        assert "does not deduplicate and cannot be asked" in page
        assert f'{task_path("held")}">held</a>' in page and f"<td>{epoch}</td>" in page
        assert f"{socket.gethostname()}:{os.getpid()}" in page  # the worker holding it
        assert "No operation is SUBMITTED." in page
        assert client.get(task_path("nope")).status_code == 404


def test_headroom_counts_from_the_oldest_key_in_flight() -> None:
    policy = intentlog.Policy(idempotent=True, key_retention=100.0)
    now = 1000.0

    def op(key: str, effect: str, state: intentlog.State, first: float) -> intentlog.Operation:
        return intentlog.Operation(
            key, "t", effect, "f", state, policy, created_at=first, updated_at=first,
            attempts=1, submitted_at=first, first_submitted_at=first,
        )  # fmt: skip

    ops = [
        op("a", "pay", intentlog.State.SUBMITTED, 950.0),  # 50 s left
        op("b", "pay", intentlog.State.SUBMITTED, 980.0),  # 80 s left
        op("c", "pay", intentlog.State.CONFIRMED, 900.0),  # settled: does not count
        op("d", "old", intentlog.State.SUBMITTED, 850.0),  # expired 50 s ago
    ]
    rows = {h.effect: h for h in headroom(ops, now)}
    assert (rows["pay"].seconds, rows["pay"].in_flight, rows["pay"].retention) == (50.0, 2, 100.0)
    assert rows["old"].seconds == -50.0 and "expired 50 s ago" in rows["old"].text
    assert [h.seconds for h in headroom(ops[2:3], now)] == [100.0]
    assert EMAIL.policy.idempotent is False


def test_a_form_for_a_situation_that_changed_writes_nothing(db: str) -> None:
    key = only_op(db).key
    with running_console(db) as console, console.client() as client:
        page = client.get(task_path("order-1")).text
        assert 'name="seen" value="UNRESOLVED:1"' in page
        with intentlog.open(db) as journal:  # someone else decides meanwhile
            journal.resolve(key, "retry", actor="carol", note="not in the relay's log",
                            accept_risk=True)  # fmt: skip
        # 'failed' applies to a PLANNED operation too: only the form's record of what was
        # shown stops a decision about another situation.
        data = {"csrf": csrf_of(page), "key": key, "seen": "UNRESOLVED:1",
                "outcome": "failed", "actor": "dave"}  # fmt: skip
        response = client.post("/resolve", data=data)
        assert response.status_code == 400
        assert "changed since the page was shown (it is PLANNED now" in response.text
        assert "carol" in response.text  # the page shows the other decision
    assert only_op(db).state is intentlog.State.PLANNED
    assert [r.actor for r in resolutions(db)] == ["carol"]


def test_the_cli_loads_the_web_stack_only_for_the_console(db: str) -> None:
    code = (
        "import sys, intentlog.cli\n"
        "web = {'starlette', 'jinja2', 'uvicorn'} & {m.split('.')[0] for m in sys.modules}\n"
        "assert not web, web\n"
        "for name in ('starlette', 'jinja2', 'uvicorn'):\n"
        "    sys.modules[name] = None  # as if the extra were not installed\n"
        f"intentlog.cli.main(['console', '--db', {db!r}, '--port', '0'])\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert "needs its extra: pip install -e '.[console]' in intentlog's clone" in result.stderr
    assert "(pip install 'intentlog[console]' once it is published)" in result.stderr


def test_the_consoles_metrics_are_the_journals_in_prometheus_text(db: str) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    with running_console(db) as console, console.client() as client:
        response = client.get("/metrics")
        anonymous = httpx.get(f"{console.base}/metrics", timeout=60.0)
    assert anonymous.status_code == 401  # the token guards the metrics too
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }
    assert samples[("intentlog_unresolved", ())] == 1
    assert samples[("intentlog_operations", (("state", "UNRESOLVED"),))] == 1
    assert samples[("intentlog_operations", (("state", "CONFIRMED"),))] == 0


# -- what each choice risks, and what is never echoed -----------------------------------------


def _in_flight_email(url: str, task_id: str) -> str:
    """A SUBMITTED operation whose live worker's request may still land for a minute."""
    slow = intentlog.Effect("send_email", lambda key, **kw: {"id": "x"}, idempotent=True,
                            key_retention=24 * 3600, timeout=60, receipt=["id"])  # fmt: skip

    def boom(key: str, **kwargs: object) -> object:
        raise ConnectionError("reset")

    slow.submit = boom
    with intentlog.open(url, max_wait=0, attempts_per_run=1) as journal:
        with journal.task(task_id) as task, pytest.raises(intentlog.StillInFlight):
            task.run(slow, to="a@example.com")
        (op,) = journal.operations(task_id)
    return op.key


def test_failed_or_confirmed_in_flight_needs_the_phrase(journal_url: str) -> None:
    key = _in_flight_email(journal_url, "t-live")
    with running_console(journal_url) as console, console.client() as client:
        page = client.get(task_path("t-live")).text
        assert "may still land" in page and '<code class="phrase">failed send_email</code>' in page
        assert "must hold id" in page
        refused = post_resolve(client, "t-live", key, outcome="failed", actor="bob")
        assert refused.status_code == 400 and "Not marked failed." in refused.text
        no_id = post_resolve(client, "t-live", key, outcome="confirmed", actor="bob",
                             receipt='{"other": 1}', confirm="confirmed send_email")  # fmt: skip
        assert no_id.status_code == 400 and "without id" in no_id.text
        assert resolutions(journal_url) == []
        done = post_resolve(client, "t-live", key, outcome="failed", actor="bob",
                            confirm="failed send_email")  # fmt: skip
        assert done.status_code == 303
    assert only_op(journal_url, "t-live").state is intentlog.State.FAILED


@pytest.mark.parametrize("field", ["actor", "note", "receipt"])
def test_a_refused_secret_is_never_echoed(db: str, field: str) -> None:
    key = only_op(db).key
    secret = "sk_live_4eC39HqLyjWDarjtT1zdp7dc"
    typed = {"actor": "alice", "note": "checked", "receipt": ""}
    typed[field] = {"actor": secret, "note": f"token {secret}",
                    "receipt": f'{{"id": "{secret}"}}'}[field]  # fmt: skip
    with running_console(db) as console, console.client() as client:
        response = post_resolve(client, "order-1", key, outcome="confirmed", **typed)
        assert response.status_code == 400 and "credential" in response.text
        assert secret not in response.text
        # A secret in one box while another is refused for something else: not echoed either.
        other = dict(typed, receipt="{oops") if field != "receipt" else dict(typed, actor="")
        response = post_resolve(client, "order-1", key, outcome="confirmed", **other)
        assert response.status_code == 400 and secret not in response.text
    assert only_op(db).state is intentlog.State.UNRESOLVED and resolutions(db) == []
