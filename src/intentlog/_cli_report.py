"""What the CLI prints for people: tables that fit the terminal, and the values in them.

Tables never break a word, a key or a Message-ID (a person copies keys from this output):
the last column (free text) wraps at spaces only; when the other columns do not leave it
room, each row is printed as a block of ``NAME  value`` lines instead, every value whole.
"""

from __future__ import annotations

import enum
import json
import re
import shutil
import textwrap
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

import click

import intentlog
from intentlog._words import duration

__all__ = ["action_text", "compact", "iso", "pick", "table", "terminal_width", "wrap"]

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
    if indent + widths[-1] <= width or width - indent >= _MIN_TEXT:
        lines = []
        for row in [heads, *cells] if header else cells:
            head = "".join(c.ljust(w + 2) for c, w in zip(row[:-1], widths, strict=False))
            wrapped = wrap(row[-1], width - indent)
            lines.append((head + wrapped[0]).rstrip())
            lines.extend((" " * indent + more).rstrip() for more in wrapped[1:])
        return "\n".join(lines)
    # Blocks: one "NAME  value" line per cell, the free text wrapped below its name.
    names = heads if header else ["" for _ in heads]
    label = max(len(n) for n in names) + 2
    blocks = []
    for row in cells:
        lines = []
        for i, (name, cell) in enumerate(zip(names, row, strict=False)):
            if i == len(row) - 1 and len(cell) > width - label:
                parts = wrap(cell, width - label)
            else:
                parts = [cell]  # whole, even past the width: never split an id
            lines.append((name.ljust(label) + parts[0]).rstrip())
            lines.extend((" " * label + p).rstrip() for p in parts[1:])
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


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


def action(action: intentlog.Action | None, next_step: str | None) -> str | None:
    if action is intentlog.Action.RESUME and next_step:
        return f"RESUME at {next_step}"
    return action.value if action else None


def action_text(info: intentlog.TaskInfo) -> str:
    return action(info.next_action, info.record.next_step) or "none (task complete)"


def wait_text(seconds: float | None) -> str:
    return "-" if seconds is None else duration(seconds)


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
