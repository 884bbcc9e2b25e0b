"""Request bodies as a service takes them: canonical JSON or a canonical form, with the
operation key written where the service's search finds it.

Both encodings are canonical: members sorted at every level, so the same call sends the same
bytes after a restart, whatever the order of its arguments. A service that fingerprints the
raw body (Stripe compares a retry's parameters with the first request's) then sees a retry,
not another request under the same key. Everything here runs before anything is sent, and
everything it refuses raises :class:`_Unsendable`, which the HTTP effect turns into
:class:`intentlog.Rejected`: nothing was sent, so "not applied" is the truth.
"""

from __future__ import annotations

import json
import math
import re
import urllib.parse
from collections.abc import Callable
from typing import Any

from intentlog._keys import canonical_json
from intentlog._service import BodyPath, Encoding, MarkerPlace

__all__ = [
    "FORM",
    "JSON",
    "Unsendable",
    "encode",
    "form",
    "graphql_directive",
    "value_at",
    "with_pinned",
    "with_reference",
]

_Place = Callable[[bool, Any, str], Any]  # (a value is there, the value, where) -> new value

JSON = "application/json"
FORM = "application/x-www-form-urlencoded"


class Unsendable(Exception):
    """The body cannot be sent as the service takes it; the message says why (no value of
    the body is in it, only names and types)."""


def encode(body: Any, encoding: Encoding, *, what: str) -> tuple[bytes, str]:
    """``body`` as the bytes to send and their Content-Type.

    ``"json"``: canonical JSON (sorted keys, no spaces; InvalidInput naming ``what`` for a
    value that is not JSON data). ``"form"``: see :func:`form`.
    """
    text = canonical_json(body, what=what)  # also proves the body is JSON data
    if encoding == "json":
        return text.encode(), JSON
    return form(body).encode("ascii"), FORM


def form(body: Any) -> str:
    """``body`` (a JSON object) as ``application/x-www-form-urlencoded``, nested as Stripe's
    official library (stripe-python ``_api_encode``) writes it, with members sorted at every
    level:

    - an object's members as ``name[member]`` (``metadata[order]=42``, ``a[b][c]=1``);
    - an array's items as ``name[index]`` (``expand[0]=customer``), objects in arrays as
      ``items[0][price]=p_1``;
    - ``true``/``false`` for booleans, a number as its JSON text, a string as itself;
    - None is left out, and so is an empty object or array (both as stripe-python does:
      there is nothing to write for them; send ``""`` to clear a value where the API
      allows it).

    Raises Unsendable for what the form has no spelling for: a body that is not an object,
    an array directly inside an array, a member name with ``[`` or ``]`` in it (it would
    read as nesting), a number that is not finite.
    """
    if not isinstance(body, dict):
        raise Unsendable(
            f"a form-encoded body must be a JSON object of named fields, not {_kind(body)}"
        )
    pairs: list[tuple[str, str]] = []
    for name in sorted(body):
        _pairs(_member(name, ""), body[name], pairs)
    return urllib.parse.urlencode(pairs)


def _pairs(name: str, value: Any, out: list[tuple[str, str]]) -> None:
    if value is None:
        return
    if isinstance(value, bool):  # before int: a bool is an int in Python
        out.append((name, "true" if value else "false"))
    elif isinstance(value, int | float):
        if isinstance(value, float) and not math.isfinite(value):
            raise Unsendable(f"{name} is {value!r}, which a form cannot carry")
        out.append((name, json.dumps(value)))
    elif isinstance(value, str):
        out.append((name, value))
    elif isinstance(value, dict):
        for member in sorted(value):
            _pairs(_member(member, name), value[member], out)
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            if isinstance(item, list | tuple):
                raise Unsendable(
                    f"{name}[{index}] is an array inside an array, which a form has no "
                    "spelling for (Stripe's API takes none)"
                )
            _pairs(f"{name}[{index}]", item, out)
    else:  # canonical_json has refused anything else already; kept for direct callers
        raise Unsendable(f"{name} is {_kind(value)}, which a form cannot carry")


def _member(member: Any, parent: str) -> str:
    if not isinstance(member, str) or "[" in member or "]" in member:
        where = f" in {parent}" if parent else ""
        raise Unsendable(
            f"the member name {member!r}{where} cannot be form-encoded: names with [ or ] "
            "would read as nesting"
        )
    return f"{parent}[{member}]" if parent else member


def graphql_directive(query: str, directive: str) -> str:
    """``query`` (a GraphQL document) with ``directive`` on the first field of its mutation,
    after that field's arguments, where Shopify takes ``@idempotent(key: "...")``
    (``mutation { refundCreate(input: $i) @idempotent(key: "k") { ... } }``).

    Strings, block strings and comments are skipped, so nothing inside them is mistaken for
    syntax. Raises Unsendable for a document without a mutation, or whose mutation already
    carries a directive of that name (the key is written there: leave it out of the call).
    """
    name = directive.split("(")[0]
    spots: list[tuple[int, str]] = []  # (position, character) of the syntax outside strings
    i, n = 0, len(query)
    while i < n:
        if query.startswith('"""', i):
            end = query.find('"""', i + 3)
            i = n if end < 0 else end + 3
        elif query[i] == '"':
            i += 1
            while i < n and query[i] != '"':
                i += 2 if query[i] == "\\" else 1
            i += 1
        elif query[i] == "#":
            end = query.find("\n", i)
            i = n if end < 0 else end
        else:
            spots.append((i, query[i]))
            i += 1
    code = "".join(c for _, c in spots)
    if f"{name}(" in code.replace(" ", "") or f"{name} " in code:
        raise Unsendable(f"the query already holds a {name} directive, where the key is "
                         "written; leave it out of the call")  # fmt: skip
    found = re.search(r"(?:^|[\s}])mutation\b[^{]*\{\s*(?:\w+\s*:\s*)?\w+\s*", code)
    if found is None:
        raise Unsendable(f"the query must hold a mutation for the {name} directive")
    at = found.end()
    if at < len(code) and code[at] == "(":  # the field's arguments: the directive follows
        depth = 0
        for close in range(at, len(code)):
            depth += {"(": 1, ")": -1}.get(code[close], 0)
            if depth == 0:
                break
        at = close + 1
    where = spots[at][0] if at < len(spots) else n
    return f"{query[:where].rstrip()} {directive} {query[where:].lstrip()}"


def with_reference(
    body: Any, path: BodyPath, key: str, marker: str | None = None, at: MarkerPlace = "end"
) -> Any:
    """``body`` with ``key`` at ``path`` (member names and array indexes), for the service's
    search to find; the caller's value is not changed (the path is copied on write).

    Missing objects along the path are created (``metadata`` need not be given); a missing
    array item is not (what else it would need is not ours to invent). A value already at
    the path must be the key itself; anything else raises Unsendable, since the search
    would then find another operation's record, or none.

    With a ``marker`` (a text template with ``{key}``), the text at the path keeps what the
    caller wrote and gets the marker as its last paragraph (the marker alone where there
    was none); a text that already ends with it is left as it is, so a body made again is
    the same. A value there that is not text raises Unsendable.
    """
    if not isinstance(body, dict):
        raise Unsendable(
            f"the key is written into the body at {_spelled(path)}, so the body must be a JSON "
            f"object, not {_kind(body)}"
        )

    def place(there: bool, value: Any, where: str) -> Any:
        if marker is None:
            if there and value != key:
                raise Unsendable(
                    f"the body already holds another value at {where}, where the key is "
                    "written for the service's search; leave it out of the call"
                )
            return key
        if at == "graphql-directive":
            if not there or not isinstance(value, str):
                raise Unsendable(f"{where} must be the GraphQL document that takes the key")
            return graphql_directive(value, marker.replace("{key}", json.dumps(key)[1:-1]))
        text = marker.replace("{key}", key)
        if not there or value is None or value == "":
            return text
        if not isinstance(value, str):
            raise Unsendable(f"{where} must be text to carry the key's marker, "
                             f"not {_kind(value)}")  # fmt: skip
        return value if value.endswith(text) else f"{value}\n\n{text}"

    return _put(body, path, 0, place)


def with_pinned(body: Any, pinned: tuple[tuple[BodyPath, str], ...]) -> Any:
    """``body`` with each pinned value at its path (written where the body has none, objects
    created along the way); a body holding another value there raises Unsendable, since the
    lookup would then look in the wrong place."""
    for path, pin in pinned:
        if not isinstance(body, dict):
            raise Unsendable(f"the body must be a JSON object to hold {_spelled(path)}, "
                             f"not {_kind(body)}")  # fmt: skip

        def place(there: bool, value: Any, where: str, pin: str = pin) -> Any:
            if there and value != pin:
                raise Unsendable(f"{where} must be {pin!r}, where the service's lookup "
                                 "finds the call; leave it out of the call")  # fmt: skip
            return pin

        body = _put(body, path, 0, place)
    return body


def _put(container: Any, path: BodyPath, depth: int, place: _Place) -> Any:
    step = path[depth]
    last = depth == len(path) - 1
    where = _spelled(path[: depth + 1])
    if isinstance(step, str):
        if not isinstance(container, dict):
            raise Unsendable(f"{_spelled(path[:depth])} must be an object to hold {where}, "
                             f"not {_kind(container)}")  # fmt: skip
        copy = dict(container)
        if last:
            copy[step] = place(step in copy, copy.get(step), where)
        else:
            copy[step] = _put(copy.get(step, {}), path, depth + 1, place)
        return copy
    if not isinstance(container, list) or step >= len(container):
        raise Unsendable(f"the body has no item {where} to hold the key "
                         f"(found {_kind(container)})")  # fmt: skip
    items = list(container)
    if last:
        items[step] = place(True, items[step], where)
    else:
        items[step] = _put(items[step], path, depth + 1, place)
    return items


def value_at(data: Any, path: BodyPath) -> tuple[bool, Any]:
    """(True, the value) at ``path`` in parsed JSON, or (False, None) where there is none."""
    for step in path:
        member = isinstance(step, str) and isinstance(data, dict) and step in data
        item = isinstance(step, int) and isinstance(data, list) and step < len(data)
        if not (member or item):
            return False, None
        data = data[step]
    return True, data


def _spelled(path: BodyPath) -> str:
    """A path as a person reads it: ``metadata.intentlog_key``, ``purchase_units[0]``."""
    text = ""
    for step in path:
        text += f"[{step}]" if isinstance(step, int) else (f".{step}" if text else step)
    return text or "the body"


def _kind(value: Any) -> str:
    if isinstance(value, list | tuple):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    if value is None:
        return "null"
    return type(value).__name__
