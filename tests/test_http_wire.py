"""What an HTTP effect sends and reads as its service declares it, against a small Stripe-like
server on 127.0.0.1 that parses what it receives (the form body with parse_qsl) and a real
SQLite journal:

- a form-encoded body, canonical (sorted, nested as Stripe's library writes it), with the
  key also in ``metadata[intentlog_key]``; values a form cannot carry are refused unsent;
- the key length limit, at declaration and for an explicit key;
- the ready search lookup: one match Found, none NotFound, two Indeterminate;
- Stripe's answers: 400 ``idempotency_error`` is KeyConflict with its message, 409
  ``idempotency_key_in_use`` is "in progress" and waited on, a 200 marked
  ``Idempotent-Replayed: true`` confirms.
"""

from __future__ import annotations

import asyncio
import http.server
import json
import re
import threading
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

import intentlog
from intentlog import profiles
from intentlog.integrations import _encoding
from intentlog.integrations.http import async_http_effect, http_effect

FORM = "application/x-www-form-urlencoded"
_QUERY = re.compile(r"^metadata\['intentlog_key'\]:'(.*)'$")


@dataclass
class Received:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes

    def form(self) -> list[tuple[str, str]]:
        assert self.headers.get("content-type") == FORM, self.headers
        return urllib.parse.parse_qsl(self.body.decode("ascii"), strict_parsing=True)


@dataclass
class Stripe:
    """A charges API: creates a charge per POST (unless an answer is scripted), finds
    charges by ``metadata['intentlog_key']`` at ``/v1/charges/search``."""

    url: str = ""
    received: list[Received] = field(default_factory=list)
    charges: list[dict[str, Any]] = field(default_factory=list)
    scripted: list[tuple[int, Any, dict[str, str]]] = field(default_factory=list)
    apply_scripted: bool = False  # a scripted answer still creates the charge (a lost reply)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def posts(self) -> list[Received]:
        return [r for r in self.received if r.method == "POST"]

    def searches(self) -> list[Received]:
        return [r for r in self.received if r.method == "GET"]

    def create(self, fields: dict[str, str]) -> dict[str, Any]:
        metadata = {
            m.group(1): v for k, v in fields.items() if (m := re.match(r"metadata\[(.+)\]$", k))
        }
        charge = {"id": f"ch_{len(self.charges) + 1}", "metadata": metadata,
                  "amount": fields.get("amount")}  # fmt: skip
        self.charges.append(charge)
        return charge


def handler(state: Stripe) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def reply(self, status: int, body: Any, headers: dict[str, str]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        def record(self, body: bytes) -> Received:
            split = urllib.parse.urlsplit(self.path)
            seen = Received(self.command, split.path, urllib.parse.parse_qs(split.query),
                            {k.lower(): v for k, v in self.headers.items()}, body)  # fmt: skip
            with state.lock:
                state.received.append(seen)
            return seen

        def do_GET(self) -> None:
            seen = self.record(b"")
            if seen.path != "/v1/charges/search":
                self.reply(404, {"error": {"message": "no such route"}}, {})
                return
            (query,) = seen.query["query"]
            match = _QUERY.match(query)
            assert match, query
            with state.lock:
                found = [c for c in state.charges if c["metadata"].get("intentlog_key") == match[1]]
            self.reply(200, {"object": "search_result", "data": found}, {})

        def do_POST(self) -> None:
            seen = self.record(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
            with state.lock:
                script = state.scripted.pop(0) if state.scripted else None
            fields: dict[str, str] = {}
            if seen.headers.get("content-type") == FORM:
                fields = dict(seen.form())
            if script is not None:
                if state.apply_scripted:
                    with state.lock:
                        state.create(fields)
                self.reply(*script)
                return
            with state.lock:
                charge = state.create(fields)
            self.reply(200, charge, {})

    return Handler


@pytest.fixture
def stripe() -> Iterator[Stripe]:
    state = Stripe()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler(state))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def charge_effect(stripe: Stripe, **settings: Any) -> intentlog.Effect:
    service = settings.pop("service", profiles.STRIPE)
    return http_effect("charge", "POST", stripe.url + "/v1/charges", receipt=["id"],
                       service=service, **settings)  # fmt: skip


def ops(path: Path) -> list[intentlog.Operation]:
    with intentlog.open(path) as journal:
        return list(journal.operations())


# -- the form body ----------------------------------------------------------------------------


def test_a_stripe_charge_is_form_encoded_with_the_key_in_metadata(
    tmp_path: Path, stripe: Stripe
) -> None:
    charge = charge_effect(stripe)
    args: dict[str, Any] = dict(
        amount=500, currency="usd", capture=False, description=None,
        metadata={"order": "42", "note": "a b&c"}, expand=["customer", "invoice"],
        items=[{"price": "p_1", "quantity": 2}], level={"b": {"c": 1.5}},
    )  # fmt: skip
    with intentlog.open(tmp_path / "a.db") as journal, journal.task("order-42") as task:
        assert task.run(charge, **args) == {"id": "ch_1"}
    # The same call, its arguments in another order, in a fresh journal: the same key and
    # the same bytes (the server replays nothing here, so it creates a second charge).
    with intentlog.open(tmp_path / "b.db") as journal, journal.task("order-42") as task:
        task.run(charge, **dict(reversed(list(args.items()))))
    first, again = stripe.posts()
    (op,) = ops(tmp_path / "a.db")
    assert first.body == again.body
    assert first.headers["idempotency-key"] == again.headers["idempotency-key"] == op.key
    assert first.form() == [
        ("amount", "500"),
        ("capture", "false"),
        ("currency", "usd"),
        ("expand[0]", "customer"),
        ("expand[1]", "invoice"),
        ("items[0][price]", "p_1"),
        ("items[0][quantity]", "2"),
        ("level[b][c]", "1.5"),
        ("metadata[intentlog_key]", op.key),
        ("metadata[note]", "a b&c"),
        ("metadata[order]", "42"),
    ]  # sorted at every level; None (description) left out, as stripe-python does
    assert first.body.startswith(b"amount=500&capture=false&currency=usd&expand%5B0%5D=")
    assert op.state is intentlog.State.CONFIRMED


def test_the_form_encoder_follows_stripes_library() -> None:
    assert _encoding.form({"b": True, "a": {"y": [1, 2], "x": None}, "e": [], "f": {}}) == (
        "a%5By%5D%5B0%5D=1&a%5By%5D%5B1%5D=2&b=true"
    )
    assert _encoding.form({"n": 10**20, "f": 0.1, "s": "é"}) == (
        "f=0.1&n=100000000000000000000&s=%C3%A9"
    )
    for bad, why in (
        ({"a": [[1]]}, "array inside an array"),
        ({"a": {"b[c]": 1}}, "would read as nesting"),
        ({"a": float("inf")}, "cannot carry"),
        ([1, 2], "JSON object of named fields"),
    ):
        with pytest.raises(_encoding.Unsendable, match=why):
            _encoding.form(bad)


def test_values_a_form_cannot_carry_are_refused_unsent(tmp_path: Path, stripe: Stripe) -> None:
    charge = charge_effect(stripe)
    with intentlog.open(tmp_path / "j.db") as journal, journal.task("o") as task:
        with pytest.raises(intentlog.Rejected, match=r"grid\[0\] is an array inside an array"):
            task.run(charge, amount=5, grid=[[1, 2]])
        with pytest.raises(intentlog.Rejected, match="would read as nesting"):
            task.run(charge, amount=6, metadata={"a[b]": "x"})
        with pytest.raises(intentlog.Rejected, match="must be a JSON object, not an array"):
            task.run(charge, json=[1, 2])
        with pytest.raises(intentlog.InvalidInput, match="JSON"):
            task.run(charge, amount=float("nan"))  # refused before any intent is written
    assert {op.state for op in ops(tmp_path / "j.db")} == {intentlog.State.FAILED}
    assert all("nothing was sent" in str(op.error) for op in ops(tmp_path / "j.db"))
    assert stripe.received == []


# -- the key in the body, and its length --------------------------------------------------------


def test_the_key_in_the_body_must_not_differ_from_the_operation_key(
    tmp_path: Path, stripe: Stripe
) -> None:
    charge = charge_effect(stripe)
    with intentlog.open(tmp_path / "j.db") as journal, journal.task("o") as task:
        with pytest.raises(intentlog.Rejected, match=r"another value at metadata.intentlog_key"):
            task.run(charge, amount=5, metadata={"intentlog_key": "someone-else"})
        assert stripe.received == []  # nothing was sent
        receipt = task.run(charge, key="pay-1", amount=5, metadata={"intentlog_key": "pay-1"})
    assert receipt == {"id": "ch_1"}
    (post,) = stripe.posts()
    assert ("metadata[intentlog_key]", "pay-1") in post.form()


def test_a_service_key_limit_is_checked_at_declaration_and_before_sending(
    tmp_path: Path, stripe: Stripe
) -> None:
    url = stripe.url + "/v1/payments"
    long_name = "authorise-the-payment-for-the-customer-order"  # its keys: 40 + 33 characters
    with pytest.raises(intentlog.InvalidInput) as caught:
        http_effect(long_name, "POST", url, receipt=["id"], service=profiles.ADYEN)
    message = str(caught.value)
    for part in (long_name, "'adyen'", "64", "73", "shorter name= (at most 31"):
        assert part in message, message
    with pytest.raises(intentlog.InvalidInput, match="adyen"):
        async_http_effect(long_name, "POST", url, receipt=["id"], service=profiles.ADYEN)
    http_effect(long_name, "POST", url, receipt=["id"], service=profiles.STRIPE)  # 255 is room

    pay = http_effect("pay", "POST", url, receipt=["id"], service=profiles.ADYEN)
    with intentlog.open(tmp_path / "j.db") as journal, journal.task("o") as task:
        with pytest.raises(intentlog.Rejected, match=r"65 characters; service 'adyen' takes at"):
            task.run(pay, key="k" * 65, amount=5)
        (op,) = journal.operations()
        assert op.state is intentlog.State.FAILED
        task.run(pay, key="k" * 64, amount=5)  # at the limit: sent, JSON with the key
    assert len(stripe.received) == 1
    (post,) = stripe.posts()
    assert post.headers["content-type"] == "application/json"
    assert json.loads(post.body) == {"amount": 5, "metadata": {"intentlog_key": "k" * 64}}


# -- the ready search ---------------------------------------------------------------------------


def test_the_profiles_search_finds_one_none_or_too_many(stripe: Stripe) -> None:
    charge = charge_effect(stripe)
    assert charge.reconcile is not None
    assert charge.reconcile("k-1") == intentlog.NotFound()
    stripe.charges.append({"id": "ch_9", "metadata": {"intentlog_key": "k-1"}})
    assert charge.reconcile("k-1") == intentlog.Found({"id": "ch_9"})
    stripe.charges.append({"id": "ch_10", "metadata": {"intentlog_key": "k-1"}})
    found = charge.reconcile("k-1")
    assert isinstance(found, intentlog.Indeterminate) and "2 records" in found.reason
    (first, *_) = stripe.searches()
    assert first.path == "/v1/charges/search"
    assert first.query == {"query": ["metadata['intentlog_key']:'k-1'"]}
    # An explicit lookup wins over the profile's search.
    mine = charge_effect(stripe, lookup=intentlog.integrations.http.Lookup.by_key(
        stripe.url + "/v1/charges/{key}"))  # fmt: skip
    assert mine.reconcile is not None
    assert isinstance(mine.reconcile("k-1"), intentlog.NotFound)  # 404 from that route
    assert stripe.received[-1].path == "/v1/charges/k-1"


def test_a_search_match_holding_another_key_is_never_taken(stripe: Stripe) -> None:
    charge = charge_effect(stripe)
    assert charge.reconcile is not None
    # A search that ignored its query would list another operation's charge.
    stripe.charges.append({"id": "ch_1", "metadata": {"intentlog_key": "k-1"}})
    wrong = profiles.STRIPE.replace(
        search=intentlog.Search("{url}/search?query=metadata['intentlog_key']:'k-1'&k={key}",
                                results="data"))  # fmt: skip
    other = charge_effect(stripe, service=wrong)
    assert other.reconcile is not None
    found = other.reconcile("k-2")
    assert isinstance(found, intentlog.Indeterminate) and "another key" in found.reason


def test_a_lost_answer_is_settled_by_the_search_without_a_resend(
    tmp_path: Path, stripe: Stripe
) -> None:
    """The charge is created but its answer is a 500: the operation is reconciled by the
    profile's search and confirmed with the charge it finds, with no second POST."""
    stripe.scripted.append((500, {"error": {"message": "boom"}}, {}))
    stripe.apply_scripted = True
    charge = charge_effect(stripe)
    with intentlog.open(tmp_path / "j.db") as journal, journal.task("o") as task:
        assert task.run(charge, amount=7) == {"id": "ch_1"}
    assert len(stripe.posts()) == 1 and len(stripe.searches()) == 1
    (op,) = ops(tmp_path / "j.db")
    assert op.state is intentlog.State.CONFIRMED and op.receipt == {"id": "ch_1"}


# -- Stripe's answers ---------------------------------------------------------------------------

IDEMPOTENCY_ERROR = {
    "error": {
        "type": "idempotency_error",
        "message": "Keys for idempotent requests can only be used with the same parameters "
        "they were first used with.",
    }
}


def test_a_reused_key_is_a_key_conflict_with_the_services_message(
    tmp_path: Path, stripe: Stripe
) -> None:
    stripe.scripted.append((400, IDEMPOTENCY_ERROR, {}))
    charge = charge_effect(stripe)
    with intentlog.open(tmp_path / "j.db") as journal, journal.task("o") as task:
        with pytest.raises(intentlog.KeyConflict, match="only be used with the same parameters"):
            task.run(charge, amount=5)
        # Any other 400 is still the refusal it says it is.
        unknown = {"type": "invalid_request_error", "message": "Received unknown parameter"}
        stripe.scripted.append((400, {"error": unknown}, {}))
        with pytest.raises(intentlog.Rejected, match="Received unknown parameter") as refused:
            task.run(charge, amount=6)
        assert not isinstance(refused.value, intentlog.KeyConflict)
    assert len(stripe.posts()) == 2


def test_key_in_use_409_is_waited_on_and_a_marked_replay_confirms(
    tmp_path: Path, stripe: Stripe
) -> None:
    in_use = {"error": {"type": "invalid_request_error", "code": "idempotency_key_in_use",
                        "message": "There is currently another in-progress request using "
                                   "this Stripe API key and idempotency key."}}  # fmt: skip
    stripe.scripted += [
        (409, in_use, {}),
        (200, {"id": "ch_7", "metadata": {}}, {"Idempotent-Replayed": "true"}),
    ]
    charge = charge_effect(stripe)
    with intentlog.open(tmp_path / "j.db") as journal, journal.task("o") as task:
        assert task.run(charge, amount=5) == {"id": "ch_7"}
    first, second = stripe.posts()
    assert first.body == second.body
    assert first.headers["idempotency-key"] == second.headers["idempotency-key"]
    assert len(stripe.searches()) == 1  # asked once while waiting; none yet, so resent
    (op,) = ops(tmp_path / "j.db")
    assert op.state is intentlog.State.CONFIRMED and op.receipt == {"id": "ch_7"}


def test_the_async_effect_sends_the_same_form_and_searches(tmp_path: Path, stripe: Stripe) -> None:
    url = stripe.url + "/v1/charges"
    charge = async_http_effect("charge", "POST", url, receipt=["id"], service=profiles.STRIPE)
    sync = charge_effect(stripe)

    async def main() -> Any:
        async with intentlog.open_async(tmp_path / "a.db") as journal, journal.task("o") as task:
            return await task.run(charge, amount=5, metadata={"order": "1"})

    assert asyncio.run(main()) == {"id": "ch_1"}
    with intentlog.open(tmp_path / "s.db") as journal, journal.task("o") as task:
        task.run(sync, metadata={"order": "1"}, amount=5)
    first, second = stripe.posts()
    assert first.body == second.body and first.headers["content-type"] == FORM
    assert charge.reconcile is not None
    found = asyncio.run(charge.reconcile(first.headers["idempotency-key"]))
    assert found == intentlog.Indeterminate("search found 2 records for one key")


def test_service_wire_fields_are_validated_and_kept_by_replace() -> None:
    search = intentlog.Search("{url}/search?q={key}", results="data")
    reuse = intentlog.KeyReuse((400,), ("error", "type"), "x")
    service = intentlog.Service("api", key=intentlog.KeyPlace.header("Idempotency-Key"),
                                retention=60, lookup="reference", encoding="form",
                                reference=("metadata", "k"), key_max_length=80, search=search,
                                key_reuse=reuse)  # fmt: skip
    again = service.replace(timeout=5)
    assert (again.encoding, again.reference) == ("form", ("metadata", "k"))
    assert again.key_max_length == 80
    assert again.search == search and again.key_reuse == service.key_reuse
    bad: list[tuple[dict[str, Any], str]] = [
        ({"encoding": "xml"}, "encoding must be 'json' or 'form'"),
        ({"reference": ()}, "reference must be a path"),
        ({"reference": (0, "k")}, "reference must be a path"),
        ({"reference": ("a[b]",)}, "reference must be a path"),
        ({"key_max_length": 0}, "key_max_length"),
        ({"key_max_length": True}, "key_max_length"),
        ({"search": "url"}, "Search"),
        ({"search": search, "lookup": None}, "a search is a lookup"),
        ({"key_reuse": (400,)}, "KeyReuse"),
    ]
    for changes, message in bad:
        with pytest.raises(intentlog.InvalidInput, match=re.escape(message)):
            service.replace(**changes)
    for build, message in (
        (lambda: intentlog.Search("{url}/search"), "{key}"),
        (lambda: intentlog.Search("/search?q={key}"), "start with"),
        (lambda: intentlog.KeyReuse((500,), ("error",), "x"), "4xx"),
        (lambda: intentlog.KeyReuse((400,), (), "x"), "member"),
    ):
        with pytest.raises(intentlog.InvalidInput, match=re.escape(message)):
            build()
    assert isinstance(httpx.URL(search.url_for("https://a.example/v1/x", "k 1")), httpx.URL)


def test_a_search_by_reference_without_the_key_in_the_body_is_refused() -> None:
    # The search would answer NotFound forever, and a trusted NotFound resends a call that
    # landed: the combination is refused where it is declared.
    with pytest.raises(intentlog.InvalidInput, match="state reference=") as caught:
        profiles.STRIPE.replace(reference=None)
    assert caught.value.option == "reference"


def test_an_effect_with_its_own_submit_is_held_to_the_services_key_length() -> None:
    # Adyen takes keys of at most 64 characters; a derived key is the name's slug plus 33.
    def pay(key: str, amount: int) -> dict[str, object]:
        return {"pspReference": key}

    with pytest.raises(intentlog.InvalidInput, match="over the 64 that service 'adyen'"):
        intentlog.Effect("a-payment-effect-with-a-long-name-x", pay, service=profiles.ADYEN)
    assert intentlog.Effect("pay", pay, service=profiles.ADYEN).service is profiles.ADYEN
