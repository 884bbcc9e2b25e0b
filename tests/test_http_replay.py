"""A replay that carries the receipt is the confirmation, against a service whose idempotency
layer answers a completed key with 409 and the original body, on SQLite and PostgreSQL.

The service (:class:`InvoiceApi`) lives in the test process on 127.0.0.1 so that its record
survives the worker that the restart test kills with SIGKILL; the applications are counted
there, never in the journal. Run as a script, this file is that worker:

    python test_http_replay.py work JOURNAL_URL API_URL
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import intentlog
from intentlog.integrations.http import AmbiguousResponse, async_http_effect, http_effect

HERE = Path(__file__).resolve()
RECEIPT = ["id", "amount", "status"]
DAY = 24 * 3600
KEY = "order-1-invoice"


class InvoiceApi:
    """``POST /invoices`` behind an idempotency layer that behaves as django-idempotency-key.

    Modelled on its published behaviour (https://github.com/yoyowallet/django-idempotency-key):

    - the key comes in the ``Idempotency-Key`` header (its ``HTTP_IDEMPOTENCY_KEY``);
    - a key whose request completed with a 2xx (its ``STORE_ON_STATUSES``) is answered with the
      stored response, its status set to ``CONFLICT_STATUS_CODE``, "defaults to
      HTTP_409_CONFLICT" (README, Settings; ``idempotency_key/middleware.py`` in the 1.x
      releases: ``if status_code is not None: response.status_code = status_code; return
      response``), so a replay is a 409 whose body is the original answer;
    - a key whose first request is still being handled is answered 409 with the generic
      conflict body ``{"error": "Conflict (409)"}`` (``idempotency_key/exceptions.py``
      ``conflict()``; "If the original request ... is still in-flight, 409 ("Conflict") is
      returned", README);
    - a request that did not complete with a 2xx is not stored.

    Its own record: ``applied`` (every invoice created, with its key) and ``answers`` (every
    status and body it answered, written before the answer is sent, so a request whose
    client died is recorded too). With ``hold`` set, a new request waits (after it was
    received) until ``release()``.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.stored: dict[str, dict[str, Any] | None] = {}  # None: still in flight
        self.applied: list[tuple[str, dict[str, Any]]] = []
        self.answers: list[tuple[int, dict[str, Any]]] = []
        self.gate = threading.Event()
        self.gate.set()
        api = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                status, body = api.handle(self.headers.get("Idempotency-Key"), raw)
                data = json.dumps(body).encode()
                with contextlib.suppress(OSError):  # the client may be gone (killed)
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,))

    def handle(self, key: str | None, raw: bytes) -> tuple[int, dict[str, Any]]:
        with self.lock:
            if not key:
                return self.answered(400, {"error": "Bad Request (400)"})
            if key in self.stored:
                done = self.stored[key]
                if done is None:
                    return self.answered(409, {"error": "Conflict (409)"})
                return self.answered(409, done)  # the stored response, status set to 409
            self.stored[key] = None  # in flight: a same-key request now gets the conflict
            self.changed.notify_all()
        self.gate.wait()
        with self.lock:
            body = json.loads(raw)
            invoice = {"id": f"inv_{len(self.applied) + 1}", "amount": body.get("amount"),
                       "status": "open"}  # fmt: skip
            self.applied.append((key, invoice))
            self.stored[key] = invoice
            return self.answered(201, invoice)

    def answered(self, status: int, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        self.answers.append((status, body))
        self.changed.notify_all()
        return status, body

    def wait_for(self, done: Callable[[], bool], what: str) -> None:
        """Wait (on the record's own changes) until ``done()``; fail after a minute."""
        with self.changed:
            if not self.changed.wait_for(done, timeout=60):
                raise AssertionError(f"the service never {what}")

    def statuses(self) -> list[int]:
        with self.lock:
            return [status for status, _ in self.answers]

    def __enter__(self) -> InvoiceApi:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.gate.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture
def api() -> Iterator[InvoiceApi]:
    with InvoiceApi() as service:
        yield service


def invoice_effect(url: str, *, is_async: bool = False, **settings: Any) -> intentlog.Effect:
    """The invoice effect as a user writes it for this service: it deduplicates for a day;
    nothing said about replays, so the defaults apply (``in_progress=(409,)``)."""
    options: dict[str, Any] = {"idempotent": True, "key_retention": DAY, "timeout": 1}
    options.update(settings)
    build = async_http_effect if is_async else http_effect
    return build("invoice", "POST", url + "/invoices", receipt=RECEIPT, **options)


def run(journal_url: str, effect: intentlog.Effect, *, is_async: bool, **args: Any) -> Any:
    if not is_async:
        with intentlog.open(journal_url, max_wait=30) as journal, journal.task("o") as task:
            return task.run(effect, **args)

    async def main() -> Any:
        async with (
            intentlog.open_async(journal_url, max_wait=30) as journal,
            journal.task("o") as task,
        ):
            return await task.run(effect, **args)

    return asyncio.run(main())


def only_op(journal_url: str) -> intentlog.Operation:
    with intentlog.open(journal_url) as journal:
        (op,) = journal.operations()
        return op


def completed_elsewhere(api: InvoiceApi, amount: int) -> dict[str, Any]:
    """The key completed at the service by another client (another journal, a person)."""
    answer = httpx.post(api.url + "/invoices", json={"amount": amount},
                        headers={"Idempotency-Key": KEY})  # fmt: skip
    assert answer.status_code == 201, answer.text
    return dict(answer.json())


SERVICE = intentlog.Service(
    "invoice-api",
    key=intentlog.KeyPlace.header("Idempotency-Key"),
    retention=DAY,
    timeout=1,
    source="a test service behaving as django-idempotency-key",
)


@pytest.mark.parametrize("declared", ["keywords", "service"])
@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_a_first_send_answered_by_a_409_replay_confirms(
    journal_url: str, api: InvoiceApi, is_async: bool, declared: str
) -> None:
    original = completed_elsewhere(api, 500)
    settings: dict[str, Any] = (
        {"service": SERVICE, "idempotent": None, "key_retention": None, "timeout": None}
        if declared == "service"
        else {}
    )
    effect = invoice_effect(api.url, is_async=is_async, **settings)
    receipt = run(journal_url, effect, is_async=is_async, key=KEY, amount=500)
    assert receipt == original
    assert api.statuses() == [201, 409]  # read at once, not resent, not waited on
    assert api.applied == [(KEY, original)]  # applied once, by the other client
    op = only_op(journal_url)
    assert op.state is intentlog.State.CONFIRMED and op.receipt == original


def test_a_restart_after_a_crash_after_the_service_applied_confirms_by_the_replay(
    journal_url: str, api: InvoiceApi
) -> None:
    # The worker is killed once its request is written; the service applies it and stores
    # the answer nobody reads. The restarted run resends the key (its in-flight window
    # over), gets the 409 replay with the original body, and confirms with that receipt.
    env = {k: v for k, v in os.environ.items() if k != "INTENTLOG_CRASH"}
    env["INTENTLOG_CRASH"] = "after_send:invoice"
    proc = subprocess.run(
        [sys.executable, str(HERE), "work", journal_url, api.url],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    api.wait_for(lambda: len(api.answers) == 1, "applied the first request")
    ((key, original),) = api.applied
    assert only_op(journal_url).state is intentlog.State.SUBMITTED

    receipt = run(journal_url, invoice_effect(api.url), is_async=False, amount=500)
    assert receipt == original
    assert api.statuses() == [201, 409]  # the applied request, then its replay
    assert api.applied == [(key, original)]  # never two
    op = only_op(journal_url)
    assert op.key == key and op.state is intentlog.State.CONFIRMED and op.receipt == original


def test_a_409_without_the_receipt_is_still_in_progress_then_the_replay_confirms(
    journal_url: str, api: InvoiceApi, tmp_path: Path
) -> None:
    # Another client's request for the key is held in flight: this run's 409s carry the
    # generic conflict body, "in progress", so the operation stays SUBMITTED (nothing
    # guessed). Once that request completes, the next run's 409 carries the receipt.
    api.gate.clear()
    first = threading.Thread(target=completed_elsewhere, args=(api, 700))
    first.start()
    try:
        api.wait_for(lambda: KEY in api.stored, "received the first request")
        effect = invoice_effect(api.url, in_progress_wait=0.2)
        with (
            intentlog.open(journal_url, max_wait=30, attempts_per_run=1) as journal,
            journal.task("o") as task,
            pytest.raises(AmbiguousResponse, match="still in progress"),
        ):
            task.run(effect, key=KEY, amount=700)
        assert only_op(journal_url).state is intentlog.State.SUBMITTED
        assert set(api.statuses()) == {409}
        assert all(body == {"error": "Conflict (409)"} for _, body in api.answers)
    finally:
        api.gate.set()
        first.join()
    receipt = run(journal_url, effect, is_async=False, key=KEY, amount=700)
    ((_, original),) = api.applied
    assert receipt == original and api.answers[-1] == (409, original)
    assert only_op(journal_url).state is intentlog.State.CONFIRMED


def spec(**settings: Any) -> Any:
    """The answer mapping of the invoice effect (keywords: in_progress=(409,) by default)."""
    from intentlog.integrations import http

    options: dict[str, Any] = dict(idempotent=True, key_retention=DAY, timeout=1.0,
                                   lookup_lag=None, locks_in_flight=None, replay=None,
                                   key_header=None)  # fmt: skip
    options.update(settings)
    contract = http._contract("invoice", "http://127.0.0.1/invoices", None, **options)
    return http._spec("invoice", "POST", "http://127.0.0.1/invoices", RECEIPT, None, contract,
                      None, http.NOT_APPLIED, (409,), (422,))  # fmt: skip


RECEIPT_BODY = {"id": "inv_1", "amount": 5, "status": "open"}


@pytest.mark.parametrize(
    ("status", "body", "problem", "replay", "want"),
    [
        (409, RECEIPT_BODY, False, None, "receipt"),  # django-idempotency-key's replay
        (409, {**RECEIPT_BODY, "extra": 1}, False, None, "receipt"),
        (409, {"error": "Conflict (409)"}, False, None, "in progress"),
        (409, {"id": "inv_1"}, False, None, "in progress"),  # not every receipt field
        (
            409,
            {**RECEIPT_BODY, "error": {"type": "idempotency_error"}},
            False,
            None,
            "in progress",
        ),  # an error body, whatever else it carries
        (409, {**RECEIPT_BODY, "errors": ["in flight"]}, False, None, "in progress"),
        (409, RECEIPT_BODY, True, None, "in progress"),  # application/problem+json
        (409, [RECEIPT_BODY], False, None, "in progress"),  # not an object
        (412, RECEIPT_BODY, False, (412,), "receipt"),  # a declared replay status
        (412, {**RECEIPT_BODY, "error": "x"}, False, (412,), "ambiguous"),
        (418, RECEIPT_BODY, False, None, "ambiguous"),  # neither: the request may have landed
    ],
)
def test_the_answer_mapping_of_replays(
    status: int, body: Any, problem: bool, replay: tuple[int, ...] | None, want: str
) -> None:
    from intentlog.integrations.http import _Answer

    mapping = spec(replay=intentlog.Replay(statuses=replay) if replay else None)
    answer = _Answer(status, json.dumps(body).encode(), False, False, problem)
    if want == "ambiguous":
        with pytest.raises(AmbiguousResponse, match=str(status)):
            mapping.receipt_of_answer(KEY, answer)
        return
    got = mapping.receipt_of_answer(KEY, answer)
    assert got == (RECEIPT_BODY if want == "receipt" else None)


def test_an_error_named_receipt_field_still_reads_as_the_receipt() -> None:
    # A receipt that keeps a field named "error" (say, a delivery report's) is not an error
    # body for having it.
    from intentlog.integrations import http

    contract = http._contract("report", "http://127.0.0.1/r", None, idempotent=True,
                              key_retention=DAY, timeout=1.0, lookup_lag=None,
                              locks_in_flight=None, replay=None, key_header=None)  # fmt: skip
    mapping = http._spec("report", "POST", "http://127.0.0.1/r", ["id", "error"], None,
                         contract, None, http.NOT_APPLIED, (409,), (422,))  # fmt: skip
    body = json.dumps({"id": "r_1", "error": None}).encode()
    got = mapping.receipt_of_answer(KEY, http._Answer(409, body, False))
    assert got == {"id": "r_1", "error": None}


def work(journal_url: str, api_url: str) -> int:
    """The worker of the restart test: one invoice in task ``o``."""
    receipt = run(journal_url, invoice_effect(api_url), is_async=False, amount=500)
    print(json.dumps(receipt), flush=True)
    return 0


if __name__ == "__main__":
    command, *rest = sys.argv[1:]
    assert command == "work", command
    sys.exit(work(*rest))
