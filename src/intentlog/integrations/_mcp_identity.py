"""Who a server-side MCP tool call is: its operation key and its task, read from the request.

Private to :mod:`intentlog.integrations.mcp_server`. Everything here reads plain JSON (the
request's ``_meta`` and the tool's protocol ``meta`` argument) and raises
:class:`intentlog.InvalidInput` whose ``path`` names the field, for what cannot be used;
nothing here is journaled or sent.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Mapping
from typing import Any

from intentlog._errors import InvalidInput
from intentlog._keys import MAX_KEY_LENGTH, MAX_TASK_ID_LENGTH, validate_key, validate_task_id

__all__ = [
    "ARGUMENT_KEY_FIELDS",
    "KEY_FIELDS",
    "TASK_FIELD",
    "client_key",
    "key_task",
    "meta_task",
    "session_task",
]

#: Where a client may put the operation key in the request's ``_meta``: the commerce
#: protocols' two spellings, and the key of intentlog's own MCP proxy.
KEY_FIELDS = ("idempotency_key", "idempotency-key", "intentlog/key")
#: The same two commerce spellings inside a tool's protocol ``meta`` argument (the MCP
#: bindings of ACP and UCP carry the HTTP headers there: ``meta.idempotency_key``).
ARGUMENT_KEY_FIELDS = ("idempotency_key", "idempotency-key")
#: Where a client names the task in the request's ``_meta``, as for the MCP proxy.
TASK_FIELD = "intentlog/task"

_KEY_TASK_PREFIX = "key:"
_SESSION_TASK_PREFIX = "mcp-session:"
_REQUEST_TASK_PREFIX = "mcp-request:"


def client_key(
    meta: Mapping[str, Any], argument_meta: Any, argument: str | None
) -> tuple[str, str] | None:
    """The operation key the client sent and the field it was read from (the first of those
    present), or None when it sent none.

    Looked up in the request's ``_meta`` (:data:`KEY_FIELDS`) and in the tool's protocol
    ``meta`` argument named ``argument`` (:data:`ARGUMENT_KEY_FIELDS`). Every spelling present
    must hold the same valid key (1 to 255 printable ASCII characters, no spaces: it may be
    sent on as an HTTP header); otherwise InvalidInput, whose ``path`` is the field.
    """
    found: list[tuple[str, Any]] = [
        (_meta_field(name), meta[name]) for name in KEY_FIELDS if name in meta
    ]
    if argument is not None and isinstance(argument_meta, Mapping):
        found += [
            (f"arguments.{argument}{_path(name)}", argument_meta[name])
            for name in ARGUMENT_KEY_FIELDS
            if name in argument_meta
        ]
    for field, value in found:
        try:
            validate_key(value)
        except ValueError:
            shown = repr(value)[:80]
            raise InvalidInput(
                f"{field} must be a string of 1 to {MAX_KEY_LENGTH} printable ASCII characters "
                f"without spaces, got {shown}; the call was not executed",
                path=field,
            ) from None
    keys = {value for _, value in found}
    if len(keys) > 1:
        named = ", ".join(f"{field} = {value!r}" for field, value in found)
        raise InvalidInput(
            f"the request names two different idempotency keys ({named}); send one key, or "
            "the same key in every field; the call was not executed",
            path=found[0][0],
        )
    return (found[0][1], found[0][0]) if found else None


def meta_task(meta: Mapping[str, Any]) -> str | None:
    """The task the client named in ``_meta["intentlog/task"]``, or None; InvalidInput (its
    ``path`` the field) if it is not a usable task id."""
    if TASK_FIELD not in meta:
        return None
    try:
        return validate_task_id(meta[TASK_FIELD])
    except ValueError as exc:
        raise InvalidInput(
            f"{_meta_field(TASK_FIELD)} is not a usable task id: {exc}; the call was not executed",
            path=_meta_field(TASK_FIELD),
        ) from None


def key_task(key: str) -> str:
    """The task of a call that names its key but no task: one task per key, named after it
    (a key too long for a task id keeps its start and a digest of the whole)."""
    task = _KEY_TASK_PREFIX + key
    if len(task) <= MAX_TASK_ID_LENGTH:
        return task
    digest = hashlib.sha256(key.encode("ascii")).hexdigest()[:32]
    return f"{_KEY_TASK_PREFIX}{key[:150]}~{digest}"


#: The task of this process's calls over stdio, which serves one client connection for the life
#: of the process.
_PROCESS_SESSION = _SESSION_TASK_PREFIX + uuid.uuid4().hex
_SESSION_HEADER = "mcp-session-id"


def session_task(headers: Mapping[str, str] | None) -> str:
    """The task of a call that names neither key nor task: its MCP session, which a restart of
    the server does not keep.

    Over stdio (no HTTP headers) the session is the connection, one per server process. Over
    streamable HTTP it is the ``Mcp-Session-Id`` the transport checked; a request without one
    (a stateless server, a 2026-07-28 request) belongs to no session and gets a task of its own,
    so nothing can recognise it when it is made again.
    """
    if headers is None:
        return _PROCESS_SESSION
    session = next((v for k, v in headers.items() if k.lower() == _SESSION_HEADER), None)
    if not session:
        return _REQUEST_TASK_PREFIX + uuid.uuid4().hex
    digest = hashlib.sha256(session.encode("utf-8", "replace")).hexdigest()[:32]
    return _SESSION_TASK_PREFIX + digest


def _meta_field(name: str) -> str:
    return "_meta" + _path(name)


def _path(name: str) -> str:
    return f".{name}" if name.isidentifier() else f'["{name}"]'
