"""Mail over SMTP as an effect, with the standard library: :func:`smtp_effect`.

SMTP takes no idempotency key and cannot be asked whether a message arrived
(:data:`intentlog.profiles.SMTP`), so the effect can neither deduplicate nor reconcile: its
intent is written PLANNED first and SUBMITTED just before the session starts, a crash before
that is sent after a restart, and a crash while the message may have been handed over ends
UNRESOLVED for a person to look at, never as a second mail.

To make that look quick, every message carries its operation key twice: in its
``Message-ID`` (``<KEY@DOMAIN>``, the key with characters a Message-ID cannot hold
percent-encoded) and in an ``Intentlog-Key`` header, so a person can search the mail logs or
the recipient's mailbox for it.

Answers: the server accepts responsibility for a message only with its 2xx reply to the end
of the message data. Every failure before the data is sent (no connection, a 4xx or 5xx reply
to the greeting, TLS, login, MAIL, any RCPT or DATA) proves nothing was handed over and raises
:class:`intentlog.Rejected`; a failure while the data is sent or its reply is awaited raises
:class:`AmbiguousResponse` (it may have been accepted); a 4xx or 5xx reply to the data is a
refusal again.
"""

from __future__ import annotations

import email.policy
import email.utils
import re
import smtplib
import ssl
import string
from collections.abc import Sequence
from email.message import EmailMessage
from typing import Any, Unpack

from intentlog import profiles
from intentlog._crash import crashpoint
from intentlog._effect import Effect
from intentlog._effect_options import FIXED, EffectOptions, effect_contract
from intentlog._errors import InvalidInput, Rejected
from intentlog._hygiene import scrub_text
from intentlog.integrations import AmbiguousResponse

__all__ = ["AmbiguousResponse", "message_id", "smtp_effect"]

TLS = ("starttls", "implicit")
KEY_HEADER = "Intentlog-Key"
# RFC 5322 atext: what a Message-ID's left part may hold ("." only between atoms).
_ATEXT = frozenset(string.ascii_letters + string.digits + "!#$&'*+-/=?^_`{|}~")
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_DOMAIN = re.compile(rf"^{_LABEL}(?:\.{_LABEL})*$")


def message_id(key: str, domain: str) -> str:
    """The Message-ID of the mail of operation ``key``: ``<KEY@DOMAIN>``, every character of
    the key that an RFC 5322 Message-ID cannot hold written as ``%XX`` (so ``%`` itself is
    ``%25``, and the key can be read back)."""
    left = "".join(ch if ch in _ATEXT or ch == "." else f"%{ord(ch):02X}" for ch in key)
    if left.startswith(".") or left.endswith(".") or ".." in left:
        left = left.replace(".", "%2E")
    return f"<{left}@{domain}>"


def smtp_effect(
    host: str,
    port: int = 25,
    *,
    name: str,
    sender: str,
    tls: str | None = None,
    ssl_context: ssl.SSLContext | None = None,
    username: str | None = None,
    password: str | None = None,
    domain: str | None = None,
    store_args: bool = False,
    **options: Unpack[EffectOptions],
) -> Effect:
    """An Effect that sends one mail from ``sender`` through the SMTP server at
    ``host:port``: ``task.run(effect, to=..., subject=..., text=...)``, with optional
    ``html``, ``cc``, ``bcc`` and ``reply_to`` (``to``, ``cc`` and ``bcc`` take an address or
    a list of them).

    ``tls``: None (a plain session, for a local relay), ``"starttls"`` or ``"implicit"``
    (TLS from the start, usually port 465), with ``ssl_context`` (default: the system's
    verifying context). ``username``/``password`` log in; they stay in this process and never
    reach the journal or an error message. ``domain`` is the Message-ID's right part (default:
    the sender's domain). ``timeout`` bounds every wait for the server (default the profile's
    60 s) and is the effect's request deadline; the other effect options
    (:class:`intentlog.EffectOptions`) are the SMTP profile's, and InvalidInput refuses them.

    All or nothing: if the server refuses any recipient, nothing is sent (the transaction is
    reset) and the call raises :class:`intentlog.Rejected` naming the refused addresses. The
    receipt is ``{"message_id", "reply"}``: the Message-ID and the server's reply to the data
    (which often names its queue id). The after_send crash point is passed once the end of the
    data is written and before the reply is read.
    """
    if not isinstance(host, str) or not host:
        raise InvalidInput(f"effect {name!r}: host must be a host name, got {host!r}")
    if type(port) is not int or not 0 < port < 65536:
        raise InvalidInput(f"effect {name!r}: port must be 1-65535, got {port!r}")
    if tls is not None and tls not in TLS:
        raise InvalidInput(f"effect {name!r}: tls must be None, 'starttls' or 'implicit'")
    if (username is None) != (password is None):
        raise InvalidInput(f"effect {name!r}: give username and password together")
    address = _address(sender) if isinstance(sender, str) else None
    if address is None:
        raise InvalidInput(f"effect {name!r}: sender must be one mail address, got {sender!r}")
    domain = domain if domain is not None else address.rpartition("@")[2]
    if not isinstance(domain, str) or not _DOMAIN.match(domain):
        raise InvalidInput(
            f"effect {name!r}: {domain!r} cannot be a Message-ID domain; pass domain='...'"
        )
    # SMTP's contract is the profile's (no key, no lookup): only timeout may be given.
    contract = effect_contract(
        f"effect {name!r}", options, profiles.SMTP, caller="smtp_effect", spelling=FIXED
    )
    server = _Server(name, host, port, tls, ssl_context, username, password, contract.timeout)

    def submit(
        key: str,
        /,
        *,
        to: str | Sequence[str],
        subject: str,
        text: str,
        html: str | None = None,
        cc: str | Sequence[str] | None = None,
        bcc: str | Sequence[str] | None = None,
        reply_to: str | None = None,
    ) -> dict[str, Any]:
        mid = message_id(key, domain)
        try:
            message, recipients = _compose(
                sender, mid, key, to, subject, text, html, cc, bcc, reply_to
            )
        except (TypeError, ValueError) as exc:
            raise Rejected(
                f"effect {name!r}: cannot compose the mail ({exc}); nothing was sent", key=key
            ) from None
        return server.send(key, address, recipients, message, mid)

    return Effect(
        name, submit, service=profiles.SMTP, timeout=server.timeout, store_args=store_args
    )


def _address(value: object) -> str | None:
    """The bare address of one ``Name <addr@domain>`` or ``addr@domain``, or None."""
    if not isinstance(value, str) or "\r" in value or "\n" in value:
        return None
    _, address = email.utils.parseaddr(value)
    local, at, domain = address.rpartition("@")
    return address if at and local and domain else None


def _addresses(value: object, what: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        items: list[object] = [value]
    elif isinstance(value, list | tuple):
        items = list(value)
    else:
        raise ValueError(f"{what} must be an address or a list of addresses")
    out = []
    for item in items:
        address = _address(item)
        if address is None:
            raise ValueError(f"{what}: {item!r} is not a mail address")
        out.append(address)
    return out


def _compose(
    sender: str,
    mid: str,
    key: str,
    to: Any,
    subject: Any,
    text: Any,
    html: Any,
    cc: Any,
    bcc: Any,
    reply_to: Any,
) -> tuple[bytes, list[str]]:
    """The message as the bytes SMTP sends (CRLF lines), and every recipient's address."""
    if not isinstance(subject, str) or not isinstance(text, str):
        raise ValueError("subject and text must be strings")
    if html is not None and not isinstance(html, str):
        raise ValueError("html must be a string")
    shown = _addresses(to, "to")
    copies = _addresses(cc, "cc")
    hidden = _addresses(bcc, "bcc")
    if not shown:
        raise ValueError("to needs at least one address")
    message = EmailMessage(policy=email.policy.SMTP)  # raises on CR/LF in a header value
    message["From"] = sender
    message["To"] = ", ".join(to if not isinstance(to, str) else [to])
    if copies:
        message["Cc"] = ", ".join(cc if not isinstance(cc, str) else [cc])
    if reply_to is not None:
        if _address(reply_to) is None:
            raise ValueError(f"reply_to: {reply_to!r} is not a mail address")
        message["Reply-To"] = reply_to
    message["Subject"] = subject
    message["Date"] = email.utils.formatdate(localtime=False)
    message["Message-ID"] = mid
    message[KEY_HEADER] = key
    message.set_content(text)
    if html is not None:
        message.add_alternative(html, subtype="html")
    # Bcc addresses get the message but never appear in it.
    return message.as_bytes(), list(dict.fromkeys(shown + copies + hidden))


class _Server:
    """One SMTP server and how to hand it a message: the SMTP transaction written out, so
    that every failure is known to lie before or after the end of the data."""

    def __init__(
        self,
        name: str,
        host: str,
        port: int,
        tls: str | None,
        context: ssl.SSLContext | None,
        username: str | None,
        password: str | None,
        timeout: float,
    ) -> None:
        self.name, self.host, self.port, self.tls = name, host, port, tls
        self.context, self.timeout = context, timeout
        self._login = (
            (username, password) if username is not None and password is not None else None
        )

    def send(
        self, key: str, sender: str, recipients: list[str], message: bytes, mid: str
    ) -> dict[str, Any]:
        smtp = self._session(key)
        try:
            self._envelope(smtp, key, sender, recipients)
            reply = self._data(smtp, key, message)
        finally:
            try:
                smtp.quit()
            except Exception:  # the outcome is settled; a failed goodbye is not news
                smtp.close()
        return {"message_id": mid, "reply": reply}

    def _refused(self, key: str, what: str, code: int | None, reply: Any) -> Rejected:
        text = reply.decode("utf-8", "replace") if isinstance(reply, bytes) else str(reply)
        detail = scrub_text(" ".join(text.split()), limit=200)
        status = f"{code} " if code is not None else ""
        return Rejected(
            f"effect {self.name!r}: {self.host}:{self.port} refused {what} ({status}{detail}); "
            "nothing was sent",
            key=key,
            status=code,
        )

    def _session(self, key: str) -> smtplib.SMTP:
        """A connected, greeted (and secured, logged-in) session; Rejected if it fails."""
        smtp: smtplib.SMTP | None = None
        try:
            if self.tls == "implicit":
                context = self.context or ssl.create_default_context()
                smtp = smtplib.SMTP_SSL(self.host, self.port, timeout=self.timeout, context=context)
            else:
                smtp = smtplib.SMTP(self.host, self.port, timeout=self.timeout)
            smtp.ehlo_or_helo_if_needed()
            if self.tls == "starttls":
                smtp.starttls(context=self.context or ssl.create_default_context())
                smtp.ehlo()
            if self._login is not None:
                smtp.login(*self._login)
            return smtp
        except smtplib.SMTPResponseException as exc:
            if smtp is not None:
                smtp.close()
            raise self._refused(key, "the session", exc.smtp_code, exc.smtp_error) from None
        except (OSError, smtplib.SMTPException) as exc:
            if smtp is not None:
                smtp.close()
            # smtplib's messages never hold the password; scrubbed all the same.
            raise self._refused(key, "the session", None, f"{type(exc).__name__}: {exc}") from None

    def _envelope(self, smtp: smtplib.SMTP, key: str, sender: str, recipients: list[str]) -> None:
        try:
            code, reply = smtp.mail(sender)
            if code != 250:
                raise self._refused(key, f"sender {sender}", code, reply)
            refused = {}
            for address in recipients:
                code, reply = smtp.rcpt(address)
                if code not in (250, 251):
                    refused[address] = (code, reply)
            if refused:
                smtp.rset()  # all or nothing: the accepted recipients get nothing either
                first = next(iter(refused.values()))
                raise self._refused(key, f"recipient(s) {', '.join(refused)}", *first)
            code, reply = smtp.docmd("DATA")
            if code != 354:
                raise self._refused(key, "DATA", code, reply)
        except (OSError, smtplib.SMTPException) as exc:
            # Nothing of the message has been written yet, so nothing was handed over.
            raise self._refused(key, "the envelope", None, f"{type(exc).__name__}: {exc}") from None

    def _data(self, smtp: smtplib.SMTP, key: str, message: bytes) -> str:
        # The message with leading dots doubled and the end-of-data line, as smtplib's data()
        # sends it; written here so that the crash point sits between the send and the reply.
        data = re.sub(rb"(?m)^\.", b"..", message)
        if not data.endswith(b"\r\n"):
            data += b"\r\n"
        try:
            smtp.send(data + b".\r\n")
            crashpoint("after_send", self.name)  # handed over; the server's verdict not read
            code, reply = smtp.getreply()
        except (OSError, smtplib.SMTPException) as exc:
            detail = scrub_text(f"{type(exc).__name__}: {exc}", limit=200)
            raise AmbiguousResponse(
                f"effect {self.name!r}: the session with {self.host}:{self.port} broke while the "
                f"message was being handed over ({detail}); it may have been accepted",
                key=key,
            ) from None
        if not 200 <= code < 300:
            raise self._refused(key, "the message", code, reply)
        return scrub_text(" ".join(reply.decode("utf-8", "replace").split()), limit=200)
