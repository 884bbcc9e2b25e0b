"""`intentlog gateway` in front of clients nobody here wrote: the official Stripe Python SDK
(stripe-python, pinned in the dev extra) and the system's ``curl``, against the project's fake
Stripe in its own process (``python -m intentlog.testing.fakes stripe``), counted at the fake's
own record.

A client is killed with SIGKILL after the fake applied its charge and before it could print
anything (it blocks on a FIFO that nobody writes to), and started again: through the gateway
the restarted client's request is answered from the journal (one charge); straight at the fake,
with the key stripe-python makes up per call (or none, for curl), it is applied a second time.
Then what the gateway refuses, and how it starts and stops: bad input through curl (428, 422,
413, 404, each a problem document, the journal and the fake untouched), a malformed routes
file, the token, and SIGTERM with a request in flight.

Every wait is on a line on a pipe, a request held at the fake, a refused connection or a row
in a record, never on the clock.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

if os.environ.get("CI") != "true":  # where CI=true these tests must run, not skip
    pytest.importorskip("httpx", reason="the gateway is not installed (intentlog[gateway])")
    pytest.importorskip("stripe", reason="stripe-python is not installed (the dev extra)")
    if shutil.which("curl") is None:
        pytest.skip("no curl on PATH", allow_module_level=True)

from gateway_support import (
    DEADLINE,
    STRIPE_AUTH,
    Child,
    Children,
    Fake,
    Gateway,
    route,
    run_cli,
    send,
    start_fake,
    wait_until,
    write_routes,
)
from intentlog.testing.fakes import StripeFake

API_KEY = "sk_test_gateway"
PAUSED = "paused after the charge"
CHARGE = {"amount": "500", "currency": "usd", "source": "tok_visa"}

#: A Stripe client as stripe-python's users write one: ``StripeClient`` pointed at ``url``
#: (its ``base_addresses["api"]``), one ``charges.create``. The Intentlog headers go in the
#: request option ``headers``; ``idempotency_key`` is the request option of that name (left
#: out, stripe-python makes up a random one for every POST). ``pause``: a FIFO to block on
#: once the charge was answered, before anything is printed (a test SIGKILLs it there). Prints
#: one JSON line: the status, the charge's id and the answer's Intentlog-* headers.
SDK_CLIENT = """
import json, sys
import stripe

spec = json.loads(sys.argv[1])
client = stripe.StripeClient(spec["api_key"], base_addresses={"api": spec["url"]})
headers = {}
if spec.get("task"):
    headers["Intentlog-Task"] = spec["task"]
if spec.get("step"):
    headers["Intentlog-Step"] = spec["step"]
options = {"headers": headers}
if spec.get("idempotency_key"):
    options["idempotency_key"] = spec["idempotency_key"]
charge = client.v1.charges.create(
    {"amount": 500, "currency": "usd", "source": "tok_visa", "metadata": {"order": "42"}},
    options,
)
if spec.get("pause"):
    print("paused after the charge", file=sys.stderr, flush=True)
    with open(spec["pause"]) as fifo:  # blocks: nobody opens it to write
        fifo.read()
answer = charge.last_response
print(json.dumps({
    "status": answer.code,
    "id": charge.id,
    "headers": {k.lower(): v for k, v in answer.headers.items()
                if k.lower().startswith(("intentlog-", "idempotent-"))},
}))
"""

#: A shell agent: one charge with curl (``-i``: the status line and headers come too), then,
#: given a FIFO as $2, it blocks on it before printing what curl got.
CURL_AGENT = r"""
set -eo pipefail
answer=$(curl -sS -i "$1/v1/charges" -u "$3:" \
  -H "Intentlog-Task: order-42" -H "Intentlog-Step: charge" \
  -d amount=500 -d currency=usd -d source=tok_visa)
if [ -n "$2" ]; then
  echo "paused after the charge" >&2
  read -r _ < "$2"
fi
printf '%s\n' "$answer"
"""


@pytest.fixture
def children() -> Iterator[Children]:
    with Children() as kids:
        yield kids


@pytest.fixture
def stripe(children: Children, tmp_path: Path) -> Fake:
    return start_fake(children, "stripe", tmp_path / "stripe.db")


def stripe_gateway(
    children: Children, upstream: str, tmp_path: Path, *args: str, name: str = "stripe"
) -> Gateway:
    """A gateway with one route, ``/stripe`` to ``upstream`` (profile stripe), started."""
    routes = write_routes(
        tmp_path / "routes.toml", [route(name, "/stripe", upstream, profile="stripe")]
    )
    gateway = Gateway(children, routes, db=str(tmp_path / "journal.db"), cwd=tmp_path, args=args)
    gateway.start()
    return gateway


def fifo(tmp_path: Path) -> str:
    """A FIFO a client blocks on once its charge was answered (nobody ever writes to it)."""
    path = tmp_path / "pause.fifo"
    os.mkfifo(path)
    return str(path)


def printed(child: Child) -> dict[str, Any]:
    """Wait for a client to exit 0; the one JSON line it printed."""
    code = child.exited()
    assert code == 0, str(child)
    [line] = [line for line in child.seen["stdout"] if line.startswith("{")]
    result: dict[str, Any] = json.loads(line)
    return result


def sdk_client(children: Children, spec: dict[str, Any]) -> Child:
    return children.start([sys.executable, "-c", SDK_CLIENT, json.dumps(spec)])


def killed_after_the_charge(child: Child, stripe: Fake) -> None:
    """The client paused after its charge was answered: the fake applied it; SIGKILL it."""
    child.expect(PAUSED, stream="stderr")
    assert len(stripe.applied()) == 1
    assert child.kill() == -signal.SIGKILL


# -- stripe-python -------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("identity", ["step", "idempotency_key"])
def test_stripe_python_killed_after_the_charge_through_the_gateway_charges_once(
    children: Children, stripe: Fake, tmp_path: Path, identity: str
) -> None:
    gateway = stripe_gateway(children, stripe.url, tmp_path)
    spec: dict[str, Any] = {"url": gateway.url + "/stripe", "api_key": API_KEY, "task": "order-42"}
    # The identity: Intentlog-Step, or a key of the client's own that the restarted client
    # sends again (stripe-python's request option idempotency_key).
    spec.update({"step": "charge"} if identity == "step" else {"idempotency_key": "order-42-pay"})
    killed_after_the_charge(sdk_client(children, {**spec, "pause": fifo(tmp_path)}), stripe)

    again = printed(sdk_client(children, spec))
    [charge] = stripe.applied()
    assert again["status"] == 200 and again["id"] == charge.id
    assert again["headers"]["intentlog-replay"] == "true"
    assert again["headers"]["intentlog-state"] == "CONFIRMED"
    # Upstream, the gateway's own key replaced the client's.
    assert charge.key == again["headers"]["intentlog-key"]
    assert [r.outcome for r in stripe.requests()] == ["applied"]


@pytest.mark.slow
def test_stripe_python_alone_charges_twice_across_a_kill(
    children: Children, stripe: Fake, tmp_path: Path
) -> None:
    """The baseline: straight at Stripe, stripe-python makes up a new random
    Idempotency-Key for every call, so the restarted client's charge is a second one."""
    spec = {"url": stripe.url, "api_key": API_KEY}
    killed_after_the_charge(sdk_client(children, {**spec, "pause": fifo(tmp_path)}), stripe)

    again = printed(sdk_client(children, spec))
    first, second = stripe.applied()
    assert again["id"] == second.id != first.id
    assert first.key != second.key
    assert [r.outcome for r in stripe.requests()] == ["applied", "applied"]


@pytest.mark.slow
def test_stripe_python_random_key_through_the_gateway_is_a_new_request_each_run(
    children: Children, stripe: Fake, tmp_path: Path
) -> None:
    """A random key per call is no identity: through the gateway, two runs that leave the
    key to stripe-python (and send no Intentlog-Step) are two operations, two charges. The
    gateway cannot know they were meant as one; the docs say to give a stable one."""
    gateway = stripe_gateway(children, stripe.url, tmp_path)
    spec = {"url": gateway.url + "/stripe", "api_key": API_KEY, "task": "order-42"}
    first, second = (printed(sdk_client(children, spec)) for _ in range(2))
    assert first["headers"]["intentlog-key"] != second["headers"]["intentlog-key"]
    assert "intentlog-replay" not in second["headers"]
    assert len(stripe.applied()) == 2


# -- curl ------------------------------------------------------------------------------------


def parse_curl(output: str) -> tuple[int, dict[str, str], str]:
    """``curl -i`` output: the status, the headers (lower-case names) and the body (read
    as text, so the CRLF of the head may have become LF)."""
    head, _, body = output.replace("\r\n", "\n").partition("\n\n")
    status_line, *lines = head.split("\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(status_line.split()[1]), headers, body.rstrip("\n")


def curl(*args: str) -> tuple[int, dict[str, str], str]:
    done = subprocess.run(
        ["curl", "-sS", "-i", *args], capture_output=True, text=True, timeout=DEADLINE
    )
    assert done.returncode == 0, done.stderr
    return parse_curl(done.stdout)


def curl_agent(children: Children, url: str, pause: str = "") -> Child:
    return children.start(["bash", "-c", CURL_AGENT, "agent", url, pause, API_KEY])


@pytest.mark.slow
@pytest.mark.parametrize("through", ["gateway", "alone"])
def test_curl_killed_after_the_charge_is_run_again(
    children: Children, stripe: Fake, tmp_path: Path, through: str
) -> None:
    """The same shell agent run twice, killed the first time after the charge: through the
    gateway the second run gets the recorded answer; straight at the fake (curl sends no
    idempotency key of its own) it charges again."""
    url = stripe.url
    if through == "gateway":
        gateway = stripe_gateway(children, stripe.url, tmp_path)
        url = gateway.url + "/stripe"
    killed_after_the_charge(curl_agent(children, url, fifo(tmp_path)), stripe)

    again = curl_agent(children, url)
    assert again.exited() == 0, str(again)
    status, headers, body = parse_curl("".join(again.seen["stdout"]))
    assert status == 200
    if through == "alone":
        first, second = stripe.applied()
        assert json.loads(body)["id"] == second.id != first.id
        return
    [charge] = stripe.applied()
    assert json.loads(body)["id"] == charge.id
    assert headers["intentlog-replay"] == "true"
    assert headers["intentlog-state"] == "CONFIRMED"
    assert charge.key == headers["intentlog-key"]
    # The API key went upstream in Authorization; no byte of it is in the journal's files.
    journal = b"".join(p.read_bytes() for p in tmp_path.glob("journal.db*"))
    assert journal and API_KEY.encode() not in journal


def test_curl_bad_input_is_a_problem_document_and_changes_nothing(
    children: Children, stripe: Fake, tmp_path: Path
) -> None:
    """428 (no task; a task but no identity), 422 (Intentlog-Step reused with another body),
    413 (over --max-body), 404 (no route): each application/problem+json saying what was
    wrong; nothing forwarded, the journal as it was (``intentlog status --json``)."""
    # --idle: the task stays held, so nothing settles it between the two looks.
    gateway = stripe_gateway(children, stripe.url, tmp_path, "--max-body", "1000", "--idle", "600")
    pay = gateway.url + "/stripe/v1/charges"
    auth = ["-u", f"{API_KEY}:"]
    form = [arg for name, value in CHARGE.items() for arg in ("-d", f"{name}={value}")]
    task = ["-H", "Intentlog-Task: order-42"]
    status, _, _ = curl(pay, *auth, *task, "-H", "Intentlog-Step: charge", *form)
    assert status == 200

    def journal() -> Any:
        return json.loads(run_cli(gateway.db, "status", "--json").stdout)

    before, sent = journal(), len(stripe.requests())
    big = tmp_path / "big.txt"
    big.write_text("amount=500&description=" + "x" * 2000)
    cases = [
        (428, "no-task", "Intentlog-Task", [pay, *auth, "-H", "Intentlog-Step: s", *form]),
        (428, "no-identity", "Intentlog-Step", [pay, *auth, "-H", "Intentlog-Task: t2", *form]),
        (
            422,
            "identity-reused",
            "another request",
            [pay, *auth, *task, "-H", "Intentlog-Step: charge", "-d", "amount=600", *form[2:]],
        ),
        (
            413,
            "too-large",
            "over 1000 bytes",
            [pay, *auth, *task, "-H", "Intentlog-Step: big", "--data-binary", f"@{big}"],
        ),
        (
            404,
            "unknown-route",
            "/paypal/v2/checkout/orders",
            [gateway.url + "/paypal/v2/checkout/orders", *auth, *task, *form],
        ),
    ]
    for want, kind, says, args in cases:
        status, headers, body = curl(*args)
        problem = json.loads(body)
        assert (status, headers["content-type"]) == (want, "application/problem+json"), body
        assert problem["status"] == want and problem["type"].endswith("/" + kind), problem
        assert problem["title"] and says in problem["detail"], problem
        assert "intentlog-state" not in headers
    assert journal() == before
    assert len(stripe.requests()) == sent
    assert run_cli(gateway.db, "show", "t2").returncode == 1  # no task t2 was made


# -- starting and stopping ---------------------------------------------------------------------

GOOD = '[[route]]\nname = "pay"\nprefix = "/pay"\nupstream = "http://127.0.0.1:9"\n'
MALFORMED = {
    "unknown field": (
        GOOD + 'profile = "stripe"\n\n[[route]]\nname = "mail"\nprefix = "/mail"\n'
        'upstream = "http://127.0.0.1:9"\nidempotent = true\nkey_retension = "24h"\n',
        ["routes.toml:7", "route 2", "'key_retension'", "key_retention"],
    ),
    "bad upstream": (
        '[[route]]\nname = "pay"\nprefix = "/pay"\nupstream = "127.0.0.1:9"\n',
        ["routes.toml:1", "route 1", "upstream", "'127.0.0.1:9'"],
    ),
    "unknown profile": (
        GOOD + 'profile = "strype"\n',
        ["routes.toml:1", "route 1 ('pay')", "field 'profile'", "'strype'", "stripe"],
    ),
    "profile and an option": (
        GOOD + 'profile = "stripe"\nkey_retention = "24h"\n',
        ["routes.toml:1", "route 1 ('pay')", "'key_retention'", "profile"],
    ),
    "duplicate prefix": (
        GOOD + '\n[[route]]\nname = "pay2"\nprefix = "/pay/"\nupstream = "http://127.0.0.1:9"\n',
        ["routes.toml", "prefix", "'/pay'"],
    ),
}
#: What the duplicate prefix's message should name as well, as every other one does: the
#: line of the second route, and which routes.
DUPLICATE_WHERE = ["routes.toml:6", "route 2"]


def gateway_command(folder: Path, *args: str) -> subprocess.Popen[str]:
    """``intentlog gateway ARGS`` started in ``folder``, without the test's INTENTLOG_*
    environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("INTENTLOG_")}
    return subprocess.Popen(
        [sys.executable, "-m", "intentlog.cli", "gateway", "--db", str(folder / "j.db"), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=folder,
        env=env,
    )


def test_a_gateway_that_cannot_start_says_why_and_listens_on_nothing(tmp_path: Path) -> None:
    """A malformed routes file (each case of MALFORMED), or an address off loopback with no
    token: the gateway exits 1 at start, never says it listens, names what was wrong (the
    file's line, the route and the field) and opens no journal. The cases run at once."""
    started: dict[str, tuple[Path, subprocess.Popen[str]]] = {}
    for index, (case, (text, _)) in enumerate(MALFORMED.items()):
        folder = tmp_path / f"case{index}"
        folder.mkdir()
        (folder / "routes.toml").write_text(text)
        listen = ("--listen", "127.0.0.1:0")
        started[case] = folder, gateway_command(folder, "--routes", "routes.toml", *listen)
    (tmp_path / "routes.toml").write_text(GOOD)
    off_loopback = gateway_command(tmp_path, "--routes", "routes.toml", "--listen", "0.0.0.0:0")
    said: dict[str, str] = {}
    for case, (folder, proc) in started.items():
        out, err = proc.communicate(timeout=DEADLINE)
        said[case] = err
        assert (proc.returncode, out) == (1, ""), (case, out, err)  # it never listened
        assert err.startswith("error: routes.toml"), (case, err)
        missing = [part for part in MALFORMED[case][1] if part not in err]
        assert not missing, (case, missing, err)
        assert not (folder / "j.db").exists()  # stopped before it opened the journal
    out, err = off_loopback.communicate(timeout=DEADLINE)
    assert (off_loopback.returncode, out) == (1, "")
    assert "'0.0.0.0', which is not a loopback address" in err
    assert "--token" in err and "Intentlog-Token" in err
    assert all(part in said["duplicate prefix"] for part in DUPLICATE_WHERE), said


def test_with_a_token_a_request_without_it_is_401_and_nothing_is_forwarded(
    children: Children, stripe: Fake, tmp_path: Path
) -> None:
    token = "gateway-token-0123456789"
    gateway = stripe_gateway(children, stripe.url, tmp_path, "--token", token)
    pay = gateway.url + "/stripe/v1/charges"
    for sent in ({}, {"Intentlog-Token": "gateway-token-wrong-value"}):
        for method in ("POST", "GET"):
            answer = send(pay, task="order-42", step="charge", form=CHARGE, method=method,
                          headers={**STRIPE_AUTH, **sent})  # fmt: skip
            assert answer.status_code == 401, answer.text
            assert answer.headers["content-type"] == "application/problem+json"
            assert "Intentlog-Token" in answer.json()["detail"]
    assert stripe.requests() == []
    assert run_cli(gateway.db, "show", "order-42").returncode == 1  # nothing journaled
    answer = send(pay, task="order-42", step="charge", form=CHARGE,
                  headers={**STRIPE_AUTH, "Intentlog-Token": token})  # fmt: skip
    assert answer.status_code == 200 and len(stripe.applied()) == 1


def refuses_connections(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=DEADLINE).close()
    except ConnectionRefusedError:
        return True
    return False


def test_sigterm_with_a_request_in_flight_answers_it_then_exits_0(
    children: Children, tmp_path: Path
) -> None:
    """SIGTERM while a charge is held at the service: the gateway stops accepting
    connections, the charge is answered once the service answers, the gateway exits 0 with
    the operation CONFIRMED and the task settled (completed)."""
    with StripeFake(api_key=API_KEY) as fake:
        gateway = stripe_gateway(children, fake.url, tmp_path)
        fake.hold()
        answers: list[httpx.Response] = []

        def pay() -> None:
            auth = {"Authorization": f"Bearer {API_KEY}"}
            url = gateway.url + "/stripe/v1/charges"
            answers.append(send(url, task="order-42", step="charge", form=CHARGE, headers=auth))

        client = threading.Thread(target=pay, daemon=True)
        client.start()
        assert fake.wait_held(1, timeout=DEADLINE)
        assert gateway.child is not None
        gateway.child.proc.send_signal(signal.SIGTERM)
        wait_until("the gateway stopped accepting", lambda: refuses_connections(gateway.port))
        assert gateway.child.proc.poll() is None  # still there, for the charge in flight
        fake.release()
        client.join(DEADLINE)
        [answer] = answers
        assert answer.status_code == 200, answer.text
        assert answer.headers["intentlog-state"] == "CONFIRMED"
        code = gateway.child.exited()
        [charge] = fake.applied()
        assert answer.json()["id"] == charge.id

    shown = json.loads(run_cli(gateway.db, "show", "order-42", "--json").stdout)
    [op] = shown["operations"]
    assert op["state"] == "CONFIRMED" and op["receipt"]["http"]["body"]["id"] == charge.id
    assert code == 0, str(gateway.child)
    assert shown["task"]["completed"] is True
