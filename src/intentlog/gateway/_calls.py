"""Journaled requests: identity, the one attempt that may be sent, and the reply.

A request's identity is its task (``Intentlog-Task``) and its step (``Intentlog-Step``), or
else the idempotency key the client sends itself. The operation key is derived from the
route and that identity, so the same identity on the same route is the same operation, and
the same identity with another request (method, path, query or body) is refused 422, as
Stripe refuses a reused key: nothing is forwarded and nothing journaled changes.

A request whose earlier attempt was refused by the service (FAILED: it definitely did not
apply) is sent again as the next attempt (``<key>.2``, ``<key>.3``, ...). Every other state
is the library's decision: CONFIRMED answers from the receipt, SUBMITTED reconciles (or
resends the same key where the service deduplicates), and a request that can be neither is
UNRESOLVED, answered 409, never sent again until a person resolves it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import time
from typing import TYPE_CHECKING, Any

from intentlog._async import AsyncJournal, AsyncTask
from intentlog._errors import (
    ApprovalRequired,
    Error,
    InvalidInput,
    KeyConflict,
    LeaseLost,
    OutcomeUnknown,
    Rejected,
    StillInFlight,
    TaskBusy,
    UnknownOperation,
)
from intentlog._keys import canonical_json, derive_key, fingerprint, validate_label
from intentlog._model import State
from intentlog._open import cli_command
from intentlog.gateway._answers import Reply, problem, replay
from intentlog.gateway._forward import (
    Incoming,
    NotSent,
    Upstream,
    effect_for,
    receipt_answer,
)
from intentlog.gateway._handles import TaskHandles
from intentlog.integrations import AmbiguousResponse

if TYPE_CHECKING:
    from intentlog.gateway._relay import Relay
    from intentlog.gateway._routes import Route

__all__ = ["STEP_HEADER", "TASK_HEADER", "Calls"]

TASK_HEADER = "intentlog-task"
STEP_HEADER = "intentlog-step"
#: Prefixes of the keys SDKs make up per call when none is given (stripe-node's
#: "stripe-node-retry-<uuid>"): the same call made again after a restart gets another one.
_PER_CALL_KEYS = ("stripe-node-retry-",)
MAX_ATTEMPTS = 20  # attempts refused by the service before the gateway stops trying


class Calls:
    """The journaled requests of one gateway process."""

    def __init__(self, journal: AsyncJournal, client: Relay, idle: float) -> None:
        self.journal = journal
        self.client = client
        self.handles = TaskHandles(journal, idle=idle)
        self.db = journal.store.url

    async def handle(self, route: Route, incoming: Incoming, headers: dict[str, str]) -> Reply:
        """Journal, forward and answer one unsafe request on a journaled route."""
        identity = _identity(route, headers)
        if isinstance(identity, Reply):
            return identity
        call = _call(route, incoming, headers, *identity)
        try:
            async with self.handles.held(call.task_id) as task:
                return await self._run(call, task)
        except Error as exc:
            return self._stopped(call, exc)

    async def _run(self, call: _Call, task: AsyncTask) -> Reply:
        """Run the attempt the journal allows, and answer what came of it."""
        # The first attempt's key is run straight away, with no read before it: the
        # journal answers a key it holds (a replay, a reconciliation, a resend of the
        # same key) as it would anyway. Only when it refuses by itself, asking the
        # service nothing, is the journal read to find the attempt to run, if any.
        key, careful = call.base, False
        while True:
            effect, upstream, spec = effect_for(
                call.route, call.incoming, self.client, first_send=self._first_send
            )
            call.upstream = upstream
            try:
                spec.request(key, None)  # a body the service cannot take
            except Rejected as exc:
                return problem(400, "unsendable", str(exc), key=key, task=call.task_id)
            try:
                receipt = await task.run(effect, key=key, request=call.request)
            except NotSent as exc:
                return _not_sent(exc, key, call.task_id)
            except (Rejected, KeyConflict) as exc:
                if not careful and not upstream.asked:
                    # The journal refused by itself, from what it holds (the key is
                    # FAILED, or another request's): read it, attempt by attempt.
                    careful = True
                    attempt = await self._attempt_key(call.base, call.prints, call.task_id)
                    if isinstance(attempt, Reply):
                        return attempt
                    key = attempt
                    continue
                if isinstance(exc, KeyConflict):
                    raise
                return _refused(exc, key, call.task_id, upstream)
            except AmbiguousResponse as exc:
                return _in_doubt(exc, key, call.task_id, upstream)
            return _answered(receipt, key, upstream)

    def _stopped(self, call: _Call, exc: Error) -> Reply:
        """The answer to the error that stopped the call (from the task's lease, the journal
        or the attempt), by its kind: the first of these checks that fits."""
        task_id = call.task_id
        if isinstance(exc, TaskBusy):
            return problem(409, "task-busy", str(exc), task=task_id, retry_after=1)
        if isinstance(exc, LeaseLost):
            self.handles.drop(task_id)  # the next request takes a new lease
            return problem(409, "task-busy", str(exc), task=task_id, retry_after=1)
        if isinstance(exc, StillInFlight):
            wait = 1 if exc.not_before is None else max(1, math.ceil(exc.not_before - time.time()))
            return problem(
                409,
                "in-flight",
                str(exc),
                task=task_id,
                key=exc.key,
                state=exc.state,
                retry_after=wait,
            )
        if isinstance(exc, OutcomeUnknown):
            key = exc.key or call.base
            return problem(
                409,
                "unresolved",
                f"{exc}. The request may or may not have been applied; it is not sent again.",
                task=task_id,
                key=key,
                state="UNRESOLVED",
                next_action="ESCALATE: a person checks the service and resolves it",
                resolve=cli_command(self.db, "resolve", key),
                resolve_with=["--confirmed --receipt JSON", "--failed", "--retry"],
            )
        if isinstance(exc, KeyConflict):
            return problem(422, "identity-reused", str(exc), task=task_id, key=exc.key)
        if isinstance(exc, ApprovalRequired):  # pragma: no cover - no route asks for approvals
            return problem(409, "approval", str(exc), task=task_id, key=exc.key)
        if isinstance(exc, InvalidInput):
            return problem(400, "invalid", str(exc), task=task_id)
        return _journal_failed(call, exc)

    async def _attempt_key(self, base: str, prints: str, task_id: str) -> str | Reply:
        """The key of the attempt to run (the first one not refused by the service). An
        attempt recorded for another request is a reused identity (422)."""
        for attempt in range(1, MAX_ATTEMPTS + 1):
            key = base if attempt == 1 else f"{base}.{attempt}"
            try:
                op = await self.journal.operation(key)
            except UnknownOperation:
                return key
            if op.fingerprint != prints:
                return problem(
                    422,
                    "identity-reused",
                    f"this identity was first used for another request (method, path, query "
                    f"or body differ) as operation {base!r}; a different request needs its "
                    "own Intentlog-Step or idempotency key. Nothing was sent.",
                    task=task_id,
                    key=base,
                )
            if op.state is not State.FAILED:
                return key
            if not _refused_by_service(op.error):
                # A person resolved it failed, denied it, or cancelled its task: "not to be
                # sent again" is theirs to lift, not the agent's repeat.
                return problem(
                    409, "settled-failed",
                    f"operation {key!r} was settled as failed by a person, not refused by the "
                    "service: it is not sent again. Send it under a new identity (another "
                    "Intentlog-Step) if it is still wanted.",
                    task=task_id, key=key, state="FAILED",
                )  # fmt: skip
        return problem(
            409,
            "attempts",
            f"{MAX_ATTEMPTS} attempts of this request were refused by the "
            "service; send it under a new identity",
            task=task_id,
            key=base,
        )

    async def _first_send(self, key: str) -> bool:
        """Whether the send of ``key`` under way is its first ever (its operation counts one
        attempt, this one). Asked only when a send could not connect; False when the journal
        cannot say."""
        try:
            op = await self.journal.operation(key)
        except Error:
            return False
        return op.attempts == 1

    async def aclose(self) -> None:
        await self.handles.aclose()


@dataclasses.dataclass
class _Call:
    """One journaled request: what came in, its identity, and the last attempt's exchange
    (``upstream``: None until an attempt is made ready)."""

    route: Route
    incoming: Incoming
    task_id: str
    base: str  # the first attempt's key; the next ones are <base>.2, <base>.3, ...
    request: dict[str, str]  # what the operation is recorded as (digests, never values)
    prints: str  # the fingerprint of ``request``, which every attempt is recorded with
    upstream: Upstream | None = None


def _call(
    route: Route, incoming: Incoming, headers: dict[str, str], task_id: str, what: dict[str, str]
) -> _Call:
    """The call of a request whose identity within task ``task_id`` is ``what``."""
    # A step is the task's own; a client's idempotency key names its request whatever the
    # task (as the service itself would read it): the same key under another task is
    # then refused (422), never sent as a new request.
    owner = task_id if "step" in what else ""
    base = derive_key(owner, route.effect, canonical_json(what))
    request = {
        "method": incoming.method,
        "route": route.prefix,
        "path": hashlib.sha256(incoming.path.encode()).hexdigest(),
        "query": hashlib.sha256(incoming.query.encode()).hexdigest(),
        "body": hashlib.sha256(incoming.body).hexdigest(),
        # Who is asking (a digest of the credentials and the account they select, never
        # their value): another account's request under the same identity is not this one.
        "caller": _caller(headers),
    }
    prints = fingerprint(canonical_json({"request": request}))
    return _Call(route, incoming, task_id, base, request, prints)


def _not_sent(exc: NotSent, key: str, task_id: str) -> Reply:
    return problem(
        502, "upstream",
        f"{exc}. The request is recorded FAILED (not applied); send it again "
        "once the service can be reached: it goes as a new attempt.",
        key=key, task=task_id, state="FAILED", retry_after=1,
    )  # fmt: skip


def _refused(exc: Rejected, key: str, task_id: str, upstream: Upstream) -> Reply:
    if upstream.answered:  # the service's own refusal, as it came
        return Reply(
            upstream.status,
            upstream.headers,
            upstream.body,
            {"Intentlog-State": "FAILED", "Intentlog-Key": key},
        )
    return problem(
        502 if exc.status is None else 400,
        "refused",
        str(exc),
        key=key,
        task=task_id,
        state="FAILED",
    )


def _in_doubt(exc: AmbiguousResponse, key: str, task_id: str, upstream: Upstream) -> Reply:
    # It may have been applied: SUBMITTED. The same request again is settled
    # first (the same key resent where the service deduplicates, else looked
    # up, else UNRESOLVED), never sent as a new one.
    state = {
        "Intentlog-State": "SUBMITTED",
        "Intentlog-Key": key,
        "Retry-After": "1",
    }
    if upstream.answered:
        return Reply(upstream.status, upstream.headers, upstream.body, state)
    return problem(
        502,
        "in-doubt",
        f"{exc}. Send the same request again: the gateway settles this one "
        "(resends the same key where the service deduplicates, else asks the "
        "service) before anything is sent anew.",
        task=task_id,
        key=key,
        state="SUBMITTED",
        retry_after=1,
    )


def _answered(receipt: Any, key: str, upstream: Upstream) -> Reply:
    if upstream.answered and not upstream.truncated and not _reconciled(receipt):
        # This request's own answer, sent back as it came (a record a lookup
        # found after an answer that proved nothing is given as a replay).
        return Reply(
            upstream.status,
            upstream.headers,
            upstream.body,
            {"Intentlog-State": "CONFIRMED", "Intentlog-Key": key},
        )
    return replay(receipt_answer(receipt), key, reconciled=_reconciled(receipt))


def _journal_failed(call: _Call, exc: Error) -> Reply:
    upstream = call.upstream
    if upstream is not None and upstream.answered and not upstream.truncated:
        # The service answered; the journal could not record it yet. The answer is
        # the client's; the operation stays SUBMITTED and its repeat settles it.
        state = {"Intentlog-State": "SUBMITTED", "Intentlog-Key": exc.key or call.base}
        return Reply(upstream.status, upstream.headers, upstream.body, state)
    return problem(502, "journal", str(exc), task=call.task_id, key=exc.key, state=exc.state)


#: Headers that carry a credential or select the account a request acts for.
_CALLER_HEADERS = ("authorization", "proxy-authorization", "cookie", "x-api-key", "api-key",
                   "stripe-account", "stripe-context", "x-shopify-access-token")  # fmt: skip


def _caller(headers: dict[str, str]) -> str:
    """A digest of the request's credentials and account headers (never their value)."""
    seen = [(name, headers[name]) for name in _CALLER_HEADERS if name in headers]
    return hashlib.sha256(canonical_json(seen).encode()).hexdigest()


def _refused_by_service(error: Any) -> bool:
    """Whether a FAILED operation's error is the service's own refusal (it definitely did not
    apply, so the same request may be sent as a new attempt), as the protocol records one."""
    return isinstance(error, dict) and error.get("type") in ("Rejected", "KeyConflict", "NotSent")


def _reconciled(receipt: Any) -> bool:
    return isinstance(receipt, dict) and receipt.get("reconciled") is True


def _identity(route: Route, headers: dict[str, str]) -> tuple[str, dict[str, str]] | Reply:
    """The task and the operation's identity within it, or the 428/400 that says what is
    missing or wrong (nothing was journaled or forwarded)."""
    task = headers.get(TASK_HEADER)
    step = headers.get(STEP_HEADER)
    client_key = headers.get(route.client_key_header.lower())
    if task is None:
        return problem(
            428,
            "no-task",
            f"a {_unsafe()} request through route {route.name!r} needs an Intentlog-Task "
            "header naming its task; nothing was forwarded",
        )
    try:
        task = validate_label(task, "Intentlog-Task", 200)
        if step is not None:
            return task, {"step": validate_label(step, "Intentlog-Step", 200)}
    except InvalidInput as exc:
        return problem(400, "bad-header", f"{exc}; nothing was forwarded")
    if client_key is None or not client_key.strip():
        return problem(
            428,
            "no-identity",
            f"a {_unsafe()} request through route {route.name!r} needs its identity: an "
            f"Intentlog-Step header, or a stable {route.client_key_header} header (the same "
            "value when the request is made again); nothing was forwarded",
        )
    if client_key.startswith(_PER_CALL_KEYS):
        return problem(
            428, "no-identity",
            f"{route.client_key_header} {client_key[:40]!r}... is a key the SDK made up for "
            "this call, so a restarted client sends another one and would be charged again: "
            "give the request an Intentlog-Step header, or a stable idempotency key of your "
            "own; nothing was forwarded",
        )  # fmt: skip
    if len(client_key) > 255 or not client_key.isprintable():
        return problem(
            400,
            "bad-header",
            f"{route.client_key_header} must be 1 to 255 "
            "printable characters; nothing was forwarded",
        )
    return task, {"idempotency_key": client_key}


def _unsafe() -> str:
    return "POST, PUT, PATCH or DELETE"
