"""intentlog.integrations.smtp against a real SMTP server (aiosmtpd) on 127.0.0.1, real
journals, and worker processes killed with SIGKILL. The server's handler records every mail
it accepts; that record is the ground truth.

Where aiosmtpd is missing the tests skip, except with CI=true, where they must run.
"""

from __future__ import annotations

import dataclasses
import email
import email.policy
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import intentlog
from engine_servers import free_port
from intentlog import profiles

SUPPORT = Path(__file__).parent / "support"


@dataclasses.dataclass
class Mail:
    sender: str
    recipients: list[str]
    message: email.message.EmailMessage


class Recorder:
    """An aiosmtpd handler that records every accepted mail, and refuses on request: a
    recipient whose address starts with ``unknown``, a sender ``blocked@...``, and any data
    while ``refuse_data`` is set."""

    def __init__(self) -> None:
        self.mails: list[Mail] = []
        self.refuse_data = False
        self.changed = threading.Condition()

    async def handle_MAIL(
        self, server: Any, session: Any, envelope: Any, address: str, options: Any
    ) -> str:
        if address.startswith("blocked@"):
            return "550 5.7.1 sender blocked"
        envelope.mail_from = address
        return "250 OK"

    async def handle_RCPT(
        self, server: Any, session: Any, envelope: Any, address: str, options: Any
    ) -> str:
        if address.startswith("unknown"):
            return "550 5.1.1 no such user"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        if self.refuse_data:
            return "554 5.7.1 message refused as spam"
        message = email.message_from_bytes(envelope.content, policy=email.policy.default)
        with self.changed:
            self.mails.append(Mail(envelope.mail_from, list(envelope.rcpt_tos), message))
            self.changed.notify_all()
        return "250 2.0.0 queued as Q123"

    def wait_for(self, count: int, timeout: float = 30.0) -> list[Mail]:
        """The mails once at least ``count`` arrived (or the timeout passed)."""
        with self.changed:
            self.changed.wait_for(lambda: len(self.mails) >= count, timeout=timeout)
            return list(self.mails)


@dataclasses.dataclass
class Server:
    host: str
    port: int
    recorder: Recorder


@pytest.fixture
def smtp_server() -> Iterator[Server]:
    try:
        from aiosmtpd.controller import Controller
    except ImportError:
        if os.environ.get("CI") == "true":
            pytest.fail("aiosmtpd is not installed (CI=true: SMTP tests must run)", pytrace=False)
        pytest.skip("aiosmtpd is not installed (pip install 'intentlog[dev]')")
    from aiosmtpd.smtp import AuthResult

    def authenticate(server: Any, session: Any, envelope: Any, mechanism: str, data: Any) -> Any:
        ok = (data.login, data.password) == (b"shop", b"s3cret-pass")
        return AuthResult(success=ok)

    recorder = Recorder()
    controller = Controller(
        recorder,
        hostname="127.0.0.1",
        port=free_port(),
        authenticator=authenticate,
        auth_require_tls=False,
    )
    controller.start()
    try:
        yield Server("127.0.0.1", controller.port, recorder)
    finally:
        controller.stop()


def mailer(server: Server, **settings: Any) -> intentlog.Effect:
    from intentlog.integrations.smtp import smtp_effect

    options: dict[str, Any] = {"name": "mail", "sender": "Shop <shop@example.com>", "timeout": 5}
    return smtp_effect(server.host, server.port, **{**options, **settings})


def send(journal: Path, effect: intentlog.Effect, **args: Any) -> Any:
    with intentlog.open(journal) as j, j.task("t") as task:
        return task.run(effect, **args)


def only_op(journal: Path) -> intentlog.Operation:
    with intentlog.open(journal) as j:
        (op,) = j.operations()
        return op


ORDER_MAIL: dict[str, Any] = {
    "to": ["a@example.org", "B <b@example.org>"],
    "cc": "c@example.org",
    "bcc": ["d@example.org"],
    "subject": "Order 7 shipped",
    "text": "Your order is on its way.\n.\nA line with a dot.",
    "html": "<p>Shipped</p>",
}


def test_mail_receipt_and_key_in_headers(tmp_path: Path, smtp_server: Server) -> None:
    effect = mailer(smtp_server)
    assert effect.service is profiles.SMTP and not effect.idempotent and effect.reconcile is None
    receipt = send(tmp_path / "j.db", effect, **ORDER_MAIL)
    op = only_op(tmp_path / "j.db")
    assert (
        receipt
        == op.receipt
        == {"message_id": f"<{op.key}@example.com>", "reply": "2.0.0 queued as Q123"}
    )
    (mail,) = smtp_server.recorder.mails
    assert mail.sender == "shop@example.com"
    assert mail.recipients == ["a@example.org", "b@example.org", "c@example.org", "d@example.org"]
    assert mail.message["Message-ID"] == receipt["message_id"]
    assert mail.message["Intentlog-Key"] == op.key
    assert mail.message["Bcc"] is None and "d@example.org" not in str(mail.message)
    plain = mail.message.get_body(("plain",))
    assert plain is not None and "\r\n.\r\nA line with a dot." in plain.get_content()
    # The same call again: the stored receipt, no second mail.
    assert send(tmp_path / "j.db", effect, **ORDER_MAIL) == receipt
    assert len(smtp_server.recorder.mails) == 1


def test_message_id_of_any_key() -> None:
    from intentlog.integrations.smtp import message_id

    assert message_id("mail-0123abcd", "example.com") == "<mail-0123abcd@example.com>"
    assert message_id("order.7", "example.com") == "<order.7@example.com>"
    assert message_id("a@b(c)%", "x.org") == "<a%40b%28c%29%25@x.org>"
    assert message_id(".lead", "x.org") == "<%2Elead@x.org>"
    parsed = email.message_from_string(
        f"Message-ID: {message_id('a<b>:c', 'x.org')}\n\n", policy=email.policy.default
    )
    assert parsed["Message-ID"] == "<a%3Cb%3E%3Ac@x.org>"


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ({"to": "unknown@example.org"}, r"refused recipient\(s\) unknown@example.org \(550"),
        ({"to": ["a@example.org", "unknown2@example.org"]}, "unknown2@example.org"),
    ],
)
def test_refused_recipient_sends_nothing(
    tmp_path: Path, smtp_server: Server, args: dict[str, Any], match: str
) -> None:
    with pytest.raises(intentlog.Rejected, match=match) as caught:
        send(tmp_path / "j.db", mailer(smtp_server), subject="s", text="t", **args)
    assert caught.value.status == 550
    assert only_op(tmp_path / "j.db").state is intentlog.State.FAILED
    assert smtp_server.recorder.mails == []  # all or nothing: a.example.org got nothing either


def test_refusals_before_and_after_the_data(tmp_path: Path, smtp_server: Server) -> None:
    blocked = mailer(smtp_server, sender="blocked@example.com")
    with pytest.raises(intentlog.Rejected, match=r"refused sender blocked@example.com"):
        send(tmp_path / "a.db", blocked, to="a@example.org", subject="s", text="t")
    smtp_server.recorder.refuse_data = True
    with pytest.raises(intentlog.Rejected, match=r"refused the message .554"):
        send(tmp_path / "b.db", mailer(smtp_server), to="a@example.org", subject="s", text="t")
    assert only_op(tmp_path / "b.db").state is intentlog.State.FAILED
    assert smtp_server.recorder.mails == []


def test_nothing_listening_is_refused_not_unknown(tmp_path: Path) -> None:
    from intentlog.integrations.smtp import smtp_effect

    effect = smtp_effect("127.0.0.1", free_port(), name="mail", sender="s@example.com")
    with pytest.raises(intentlog.Rejected, match=r"refused the session .*nothing was sent"):
        send(tmp_path / "j.db", effect, to="a@example.org", subject="s", text="t")


def test_login_stays_out_of_the_journal(tmp_path: Path, smtp_server: Server) -> None:
    good = mailer(smtp_server, username="shop", password="s3cret-pass")
    send(tmp_path / "j.db", good, to="a@example.org", subject="s", text="t")
    assert len(smtp_server.recorder.mails) == 1
    bad = mailer(smtp_server, username="shop", password="wrong-pass", timeout=2)
    # (535 to PLAIN; aiosmtpd then never answers smtplib's AUTH LOGIN, so it ends in a timeout)
    with pytest.raises(
        intentlog.Rejected, match=r"refused the session .*nothing was sent"
    ) as caught:
        send(tmp_path / "k.db", bad, to="a@example.org", subject="s", text="t")
    assert "wrong-pass" not in str(caught.value)
    for db in ("j.db", "k.db"):
        assert b"pass" not in (tmp_path / db).read_bytes()


def test_bad_mail_and_settings(tmp_path: Path, smtp_server: Server) -> None:
    from intentlog.integrations.smtp import smtp_effect

    with pytest.raises(intentlog.Rejected, match="cannot compose the mail"):
        send(
            tmp_path / "j.db",
            mailer(smtp_server),
            to="a@example.org",
            subject="s\r\nBcc: victim@example.org",
            text="t",
        )
    with pytest.raises(intentlog.Rejected, match="not a mail address"):
        send(tmp_path / "k.db", mailer(smtp_server), to="nobody", subject="s", text="t")
    with pytest.raises(intentlog.InvalidInput, match="missing a required argument"):
        send(tmp_path / "l.db", mailer(smtp_server), to="a@example.org", subject="s")
    assert smtp_server.recorder.mails == []
    for kwargs, message in [
        ({"sender": "not an address"}, "sender must be one mail address"),
        ({"sender": "a@b", "tls": "ssl"}, "tls must be"),
        ({"sender": "a@b", "username": "u"}, "username and password together"),
        ({"sender": "a@under_score"}, "cannot be a Message-ID domain"),
    ]:
        with pytest.raises(intentlog.InvalidInput, match=message):
            smtp_effect("127.0.0.1", 25, name="mail", **kwargs)


# -- SIGKILL at each boundary ----------------------------------------------------------------


def worker(
    journal: Path, server: Server, crash: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(SUPPORT)}
    env.pop("INTENTLOG_CRASH", None)
    if crash:
        env["INTENTLOG_CRASH"] = crash
    config = {
        "host": server.host,
        "port": server.port,
        "args": {"to": "guest@example.org", "subject": "Order 7", "text": "Shipped."},
    }
    return subprocess.run(
        [
            sys.executable,
            str(SUPPORT / "service_workers.py"),
            "smtp",
            str(journal),
            json.dumps(config),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )


@pytest.mark.parametrize("point", ["after_send", "after_remote_commit"])
def test_killed_in_flight_is_unresolved_never_a_second_mail(
    tmp_path: Path, smtp_server: Server, point: str
) -> None:
    journal = tmp_path / "j.db"
    assert worker(journal, smtp_server, f"{point}:mail").returncode == -signal.SIGKILL
    (mail,) = smtp_server.recorder.wait_for(1)  # the server had the whole message
    restarted = worker(journal, smtp_server)
    assert restarted.returncode == 3, restarted.stdout + restarted.stderr
    with intentlog.open(journal) as j:
        (pending,) = j.pending()
        assert pending.state is intentlog.State.UNRESOLVED
        assert pending.next_action is intentlog.Action.ESCALATE
        assert "neither deduplicate nor be asked" in pending.reason
    # What a person looks for in the mail logs to resolve it:
    assert mail.message["Message-ID"] == f"<{pending.key}@example.com>"
    # The restart has exited: a mail it had sent would have been recorded before the server's
    # reply, which it would have waited for. Still one.
    assert len(smtp_server.recorder.mails) == 1


@pytest.mark.parametrize(("point", "mails"), [("after_plan", 1), ("after_submit_mark", 0)])
def test_killed_before_sending(tmp_path: Path, smtp_server: Server, point: str, mails: int) -> None:
    journal = tmp_path / "j.db"
    assert worker(journal, smtp_server, f"{point}:mail").returncode == -signal.SIGKILL
    assert smtp_server.recorder.mails == []
    restarted = worker(journal, smtp_server)
    if point == "after_plan":  # PLANNED: nothing was sent, so it is sent now
        assert restarted.returncode == 0, restarted.stderr
        assert json.loads(restarted.stdout.splitlines()[-1])["receipt"]["reply"].endswith("Q123")
        assert only_op(journal).state is intentlog.State.CONFIRMED
    else:  # SUBMITTED: the session may have started; nothing can tell, so a person decides
        assert restarted.returncode == 3
        assert only_op(journal).state is intentlog.State.UNRESOLVED
    assert len(smtp_server.recorder.wait_for(mails, timeout=5)) == mails


def test_docs_smtp_section_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, smtp_server: Server
) -> None:
    from integration_workflows import run_doc_section

    monkeypatch.chdir(tmp_path)
    assert run_doc_section("SMTP") == 1
