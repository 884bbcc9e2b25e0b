"""intentlog.tracing captured by the OpenTelemetry SDK's in-memory exporter, on real journals
(SQLite files, PostgreSQL), sync and asyncio, and through a real HTTP server on 127.0.0.1
that records the trace context it receives. No span may carry a key, arguments or a receipt."""

from __future__ import annotations

import asyncio
import http.server
import json
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import intentlog
import intentlog.tracing
from intentlog.integrations.http import Lookup, async_http_effect, http_effect

SECRET_KEY = "key-SECRET-7f3a9c"
SECRET_ARG = "card-SECRET-4242"
SECRET_RECEIPT = "receipt-SECRET-ch_91"
SECRET_TASK = "task-SECRET-alice@example.com"


@dataclass
class Traced:
    exporter: InMemorySpanExporter
    provider: TracerProvider

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def named(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.spans() if s.name == name]

    @property
    def tracer(self) -> trace.Tracer:
        return self.provider.get_tracer("tests")


@pytest.fixture
def traced() -> Iterator[Traced]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    intentlog.tracing.enable(provider)
    try:
        yield Traced(exporter, provider)
    finally:
        intentlog.tracing.disable()
        provider.shutdown()


def texts_of(span: ReadableSpan) -> list[str]:
    """Everything a span says: name, attributes, events, links, status."""
    out = [span.name, span.status.description or ""]
    attribute_sets = [span.attributes or {}]
    attribute_sets += [event.attributes or {} for event in span.events]
    attribute_sets += [link.attributes or {} for link in span.links]
    out += [event.name for event in span.events]
    for attributes in attribute_sets:
        for name, value in attributes.items():
            out += [name, str(value)]
    return out


def assert_clean(spans: Sequence[ReadableSpan], journal_url: Any, *secrets: str) -> None:
    """No span carries any key of the journal, nor any of ``secrets`` (arguments, receipts,
    the task id)."""
    with intentlog.open(journal_url) as journal:
        keys = [op.key for op in journal.operations()]
    assert keys
    for span in spans:
        for text in texts_of(span):
            for secret in (*keys, *secrets):
                assert secret not in text, (span.name, text)


def attributes(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


class Flaky:
    """A submit that raises an ambiguous error on its first ``fails`` calls, recording the
    span current in each call."""

    def __init__(self, fails: int) -> None:
        self.fails = fails
        self.calls = 0
        self.current: list[int] = []

    def __call__(self, key: str, **args: Any) -> dict[str, Any]:
        self.current.append(trace.get_current_span().get_span_context().span_id)
        self.calls += 1
        if self.calls <= self.fails:
            raise ConnectionError(f"no answer for {key}")  # the message names the key
        return {"id": SECRET_RECEIPT}


def test_run_and_replay(traced: Traced, journal_url: str) -> None:
    submit = Flaky(0)
    charge = intentlog.Effect("charge", submit, idempotent=True, key_retention=intentlog.FOREVER)
    with intentlog.open(journal_url) as journal, traced.tracer.start_as_current_span("outer"):
        with journal.task(SECRET_TASK) as task:
            assert task.run(charge, key=SECRET_KEY, card=SECRET_ARG) == {"id": SECRET_RECEIPT}
        with journal.task(SECRET_TASK) as task:  # a replay: another handle, the step recorded
            assert task.run(charge, key=SECRET_KEY, card=SECRET_ARG) == {"id": SECRET_RECEIPT}
    outer = traced.named("outer")[0]
    first, replay = traced.named("intentlog.run charge")
    (sent,) = traced.named("intentlog.submit")
    assert parent_id(first) == parent_id(replay) == outer.context.span_id
    assert parent_id(sent) == first.context.span_id
    assert {s.context.trace_id for s in traced.spans()} == {outer.context.trace_id}
    base = {"intentlog.effect": "charge", "intentlog.state": "CONFIRMED", "intentlog.attempt": 1}
    assert attributes(first) == {**base, "intentlog.replay": False}
    assert attributes(replay) == {**base, "intentlog.replay": True}
    assert attributes(sent) == base
    assert submit.current == [sent.context.span_id]  # submit ran with its span current
    assert all(s.status.status_code is StatusCode.UNSET for s in traced.spans())
    assert_clean(traced.spans(), journal_url, SECRET_ARG, SECRET_RECEIPT, SECRET_TASK)


def test_reconcile_found_not_found_and_unresolved(traced: Traced, journal_url: str) -> None:
    looked: list[int] = []

    def found(key: str) -> intentlog.LookupResult:
        looked.append(trace.get_current_span().get_span_context().span_id)
        return intentlog.Found({"id": SECRET_RECEIPT})

    asked = intentlog.Effect("asked", Flaky(1), reconcile=found)
    resent = intentlog.Effect(
        "resent", Flaky(1), reconcile=lambda key: intentlog.NotFound(), timeout=0.05
    )
    neither = intentlog.Effect("neither", Flaky(1))
    with intentlog.open(journal_url, max_wait=10) as journal, journal.task(SECRET_TASK) as task:
        assert task.run(asked, card=SECRET_ARG) == {"id": SECRET_RECEIPT}
        assert task.run(resent, card=SECRET_ARG) == {"id": SECRET_RECEIPT}
        with pytest.raises(intentlog.OutcomeUnknown):
            task.run(neither, card=SECRET_ARG)
    runs = {s.name.removeprefix("intentlog.run "): s for s in traced.spans() if " " in s.name}
    children: dict[str, list[ReadableSpan]] = {name: [] for name in runs}
    for span in traced.spans():
        for name, run in runs.items():
            if parent_id(span) == run.context.span_id:
                children[name].append(span)

    # asked: the submit raised, the lookup found it.
    submit, lookup = children["asked"]
    assert (submit.name, lookup.name) == ("intentlog.submit", "intentlog.reconcile")
    assert attributes(submit) == {
        "intentlog.effect": "asked", "intentlog.attempt": 1, "intentlog.state": "SUBMITTED"
    }  # fmt: skip
    assert (submit.status.status_code, submit.status.description) == (
        StatusCode.ERROR,
        "ConnectionError",
    )
    assert attributes(lookup) == {
        "intentlog.effect": "asked",
        "intentlog.reconcile.result": "found",
    }
    assert looked == [lookup.context.span_id]
    assert attributes(runs["asked"]) == {
        "intentlog.effect": "asked", "intentlog.state": "CONFIRMED", "intentlog.attempt": 1,
        "intentlog.replay": False,
    }  # fmt: skip

    # resent: not found (once the request could no longer land), then sent again.
    names = [s.name for s in children["resent"]]
    assert names[0] == "intentlog.submit" and names[-1] == "intentlog.submit"
    assert set(names[1:-1]) == {"intentlog.reconcile"}
    assert {attributes(s)["intentlog.reconcile.result"] for s in children["resent"][1:-1]} == {
        "not_found"
    }
    assert attributes(children["resent"][-1])["intentlog.attempt"] == 2
    assert attributes(children["resent"][-1])["intentlog.state"] == "CONFIRMED"
    run = runs["resent"]
    assert attributes(run)["intentlog.attempt"] == 2
    assert [(e.name, dict(e.attributes or {})) for e in run.events] == [
        ("intentlog.resend", {"intentlog.resend.reason": "after_error"})
    ]

    # neither: nothing can settle it.
    assert attributes(runs["neither"])["intentlog.state"] == "UNRESOLVED"
    assert runs["neither"].status.description == "OutcomeUnknown"
    assert_clean(traced.spans(), journal_url, SECRET_ARG, SECRET_RECEIPT, SECRET_TASK)


def test_async_spans_follow_each_task(traced: Traced, journal_url: str) -> None:
    seen: dict[str, list[int]] = {"submit": [], "lookup": [], "sync": []}
    lost: set[str] = set()

    async def submit(key: str, order: str, card: str) -> dict[str, Any]:
        seen["submit"].append(trace.get_current_span().get_span_context().span_id)
        await asyncio.sleep(0)  # the other task runs meanwhile
        if order == "o-0" and order not in lost:
            lost.add(order)
            raise ConnectionError("no answer")
        return {"id": SECRET_RECEIPT + order}

    async def lookup(key: str) -> intentlog.LookupResult:
        seen["lookup"].append(trace.get_current_span().get_span_context().span_id)
        return intentlog.Found({"id": SECRET_RECEIPT})

    def sync_submit(key: str, order: str) -> dict[str, Any]:  # run in a pool thread
        seen["sync"].append(trace.get_current_span().get_span_context().span_id)
        return {"id": SECRET_RECEIPT}

    charge = intentlog.Effect("charge", submit, reconcile=lookup)
    note = intentlog.Effect("note", sync_submit, idempotent=True, key_retention=intentlog.FOREVER)

    async def one(journal: intentlog.AsyncJournal, order: str) -> None:
        with traced.tracer.start_as_current_span(f"outer {order}"):
            async with journal.task(f"{SECRET_TASK}-{order}") as task:
                await task.run(charge, order=order, card=SECRET_ARG)
                await task.run(note, order=order)

    async def main() -> None:
        async with intentlog.open_async(journal_url, max_wait=10) as journal:
            await asyncio.gather(one(journal, "o-0"), one(journal, "o-1"))

    asyncio.run(main())
    spans = traced.spans()
    by_id = {s.context.span_id: s for s in spans}
    for order in ("o-0", "o-1"):
        outer = traced.named(f"outer {order}")[0]
        runs = [s for s in spans if parent_id(s) == outer.context.span_id]
        assert sorted(s.name for s in runs) == ["intentlog.run charge", "intentlog.run note"]
        for run in runs:
            assert run.context.trace_id == outer.context.trace_id
    for kind, name in (("submit", "intentlog.submit"), ("lookup", "intentlog.reconcile")):
        assert seen[kind] and all(by_id[i].name == name for i in seen[kind])
    assert len(seen["lookup"]) == 1 and len(seen["submit"]) == 2  # o-0's first send was lost
    assert [by_id[i].name for i in seen["sync"]] == ["intentlog.submit"] * 2
    for run in (s for s in spans if s.name.startswith("intentlog.run")):
        assert attributes(run)["intentlog.state"] == "CONFIRMED"
    assert_clean(spans, journal_url, SECRET_ARG, SECRET_RECEIPT, SECRET_TASK)


# -- trace context over HTTP ----------------------------------------------------------------


@dataclass
class Charges:
    """A service that records the headers of every request; it drops the answer to the
    first POST when ``drop_first`` (the charge is made, the answer lost)."""

    drop_first: bool = False
    url: str = ""
    seen: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    made: dict[str, str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


def charges_handler(state: Charges) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def reply(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            with state.lock:
                state.seen.append(("GET", dict(self.headers)))
                key = self.path.rsplit("/", 1)[1]
                made = state.made.get(key)
            self.reply(200, {"id": made}) if made else self.reply(404, {})

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            key = self.headers["Idempotency-Key"]
            with state.lock:
                first = not state.seen
                state.seen.append(("POST", dict(self.headers)))
                state.made.setdefault(key, SECRET_RECEIPT)
            if first and state.drop_first:
                self.close_connection = True  # applied, no answer
                return
            self.reply(201, {"id": SECRET_RECEIPT})

    return Handler


@pytest.fixture
def charges() -> Iterator[Charges]:
    state = Charges()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), charges_handler(state))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def traceparent(headers: dict[str, str]) -> tuple[int, int] | None:
    """(trace id, parent span id) of a W3C traceparent header, or None."""
    value = {k.lower(): v for k, v in headers.items()}.get("traceparent")
    if value is None:
        return None
    _, trace_id, span_id, _ = value.split("-")
    return int(trace_id, 16), int(span_id, 16)


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_trace_context_reaches_the_service(
    traced: Traced, charges: Charges, tmp_path: Any, is_async: bool
) -> None:
    charges.drop_first = True
    build = async_http_effect if is_async else http_effect
    charge = build(
        "charge", "POST", charges.url + "/charges", receipt=["id"], idempotent=True,
        key_retention=3600, timeout=5.0,
        lookup=Lookup.by_key(charges.url + "/charges/by-key/{key}"),
    )  # fmt: skip
    path = tmp_path / "j.db"

    def run(effect: intentlog.Effect, task_id: str) -> Any:
        if not is_async:
            with intentlog.open(path, max_wait=10) as journal, journal.task(task_id) as task:
                return task.run(effect, card=SECRET_ARG)

        async def main() -> Any:
            async with (
                intentlog.open_async(path, max_wait=10) as journal,
                journal.task(task_id) as task,
            ):
                return await task.run(effect, card=SECRET_ARG)

        return asyncio.run(main())

    assert run(charge, SECRET_TASK) == {"id": SECRET_RECEIPT}
    (submit,) = traced.named("intentlog.submit")
    (lookup,) = traced.named("intentlog.reconcile")
    assert attributes(lookup)["intentlog.reconcile.result"] == "found"
    assert [(method, traceparent(headers)) for method, headers in charges.seen] == [
        ("POST", (submit.context.trace_id, submit.context.span_id)),
        ("GET", (lookup.context.trace_id, lookup.context.span_id)),
    ]
    assert_clean(traced.spans(), path, SECRET_ARG, SECRET_RECEIPT, SECRET_TASK)

    intentlog.tracing.disable()  # off: nothing is added to the request
    charges.seen.clear()
    charges.drop_first = False
    again = build(
        "charge2",
        "POST",
        charges.url + "/charges",
        receipt=["id"],
        idempotent=True,
        key_retention=intentlog.FOREVER,
    )
    assert run(again, "another") == {"id": SECRET_RECEIPT}
    assert [(m, traceparent(h)) for m, h in charges.seen] == [("POST", None)]
    assert len(traced.spans()) == 3  # no new span either


def test_enable_replaces_the_provider_and_disable_stops(traced: Traced, tmp_path: Any) -> None:
    other = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(other))
    effect = intentlog.Effect("e", Flaky(0), idempotent=True, key_retention=intentlog.FOREVER)
    with intentlog.open(tmp_path / "j.db") as journal, journal.task("t") as task:
        intentlog.tracing.enable(provider)
        task.run(effect, n=1)
        intentlog.tracing.disable()
        intentlog.tracing.disable()  # idempotent
        task.run(effect, n=2)
    assert [s.name for s in other.get_finished_spans()] == ["intentlog.submit", "intentlog.run e"]
    assert traced.spans() == []
    provider.shutdown()
