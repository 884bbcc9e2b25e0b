"""An HTTP lookup never takes "the service answered something" for "the request landed".

A worker is killed with SIGKILL after the intent is durable and before the request is sent
(``after_submit_mark``), then restarted. The lookup by key answers 200 with nothing (``null``,
``[]``, ``{}``), or with records of other keys only (a filter the service ignored): the
charge is sent once, never recorded CONFIRMED unsent. Counted at the service's own record. A
lone record holding another key cannot be this operation's, and is never taken for it either.
"""

from __future__ import annotations

import dataclasses
import http.server
import json
import os
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import intentlog
from intentlog.integrations.http import Lookup, http_effect

# A service that deduplicates nothing and can be asked about a key: a resend is safe only
# because the lookup said the first request did not land.
SERVICE = intentlog.Service("charges", lookup="key", reference=("key",), timeout=0.5)
ANSWERS: dict[str, Any] = {
    "null": None,
    "false": False,
    "empty-list": [],
    "empty-object": {},
    "other-keys": [{"id": "ch_old", "key": "another-key", "amount": 9}],
}


@dataclasses.dataclass
class Charges:
    url: str = ""
    answer: str = "null"  # what GET /charges/by-key answers while the key has no charge
    posts: list[dict[str, Any]] = dataclasses.field(default_factory=list)


@pytest.fixture
def charges() -> Iterator[Charges]:
    state = Charges()

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def reply(self, body: Any, status: int = 200) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            record = {"id": f"ch_{len(state.posts) + 1}", **body}
            state.posts.append(record)
            self.reply(record, 201)

        def do_GET(self) -> None:
            if self.path.startswith("/search"):  # a search that matched on something else
                self.reply({"data": [{"id": "ch_old", "amount": 9}]})
                return
            key = self.path.rsplit("/", 1)[1]
            mine = [p for p in state.posts if p.get("key") == key]
            if mine:
                self.reply(mine[0] if state.answer != "other-keys" else state.posts)
            elif state.answer == "lone-other":
                self.reply({"id": "ch_old", "key": "another-key", "amount": 9})
            else:
                self.reply(ANSWERS[state.answer])

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
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


def charge_effect(url: str) -> intentlog.Effect:
    return http_effect(
        "charge", "POST", url + "/charges", receipt=["id", "amount"], service=SERVICE,
        lookup=Lookup.by_key(url + "/charges/by-key/{key}"),
    )  # fmt: skip


WORKER = """
import sys
import intentlog
from tests.test_http_lookup_crash import charge_effect
with intentlog.open(sys.argv[1]) as journal, journal.task("order-1") as task:
    task.run(charge_effect(sys.argv[2]), key="order-1-charge", amount=5)
"""


def run_worker(db: Path, url: str, crash: str) -> subprocess.CompletedProcess[str]:
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "INTENTLOG_CRASH": crash, "PYTHONPATH": str(root)}
    return subprocess.run(
        [sys.executable, "-c", WORKER, str(db), url], env=env, capture_output=True, text=True,
        timeout=120, cwd=root,
    )  # fmt: skip


@pytest.mark.parametrize("answer", sorted(ANSWERS))
def test_a_lookup_that_answers_nothing_of_this_key_sends_it_once(
    tmp_path: Path, charges: Charges, answer: str
) -> None:
    charges.answer = answer
    db = tmp_path / "journal.db"
    done = run_worker(db, charges.url, "after_submit_mark")
    assert done.returncode == -9, done.stderr
    assert charges.posts == []  # killed after the intent, before the send
    with intentlog.open(db, max_wait=30) as journal, journal.task("order-1") as task:
        receipt = task.run(charge_effect(charges.url), key="order-1-charge", amount=5)
        (op,) = journal.operations("order-1")
    assert receipt == {"id": "ch_1", "amount": 5}
    assert len(charges.posts) == 1  # sent once: not confirmed unsent, not sent twice
    assert op.state is intentlog.State.CONFIRMED


def test_a_lost_answer_is_still_found_among_other_keys(tmp_path: Path, charges: Charges) -> None:
    """The other half: killed after the service applied the charge, the lookup that lists
    other keys' charges beside this one's finds this one's, and nothing is resent."""
    charges.answer = "other-keys"
    charges.posts.append({"id": "ch_0", "key": "another-key", "amount": 9})
    db = tmp_path / "journal.db"
    done = run_worker(db, charges.url, "after_remote_commit")
    assert done.returncode == -9, done.stderr
    assert len(charges.posts) == 2
    with intentlog.open(db, max_wait=30) as journal, journal.task("order-1") as task:
        receipt = task.run(charge_effect(charges.url), key="order-1-charge", amount=5)
    assert receipt == {"id": "ch_2", "amount": 5}
    assert len(charges.posts) == 2


def test_a_lone_record_of_another_key_is_never_this_operations(
    tmp_path: Path, charges: Charges
) -> None:
    """A lookup by key that answers one record holding another key is not asking about this
    key at all: it cannot tell, so the operation is never confirmed by it nor resent on its
    word; it ends UNRESOLVED for a person, with nothing sent."""
    charges.answer = "lone-other"
    effect = charge_effect(charges.url)
    assert effect.reconcile is not None
    verdict = effect.reconcile("order-1-charge")
    assert isinstance(verdict, intentlog.Indeterminate), verdict
    assert "another key" in verdict.reason
    db = tmp_path / "journal.db"
    assert run_worker(db, charges.url, "after_submit_mark").returncode == -9
    with (
        intentlog.open(db, max_wait=30) as journal,
        journal.task("order-1") as task,
        pytest.raises(intentlog.OutcomeUnknown),
    ):
        task.run(effect, key="order-1-charge", amount=5)
    assert charges.posts == []


def test_a_search_match_that_does_not_hold_the_key_is_never_this_operations(
    charges: Charges,
) -> None:
    """A service's ready search by the key it wrote into the body (``reference``): a match
    with no key there is some other record, so the search cannot tell (Indeterminate)."""
    searched = SERVICE.replace(
        lookup="reference", search=intentlog.Search(charges.url + "/search?key={key}",
                                                    results="data"),
    )  # fmt: skip
    effect = http_effect("charge", "POST", charges.url + "/charges", receipt=["id"],
                         service=searched)  # fmt: skip
    assert effect.reconcile is not None
    verdict = effect.reconcile("order-1-charge")
    assert isinstance(verdict, intentlog.Indeterminate), verdict
    assert "does not hold the key" in verdict.reason


# -- a reconciler of the user's own ----------------------------------------------------------


def careless_effect(url: str) -> intentlog.Effect:
    """A reconciler with the classic slip: ``Found(whatever the lookup answered)``."""

    def submit(key: str, amount: int) -> Any:
        request = urllib.request.Request(
            url + "/charges", data=json.dumps({"key": key, "amount": amount}).encode(),
            headers={"Content-Type": "application/json"}, method="POST",
        )  # fmt: skip
        with urllib.request.urlopen(request, timeout=5) as answer:
            return json.load(answer)

    def reconcile(key: str) -> intentlog.Found:
        with urllib.request.urlopen(url + "/charges/by-key/" + key, timeout=5) as answer:
            return intentlog.Found(json.load(answer))  # null, [] or {} when there is none

    return intentlog.Effect("charge", submit, reconcile=reconcile, timeout=0.5)


CARELESS = WORKER.replace("charge_effect", "careless_effect")


@pytest.mark.parametrize("answer", ["null", "false", "empty-list", "empty-object"])
def test_a_reconciler_that_says_found_with_nothing_never_confirms_an_unsent_call(
    tmp_path: Path, charges: Charges, answer: str
) -> None:
    """``Found(None)``, ``Found(False)``, ``Found([])`` or ``Found({})`` is a reconciler's
    slip, not a hit: the call killed before it was sent is not recorded CONFIRMED; the lookup
    counts as failed, and the operation ends UNRESOLVED for a person, naming the slip, with
    nothing sent."""
    charges.answer = answer
    db = tmp_path / "journal.db"
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "INTENTLOG_CRASH": "after_submit_mark", "PYTHONPATH": str(root)}
    done = subprocess.run(
        [sys.executable, "-c", CARELESS, str(db), charges.url], env=env, capture_output=True,
        text=True, timeout=120, cwd=root,
    )  # fmt: skip
    assert done.returncode == -9, done.stderr
    with (
        intentlog.open(db, max_wait=30) as journal,
        journal.task("order-1") as task,
        pytest.raises(intentlog.OutcomeUnknown, match=r"returned Found\("),
    ):
        task.run(careless_effect(charges.url), key="order-1-charge", amount=5)
    with intentlog.open(db) as journal:
        (op,) = journal.operations("order-1")
    assert op.state is intentlog.State.UNRESOLVED
    assert charges.posts == []
