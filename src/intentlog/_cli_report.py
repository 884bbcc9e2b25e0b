"""What the CLI prints for people: tables that fit the terminal, and the values in them.

Tables never break a word, a key or a Message-ID (a person copies keys from this output),
and degrade in steps as the terminal narrows:

1. columns, the last one (a key, or free text) wrapped at spaces beside the others, while
   it has room for its longest word and at least a few words a line;
2. else, for a long last column beside two or more short ones that fit, those columns,
   each row followed by its last column on lines of its own (``  WHY  text...``), wrapped
   at spaces: an 80-column terminal keeps a table of long keys as a table;
3. else, when even the other columns do not fit, each row as a block of ``NAME  value``
   lines, every value whole.

A table without headers (``show``'s ``name  value`` lists) skips step 2 and never pushes
a value out of its column for one long word: an id longer than the room runs past it.

``status`` and ``show`` are rendered here, as text and as ``--json``, from the operator's view
that the console renders too (:mod:`intentlog._view`).
"""

from __future__ import annotations

import enum
import json
import re
import shutil
import textwrap
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

import click

import intentlog
from intentlog._open import cli_command
from intentlog._view import (
    OpView,
    PendingView,
    Status,
    TaskRow,
    TaskView,
    action_text,
    task_action_text,
)
from intentlog._words import duration

__all__ = [
    "OP_FIELDS",
    "OP_TIMES",
    "args_text",
    "compact",
    "iso",
    "kind_of",
    "pick",
    "prose",
    "show_doc",
    "show_text",
    "status_doc",
    "status_text",
    "table",
    "terminal_width",
    "wait_text",
    "wrap",
]

_MIN_TEXT = 24  # the narrowest the wrapped last column may get before rows become blocks


def terminal_width() -> int:
    """The width to fit: ``terminal_width`` of the click context (CliRunner passes it),
    else the terminal's (``$COLUMNS`` first), else 100 when not a terminal."""
    ctx = click.get_current_context(silent=True)
    if ctx is not None and ctx.terminal_width:
        return max(int(ctx.terminal_width), 20)
    return max(shutil.get_terminal_size((100, 24)).columns, 20)


# A number and its unit ("48 s", "2 days") stay on one line: held together while wrapping.
_UNIT = re.compile(r"(\d) (?=(?:days?|h|min|s)\b)")
_GLUE = "\x00"


def wrap(text: str, width: int) -> list[str]:
    # Whole words only: a key, an id with hyphens or a URL is never split.
    glued = _UNIT.sub(lambda m: m[1] + _GLUE, text)
    lines = textwrap.wrap(glued, max(width, 1), break_long_words=False, break_on_hyphens=False)
    return [line.replace(_GLUE, " ") for line in lines] or [""]


def table(
    headers: Sequence[str],
    rows: Iterable[Sequence[object]],
    header: bool = True,
    width: int | None = None,
) -> str:
    """Aligned columns within ``width`` (default: the terminal's); see the module docstring."""
    width = terminal_width() if width is None else width
    cells = [[str(c) for c in row] for row in rows]
    heads = [str(h) for h in headers]
    widths = [len(h) if header else 0 for h in heads]
    for row in cells:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    indent = sum(w + 2 for w in widths[:-1])
    room = width - indent
    longest = max((len(word) for row in cells for word in row[-1].split()), default=0)
    if indent + widths[-1] <= width or (room >= _MIN_TEXT and (longest <= room or not header)):
        return "\n".join(_beside(row, widths, indent, room) for row in _with(heads, cells, header))
    # Step 2 is for a long last column (a key, free text) beside short ones; a table of two
    # columns, or of short values, reads better as blocks.
    below = width - len(heads[-1]) - 4  # "  NAME  " before the last column's own lines
    long_last = len(heads) > 2 and widths[-1] >= _MIN_TEXT and indent - 2 <= width
    if header and long_last and (below >= _MIN_TEXT or widths[-1] <= below):
        lines = [_cols(heads[:-1], widths)]
        lines.extend(_under(row, heads[-1], widths, below) for row in cells)
        return "\n".join(lines)
    return _blocks(heads if header else ["" for _ in heads], cells, width)


def _with(heads: list[str], cells: list[list[str]], header: bool) -> list[list[str]]:
    return [heads, *cells] if header else cells


def _cols(cells: Sequence[str], widths: list[int]) -> str:
    return "".join(c.ljust(w + 2) for c, w in zip(cells, widths, strict=False)).rstrip()


def _beside(row: list[str], widths: list[int], indent: int, room: int) -> str:
    """One row in columns, its last cell wrapped at spaces in the ``room`` to its right."""
    head = "".join(c.ljust(w + 2) for c, w in zip(row[:-1], widths, strict=False))
    wrapped = wrap(row[-1], room)
    lines = [(head + wrapped[0]).rstrip()]
    lines.extend((" " * indent + more).rstrip() for more in wrapped[1:])
    return "\n".join(lines)


def _under(row: list[str], name: str, widths: list[int], room: int) -> str:
    """One row in columns but its last cell, which follows on lines of its own after the
    last column's name (the header row names only the other columns)."""
    if not row[-1]:
        return _cols(row[:-1], widths)
    label = f"  {name}  "
    wrapped = wrap(row[-1], room)
    lines = [_cols(row[:-1], widths), (label + wrapped[0]).rstrip()]
    lines.extend((" " * len(label) + more).rstrip() for more in wrapped[1:])
    return "\n".join(lines)


def _blocks(names: list[str], cells: list[list[str]], width: int) -> str:
    """Each row as a block of ``NAME  value`` lines, the free text wrapped beside its name,
    or under it (indented by two) where the names leave it too little room."""
    label = max(len(n) for n in names) + 2
    room = width - label
    blocks = []
    for row in cells:
        lines = []
        for i, (name, cell) in enumerate(zip(names, row, strict=False)):
            if i < len(row) - 1 or len(cell) <= room:
                lines.append((name.ljust(label) + cell).rstrip())  # whole: never split an id
            elif room >= _MIN_TEXT or not name:
                parts = wrap(cell, room)
                lines.append((name.ljust(label) + parts[0]).rstrip())
                lines.extend((" " * label + part).rstrip() for part in parts[1:])
            else:  # a word or two a line beside the names: the whole width under its name
                lines.append(name)
                lines.extend(("  " + part).rstrip() for part in wrap(cell, width - 2))
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def prose(text: str, width: int | None = None) -> str:
    """Prose (a title, a summary) wrapped at spaces to the terminal: leading newlines kept."""
    body = text.lstrip("\n")
    width = terminal_width() if width is None else width
    return "\n" * (len(text) - len(body)) + "\n".join(wrap(body, width))


def iso(t: float | None) -> str | None:
    if t is None:
        return None
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def compact(value: Any) -> str:
    """JSON on one line with a space after separators, so it wraps between fields, never
    inside a value."""
    return "-" if value is None else json.dumps(value, separators=(", ", ": "), default=str)


def pick(obj: Any, *names: str) -> dict[str, Any]:
    """Attributes as JSON values: enums by value, times (``*_at``, ``at``) as ISO-8601 UTC."""
    out: dict[str, Any] = {}
    for name in names:
        value = getattr(obj, name)
        if name in ("at", "not_before") or name.endswith("_at"):
            value = iso(value)
        out[name] = value.value if isinstance(value, enum.Enum) else value
    return out


def wait_text(seconds: float | None) -> str:
    return "-" if seconds is None else duration(seconds)


def args_text(op: intentlog.Operation) -> str:
    """An operation's arguments as ``show`` prints them: the kept ones, or that they were not
    kept. By default an effect keeps only their fingerprint, so a person who sees none knows
    why, and can still tell two calls apart."""
    if op.args is not None:
        return compact(op.args)
    return f"not stored (store_args=False); fingerprint {op.fingerprint[:16]}..."


def kind_of(op: intentlog.Operation) -> str:
    """What a person checks at the service: an effect, or a service contract by name."""
    policy = op.policy
    ways = []
    if policy.idempotent:
        ways.append("deduplicates")
    if policy.can_reconcile:
        ways.append("lookup")
    how = ", ".join(ways) or "neither deduplicates nor looks up"
    return f"effect ({how})" if policy.service is None else f"service {policy.service} ({how})"


def approval_of(op: intentlog.Operation) -> dict[str, Any] | None:
    """An operation's approval as ``show --json`` has it (None: its effect needs none)."""
    approval = op.approval
    if approval is None:
        return None
    return {"status": approval.status, "actor": approval.actor, "at": iso(approval.at),
            "reason": approval.reason, "fingerprint": approval.fingerprint}  # fmt: skip


def approval_text(approval: dict[str, Any]) -> str:
    """The approval line of ``show`` (``approval`` as :func:`approval_of` gives it)."""
    if approval["status"] == "awaiting":
        return "awaiting a person's approval (intentlog approve KEY / intentlog deny KEY)"
    why = f": {approval['reason']}" if approval["reason"] else ""
    return f"{approval['status']} by {approval['actor']} at {approval['at']}{why}"


# -- status and show: the operator's view (intentlog._view) as JSON and as text --------------

OP_FIELDS = ("key", "task_id", "effect", "state", "attempts", "receipt", "error", "note")
OP_TIMES = ("created_at", "updated_at", "submitted_at")
_RESOLUTION_FIELDS = ("at", "from_state", "to_state", "note", "receipt", "actor")


def status_doc(view: Status) -> dict[str, Any]:
    """``intentlog status --json``."""
    pending = [_pending_doc(p) for p in view.pending]
    doc = {"journal": view.journal, "counts": view.counts, "pending": pending}
    doc |= {"tasks": [_task_row_doc(t) for t in view.tasks]}
    return doc | {"needs_person": view.needs_person}


def _pending_doc(p: PendingView) -> dict[str, Any]:
    doc = pick(p, "key", "task_id", "effect", "state", "next_action", "reason", "not_before")
    return doc | {"wait_seconds": None if p.wait is None else round(p.wait, 1)}


def _task_row_doc(t: TaskRow) -> dict[str, Any]:
    info, outlook = t.info, t.info.outlook
    doc = pick(info.record, "task_id", "next_step", "epoch", "kind", "runs", "last_error")
    doc |= {"next_action": action_text(info.next_action), "holder_alive": info.holder_alive}
    doc |= {"not_before": iso(t.not_before)}
    doc |= {"who": outlook.doer.value if outlook else None}
    return doc | {"why": outlook.reason if outlook else None}


def status_text(view: Status) -> Iterator[str]:
    """``intentlog status``, a block at a time (each echoed as it comes)."""
    yield f"journal  {view.journal}\n"
    yield table(list(view.counts), [[str(n) for n in view.counts.values()]])
    if view.pending:
        yield from _pending_text(view.pending)
    if view.tasks:
        yield from _tasks_text(view.tasks)
    if view.needs_person:
        lines = [prose(f"needs a person: {what}:") + f"\n  {command}"
                 for what, command in _steps(view)]  # fmt: skip
        yield "\n" + "\n".join(lines or ["needs a person: see WHY above"])
    elif view.automatic:
        yield prose("\nwork remains that a worker or intentlog recover will do")
    else:
        yield "\nnothing needs attention"


def _pending_text(pending: list[PendingView]) -> Iterator[str]:
    yield prose(f"\noperations needing attention ({len(pending)}):")
    docs = [_pending_doc(p) for p in pending]
    cols = ("task_id", "effect", "state", "next_action")
    rows = [[*(d[c] for c in cols), wait_text(d["wait_seconds"]), d["key"]] for d in docs]
    # The key last and whole, the reason on its own line below: keys are copied from here.
    yield table(["TASK", "EFFECT", "STATE", "NEXT", "WAIT", "KEY"], rows)
    yield "\nwhy:"
    yield table(["KEY", "REASON"], [[p.key, p.reason] for p in pending])


def _tasks_text(tasks: list[TaskRow]) -> Iterator[str]:
    yield prose(f"\ntasks needing attention ({len(tasks)}):")
    rows = []
    for t in tasks:
        record, outlook = t.info.record, t.info.outlook
        who, why = (outlook.doer.value, outlook.reason) if outlook else ("-", "")
        rows.append([record.task_id, task_action_text(t.info), who, str(record.runs or "-"), why])
    yield table(["TASK", "NEXT", "WHO", "FAILED RUNS", "WHY"], rows)
    errors = [(t.info.record.task_id, t.info.record.last_error) for t in tasks
              if t.info.record.last_error]  # fmt: skip
    if errors:
        yield "\nlast errors:"
        yield table(["TASK", "LAST ERROR"], errors)


def _steps(view: Status) -> list[tuple[str, str]]:
    """The steps this journal needs of a person, each as a command that works when pasted
    (with --db), printed on a line of its own and never wrapped: people copy it from there."""
    steps: list[tuple[str, str]] = []
    if view.escalated:
        command = cli_command(view.journal, "resolve", "KEY", "--confirmed/--failed/--retry")
        # Named as their rows name them: one the decision escalates may still be SUBMITTED.
        states = {p.state for p in view.pending if p.next_action is intentlog.Action.ESCALATE}
        which = "UNRESOLVED" if states == {intentlog.State.UNRESOLVED} else "ESCALATE"
        steps.append((f"resolve the {which} operations", command))
    if view.awaiting:
        command = cli_command(view.journal, "approve", "KEY") + "   (or: deny KEY)"
        steps.append(("approve or deny the operations waiting for approval", command))
    if view.unfinishable:
        command = cli_command(view.journal, "complete", "TASK") + "   (or: cancel TASK)"
        steps.append(("complete or cancel the tasks nothing will finish", command))
    return steps


def show_doc(view: TaskView) -> dict[str, Any]:
    """``intentlog show TASK --json``."""
    info, rec, outlook = view.info, view.info.record, view.info.outlook
    task = pick(rec, "task_id", "next_step", "state", "completed", "epoch", "created_at")
    task |= {"updated_at": iso(rec.updated_at), "lease_holder": rec.owner, "kind": rec.kind}
    task |= {"holder_alive": info.holder_alive, "next_action": action_text(info.next_action)}
    task |= {"who": outlook.doer.value if outlook else None}
    task |= {"why": outlook.reason if outlook else None}
    task |= {"resolutions": [pick(r, "at", "outcome", "note", "actor") for r in view.endings]}
    ops = []
    for v in view.ops:
        op = v.op
        doc = pick(op, *OP_FIELDS, *OP_TIMES)
        doc |= {"kind": kind_of(op), "args": op.args, "args_stored": op.args is not None}
        doc |= {"fingerprint": op.fingerprint, "approval": approval_of(op)}
        doc |= {"next_action": v.action.value, "next_reason": v.reason if v.open else None}
        doc |= {"not_before": iso(v.not_before)}
        doc |= {"resolutions": [pick(r, *_RESOLUTION_FIELDS) for r in v.resolutions]}
        ops.append(doc)
    return {"journal": view.journal, "task": task, "operations": ops}


def show_text(view: TaskView) -> Iterator[str]:
    """``intentlog show TASK``, a block at a time."""
    info, rec = view.info, view.info.record
    holder = f"{rec.owner} ({'alive' if info.holder_alive else 'not alive'})" if rec.owner else "-"
    fields = [("task", rec.task_id), ("next action", view.action_text)]
    if info.outlook is not None:
        fields += [("who", info.outlook.doer.value), ("why", info.outlook.reason)]
    fields += [("kind", rec.kind or "-"), ("next_step", rec.next_step or "-")]
    fields += [("state", compact(rec.state))]
    fields += [("completed", "yes" if rec.completed else "no"), ("epoch", str(rec.epoch))]
    fields += [("lease holder", holder), ("updated", str(iso(rec.updated_at)))]
    for r in view.endings:
        text = f"{iso(r.at)} {r.outcome} by {r.actor}" + (f": {r.note}" if r.note else "")
        fields.append(("ended", text))
    yield table(["", ""], fields, header=False)
    yield f"\noperations ({len(view.ops)}):"
    for v in view.ops:
        rows = _op_rows(v)
        width = terminal_width() - 2
        yield "\n" + textwrap.indent(table(["", ""], rows, header=False, width=width), "  ")


def _op_rows(v: OpView) -> list[tuple[str, Any]]:
    """One operation of ``show`` as ``name  value`` rows."""
    op = v.op
    nxt = v.action.value + ("" if v.wait is None else f" (in {wait_text(v.wait)})")
    rows: list[tuple[str, Any]] = [("key", op.key), ("effect", op.effect), ("kind", kind_of(op))]
    rows += [("state", op.state.value), ("next", nxt)]
    if v.open and v.reason:
        rows.append(("why", v.reason))
    approval = approval_of(op)
    if approval is not None:
        rows.append(("approval", approval_text(approval)))
    rows += [("runs", str(op.attempts)), ("args", args_text(op))]
    rows += [("receipt", compact(op.receipt)), ("error", compact(op.error))]
    rows += [("note", op.note or "-")]
    rows += [("created", iso(op.created_at)), ("updated", iso(op.updated_at))]
    for r in v.resolutions:
        text = f"{iso(r.at)} {r.from_state.value} -> {r.to_state.value} by {r.actor}"
        extra = f"; receipt {compact(r.receipt)}" if r.receipt is not None else ""
        rows.append(("resolution", text + (f": {r.note}" if r.note else "") + extra))
    return rows
