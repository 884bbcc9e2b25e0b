"""What the client of a journaled MCP tool sees when the call has no result of its own.

Private to :mod:`intentlog.integrations.mcp_server`. Each answer is an error result
(``isError: true``) whose text tells the model what happened and what not to do, and whose
``_meta["intentlog/operation"]`` carries the same facts for a program, in the vocabulary of
intentlog's MCP proxy (``key``, ``state``, ``next_action``, ``task_id``, ``tool``, ...). No
``structuredContent`` is sent: a client checks a tool's structured results against its
``outputSchema``, and these facts are not the tool's output.
"""

from __future__ import annotations

import math
import shlex
import time
from typing import TYPE_CHECKING, Any

from intentlog._errors import (
    ApprovalRequired,
    KeyConflict,
    OutcomeUnknown,
    Rejected,
    StillInFlight,
    TaskBusy,
)

if TYPE_CHECKING:
    from mcp.types import CallToolResult

__all__ = [
    "OPERATION_META",
    "applied_unreadable",
    "awaiting_approval",
    "busy",
    "conflict",
    "error_result",
    "in_flight",
    "refused",
    "rejected",
    "unresolved",
]

OPERATION_META = "intentlog/operation"
"""The ``_meta`` entry of an answer that holds the operation's facts."""


def error_result(text: str, facts: dict[str, Any]) -> CallToolResult:
    """An ``isError`` result with ``text`` and the facts in ``_meta["intentlog/operation"]``."""
    from mcp.types import CallToolResult

    return CallToolResult.model_validate(
        {
            "content": [{"type": "text", "text": text}],
            "isError": True,
            "_meta": {OPERATION_META: {k: v for k, v in facts.items() if v is not None}},
        }
    )


def refused(tool: str, why: str, field: str) -> CallToolResult:
    """A call refused before anything was journaled or executed, naming the field."""
    return error_result(
        f"{tool} was not executed: {why}",
        {"tool": tool, "refused": "InvalidInput", "field": field},
    )


def rejected(tool: str, exc: Rejected, key: str | None, task_id: str) -> CallToolResult:
    """The tool said "not applied" (now, or on the first call of this key)."""
    return error_result(
        f"{tool} was not applied: {exc.message}. This call (operation {key} of task "
        f"{task_id!r}) is FAILED: made again with the same key and arguments, it gets this "
        "answer again. A new attempt needs a new idempotency key.",
        {"key": key, "state": "FAILED", "next_action": "REPLAN", "task_id": task_id, "tool": tool},
    )


def conflict(
    tool: str, exc: KeyConflict, key: str | None, field: str | None, task_id: str
) -> CallToolResult:
    """The key is already the journal's record of another call: this one is refused."""
    source = f" (from {field})" if field else ""
    return error_result(
        f"{tool} was not executed: the idempotency key {key!r}{source} is already recorded "
        f"for another call ({exc.message}). The same call (same tool, same arguments) with "
        "this key gets the recorded outcome.",
        {
            "key": key,
            "state": exc.state,
            "refused": "KeyConflict",
            "field": field,
            "task_id": task_id,
            "tool": tool,
        },
    )


def unresolved(
    tool: str, exc: OutcomeUnknown, key: str | None, task_id: str, journal_url: str
) -> CallToolResult:
    """The outcome is unknown and nothing can settle it: a person has to."""
    hint = (
        f"intentlog --db {shlex.quote(journal_url)} resolve {key} --confirmed --receipt "
        "'<JSON>' | --failed | --retry"
    )
    return error_result(
        f"Do not retry this call. Whether {tool!r} was applied is unknown (operation {key} of "
        f"task {task_id!r} is UNRESOLVED): it may have been applied. The server stopped while "
        "it ran, and this tool can neither deduplicate a second run nor be asked whether the "
        "first one landed. A person must check and decide; once they have, this same call "
        f"returns their resolution. To resolve: {hint}",
        {
            "key": key,
            "state": "UNRESOLVED",
            "next_action": "ESCALATE",
            "task_id": task_id,
            "tool": tool,
            "reason": exc.message[:500],
            "resolve": hint,
        },
    )


def in_flight(tool: str, exc: StillInFlight, key: str | None, task_id: str) -> CallToolResult:
    """An earlier run of this call may still land; the same call later gets the outcome."""
    wait = None if exc.not_before is None else max(0.0, exc.not_before - time.time())
    when = f" in about {math.ceil(wait)} s" if wait is not None else " later"
    return error_result(
        f"Do not do this another way. An earlier run of {tool!r} (operation {key} of task "
        f"{task_id!r}) may still be in flight and its outcome is not settled yet. Make this "
        f"same call again{when}: it returns the outcome, and runs the tool again only where "
        "that cannot apply it twice.",
        {
            "key": key,
            "state": "SUBMITTED",
            "next_action": "WAIT",
            "task_id": task_id,
            "tool": tool,
            "retry_after_seconds": None if wait is None else round(wait, 3),
            "reason": exc.message[:500],
        },
    )


def awaiting_approval(tool: str, exc: ApprovalRequired, task_id: str) -> CallToolResult:
    """The call waits for a person's approval; nothing was executed."""
    return error_result(
        f"{tool} was not executed yet: it needs a person's approval ({exc.message}). Once "
        "approved, this same call runs it, once.",
        {
            "key": exc.key,
            "state": "PLANNED",
            "next_action": "APPROVE",
            "task_id": task_id,
            "tool": tool,
            "approve": exc.command,
        },
    )


def busy(tool: str, exc: TaskBusy, key: str | None, task_id: str) -> CallToolResult:
    """Another worker holds the task: nothing was executed, the same call may be sent again."""
    return error_result(
        f"{tool} was not executed: another worker is running task {task_id!r} "
        f"({exc.message}). Send the same call again shortly.",
        {"key": key, "task_id": task_id, "tool": tool, "refused": "TaskBusy"},
    )


def applied_unreadable(tool: str, key: str | None, receipt: Any, why: str) -> CallToolResult:
    """A replay whose recorded result no longer fits the tool's return type (it was reduced
    before it was journaled): the call was applied, and this says what is known of it."""
    return error_result(
        f"{tool} was applied (operation {key}); do not repeat it. Its recorded result does not "
        f"fit the tool's return type any more ({why}); what was recorded: {receipt!r}"[:4000],
        {"key": key, "state": "CONFIRMED", "replay": True, "tool": tool},
    )
