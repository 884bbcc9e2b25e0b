"""intentlog.integrations.http against real HTTP servers on 127.0.0.1, real journals, and
real processes killed with SIGKILL. The service's own record is the ground truth."""

from __future__ import annotations

import asyncio
import dataclasses
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import intentlog
from intentlog.integrations.http import (
    AmbiguousResponse,
    Lookup,
    async_http_effect,
    http_effect,
)
from intentlog.testing import CRASH_POINTS, MODES, MatrixReport, ReferenceService, ServiceInfo

SUPPORT = Path(__file__).parent / "support"
FAULTS = ("drop_after_commit", "error_before_commit", "error_after_commit", "delay")


def payments(
    service: ReferenceService, *, is_async: bool = False, **settings: Any
) -> intentlog.Effect:
    """An effect for the reference service, declaring exactly what its mode can do."""
    build = async_http_effect if is_async else http_effect
    dedupes = service.mode in ("dedupe", "both")
    options: dict[str, Any] = {
        "receipt": ["id", "status", "amount"],
        "idempotent": dedupes,
        "key_retention": 3600 if dedupes else None,
        "timeout": 0.5,
        "lookup": (
            Lookup.by_key(service.url + "/payments/by-key/{key}")
            if service.mode in ("lookup", "both")
            else None
        ),
        **settings,
    }
    return build("charge", "POST", service.url + "/payments", **options)


def run_once(journal_path: Path, effect: intentlog.Effect, *, is_async: bool, **args: Any) -> Any:
    """task.run(effect, **args) in a fresh task handle, on a sync or an async journal."""
    if not is_async:
        with intentlog.open(journal_path, max_wait=10) as journal, journal.task("t") as task:
            return task.run(effect, **args)

    async def main() -> Any:
        async with (
            intentlog.open_async(journal_path, max_wait=10) as journal,
            journal.task("t") as task,
        ):
            return await task.run(effect, **args)

    return asyncio.run(main())


def only_op(journal_path: Path) -> intentlog.Operation:
    with intentlog.open(journal_path) as journal:
        (op,) = journal.operations()
        return op


class Counter:
    """httpx event hooks: counts statuses, and clears the service's faults on the second
    request (so a delay hits exactly the first one)."""

    def __init__(self, service: ReferenceService) -> None:
        self.service = service
        self.requests = 0
        self.statuses: list[int] = []

    def on_request(self, request: httpx.Request) -> None:
        self.requests += 1
        if self.requests == 2:
            self.service.clear_faults()

    def on_response(self, response: httpx.Response) -> None:
        self.statuses.append(response.status_code)

    async def aon_request(self, request: httpx.Request) -> None:
        self.on_request(request)

    async def aon_response(self, response: httpx.Response) -> None:
        self.on_response(response)


def run_with_counter(
    journal_path: Path, service: ReferenceService, counter: Counter, *, is_async: bool
) -> Any:
    """Run one charge through an effect on a client of our own that carries the counter."""
    if not is_async:
        hooks = {"request": [counter.on_request], "response": [counter.on_response]}
        with httpx.Client(event_hooks=hooks) as client:
            effect = payments(service, client=client, in_progress_wait=3)
            return run_once(journal_path, effect, is_async=False, amount=5)

    async def main() -> Any:
        hooks = {"request": [counter.aon_request], "response": [counter.aon_response]}
        async with httpx.AsyncClient(event_hooks=hooks) as client:  # on this loop
            effect = payments(service, is_async=True, client=client, in_progress_wait=3)
            async with (
                intentlog.open_async(journal_path, max_wait=10) as journal,
                journal.task("t") as task,
            ):
                return await task.run(effect, amount=5)

    return asyncio.run(main())


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("mode", MODES)
def test_every_mode_and_fault(tmp_path: Path, mode: str, fault: str, is_async: bool) -> None:
    with ReferenceService(mode, db_path=tmp_path / "svc.db") as service:
        counter = Counter(service)
        # delay: the service commits, then answers after 1.5 s; the client gives up at 0.5 s.
        service.set_faults(**({"delay": 1.5} if fault == "delay" else {fault: 1}))
        try:
            receipt = run_with_counter(tmp_path / "j.db", service, counter, is_async=is_async)
        except intentlog.OutcomeUnknown:
            receipt = None
        applied = service.applied()
        op = only_op(tmp_path / "j.db")
    assert all(len(ids) == 1 for ids in applied.values()), applied  # never twice for one key
    if mode == "neither":
        # Nothing can settle a lost answer: UNRESOLVED (even for the 503, which applied
        # nothing: the effect cannot know that), for a person to resolve.
        assert receipt is None and op.state is intentlog.State.UNRESOLVED
        assert sum(map(len, applied.values())) == (0 if fault == "error_before_commit" else 1)
        return
    assert op.state is intentlog.State.CONFIRMED
    assert receipt == op.receipt == {"id": applied[op.key][0], "status": "succeeded", "amount": 5}
    if mode == "dedupe" and fault == "delay":
        assert 409 in counter.statuses  # the resend met the first request still in progress


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_no_fault_receipt_and_replay(tmp_path: Path, is_async: bool) -> None:
    with ReferenceService("both", db_path=tmp_path / "svc.db") as service:
        effect = payments(service, is_async=is_async)
        first = run_once(tmp_path / "j.db", effect, is_async=is_async, amount=9)
        again = run_once(tmp_path / "j.db", effect, is_async=is_async, amount=9)
        assert first == again == {"id": first["id"], "status": "succeeded", "amount": 9}
        assert list(service.truth().values()) == [1]
        # json= sends the value itself as the body
        body = run_once(tmp_path / "j.db", effect, is_async=is_async, json={"amount": 3})
        assert body["amount"] == 3 and len(service.truth()) == 2


def test_lookup_reads_service_directly(tmp_path: Path) -> None:
    with ReferenceService("lookup", db_path=tmp_path / "svc.db") as service:
        effect = payments(service)
        assert effect.reconcile is not None
        assert effect.reconcile("nothing-here") == intentlog.NotFound()
        receipt = run_once(tmp_path / "j.db", effect, is_async=False, amount=1)
        assert effect.reconcile(only_op(tmp_path / "j.db").key) == intentlog.Found(receipt)
    with ReferenceService("dedupe", db_path=tmp_path / "svc2.db") as service:
        # a lookup on a service without one: 501, which proves nothing
        effect = payments(service, lookup=Lookup.by_key(service.url + "/payments/by-key/{key}"))
        assert effect.reconcile is not None
        result = effect.reconcile("k")
        assert isinstance(result, intentlog.Indeterminate) and "501" in result.reason


# -- a second, independent service with other conventions ----------------------------------


@dataclasses.dataclass
class Tickets:
    """A tickets API: deduplicates on X-Request-Id (which must be "req-" + up to 40 chars),
    answers 202 with a status resource, 423 while a request id is being processed, 409 for a
    request id reused with another body; search by request id at GET /api/search."""

    url: str = ""
    created: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    faults: list[str] = dataclasses.field(default_factory=list)  # consumed one per POST
    by_request: dict[str, tuple[str, dict[str, Any]]] = dataclasses.field(default_factory=dict)
    busy: set[str] = dataclasses.field(default_factory=set)
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)


def tickets_handler(state: Tickets) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def reply(self, status: int, body: Any, raw: bytes | None = None) -> None:
            data = raw if raw is not None else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("X-Trace", "token abcdefghijklmnop")  # must never be reported
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            parts = urllib.parse.urlsplit(self.path)
            if parts.path == "/api/search":
                request_id = urllib.parse.parse_qs(parts.query).get("request_id", [""])[0]
                with state.lock:
                    found = state.by_request.get(request_id)
                results = [{"number": found[0], "state": "queued"}] if found else []
                self.reply(200, {"results": results})
            elif parts.path.startswith("/api/tickets/"):
                self.reply(200, {"number": parts.path.rsplit("/", 1)[1], "state": "open"})
            else:
                self.reply(404, {"problem": "no such path"})

        def do_PUT(self) -> None:
            self.reply(405, {"title": "tickets are created with POST"})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.headers.get("Authorization") == "Bearer wrong-token-123456":
                self.reply(403, {"message": "token Bearer wrong-token-123456 is not valid"})
                return
            request_id = self.headers.get("X-Request-Id", "")
            if not request_id.startswith("req-") or len(request_id) > 44:
                self.reply(400, {"problem": "bad X-Request-Id", "title": "invalid request id"})
                return
            with state.lock:
                fault = state.faults.pop(0) if state.faults else None
                if fault == "unavailable":
                    self.reply(503, {"title": "try later"})
                    return
                if request_id in state.busy:
                    self.reply(423, {"title": "still processing this request id"})
                    return
                if request_id in state.by_request:
                    number, first = state.by_request[request_id]
                    if first != body:
                        self.reply(409, {"title": "request id reused with another body"})
                        return
                else:
                    number = f"TK-{len(state.created) + 1}"
                    state.created.append((request_id, number))
                    state.by_request[request_id] = (number, body)
                    state.busy.add(request_id)
            try:
                if fault == "slow":
                    time.sleep(1.0)
            finally:
                with state.lock:
                    state.busy.discard(request_id)
            answer = {"number": number, "state": "queued", "href": f"/api/tickets/{number}"}
            if fault == "drop":
                self.close_connection = True
            elif fault == "malformed":
                self.reply(202, None, raw=b'{"number": "TK-')
            elif fault == "no_fields":
                self.reply(202, {"accepted": True})
            elif fault == "huge":
                self.reply(202, {**answer, "padding": "x" * (2 << 20)})
            else:
                self.reply(202, answer)

    return Handler


class QuietServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that stops reading an oversized answer resets the connection: expected.
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


@pytest.fixture
def tickets() -> Iterator[Tickets]:
    state = Tickets()
    server = QuietServer(("127.0.0.1", 0), tickets_handler(state))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def ticket_effect(state: Tickets, *, lookup: bool = True, **settings: Any) -> intentlog.Effect:
    search = Lookup.by_key(
        state.url + "/api/search?request_id={key}",
        pick=lambda body: body["results"][0] if body["results"] else None,
    )
    options: dict[str, Any] = {
        "receipt": ["number", "state"],
        "key_header": "X-Request-Id",
        "in_progress": (423,),
        "key_reused": (409,),
        "idempotent": True,
        "key_retention": intentlog.FOREVER,
        "lookup": search if lookup else None,
        "timeout": 0.3,
        **settings,
    }
    return http_effect("open_ticket", "POST", state.url + "/api/tickets", **options)


def open_ticket(path: Path, effect: intentlog.Effect, key: str, **body: Any) -> Any:
    with intentlog.open(path, max_wait=10) as journal, journal.task("incident-1") as task:
        return task.run(effect, key=key, **body)


def test_tickets_202_and_search_lookup(tmp_path: Path, tickets: Tickets) -> None:
    effect = ticket_effect(tickets)
    receipt = open_ticket(tmp_path / "j.db", effect, "req-1", title="disk full")
    assert receipt == {"number": "TK-1", "state": "queued"}
    assert open_ticket(tmp_path / "j.db", effect, "req-1", title="disk full") == receipt
    tickets.faults.append("drop")  # created, then the connection is closed unanswered
    assert open_ticket(tmp_path / "j.db", effect, "req-2", title="cpu")["number"] == "TK-2"
    assert tickets.created == [("req-1", "TK-1"), ("req-2", "TK-2")]
    assert effect.reconcile is not None
    assert effect.reconcile("req-3") == intentlog.NotFound()  # an empty search result


def test_tickets_in_progress_status_waits_then_resends(tmp_path: Path, tickets: Tickets) -> None:
    # The first answer comes after 1 s; the client gives up at 0.3 s and, with no lookup,
    # resends the same request id: 423 (in progress), wait, resend, the stored answer.
    tickets.faults.append("slow")
    effect = ticket_effect(tickets, lookup=False, in_progress_wait=3)
    assert open_ticket(tmp_path / "j.db", effect, "req-9", title="x")["number"] == "TK-1"
    assert len(tickets.created) == 1
    assert only_op(tmp_path / "j.db").attempts == 2  # one resend by the decision; 423s waited


def test_malformed_json_in_a_2xx_is_ambiguous(tmp_path: Path, tickets: Tickets) -> None:
    tickets.faults.append("malformed")
    effect = ticket_effect(tickets)
    # The lookup settles it: created once, confirmed with what the service holds.
    assert open_ticket(tmp_path / "j.db", effect, "req-1", title="a")["number"] == "TK-1"
    # Without a lookup, and malformed every time: resent (deduplicated), then a clear error,
    # and the operation stays SUBMITTED for the next run to settle, never FAILED.
    tickets.faults.extend(["malformed"] * 3)
    plain = ticket_effect(tickets, lookup=False)
    with pytest.raises(AmbiguousResponse, match="answered 202 with a body that is not JSON"):
        open_ticket(tmp_path / "j2.db", plain, "req-2", title="b")
    op = only_op(tmp_path / "j2.db")
    assert op.state is intentlog.State.SUBMITTED and op.attempts == 3
    assert len(tickets.created) == 2
    assert open_ticket(tmp_path / "j2.db", plain, "req-2", title="b")["number"] == "TK-2"


def test_2xx_without_receipt_fields_stays_submitted(tmp_path: Path, tickets: Tickets) -> None:
    tickets.faults.extend(["no_fields"] * 3)
    plain = ticket_effect(tickets, lookup=False)
    with pytest.raises(AmbiguousResponse, match="no receipt field\\(s\\) 'number', 'state'"):
        open_ticket(tmp_path / "j.db", plain, "req-1", title="a")
    with intentlog.open(tmp_path / "j.db") as journal:
        (pending,) = journal.pending()
        assert pending.state is intentlog.State.SUBMITTED
        # our own request ended: the next step is to resend the key (deduplicated)
        assert pending.next_action in (intentlog.Action.SUBMIT, intentlog.Action.WAIT)
    # with a lookup, the next run reconciles instead, and finds it
    assert open_ticket(tmp_path / "j.db", ticket_effect(tickets), "req-1", title="a") == {
        "number": "TK-1",
        "state": "queued",
    }
    assert len(tickets.created) == 1


def test_oversized_2xx_is_ambiguous(tmp_path: Path, tickets: Tickets) -> None:
    tickets.faults.append("huge")
    receipt = open_ticket(tmp_path / "j.db", ticket_effect(tickets), "req-1", title="a")
    assert receipt == {"number": "TK-1", "state": "queued"} and len(tickets.created) == 1
    assert only_op(tmp_path / "j.db").attempts == 1  # settled by the lookup, not resent


def test_rejected_header_fails_cleanly(tmp_path: Path, tickets: Tickets) -> None:
    # The service refuses our key as its request id (400): not applied, so FAILED, and every
    # later run says so again (a new attempt needs a new key). Headers are never reported.
    effect = ticket_effect(tickets)
    with pytest.raises(intentlog.Rejected) as caught:
        open_ticket(tmp_path / "j.db", effect, "not-a-request-id", title="a")
    message = str(caught.value)
    assert "(400): invalid request id" in message and "abcdefghijklmnop" not in message
    assert caught.value.status == 400
    with intentlog.open(tmp_path / "j.db") as journal:
        assert journal.pending() == []
        assert journal.operation("not-a-request-id").state is intentlog.State.FAILED
    with pytest.raises(intentlog.Rejected, match="FAILED"):
        open_ticket(tmp_path / "j.db", effect, "not-a-request-id", title="a")
    assert tickets.created == []


def test_rejected_message_is_scrubbed(tmp_path: Path, tickets: Tickets) -> None:
    with httpx.Client(headers={"Authorization": "Bearer wrong-token-123456"}) as client:
        effect = ticket_effect(tickets, client=client, not_applied=(400, 403))
        with pytest.raises(intentlog.Rejected) as caught:
            open_ticket(tmp_path / "j.db", effect, "req-1", title="a")
    assert "wrong-token" not in str(caught.value) and "(403)" in str(caught.value)
    op = only_op(tmp_path / "j.db")
    assert op.state is intentlog.State.FAILED and "wrong-token" not in json.dumps(op.error)


def test_key_reused_by_another_journal_is_a_key_conflict(tmp_path: Path, tickets: Tickets) -> None:
    effect = ticket_effect(tickets)
    open_ticket(tmp_path / "a.db", effect, "req-1", title="a")
    with pytest.raises(intentlog.KeyConflict, match="409"):
        open_ticket(tmp_path / "b.db", effect, "req-1", title="other")
    assert only_op(tmp_path / "b.db").state is intentlog.State.FAILED
    assert len(tickets.created) == 1


def test_5xx_is_ambiguous_and_settled(tmp_path: Path, tickets: Tickets) -> None:
    tickets.faults.append("unavailable")  # nothing created; the lookup says so, then resend
    effect = ticket_effect(tickets)
    assert open_ticket(tmp_path / "j.db", effect, "req-1", title="a")["number"] == "TK-1"
    assert len(tickets.created) == 1 and only_op(tmp_path / "j.db").attempts == 2


def test_status_resource_of_a_client_chosen_id(tmp_path: Path, tickets: Tickets) -> None:
    # With {key} in the URL, the resource's id is the key; its status resource is then a
    # lookup by key (here the tickets API's GET /api/tickets/{id}).
    effect = http_effect(
        "put_ticket",
        "PUT",
        tickets.url + "/api/tickets/{key}",
        receipt=["number"],
        lookup=Lookup.by_key(tickets.url + "/api/tickets/{key}"),
        not_applied=(404, 405),
    )
    assert effect.reconcile is not None
    assert effect.reconcile("T 1/2") == intentlog.Found({"number": "T%201%2F2"})
    with pytest.raises(intentlog.Rejected, match="405"):  # this server has no PUT
        open_ticket(tmp_path / "j.db", effect, "ticket-7", title="a")


def test_bad_settings_are_refused() -> None:
    url = "http://127.0.0.1:9/x"
    bad: list[tuple[dict[str, Any], str]] = [
        ({"method": "GET"}, "method must be one of"),
        ({"url": "ftp://x/y"}, "http:// or https://"),
        ({"receipt": "id"}, "non-empty list"),
        ({"receipt": []}, "non-empty list"),
        ({"not_applied": (500,)}, "4xx status codes"),
        ({"not_applied": (409,)}, "one of not_applied"),
        ({"key_header": "Bad Header"}, "no header name"),
        ({"key_retention": 60}, "idempotent=True"),
        ({"client": object()}, "httpx.Client"),
        ({"lookup": "http://x/{key}"}, "Lookup.by_key"),
    ]
    for change, message in bad:
        options: dict[str, Any] = {"method": "POST", "url": url, "receipt": ["id"]}
        options.update(change)
        with pytest.raises(intentlog.InvalidInput, match=message):
            http_effect("x", options.pop("method"), options.pop("url"), **options)
    with pytest.raises(intentlog.InvalidInput, match=r"httpx\.AsyncClient"), httpx.Client() as c:
        async_http_effect("x", "POST", url, receipt=["id"], client=c)
    with pytest.raises(intentlog.InvalidInput, match="placeholder"):
        Lookup.by_key("http://x/lookup")


def test_unreachable_service_is_ambiguous(tmp_path: Path) -> None:
    # Nothing listens on port 9 here: no answer, so the outcome is unknown to the effect.
    effect = http_effect("x", "POST", "http://127.0.0.1:9/x", receipt=["id"], timeout=0.5)
    with pytest.raises(intentlog.OutcomeUnknown):
        run_once(tmp_path / "j.db", effect, is_async=False, a=1)
    assert only_op(tmp_path / "j.db").state is intentlog.State.UNRESOLVED


def test_missing_httpx_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['httpx'] = None\n"
        "from intentlog.integrations.http import http_effect\n"
        "http_effect('x', 'POST', 'http://h/x', receipt=['id'])\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 1 and "pip install 'intentlog[http]'" in run.stderr


# -- SIGKILL --------------------------------------------------------------------------------


@pytest.mark.parametrize("workflow", ["http_order", "http_order_async"])
def test_after_send_fires_once_written_before_the_answer(tmp_path: Path, workflow: str) -> None:
    # The service commits, then holds its answer 20 s. A kill at after_send must come right
    # after the request was written, not once the answer arrives.
    with ReferenceService("both", db_path=tmp_path / "svc.db") as service:
        service.set_faults(delay=20.0)
        info = ServiceInfo(service.url, "both", timeout=2.0)  # shorter than the delay
        env = {**os.environ, "PYTHONPATH": str(SUPPORT), "INTENTLOG_CRASH": "after_send:charge"}
        command = [sys.executable, "-m", "intentlog.testing._child",
                   f"integration_workflows:{workflow}", str(tmp_path / "j.db"),
                   json.dumps(dataclasses.asdict(info))]  # fmt: skip
        started = time.monotonic()
        run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
        assert run.returncode == -signal.SIGKILL, run.stderr
        assert time.monotonic() - started < 15.0  # it did not wait for the answer
        service.clear_faults()
        # The request was whole, so the service applies it, though perhaps only after the
        # client died (exactly the in-flight window the decision waits out).
        deadline = time.monotonic() + 10
        while not service.truth() and time.monotonic() < deadline:
            time.sleep(0.05)
        # The async workflow runs two orders at once: the other order's charge may be on the
        # wire too when the kill comes. Each key at most once either way.
        applied = list(service.truth().values())
        assert applied == [1] or (workflow == "http_order_async" and applied == [1, 1])
        env.pop("INTENTLOG_CRASH")
        rerun = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
        assert rerun.returncode == 0, rerun.stderr
        truth = service.truth()  # every effect of the workflow applied exactly once
        assert set(truth.values()) == {1} and len(truth) == (3 if workflow == "http_order" else 4)


# One service mode per test, so that pytest-xdist spreads each matrix over its workers; the
# tests of a matrix together cover its modes, each cell as one matrix of all of them would.


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("mode", MODES)
def test_crash_matrix_http_order(crash_matrix: Callable[..., MatrixReport], mode: str) -> None:
    report = crash_matrix("integration_workflows:http_order", modes=[mode])
    report.raise_for_problems()
    assert len(report.cells) == len(CRASH_POINTS) * 3
    assert {cell.mode for cell in report.cells} == {mode}
    for cell in report.cells:
        if cell.mode != "neither":
            assert cell.unresolved == [], cell  # a service that can be asked needs no person
        if cell.point == "after_send":
            assert cell.outcome != "not reached", cell  # the transport marks the point


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("mode", ["dedupe", "lookup"])
def test_crash_matrix_async_http(crash_matrix: Callable[..., MatrixReport], mode: str) -> None:
    report = crash_matrix("integration_workflows:http_order_async", modes=[mode])
    report.raise_for_problems()
    assert len(report.cells) == len(CRASH_POINTS) * 4
    assert {cell.mode for cell in report.cells} == {mode}
    assert all(c.unresolved == [] for c in report.cells)
    assert all(c.outcome != "not reached" for c in report.cells if c.point == "after_send")


# -- documentation --------------------------------------------------------------------------


def test_docs_http_section_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from integration_workflows import run_doc_section

    monkeypatch.chdir(tmp_path)
    assert run_doc_section("HTTP APIs") >= 2
    capsys.readouterr()  # examples print; keep a passing run quiet
