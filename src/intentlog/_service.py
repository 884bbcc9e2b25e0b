"""Service contracts: what one external service promises about idempotency keys.

A :class:`Service` is declared once and shared by the effects that talk to that service. It
states where the service takes the key, how long it honours it, whether it locks a key while
a request runs, how a replay answers, how the service can be asked and how far that lags,
and the request deadline. Every value left unknown takes its safe side: a key whose
retention is not stated does not count as deduplicating, a lookup whose lag is not stated
lags as long as a request may take, and a service is not assumed to lock keys in flight.

An effect turns its contract into a :class:`intentlog.Policy` (what the decision reads),
recorded with an operation at its first send; later judgements use the stricter of the
recorded and the live values (:func:`intentlog._decide.strictest`).
"""

from __future__ import annotations

import dataclasses
import enum
import re
import urllib.parse
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Literal

from intentlog._errors import InvalidInput
from intentlog._validate import seconds

__all__ = [
    "FOREVER",
    "PROCESS",
    "AnswerError",
    "KeyPlace",
    "KeyReuse",
    "Replay",
    "Retention",
    "Search",
    "Seconds",
    "Service",
]

Seconds = float | int | timedelta

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ._:/()+-]{0,79}$")
_HEADER = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an RFC 9110 token
_SEGMENT = re.compile(r"\{segment\[(-?\d+)\]\}")  # a Search template's path segment


class Retention(enum.Enum):
    """Retentions that are not a duration."""

    FOREVER = "forever"  # the service keeps every key for as long as it keeps the effect
    PROCESS = "process"  # kept only while the service's process lives: lost in its crash


FOREVER = Retention.FOREVER
PROCESS = Retention.PROCESS

KeyKind = Literal["header", "body", "query", "message_id", "resource", "metadata"]
LookupKind = Literal["key", "reference", "status"]
Encoding = Literal["json", "form"]
MarkerPlace = Literal["end", "graphql-directive"]
BodyPath = tuple[str | int, ...]  # str: a member of an object, int: an index into an array


@dataclasses.dataclass(frozen=True, slots=True)
class KeyPlace:
    """Where a service takes the idempotency key.

    ``kind``: ``"header"`` (an HTTP header such as ``Idempotency-Key``), ``"body"`` (a field
    of the JSON body), ``"query"`` (a URL query parameter), ``"message_id"`` (a message's
    deduplication id, such as ``Nats-Msg-Id`` or SQS's ``MessageDeduplicationId``),
    ``"resource"`` (the key names what is created, and a second create of it is refused, as
    an S3 conditional put) or ``"metadata"`` (stored beside the effect, for a lookup to find;
    no deduplication).
    """

    kind: KeyKind
    name: str

    def __post_init__(self) -> None:
        if self.kind not in ("header", "body", "query", "message_id", "resource", "metadata"):
            raise InvalidInput(f"KeyPlace kind must be header, body, query, message_id, "
                               f"resource or metadata, got {self.kind!r}")  # fmt: skip
        if not isinstance(self.name, str) or not self.name or len(self.name) > 100:
            raise InvalidInput(f"KeyPlace name must be a non-empty string, got {self.name!r}")
        if self.kind == "header" and not _HEADER.match(self.name):
            raise InvalidInput(f"KeyPlace: {self.name!r} is not an HTTP header name")

    @classmethod
    def header(cls, name: str) -> KeyPlace:
        return cls("header", name)

    @classmethod
    def body(cls, name: str) -> KeyPlace:
        return cls("body", name)

    @classmethod
    def query(cls, name: str) -> KeyPlace:
        return cls("query", name)

    @classmethod
    def message_id(cls, name: str) -> KeyPlace:
        return cls("message_id", name)

    @classmethod
    def metadata(cls, name: str) -> KeyPlace:
        return cls("metadata", name)


@dataclasses.dataclass(frozen=True, slots=True)
class Replay:
    """How a service answers a key it has already seen: the original result again.

    ``statuses``: HTTP statuses that carry the original answer's body on a replay (some
    services answer a repeated key with 409 and the first body); a 2xx is always read as an
    answer. ``header``: a header (name, value) that marks a replayed answer, such as
    ``("Idempotent-Replayed", "true")``. A replay is read as the confirmation it is, with the
    receipt taken from the replayed body.
    """

    statuses: tuple[int, ...] = ()
    header: tuple[str, str] | None = None

    def __post_init__(self) -> None:
        codes = tuple(self.statuses)
        if not all(type(s) is int and 200 <= s < 500 for s in codes):
            raise InvalidInput(f"Replay statuses must be 2xx-4xx status codes, got {codes!r}")
        object.__setattr__(self, "statuses", codes)
        if self.header is not None:
            name, value = self.header
            if not isinstance(name, str) or not _HEADER.match(name) or not isinstance(value, str):
                raise InvalidInput(f"Replay header must be (name, value), got {self.header!r}")


@dataclasses.dataclass(frozen=True, slots=True)
class KeyReuse:
    """How a service says "this key was already used for another request" (another body,
    another endpoint): an answer with a status in ``statuses`` whose JSON body holds ``value``
    at ``member`` (a path of member names). Stripe answers so with 400 and
    ``error.type == "idempotency_error"``:
    ``KeyReuse(statuses=(400,), member=("error", "type"), value="idempotency_error")``.

    Such an answer is read as :class:`intentlog.KeyConflict` carrying the service's message,
    never as a refusal of this request: the key names another request, so whether this one
    was applied is not what the answer says. An answer with the status and another body
    means what the status means otherwise.
    """

    statuses: tuple[int, ...]
    member: tuple[str, ...]
    value: str

    def __post_init__(self) -> None:
        codes = tuple(self.statuses)
        if not codes or not all(type(s) is int and 400 <= s < 500 for s in codes):
            raise InvalidInput(f"KeyReuse statuses must be 4xx status codes, got {codes!r}")
        member = tuple(self.member) if isinstance(self.member, tuple | list) else ()
        if not member or not all(isinstance(m, str) and m for m in member):
            raise InvalidInput(f"KeyReuse member must be a path of member names, such as "
                               f"('error', 'type'), got {self.member!r}")  # fmt: skip
        if not isinstance(self.value, str) or not self.value:
            raise InvalidInput(f"KeyReuse value must be a non-empty string, got {self.value!r}")
        object.__setattr__(self, "statuses", codes)
        object.__setattr__(self, "member", member)

    def matches(self, status: int, data: object) -> bool:
        """Whether an answer (its status and parsed JSON body) says the key was reused."""
        if status not in self.statuses:
            return False
        for name in self.member:
            if not isinstance(data, dict) or name not in data:
                return False
            data = data[name]
        return data == self.value


@dataclasses.dataclass(frozen=True, slots=True)
class AnswerError:
    """How a service says, inside a 2xx answer, that a call failed, in one of two forms:

    - a flag: Slack answers HTTP 200 with ``{"ok": false, "error": "channel_not_found"}``:
      ``AnswerError(ok=("ok",), code=("error",), transient=("internal_error", ...))``; an
      answer whose ``ok`` member is not ``true`` failed, with the code at ``code``;
    - a list of errors: GraphQL answers HTTP 200 with ``{"errors": [{"extensions": {"code":
      "THROTTLED"}}]}``, and a mutation's ``userErrors`` under ``data``:
      ``AnswerError(errors=("errors",), code=("extensions", "code"))``,
      ``AnswerError(errors=("data", "*", "userErrors"), code=("message",))`` (``"*"``: any
      member); a non-empty list there is a failure, with the code at ``code`` in its first
      item.

    A code in ``transient`` is an error after which the call may have been applied (the
    service's own words for it say so): ambiguous, settled as a crash in flight is. So is
    any failure where a value at ``ran`` is not null (GraphQL answers errors beside the data
    of a mutation that did run: ``ran=("data", "*")``). Any other code is a refusal:
    Rejected, FAILED.
    """

    code: tuple[str, ...]
    ok: tuple[str, ...] | None = None
    errors: tuple[str, ...] | None = None
    transient: tuple[str, ...] = ()
    ran: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if (self.ok is None) == (self.errors is None):
            raise InvalidInput("AnswerError takes ok= (a flag) or errors= (a list), one of them")
        for name in ("code", "ok", "errors", "transient", "ran"):
            value = getattr(self, name)
            if value is None:
                continue
            steps = tuple(value) if isinstance(value, tuple | list) else ()
            if (not steps and name != "transient") or not all(
                isinstance(m, str) and m for m in steps
            ):
                raise InvalidInput(f"AnswerError {name} must be member names, got {value!r}")
            object.__setattr__(self, name, steps)

    def ambiguous(self, data: object, code: str) -> bool:
        """Whether a failure (its answer and code) may still have applied the call."""
        ran = self.ran is not None and any(v is not None for v in _at(data, self.ran))
        return ran or code in self.transient

    def failure(self, data: object) -> str | None:
        """The error code of a failed answer (its parsed JSON), or None where it succeeded."""
        if self.ok is not None:
            ok = _at(data, self.ok)
            return None if True in ok else _code(data, self.code)
        assert self.errors is not None
        for found in _at(data, self.errors):
            if isinstance(found, list) and found:
                return _code(found[0], self.code)
        return None


def _at(data: object, path: tuple[str, ...]) -> list[object]:
    """The values at ``path`` (``"*"``: every member of an object)."""
    values = [data]
    for name in path:
        values = [
            v
            for d in values
            if isinstance(d, dict)
            for v in (d.values() if name == "*" else [d[name]] if name in d else [])
        ]
    return values


def _code(data: object, path: tuple[str, ...]) -> str:
    found = _at(data, path)
    code = found[0] if found else None
    return code if isinstance(code, str) and code else "no error code"


@dataclasses.dataclass(frozen=True, slots=True)
class Search:
    """A ready lookup: the service's search for the operation key, which the effect stored
    where the search finds it (see ``Service.reference``).

    ``url``: a template; ``{url}`` is replaced by the effect's URL and ``{key}`` by the key
    (URL-quoted in the path, form-encoded in the query, so a key never changes the shape of
    the URL). Stripe: ``"{url}/search?query=metadata['intentlog_key']:'{key}'"``.
    ``results``: the member of the JSON answer that lists the matches (Stripe's ``"data"``);
    None: the answer is the list itself. ``incomplete``: a member that, when true, says the
    list may be missing matches (GitHub's ``incomplete_results``, set when its search timed
    out): no match then is Indeterminate, never NotFound.

    ``listing``: the answer lists recent records, not matches (Slack's conversations.history):
    the records holding the key at the service's ``reference`` are the matches, the others
    are passed over; with ``incomplete`` (Slack's ``has_more``) a list that goes on beyond
    the answer settles nothing where none matches.

    With the service's ``marker`` the search is a text search, which matches loosely (words,
    not characters): a match counts only where the marker for the key is found, character for
    character, in the match's ``reference`` member; the others are not the operation's.

    One match is the record (its receipt fields must be there); none is NotFound, trusted
    only once the service's ``lookup_lag`` has passed; more than one is Indeterminate, since
    a key names one operation; any answer but a 200 with that list is Indeterminate.
    """

    url: str
    results: str | None = None
    incomplete: str | None = None
    listing: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.url, str) or ("{key}" not in self.url and not self.listing):
            # A listing names no key (it lists recent records); any other search must, or
            # it finds another operation's record, or none.
            raise InvalidInput(f"Search url must be a template with a {{key}} placeholder, "
                               f"got {self.url!r}")  # fmt: skip
        if not self.url.startswith(("{url}", "http://", "https://", "../", "./")):
            raise InvalidInput(f"Search url must start with {{url}} (the effect's URL), "
                               f"http(s):// or ../ (relative to the effect's URL), got "
                               f"{self.url!r}")  # fmt: skip
        if type(self.listing) is not bool:
            raise InvalidInput(f"Search listing must be True or False, got {self.listing!r}")
        for name, member in (("results", self.results), ("incomplete", self.incomplete)):
            if member is not None and (not isinstance(member, str) or not member):
                raise InvalidInput(f"Search {name} must name a JSON member or be None, got "
                                   f"{member!r}")  # fmt: skip

    def url_for(self, effect_url: str, key: str) -> str:
        """The search URL for ``key`` on an effect sending to ``effect_url``.

        ``{segment[i]}`` is the effect URL's path segment ``i`` (negative: from the end), and
        a template starting with ``../`` or ``./`` is resolved against the effect's URL (RFC
        3986), so one template serves every host and API prefix: GitHub's
        ``../../../search/issues?q=repo:{segment[-3]}/{segment[-2]}`` on
        ``https://api.github.com/repos/acme/shop/issues`` is
        ``https://api.github.com/search/issues?q=repo:acme/shop``.
        """
        effect = urllib.parse.urlsplit(effect_url)
        segments = effect.path.split("/")[1:]

        def fill(text: str, key_text: str) -> str:
            def segment(match: re.Match[str]) -> str:
                index = int(match.group(1))
                if not -len(segments) <= index < len(segments) or not segments[index]:
                    raise InvalidInput(f"search {self.url!r}: the effect URL {effect.path!r} "
                                       f"has no path segment {index}")  # fmt: skip
                return urllib.parse.unquote(segments[index])

            return _SEGMENT.sub(segment, text).replace("{key}", key_text)

        template = self.url.replace("{url}", effect_url)
        if template.startswith(("../", "./")):
            template = urllib.parse.urljoin(effect_url, template)
        split = urllib.parse.urlsplit(template)
        pairs = urllib.parse.parse_qsl(split.query, keep_blank_values=True)
        query = urllib.parse.urlencode([(n, fill(v, key)) for n, v in pairs])
        path = fill(split.path, urllib.parse.quote(key, safe=""))
        return split._replace(path=path, query=query).geturl()


@dataclasses.dataclass(frozen=True, slots=True, init=False)
class Service:
    """What one external service promises about idempotency keys. Frozen; share one value
    among the effects of a service (``Effect(..., service=STRIPE)``).

    - ``key``: where the service takes the key (:class:`KeyPlace`), or None: it takes none.
    - ``retention``: how long it honours a key: seconds or a timedelta, :data:`FOREVER`, or
      :data:`PROCESS` (only while its process lives, which counts as not deduplicating across
      a crash). None: unknown, which counts as not deduplicating.
    - ``locks_in_flight``: a second request with a key whose first request is still running
      is refused (Stripe answers 409) instead of executed. Only then may a request whose
      sender died be resent before its deadline has passed.
    - ``replay``: how a replayed answer looks (:class:`Replay`).
    - ``lookup``: how it can be asked what happened: by ``"key"``, by a client
      ``"reference"`` stored with the effect, or by a ``"status"`` resource; None: it cannot.
      The effect still needs a reconciler that asks.
    - ``lookup_lag``: how far a lookup may lag behind a commit. None: unknown, taken as the
      request timeout.
    - ``timeout``: the request deadline (after it, the request cannot land any more).
    - ``encoding``: how a request body is written: ``"json"`` (canonical JSON, the default)
      or ``"form"`` (``application/x-www-form-urlencoded`` with nested names such as
      ``metadata[k]=v``, as Stripe's v1 API takes).
    - ``reference``: where in the body the key is also written, for the service's search to
      find (a path of member names and array indexes, such as ``("metadata",
      "intentlog_key")``); None: nowhere.
    - ``key_max_length``: the longest key the service takes; None: no stated limit.
    - ``search``: a ready lookup (:class:`Search`); an HTTP effect uses it unless it is
      given a lookup of its own. It needs ``lookup`` stated.
    - ``key_reuse``: how the service says a key was already used for another request
      (:class:`KeyReuse`), read as :class:`intentlog.KeyConflict`.
    - ``pinned``: values the body must hold for the lookup to find the call, as (path, value)
      pairs: written where the call gives none, and a call that gives another is refused
      before anything is sent (Slack's metadata ``event_type``, and the channel its history
      is read from).
    - ``answer_errors``: how the service says, inside a 2xx answer, that the call failed
      (:class:`AnswerError`, one or a tuple); none: a 2xx is a success.
    - ``marker_place``: where the marker goes in that text: ``"end"`` (its last paragraph,
      the default) or ``"graphql-directive"`` (on the first field of the GraphQL mutation
      held there, after its arguments, as Shopify takes ``@idempotent(key: "...")``; the
      key is escaped as a GraphQL string).
    - ``marker``: for a service that takes no key but stores text, the text that carries the
      key (a template with ``{key}``, such as ``"intentlog-key {key}"``), appended as its own
      paragraph to the text at ``reference`` (which it needs); a search then finds it by
      containment. None: the key itself is the value at ``reference``.
    - ``source``: where these numbers come from, and when they were read.
    """

    name: str
    key: KeyPlace | None
    retention: float | Retention | None
    locks_in_flight: bool
    replay: Replay | None
    lookup: LookupKind | None
    lookup_lag: float | None
    timeout: float
    encoding: Encoding
    reference: BodyPath | None
    key_max_length: int | None
    search: Search | None
    key_reuse: KeyReuse | None
    marker: str | None
    marker_place: MarkerPlace
    pinned: tuple[tuple[BodyPath, str], ...]
    answer_errors: tuple[AnswerError, ...]
    source: str

    def __init__(
        self,
        name: str,
        *,
        key: KeyPlace | None = None,
        retention: Seconds | Retention | None = None,
        locks_in_flight: bool = False,
        replay: Replay | None = None,
        lookup: LookupKind | None = None,
        lookup_lag: Seconds | None = None,
        timeout: Seconds = 30.0,
        encoding: Encoding = "json",
        reference: BodyPath | None = None,
        key_max_length: int | None = None,
        search: Search | None = None,
        key_reuse: KeyReuse | None = None,
        marker: str | None = None,
        marker_place: MarkerPlace = "end",
        pinned: tuple[tuple[BodyPath, str], ...] = (),
        answer_errors: AnswerError | tuple[AnswerError, ...] = (),
        source: str = "",
    ) -> None:
        if not isinstance(name, str) or not _NAME.match(name):
            raise InvalidInput(f"service name must be 1-80 printable chars, got {name!r}")
        given: dict[str, Any] = {
            "name": name,
            "key": key,
            "retention": retention,
            "locks_in_flight": locks_in_flight,
            "replay": replay,
            "lookup": lookup,
            "lookup_lag": lookup_lag,
            "timeout": timeout,
            "encoding": encoding,
            "reference": reference,
            "key_max_length": key_max_length,
            "search": search,
            "key_reuse": key_reuse,
            "marker": marker,
            "marker_place": marker_place,
            "pinned": pinned,
            "answer_errors": answer_errors,
            "source": source,
        }
        what = f"service {name!r}"
        for check in _CHECKS:
            check(given, what)
        for field, value in given.items():
            object.__setattr__(self, field, value)

    @property
    def deduplicates(self) -> bool:
        """Whether a resend with the same key is answered from the first request, across a
        crash of either side: a key is taken (not merely stored as metadata) and kept for a
        known time or forever."""
        return (
            self.key is not None
            and self.key.kind != "metadata"
            and self.retention is not None
            and self.retention is not PROCESS
        )

    @property
    def key_retention(self) -> float | None:
        """The retention in seconds for a deduplicating service; None for one that keeps
        keys :data:`FOREVER` (stated so) or that does not deduplicate (see ``deduplicates``:
        an unstated retention never deduplicates)."""
        if not self.deduplicates or self.retention is FOREVER:
            return None
        assert isinstance(self.retention, float)
        return self.retention

    def replace(self, **changes: object) -> Service:
        """A copy with ``changes`` (the constructor's keywords), validated again."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        fields.update(changes)
        name = fields.pop("name")
        return Service(name, **fields)

    def describe(self) -> str:
        """One line: what this contract lets the journal do after a crash in flight."""
        if self.deduplicates:
            assert self.key is not None  # a service that deduplicates takes a key
            kept = "forever" if self.retention is FOREVER else f"for {self.retention:g} s"
            how = f"deduplicates on {self.key.kind} {self.key.name!r} {kept}"
        else:
            how = "does not deduplicate across a crash"
        ask = f"; can be asked by {self.lookup}" if self.lookup else "; cannot be asked"
        return f"{self.name}: {how}{ask}"


# -- the constructor's checks ------------------------------------------------------------------
#
# A normaliser reads one field's value as given and returns it as the Service keeps it, or
# raises InvalidInput; ``at`` is the field as messages name it (``"service 'stripe': timeout"``).
# A rule checks fields together once each of them has been read.

_Normaliser = Callable[[Any, str], Any]
_Check = Callable[[dict[str, Any], str], None]  # (the fields as given so far, "service 'x'")


def _field(name: str, normalise: _Normaliser) -> _Check:
    def check(given: dict[str, Any], what: str) -> None:
        given[name] = normalise(given[name], f"{what}: {name}")

    return check


def _instance(cls: type, example: str) -> _Normaliser:
    """None, or an instance of ``cls`` (``example`` shows how one is made)."""

    def normalise(value: Any, at: str) -> Any:
        if value is not None and not isinstance(value, cls):
            raise InvalidInput(f"{at} must be {example}, got {value!r}")
        return value

    return normalise


def _one_of(*choices: str | None, got: bool = True, option: str | None = None) -> _Normaliser:
    """One of ``choices``; ``option`` is the field an error names, where it names one."""
    words = ", ".join(repr(c) for c in choices[:-1]) + f" or {choices[-1]!r}"

    def normalise(value: Any, at: str) -> Any:
        if value not in choices:
            shown = f", got {value!r}" if got else ""
            raise InvalidInput(f"{at} must be {words}{shown}", option=option)
        return value

    return normalise


def _seconds(*, positive: bool) -> _Normaliser:
    """None (unknown), or seconds: > 0 with ``positive``, else >= 0."""

    def normalise(value: Any, at: str) -> float | None:
        return None if value is None else seconds(at, value, positive=positive, bounded=False)

    return normalise


def _retention(value: Any, at: str) -> float | Retention | None:
    if isinstance(value, Retention):
        return value
    return None if value is None else seconds(at, value, positive=True, bounded=False)


def _flag(value: Any, at: str) -> bool:
    if type(value) is not bool:
        raise InvalidInput(f"{at} must be True or False")
    return value


def _optional_path(value: Any, at: str) -> BodyPath | None:
    return None if value is None else _path(value, at)


def _key_max_length(value: Any, at: str) -> int | None:
    if value is not None and (type(value) is not int or not 1 <= value <= 10_000):
        raise InvalidInput(f"{at} must be a positive whole number of characters, got "
                           f"{value!r}")  # fmt: skip
    return value


def _marker(value: Any, at: str) -> str | None:
    if value is not None and (
        not isinstance(value, str) or value.count("{key}") != 1 or len(value) > 200
    ):
        raise InvalidInput(f"{at} must be a text with one {{key}} placeholder, got {value!r}",
                           option="marker")  # fmt: skip
    return value


def _pinned(value: Any, at: str) -> tuple[tuple[BodyPath, str], ...]:
    pairs = tuple(value) if isinstance(value, tuple | list) else None
    if pairs is None or not all(
        isinstance(p, tuple | list) and len(p) == 2 and isinstance(p[1], str) for p in pairs
    ):
        raise InvalidInput(f"{at} must be (path, text) pairs, got {value!r}", option="pinned")
    return tuple((_path(p, f"{at} path"), v) for p, v in pairs)


def _answer_errors(value: Any, at: str) -> tuple[AnswerError, ...]:
    found = (value,) if isinstance(value, AnswerError) else value
    if not isinstance(found, tuple) or not all(isinstance(a, AnswerError) for a in found):
        raise InvalidInput(f"{at} must be AnswerError(...)s, got {found!r}")
    return found


def _source(value: Any, at: str) -> str:
    if not isinstance(value, str) or len(value) > 3000:
        raise InvalidInput(f"{at} must be a string (where the numbers come from)")
    return value


def _search_finds_by_something(given: dict[str, Any], what: str) -> None:
    if given["search"] is None:
        return
    if given["lookup"] is None:
        raise InvalidInput(f"{what}: a search is a lookup; state what it finds by "
                           "(lookup='reference' or 'key')")  # fmt: skip
    if given["lookup"] == "reference" and given["reference"] is None:
        # A search by reference finds only what the request wrote; without the key in the
        # body it answers NotFound forever, and a trusted NotFound would resend a call that
        # landed.
        raise InvalidInput(f"{what}: a search by reference finds only the key the request "
                           "carries: state reference= (where the body holds the key), or "
                           "leave the search out", option="reference")  # fmt: skip


def _marker_has_a_place(given: dict[str, Any], what: str) -> None:
    if given["marker"] is not None and given["reference"] is None:
        raise InvalidInput(f"{what}: a marker is written into the text at reference=; "
                           "state where", option="reference")  # fmt: skip


#: Every check of the constructor, in the order they run: the first fault found is the one
#: reported. Each field but ``name`` (read first: the messages name the service) is read once.
_CHECKS: tuple[_Check, ...] = (
    _field("key", _instance(KeyPlace, "a KeyPlace (KeyPlace.header(...))")),
    _field("retention", _retention),
    _field("locks_in_flight", _flag),
    _field("replay", _instance(Replay, "a Replay(...)")),
    _field("lookup", _one_of("key", "reference", "status", None, got=False)),
    _field("encoding", _one_of("json", "form")),
    _field("reference", _optional_path),
    _field("key_max_length", _key_max_length),
    _field("search", _instance(Search, "a Search(...)")),
    _search_finds_by_something,
    _field("key_reuse", _instance(KeyReuse, "a KeyReuse(...)")),
    _field("marker", _marker),
    _field("marker_place", _one_of("end", "graphql-directive", option="marker_place")),
    _marker_has_a_place,
    _field("pinned", _pinned),
    _field("answer_errors", _answer_errors),
    _field("source", _source),
    _field("lookup_lag", _seconds(positive=False)),
    _field("timeout", _seconds(positive=True)),
)


def _path(value: object, what: str) -> BodyPath:
    """``value`` as a path into a JSON body: member names and array indexes, starting with
    a member (a body that carries a key is an object), at most 10 steps."""
    steps = tuple(value) if isinstance(value, tuple | list) else ()
    ok = (
        0 < len(steps) <= 10
        and isinstance(steps[0], str)
        and all(
            (isinstance(s, str) and s and "[" not in s and "]" not in s)
            or (type(s) is int and s >= 0)
            for s in steps
        )
    )
    if not ok:
        raise InvalidInput(f"{what} must be a path of member names and array indexes starting "
                           f"with a member, such as ('metadata', 'intentlog_key'), got "
                           f"{value!r}")  # fmt: skip
    return steps
