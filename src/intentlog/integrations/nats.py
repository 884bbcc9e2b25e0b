"""NATS JetStream publishes as effects, with nats-py: :func:`publish_effect` (asyncio only).

``pip install -e '.[nats]'`` from the clone (``'intentlog[nats]'`` once published). A publish
carries the operation key as ``Nats-Msg-Id``; the stream drops a second message with the same id
inside its duplicate window, and answers it with the first message's sequence. So the effect
declares the service contract :func:`intentlog.profiles.nats_jetstream` with the stream's
``duplicate_window`` as the key's retention, read when the effect is built: a lost ack is
settled by publishing the same key again inside the window, and past the window the operation
becomes UNRESOLVED instead of a second message, unless a lookup can find the message.

Lookups (``lookup=``), since JetStream cannot look a message up by its ``Nats-Msg-Id``:

- ``"scan"`` (default): read the subject's messages, headers only, with an ordered consumer
  from the subject's first message up to its last, until the id is found. Correct on any
  stream; its cost grows with the messages kept on the subject, so it is bounded
  (``scan_limit``; beyond it the answer is Indeterminate). ``reconcile(key)`` is given only
  the key, not when it was sent, so the scan cannot start at the time of the send.
- ``"subject"``: publish to ``<subject>.<key>`` (the stream must take ``<subject>.>``), and
  look up with one "last message on subject" request: constant cost, the efficient choice
  when consumers can subscribe to ``<subject>.>``.
- ``None``: no lookup; the duplicate window alone settles a lost ack.

A lookup can always confirm (Found). It can deny (NotFound, after which the decision publishes
again) only on a stream that has never removed a message: once messages were removed (by
``max_age``, message or byte limits, a work queue or interest retention, a purge or a
delete), a missing message may have been removed after landing, so a miss is Indeterminate
and the duplicate window decides. The effect is asyncio only (nats-py is): run it on an
``intentlog.open_async`` journal.
"""

from __future__ import annotations

import contextlib
import json
import re
from typing import TYPE_CHECKING, Any, Unpack

from intentlog import profiles
from intentlog._crash import crashpoint
from intentlog._effect import Effect
from intentlog._effect_options import FIXED, EffectOptions, effect_contract
from intentlog._errors import InvalidInput, Rejected
from intentlog._hygiene import scrub_text
from intentlog._model import Found, Indeterminate, LookupResult, NotFound
from intentlog._validate import seconds
from intentlog.integrations import AmbiguousResponse, _call_body, _require

if TYPE_CHECKING:
    from nats.aio.client import Client
    from nats.js import JetStreamContext

__all__ = ["AmbiguousResponse", "publish_effect"]

LOOKUPS = ("scan", "subject")
_SUBJECT = re.compile(r"^[^\s.*>]+(\.[^\s.*>]+)*$")  # a literal subject: no wildcards
_MSG_ID = "Nats-Msg-Id"
_STORE_FAILED = 10077  # a 503 whose store refused the message (a limit): not stored


async def publish_effect(
    nc_or_js: Client | JetStreamContext,
    subject: str,
    *,
    name: str,
    stream: str | None = None,
    lookup: str | None = "scan",
    scan_limit: int = 100_000,
    lazy_receipt: bool = False,
    **options: Unpack[EffectOptions],
) -> Effect:
    """An async Effect that publishes the call's keyword arguments as JSON to ``subject``
    (``task.run(effect, json=value)`` publishes ``value`` itself) with ``Nats-Msg-Id`` = key.

    The receipt is ``{"stream", "seq", "duplicate"}``; ``duplicate`` is True when an earlier
    attempt had already stored the message (the stream said so, or a lookup found it).
    ``stream`` defaults to the stream that takes ``subject``; its ``duplicate_window`` is read
    now and becomes the key's retention (re-create the effect if you change the window; an
    operation first published under another window is judged by the smaller of the two). The
    publish names the stream (``Nats-Expected-Stream``), so no other stream stores it.
    ``timeout`` bounds the wait for the stream's ack; ``lookup_lag`` is 0 because lookups read
    from the stream leader, which acks only what it stored. These two are the effect options
    (:class:`intentlog.EffectOptions`) it takes; the others are the stream's, and InvalidInput
    refuses them.

    Outcomes: an ack -> the receipt; an error ack (a limit, a wrong stream) ->
    :class:`intentlog.Rejected`; no ack in time, a lost connection, no stream listening, or a
    503 -> :class:`AmbiguousResponse`. Guarantee: the after_send crash point is passed once
    the server has the message (after a flush) and before its ack is read.
    """
    _require("nats", "nats")
    from nats.aio.client import Client
    from nats.js import JetStreamContext
    from nats.js.errors import NotFoundError

    if isinstance(nc_or_js, JetStreamContext):
        js: Any = nc_or_js
        nc: Any = nc_or_js._nc  # nats-py keeps the connection here; there is no accessor
    elif isinstance(nc_or_js, Client):
        nc, js = nc_or_js, nc_or_js.jetstream()
    else:
        raise InvalidInput(f"effect {name!r}: need a nats Client or JetStreamContext")
    if not isinstance(subject, str) or not _SUBJECT.match(subject):
        raise InvalidInput(f"effect {name!r}: {subject!r} is not a literal NATS subject")
    if lookup is not None and lookup not in LOOKUPS:
        raise InvalidInput(f"effect {name!r}: lookup must be one of {LOOKUPS} or None")
    if type(scan_limit) is not int or scan_limit < 1:
        raise InvalidInput(f"effect {name!r}: scan_limit must be an int >= 1")
    # The contract is the stream's (read below): only timeout (default 5 s) may be given, and
    # lookup_lag (default 0), which describes this effect's own lookup; checked before the
    # stream is asked anything.
    lag_given = options.pop("lookup_lag", None)
    lag = 0.0 if lag_given is None else seconds("lookup_lag", lag_given, bounded=False)
    wait = effect_contract(
        f"effect {name!r}", options, profiles.nats_jetstream(timeout=5.0), caller="publish_effect",
        spelling=FIXED,
    ).timeout  # fmt: skip
    probe = subject + ".probe" if lookup == "subject" else subject
    try:
        if stream is None:
            stream = await js.find_stream_name_by_subject(probe)
        info = await js.stream_info(stream)
    except NotFoundError:
        which = f"stream {stream!r}" if stream else f"a stream that takes {probe!r}"
        raise InvalidInput(f"effect {name!r}: JetStream has no {which}") from None
    window = float(info.config.duplicate_window or 0)
    if window <= 0:
        raise InvalidInput(f"effect {name!r}: stream {stream!r} reports no duplicate window")
    target = _Target(name, subject, str(stream), lookup, wait, scan_limit)

    async def submit(key: str, /, **fields: Any) -> dict[str, Any]:
        payload = json.dumps(_call_body(fields), separators=(",", ":"), allow_nan=False)
        return await target.publish(nc, key, payload.encode())

    async def reconcile(key: str) -> LookupResult:
        return await target.find(js, key)

    # The contract is the stream's as read now. An operation is judged by the stricter of
    # what was recorded at its first publish and this, so a window changed since (an effect
    # built anew after a restart) can narrow what a restart may do, never widen it.
    service = profiles.nats_jetstream(window, timeout=wait).replace(
        lookup="reference" if lookup is not None else None,
        lookup_lag=lag,
    )
    return Effect(
        name,
        submit,
        reconcile=reconcile if lookup is not None else None,
        service=service,
        timeout=wait,
        lazy_receipt=lazy_receipt,
    )


class _Target:
    """Where one effect publishes and how it finds what it published."""

    def __init__(
        self, name: str, subject: str, stream: str, lookup: str | None, wait: float, limit: int
    ) -> None:
        self.name, self.subject, self.stream = name, subject, stream
        self.lookup, self.wait, self.limit = lookup, wait, limit

    def subject_for(self, key: str) -> str:
        if self.lookup != "subject":
            return self.subject
        if not _SUBJECT.match(key):
            # Checked before anything is sent: not applied, so FAILED, and the key must change.
            raise Rejected(
                f"effect {self.name!r}: key {key!r} cannot end a subject (lookup='subject' "
                "needs keys without '*', '>', empty tokens or spaces)",
                key=key,
            )
        return f"{self.subject}.{key}"

    async def publish(self, nc: Any, key: str, payload: bytes) -> dict[str, Any]:
        where = self.subject_for(key)
        headers = {_MSG_ID: key, "Nats-Expected-Stream": self.stream}
        # A reply inbox of our own rather than nc.request or js.publish: the crash point must
        # sit between the send and the reading of the ack, which those do in one call.
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox, max_msgs=1)
        try:
            try:
                await nc.publish(where, payload, reply=inbox, headers=headers)
                # nats-py buffers writes: the flush's PONG proves the server has the message.
                # The ack comes after it, so this costs no extra round trip.
                await nc.flush(timeout=self.wait)
            except Exception as exc:
                raise self._ambiguous(f"publish to {where!r} failed", exc) from exc
            crashpoint("after_send", self.name)  # the server has it; its ack is not read
            try:
                ack = await sub.next_msg(timeout=self.wait)
            except Exception as exc:
                raise self._ambiguous(f"no ack from stream {self.stream!r}", exc) from exc
        finally:
            with contextlib.suppress(Exception):  # already gone after its one message
                await sub.unsubscribe()
        return self._receipt(key, ack)

    def _receipt(self, key: str, ack: Any) -> dict[str, Any]:
        if ack.headers and ack.headers.get("Status") == "503":
            raise AmbiguousResponse(
                f"no stream took {self.subject!r} (503 no responders); nothing is known to "
                "have stored it",
                key=key,
                status=503,
            )
        try:
            data = json.loads(ack.data)
        except ValueError:
            raise AmbiguousResponse(f"stream {self.stream!r} sent an ack that is not JSON",
                                    key=key) from None  # fmt: skip
        error = data.get("error") if isinstance(data, dict) else None
        if isinstance(error, dict):
            code = error.get("code")
            text = scrub_text(str(error.get("description") or "no description"), limit=200)
            message = f"stream {self.stream!r} refused the message ({code}): {text}"
            if code == 503 and error.get("err_code") != _STORE_FAILED:
                # Unavailable (no quorum, an election): resending the key inside the window
                # is cheap, and taking a doubt for "not applied" never is.
                raise AmbiguousResponse(message, key=key, status=503)
            raise Rejected(message, key=key, status=code)
        if not isinstance(data, dict) or data.get("stream") != self.stream:
            raise AmbiguousResponse(f"unexpected ack from {self.stream!r}", key=key)
        return {"stream": self.stream, "seq": int(data["seq"]), "duplicate": bool(data.get(
            "duplicate"))}  # fmt: skip

    def _ambiguous(self, what: str, exc: Exception) -> AmbiguousResponse:
        detail = scrub_text(f"{type(exc).__name__}: {exc}".rstrip(": "), limit=200)
        return AmbiguousResponse(f"{what} ({detail}); the message may have been stored")

    async def find(self, js: Any, key: str) -> LookupResult:
        """Found with the message's sequence; NotFound only when nothing was ever removed
        from the stream; otherwise Indeterminate."""
        try:
            if self.lookup == "subject":
                seq = await self._last_on(js, self.subject_for(key), key)
            else:
                seq = await self._scan(js, key)
            if seq is not None:
                return Found({"stream": self.stream, "seq": seq, "duplicate": True})
            # Checked after the search: a removal during it is seen too.
            state = (await js.stream_info(self.stream)).state
        except _TooMany:
            return Indeterminate(
                f"more than {self.limit} messages on {self.subject!r} to search; raise "
                "scan_limit or use lookup='subject'"
            )
        except Exception as exc:
            return Indeterminate(
                scrub_text(f"lookup failed: {type(exc).__name__}: {exc}", limit=300)
            )
        if (state.first_seq or 0) > 1 or state.num_deleted or state.lost:
            return Indeterminate(
                f"not in stream {self.stream!r}, but the stream has removed messages (first "
                f"sequence {state.first_seq}), so it may have landed and been removed"
            )
        return NotFound()

    async def _last_on(self, js: Any, subject: str, key: str) -> int | None:
        from nats.js.errors import NotFoundError

        try:
            msg = await js.get_msg(self.stream, subject=subject)  # the leader: no lag
        except NotFoundError:
            return None
        if (msg.headers or {}).get(_MSG_ID) != key:
            # another publisher used our subject: the newest message is not ours
            raise RuntimeError(f"the last message on {subject!r} has another {_MSG_ID}")
        return int(msg.seq)

    async def _scan(self, js: Any, key: str) -> int | None:
        from nats.js.api import DeliverPolicy
        from nats.js.errors import NotFoundError

        try:  # where the scan can stop; a message sent after this is the in-flight window's
            last = await js.get_msg(self.stream, subject=self.subject)
        except NotFoundError:
            return None  # nothing on the subject at all
        if (last.headers or {}).get(_MSG_ID) == key:
            return int(last.seq)  # the usual case: ours is the newest
        sub = await js.subscribe(
            self.subject, stream=self.stream, ordered_consumer=True, headers_only=True,
            deliver_policy=DeliverPolicy.ALL,
        )  # fmt: skip
        try:
            for _ in range(self.limit):
                msg = await sub.next_msg(timeout=self.wait)
                seq = int(msg.metadata.sequence.stream)
                if (msg.headers or {}).get(_MSG_ID) == key:
                    return seq
                if seq >= last.seq:
                    return None
            raise _TooMany
        finally:
            await sub.unsubscribe()


class _TooMany(Exception):
    """The scan reached scan_limit before the end of the subject."""
