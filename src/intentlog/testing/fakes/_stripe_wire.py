"""Stripe's wire formats the fake reads: form-encoded parameters and search queries."""

from __future__ import annotations

import urllib.parse
from typing import Any

__all__ = ["parse_form", "parse_search"]


def parse_form(body: str) -> dict[str, Any]:
    """Stripe's form encoding into nested values: ``metadata[k]=v`` -> ``{"metadata": {"k":
    "v"}}``, ``a[b][c]=v``, ``expand[]=x`` -> ``{"expand": ["x"]}``, ``items[0][price]=p`` ->
    ``{"items": [{"price": "p"}]}``. Raises ValueError for a name that nests inconsistently.

    Source: https://docs.stripe.com/api (read 2026-12-04): "accepts form-encoded request
    bodies"; the bracket nesting is what Stripe's own libraries send (stripe-python
    ``_api_requestor`` encodes dicts as ``k[sub]``, lists as ``k[0]`` and ``expand[]``).
    """
    root: dict[str, Any] = {}
    for name, value in urllib.parse.parse_qsl(body, keep_blank_values=True):
        head, bracket, rest = name.partition("[")
        path = [head]
        if bracket:
            if not rest.endswith("]"):
                path = [name]  # not a nesting: an (unknown) flat name
            else:
                path += rest[:-1].split("][")
        node = root
        for depth, seg in enumerate(path):
            last = depth == len(path) - 1
            if seg == "" and depth > 0:  # "x[]": append
                seg = str(len(node))
            if last:
                if seg in node:
                    raise ValueError(f"{name} is given twice or nests inconsistently")
                node[seg] = value
            else:
                child = node.setdefault(seg, {})
                if not isinstance(child, dict):
                    raise ValueError(f"{name} nests under a value that is not an object")
                node = child
    return {key: _listify(key, value) for key, value in root.items()}


def _listify(name: str, value: Any) -> Any:
    # A hash whose keys are all indexes is an array (items[0][price]); metadata is always a hash,
    # whatever its keys look like.
    if not isinstance(value, dict):
        return value
    inner = {k: (v if name == "metadata" else _listify(k, v)) for k, v in value.items()}
    if name != "metadata" and inner and all(k.isdigit() for k in inner):
        return [inner[k] for k in sorted(inner, key=int)]
    return inner


def parse_search(query: str) -> list[tuple[str, str]]:
    """The ``metadata['key']:'value'`` clauses of a Stripe search query, joined by spaces or
    ``AND``; ValueError for anything else (other fields, ``OR``, negation, bad quoting).

    Source: https://docs.stripe.com/search (read 2026-12-04), "Search query language": a clause
    is a field, an operator and a value; ``metadata["key"]:"value"`` matches metadata;
    clauses combine with a space or AND (AND and OR are mutually exclusive); strings are quoted
    with single or double quotes, and a quote inside is escaped with a backslash. The fake
    understands only metadata clauses: any other field is refused as unsupported.
    """
    clauses: list[tuple[str, str]] = []
    pos, end = 0, len(query)
    while True:
        while pos < end and query[pos] == " ":
            pos += 1
        if pos == end:
            break
        if clauses and query[pos : pos + 4].upper() == "AND ":
            pos += 4
            continue
        if not query.startswith("metadata[", pos):
            raise ValueError(f"only metadata['key']:'value' clauses are supported, at {pos}")
        key, pos = _quoted(query, pos + len("metadata["))
        if not query.startswith("]:", pos):
            raise ValueError(f"expected ']:' at {pos}")
        value, pos = _quoted(query, pos + 2)
        clauses.append((key, value))
    if not clauses:
        raise ValueError("the query is empty")
    return clauses


def _quoted(text: str, pos: int) -> tuple[str, int]:
    if pos >= len(text) or text[pos] not in "'\"":
        raise ValueError(f"expected a quoted string at {pos}")
    quote, out, pos = text[pos], [], pos + 1
    while pos < len(text):
        char = text[pos]
        if char == "\\" and pos + 1 < len(text):
            out.append(text[pos + 1])
            pos += 2
        elif char == quote:
            return "".join(out), pos + 1
        else:
            out.append(char)
            pos += 1
    raise ValueError("unterminated quoted string")
