"""Lookups: the read tool of a server that tells whether a call the proxy lost track of
landed, the arguments it is sent for one call, and which tools may be one."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from intentlog._errors import InvalidInput
from intentlog._model import no_record

if TYPE_CHECKING:
    from intentlog.proxy._policy import ProxyFile

__all__ = [
    "NOT_FOUND",
    "PLACEHOLDER",
    "Hit",
    "Lookup",
    "Verdict",
    "at_path",
    "key_refusals",
    "lookup_refusals",
]

PLACEHOLDER = re.compile(r"\{(key|arguments\.[A-Za-z0-9_.-]+)\}")


@dataclasses.dataclass(frozen=True, slots=True)
class Lookup:
    """A read tool of the same server that tells whether a call landed.

    ``arguments`` are sent to ``tool``; a string value ``"{key}"`` becomes the operation key
    and ``"{arguments.NAME}"`` the call's argument NAME, where NAME is a dotted path that may
    index into lists (``{arguments.entities.0.name}``); a whole-string placeholder keeps the
    argument's JSON type, inside a longer string it is formatted as text. A placeholder the
    call's arguments do not resolve is an error (:meth:`render` raises InvalidInput), never a
    null sent.

    ``found`` (required) is a dotted path into the lookup's result (its
    ``structuredContent``, else its first text content read as JSON) to what is there only
    when the call landed. ``match`` maps dotted paths inside that value to placeholders, and
    ties a hit to this very call (required unless the lookup's arguments carry ``{key}``):
    with it, a list at ``found`` is searched for the one record whose fields equal the
    call's values, and a single record there must hold them. :meth:`judge` gives the
    verdict. The guarantee: "the server answered something" never counts as "the call
    landed", and an answer of another shape never counts as "it did not". A null, ``""``,
    ``[]``, ``{}``, ``false`` or ``0`` at ``found`` (or on the way to it, or an index past a
    list's end) is NotFound, and so is a list with no matching record. A member of the path
    that the answer lacks, a text answer, a record of another call where this one's should
    be, or two records that both match, is Indeterminate. An error result means the lookup
    could not tell (asked again later), unless its text matches ``not_found_error``.

    The tool is called unjournaled during recovery, so it must only read: one the tools
    file journals is refused when the file is read, and one the file does not mark
    ``read_only`` must be listed by the server with ``readOnlyHint: true``
    (:func:`lookup_refusals`), or the proxy does not start.
    """

    tool: str
    arguments: Mapping[str, Any]
    found: tuple[str, ...]
    not_found_error: re.Pattern[str] | None = None
    match: Mapping[tuple[str, ...], Any] = dataclasses.field(default_factory=dict)

    def render(self, key: str, call_arguments: Mapping[str, Any]) -> dict[str, Any]:
        """The lookup's arguments for one call; InvalidInput names a placeholder that the
        call's arguments do not resolve."""
        return {name: _render(value, key, call_arguments) for name, value in self.arguments.items()}

    def check(self, call_arguments: Mapping[str, Any]) -> None:
        """Raise InvalidInput naming a placeholder of the arguments or of ``match`` that the
        call's arguments do not resolve: such a call could never be found after a crash."""
        self.render("key", call_arguments)
        for value in self.match.values():
            _render(value, "key", call_arguments)

    def judge(self, answer: Any, key: str, call_arguments: Mapping[str, Any]) -> Verdict:
        """What the lookup's ``answer`` says of the call with ``key`` and ``call_arguments``:
        the value found (the call's result), NOT_FOUND, or the reason it cannot tell.

        NOT_FOUND only where the answer has the shape the tools file expects and says
        "nothing" at ``found``; an answer of another shape (text, a path that is not there: a
        typo in ``found`` or a server that answers otherwise) cannot tell, so that a lookup
        that never matches does not have every call sent again."""
        where = ".".join(self.found)
        state, value = _walk(answer, self.found)
        if state == "shape":
            return (
                f"its answer has no {value!r} on the way to found = {where!r} (it is "
                f"{_short(answer)}): the answer's shape is not the one the tools file expects"
            )
        if no_record(value):
            return NOT_FOUND
        if not self.match:
            return Hit(value)
        wanted = {path: _render(v, key, call_arguments) for path, v in self.match.items()}
        if isinstance(value, list):
            hits = [item for item in value if _matches(item, wanted)]
            if not hits:
                return NOT_FOUND
            if len(hits) > 1:
                return f"{len(hits)} records at {where!r} match this one call"
            return Hit(hits[0])
        if _matches(value, wanted):
            return Hit(value)
        return f"the record at {where!r} is not this call's (its {_mismatch(value, wanted)})"


@dataclasses.dataclass(frozen=True, slots=True)
class Hit:
    """A lookup found the call: ``value`` is what it found."""

    value: Any


NOT_FOUND = "not found"
# Hit: found; NOT_FOUND: the server says the call is not there; any other string: why the
# answer cannot tell (Indeterminate, asked again later).
Verdict = Hit | str


def at_path(value: Any, path: tuple[str, ...]) -> Any:
    """The value at a dotted ``path`` (names index objects, digits lists); None if absent."""
    for part in path:
        if isinstance(value, Mapping):
            value = value.get(part)
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return None
    return value


def _walk(answer: Any, path: tuple[str, ...]) -> tuple[str, Any]:
    """``("value", v)`` for the value at ``path`` (None where the answer says null there,
    or where a list is too short for the index: no such item), or ``("shape", part)`` where
    the answer lacks the member ``part`` or is not a container where one is expected."""
    value = answer
    for depth, part in enumerate(path):
        if value is None and depth > 0:
            return "value", None  # a null on the way: nothing there
        if isinstance(value, Mapping):
            if part not in value:
                return "shape", ".".join(path[: depth + 1])
            value = value[part]
        elif isinstance(value, list) and part.isdigit():
            if int(part) >= len(value):
                return "value", None
            value = value[int(part)]
        else:
            return "shape", ".".join(path[: depth + 1])
    return "value", value


def _matches(record: Any, wanted: Mapping[tuple[str, ...], Any]) -> bool:
    return all(
        _present(record, path) and at_path(record, path) == value for path, value in wanted.items()
    )


def _present(record: Any, path: tuple[str, ...]) -> bool:
    # A null where the call's value is null is a match; a field that is missing is not.
    if not path:  # "." : the record itself
        return True
    parent = at_path(record, path[:-1])
    if isinstance(parent, Mapping):
        return path[-1] in parent
    return isinstance(parent, list) and path[-1].isdigit() and int(path[-1]) < len(parent)


def _mismatch(record: Any, wanted: Mapping[tuple[str, ...], Any]) -> str:
    for path, value in wanted.items():
        name = ".".join(path) or "value"
        if not _present(record, path):
            return f"{name} is missing, this call's is {_short(value)}"
        if at_path(record, path) != value:
            return f"{name} is {_short(at_path(record, path))}, this call's {_short(value)}"
    return "fields differ"  # not reached: called only when a field differs


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _render(value: Any, key: str, call_arguments: Mapping[str, Any]) -> Any:
    if isinstance(value, dict):
        return {k: _render(v, key, call_arguments) for k, v in value.items()}
    if isinstance(value, list):
        return [_render(v, key, call_arguments) for v in value]
    if not isinstance(value, str):
        return value
    whole = PLACEHOLDER.fullmatch(value)
    if whole:
        return _lookup_value(whole.group(1), key, call_arguments)
    return PLACEHOLDER.sub(lambda m: str(_lookup_value(m.group(1), key, call_arguments)), value)


def _lookup_value(name: str, key: str, call_arguments: Mapping[str, Any]) -> Any:
    if name == "key":
        return key
    value: Any = call_arguments
    for part in name.split(".")[1:]:
        if isinstance(value, Mapping) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            raise InvalidInput(
                f"the lookup needs {{{name}}}, which this call's arguments do not have "
                f"({_shape(value, part)})",
                option="lookup",
            )
    return value


def _shape(value: Any, part: str) -> str:
    if isinstance(value, list):
        return f"the list there has {len(value)} items, no item {part}"
    if isinstance(value, Mapping):
        return f"no {part!r} there"
    return f"{type(value).__name__} there, not an object or a list"


def lookup_refusals(file: ProxyFile, listed: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Why each lookup of ``file`` may not be used with a server that lists ``listed`` (its
    tools by name, as ``tools/list`` gives them); empty when every lookup may.

    A lookup is called unjournaled during recovery: were it a tool that changes something,
    recovery would apply it unrecorded (a ``write_file`` as the lookup of ``edit_file``
    clobbers the file, and the lost edit is reported found). So its tool must be marked
    read-only, by the tools file (``read_only = true``) or by the server
    (``readOnlyHint: true``), and the server must list it.
    """
    refusals = []
    for name, policy in sorted(file.tools.items()):
        lookup = policy.lookup
        if lookup is None:
            continue
        configured = file.tools.get(lookup.tool)
        if configured is not None and not configured.journaled:
            if lookup.tool not in listed:
                refusals.append(
                    f"the lookup of {name!r} is {lookup.tool!r}, which the server does not "
                    "list: name a read tool the server has (intentlog mcp --list-tools)"
                )
            continue
        definition = listed.get(lookup.tool)
        if definition is None:
            refusals.append(
                f"the lookup of {name!r} is {lookup.tool!r}, which the server does not list: "
                "name a read tool the server has (intentlog mcp --list-tools)"
            )
            continue
        hints = definition.get("annotations")
        if not (isinstance(hints, Mapping) and hints.get("readOnlyHint") is True):
            refusals.append(
                f"the lookup of {name!r} is {lookup.tool!r}, which the server does not mark "
                "read-only (readOnlyHint): a lookup is called unjournaled during recovery, so "
                f"it must only read. Name a read-only tool, or, if {lookup.tool!r} truly only "
                f"reads, say so in the tools file: [tools.{lookup.tool}] read_only = true"
            )
    return refusals


def key_refusals(file: ProxyFile, listed: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Why each ``key_argument`` of ``file`` may not be used with a server that lists
    ``listed``; empty when every one may.

    The proxy writes the key into that argument, and a resend after a crash is safe only
    because the server deduplicates on it. An argument the tool does not take (a typo:
    ``idempotencyKey`` for ``idempotency_key``) is dropped by most servers without a word,
    so nothing deduplicates and the resend applies the call twice. A tool whose input
    schema lists its arguments must list this one; a tool the server does not list, or
    whose schema lists none, cannot be checked here.
    """
    refusals = []
    for name, policy in sorted(file.tools.items()):
        argument = policy.key_argument
        definition = listed.get(name)
        if argument is None or definition is None:
            continue
        schema = definition.get("inputSchema")
        properties = schema.get("properties") if isinstance(schema, Mapping) else None
        if not isinstance(properties, Mapping) or argument in properties:
            continue
        takes = ", ".join(sorted(str(p) for p in properties)) or "none"
        refusals.append(
            f"[tools.{name}] key_argument = {argument!r}, but the server's {name!r} takes no "
            f"such argument (it takes: {takes}): the key would never reach the server, so "
            "nothing would deduplicate a resend. Name the argument that carries its "
            "idempotency key"
        )
    return refusals
