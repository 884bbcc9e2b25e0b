"""Which tool calls the proxy journals, and what each tool's server promises.

A :class:`ToolPolicy` comes from the tool's entry in ``tools.toml`` when it has one, else
from the safe default, which one annotation can change. Annotations are hints a server gives
about itself (https://modelcontextprotocol.io/specification/2025-11-25/server/tools#tool-annotations
says clients must treat them as untrusted), so none of them ever makes the proxy send a call
again:

- ``readOnlyHint: true``: the call passes through, never journaled (a read answered from a
  journal would be stale; the proxy itself never sends a read twice);
- anything else, ``idempotentHint: true`` included: journaled as a side effect that can
  neither deduplicate nor be asked, so a call caught in flight by a crash ends UNRESOLVED,
  never resent. Only the tools file can say a tool may be resent (``idempotent``,
  ``key_argument``, ``key_meta``, ``profile``) or looked up.

This module reads files and values only; it imports nothing of the MCP SDK.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

from intentlog import profiles
from intentlog._effect_options import EffectOptions, Spelling, effect_contract, unstated_retention
from intentlog._errors import InvalidInput
from intentlog._service import FOREVER, PROCESS, Retention, Service
from intentlog._validate import parse_toml, read_config
from intentlog.proxy._lookups import PLACEHOLDER as _PLACEHOLDER
from intentlog.proxy._lookups import Lookup, key_refusals, lookup_refusals

__all__ = [
    "Lookup",
    "ProxyFile",
    "ToolPolicy",
    "default_policy",
    "key_refusals",
    "load_tools",
    "lookup_refusals",
    "parse_tools",
]

OnError = Literal["failed", "unknown"]
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}
_TOOL_FIELDS = frozenset(
    {
        "read_only",
        "idempotent",
        "key_argument",
        "key_meta",
        "deduplicates",
        "key_retention",
        "locks_in_flight",
        "timeout",
        "lookup_lag",
        "profile",
        "on_error",
        "lookup",
        "lazy_receipt",
    }
)
_LOOKUP_FIELDS = frozenset({"tool", "arguments", "found", "match", "not_found_error"})
_PROXY_FIELDS = frozenset({"namespace", "timeout", "keep_arguments"})
# A ``_meta`` key as MCP defines one: an optional prefix of dot-separated labels and a slash,
# then a name that begins and ends with a letter or digit.
# https://modelcontextprotocol.io/specification/2025-11-25/basic/index#meta
_LABEL = r"[A-Za-z](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_META_KEY = re.compile(
    rf"(?:((?:{_LABEL}\.)*{_LABEL})/)?[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
)
#: The one name of intentlog's own prefix that key_meta may write: it means the operation
#: key (to a server journaled with intentlog's durable_tool too); the others name other things.
_OWN_KEY_META = "intentlog/key"
DEFAULT_TIMEOUT = 30.0
# The tools file's words for the effect options, so that a refusal shows the fix as the file
# writes it. The file's "idempotent" is MCP's idempotentHint (resent as it is); the effect's
# idempotent (the server deduplicates on a key) is the file's "deduplicates".
_TOML = Spelling(
    names={"idempotent": "deduplicates", "service": "profile"},
    assign="{name} = {value}",
    true="true",
    false="false",
    forever='"forever"',
    process='"process"',
    durations='seconds, or a duration such as "24h"',
    profile='profile = "NAME"',
    profile_name=str.lower,
    override="give them there or without the profile, not both",
)
# The fields an error about an option points at, the first one the tool's entry has.
_FIELDS_OF: dict[str, tuple[str, ...]] = {
    "idempotent": ("deduplicates", "key_argument", "key_meta", "idempotent"),
    "key_retention": ("key_retention", "retention", "key_argument", "key_meta", "deduplicates"),
    "locks_in_flight": ("locks_in_flight",),
    "timeout": ("timeout",),
    "lookup_lag": ("lookup_lag",),
    "service": ("profile",),
}


@dataclasses.dataclass(frozen=True, slots=True)
class ToolPolicy:
    """How the proxy treats calls of one tool (see the module's docstring)."""

    tool: str
    journaled: bool
    why: str
    key_argument: str | None = None
    #: The ``_meta`` entry the proxy writes the operation key into (besides or instead of
    #: ``key_argument``), for servers that read an idempotency key there.
    key_meta: str | None = None
    deduplicates: bool = False
    # Seconds the server keeps a key. None: forever, only ever from a stated "forever" (the
    # file's or its profile's) or a tool resent as it is; an unstated one is refused at load.
    retention: float | None = None
    locks_in_flight: bool = False
    timeout: float = DEFAULT_TIMEOUT
    lookup_lag: float | None = None  # None: unknown, taken as the timeout
    lookup: Lookup | None = None
    on_error: OnError = "failed"
    lazy_receipt: bool = False

    def describe(self) -> str:
        """One line: what a crash in flight leads to for this tool."""
        if not self.journaled:
            return f"{self.tool}: passes through ({self.why})"
        can = []
        places = [repr(self.key_argument)] if self.key_argument is not None else []
        if self.key_meta is not None:
            places.append(f"_meta[{self.key_meta!r}]")
        if self.deduplicates and not places:
            can.append("resent as it is (a second call has the effect of one)")
        elif self.deduplicates:
            kept = "forever" if self.retention is None else f"{self.retention:g} s"
            can.append(f"resent with its key in {' and '.join(places)} (kept {kept})")
        if self.lookup is not None:
            can.append(f"looked up with {self.lookup.tool!r}")
        after = " or ".join(can) if can else "UNRESOLVED for a person"
        return f"{self.tool}: journaled ({self.why}); in flight at a crash: {after}"


@dataclasses.dataclass(frozen=True, slots=True)
class ProxyFile:
    """What ``tools.toml`` says: per-tool policies and proxy-wide settings."""

    tools: Mapping[str, ToolPolicy]
    namespace: str | None = None
    timeout: float = DEFAULT_TIMEOUT
    #: Keep each journaled call's arguments (bounded, secrets redacted) for `show`.
    keep_arguments: bool = True


def default_policy(tool: str, annotations: Any, *, timeout: float = DEFAULT_TIMEOUT) -> ToolPolicy:
    """The policy of a tool that ``tools.toml`` does not name, from its annotations."""
    hints = annotations if isinstance(annotations, dict) else {}
    if hints.get("readOnlyHint") is True:
        return ToolPolicy(tool, journaled=False, why="annotated readOnlyHint")
    if hints.get("idempotentHint") is True:
        # A server's word alone never makes a resend safe: were the hint wrong, the proxy
        # itself would apply the call twice. The tools file says idempotent = true.
        why = "annotated idempotentHint, which alone never makes a resend safe"
        return ToolPolicy(tool, journaled=True, why=why, timeout=timeout)
    return ToolPolicy(tool, journaled=True, why="no annotation says otherwise", timeout=timeout)


def load_tools(path: str | Path) -> ProxyFile:
    """Read ``tools.toml``; InvalidInput names the file, the line and what was wrong."""
    return parse_tools(*read_config(path, "the tools file"))


def parse_tools(text: str, name: str = "tools.toml") -> ProxyFile:
    """Parse the text of a tools file (see :func:`load_tools`)."""
    data = parse_toml(text, name)
    where = _Locator(text, name, data)
    unknown = set(data) - {"proxy", "tools"}
    if unknown:
        top = sorted(unknown)[0]
        raise InvalidInput(
            f"{where.table(top)}: unknown table or key {top!r} (use [proxy], [tools.NAME])"
        )
    proxy = _table(data.get("proxy", {}), where.table("proxy"), "[proxy]")
    _no_unknown(proxy, _PROXY_FIELDS, where, "proxy")
    namespace = proxy.get("namespace")
    if namespace is not None and (
        not isinstance(namespace, str) or not re.fullmatch(r"[A-Za-z0-9_-]{1,40}", namespace)
    ):
        raise InvalidInput(
            f"{where.key('proxy', 'namespace')}: namespace must be 1-40 letters, digits, "
            f"'_' or '-', got {namespace!r}"
        )
    timeout = _duration(
        proxy.get("timeout", DEFAULT_TIMEOUT), where.key("proxy", "timeout"), "timeout"
    )
    tools = _table(data.get("tools", {}), where.table("tools"), "[tools]")
    policies = {tool: _tool(tool, entry, where, timeout) for tool, entry in tools.items()}
    keep = proxy.get("keep_arguments", True)
    if not isinstance(keep, bool):
        raise InvalidInput(
            f"{where.key('proxy', 'keep_arguments')}: keep_arguments must be true or false, "
            f"got {keep!r}"
        )
    return ProxyFile(policies, namespace, timeout if timeout is not None else DEFAULT_TIMEOUT, keep)


def _tool(tool: str, entry: Any, where: _Locator, timeout: float | None) -> ToolPolicy:
    table = f"tools.{tool}"
    fields = _table(entry, where.table(table), f"[{table}]")
    _no_unknown(fields, _TOOL_FIELDS, where, table)

    def at(field: str) -> str:
        return where.key(table, field)

    def flag(field: str, default: bool) -> bool:
        value = fields.get(field, default)
        if type(value) is not bool:
            raise InvalidInput(f"{at(field)}: {field} must be true or false, got {value!r}")
        return value

    if flag("read_only", False):
        others = sorted(set(fields) - {"read_only"})
        if others:
            raise InvalidInput(
                f"{at(others[0])}: a read_only tool passes through; {others[0]} does not apply"
            )
        return ToolPolicy(tool, journaled=False, why="read_only in the tools file")
    service = _profile(fields.get("profile"), at("profile")) if "profile" in fields else None
    key_argument = fields.get("key_argument")
    if key_argument is not None and (not isinstance(key_argument, str) or not key_argument):
        raise InvalidInput(
            f"{at('key_argument')}: key_argument must be an argument name, got {key_argument!r}"
        )
    key_meta = _key_meta(tool, fields["key_meta"], at("key_meta")) if "key_meta" in fields else None
    keyed = key_argument is not None or key_meta is not None  # the server is given the key
    # The file's idempotent is MCP's idempotentHint: the tool may be resent as it is (no key).
    resent_as_is = flag("idempotent", False) and not keyed
    options = _options(tool, fields, at, service, keyed, resent_as_is)
    try:
        contract = effect_contract(
            f"tool {tool!r}", options, service, caller="tools file",
            default_timeout=timeout or DEFAULT_TIMEOUT, spelling=_TOML,
        )  # fmt: skip
    except InvalidInput as exc:
        # The rule and its text are effect_contract's; the file adds where it was broken.
        option = getattr(exc, "option", None)
        near = [f for f in _FIELDS_OF.get(option or "", ()) if f in fields]
        place = at(near[0]) if near else where.table(table)
        raise InvalidInput(f"{place}: {exc}", tool=tool, option=option) from None
    deduplicates = contract.idempotent
    retention = contract.key_retention if isinstance(contract.key_retention, float) else None
    on_error = fields.get("on_error", "failed")
    if on_error not in ("failed", "unknown"):
        raise InvalidInput(
            f"{at('on_error')}: on_error must be 'failed' (an error result means not "
            f"applied) or 'unknown', got {on_error!r}"
        )
    lookup = _lookup(fields["lookup"], where, f"{table}.lookup") if "lookup" in fields else None
    if lookup is not None and lookup.tool == tool:
        raise InvalidInput(
            f"{where.key(table + '.lookup', 'tool')}: a tool cannot be its own lookup"
        )
    if lookup is not None and _journaled_in(where, lookup.tool):
        raise InvalidInput(
            f"{where.key(table + '.lookup', 'tool')}: the lookup of {tool!r} is "
            f"{lookup.tool!r}, which this file journals as a tool that changes something; a "
            "lookup is called unjournaled during recovery, so it must only read. Name a "
            f"read-only tool, or mark [tools.{lookup.tool}] read_only = true if it only reads",
            tool=tool,
            option="lookup",
        )
    lazy = flag("lazy_receipt", False)
    if lazy and not deduplicates and lookup is None:
        raise InvalidInput(
            f"{at('lazy_receipt')}: lazy_receipt needs a server that deduplicates or a lookup "
            "(a receipt lost in a crash is then recovered, never resent blindly)"
        )
    return ToolPolicy(
        tool,
        journaled=True,
        why="configured in the tools file",
        lazy_receipt=lazy,
        key_argument=key_argument,
        key_meta=key_meta,
        deduplicates=deduplicates,
        retention=retention,
        locks_in_flight=contract.locks_in_flight,
        timeout=contract.timeout,
        lookup_lag=contract.lookup_lag,
        lookup=lookup,
        on_error=on_error,
    )


def _options(
    tool: str, fields: Mapping[str, Any], at: Callable[[str], str], service: Service | None,
    keyed: bool, resent_as_is: bool,
) -> EffectOptions:  # fmt: skip
    """The tool's fields as the effect options (their rules are :func:`effect_contract`'s);
    what only the file has to say is checked here. ``keyed``: the proxy gives the server the
    operation key (``key_argument`` or ``key_meta``)."""
    options: EffectOptions = {}
    if "deduplicates" in fields:
        value = fields["deduplicates"]
        if type(value) is not bool:
            raise InvalidInput(f"{at('deduplicates')}: deduplicates must be true or false, got "
                               f"{value!r}")  # fmt: skip
        options["idempotent"] = value
    elif service is None:
        # A key_argument or key_meta says the server deduplicates on it (unless
        # deduplicates = false).
        options["idempotent"] = keyed or resent_as_is
    elif resent_as_is:
        raise InvalidInput(
            f"{at('profile')}: tool {tool!r} is resent as it is (idempotent = true, no "
            "key_argument), so a profile's promises about keys do not apply; drop one of them",
            tool=tool,
            option="service",
        )
    elif keyed and not service.deduplicates:
        # The key goes to the server, but the profile keeps it for no stated time.
        field = "key_argument" if "key_argument" in fields else "key_meta"
        raise _located(at(field), tool, unstated_retention(f"tool {tool!r}",
                                                           spelling=_TOML))  # fmt: skip
    if options.get("idempotent") and not keyed and not resent_as_is:
        raise InvalidInput(
            f"{at('deduplicates')}: a server deduplicates on a key it is given: set "
            "key_argument or key_meta (or idempotent = true for a tool that may be resent as "
            "it is)"
        )
    if "key_retention" in fields:
        options["key_retention"] = _retention(
            fields["key_retention"], at("key_retention"), "key_retention"
        )
    elif resent_as_is and options.get("idempotent"):
        # A second call has the effect of one: there is no key for the server to forget.
        options["key_retention"] = FOREVER
    if "locks_in_flight" in fields:
        value = fields["locks_in_flight"]
        if type(value) is not bool:
            raise InvalidInput(f"{at('locks_in_flight')}: locks_in_flight must be true or "
                               f"false, got {value!r}")  # fmt: skip
        options["locks_in_flight"] = value
    for name in ("timeout", "lookup_lag"):
        if name in fields:
            zero = name == "lookup_lag"
            options[name] = _duration(fields[name], at(name), name, allow_zero=zero)
    return options


def _key_meta(tool: str, value: Any, at: str) -> str:
    """``key_meta`` of ``tool``: a ``_meta`` key the proxy may write the operation key into,
    else InvalidInput naming the place in the file, the tool and the field.

    It must be a key as MCP spells one (a server's SDK may refuse or drop another), not one
    the protocol reserves (``progressToken``; a prefix with an ``mcp`` or
    ``modelcontextprotocol`` label), and of intentlog's own names only ``intentlog/key``,
    which means the operation key to a server journaled with ``durable_tool`` as well
    (``intentlog/task`` would name a task, not a key).
    """
    match = _META_KEY.fullmatch(value) if isinstance(value, str) else None
    where = f"{at}: key_meta of tool {tool!r}"
    if match is None:
        raise InvalidInput(
            f"{where} must be a _meta key as MCP spells one (letters, digits, '-', '_' and "
            "'.', beginning and ending with a letter or digit, after an optional prefix such "
            f'as "com.example/"), e.g. "idempotency-key"; got {value!r}',
            tool=tool,
            option="key_meta",
        )
    labels = {label.lower() for label in (match[1] or "").split(".")}
    if value == "progressToken" or labels & {"mcp", "modelcontextprotocol"}:
        raise InvalidInput(
            f"{where} is {value!r}, a _meta key the MCP protocol reserves for itself; name "
            'the field the server reads its idempotency key from, e.g. "idempotency-key"',
            tool=tool,
            option="key_meta",
        )
    if match[1] == "intentlog" and value != _OWN_KEY_META:
        raise InvalidInput(
            f"{where} is {value!r}, one of intentlog's own _meta keys, which means something "
            f"else; use {_OWN_KEY_META!r} (the operation key) or the server's own field",
            tool=tool,
            option="key_meta",
        )
    return match[0]  # the whole key (a full match): value, as a str


def _located(place: str, tool: str, error: InvalidInput) -> InvalidInput:
    return InvalidInput(f"{place}: {error}", tool=tool, option=getattr(error, "option", None))


def _lookup(entry: Any, where: _Locator, table: str) -> Lookup:
    fields = _table(entry, where.table(table), f"[{table}]")
    _no_unknown(fields, _LOOKUP_FIELDS, where, table)
    tool = fields.get("tool")
    if not isinstance(tool, str) or not tool:
        raise InvalidInput(
            f'{where.key(table, "tool")}: lookup needs tool = "<a read tool of the same server>"'
        )
    arguments = fields.get("arguments", {})
    if not isinstance(arguments, dict):
        raise InvalidInput(
            f"{where.key(table, 'arguments')}: arguments must be a table, got {arguments!r}"
        )
    for value in arguments.values():
        _check_template(value, where.key(table, "arguments"))
    path = _found_path(fields.get("found"), where.key(table, "found"))
    pattern = fields.get("not_found_error")
    compiled = None
    if pattern is not None:
        try:
            compiled = re.compile(pattern) if isinstance(pattern, str) else None
        except re.error as exc:
            raise InvalidInput(
                f"{where.key(table, 'not_found_error')}: not a regular expression: {exc}"
            ) from exc
        if compiled is None:
            raise InvalidInput(
                f"{where.key(table, 'not_found_error')}: must be a regular expression string"
            )
    match = _match_table(fields.get("match", {}), where.key(table, "match"))
    if not _names_the_call(arguments) and not _names_the_call(match):
        # Asked the same question for every call, the lookup would find an earlier call's
        # record and report this one applied when it was never sent.
        raise InvalidInput(
            f"{where.table(table)}: the lookup names nothing of the call, so it cannot tell "
            "this call from any other: use {key} or {arguments.NAME} in its arguments, or "
            'say which record is this call\'s with match = { FIELD = "{arguments.NAME}" }'
        )
    if not match and not _holds_key(arguments):
        # Asked by the call's own values (a name, a query), a server answers with records
        # like this call's (search_nodes("Ada") also answers "Adam"): only match can say
        # which one is this call's. Asked by the key, the server answers for the key.
        raise InvalidInput(
            f"{where.table(table)}: the lookup asks by the call's arguments, not by its "
            "{key}, so its answer may hold another call's record: say which record is this "
            'call\'s, e.g. match = { name = "{arguments.entities.0.name}" } (the fields of '
            "the record at found that must equal the call's values)"
        )
    return Lookup(tool, dict(arguments), path, compiled, match)


def _found_path(found: Any, at: str) -> tuple[str, ...]:
    """``found`` as a path; required, because without it any answer (an empty one too)
    would count as the call having landed."""
    path = tuple(part for part in found.split(".") if part) if isinstance(found, str) else ()
    if not path:
        raise InvalidInput(
            f'{at}: a lookup needs found = "<dotted path>": where in the lookup\'s result '
            'something is only when the call landed (e.g. "entities.0" or "refund.id"), '
            f"got {found!r}. Without it, any answer, an empty one too, would count as found"
        )
    return path


def _match_table(match: Any, at: str) -> dict[tuple[str, ...], Any]:
    if not isinstance(match, dict):
        raise InvalidInput(
            f'{at}: match must be a table of FIELD = "{{key}}" or "{{arguments.NAME}}", '
            f"got {match!r}"
        )
    table: dict[tuple[str, ...], Any] = {}
    for name, value in match.items():
        # "." is the record itself: a list of plain values (labels, names) is searched for
        # the call's value.
        path = () if name == "." else tuple(part for part in name.split(".") if part)
        if not path and name != ".":
            raise InvalidInput(
                f'{at}: {name!r} is not a dotted path into the found record (or "." for the '
                "record itself)"
            )
        _check_template(value, at)
        table[path] = value
    return table


def _holds_key(value: Any) -> bool:
    """Whether a template holds the ``{key}`` placeholder anywhere."""
    return any("{key}" in text for text in _strings(value))


def _names_the_call(value: Any) -> bool:
    """Whether a template holds a placeholder of the call ({key} or {arguments.NAME})."""
    return any(_PLACEHOLDER.search(text) is not None for text in _strings(value))


def _strings(value: Any) -> Iterator[str]:
    """Every string of a template (a value of the tools file), however deep in its tables
    and lists."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _journaled_in(where: _Locator, tool: str) -> bool:
    """Whether the file's own entry for ``tool`` journals it (is not ``read_only``)."""
    entry = where.data.get("tools", {}).get(tool) if isinstance(where.data, dict) else None
    return isinstance(entry, dict) and entry.get("read_only") is not True


def _check_template(value: Any, at: str) -> None:
    for text in _strings(value):
        for match in re.finditer(r"\{([^{}]*)\}", text):
            if not _PLACEHOLDER.fullmatch(match.group(0)):
                raise InvalidInput(
                    f"{at}: unknown placeholder {match.group(0)!r} "
                    "(use {key} or {arguments.NAME})"
                )


def _profile(name: Any, at: str) -> Service:
    found = getattr(profiles, name.upper(), None) if isinstance(name, str) else None
    if not isinstance(found, Service):
        known = sorted(
            n.lower() for n in dir(profiles) if isinstance(getattr(profiles, n), Service)
        )
        raise InvalidInput(f"{at}: unknown profile {name!r}; known: {', '.join(known)}")
    return found


def _retention(value: Any, at: str, field: str) -> float | Retention:
    """A retention field: a duration, ``"forever"`` or ``"process"`` (which the effect's
    rules refuse, naming it, as they refuse ``intentlog.PROCESS``)."""
    if value == "forever":
        return FOREVER
    if value == "process":
        return PROCESS
    seconds = _duration(value, at, field)
    assert seconds is not None
    return seconds


def _duration(value: Any, at: str, field: str, *, allow_zero: bool = False) -> float | None:
    """Seconds from a number or a string such as "500ms", "30s", "10m", "24h", "7d"."""
    if value is None:
        return None
    seconds: float | None = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str) and (match := _DURATION.match(value)):
        seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if (
        seconds is None
        or not math.isfinite(seconds)
        or seconds < 0
        or (seconds == 0 and not allow_zero)
    ):
        low = ">= 0" if allow_zero else "> 0"
        raise InvalidInput(
            f'{at}: {field} must be a duration {low} (seconds, or "30s", "10m", "24h", '
            f'"7d"), got {value!r}'
        )
    return seconds


def _table(value: Any, at: str, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidInput(f"{at}: {what} must be a table, got {value!r}")
    return value


def _no_unknown(
    fields: Mapping[str, Any], known: frozenset[str], where: _Locator, table: str
) -> None:
    unknown = sorted(set(fields) - known)
    if unknown:
        raise InvalidInput(
            f"{where.key(table, unknown[0])}: unknown setting {unknown[0]!r} in [{table}]; "
            f"known: {', '.join(sorted(known))}"
        )


class _Locator:
    """Finds the line of a table or a key in the file's text, for error messages (the TOML
    reader keeps no positions)."""

    def __init__(self, text: str, name: str, data: Any = None) -> None:
        self.lines = text.splitlines()
        self.name = name
        self.data = data  # the parsed file, for checks across its tables

    def _header(self, table: str) -> int | None:
        for number, line in enumerate(self.lines, 1):
            stripped = line.split("#", 1)[0].strip()
            if not stripped.startswith("["):
                continue
            name = stripped.strip("[]").replace(" ", "").replace('"', "").replace("'", "")
            if name == table:
                return number
        for number, line in enumerate(self.lines, 1):  # a table known by its subtables only
            stripped = line.split("#", 1)[0].strip().strip("[]").replace(" ", "")
            if stripped.replace('"', "").replace("'", "").startswith(table + "."):
                return number
        return None

    def table(self, table: str) -> str:
        number = self._header(table)
        return f"{self.name}:{number}" if number else self.name

    def key(self, table: str, key: str) -> str:
        start = self._header(table)
        pattern = re.compile(rf"^\s*(\"?){re.escape(key)}\1\s*=")
        for number in range((start or 0) + 1, len(self.lines) + 1):
            line = self.lines[number - 1]
            if start is not None and number > start and line.strip().startswith("["):
                break
            if pattern.match(line):
                return f"{self.name}:{number}"
        inline = re.compile(rf"\b{re.escape(key)}\s*=")
        for number, line in enumerate(self.lines, 1):  # an inline table, or a dotted key
            if inline.search(line) and table.split(".")[-1] in line:
                return f"{self.name}:{number}"
        return self.table(table)


def retention_for(policy: ToolPolicy) -> float | Retention | None:
    """The policy's retention as a :class:`intentlog.Service` takes it."""
    if not policy.deduplicates:
        return None
    return FOREVER if policy.retention is None else policy.retention
