"""The routes file: which path prefix goes to which upstream, and what that service promises.

A route is a path prefix and an upstream base URL (the prefix is replaced by the URL, the rest
of the path and the query are kept), with the service's contract: a profile of
:mod:`intentlog.profiles` (``profile = "stripe"``) or the keywords :func:`intentlog.integrations.
http.http_effect` takes (``idempotent``, ``key_retention``, ``key_header``, ``locks_in_flight``,
``lookup``, ``lookup_lag``, ``timeout``, ``not_applied``, ``in_progress``, ``key_reused``). A
route that states neither is a service that can neither deduplicate nor be asked: a request
caught in flight by a crash ends UNRESOLVED, never resent. ``passthrough = true`` forwards its
unsafe requests unjournaled (a webhook relay, an API whose writes do not matter).

Everything is checked when the file is read, before the gateway listens: an error names the
file, the line, the route and the field. This module reads files and values only.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
import urllib.parse
from pathlib import Path
from typing import Any

from intentlog._errors import InvalidInput
from intentlog._keys import _slug
from intentlog._service import Service
from intentlog.integrations.http import NOT_APPLIED, Lookup, _Contract, _contract
from intentlog.proxy._policy import _duration, _profile, _retention

__all__ = ["Route", "RouteFile", "load_routes", "parse_routes"]

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,40}$")
_FIELDS = frozenset(
    {
        "name",
        "prefix",
        "upstream",
        "profile",
        "passthrough",
        "idempotent",
        "key_retention",
        "key_header",
        "locks_in_flight",
        "lookup",
        "lookup_lag",
        "timeout",
        "not_applied",
        "in_progress",
        "key_reused",
    }
)
_OPTIONS = (
    "idempotent",
    "key_retention",
    "key_header",
    "locks_in_flight",
    "lookup_lag",
    "lookup",
    "not_applied",
    "in_progress",
    "key_reused",
)
#: Profiles of services that are not HTTP APIs.
_NOT_HTTP = frozenset({"smtp"})
#: Where a service takes the key that a forwarded HTTP request has a place for.
_HTTP_PLACES = ("header", "query", "body", "metadata")


@dataclasses.dataclass(frozen=True)
class Route:
    """One route: ``prefix`` goes to ``upstream``, with its service's contract.

    ``service`` is the profile (None for a route declared by keywords, whose ``options`` hold
    them); ``lookup`` is a by-key URL template (``{key}``), absolute; ``effect`` is the name
    its operations are journaled under (``gateway.<name>``), so a route renamed in the file is
    a different effect and its old operations are never answered for the new one.
    """

    name: str
    prefix: str
    upstream: str
    service: Service | None = None
    passthrough: bool = False
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    lookup: str | None = None
    not_applied: tuple[int, ...] = NOT_APPLIED
    in_progress: tuple[int, ...] = (409,)
    key_reused: tuple[int, ...] = (422,)
    key_header: str | None = None

    @property
    def effect(self) -> str:
        return f"gateway.{self.name}"

    def target(self, path: str, query: str) -> str:
        """The upstream URL for a request path under this route's prefix (and its query)."""
        rest = path[len(self.prefix) :]
        url = self.upstream.rstrip("/") + ("/" + rest.lstrip("/") if rest else "")
        return f"{url}?{query}" if query else url

    def contract(self, url: str, service: Service | None = None) -> _Contract:
        """The checked contract of a request to ``url`` (InvalidInput if it is not usable),
        with ``service`` in place of the route's profile where given (the plain service of a
        request its profile's search does not cover)."""
        options = {k: v for k, v in self.options.items() if k != "key_header"}
        return _contract(
            self.effect,
            url,
            service or self.service,
            replay=None,
            key_header=self.key_header,
            caller="the gateway route",
            **options,
        )

    def lookup_for(self) -> Lookup | None:
        return None if self.lookup is None else Lookup.by_key(self.lookup)

    @property
    def client_key_header(self) -> str:
        """The header a client's own idempotency key comes in: where the service takes its
        key when that is a header, else ``Idempotency-Key`` (what the IETF draft and most
        SDKs send)."""
        place = self.service.key if self.service is not None else None
        if place is not None and place.kind == "header":
            return place.name
        return self.key_header or "Idempotency-Key"


@dataclasses.dataclass(frozen=True)
class RouteFile:
    """The routes of one file, longest prefix first (the one a request matches)."""

    routes: tuple[Route, ...]

    def match(self, path: str) -> Route | None:
        """The route whose prefix is the longest one ``path`` starts with (at a segment
        boundary: ``/stripe`` matches ``/stripe/v1`` and ``/stripe``, not ``/stripes``)."""
        for route in self.routes:
            prefix = route.prefix.rstrip("/")
            if path == prefix or path.startswith(prefix + "/") or prefix == "":
                return route
        return None


def load_routes(path: str | Path) -> RouteFile:
    """Read a routes file; InvalidInput names the file, the line, the route and the field."""
    source = Path(path)
    try:
        text = source.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"{source}: cannot read the routes file: {exc}") from exc
    return parse_routes(text, str(source))


def parse_routes(text: str, name: str = "routes.toml") -> RouteFile:
    """Parse the text of a routes file (see :func:`load_routes`)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InvalidInput(f"{name}: not valid TOML: {exc}") from exc
    unknown = sorted(set(data) - {"route"})
    if unknown:
        raise InvalidInput(f"{name}: unknown table or key {unknown[0]!r} (use [[route]] entries)")
    entries = data.get("route")
    if not isinstance(entries, list) or not entries:
        raise InvalidInput(
            f"{name}: no routes; add at least one [[route]] with prefix and upstream"
        )
    lines = _entry_lines(text)
    routes: list[Route] = []
    for index, entry in enumerate(entries):
        line = lines[index] if index < len(lines) else None
        where = f"{name}:{line}" if line else name
        routes.append(_route(entry, f"{where}: route {index + 1}"))
    for what, values in (
        ("name", [r.name for r in routes]),
        ("prefix", [r.prefix.rstrip("/") or "/" for r in routes]),
    ):
        for later, value in enumerate(values):
            first = values.index(value)
            if first < later:
                line = lines[later] if later < len(lines) else None
                raise InvalidInput(
                    f"{name}:{line}: route {later + 1} ({routes[later].name!r}): two routes "
                    f"have the {what} {value!r} (route {first + 1}, {routes[first].name!r}, "
                    "too)"
                )
    return RouteFile(tuple(sorted(routes, key=lambda r: len(r.prefix.rstrip("/")), reverse=True)))


def _entry_lines(text: str) -> list[int]:
    """The line of each ``[[route]]`` header, in order (the TOML reader keeps no positions)."""
    return [
        number
        for number, line in enumerate(text.splitlines(), 1)
        if line.split("#", 1)[0].strip().replace(" ", "") == "[[route]]"
    ]


def _route(entry: Any, at: str) -> Route:
    if not isinstance(entry, dict):
        raise InvalidInput(f"{at}: a route must be a table, got {entry!r}")
    unknown = sorted(set(entry) - _FIELDS)
    if unknown:
        raise InvalidInput(
            f"{at}: unknown field {unknown[0]!r}; known: {', '.join(sorted(_FIELDS))}"
        )
    prefix = entry.get("prefix")
    if not isinstance(prefix, str) or not prefix.startswith("/") or "?" in prefix or "#" in prefix:
        raise InvalidInput(f"{at}: prefix must be a path starting with '/', got {prefix!r}")
    upstream = entry.get("upstream")
    parts = urllib.parse.urlsplit(upstream) if isinstance(upstream, str) else None
    if (
        not isinstance(upstream, str)
        or parts is None
        or parts.scheme not in ("http", "https")
        or not parts.netloc
    ):
        raise InvalidInput(f"{at}: upstream must be an http:// or https:// URL, got {upstream!r}")
    if parts.query or parts.fragment or parts.username or parts.password:
        raise InvalidInput(
            f"{at}: upstream must be a base URL without query, fragment or credentials "
            "(a client's credentials travel in its own headers, never in the routes file)"
        )
    name = entry.get("name", prefix.strip("/").replace("/", "-") or "root")
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidInput(
            f"{at}: name must be 1-40 letters, digits, '_' or '-', got {name!r}"
            + ("" if "name" in entry else " (taken from the prefix; give name = ...)")
        )
    at = f"{at} ({name!r})"
    passthrough = entry.get("passthrough", False)
    if not isinstance(passthrough, bool):
        raise InvalidInput(f"{at}: passthrough must be true or false, got {passthrough!r}")
    given = [k for k in (*_OPTIONS, "profile", "timeout") if k in entry]
    if passthrough:
        if given:
            raise InvalidInput(
                f"{at}: field {given[0]!r} means nothing on a passthrough route (its requests "
                "are not journaled)"
            )
        return Route(name, prefix, upstream.rstrip("/"), passthrough=True)
    service = None
    if "profile" in entry:
        service = _profile(entry["profile"], f"{at}, field 'profile'")
        stated = [k for k in _OPTIONS if k in entry]
        if stated:
            raise InvalidInput(
                f"{at}: field {stated[0]!r} is the profile's to state; with profile give "
                "timeout only (or leave profile out and state every option)"
            )
        place = service.key
        if service.name in _NOT_HTTP:
            raise InvalidInput(
                f"{at}, field 'profile': {entry['profile']!r} is not an HTTP service"
            )
        if place is not None and place.kind not in _HTTP_PLACES:
            raise InvalidInput(
                f"{at}: profile {entry['profile']!r} takes the key as {place.kind}, which a "
                "forwarded HTTP request has no place for"
            )
        if place is not None and place.kind == "metadata" and service.reference is None:
            raise InvalidInput(f"{at}: profile {entry['profile']!r} has no place for the key")
    options: dict[str, Any] = {}
    for field in ("idempotent", "locks_in_flight"):
        if field in entry:
            if not isinstance(entry[field], bool):
                raise InvalidInput(f"{at}, field {field!r}: must be true or false")
            options[field] = entry[field]
    if entry.get("idempotent") is True and "key_retention" not in entry:
        raise InvalidInput(
            f"{at}, field 'key_retention': idempotent = true needs how long the service keeps "
            'a key (key_retention = "24h", "7d", or "forever"): a resend after it forgot the '
            "key applies twice"
        )
    if "key_retention" in entry:
        options["key_retention"] = _retention(
            entry["key_retention"], f"{at}, field 'key_retention'", "key_retention"
        )
    for field in ("timeout", "lookup_lag"):
        if field in entry:
            options[field] = _duration(
                entry[field], f"{at}, field {field!r}", field, allow_zero=field == "lookup_lag"
            )
    key_header = entry.get("key_header")
    if key_header is not None and not isinstance(key_header, str):
        raise InvalidInput(f"{at}, field 'key_header': must be a header name, got {key_header!r}")
    lookup = entry.get("lookup")
    if lookup is not None:
        if not isinstance(lookup, str) or "{key}" not in lookup:
            raise InvalidInput(
                f"{at}, field 'lookup': must be a URL or a path with {{key}} (GET it: 200 is "
                f"found, 404 not), got {lookup!r}"
            )
        if lookup.startswith("/"):
            lookup = upstream.rstrip("/") + lookup
        elif not lookup.startswith(("http://", "https://")):
            raise InvalidInput(f"{at}, field 'lookup': must start with '/' or http(s)://")
        there = urllib.parse.urlsplit(lookup)
        if (there.scheme, there.netloc) != (parts.scheme, parts.netloc):
            # The lookup is sent with the client's own credentials: only to the upstream.
            raise InvalidInput(
                f"{at}, field 'lookup': must be on the upstream's origin "
                f"({parts.scheme}://{parts.netloc}), since it carries the client's credentials"
            )
    if service is None and options.get("idempotent") is not True:
        # A service that takes no key cannot say a key is in flight or reused: its 409
        # (a conflict), 422 (validation) and 429 (rate limit) refuse the request.
        neither = (*NOT_APPLIED, 409, 422, 429)
        defaults = {"not_applied": neither, "in_progress": (), "key_reused": ()}
    else:
        defaults = {"not_applied": (*NOT_APPLIED, 429), "in_progress": (409,), "key_reused": (422,)}
    statuses = {
        f: _statuses(entry[f], f"{at}, field {f!r}")
        for f in ("not_applied", "in_progress", "key_reused")
        if f in entry
    }
    route = Route(
        name,
        prefix,
        upstream.rstrip("/"),
        service,
        False,
        options,
        lookup,
        statuses.get("not_applied", defaults["not_applied"]),
        statuses.get("in_progress", defaults["in_progress"]),
        statuses.get("key_reused", defaults["key_reused"]),
        key_header,
    )
    limit = service.key_max_length if service is not None else None
    longest = len(f"{_slug(route.effect)}-{'0' * 32}.99")  # a key with an attempt's suffix
    if limit is not None and longest > limit:
        raise InvalidInput(
            f"{at}, field 'name': the service takes keys of at most {limit} characters and "
            f"this route's would take {longest}; give the route a shorter name"
        )
    try:
        route.contract(route.upstream)
    except InvalidInput as exc:
        field = f", field {exc.option!r}" if getattr(exc, "option", None) else ""
        raise InvalidInput(f"{at}{field}: {exc}") from None
    return route


def _statuses(value: Any, at: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(type(s) is int and 400 <= s < 500 for s in value):
        raise InvalidInput(f"{at}: must be a list of 4xx status codes, got {value!r}")
    return tuple(value)
