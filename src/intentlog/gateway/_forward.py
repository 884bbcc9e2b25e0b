"""One forwarded request as an effect: the client's request with the operation key placed
where the route's service takes it, and the upstream's answer as the receipt.

The answers are read by :class:`intentlog.integrations.http._Spec`, the mapping every HTTP
effect uses (replays, "in progress" waits, refusals, answer errors inside a 200, lookups and
searches), with three differences a gateway needs: the request is the client's (its bytes
forwarded as they came, unless the key must be written into the body), any 2xx answer is the
answer (the client, not the gateway, reads its fields), and the receipt is the whole answer
(status, media type, a few headers and the body), so a repeat gets what the first request got.
A record found by a lookup is the receipt of a reconciled request: its body is that record.

Credentials never reach the journal: request headers are forwarded and never recorded, and of
the answer's headers only the few in :data:`KEPT_HEADERS` are kept. The receipt is cleaned by
the journal's hygiene like any other (secret-looking values redacted, bounded in size).
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import functools
import hashlib
import json
import re
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, cast

from intentlog._effect import Effect
from intentlog._errors import Rejected
from intentlog._flow import drive_async
from intentlog._model import LookupResult
from intentlog._service import Service
from intentlog.integrations import AmbiguousResponse, _encoding
from intentlog.integrations._http_runner import _Answer, _exchange_async, _Flow, _Pause, _Send
from intentlog.integrations.http import Receipt, _Contract, _Spec, _spec

if TYPE_CHECKING:
    from intentlog.gateway._relay import Relay, RelayResponse
    from intentlog.gateway._routes import Route

__all__ = ["KEPT_HEADERS", "Incoming", "Upstream", "effect_for", "receipt_answer"]

#: The answer headers a receipt keeps (everything else, ``Set-Cookie`` first, is dropped).
KEPT_HEADERS = frozenset(
    {
        "content-type",
        "location",
        "request-id",
        "x-request-id",
        "etag",
        "x-github-request-id",
        "idempotent-replayed",
    }
)
#: The marker of a receipt that holds an HTTP answer (a person's receipt does not).
ANSWER = "http"
#: The largest answer body a receipt keeps whole (the journal bounds a receipt at 64 KiB).
MAX_KEPT_BODY = 32 * 1024
_FROM_ANSWER: Receipt = {}  # the answer itself is the receipt (compared by identity)


@dataclasses.dataclass(frozen=True)
class Incoming:
    """A client's request as the gateway forwards it: ``headers`` are already filtered (no
    hop-by-hop header, no ``Intentlog-*``, no ``Host``)."""

    method: str
    path: str
    query: str
    headers: tuple[tuple[str, str], ...]
    body: bytes

    @property
    def media(self) -> str:
        for name, value in self.headers:
            if name.lower() == "content-type":
                return value.split(";")[0].strip().lower()
        return ""


class NotSent(Rejected):
    """The request's first send ever could not connect to the service: nothing was sent."""


@dataclasses.dataclass
class Upstream:
    """The last exchange's answer as it came: what the client is given the first time."""

    status: int = 0
    headers: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    body: bytes = b""
    answered: bool = False
    truncated: bool = False  # the body was over the runner's bound: only its start is here
    sends: int = 0  # submit requests begun by this effect
    asked: bool = False  # the service was asked anything (a send, a lookup, a search)
    key: str = ""  # the key being sent
    #: Whether the send of a key under way is its first ever (asked of the journal only
    #: when a send could not connect): None, never assumed so.
    first_send: Callable[[str], Awaitable[bool]] | None = None


@dataclasses.dataclass(frozen=True)
class _GatewaySpec(_Spec):
    incoming: Incoming | None = None

    def request(self, key: str, body: Any) -> _Send:
        incoming = self.incoming
        assert incoming is not None
        headers = {name: value for name, value in incoming.headers}
        url = self.url
        content = incoming.body
        place, service = self.key, self.service
        limit = service.key_max_length if service is not None else None
        if limit is not None and len(key) > limit:
            raise Rejected(
                f"route {self.name!r}: key {key[:40]!r}... is {len(key)} characters; the "
                f"service takes at most {limit}; nothing was sent",
                key=key,
            )
        if place is not None and place.kind == "header":
            for name in [n for n in headers if n.lower() == place.name.lower()]:
                del headers[name]  # the client's own key gives way to the operation's
            headers[place.name] = key
        elif place is not None and place.kind == "query":
            split = urllib.parse.urlsplit(url)
            pairs = [
                (n, v)
                for n, v in urllib.parse.parse_qsl(split.query, keep_blank_values=True)
                if n != place.name
            ]
            url = split._replace(query=urllib.parse.urlencode([*pairs, (place.name, key)])).geturl()
        into_body = (place is not None and place.kind == "body") or (
            service is not None and (service.reference is not None or service.pinned)
        )
        if into_body:
            content = self._with_key_in_body(key, incoming)
        return _Send(self.method, url, content, headers, True)

    def _with_key_in_body(self, key: str, incoming: Incoming) -> bytes:
        """The client's body with the key written where the service reads it. A JSON body
        is rewritten canonically (the same request gives the same bytes); a form gets the
        key's field appended, the client's bytes kept. Refused (Rejected, nothing sent)
        where the body cannot carry it."""
        service, place = self.service, self.key
        media = incoming.media
        try:
            if media == _encoding.FORM and service is not None and service.reference is not None:
                if service.marker is not None or service.pinned:
                    raise _encoding.Unsendable("a form cannot carry this service's marker")
                pairs = urllib.parse.parse_qsl(incoming.body.decode(), keep_blank_values=True)
                field = _encoding.form(_encoding.with_reference({}, service.reference, key))
                name = urllib.parse.unquote_plus(field.split("=", 1)[0])
                if any(n == name and v != key for n, v in pairs):
                    raise _encoding.Unsendable(f"the form already has a field {name!r}")
                if any(n == name for n, _ in pairs):
                    return incoming.body
                joined = incoming.body + b"&" if incoming.body else b""
                return joined + field.encode("ascii")
            if media != _encoding.JSON and not media.endswith("+json"):
                raise _encoding.Unsendable(
                    f"the key is written into the body, which must then be JSON or a form, "
                    f"not {media or 'without a Content-Type'}"
                )
            body = json.loads(incoming.body or b"null")
            if place is not None and place.kind == "body":
                if not isinstance(body, dict):
                    raise _encoding.Unsendable("the key's body field needs a JSON object")
                if body.get(place.name, key) != key:
                    raise _encoding.Unsendable(f"the body already has a field {place.name!r}")
                body = {**body, place.name: key}
            if service is not None and service.pinned:
                body = _encoding.with_pinned(body, service.pinned)
            if service is not None and service.reference is not None:
                body = _encoding.with_reference(
                    body, service.reference, key, service.marker, service.marker_place
                )
            return _encoding.encode(body, "json", what="the request body")[0]
        except (_encoding.Unsendable, ValueError, UnicodeDecodeError) as exc:
            raise Rejected(f"route {self.name!r}: {exc}; nothing was sent", key=key) from None

    def lookup_flow(self, key: str) -> _Flow[LookupResult]:
        # The lookup asks with the client's own credentials (this request's headers, never
        # journaled): the gateway holds none of its own.
        assert self.incoming is not None
        media = {"content-type", "content-length", "content-encoding"}
        ours = {self.key.name.lower()} if self.key is not None else set()
        headers = {n: v for n, v in self.incoming.headers if n.lower() not in media | ours}
        flow = super().lookup_flow(key)
        try:
            step = next(flow)
            while True:
                if isinstance(step, _Send):
                    step = dataclasses.replace(step, headers={**headers, **step.headers})
                try:
                    answer = yield step
                except Exception as exc:  # no answer: the flow reads it as Indeterminate
                    step = flow.throw(exc)
                    continue
                step = flow.send(answer)
        except StopIteration as stop:
            result: LookupResult = stop.value
            return result

    def receipt_in(self, answer: _Answer) -> tuple[Receipt | None, str]:
        # The client reads the answer's fields; any 2xx answer is the answer (one over the
        # runner's bound is kept as its size, see recorded()).
        return _FROM_ANSWER, ""

    def replayed_receipt(self, answer: _Answer) -> Receipt | None:
        # A non-2xx replay status is the first answer replayed only when it is no error
        # body (see _Spec.replayed_receipt); a body that is not JSON cannot be told apart
        # from "in progress", so it is not taken for one.
        if answer.problem or answer.truncated or not answer.replayed:
            # Only the service's own replay mark says so: a 409 body without an error
            # member is no proof (GitHub's {"message": "Merge conflict"} is a refusal).
            return None
        try:
            data = json.loads(answer.body)
        except ValueError:
            return None
        if not isinstance(data, dict) or "error" in data or "errors" in data:
            return None
        return _FROM_ANSWER

    def receipt_of(self, data: Any) -> tuple[Receipt | None, str | None]:
        # A record a lookup or a search found: the reconciled request's answer.
        if not isinstance(data, dict):
            return None, f"JSON that is not an object ({type(data).__name__})"
        answer = {"status": 200, "content_type": "application/json", "headers": {}, "body": data}
        return {ANSWER: answer, "reconciled": True}, None


def effect_for(
    route: Route,
    incoming: Incoming,
    client: Relay,
    *,
    first_send: Callable[[str], Awaitable[bool]] | None = None,
) -> tuple[Effect, Upstream, _GatewaySpec]:
    """The effect that forwards ``incoming`` on ``route`` (made per request: its URL is the
    request's). Its receipt is the upstream's answer (:func:`receipt_answer` reads it back);
    the answer as it came is also kept, in the :class:`Upstream` returned beside it, for
    the first reply, and the spec, whose :meth:`_GatewaySpec.request` the caller may run
    before journaling anything (it refuses a body the service cannot take, sending nothing).

    A profile writes the key into the body and looks it up by its search only for the
    requests that search covers (:func:`covered`): on any other request of the route its
    service is the plain one, deduplicating by its header where it has one, else neither."""
    url = route.target(incoming.path, incoming.query)
    path = urllib.parse.urlsplit(url).path
    whole = route.service is None or covered(route.service, incoming.method, path, incoming.body)
    contract, template = _template(route, incoming.method, url, whole=whole)
    spec = dataclasses.replace(template, url=url, incoming=incoming)
    upstream = Upstream(first_send=first_send)

    # Its one argument named plainly: the effect binds it without inspect's general binding.
    async def submit(key: str, /, request: Any = None) -> Receipt:
        upstream.key, upstream.asked = key, True
        receipt = await drive_async(
            spec.submit_flow(key, None), functools.partial(_exchange, client, spec, upstream)
        )
        if receipt is _FROM_ANSWER:
            return {ANSWER: recorded(upstream)}
        return receipt  # a lookup found it while the service was still working on the key

    async def reconcile(key: str) -> Any:
        upstream.asked = True
        return await drive_async(
            spec.lookup_flow(key), functools.partial(_exchange, client, spec, Upstream())
        )

    effect = Effect(
        route.effect,
        submit,
        reconcile=reconcile if spec.lookup is not None else None,
        store_args=_shown,
        **contract.effect,
    )
    return effect, upstream, spec


#: Per route, method and service (whole or plain), and whether the URL holds ``{key}``: the
#: checked contract and the spec without its URL, made at the first such request. They
#: depend on nothing else of a request; the route is kept beside them (its id is the key).
_TEMPLATES: dict[tuple[int, str, bool, bool], tuple[Route, _Contract, _GatewaySpec]] = {}


def _template(
    route: Route, method: str, url: str, *, whole: bool
) -> tuple[_Contract, _GatewaySpec]:
    """The contract and spec template of a request to ``url`` (InvalidInput, never kept,
    where it is not usable)."""
    cache = (id(route), method, whole, "{key}" in url)
    found = _TEMPLATES.get(cache)
    if found is not None and found[0] is route:
        return found[1], found[2]
    service = route.service if whole or route.service is None else plain(route.service)
    contract = route.contract(url, service)
    base = _spec(
        route.effect, method, url, ("_",), route.lookup_for(), contract, None,
        route.not_applied, route.in_progress, route.key_reused,
    )  # fmt: skip
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
    template = _GatewaySpec(**{**fields, "fields": ()}, incoming=None)
    _TEMPLATES[cache] = (route, contract, template)
    return contract, template


#: The requests each profile's search covers (POST to these upstream paths): only there is
#: the key written into the body and the search asked. Sources: the profiles' own notes
#: (intentlog.profiles): Stripe's search covers these collections, GitHub's issues and pulls.
_COVERS = {
    "stripe": re.compile(
        r"/v1/(charges|customers|invoices|payment_intents|prices|products|subscriptions)/?"
    ),
    "github-rest": re.compile(r"/repos/[^/]+/[^/]+/(issues|pulls)/?"),
    "paypal-orders-v2": re.compile(r"/v2/checkout/orders/?"),
    "adyen": re.compile(r"(/v\d+)?/payments/?"),
    "slack": re.compile(r"(/api)?/chat\.postMessage"),
    "shopify-graphql": re.compile(r".*/graphql\.json"),
}


def covered(service: Service, method: str, path: str, body: bytes) -> bool:
    """Whether the profile's key-in-body and search apply to this request: a POST with a
    body to a path its search covers (any path, for a profile not in :data:`_COVERS`)."""
    if method != "POST" or not body:
        return False
    pattern = _COVERS.get(service.name)
    return pattern is None or pattern.fullmatch(path) is not None


def plain(service: Service) -> Service:
    """The service without what it writes into a body or searches: its header or query key
    only, if it has one (else it can neither deduplicate nor be asked)."""
    key = (
        service.key if service.key is not None and service.key.kind in ("header", "query") else None
    )
    return service.replace(
        key=key, reference=None, marker=None, search=None, pinned=(), lookup=None,
        retention=service.retention if key is not None else None,
        locks_in_flight=service.locks_in_flight if key is not None else False,
        replay=service.replay if key is not None else None, key_reuse=None,
    )  # fmt: skip


def _shown(args: dict[str, Any]) -> dict[str, Any]:
    """What ``intentlog show`` shows of a request: its method and the route's prefix. The
    path, the query and the body may hold personal data or credentials (a webhook's token,
    a bot token in the path), so they are journaled only as the digest the fingerprint is."""
    request = args.get("request", {})
    return {"method": request.get("method"), "route": request.get("route")}


async def _exchange(
    client: Relay, spec: _GatewaySpec, upstream: Upstream, step: _Send | _Pause
) -> _Answer | None:
    """Perform one step of the flow (as the HTTP effect's async runner does), keeping the
    answer's status, headers and body for the client."""
    if isinstance(step, _Pause):
        await asyncio.sleep(step.seconds)
        return None
    seen: list[RelayResponse] = []

    async def hook(response: RelayResponse) -> None:
        seen.append(response)

    hooked = cast("httpx.AsyncClient", _Hooked(client, hook))  # send and build_request only
    sends_before = upstream.sends
    if step.mark_sent:
        upstream.sends += 1
    try:
        answer = await _exchange_async(hooked, spec, step)
    except AmbiguousResponse as exc:
        import httpx

        unconnected = isinstance(exc.__cause__, httpx.ConnectError | httpx.ConnectTimeout)
        if (
            unconnected
            and step.mark_sent
            and sends_before == 0
            and upstream.first_send is not None
            and await upstream.first_send(upstream.key)
        ):
            # No connection was made, so no byte of the request left: and no earlier send of
            # this key exists (the journal counts this one attempt). Not applied, and known
            # so: FAILED, and the same request again is a new attempt once the service can
            # be reached.
            raise NotSent(f"{exc}; no connection was made, so nothing was sent") from exc
        raise
    if answer is not None and seen:
        upstream.status = answer.status
        upstream.headers = list(seen[-1].headers.multi_items())
        upstream.body = answer.body
        upstream.answered = True
        upstream.truncated = answer.truncated
    return answer


class _Hooked:
    """The client, with a hook that sees each response's headers (the runner keeps the
    status and the body only)."""

    def __init__(self, client: Relay, hook: Any) -> None:
        self._client, self._hook = client, hook

    def build_request(self, *args: Any, **kwargs: Any) -> Any:
        return self._client.build_request(*args, **kwargs)

    async def send(self, request: Any, **kwargs: Any) -> Any:
        response = await self._client.send(request, **kwargs)
        await self._hook(response)
        return response


def recorded(upstream: Upstream) -> dict[str, Any]:
    """The answer as the journal keeps it: status, media type, the kept headers and the body
    (JSON as JSON, text as text, anything else base64)."""
    headers = {n.lower(): v for n, v in upstream.headers if n.lower() in KEPT_HEADERS}
    media = headers.get("content-type", "").split(";")[0].strip().lower()
    answer: dict[str, Any] = {
        "status": upstream.status,
        "content_type": headers.pop("content-type", ""),
        "headers": headers,
    }
    if len(upstream.body) > MAX_KEPT_BODY or upstream.truncated:
        # Kept as its size and digest: a repeat is told the body is not kept, never given
        # a cut one (the journal's own bound would replace the whole receipt by a note).
        answer["omitted"] = {
            "bytes": len(upstream.body),
            "sha256": hashlib.sha256(upstream.body).hexdigest(),
        }
        if upstream.truncated:  # not the whole body: its size is "more than this"
            answer["omitted"] = {"bytes_over": len(upstream.body)}
        return answer
    if media == "application/json" or media.endswith("+json"):
        try:
            answer["body"] = json.loads(upstream.body) if upstream.body else None
            return answer
        except ValueError:
            pass
    try:
        answer["text"] = upstream.body.decode("utf-8")
    except UnicodeDecodeError:
        answer["base64"] = base64.b64encode(upstream.body).decode("ascii")
    return answer


def receipt_answer(receipt: Any) -> tuple[int, str, dict[str, str], bytes]:
    """The reply a receipt gives: status, media type, headers, body. A receipt that holds no
    HTTP answer (a person's, from ``intentlog resolve --confirmed --receipt``) is given as
    200 with that receipt as its JSON body."""
    answer = receipt.get(ANSWER) if isinstance(receipt, dict) else None
    if not isinstance(answer, dict) or not isinstance(answer.get("status"), int):
        body = json.dumps(receipt, separators=(",", ":")).encode()
        return 200, "application/json", {}, body
    headers = {str(k): str(v) for k, v in (answer.get("headers") or {}).items()}
    media = str(answer.get("content_type") or "")
    if "body" in answer:
        body = b"" if answer["body"] is None else json.dumps(answer["body"]).encode()
        media = media or "application/json"
    elif "text" in answer:
        body = str(answer["text"]).encode()
    elif "base64" in answer:
        body = base64.b64decode(str(answer["base64"]))
    elif "omitted" in answer:
        omitted = {"replay": "the answer's body was over the gateway's bound and is not kept",
                   **dict(answer["omitted"])}  # fmt: skip
        media, body = "application/json", json.dumps({"intentlog": omitted}).encode()
    else:
        body = b""
    return answer["status"], media, headers, body
