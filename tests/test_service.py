"""The reference service: a real HTTP server on 127.0.0.1, real requests, a real SQLite file."""

from __future__ import annotations

import http.client
import json
import os
import pickle
import select
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from intentlog.testing._service import MODES, ReferenceService, ServiceClient, ServiceError

# What a dropped connection or a timeout may surface as; the client must not swallow it.
TRANSPORT_ERRORS = (OSError, http.client.HTTPException, urllib.error.URLError)

Factory = Callable[..., ReferenceService]


@pytest.fixture
def start_service() -> Iterator[Factory]:
    """Start services that are always stopped at the end of the test."""
    started: list[ReferenceService] = []

    def start(mode: str = "both", **options: Any) -> ReferenceService:
        service = ReferenceService(mode, **options).start()
        started.append(service)
        return service

    yield start
    for service in started:
        service.stop()


def request(
    url: str,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], Any]:
    """One raw HTTP exchange: (status, lower-cased headers, parsed JSON body)."""
    parts = urllib.parse.urlsplit(url)
    assert parts.hostname is not None
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=5)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        data = response.read()
        found = {name.lower(): value for name, value in response.getheaders()}
        return response.status, found, json.loads(data) if data else None
    finally:
        conn.close()


def post(url: str, key: str | None, payload: object) -> tuple[int, dict[str, str], Any]:
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Idempotency-Key"] = key
    return request(url, "POST", "/payments", json.dumps(payload).encode(), headers)


# -- modes -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "applied", "replayed", "lookup_status"),
    [
        ("dedupe", 1, True, 501),
        ("lookup", 2, False, 200),
        ("both", 1, True, 200),
        ("neither", 2, False, 501),
    ],
)
def test_each_mode_dedupes_and_looks_up_as_declared(
    start_service: Factory, mode: str, applied: int, replayed: bool, lookup_status: int
) -> None:
    service = start_service(mode)
    status1, headers1, first = post(service.url, "k1", {"amount": 500, "currency": "chf"})
    status2, headers2, second = post(service.url, "k1", {"amount": 500, "currency": "chf"})

    assert (status1, status2) == (201, 201)
    assert first["key"] == "k1"
    assert first["status"] == "succeeded"
    assert first["amount"] == 500
    assert first["id"].startswith("pay_")
    assert "idempotent-replayed" not in headers1
    assert (headers2.get("idempotent-replayed") == "true") is replayed
    assert (second == first) is replayed
    assert service.truth() == {"k1": applied}
    assert ServiceClient(service.url).truth() == {"k1": applied}

    by_key = request(service.url, "GET", "/payments/by-key/k1")
    by_id = request(service.url, "GET", f"/payments/{first['id']}")
    assert by_key[0] == by_id[0] == lookup_status
    if lookup_status == 200:
        assert by_key[2] == second  # the latest application of the key
        assert by_id[2] == first
    else:
        assert by_key[2]["error"] == by_id[2]["error"] == "lookup_not_supported"
        with pytest.raises(ServiceError) as caught:
            ServiceClient(service.url).lookup("k1")
        assert caught.value.status == 501


def test_lookup_answers_not_found_for_unknown_keys_and_ids(start_service: Factory) -> None:
    service = start_service("lookup")
    client = ServiceClient(service.url)
    record = client.pay("a/b c", {"amount": 1})  # a key that needs quoting in the lookup path

    assert record == {"id": record["id"], "key": "a/b c", "status": "succeeded", "amount": 1}
    assert client.lookup("a/b c") == record
    assert client.lookup("never-sent") is None
    status, _, body = request(service.url, "GET", "/payments/pay_0000")
    assert (status, body["error"]) == (404, "not_found")


def test_replay_is_byte_identical_and_ignores_key_order(start_service: Factory) -> None:
    service = start_service("dedupe")
    url = urllib.parse.urlsplit(service.url)
    raw: list[bytes] = []
    for body in (b'{"amount": 7, "currency": "chf"}', b'{"currency":"chf","amount":7}'):
        conn = http.client.HTTPConnection(url.hostname or "", url.port, timeout=5)
        conn.request("POST", "/payments", body, {"Idempotency-Key": "ordered"})
        raw.append(conn.getresponse().read())
        conn.close()

    assert raw[0] == raw[1]
    assert service.truth() == {"ordered": 1}


# -- dedupe details ----------------------------------------------------------------------------


def test_same_key_while_in_progress_gets_409(start_service: Factory) -> None:
    service = start_service("dedupe")
    client = ServiceClient(service.url, timeout=30)
    # Long enough that the two requests below come while the first is still being answered,
    # however slow the machine; the test waits it out once, at the end.
    service.set_faults(delay=3.0, key="slow")

    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(client.pay, "slow", {"amount": 1})
        deadline = time.monotonic() + 60
        while service.truth() != {"slow": 1}:  # applied, now answering slowly
            assert time.monotonic() < deadline, "the first request never applied"
            time.sleep(0.01)
        with pytest.raises(ServiceError) as caught:
            client.pay("slow", {"amount": 1})
        other = client.pay("fast", {"amount": 2})  # the delay is only for key "slow"
        other_first = not first.done()  # answered while "slow" was still held
        original = first.result(timeout=60)

    assert caught.value.status == 409
    assert isinstance(caught.value.body, dict)
    assert caught.value.body["error"] == "in_progress"
    assert other["key"] == "fast"
    assert other_first
    service.clear_faults()
    assert client.pay("slow", {"amount": 1}) == original  # done: now a replay, not a 409
    assert service.truth() == {"fast": 1, "slow": 1}


def test_concurrent_requests_with_one_key_apply_once(start_service: Factory) -> None:
    service = start_service("both")
    client = ServiceClient(service.url)
    barrier = threading.Barrier(12)

    def pay() -> dict[str, Any] | int:
        barrier.wait()
        try:
            return client.pay("race", {"amount": 9})
        except ServiceError as exc:
            return exc.status

    with ThreadPoolExecutor(12) as pool:
        outcomes = list(pool.map(lambda _: pay(), range(12)))

    records = [o for o in outcomes if isinstance(o, dict)]
    assert all(o == 409 for o in outcomes if not isinstance(o, dict))
    assert records
    assert len({record["id"] for record in records}) == 1
    assert service.truth() == {"race": 1}


def test_key_reused_with_another_payload_gets_422(start_service: Factory) -> None:
    service = start_service("both")
    client = ServiceClient(service.url)
    original = client.pay("k", {"amount": 100})

    with pytest.raises(ServiceError) as caught:
        client.pay("k", {"amount": 200})

    assert caught.value.status == 422
    assert isinstance(caught.value.body, dict)
    assert caught.value.body["error"] == "key_reused"
    assert service.truth() == {"k": 1}
    assert client.lookup("k") == original


def test_retention_expiry_forgets_the_key(start_service: Factory) -> None:
    service = start_service("dedupe", retention=2.0)  # the replay below comes well within it
    client = ServiceClient(service.url)
    first = client.pay("k", {"amount": 1})
    assert client.pay("k", {"amount": 1}) == first  # within retention: replayed

    time.sleep(2.05)  # past the retention (a later wake-up only makes it more so)
    second = client.pay("k", {"amount": 1})

    assert second["id"] != first["id"]
    assert service.truth() == {"k": 2}  # a real duplicate, counted
    assert client.pay("k", {"amount": 1}) == second  # a new retention window started


def test_lookup_lag_hides_fresh_records(start_service: Factory) -> None:
    service = start_service("lookup", lookup_lag=2.0)  # the lookups below come well within it
    client = ServiceClient(service.url)
    applied_at = time.monotonic()
    record = client.pay("k", {"amount": 3})

    assert client.lookup("k") is None
    assert request(service.url, "GET", f"/payments/{record['id']}")[0] == 404
    assert service.truth() == {"k": 1}  # ground truth never lags

    time.sleep(max(0.0, applied_at + 2.1 - time.monotonic()))
    assert client.lookup("k") == record
    assert request(service.url, "GET", f"/payments/{record['id']}")[2] == record


# -- faults ------------------------------------------------------------------------------------


def test_drop_after_commit_applies_but_never_answers(start_service: Factory) -> None:
    service = start_service("both")
    client = ServiceClient(service.url)
    service.set_faults(drop_after_commit=1)

    with pytest.raises(TRANSPORT_ERRORS):
        client.pay("k", {"amount": 5})

    assert service.truth() == {"k": 1}
    found = client.lookup("k")
    assert found is not None
    assert found["key"] == "k"
    assert client.pay("k", {"amount": 5}) == found  # the count is used up; the retry replays
    assert service.truth() == {"k": 1}


def test_error_before_commit_applies_nothing(start_service: Factory) -> None:
    service = start_service("both")
    client = ServiceClient(service.url)
    client.set_faults(error_before_commit=1)

    with pytest.raises(ServiceError) as caught:
        client.pay("k", {"amount": 5})

    assert caught.value.status == 503
    assert service.truth() == {}
    assert client.lookup("k") is None
    assert client.pay("k", {"amount": 5})["key"] == "k"
    assert service.truth() == {"k": 1}


def test_error_after_commit_applies_then_answers_500(start_service: Factory) -> None:
    service = start_service("both")
    client = ServiceClient(service.url)
    service.set_faults(error_after_commit=1)

    with pytest.raises(ServiceError) as caught:
        client.pay("k", {"amount": 5})

    assert caught.value.status == 500
    assert service.truth() == {"k": 1}
    assert client.pay("k", {"amount": 5}) == client.lookup("k")


def test_delay_slows_the_answer_after_commit(start_service: Factory) -> None:
    service = start_service("both")
    client = ServiceClient(service.url)
    service.set_faults(delay=0.3)

    started = time.monotonic()
    record = client.pay("k", {"amount": 5})

    assert time.monotonic() - started >= 0.3
    assert record["key"] == "k"
    assert service.truth() == {"k": 1}


def test_timeout_propagates_and_the_payment_still_lands(start_service: Factory) -> None:
    service = start_service("neither")
    service.set_faults(delay=0.5)

    with pytest.raises(TRANSPORT_ERRORS):
        ServiceClient(service.url, timeout=0.1).pay("k", {"amount": 5})

    assert service.truth() == {"k": 1}


def test_hold_keeps_a_request_executing_until_released_and_settle_waits_for_it(
    start_service: Factory,
) -> None:
    service = start_service("neither")
    service.set_faults(hold=300.0)

    with pytest.raises(TRANSPORT_ERRORS):
        ServiceClient(service.url, timeout=0.1).pay("k", {"amount": 5})

    # The client gave up; its request is still executing and the record does not show it.
    assert service.truth() == {}
    with pytest.raises(TimeoutError, match="still running"):
        service.settle(timeout=0.2)
    service.clear_faults()  # releases the held request
    service.settle()
    assert service.truth() == {"k": 1}


def test_settle_returns_at_once_when_nothing_is_running(start_service: Factory) -> None:
    service = start_service("neither")
    ServiceClient(service.url).pay("k", {"amount": 5})

    service.settle(timeout=30.0)

    assert service.truth() == {"k": 1}


def test_fault_counts_run_in_sequence_and_only_for_their_key(start_service: Factory) -> None:
    service = start_service("dedupe")
    client = ServiceClient(service.url)
    client.set_faults(error_before_commit=1, drop_after_commit=1, key="target")

    assert client.pay("bystander", {"amount": 1})["key"] == "bystander"
    with pytest.raises(ServiceError) as caught:
        client.pay("target", {"amount": 1})
    assert caught.value.status == 503
    status, _, remaining = request(service.url, "GET", "/_faults")
    assert status == 200
    assert remaining == {
        "drop_after_commit": 1,
        "error_before_commit": 0,
        "error_after_commit": 0,
        "delay": 0.0,
        "hold": 0.0,
        "key": "target",
    }
    with pytest.raises(TRANSPORT_ERRORS):
        client.pay("target", {"amount": 1})
    client.pay("target", {"amount": 1})

    assert service.truth() == {"bystander": 1, "target": 1}


def test_faults_endpoint_replaces_reads_and_clears(start_service: Factory) -> None:
    service = start_service("both")
    body = json.dumps({"error_after_commit": 2, "delay": 0.1}).encode()

    status, _, settings = request(service.url, "POST", "/_faults", body)
    assert status == 200
    assert settings["error_after_commit"] == 2
    assert settings["delay"] == 0.1
    status, _, settings = request(service.url, "POST", "/_faults", b'{"drop_after_commit": 1}')
    assert (settings["drop_after_commit"], settings["error_after_commit"]) == (1, 0)  # replaced
    status, _, settings = request(service.url, "DELETE", "/_faults")
    assert status == 200
    assert request(service.url, "GET", "/_faults")[2] == settings
    assert settings == {
        "drop_after_commit": 0,
        "error_before_commit": 0,
        "error_after_commit": 0,
        "delay": 0.0,
        "hold": 0.0,
        "key": None,
    }


@pytest.mark.parametrize(
    "faults",
    [
        {"bogus": 1},
        {"drop_after_commit": -1},
        {"error_before_commit": True},
        {"delay": "slow"},
        {"delay": -1},
        {"hold": "long"},
        {"key": 5},
    ],
)
def test_bad_fault_settings_are_refused(start_service: Factory, faults: dict[str, Any]) -> None:
    service = start_service("both")

    status, _, body = request(service.url, "POST", "/_faults", json.dumps(faults).encode())
    assert (status, body["error"]) == (400, "invalid_faults")
    name = next(iter(faults))
    assert name in body["message"]
    with pytest.raises(ValueError, match=name):
        service.set_faults(**faults)
    assert request(service.url, "GET", "/_faults")[2]["key"] is None  # nothing changed


def test_truth_is_answered_whatever_the_faults_and_mode(start_service: Factory) -> None:
    service = start_service("neither", lookup_lag=10)
    client = ServiceClient(service.url)
    client.pay("a", {})
    client.pay("a", {})
    client.pay("b", {})
    service.set_faults(error_before_commit=5, delay=1.0)

    status, _, truth = request(service.url, "GET", "/_truth")

    assert status == 200
    assert truth == {"applied": {"a": 2, "b": 1}, "total": 3}


# -- durability --------------------------------------------------------------------------------


def test_restart_on_the_same_file_keeps_dedupe_and_lookup(tmp_path: Path) -> None:
    db = tmp_path / "service.db"
    with ReferenceService("both", db_path=db) as first:
        original = ServiceClient(first.url).pay("k", {"amount": 42})

    assert ReferenceService(db_path=db).truth() == {"k": 1}  # readable without serving
    with ReferenceService("both", db_path=db) as again:
        status, headers, replay = post(again.url, "k", {"amount": 42})
        looked_up = ServiceClient(again.url).lookup("k")
        truth = again.truth()

    assert (status, headers["idempotent-replayed"]) == (201, "true")
    assert replay == looked_up == original
    assert truth == {"k": 1}


def test_temporary_record_is_removed_and_stop_is_idempotent() -> None:
    service = ReferenceService("dedupe").start()
    path = service.db_path
    assert path is not None
    assert os.path.exists(path)

    service.stop()
    service.stop()

    assert not os.path.exists(path)
    with pytest.raises(RuntimeError, match="not running"):
        _ = service.url
    with pytest.raises(RuntimeError, match="temporary"):
        service.truth()
    with pytest.raises(RuntimeError, match="starts once"):
        service.start()


def test_a_failed_start_leaves_nothing_behind(start_service: Factory) -> None:
    running = start_service("both")
    port = urllib.parse.urlsplit(running.url).port
    assert port is not None
    clash = ReferenceService("both", port=port)

    with pytest.raises(OSError):
        clash.start()

    assert clash.db_path is not None
    assert not os.path.exists(clash.db_path)
    clash.stop()  # still safe


# -- bad input ---------------------------------------------------------------------------------


def test_missing_or_invalid_idempotency_key_is_refused(start_service: Factory) -> None:
    service = start_service("neither")

    missing = post(service.url, None, {"amount": 1})
    too_long = post(service.url, "k" * 256, {"amount": 1})
    not_ascii = post(service.url, "clé", {"amount": 1})
    longest = post(service.url, "k" * 255, {"amount": 1})

    assert (missing[0], missing[2]["error"]) == (400, "missing_idempotency_key")
    assert (too_long[0], too_long[2]["error"]) == (400, "invalid_idempotency_key")
    assert (not_ascii[0], not_ascii[2]["error"]) == (400, "invalid_idempotency_key")
    assert longest[0] == 201
    assert service.truth() == {"k" * 255: 1}


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (b'{"amount": 5', "malformed_json"),
        (b"", "malformed_json"),
        (b"\xff", "malformed_json"),
        (b'{"amount": NaN}', "malformed_json"),
        (b"[1, 2]", "invalid_body"),
    ],
)
def test_bad_bodies_are_refused_and_apply_nothing(
    start_service: Factory, body: bytes, error: str
) -> None:
    service = start_service("both")

    status, _, answer = request(service.url, "POST", "/payments", body, {"Idempotency-Key": "k"})

    assert (status, answer["error"]) == (400, error)
    assert service.truth() == {}


def test_unknown_paths_and_wrong_methods(start_service: Factory) -> None:
    service = start_service("both")

    unknown = request(service.url, "GET", "/refunds")
    get_payments = request(service.url, "GET", "/payments")
    delete_truth = request(service.url, "DELETE", "/_truth")
    put_lookup = request(service.url, "PUT", "/payments/by-key/k", b"{}")

    assert (unknown[0], unknown[2]["error"]) == (404, "unknown_path")
    assert (get_payments[0], get_payments[1]["allow"]) == (405, "POST")
    assert (delete_truth[0], delete_truth[1]["allow"]) == (405, "GET")
    assert (put_lookup[0], put_lookup[2]["error"]) == (405, "method_not_allowed")


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"mode": "sometimes"}, "mode"),
        ({"retention": -1.0}, "retention"),
        ({"lookup_lag": -0.5}, "lookup_lag"),
        ({"lookup_lag": float("nan")}, "lookup_lag"),
    ],
)
def test_bad_constructor_arguments_name_the_argument(options: dict[str, Any], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        ReferenceService(**options)


def test_modes_are_the_four_documented_ones() -> None:
    assert MODES == ("dedupe", "lookup", "both", "neither")


def test_client_refuses_non_http_urls() -> None:
    with pytest.raises(ValueError, match="http"):
        ServiceClient("file:///etc/passwd")


def test_service_error_pickles() -> None:
    error = ServiceError(409, {"error": "in_progress"})

    copy = pickle.loads(pickle.dumps(error))

    assert isinstance(copy, ServiceError)
    assert (copy.status, copy.body) == (409, {"error": "in_progress"})
    assert "409" in str(copy)


# -- as a separate process ---------------------------------------------------------------------


def _read_line(proc: subprocess.Popen[str], timeout: float) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, "the service printed nothing"
    return proc.stdout.readline()


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT])
def test_module_runs_the_service_in_a_subprocess(tmp_path: Path, stop_signal: int) -> None:
    db = tmp_path / "x.db"
    command = [sys.executable, "-m", "intentlog.testing", "--mode", "both", "--port", "0"]
    with subprocess.Popen(
        [*command, "--db", str(db)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        try:
            line = _read_line(proc, timeout=10)
            assert line.startswith("listening on http://127.0.0.1:")
            url = line.removeprefix("listening on ").strip()
            record = ServiceClient(url).pay("k", {"amount": 500})
            assert ServiceClient(url).lookup("k") == record
            proc.send_signal(stop_signal)
            assert proc.wait(timeout=10) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
        rest, errors = proc.communicate()

    assert rest == ""  # exactly one line on stdout
    assert errors == ""
    assert ReferenceService(db_path=db).truth() == {"k": 1}


def test_module_refuses_bad_arguments_with_a_clear_message() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "intentlog.testing", "--retention", "-1"],
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )

    assert result.returncode == 2
    assert "retention" in result.stderr
    assert result.stdout == ""
