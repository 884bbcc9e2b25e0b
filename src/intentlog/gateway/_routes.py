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
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from intentlog._errors import InvalidInput
from intentlog._keys import _slug
from intentlog._service import Service
from intentlog._validate import parse_toml, read_config
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
    return parse_routes(*read_config(path, "the routes file"))


def parse_routes(text: str, name: str = "routes.toml") -> RouteFile:
    """Parse the text of a routes file (see :func:`load_routes`)."""
    data = parse_toml(text, name)
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
    """One ``[[route]]`` entry as a Route, its fields checked in the order of the tables below
    (``at`` is where the file has it: messages start with it)."""
    if not isinstance(entry, dict):
        raise InvalidInput(f"{at}: a route must be a table, got {entry!r}")
    made: dict[str, Any] = {}
    for check in _WHERE:
        check(entry, made, at)
    at = f"{at} ({made['name']!r})"  # from here on, messages name the route too
    _passthrough(entry, made, at)
    if made["passthrough"]:
        return Route(**made)
    made.update(service=None, options={})
    for check in _CONTRACT:
        check(entry, made, at)
    return Route(**made)


# -- a route's checks --------------------------------------------------------------------------
#
# A check reads the entry as the file gives it and writes what it found into ``made`` (the
# Route's fields so far, under their names), or raises InvalidInput; ``at`` starts every
# message (``"routes.toml:3: route 1 ('stripe')"``). A check may read what earlier ones made.

_Check = Callable[[dict[str, Any], dict[str, Any], str], None]  # (entry, made, at)
#: Reads one option's value; (value, at, field) -> the value http_effect takes.
_Normaliser = Callable[[Any, str, str], Any]


def _known(entry: dict[str, Any], made: dict[str, Any], at: str) -> None:
    unknown = sorted(set(entry) - _FIELDS)
    if unknown:
        raise InvalidInput(
            f"{at}: unknown field {unknown[0]!r}; known: {', '.join(sorted(_FIELDS))}"
        )


def _prefix(entry: dict[str, Any], made: dict[str, Any], at: str) -> None:
    prefix = entry.get("prefix")
    if not isinstance(prefix, str) or not prefix.startswith("/") or "?" in prefix or "#" in prefix:
        raise InvalidInput(f"{at}: prefix must be a path starting with '/', got {prefix!r}")
    made["prefix"] = prefix


def _upstream(entry: dict[str, Any], made: dict[str, Any], at: str) -> None:
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
    made["upstream"] = upstream.rstrip("/")


def _name(entry: dict[str, Any], made: dict[str, Any], at: str) -> None:
    name = entry.get("name", made["prefix"].strip("/").replace("/", "-") or "root")
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidInput(
            f"{at}: name must be 1-40 letters, digits, '_' or '-', got {name!r}"
            + ("" if "name" in entry else " (taken from the prefix; give name = ...)")
        )
    made["name"] = name


def _passthrough(entry: dict[str, Any], made: dict[str, Any], at: str) -> None:
    passthrough = entry.get("passthrough", False)
    if not isinstance(passthrough, bool):
        raise InvalidInput(f"{at}: passthrough must be true or false, got {passthrough!r}")
    given = [k for k in (*_OPTIONS, "profile", "timeout") if k in entry]
    if passthrough and given:
        raise InvalidInput(
            f"{at}: field {given[0]!r} means nothing on a passthrough route (its requests "
            "are not journaled)"
        )
    made["passthrough"] = passthrough


def _service(entry: dict[str, Any], made: dict[str, Any], at: str) -> None:
    if "profile" in entry:
        made["service"] = _profile(entry["profile"], f"{at}, field 'profile'")


def _profile_alone(entry: dict[str, Any], made: dict[str, Any], at: str) -> None:
    stated = [k for k in _OPTIONS if k in entry]
    if made["service"] is not None and stated:
        raise InvalidInput(
            f"{at}: field {stated[0]!r} is the profile's to state; with profile give "
            "timeout only (or leave profile out and state every option)"
        )


def _http_service(entry: dict[str, Any], made: dict[str, Any], at: str) -> None:
    service: Service | None = made["service"]
    if service is None:
        return
    place = service.key
    if service.name in _NOT_HTTP:
        raise InvalidInput(f"{at}, field 'profile': {entry['profile']!r} is not an HTTP service")
    if place is not None and place.kind not in _HTTP_PLACES:
        raise InvalidInput(
            f"{at}: profile {entry['profile']!r} takes the key as {place.kind}, which a "
            "forwarded HTTP request has no place for"
        )
    if place is not None and place.kind == "metadata" and service.reference is None:
        raise InvalidInput(f"{at}: profile {entry['profile']!r} has no place for the key")


def _option(field: str, normalise: _Normaliser) -> _Check:
    """An http_effect keyword, read where the entry states it."""

    def check(entry: dict[str, Any], made: dict[str, Any], at: str) -> None:
        if field in entry:
            made["options"][field] = normalise(entry[field], f"{at}, field {field!r}", field)

    return check


def _flag(value: Any, at: str, field: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidInput(f"{at}: must be true or false")
    return value


def _lag(value: Any, at: str, field: str) -> float | None:
    return _duration(value, at, field, allow_zero=True)


def _retention_stated(entry: dict[str, Any], made: dict[str, Any], at: str) -> None:
    if entry.get("idempotent") is True and "key_retention" not in entry:
        raise InvalidInput(
            f"{at}, field 'key_retention': idempotent = true needs how long the service keeps "
            'a key (key_retention = "24h", "7d", or "forever"): a resend after it forgot the '
            "key applies twice"
        )


def _key_header(entry: dict[str, Any], made: dict[str, Any], at: str) -> None:
    key_header = entry.get("key_header")
    if key_header is not None and not isinstance(key_header, str):
        raise InvalidInput(f"{at}, field 'key_header': must be a header name, got {key_header!r}")
    made["key_header"] = key_header


def _lookup(entry: dict[str, Any], made: dict[str, Any], at: str) -> None:
    lookup = made["lookup"] = entry.get("lookup")
    if lookup is None:
        return
    if not isinstance(lookup, str) or "{key}" not in lookup:
        raise InvalidInput(
            f"{at}, field 'lookup': must be a URL or a path with {{key}} (GET it: 200 is "
            f"found, 404 not), got {lookup!r}"
        )
    if lookup.startswith("/"):
        lookup = made["upstream"] + lookup
    elif not lookup.startswith(("http://", "https://")):
        raise InvalidInput(f"{at}, field 'lookup': must start with '/' or http(s)://")
    # The upstream as made is the file's less its path's trailing slashes: the same origin.
    parts = urllib.parse.urlsplit(made["upstream"])
    there = urllib.parse.urlsplit(lookup)
    if (there.scheme, there.netloc) != (parts.scheme, parts.netloc):
        # The lookup is sent with the client's own credentials: only to the upstream.
        raise InvalidInput(
            f"{at}, field 'lookup': must be on the upstream's origin "
            f"({parts.scheme}://{parts.netloc}), since it carries the client's credentials"
        )
    made["lookup"] = lookup


def _statuses_of(field: str) -> _Check:
    """The statuses of ``field`` (not_applied, in_progress or key_reused), or the default
    for what the service promises."""

    def check(entry: dict[str, Any], made: dict[str, Any], at: str) -> None:
        if field in entry:
            made[field] = _statuses(entry[field], f"{at}, field {field!r}")
        else:
            made[field] = _default_statuses(made)[field]

    return check


def _default_statuses(made: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    if made["service"] is None and made["options"].get("idempotent") is not True:
        # A service that takes no key cannot say a key is in flight or reused: its 409
        # (a conflict), 422 (validation) and 429 (rate limit) refuse the request.
        neither = (*NOT_APPLIED, 409, 422, 429)
        return {"not_applied": neither, "in_progress": (), "key_reused": ()}
    return {"not_applied": (*NOT_APPLIED, 429), "in_progress": (409,), "key_reused": (422,)}


def _keys_fit(entry: dict[str, Any], made: dict[str, Any], at: str) -> None:
    service: Service | None = made["service"]
    limit = service.key_max_length if service is not None else None
    longest = len(f"{_slug(Route(**made).effect)}-{'0' * 32}.99")  # a key with an attempt's suffix
    if limit is not None and longest > limit:
        raise InvalidInput(
            f"{at}, field 'name': the service takes keys of at most {limit} characters and "
            f"this route's would take {longest}; give the route a shorter name"
        )


def _usable(entry: dict[str, Any], made: dict[str, Any], at: str) -> None:
    route = Route(**made)
    try:
        route.contract(route.upstream)
    except InvalidInput as exc:
        field = f", field {exc.option!r}" if getattr(exc, "option", None) else ""
        raise InvalidInput(f"{at}{field}: {exc}") from None


#: Where requests go, checked first, in this order (the first fault found is the one
#: reported): the messages of the checks after these name the route.
_WHERE: tuple[_Check, ...] = (_known, _prefix, _upstream, _name)
#: What the service promises, checked in this order on a route that is not a passthrough;
#: the last two check the route made.
_CONTRACT: tuple[_Check, ...] = (
    _service,
    _profile_alone,
    _http_service,
    _option("idempotent", _flag),
    _option("locks_in_flight", _flag),
    _retention_stated,
    _option("key_retention", _retention),
    _option("timeout", _duration),
    _option("lookup_lag", _lag),
    _key_header,
    _lookup,
    _statuses_of("not_applied"),
    _statuses_of("in_progress"),
    _statuses_of("key_reused"),
    _keys_fit,
    _usable,
)


def _statuses(value: Any, at: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(type(s) is int and 400 <= s < 500 for s in value):
        raise InvalidInput(f"{at}: must be a list of 4xx status codes, got {value!r}")
    return tuple(value)
