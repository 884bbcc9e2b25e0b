"""What the journal keeps of a tool result, and what the agent gets back.

The receipt of a journaled call is the tool's whole result (``content``,
``structuredContent``, ``isError``, ``resultType``, ``_meta``, and any field of a newer
revision or an extension; for a task-augmented call, the ``CreateTaskResult`` naming the
task it started), bounded and cleaned by the journal's hygiene before it is written: secret
values are redacted, and a result larger than the journal's bound is replaced by a note of
its size and digest. The first answer to a call is the upstream's own result; a replay
(the same call again, after a restart or a lost response) is built from the receipt and
says so in ``_meta["intentlog/operation"]``, with what was reduced, if anything.

Every answer the proxy builds itself is given in the revision the agent speaks
(:func:`in_revision`): from 2026-07-28 on a result carries ``resultType``, which the
revision requires of every result and its clients validate; an older agent gets none.
https://modelcontextprotocol.io/specification/2026-07-28/schema#calltoolresult

Clients check ``structuredContent`` against the tool's ``outputSchema``, and the
TypeScript SDK (``Client.callTool``) does so on error results too: it validates any
``structuredContent`` present and accepts an error result without one.
https://github.com/modelcontextprotocol/typescript-sdk/blob/main/src/client/index.ts
So a result answered from the journal (a replay, what a lookup found, a person's receipt)
is the tool's own result, ``isError`` false, wherever that is valid in the revision the
agent speaks; only where its structured content does not fit the schema in a revision that
requires it (2025-06-18 on) is it an error result *without* structured content, whose text
says the call *was applied* and must not be repeated (:func:`_fitted` says why no other
answer is both valid and true there); and the proxy's own
answers (UNRESOLVED, still in flight) carry their facts as ``structuredContent`` only for a
tool known to declare no ``outputSchema`` (else where no schema check can fail: in
``_meta["intentlog/operation"]``, which every answer carries).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from intentlog._hygiene import redact, reduce_receipt, scrub_text

__all__ = [
    "META",
    "attach",
    "error_result",
    "in_flight_result",
    "in_revision",
    "receipt_of",
    "replay_of",
    "text_of",
    "unresolved_result",
]

log = logging.getLogger("intentlog.proxy")
META = "intentlog/operation"
#: The first revision whose results carry ``resultType`` and whose structured content may be
#: any JSON value (revisions are dates, so later ones compare greater).
MODERN = "2026-07-28"
#: The first revision with structured tool results (``outputSchema``, ``structuredContent``).
STRUCTURED = "2025-06-18"
_ROOM = 4096  # what the receipt's envelope and notes may take beside the result


def receipt_of(result: Any, *, tool: str, max_bytes: int, via: str = "send") -> dict[str, Any]:
    """The receipt to journal for a tool result (never raises: a receipt must never cost
    the confirmation). ``via``: ``"send"`` or ``"lookup"`` (how the outcome was learnt)."""
    kept = dict(result) if isinstance(result, dict) else result
    masked = False
    if isinstance(kept, dict) and isinstance(kept.get("content"), list):
        try:
            kept["content"], masked = _masked_content(kept["content"])
        except Exception:  # content too odd to examine (nested too deep, ...): not kept
            kept["content"], masked = [], True
    stored, _, dropped = reduce_receipt(kept, effect=tool, max_bytes=max(max_bytes - _ROOM, 256))
    if masked:
        dropped.append(f"text content of {tool!r} held credential-like values; they were masked")
    receipt: dict[str, Any] = {"result": stored, "via": via}
    if dropped:
        receipt["reduced"] = [scrub_text(d, limit=400) for d in dropped[:5]]
        for note in receipt["reduced"]:
            log.warning("%s", note)
    return receipt


def _masked_content(blocks: list[Any]) -> tuple[list[Any], bool]:
    """Text blocks with the credentials they carry masked: a text that is JSON (a tool's
    structured result, printed) is redacted as JSON; any other text has credential shapes
    replaced by ``***``. Whether anything was masked."""
    out: list[Any] = []
    changed = False
    for block in blocks:
        text = block.get("text") if isinstance(block, dict) else None
        if not isinstance(text, str):
            out.append(block)
            continue
        cleaned = text
        value = None
        if text.lstrip()[:1] in ("{", "["):  # a printed structured result, perhaps
            try:
                value = json.loads(text)
            except ValueError:
                value = None
        if isinstance(value, dict | list):
            safe = redact(value)
            if safe is not value:
                cleaned = json.dumps(safe, ensure_ascii=False, indent=2)
        cleaned = scrub_text(cleaned, limit=max(len(cleaned) * 2, 16))
        if cleaned != text:
            changed = True
            block = {**block, "text": cleaned}
        out.append(block)
    return out, changed


def attach(result: dict[str, Any], **operation: Any) -> dict[str, Any]:
    """``result`` with the operation's facts in ``_meta`` (a copy; the result's own
    ``_meta`` is kept)."""
    meta = dict(result.get("_meta") or {}) if isinstance(result.get("_meta"), dict) else {}
    meta[META] = {k: v for k, v in operation.items() if v is not None}
    return {**result, "_meta": meta}


def text_of(result: Any) -> str:
    """The text content of a tool result, joined (for messages and error patterns)."""
    content = result.get("content") if isinstance(result, dict) else None
    if not isinstance(content, list):
        return ""
    return "\n".join(
        block["text"]
        for block in content
        if isinstance(block, dict) and isinstance(block.get("text"), str)
    )


def in_revision(result: dict[str, Any], version: str | None) -> dict[str, Any]:
    """``result`` as an agent speaking protocol revision ``version`` expects it.

    From 2026-07-28 on, every result carries ``resultType`` ("complete" unless it says
    otherwise: an ``input_required`` round, or an extension's result); the SDK's clients
    refuse a ``CallToolResult`` without it. Older revisions have no such field, so it is
    left out for their agents (a receipt recorded in one revision may be replayed to an
    agent of another). A ``CreateTaskResult`` of the 2025-11-25 tasks is left as it is.
    """
    modern = isinstance(version, str) and version >= MODERN
    if modern:
        if "resultType" in result or "task" in result:
            return result
        return {**result, "resultType": "complete"}
    if "resultType" in result and result["resultType"] == "complete":
        return {k: v for k, v in result.items() if k != "resultType"}
    return result


def error_result(text: str, structured: dict[str, Any] | None = None) -> dict[str, Any]:
    """A tool error result (``isError``) the model can read."""
    result: dict[str, Any] = {"content": [{"type": "text", "text": text}], "isError": True}
    if structured is not None:
        result["structuredContent"] = structured
    return result


def _own_answer(
    text: str, facts: dict[str, Any], tool: dict[str, Any] | None, *, key: str, state: str
) -> dict[str, Any]:
    """One of the proxy's own error answers: its facts in ``_meta["intentlog/operation"]``,
    and as ``structuredContent`` too only where no client's schema check can fail on them
    (the tool is known and declares no ``outputSchema``)."""
    fits = isinstance(tool, dict) and tool.get("outputSchema") is None
    result = error_result(text, facts if fits else None)
    details = {k: v for k, v in facts.items() if k not in ("state", "key")}
    return attach(result, key=key, state=state, replay=False, **details)


def unresolved_result(
    key: str, task_id: str, tool: str, why: str, *, db: str, definition: dict[str, Any] | None
) -> dict[str, Any]:
    """The answer to a call whose outcome is UNRESOLVED: an error result that tells the
    model not to retry, and a person how to resolve it. ``definition``: the tool as the
    server lists it (None: not known)."""
    hint = f"intentlog --db {db} resolve {key} --confirmed --receipt '<JSON>' | --failed | --retry"
    text = (
        f"Do not retry this call. Whether {tool!r} was applied is unknown (operation {key} of "
        f"task {task_id!r} is UNRESOLVED): the proxy stopped while the request was in flight, "
        "and this tool can neither deduplicate a resend nor be asked. A person must check and "
        "decide; once they have, making this same call again returns their resolution. To "
        f"resolve: {hint}"
    )
    facts = {
        "state": "UNRESOLVED",
        "next_action": "ESCALATE",
        "key": key,
        "task_id": task_id,
        "tool": tool,
        "reason": why[:500],
        "resolve": hint,
    }
    return _own_answer(text, facts, definition, key=key, state="UNRESOLVED")


def in_flight_result(
    key: str,
    task_id: str,
    tool: str,
    why: str,
    wait: float | None,
    *,
    definition: dict[str, Any] | None,
) -> dict[str, Any]:
    """The answer to a call that may still be in flight: call again after ``wait`` s."""
    when = f" in about {wait:.0f} s" if wait is not None else " later"
    text = (
        f"Do not start this action another way. The call of {tool!r} (operation {key} of task "
        f"{task_id!r}) may still be in flight and its outcome is not settled yet. Make this "
        f"same call again{when}: it returns the outcome, and resends only where that cannot "
        "apply it twice."
    )
    facts = {
        "state": "SUBMITTED",
        "next_action": "WAIT",
        "key": key,
        "task_id": task_id,
        "tool": tool,
        "retry_after_seconds": round(wait, 3) if wait is not None else None,
        "reason": why[:500],
    }
    return _own_answer(text, facts, definition, key=key, state="SUBMITTED")


def _is_tool_result(result: dict[str, Any]) -> bool:
    """Whether a recorded result is a ``CallToolResult`` (not a task it started, nor an
    extension's result of its own ``resultType``)."""
    return "task" not in result and result.get("resultType", "complete") == "complete"


def replay_of(
    receipt: Any,
    *,
    key: str,
    tool: dict[str, Any] | None,
    resolved_by: str | None = None,
    version: str | None = None,
) -> dict[str, Any]:
    """The result to answer a replayed call with, from its receipt: the recorded result (or
    what a lookup found, or a person's receipt) as the tool's own, wherever that is valid in
    the agent's revision ``version`` (None: not known, taken as one with structured results);
    see :func:`_fitted` for the one case where it cannot be."""
    schema = tool.get("outputSchema") if isinstance(tool, dict) else None
    ours = (
        isinstance(receipt, dict) and isinstance(receipt.get("result"), dict) and "via" in receipt
    )
    if ours:
        result = dict(receipt["result"])
        via = receipt.get("via")
        if "intentlog_note" in result:  # nothing of the result was kept
            why = f"its result was not kept by the journal ({result['intentlog_note']})"
            answer = _applied_but(key, why, as_error=schema is not None and _structured(version))
        elif _is_tool_result(result):
            if "content" not in result:
                result["content"] = _content_for(result.get("structuredContent"))
            if via == "lookup":
                result = _found_value(result, version)
            answer = _fitted(result, schema, version, key=key, what="its recorded result")
        else:
            answer = result
        return attach(
            answer, key=key, state="CONFIRMED", replay=True, via=via, reduced=receipt.get("reduced")
        )
    # A person's resolution: their receipt, as the call's result where it fits the tool.
    who = f" by {resolved_by}" if resolved_by else ""
    result = {
        "content": [
            {
                "type": "text",
                "text": f"This call was applied once already (resolved{who}); its receipt: "
                + json.dumps(receipt, ensure_ascii=False, sort_keys=True),
            }
        ]
    }
    if isinstance(receipt, dict) or (_any_value(version) and _present(receipt)):
        result["structuredContent"] = receipt
    answer = _fitted(result, schema, version, key=key, what="the receipt recorded for it")
    return attach(answer, key=key, state="CONFIRMED", replay=True, via="resolution")


def _fitted(
    result: dict[str, Any], schema: Any, version: str | None, *, key: str, what: str
) -> dict[str, Any]:
    """``result`` (a call's recorded outcome, which is true: the call was applied, and this
    is what is known of it) as an answer the agent's revision accepts.

    - Its structured content fits the tool's ``outputSchema`` (or there is none): it is the
      answer, ``isError`` false.
    - It does not fit, and the agent speaks a revision before 2025-06-18, which has no
      structured results (``outputSchema`` and ``structuredContent`` came with 2025-06-18):
      its text content alone is a valid answer, ``isError`` false.
    - It does not fit, from 2025-06-18 on: no answer is both valid and true. A result that
      is not an error must carry structured content conforming to the schema (the
      revision's "Servers MUST provide structured results that conform to this schema", and
      the SDKs' clients refuse one without), and the only value the proxy has of this call's
      outcome does not conform; any other value would be made up (a server-memory
      ``create_entities`` must list the entities *that call* created, which no lookup of
      the graph can tell). So the answer is an error result without structured content
      (which every client accepts), whose text says that the call *was applied*, must not
      be made again, and what is known of it; ``_meta`` says it is CONFIRMED.
    """
    if not isinstance(schema, dict) or result.get("isError") is True:
        structured = result.get("structuredContent")
        if structured is not None and not isinstance(structured, dict) and not _any_value(version):
            return _without_structure(result)  # only objects before 2026-07-28
        return result
    problem = _schema_problem(result.get("structuredContent"), schema, version)
    if problem is None:
        return result
    if not _structured(version):
        return _without_structure(result)
    answer = _applied_but(key, f"{what} {problem}", as_error=True)
    known = [
        b for b in result.get("content") or [] if isinstance(b, dict) and b.get("type") == "text"
    ]
    answer["content"].extend(known)
    return answer


def _without_structure(result: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in result.items() if k != "structuredContent"}


def _found_value(result: dict[str, Any], version: str | None) -> dict[str, Any]:
    """A lookup's recorded result with what it found as structured content, where the
    agent's revision takes a value that is not an object (2026-07-28 on): a lookup's value is
    kept as its JSON text, and as structured content only when it is an object."""
    if "structuredContent" in result or not _any_value(version):
        return result
    try:
        value = json.loads(text_of(result))
    except ValueError:
        return result
    return {**result, "structuredContent": value} if _present(value) else result


def _structured(version: str | None) -> bool:
    """Whether revision ``version`` has structured tool results (2025-06-18 on; an unknown
    revision is taken as one that has them, the stricter reading)."""
    return not (isinstance(version, str) and version < STRUCTURED)


def _any_value(version: str | None) -> bool:
    """Whether structured content may be any JSON value, not only an object (2026-07-28)."""
    return isinstance(version, str) and version >= MODERN


def _present(value: Any) -> bool:
    """Whether a client sees ``value`` as structured content at all: the TypeScript SDK
    tests it for truth, so ``null``, ``false``, ``0`` and ``""`` read as none."""
    return value is not None and value is not False and value != 0 and value != ""


def _applied_but(key: str, why: str, *, as_error: bool) -> dict[str, Any]:
    """A text that the call was applied; never structured content (see the module's
    docstring: an error result's structured content is still checked by some clients)."""
    text = (
        f"This call was applied once already (operation {key}), but {why}. Do not call it "
        "again to get the result: that would apply it a second time."
    )
    return {"content": [{"type": "text", "text": text}], "isError": as_error}


def _content_for(structured: Any) -> list[dict[str, Any]]:
    return [{"type": "text", "text": json.dumps(structured, ensure_ascii=False, sort_keys=True)}]


def _schema_problem(structured: Any, schema: dict[str, Any], version: str | None) -> str | None:
    """Why ``structured`` as a result's structured content would fail a client's check
    against ``schema`` in revision ``version``, or None."""
    if not _present(structured):
        return "has no structured content, which the tool's output schema requires"
    if not isinstance(structured, dict) and not _any_value(version):
        return "is not a JSON object, as structured content must be before revision 2026-07-28"
    try:
        import jsonschema
    except ImportError:  # pragma: no cover - installed with the mcp extra
        return None
    try:
        jsonschema.validate(structured, schema)
    except jsonschema.ValidationError as exc:
        return f"does not match the tool's output schema ({scrub_text(exc.message, limit=200)})"
    except jsonschema.SchemaError:
        return None  # the server's schema is broken; clients will say so, not us
    return None
