"""HTTP APIs as effects, with httpx: :func:`http_effect` (sync) and :func:`async_http_effect`.

``pip install -e '.[http]'`` from the clone (``'intentlog[http]'`` once published). What the
service promises (where it takes the key, for how long, whether it locks a key in flight, how a
replay looks, how it takes a body, how it can be searched) comes from an
:class:`intentlog.Service` (``service=profiles.STRIPE``) or from keywords. Bodies are sent
canonical (JSON, or a form for a service that takes one), so a call made again sends the same
bytes. Both share one mapping of answers to outcomes (:meth:`_Spec.receipt_of_answer`,
:meth:`_Spec.lookup_result`, :meth:`_Spec.search_result`) and one protocol for the in-progress
wait (:meth:`_Spec.submit_flow`), written as generators that yield the HTTP exchanges they need;
a small sync runner and a small async runner (:mod:`._http_runner`) perform them. A service that
answers errors inside a 200 (``Service.answer_errors``: Slack, GraphQL) is read the same way.
Anything that does not prove "applied" or "not applied" raises :class:`AmbiguousResponse`, never
Rejected, so the decision settles it. Credentials belong in the client
(``client=httpx.Client(headers=...)``): no request or answer header ever reaches the journal or
an error message.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import time
import urllib.parse
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, Unpack, cast

from intentlog._effect import Effect
from intentlog._effect_options import EffectOptions, effect_contract
from intentlog._errors import InvalidInput, KeyConflict, Rejected
from intentlog._hygiene import scrub_text
from intentlog._model import Found, Indeterminate, LookupResult, NotFound
from intentlog._service import KeyPlace, Replay, Search, Seconds, Service
from intentlog._validate import seconds
from intentlog.integrations import AmbiguousResponse, _call_body, _encoding
from intentlog.integrations._http_runner import (
    _MAX_ANSWER,
    _Answer,
    _async_client,
    _drive_async,
    _drive_sync,
    _Flow,
    _httpx,
    _Pause,
    _Send,
    _sync_client,
    _where,
)

if TYPE_CHECKING:
    import httpx

__all__ = ["AmbiguousResponse", "Lookup", "async_http_effect", "http_effect"]

T = TypeVar("T")
Receipt = dict[str, Any]
_METHODS = ("POST", "PUT", "PATCH", "DELETE")
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an HTTP header name (RFC 9110 token)
NOT_APPLIED = (400, 401, 402, 403, 404, 405, 413, 415)


@dataclasses.dataclass(frozen=True)
class Lookup:
    """How to ask the service about an operation key, for reconciling a lost answer.

    Only a lookup *by key* can reconcile: the answer that would have carried the new
    resource's id is exactly what may have been lost. A status resource (``/charges/{id}``)
    works as a lookup only when the id is the key itself (``PUT /charges/{key}``); otherwise
    have the service store the key (an ``external_id``, a metadata field) and search by it.
    """

    url: str
    pick: Callable[[Any], Any] | None = None

    @classmethod
    def by_key(cls, url: str, *, pick: Callable[[Any], Any] | None = None) -> Lookup:
        """``GET url`` with ``{key}`` replaced by the (URL-quoted) key; 200 is found, 404 not.

        ``pick(body)`` turns a search answer into the record for the key (``None``: there is
        none, which counts as NotFound), for APIs that answer a search with a list.
        """
        if "{key}" not in url:
            raise InvalidInput(f"a lookup URL needs a {{key}} placeholder, got {url!r}")
        _check_url(url)
        if pick is not None and not callable(pick):
            raise InvalidInput(f"pick must be a function of the lookup's JSON, got {pick!r}")
        return cls(url, pick)

    def url_for(self, key: str) -> str:
        return _with_key(self.url, key)


@dataclasses.dataclass(frozen=True)
class _Spec:
    """What one HTTP effect sends and how it reads the answers: the mapping, written once."""

    name: str
    method: str
    url: str
    fields: tuple[str, ...]
    lookup: Lookup | None
    idempotent: bool
    timeout: float
    in_progress_wait: float
    not_applied: frozenset[int]
    in_progress: frozenset[int]
    key_reused: frozenset[int]
    key: KeyPlace | None  # None: the service takes no key (a {key} in the URL still works)
    replay: Replay
    # The declared service, for how it takes a body and a key and how it answers (encoding,
    # reference, key_max_length, search, key_reuse); None: declared by keywords.
    service: Service | None = None

    def request(self, key: str, body: Any) -> _Send:
        """The submit request for ``key``: the key where the service takes it (and, with the
        service's ``reference``, also inside the body for its search), and the body in the
        service's encoding, canonical either way (:mod:`._encoding`). So a call made again
        with its arguments in another order sends the same bytes under the same key, as
        services that fingerprint the raw body require of a retry. Everything refused here
        is refused before anything is sent: Rejected, FAILED, which is the truth."""
        service = self.service
        limit = service.key_max_length if service is not None else None
        if limit is not None and len(key) > limit:
            assert service is not None
            raise Rejected(
                f"effect {self.name!r}: key {key[:40]!r}... is {len(key)} characters; service "
                f"{service.name!r} takes at most {limit}; nothing was sent",
                key=key,
            )
        url = _with_key(self.url, key)
        headers: dict[str, str] = {}
        place = self.key
        if place is not None and place.kind == "header":
            headers[place.name] = key
        elif place is not None and place.kind == "query":
            split = urllib.parse.urlsplit(url)
            pair = urllib.parse.urlencode({place.name: key})
            url = split._replace(query=f"{split.query}&{pair}" if split.query else pair).geturl()
        elif place is not None and place.kind == "body":
            # Refused before anything is sent, so "not applied" is the truth: FAILED.
            if not isinstance(body, dict):
                raise Rejected(
                    f"effect {self.name!r} puts the key in the body field {place.name!r}, so its "
                    f"body must be a JSON object, not {type(body).__name__}; nothing was sent",
                    key=key,
                )
            if place.name in body:
                raise Rejected(
                    f"effect {self.name!r}: the body already has a field {place.name!r}, where "
                    "the service takes the key; nothing was sent",
                    key=key,
                )
            body = {**body, place.name: key}
        try:
            if service is not None and service.pinned:
                body = _encoding.with_pinned(body, service.pinned)
            if service is not None and service.reference is not None:
                body = _encoding.with_reference(
                    body, service.reference, key, service.marker, service.marker_place
                )
            content, headers["Content-Type"] = _encoding.encode(
                body,
                "json" if service is None else service.encoding,
                what=f"the body of effect {self.name!r}",
            )
        except _encoding.Unsendable as exc:
            raise Rejected(f"effect {self.name!r}: {exc}; nothing was sent", key=key) from None
        return _Send(self.method, url, content, headers, True)

    def submit_flow(self, key: str, body: Any) -> _Flow[Receipt]:
        send = self.request(key, body)
        give_up: float | None = None
        pause = 0.05
        while True:
            answer: _Answer = yield send
            receipt = self.receipt_of_answer(key, answer)
            if receipt is not None:
                return receipt
            # The service is still working on this key (an earlier attempt of ours, perhaps
            # from before a crash). Its outcome is coming: wait for it rather than give up.
            if self.lookup is None and not self.idempotent:
                raise AmbiguousResponse(
                    f"{self.method} {_where(send.url)} answered {answer.status} (in progress) "
                    "and the effect can neither look the key up nor resend it",
                    status=answer.status,
                    key=key,
                )
            if give_up is None:  # counted from the first such answer, not from the send
                give_up = time.monotonic() + self.in_progress_wait
            while True:
                if time.monotonic() + pause > give_up:
                    raise AmbiguousResponse(
                        f"{self.method} {_where(send.url)}: key {key!r} still in progress "
                        f"after {self.in_progress_wait:g}s; the request may yet be applied",
                        status=answer.status,
                        key=key,
                    )
                yield _Pause(pause)
                pause = min(pause * 2, 1.0)
                if self.lookup is not None:
                    found = yield from self.lookup_flow(key)
                    if isinstance(found, Found):
                        return cast(Receipt, found.receipt)
                if self.idempotent:
                    break  # resend the same key: the service deduplicates it

    @property
    def search(self) -> Search | None:
        """The service's ready search, when it is this effect's lookup (see :func:`_spec`)."""
        service = self.service
        if service is None or service.search is None or self.lookup is None:
            return None
        return service.search if self.lookup.url == service.search.url else None

    def lookup_flow(self, key: str) -> _Flow[LookupResult]:
        assert self.lookup is not None
        search = self.search
        url = search.url_for(self.url, key) if search else self.lookup.url_for(key)
        send = _Send("GET", url, None, {}, False)
        try:
            answer: _Answer = yield send
        except AmbiguousResponse as exc:
            return Indeterminate(f"lookup failed: {exc}")
        return self.search_result(key, answer) if search else self.lookup_result(key, answer)

    def receipt_of_answer(self, key: str, answer: _Answer) -> Receipt | None:
        """The receipt in a submit's answer, None for "in progress"; raises otherwise.

        A 2xx whose body holds every receipt field is the answer. A status in the service's
        ``Replay.statuses`` or in ``in_progress`` (409 by default) whose body holds every
        receipt field, and is no error body (:meth:`replayed_receipt`), is the original
        answer replayed (django-idempotency-key answers a completed key with 409 and the
        first body), and so the confirmation. Without them the status means what it means
        otherwise: an ``in_progress`` status is "in progress". An answer marked by the
        replay header is a finished one, so never "in progress"; a replayed refusal is
        still a refusal.
        """
        status = answer.status
        if 200 <= status < 300 and not (self.service is not None and self.service.answer_errors):
            receipt, problem = self.receipt_in(answer)
            if receipt is not None:
                return receipt  # the common case: no message to make
        where = f"{self.method} {_where(_with_key(self.url, key))}"
        if 200 <= status < 300:
            self.raise_answer_error(key, answer, where)
            receipt, problem = self.receipt_in(answer)
            if receipt is not None:
                return receipt
        elif status in self.replay.statuses or status in self.in_progress:
            receipt = self.replayed_receipt(answer)
            if receipt is not None:
                return receipt
        if 200 <= status < 300:
            raise AmbiguousResponse(
                f"{where} answered {status} with {problem}; it may have been applied, so the "
                "operation stays SUBMITTED and is reconciled",
                status=status,
                key=key,
            )
        detail = _detail(answer.body)
        reuse = self.service.key_reuse if self.service is not None else None
        if reuse is not None and reuse.matches(status, _parse(answer.body)[0]):
            # The key belongs to another request (other parameters, another endpoint): not a
            # refusal of this one, whose outcome the answer does not tell.
            raise KeyConflict(
                f"{where} answered {status}: key {key!r} was already used for another request "
                f"({detail})",
                key=key,
                status=status,
            )
        if status in self.in_progress and not answer.replayed:
            return None
        if status in self.key_reused:
            raise KeyConflict(
                f"{where} answered {status}: key {key!r} was already used for another request "
                f"({detail})",
                key=key,
                status=status,
            )
        if status in self.not_applied:
            raise Rejected(
                f"{where} refused the request ({status}): {detail}", key=key, status=status
            )
        raise AmbiguousResponse(
            f"{where} answered {status} ({detail}); the request may have been applied",
            status=status,
            key=key,
        )

    def raise_answer_error(self, key: str, answer: _Answer, where: str) -> None:
        """Raise for a 2xx answer that says the call failed (the service's ``answer_errors``):
        Rejected for a refusal, AmbiguousResponse for an error after which the call may have
        been applied."""
        specs = self.service.answer_errors if self.service is not None else ()
        if not specs or answer.truncated:
            return
        data = _parse(answer.body)[0]
        failed = [(spec, code) for spec in specs if (code := spec.failure(data)) is not None]
        if not failed:
            return
        spec, code = failed[0]
        if spec.ambiguous(data, code):
            code = scrub_text(code, limit=100)
            raise AmbiguousResponse(
                f"{where} answered {answer.status} with error {code!r}; the request may have "
                "been applied",
                status=answer.status,
                key=key,
            )
        code = scrub_text(code, limit=100)
        raise Rejected(f"{where} refused the request: {code}", key=key, status=answer.status)

    def replayed_receipt(self, answer: _Answer) -> Receipt | None:
        """The receipt of a non-2xx answer that replays the original one, else None.

        It must hold every receipt field and be no error body: not ``application/problem+json``
        (RFC 9457, the IETF Idempotency-Key draft's "request outstanding" answer) and no
        top-level ``error``/``errors`` member that is not itself a receipt field (Stripe's and
        django-idempotency-key's "in progress" 409s). An error that happens to carry
        receipt-named fields is read as what it says, so a request still running is never
        confirmed with a receipt it has not produced.
        """
        if answer.problem:
            return None
        receipt, _ = self.receipt_in(answer)
        if receipt is None:
            return None
        data = json.loads(answer.body)  # an object: receipt_in parsed it
        if any(k in data and k not in self.fields for k in ("error", "errors")):
            return None
        return receipt

    def receipt_in(self, answer: _Answer) -> tuple[Receipt | None, str]:
        """The receipt fields of an answer's body, or what is wrong with it."""
        if answer.truncated:
            return None, f"a body over {_MAX_ANSWER} bytes"
        data, problem = _parse(answer.body)
        if problem is not None:
            return None, problem
        receipt, problem = self.receipt_of(data)
        return receipt, problem or ""

    def lookup_result(self, key: str, answer: _Answer) -> LookupResult:
        """A lookup by key's answer: 404 or an empty 200 (``null``, ``false``, ``[]``, ``{}``,
        or a ``pick`` that gives None) is NotFound; a record with the receipt fields is Found.

        A record that holds another key where the service writes it (its ``reference``) is
        another operation's, never Found: Indeterminate, as the lookup cannot be asking for
        this key. A list (a filter the service may have ignored) is searched for the record
        holding this key at the ``reference``: none is NotFound, two are Indeterminate;
        without a ``reference`` a list cannot be judged (give ``pick=``).
        """
        if answer.status == 404:
            return NotFound()
        if answer.status != 200 or answer.truncated:
            return Indeterminate(f"lookup answered {answer.status}: {_detail(answer.body)}")
        data, problem = _parse(answer.body)
        if problem is not None:
            return Indeterminate(f"lookup answered 200 with {problem}")
        if self.lookup is not None and self.lookup.pick is not None:
            try:
                data = self.lookup.pick(data)
            except Exception as exc:
                return Indeterminate(f"lookup's pick raised {type(exc).__name__}")
        if data is None or data is False or (isinstance(data, list | dict) and not data):
            return NotFound()  # "nothing for this key": never taken for a record
        reference = self.service.reference if self.service is not None else None
        if isinstance(data, list) and reference is not None:
            data = [m for m in data if _encoding.value_at(m, reference) == (True, key)]
            if not data:
                return NotFound()
            if len(data) > 1:
                return Indeterminate(f"lookup found {len(data)} records for one key")
            data = data[0]
        if reference is not None and self.service is not None and self.service.marker is None:
            there, value = _encoding.value_at(data, reference)
            if there and value != key:
                return Indeterminate("lookup found a record holding another key")
        receipt, problem = self.receipt_of(data)
        if receipt is not None:
            return Found(receipt)
        return Indeterminate(f"lookup answered 200 with {problem}")

    def search_result(self, key: str, answer: _Answer) -> LookupResult:
        """A search's answer: one match is the record, none NotFound, more Indeterminate.

        Only a 200 whose ``results`` member is a list says anything: a search answers "none"
        with an empty list, so a 404 is a wrong URL, not a missing record. A match whose
        body holds another value where the key was written (the service's ``reference``)
        is another operation's record: Indeterminate, never Found.
        """
        search, service = self.search, self.service
        assert search is not None and service is not None
        if answer.status != 200 or answer.truncated:
            return Indeterminate(f"search answered {answer.status}: {_detail(answer.body)}")
        data, problem = _parse(answer.body)
        whole = data if isinstance(data, dict) else {}
        if problem is None and search.results is not None:
            data = data.get(search.results) if isinstance(data, dict) else None
        if not isinstance(data, list):
            member = f"a {search.results!r} list" if search.results else "a list"
            return Indeterminate(f"search answered 200 without {member} of matches")
        if search.listing and service.reference is not None:
            # A list of recent records: the ones holding this key are the matches.
            path = service.reference
            data = [m for m in data if _encoding.value_at(m, path) == (True, key)]
        elif service.marker is not None and service.reference is not None:
            # A text search matches words, not characters: only a record whose text holds
            # the marker itself is this operation's.
            text = service.marker.replace("{key}", key)
            path, open_end = service.reference, service.marker.endswith("{key}")
            data = [m for m in data if _holds(_encoding.value_at(m, path), text, open_end=open_end)]
        if not data:
            if search.incomplete is not None and whole.get(search.incomplete) is True:
                # The search gave up early (GitHub's timed-out search): "none" is not an answer.
                return Indeterminate(f"search found nothing but says {search.incomplete}")
            return NotFound()
        if len(data) > 1:
            return Indeterminate(f"search found {len(data)} records for one key")
        (match,) = data
        if service.reference is not None and service.marker is None:
            # A search by the key finds records that hold it: one that holds another key, or
            # none where the key is written, is not this operation's.
            there, value = _encoding.value_at(match, service.reference)
            if not there:
                return Indeterminate("search found a record that does not hold the key")
            if value != key:
                return Indeterminate("search found a record holding another key")
        receipt, problem = self.receipt_of(match)
        if receipt is not None:
            return Found(receipt)
        return Indeterminate(f"search found a record with {problem}")

    def receipt_of(self, data: Any) -> tuple[Receipt | None, str | None]:
        if not isinstance(data, dict):
            return None, f"JSON that is not an object ({type(data).__name__})"
        missing = [f for f in self.fields if f not in data]
        if missing:
            return None, f"no receipt field(s) {', '.join(map(repr, missing))}"
        return {f: data[f] for f in self.fields}, None


def _holds(found: tuple[bool, Any], text: str, *, open_end: bool) -> bool:
    """Whether the text at ``found`` holds the marker ``text`` itself. Where the marker ends
    with the key (``open_end``), a longer key is not this one: ``intentlog-key: k.1`` is not
    held by a body that says ``intentlog-key: k.1.2``, so the next character must be one no
    key has (keys are printable ASCII without spaces) or the end."""
    there, value = found
    if not (there and isinstance(value, str)):
        return False
    if not open_end:
        return text in value
    return re.search(re.escape(text) + r"(?![!-~])", value) is not None


def _parse(body: bytes) -> tuple[Any, str | None]:
    try:
        return json.loads(body), None
    except ValueError:  # also UnicodeDecodeError
        return None, f"a body that is not JSON ({len(body)} bytes)"


def _detail(body: bytes) -> str:
    """A short, scrubbed message from an error answer (never its headers)."""
    text = body[:4096].decode("utf-8", "replace")
    with contextlib.suppress(ValueError):
        data = json.loads(body)
        error = data.get("error") if isinstance(data, dict) else None
        candidates = [error.get("message") if isinstance(error, dict) else None]
        if isinstance(data, dict):
            candidates += [data.get(k) for k in ("message", "detail", "title", "description")]
        candidates.append(error)
        text = next((c for c in candidates if isinstance(c, str) and c), text)
    return scrub_text(" ".join(text.split()), limit=200) or "no details"


def _check_url(url: str) -> None:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidInput(f"URL must be http:// or https:// with a host, got {_where(url)!r}")


def _with_key(url: str, key: str) -> str:
    return url.replace("{key}", urllib.parse.quote(key, safe=""))


# -- the builders ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Contract:
    """What an HTTP effect declares about its service: from a Service, or from keywords."""

    key: KeyPlace | None
    replay: Replay
    deduplicates: bool
    timeout: float
    effect: dict[str, Any]  # the keywords for Effect(...)
    service: Service | None = None


def _contract(
    name: str, url: str, service: Service | None, *, replay: Replay | None,
    key_header: str | None, caller: str = "http_effect", **options: Unpack[EffectOptions],
) -> _Contract:  # fmt: skip
    """The effect's contract: the options' rules are :func:`effect_contract`'s (``replay``
    and ``key_header`` are refused beside a service like them); where the key goes is
    HTTP's own."""
    if replay is not None and not isinstance(replay, Replay):
        raise InvalidInput(f"effect {name!r}: replay must be a Replay(...), got {replay!r}")
    contract = effect_contract(
        f"effect {name!r}", options, service, caller=caller,
        declared={"replay": replay, "key_header": key_header},
    )  # fmt: skip
    if service is None:
        header = "Idempotency-Key" if key_header is None else key_header
        if not isinstance(header, str) or not _TOKEN.match(header):
            raise InvalidInput(f"effect {name!r}: key_header {header!r} is no header name")
        return _Contract(
            KeyPlace.header(header), replay or Replay(), contract.idempotent, contract.timeout,
            dict(idempotent=contract.idempotent, key_retention=contract.key_retention,
                 timeout=contract.timeout, lookup_lag=contract.lookup_lag,
                 locks_in_flight=contract.locks_in_flight),
        )  # fmt: skip
    place = service.key
    if (
        place is not None
        and service.reference is not None
        and (place.kind == "metadata" or (place.kind == "body" and service.marker is not None))
    ):
        place = None  # the key rides in the body (the service's reference), nowhere else
    elif place is not None and place.kind in ("message_id", "metadata"):
        raise InvalidInput(
            f"effect {name!r}: service {service.name!r} takes the key as {place.kind} "
            f"({place.name!r}), which an HTTP request has no place for; name the header, body "
            "field or query parameter that carries it: service.replace(key=KeyPlace.body(...))"
        )
    if place is not None and place.kind == "resource" and "{key}" not in url:
        raise InvalidInput(
            f"effect {name!r}: service {service.name!r} takes the key as the resource's name, "
            "so the URL needs a {key} placeholder"
        )
    return _Contract(
        place, service.replay or Replay(), contract.idempotent, contract.timeout,
        dict(service=service, timeout=contract.timeout), service,
    )  # fmt: skip


def _spec(
    name: str, method: str, url: str, receipt: Sequence[str] | None, lookup: Lookup | None,
    contract: _Contract, in_progress_wait: Seconds | None, not_applied: Sequence[int],
    in_progress: Sequence[int], key_reused: Sequence[int],
) -> _Spec:  # fmt: skip
    if not isinstance(method, str) or method.upper() not in _METHODS:
        raise InvalidInput(f"effect {name!r}: method must be one of {_METHODS}, got {method!r}")
    _check_url(url)
    if receipt is None or isinstance(receipt, str) or not receipt:
        raise InvalidInput(f"effect {name!r}: receipt must be a non-empty list of field names")
    if not all(isinstance(f, str) and f for f in receipt):
        raise InvalidInput(f"effect {name!r}: receipt must be field names (strings)")
    if lookup is not None and not isinstance(lookup, Lookup):
        raise InvalidInput(f"effect {name!r}: lookup must be Lookup.by_key(...), got {lookup!r}")
    sets: dict[str, frozenset[int]] = {}
    for what, statuses in (
        ("not_applied", not_applied),
        ("in_progress", in_progress),
        ("key_reused", key_reused),
    ):
        codes = tuple(statuses)
        if not all(type(s) is int and 400 <= s < 500 for s in codes):
            raise InvalidInput(f"effect {name!r}: {what} must be 4xx status codes, got {codes!r}")
        sets[what] = frozenset(codes)
    if (sets["not_applied"] | sets["key_reused"]) & sets["in_progress"] or (
        sets["not_applied"] & sets["key_reused"]
    ):
        raise InvalidInput(f"effect {name!r}: a status may be in one of not_applied, "
                           "in_progress and key_reused only")  # fmt: skip
    # A replay status may also mean "in progress" (told apart by the receipt fields in the
    # body), never "not applied": a refusal that could be a success is no refusal.
    if both := sorted(sets["not_applied"] & set(contract.replay.statuses)):
        raise InvalidInput(f"effect {name!r}: status(es) {both} are replay statuses and in "
                           "not_applied; leave them out of not_applied")  # fmt: skip
    if contract.key is None:
        # A service that takes no key cannot say a key was reused: its 422 is a refusal.
        sets["not_applied"] |= sets["key_reused"]
        sets["key_reused"] = frozenset()
    wait = (
        None
        if in_progress_wait is None
        else seconds("in_progress_wait", in_progress_wait, bounded=False)
    )
    service = contract.service
    if service is not None and service.search is not None:
        service.search.url_for(url, "key")  # InvalidInput now for a segment the URL lacks
    # The service's key length is checked where every effect is made (Effect's constructor).
    if service is not None and lookup is None and service.search is not None:
        # The service's ready search (its URL is built per key by Search.url_for); a lookup
        # given to the effect wins.
        lookup = Lookup(service.search.url)
    return _Spec(
        name, method.upper(), url, tuple(receipt), lookup, contract.deduplicates,
        contract.timeout, contract.timeout if wait is None else wait, sets["not_applied"],
        sets["in_progress"], sets["key_reused"], contract.key, contract.replay, service,
    )  # fmt: skip


def http_effect(
    name: str, method: str, url: str, *, receipt: Sequence[str] | None = None,
    service: Service | None = None, lookup: Lookup | None = None, replay: Replay | None = None,
    not_applied: Sequence[int] = NOT_APPLIED, in_progress: Sequence[int] = (409,),
    key_reused: Sequence[int] = (422,), key_header: str | None = None,
    in_progress_wait: Seconds | None = None, client: httpx.Client | None = None,
    lazy_receipt: bool = False, **options: Unpack[EffectOptions],
) -> Effect:  # fmt: skip
    """An Effect that sends ``method url`` with the call's keyword arguments as a JSON body
    (``task.run(effect, json=value)`` sends ``value`` itself) and the operation key where the
    service takes it.

    ``service`` (an :class:`intentlog.Service`, such as ``intentlog.profiles.STRIPE``)
    declares where the key goes (a header, a body field, a query parameter, or the resource
    named by ``{key}`` in the URL), how long the service keeps it, whether it locks a key in
    flight, how a replay looks, how far its lookup lags and the request timeout; ``timeout``
    may override its deadline, and the other keywords below that it declares may not be
    given with it (InvalidInput names them). Without a service, the keywords declare it (the
    options of :class:`intentlog.EffectOptions`, checked as on :class:`intentlog.Effect`, and
    two of HTTP's own, ``replay`` and ``key_header``):
    ``idempotent`` and ``key_retention`` say the service deduplicates the key and for how
    long (given together: ``idempotent=True`` alone raises InvalidInput naming
    ``key_retention``; write ``intentlog.FOREVER`` for a service that keeps keys forever),
    ``locks_in_flight`` that it refuses a same-key request while the first one runs,
    ``lookup_lag`` how far its lookup lags a commit, ``replay`` how a replayed answer looks,
    and ``key_header`` (default ``Idempotency-Key``) carries the key.

    ``receipt`` (required) names the fields the receipt keeps, as on :class:`intentlog.Effect`,
    and that a 2xx answer (or a replay) must hold to count as an answer. ``lookup`` makes it
    reconcilable. ``timeout`` bounds every phase of each request (httpx's timeout) and is the
    deadline the decision counts with.
    Statuses in ``not_applied`` raise Rejected (FAILED), in ``key_reused`` KeyConflict. A
    status in ``in_progress`` (409 by default) or in the replay's statuses whose body holds
    every receipt field and is no error body (not ``application/problem+json``, no top-level
    ``error``/``errors`` member that is not a receipt field) is the original answer replayed,
    as django-idempotency-key answers a completed key: CONFIRMED with the receipt from that
    body. Any other ``in_progress`` answer is "in progress" and waited on, for up to
    ``in_progress_wait`` seconds (default: ``timeout``), by lookup or by resending the same
    key. Everything else that is not a 2xx with the receipt fields raises AmbiguousResponse.

    The body is sent as canonical JSON (sorted keys, no spaces), or as a canonical form
    where the service's ``encoding`` is ``"form"``, so the same call sends the same bytes
    whatever the order of its arguments. A service's ``reference``, ``key_max_length``,
    ``search`` (the lookup when ``lookup`` is not given) and ``key_reuse`` apply too (see
    :class:`intentlog.Service`); a body or key they refuse is refused before anything is
    sent (Rejected). ``client``: an httpx.Client to reuse
    (its headers carry credentials, its pool connections); the effect never closes it.
    Without one, each call opens and closes its own. Guarantee: the after_send crash point
    is passed once the request is written and before any of the answer is read.
    """
    httpx = _httpx()
    if client is not None and not isinstance(client, httpx.Client):
        raise InvalidInput(f"effect {name!r}: client must be an httpx.Client, got {client!r}")
    contract = _contract(name, url, service, replay=replay, key_header=key_header,
                         caller="http_effect", **options)  # fmt: skip
    spec = _spec(name, method, url, receipt, lookup, contract, in_progress_wait,
                 not_applied, in_progress, key_reused)  # fmt: skip

    def submit(key: str, /, **fields: Any) -> Receipt:
        with _sync_client(client) as c:
            return _drive_sync(spec.submit_flow(key, _call_body(fields)), c, spec)

    def reconcile(key: str) -> LookupResult:
        with _sync_client(client) as c:
            return _drive_sync(spec.lookup_flow(key), c, spec)

    return _effect(spec, contract, submit, reconcile, lazy_receipt)


def async_http_effect(
    name: str, method: str, url: str, *, receipt: Sequence[str] | None = None,
    service: Service | None = None, lookup: Lookup | None = None, replay: Replay | None = None,
    not_applied: Sequence[int] = NOT_APPLIED, in_progress: Sequence[int] = (409,),
    key_reused: Sequence[int] = (422,), key_header: str | None = None,
    in_progress_wait: Seconds | None = None, client: httpx.AsyncClient | None = None,
    lazy_receipt: bool = False, **options: Unpack[EffectOptions],
) -> Effect:  # fmt: skip
    """:func:`http_effect` for asyncio (``intentlog.open_async`` journals), on an
    httpx.AsyncClient; the same settings and the same mapping of answers to outcomes."""
    httpx = _httpx()
    if client is not None and not isinstance(client, httpx.AsyncClient):
        raise InvalidInput(f"effect {name!r}: client must be an httpx.AsyncClient, got {client!r}")
    contract = _contract(name, url, service, replay=replay, key_header=key_header,
                         caller="async_http_effect", **options)  # fmt: skip
    spec = _spec(name, method, url, receipt, lookup, contract, in_progress_wait,
                 not_applied, in_progress, key_reused)  # fmt: skip

    async def submit(key: str, /, **fields: Any) -> Receipt:
        async with _async_client(client) as c:
            return await _drive_async(spec.submit_flow(key, _call_body(fields)), c, spec)

    async def reconcile(key: str) -> LookupResult:
        async with _async_client(client) as c:
            return await _drive_async(spec.lookup_flow(key), c, spec)

    return _effect(spec, contract, submit, reconcile, lazy_receipt)


def _effect(
    spec: _Spec, contract: _Contract, submit: Callable[..., Any],
    reconcile: Callable[[str], Any], lazy_receipt: bool,
) -> Effect:  # fmt: skip
    return Effect(
        spec.name,
        submit,
        reconcile=reconcile if spec.lookup is not None else None,
        receipt=list(spec.fields),
        lazy_receipt=lazy_receipt,
        **contract.effect,
    )
