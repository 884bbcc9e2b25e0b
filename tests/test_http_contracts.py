"""HTTP effects judged by their service's contract, against a service intentlog did not
shape: a charges API behind an idempotency layer like the common middlewares (its own
process on 127.0.0.1, see idem_service.py), workers killed with SIGKILL right after sending,
and the service's own record as the ground truth.

- the body is canonical JSON, so a restart passing its arguments in another order sends the
  same bytes under the same key (a layer that fingerprints the raw body takes other bytes for
  another request);
- a slow service whose layer deduplicates only completed requests is not sent the key again
  while the first request may still execute; one that locks a key in flight may be, at once,
  and its 409 then reads as "in progress";
- a replay answered as 409 with the original body is the confirmation, with the receipt
  taken from it.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import intentlog
from intentlog import profiles
from intentlog._keys import canonical_json
from intentlog.integrations.http import async_http_effect, http_effect

SUPPORT = Path(__file__).parent / "support"
sys.path.insert(0, str(SUPPORT))
from idem_service import RECEIPT_FIELDS, Record  # noqa: E402

SCRIPT = str(SUPPORT / "idem_service.py")
CRASH = "after_send:charge"


class Api:
    """One running idem_service process: its URL and its record."""

    def __init__(self, url: str, record: Record, gate: Path) -> None:
        self.url, self.record, self.gate = url, record, gate

    def for_key(self) -> list[tuple[str | None, bytes, int | None]]:
        """Every request the service received (all for one key in these tests)."""
        requests = self.record.requests()
        assert len({key for key, _, _ in requests}) <= 1, requests
        return requests

    def wait(self, done: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            assert time.monotonic() < deadline, f"the service never {what}"
            time.sleep(0.02)

    def settle(self, received: int = 1) -> None:
        """Wait until the service has received at least ``received`` requests and answered
        every one (or executed it for a client that is gone), so the record holds every
        application there will be."""

        def settled() -> bool:
            requests = self.record.requests()
            return len(requests) >= received and all(s is not None for _, _, s in requests)

        self.wait(settled, "settled")


@pytest.fixture
def start_api(tmp_path: Path) -> Iterator[Callable[..., Api]]:
    procs: list[subprocess.Popen[str]] = []

    def start(*flags: str, hold: bool = False) -> Api:
        """Start the service; with ``hold``, an executing charge waits for ``api.gate``."""
        db, gate = tmp_path / f"api{len(procs)}.db", tmp_path / f"gate{len(procs)}"
        if not hold:
            gate.touch()
        proc = subprocess.Popen(
            [sys.executable, SCRIPT, "serve", str(db), "--gate", str(gate), *flags],
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.append(proc)
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()  # printed once it listens
        assert url.startswith("http://127.0.0.1:"), url
        return Api(url, Record(db), gate)

    try:
        yield start
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
            assert proc.stdout is not None
            proc.stdout.close()


def worker(
    journal: Path, api: Api, args: list[tuple[str, Any]], *, crash: bool = False,
    service: dict[str, Any] | None = None, **keywords: Any,
) -> subprocess.Popen[str]:  # fmt: skip
    """A worker process running one charge with ``args`` in this order; killed by SIGKILL
    right after sending when ``crash``."""
    env = {k: v for k, v in os.environ.items() if k != "INTENTLOG_CRASH"}
    if crash:
        env["INTENTLOG_CRASH"] = CRASH
    config = {"url": api.url, "args": args, "service": service, "keywords": keywords}
    return subprocess.Popen(
        [sys.executable, SCRIPT, "work", str(journal), json.dumps(config)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def killed(proc: subprocess.Popen[str], api: Api) -> None:
    """The worker died by SIGKILL, and its request reached the service (it was written
    whole before the kill)."""
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL, err
    api.wait(lambda: len(api.record.requests()) >= 1, "received the first request")


def finished(proc: subprocess.Popen[str]) -> Any:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    return json.loads(out.splitlines()[-1])["receipt"]


def only_op(journal: Path) -> intentlog.Operation:
    with intentlog.open(journal) as j:
        (op,) = j.operations()
        return op


def slow_api(**extra: Any) -> dict[str, Any]:
    """A Service (as JSON for the worker) for the charges API: header key, kept an hour."""
    return {"name": "charges-api", "key": ["header", "Idempotency-Key"], "retention": 3600,
            **extra}  # fmt: skip


# -- defect: HTTP bodies were not canonical -------------------------------------------------


def test_a_restart_with_reordered_arguments_sends_the_same_bytes(
    tmp_path: Path, start_api: Callable[..., Api]
) -> None:
    api = start_api()  # fast; fingerprints the raw body; 422 for a key with other bytes
    journal = tmp_path / "j.db"
    first = [("amount", 500), ("currency", "chf"), ("meta", {"order": "o-1", "cart": [2, 1]})]
    killed(worker(journal, api, first, crash=True, idempotent=True, key_retention=3600,
                  timeout=1), api)  # fmt: skip
    api.settle()  # the first request was applied before the restart sends anything
    again = [("meta", {"cart": [2, 1], "order": "o-1"}), ("currency", "chf"), ("amount", 500)]
    receipt = finished(worker(journal, api, again, idempotent=True, key_retention=3600,
                              timeout=1))  # fmt: skip
    api.settle(2)
    (sent, resent) = api.for_key()
    assert sent[1] == resent[1]  # byte-identical bodies under the same key
    assert sent[1] == canonical_json(dict(first)).encode()
    assert (sent[2], resent[2]) == (200, 200)  # applied, then replayed (not a 422)
    ((key, answer),) = api.record.applied()  # applied once
    op = only_op(journal)
    assert key == sent[0] == op.key and op.state is intentlog.State.CONFIRMED
    assert receipt == op.receipt == answer


# -- defect: a resend while the first request was still executing --------------------------


def test_slow_service_without_an_in_flight_lock_is_not_resent_while_executing(
    tmp_path: Path, start_api: Callable[..., Api]
) -> None:
    # 3 s to execute; the layer deduplicates only completed requests. The sender is dead,
    # but its request is not: the restart must wait out sent + timeout before resending.
    api = start_api("--delay", "3")
    journal = tmp_path / "j.db"
    args = [("amount", 700)]
    killed(worker(journal, api, args, crash=True, idempotent=True, key_retention=3600,
                  timeout=5), api)  # fmt: skip
    receipt = finished(worker(journal, api, args, idempotent=True, key_retention=3600,
                              timeout=5))  # fmt: skip
    api.settle(2)
    applied = api.record.applied()
    assert len(applied) == 1, f"applied {len(applied)} times"
    ((_, answer),) = applied
    assert api.record.answers() == [(200, answer)] * 2  # applied, then replayed
    assert receipt == only_op(journal).receipt == answer


def test_service_that_locks_in_flight_may_be_resent_at_once(
    tmp_path: Path, start_api: Callable[..., Api]
) -> None:
    # The layer answers 409 to a same-key request while the first one executes (held here
    # until the test opens the gate): the restart resends at once, reads the 409 as "in
    # progress" (not as a replay, not as a failure), and waits for the answer.
    api = start_api("--lock", hold=True)
    journal = tmp_path / "j.db"
    service = slow_api(locks_in_flight=True, replay={"header": ["Idempotent-Replayed", "true"]},
                       timeout=10)  # fmt: skip
    killed(worker(journal, api, [("amount", 900)], crash=True, service=service), api)
    restart = worker(journal, api, [("amount", 900)], service=service)
    api.wait(lambda: any(s == 409 for _, _, s in api.for_key()), "answered 409")
    api.gate.touch()  # the first request now completes
    receipt = finished(restart)
    api.settle(3)
    ((_, answer),) = api.record.applied()
    (first, *in_flight, replay) = api.record.answers()
    assert first == (200, answer) and replay == (200, answer)  # replayed with the header
    assert in_flight and all(s == 409 and "id" not in a for s, a in in_flight), in_flight
    op = only_op(journal)
    assert op.state is intentlog.State.CONFIRMED and receipt == op.receipt == answer
    assert op.policy.locks_in_flight and op.policy.service == "charges-api"


# -- defect: replayed answers were not understood ------------------------------------------


def test_a_409_replay_with_the_original_body_confirms(
    tmp_path: Path, start_api: Callable[..., Api]
) -> None:
    api = start_api("--replay", "409")  # a completed key is answered 409 + the first body
    journal = tmp_path / "j.db"
    service = slow_api(replay={"statuses": [409]}, timeout=1)
    killed(worker(journal, api, [("amount", 300)], crash=True, service=service), api)
    api.settle()
    receipt = finished(worker(journal, api, [("amount", 300)], service=service))
    ((_, answer),) = api.record.applied()
    assert [status for _, _, status in api.for_key()] == [200, 409]  # read once, not resent
    op = only_op(journal)
    assert op.state is intentlog.State.CONFIRMED and receipt == op.receipt == answer


def test_a_409_in_flight_and_a_409_replay_are_told_apart(
    tmp_path: Path, start_api: Callable[..., Api]
) -> None:
    # 409 means both here: without the receipt fields "in progress", with them the replay.
    api = start_api("--lock", "--replay", "409", hold=True)
    journal = tmp_path / "j.db"
    service = slow_api(locks_in_flight=True, replay={"statuses": [409]}, timeout=10)
    killed(worker(journal, api, [("amount", 400)], crash=True, service=service), api)
    restart = worker(journal, api, [("amount", 400)], service=service)
    api.wait(lambda: any(s == 409 for _, _, s in api.for_key()), "answered 409")
    api.gate.touch()
    receipt = finished(restart)
    api.settle(3)
    ((_, answer),) = api.record.applied()
    (first, *in_flight, replay) = api.record.answers()
    assert first == (200, answer) and replay == (409, answer)  # the replay ended it
    assert in_flight and all(s == 409 and "id" not in a for s, a in in_flight), in_flight
    op = only_op(journal)
    assert op.state is intentlog.State.CONFIRMED and receipt == op.receipt == answer


@pytest.mark.parametrize("declared", ["service", "keywords"])
@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_a_replay_confirms_in_process_sync_and_async(
    tmp_path: Path, start_api: Callable[..., Api], is_async: bool, declared: str
) -> None:
    # Another journal sends the same key with the same body: the service answers 409 with
    # the first answer, which is this operation's confirmation, at the first request.
    api = start_api("--replay", "409")
    replay = intentlog.Replay(statuses=(409,))
    options: dict[str, Any] = (
        {"service": intentlog.Service("charges-api", key=intentlog.KeyPlace.header(
            "Idempotency-Key"), retention=3600, replay=replay, timeout=2)}
        if declared == "service"
        else {"idempotent": True, "key_retention": 3600, "replay": replay, "timeout": 2}
    )  # fmt: skip
    build = async_http_effect if is_async else http_effect
    charge = build("charge", "POST", api.url + "/charges", receipt=RECEIPT_FIELDS,
                   **options)  # fmt: skip

    async def run_async(path: Path) -> Any:
        async with intentlog.open_async(path) as journal, journal.task("o") as task:
            return await task.run(charge, key="order-1-charge", amount=8)

    def run(path: Path) -> Any:
        if is_async:
            return asyncio.run(run_async(path))
        with intentlog.open(path) as journal, journal.task("o") as task:
            return task.run(charge, key="order-1-charge", amount=8)

    first, again = run(tmp_path / "a.db"), run(tmp_path / "b.db")
    assert first == again == api.record.applied()[0][1]
    assert [status for _, _, status in api.for_key()] == [200, 409]
    assert only_op(tmp_path / "b.db").state is intentlog.State.CONFIRMED


# -- the service contract on an HTTP effect ------------------------------------------------


def test_a_profile_url_and_credentials_are_all_a_user_writes(
    tmp_path: Path, start_api: Callable[..., Api]
) -> None:
    api = start_api()
    with httpx.Client(headers={"Authorization": "Bearer sk_test_abcdefghijklmnop"}) as client:
        charge = http_effect("charge", "POST", api.url + "/charges", receipt=["id"],
                             service=profiles.STRIPE, client=client)  # fmt: skip
        with intentlog.open(tmp_path / "j.db") as journal, journal.task("o") as task:
            receipt = task.run(charge, amount=5)
    assert receipt == {"id": "ch_1"}
    policy = only_op(tmp_path / "j.db").policy
    assert (policy.service, policy.idempotent, policy.key_retention) == ("stripe", True, 86400)
    assert policy.locks_in_flight and policy.timeout == 80
    assert charge.lookup_lag == profiles.STRIPE.lookup_lag
    assert charge.reconcile is not None  # the profile's ready search
    ((_, body, _),) = api.record.requests()  # form-encoded, the key also in its metadata
    assert body == f"amount=5&metadata%5Bintentlog_key%5D={only_op(tmp_path / 'j.db').key}".encode()


@pytest.mark.parametrize("place", ["body", "query"])
def test_the_key_goes_where_the_service_takes_it(
    tmp_path: Path, start_api: Callable[..., Api], place: str
) -> None:
    api = start_api("--key", place)
    where = intentlog.KeyPlace.body if place == "body" else intentlog.KeyPlace.query
    service = intentlog.Service("charges-api", key=where("idempotency_key"), retention=3600)
    charge = http_effect("charge", "POST", api.url + "/charges", receipt=RECEIPT_FIELDS,
                         service=service, timeout=2)  # fmt: skip
    with intentlog.open(tmp_path / "j.db") as journal, journal.task("o") as task:
        task.run(charge, note="x", amount=5)
        task.run(charge, amount=5, note="x")  # the stored receipt: nothing sent
    op = only_op(tmp_path / "j.db")
    ((key, body, status),) = api.record.requests()
    assert key == op.key and status == 200
    expected: dict[str, Any] = {"amount": 5, "note": "x"}
    if place == "body":
        expected["idempotency_key"] = op.key
    assert body == canonical_json(expected).encode()


def test_a_body_that_cannot_take_the_key_is_refused_unsent(
    tmp_path: Path, start_api: Callable[..., Api]
) -> None:
    api = start_api("--key", "body")
    service = intentlog.Service(
        "charges-api", key=intentlog.KeyPlace.body("idempotency_key"), retention=3600
    )
    charge = http_effect("charge", "POST", api.url + "/charges", receipt=RECEIPT_FIELDS,
                         service=service, timeout=2)  # fmt: skip
    with intentlog.open(tmp_path / "j.db") as journal, journal.task("o") as task:
        with pytest.raises(intentlog.Rejected, match="already has a field 'idempotency_key'"):
            task.run(charge, amount=6, idempotency_key="mine")
        with pytest.raises(intentlog.Rejected, match="must be a JSON object, not list"):
            task.run(charge, json=[1, 2])
        assert {op.state for op in journal.operations()} == {intentlog.State.FAILED}
    assert api.record.requests() == []  # nothing was sent


def test_service_and_its_keywords_together_are_refused() -> None:
    url = "http://127.0.0.1:9/charges"
    for build in (http_effect, async_http_effect):
        with pytest.raises(
            intentlog.InvalidInput, match="idempotent, key_header come from service 'stripe'"
        ):
            build("c", "POST", url, receipt=["id"], service=profiles.STRIPE,
                  idempotent=True, key_header="X-Key")  # fmt: skip
        with pytest.raises(intentlog.InvalidInput) as caught:
            build("c", "POST", url, receipt=["id"], service=profiles.STRIPE,
                  key_retention=60, lookup_lag=1, locks_in_flight=False,
                  replay=intentlog.Replay(statuses=(409,)), key_header="X-Key")  # fmt: skip
        message = str(caught.value)
        for name in ("key_retention", "lookup_lag", "locks_in_flight", "replay", "key_header"):
            assert name in message, message
        assert "stripe" in message and "service.replace" in message
        # timeout may override the service's deadline for this effect
        effect = build("c", "POST", url, receipt=["id"], service=profiles.STRIPE,
                       timeout=5)  # fmt: skip
        assert effect.timeout == 5 and effect.policy.key_retention == 86400
    bad: list[tuple[dict[str, Any], str]] = [
        ({"service": profiles.GITHUB}, "has no path segment -3"),  # not .../repos/O/R/issues
        ({"service": profiles.SQS_FIFO}, "no place for"),
        ({"service": profiles.S3_CONDITIONAL}, "placeholder"),
        ({"service": "stripe"}, "intentlog.Service"),
        ({"replay": intentlog.Replay(statuses=(404,))}, "replay statuses and in not_applied"),
        ({"replay": (409,)}, "Replay"),
    ]
    for options, message in bad:
        with pytest.raises(intentlog.InvalidInput, match=message):
            http_effect("c", "POST", url, receipt=["id"], **options)
    # S3-style: the key names the resource, a second create is refused with 412
    put = http_effect("put", "PUT", "http://127.0.0.1:9/b/{key}", receipt=["etag"],
                      service=profiles.S3_CONDITIONAL)  # fmt: skip
    assert put.policy.idempotent and put.policy.key_retention is None
