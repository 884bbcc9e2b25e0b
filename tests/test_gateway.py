"""intentlog gateway: the routes file, identity, replays, refusals and UNRESOLVED, with a real
gateway process in front of the project's Stripe fake (counted at the fake's own record)."""

from __future__ import annotations

import http.server
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from tests.support.gateway_support import Children, Gateway, route, run_cli, send, write_routes

from intentlog import InvalidInput
from intentlog.gateway import parse_routes
from intentlog.testing.fakes import GitHubFake, StripeFake

CHARGE = {"amount": "500", "currency": "usd", "source": "tok_visa"}
SECRET = "sk_test_gateway_never_journaled_4242"
AUTH = {"Authorization": f"Bearer {SECRET}"}


def post(gateway: Gateway, path: str, data: dict[str, str], **headers: str) -> httpx.Response:
    """POST ``data`` (a form) to the gateway's ``path`` with the service's credential and
    ``headers``, each named with ``_`` for ``-`` (``Intentlog_Task``)."""
    sent = {k.replace("_", "-"): v for k, v in headers.items()}
    return send(gateway.url + path, task=None, form=data, headers={**AUTH, **sent})


@pytest.fixture(scope="module")
def stripe() -> Iterator[StripeFake]:
    with StripeFake(index_lag=False) as fake:  # its search finds a charge at once
        yield fake


@pytest.fixture(scope="module")
def github() -> Iterator[GitHubFake]:
    with GitHubFake() as fake:
        yield fake


@pytest.fixture(scope="module")
def gateway(
    stripe: StripeFake, github: GitHubFake, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    where = tmp_path_factory.mktemp("gateway")
    routes = write_routes(
        where / "routes.toml",
        [
            route("stripe", "/stripe", stripe.url, profile="stripe"),
            route("ledger", "/ledger", stripe.url),
            route("relay", "/relay", stripe.url, passthrough=True),
            route("github", "/github", github.url, profile="github"),
        ],
    )
    with Children() as children:
        gw = Gateway(
            children, routes, db=str(where / "journal.db"), cwd=where, args=("--idle", "0.5")
        )
        gw.start()
        yield gw
        gw.stop()


def _applied(stripe: StripeFake, task: str) -> int:
    return sum(1 for a in stripe.applied() if task in json.dumps(a.__dict__, default=str))


def _ops(gateway: Gateway, task: str) -> list[dict[str, object]]:
    out = run_cli(gateway.db, "show", task, "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    return list(json.loads(out.stdout)["operations"])


def test_a_charge_is_journaled_once_and_a_repeat_is_its_recorded_answer(
    gateway: Gateway, stripe: StripeFake
) -> None:
    before = len(stripe.applied())
    first = post(gateway, "/stripe/v1/charges", CHARGE, Intentlog_Task="t-once",
                 Intentlog_Step="charge")  # fmt: skip
    assert first.status_code == 200, first.text
    assert first.headers["Intentlog-State"] == "CONFIRMED"
    assert "Intentlog-Replay" not in first.headers
    key = first.headers["Intentlog-Key"]
    assert (
        first.json()["metadata"]["intentlog_key"] == key
    )  # the key rides where Stripe's search finds it
    again = post(gateway, "/stripe/v1/charges", CHARGE, Intentlog_Task="t-once",
                 Intentlog_Step="charge")  # fmt: skip
    assert again.status_code == 200
    assert again.headers["Intentlog-Replay"] == "true"
    assert again.json() == first.json()
    assert len(stripe.applied()) == before + 1
    [op] = _ops(gateway, "t-once")
    assert op["state"] == "CONFIRMED" and op["key"] == key
    assert op["args"] == {
        "method": "POST",
        "route": "/stripe",
    }  # never the path: it may hold a token


def test_the_same_identity_with_another_body_is_refused_and_sends_nothing(
    gateway: Gateway, stripe: StripeFake
) -> None:
    post(gateway, "/stripe/v1/charges", CHARGE, Intentlog_Task="t-422", Intentlog_Step="c")
    sent = len(stripe.requests())
    other = post(gateway, "/stripe/v1/charges", {**CHARGE, "amount": "900"},
                 Intentlog_Task="t-422", Intentlog_Step="c")  # fmt: skip
    assert other.status_code == 422
    assert other.headers["content-type"] == "application/problem+json"
    assert "another request" in other.json()["detail"]
    assert len(stripe.requests()) == sent
    assert [op["state"] for op in _ops(gateway, "t-422")] == ["CONFIRMED"]


def test_a_request_the_service_refused_is_failed_and_its_repeat_is_a_new_attempt(
    gateway: Gateway, stripe: StripeFake
) -> None:
    no_source = {"amount": "500", "currency": "usd"}
    first = post(gateway, "/stripe/v1/charges", no_source, Intentlog_Task="t-400",
                 Intentlog_Step="c")  # fmt: skip
    assert first.status_code == 400  # Stripe's own refusal, as it came
    assert first.headers["Intentlog-State"] == "FAILED"
    assert first.json()["error"]["param"] == "source"
    again = post(gateway, "/stripe/v1/charges", no_source, Intentlog_Task="t-400",
                 Intentlog_Step="c")  # fmt: skip
    assert again.status_code == 400
    assert again.headers["Intentlog-Key"] == first.headers["Intentlog-Key"] + ".2"
    assert [op["state"] for op in _ops(gateway, "t-400")] == ["FAILED", "FAILED"]


def test_an_answer_lost_to_a_5xx_is_settled_with_the_same_key_never_a_second_charge(
    gateway: Gateway, stripe: StripeFake
) -> None:
    before = len(stripe.applied())
    stripe.fail_next(500, applied=True)  # applied, but the answer says otherwise
    # Stripe keeps the 500 for the key and would replay it: the charge is found by its search.
    answer = post(gateway, "/stripe/v1/charges", CHARGE, Intentlog_Task="t-500", Intentlog_Step="c")
    assert answer.status_code == 200, answer.text
    assert answer.headers["Intentlog-Reconciled"] == "true"
    assert answer.json()["metadata"]["intentlog_key"] == answer.headers["Intentlog-Key"]
    again = post(gateway, "/stripe/v1/charges", CHARGE, Intentlog_Task="t-500", Intentlog_Step="c")
    assert again.json() == answer.json() and again.headers["Intentlog-Replay"] == "true"
    assert len(stripe.applied()) == before + 1


def test_a_neither_route_ends_unresolved_and_a_person_settles_it(
    gateway: Gateway, stripe: StripeFake
) -> None:
    before = len(stripe.applied())
    stripe.fail_next(500, applied=True)
    first = post(gateway, "/ledger/v1/charges", CHARGE, Intentlog_Task="t-neither",
                 Intentlog_Step="c")  # fmt: skip
    assert first.status_code == 409
    problem = first.json()
    assert first.headers["content-type"] == "application/problem+json"
    assert problem["state"] == "UNRESOLVED" and problem["task"] == "t-neither"
    assert problem["key"] == first.headers["Intentlog-Key"]
    assert problem["resolve"].endswith(f"resolve {problem['key']}")
    assert problem["resolve_with"] == ["--confirmed --receipt JSON", "--failed", "--retry"]
    assert problem["next_action"].startswith("ESCALATE")
    again = post(gateway, "/ledger/v1/charges", CHARGE, Intentlog_Task="t-neither",
                 Intentlog_Step="c")  # fmt: skip
    assert again.status_code == 409  # never sent blindly a second time
    assert len(stripe.applied()) == before + 1
    resolved = run_cli(
        gateway.db, "resolve", problem["key"], "--confirmed",
        "--receipt", '{"id": "ch_seen"}', "--note", "seen in the dashboard",
    )  # fmt: skip
    assert resolved.returncode == 0, resolved.stdout + resolved.stderr
    settled = post(gateway, "/ledger/v1/charges", CHARGE, Intentlog_Task="t-neither",
                   Intentlog_Step="c")  # fmt: skip
    assert settled.status_code == 200
    assert settled.json() == {"id": "ch_seen"}
    assert settled.headers["Intentlog-Replay"] == "true"
    assert len(stripe.applied()) == before + 1


def test_reads_and_passthrough_routes_are_forwarded_unjournaled(
    gateway: Gateway, stripe: StripeFake
) -> None:
    made = post(gateway, "/stripe/v1/charges", CHARGE, Intentlog_Task="t-read", Intentlog_Step="c")
    read = send(f"{gateway.url}/stripe/v1/charges/{made.json()['id']}", task=None,
                method="GET", headers=AUTH)  # fmt: skip
    assert read.headers["Intentlog-State"] == "PASSED"
    before = len(stripe.applied())
    relayed = post(gateway, "/relay/v1/charges", CHARGE)  # no task, no identity: not journaled
    assert relayed.status_code == 200 and relayed.headers["Intentlog-State"] == "PASSED"
    assert len(stripe.applied()) == before + 1
    assert len(_ops(gateway, "t-read")) == 1


def test_a_request_without_a_task_or_an_identity_is_refused_before_anything_is_sent(
    gateway: Gateway, stripe: StripeFake
) -> None:
    sent = len(stripe.requests())
    no_task = post(gateway, "/stripe/v1/charges", CHARGE)
    assert no_task.status_code == 428 and "Intentlog-Task" in no_task.json()["detail"]
    no_identity = post(gateway, "/stripe/v1/charges", CHARGE, Intentlog_Task="t-428")
    assert no_identity.status_code == 428
    assert "Idempotency-Key" in no_identity.json()["detail"]
    bad = post(gateway, "/stripe/v1/charges", CHARGE, Intentlog_Task="t-428",
               Intentlog_Step="\x7f")  # fmt: skip
    assert bad.status_code == 400 and "Intentlog-Step" in bad.json()["detail"]
    assert len(stripe.requests()) == sent


def test_the_clients_own_idempotency_key_is_an_identity(
    gateway: Gateway, stripe: StripeFake
) -> None:
    before = len(stripe.applied())
    for _ in range(2):
        answer = post(gateway, "/stripe/v1/charges", CHARGE, Intentlog_Task="t-own",
                      Idempotency_Key="order-42-charge")  # fmt: skip
        assert answer.status_code == 200
    assert len(stripe.applied()) == before + 1
    # The service got the operation's key, not the client's.
    assert [r.outcome for r in stripe.requests()[-1:]] == ["applied"]
    assert str(stripe.requests()[-1].key).startswith("gateway.stripe-")


def test_a_key_an_sdk_makes_up_per_call_is_no_identity(
    gateway: Gateway, stripe: StripeFake
) -> None:
    sent = len(stripe.requests())
    made_up = "stripe-node-retry-4f7b2d0e-9c1a-4b7e-8f00-2a1d3c4b5e6f"
    answer = post(gateway, "/stripe/v1/charges", CHARGE, Intentlog_Task="t-random",
                  Idempotency_Key=made_up)  # fmt: skip
    assert answer.status_code == 428
    assert "Intentlog-Step" in answer.json()["detail"]
    assert answer.json()["error"]["code"] == "no-identity"  # Stripe's SDKs raise on an error member
    assert len(stripe.requests()) == sent


def test_concurrent_repeats_of_one_request_apply_it_once(
    gateway: Gateway, stripe: StripeFake
) -> None:
    before = len(stripe.applied())
    answers: list[httpx.Response] = []

    def repeat() -> None:
        answers.append(post(gateway, "/stripe/v1/charges", CHARGE, Intentlog_Task="t-race",
                            Intentlog_Step="c"))  # fmt: skip

    threads = [threading.Thread(target=repeat) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(a.status_code for a in answers) == [200] * 8
    assert len({a.json()["id"] for a in answers}) == 1
    assert len(stripe.applied()) == before + 1


def test_no_credential_reaches_the_journal(gateway: Gateway) -> None:
    post(gateway, "/stripe/v1/charges", CHARGE, Intentlog_Task="t-secret", Intentlog_Step="c")
    for path in Path(gateway.db).parent.iterdir():
        if path.name.startswith("journal.db"):
            assert SECRET.encode() not in path.read_bytes(), path.name


ROUTE = '[[route]]\nprefix = "/s"\nupstream = "http://127.0.0.1:1"\n'


@pytest.mark.parametrize(
    ("text", "names"),
    [
        (ROUTE + "colour = 1\n", ["routes.toml:1", "route 1", "'colour'"]),
        ('[[route]]\nprefix = "/s"\nupstream = "ftp://x"\n', ["route 1", "upstream"]),
        (ROUTE + 'profile = "strype"\n', ["route 1", "'profile'", "unknown profile"]),
        (ROUTE + 'profile = "stripe"\nidempotent = true\n', ["'idempotent'", "profile"]),
        (ROUTE + "idempotent = true\n", ["route 1", "'key_retention'", '"24h"']),
        (ROUTE + 'profile = "smtp"\n', ["'profile'", "not an HTTP service"]),
        (ROUTE + "\n" + ROUTE.replace('"/s"', '"/s/"\nname = "t"'), ["two routes", "prefix"]),
        (ROUTE + 'profile = "sqs_fifo"\n', ["sqs_fifo", "no place"]),
        (ROUTE + "passthrough = true\ntimeout = 3\n", ["'timeout'", "passthrough"]),
        ('[[route]]\nprefix = "s"\nupstream = "http://x"\n', ["prefix must be a path"]),
        ('[[route]]\nprefix = "/s"\nupstream = "http://u:p@x"\n', ["credentials"]),
        ("[routes]\n", ["unknown table"]),
        ("", ["no routes"]),
    ],
)
def test_a_bad_routes_file_is_refused_naming_what_is_wrong(text: str, names: list[str]) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_routes(text)
    for name in names:
        assert name in str(caught.value)


def test_the_longest_prefix_wins_at_a_segment_boundary() -> None:
    routes = parse_routes(
        '[[route]]\nprefix = "/s"\nupstream = "http://127.0.0.1:1"\n'
        '[[route]]\nprefix = "/s/v2"\nupstream = "http://127.0.0.1:2/v2"\nprofile = "github"\n'
    )
    assert routes.match("/s/v2/x") is not None
    assert routes.match("/s/v2/x").upstream.endswith(":2/v2")  # type: ignore[union-attr]
    assert routes.match("/s/v1").name == "s"  # type: ignore[union-attr]
    assert routes.match("/sx") is None
    assert routes.match("/s/v2/x").target("/s/v2/x/y", "a=1") == "http://127.0.0.1:2/v2/x/y?a=1"  # type: ignore[union-attr]


def test_the_gateway_refuses_to_start_off_loopback_without_a_token(tmp_path: Path) -> None:
    routes = tmp_path / "routes.toml"
    routes.write_text(ROUTE)
    out = run_cli(
        str(tmp_path / "j.db"), "gateway", "--routes", str(routes), "--listen", "0.0.0.0:0",
        env={**os.environ, "INTENTLOG_GATEWAY_TOKEN": ""},
    )  # fmt: skip
    assert out.returncode == 1
    assert "token" in out.stderr and out.stdout == ""


# The gateway run with an OpenTelemetry SDK provider that prints each finished span's name.
_TRACED = """
import sys
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

class Names(SpanExporter):
    def export(self, spans):
        for span in spans:
            print("span", span.name, file=sys.stderr, flush=True)
        return SpanExportResult.SUCCESS

provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(Names()))
trace.set_tracer_provider(provider)
from intentlog.cli import main
sys.argv[0] = "intentlog"
main()
"""


def test_metrics_and_traces_cover_the_gateways_requests(stripe: StripeFake, tmp_path: Path) -> None:
    # No name: the route's is taken from its prefix.
    entry = {"prefix": "/stripe", "upstream": stripe.url, "profile": "stripe"}
    routes = write_routes(tmp_path / "routes.toml", [entry])
    with Children() as children:
        gateway = Gateway(
            children, routes, db=str(tmp_path / "j.db"), cwd=tmp_path,
            args=("--metrics", "127.0.0.1:0", "--trace"), program=("-c", _TRACED),
        )  # fmt: skip
        url = gateway.start()
        assert gateway.child is not None
        metrics = gateway.child.expect("intentlog gateway: metrics at ", stream="stderr")
        answer = send(f"{url}/stripe/v1/charges", task="t-obs", step="c", form=CHARGE,
                      headers=AUTH)  # fmt: skip
        assert answer.status_code == 200
        text = httpx.get(metrics.split()[-1], timeout=30).text
        assert 'effect="gateway.stripe"' in text and 'state="CONFIRMED"' in text
        names: set[str] = set()
        while not names & {"intentlog.run", "intentlog.submit"}:  # printed as they finish
            names.add(gateway.child.expect("span ", stream="stderr").split()[1])
        assert names & {"intentlog.run", "intentlog.submit"}, names
        gateway.stop()


def test_an_answer_over_the_bound_is_kept_as_its_size_and_a_repeat_says_so(
    gateway: Gateway, stripe: StripeFake
) -> None:
    big = {**CHARGE, "description": "d" * 40_000}
    first = post(gateway, "/stripe/v1/charges", big, Intentlog_Task="t-big", Intentlog_Step="c")
    assert first.status_code == 200 and len(first.content) > 40_000  # given whole, once
    again = post(gateway, "/stripe/v1/charges", big, Intentlog_Task="t-big", Intentlog_Step="c")
    assert again.status_code == 200 and again.headers["Intentlog-Replay"] == "true"
    kept = again.json()["intentlog"]
    assert kept["bytes"] == len(first.content) and "not kept" in kept["replay"]
    assert [op["state"] for op in _ops(gateway, "t-big")] == ["CONFIRMED"]


def test_a_request_a_person_settled_as_failed_is_never_sent_again(
    gateway: Gateway, stripe: StripeFake
) -> None:
    before = len(stripe.applied())
    stripe.fail_next(500, applied=True)  # it did apply; the person will judge it wrongly
    first = post(gateway, "/ledger/v1/charges", CHARGE, Intentlog_Task="t-failed",
                 Intentlog_Step="c")  # fmt: skip
    key = first.json()["key"]
    resolved = run_cli(
        gateway.db, "resolve", key, "--failed", "--confirm", "failed gateway.ledger",
        "--note", "not in the ledger",
    )  # fmt: skip
    assert resolved.returncode == 0, resolved.stdout + resolved.stderr
    sent = len(stripe.requests())
    again = post(gateway, "/ledger/v1/charges", CHARGE, Intentlog_Task="t-failed",
                 Intentlog_Step="c")  # fmt: skip
    assert again.status_code == 409 and again.json()["type"].endswith("/settled-failed")
    assert "new identity" in again.json()["detail"]
    assert len(stripe.requests()) == sent and len(stripe.applied()) == before + 1
    assert [op["state"] for op in _ops(gateway, "t-failed")] == ["FAILED"]


def test_a_client_key_names_its_request_whatever_the_task(
    gateway: Gateway, stripe: StripeFake
) -> None:
    before = len(stripe.applied())
    first = post(gateway, "/stripe/v1/charges", CHARGE, Intentlog_Task="run-1",
                 Idempotency_Key="order-77-charge")  # fmt: skip
    assert first.status_code == 200
    other_run = post(gateway, "/stripe/v1/charges", CHARGE, Intentlog_Task="run-2",
                     Idempotency_Key="order-77-charge")  # fmt: skip
    assert other_run.status_code == 422  # refused, never a second charge
    assert len(stripe.applied()) == before + 1


def test_another_account_under_the_same_identity_is_refused_not_given_the_answer(
    gateway: Gateway, stripe: StripeFake
) -> None:
    made = post(gateway, "/stripe/v1/charges", CHARGE, Intentlog_Task="t-acct",
                Intentlog_Step="c", Stripe_Account="acct_A")  # fmt: skip
    assert made.status_code == 200
    sent = len(stripe.requests())
    other = post(gateway, "/stripe/v1/charges", CHARGE, Intentlog_Task="t-acct",
                 Intentlog_Step="c", Stripe_Account="acct_B")  # fmt: skip
    assert other.status_code == 422 and made.json()["id"] not in other.text
    assert len(stripe.requests()) == sent


def test_a_body_the_service_cannot_take_is_refused_before_anything_is_journaled(
    gateway: Gateway, stripe: StripeFake
) -> None:
    sent = len(stripe.requests())
    clash = {**CHARGE, "metadata[intentlog_key]": "someone-elses"}
    answer = post(gateway, "/stripe/v1/charges", clash, Intentlog_Task="t-clash",
                  Intentlog_Step="c")  # fmt: skip
    assert answer.status_code == 400 and "intentlog_key" in answer.json()["detail"]
    assert len(stripe.requests()) == sent
    shown = run_cli(gateway.db, "show", "t-clash", "--json")
    assert shown.returncode != 0 or json.loads(shown.stdout)["operations"] == []


def test_a_profile_writes_its_key_only_where_its_search_looks(
    gateway: Gateway, github: GitHubFake
) -> None:
    auth = {"Authorization": "Bearer ghp_gateway"}
    made = send(f"{gateway.url}/github/repos/acme/shop/issues", task="t-gh", step="open",
                json={"title": "Refund", "body": "Order 42"}, headers=auth)  # fmt: skip
    assert made.status_code == 201, made.text
    assert "intentlog-key: " in made.json()["body"]  # the search finds the issue by it
    with Recorder() as upstream:
        where = Path(gateway.db).parent / "recorded"
        where.mkdir(exist_ok=True)
        routes = write_routes(
            where / "routes.toml", [route("gh", "/gh", upstream.url, profile="github")]
        )
        with Children() as children:
            gw = Gateway(children, routes, db=str(where / "journal.db"), cwd=where)
            gw.start()
            for method, path in (("PATCH", "/repos/a/b/issues/7"), ("POST", "/repos/a/b/comments")):
                answer = send(f"{gw.url}/gh{path}", task="t-gh", step=f"{method}{path}",
                              method=method, json={"state": "closed"}, headers=auth)  # fmt: skip
                assert answer.status_code == 201, answer.text
            gw.stop()
    # Neither the PATCH nor the comment (no search finds it) had a marker written into it.
    assert [(m, p, b) for m, p, b in upstream.seen] == [
        ("PATCH", "/repos/a/b/issues/7", {"state": "closed"}),
        ("POST", "/repos/a/b/comments", {"state": "closed"}),
    ]


class Recorder:
    """An upstream on 127.0.0.1 that answers ``status`` with ``answer`` (201 {"id": 1}) and
    records each request's method, path and JSON body."""

    def __init__(self, status: int = 201, answer: bytes = b'{"id": 1}') -> None:
        self.seen: list[tuple[str, str, object]] = []
        recorder = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _any(self) -> None:
                size = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(size) or b"null")
                recorder.seen.append((self.command, self.path, body))
                out = recorder.answer
                self.send_response(recorder.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            do_POST = do_PATCH = do_PUT = _any

            def log_message(self, *args: object) -> None:
                pass

        self.status, self.answer = status, answer
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> Recorder:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_conflict_from_a_service_without_keys_is_its_refusal_not_a_replay(
    tmp_path: Path,
) -> None:
    conflict = b'{"message": "Merge conflict"}'  # GitHub's 409: no error member, a refusal
    with Recorder(409, conflict) as upstream, Children() as children:
        routes = write_routes(tmp_path / "routes.toml", [route("merge", "/merge", upstream.url)])
        gw = Gateway(children, routes, db=str(tmp_path / "journal.db"), cwd=tmp_path)
        gw.start()
        answer = send(f"{gw.url}/merge/pulls/1/merge", task="t-409", step="merge",
                      method="PUT", json={})  # fmt: skip
        assert answer.status_code == 409 and answer.content == conflict  # as it came
        assert answer.headers["Intentlog-State"] == "FAILED"
        gw.stop()


def test_a_replay_of_an_answer_whose_secret_was_redacted_says_so(tmp_path: Path) -> None:
    secret = b'{"id": "pi_1", "client_secret": "pi_1_secret_abcdef"}'
    with Recorder(200, secret) as upstream, Children() as children:
        routes = write_routes(tmp_path / "routes.toml", [route("pay", "/pay", upstream.url)])
        gw = Gateway(children, routes, db=str(tmp_path / "journal.db"), cwd=tmp_path)
        gw.start()
        first = send(f"{gw.url}/pay/intents", task="t-red", step="pi", json={"amount": 5})
        assert first.content == secret and "Intentlog-Redacted" not in first.headers
        again = send(f"{gw.url}/pay/intents", task="t-red", step="pi", json={"amount": 5})
        assert again.headers["Intentlog-Redacted"] == "true"
        assert b"pi_1_secret_abcdef" not in again.content and again.json()["id"] == "pi_1"
        assert len(upstream.seen) == 1
        gw.stop()


def test_a_service_that_cannot_be_reached_is_failed_not_unresolved(tmp_path: Path) -> None:
    import socket

    with socket.socket() as probe:  # a port nothing listens on once it is closed
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}"
    with Children() as children:
        routes = write_routes(tmp_path / "routes.toml", [route("down", "/down", closed)])
        gw = Gateway(children, routes, db=str(tmp_path / "journal.db"), cwd=tmp_path)
        gw.start()
        first = send(f"{gw.url}/down/payments", task="t-down", step="pay", json={"a": 1})
        assert first.status_code == 502 and first.json()["state"] == "FAILED", first.text
        assert "nothing was sent" in first.json()["detail"]
        again = send(f"{gw.url}/down/payments", task="t-down", step="pay", json={"a": 1})
        assert again.headers["Intentlog-Key"] == first.headers["Intentlog-Key"] + ".2", again.text
        states = [op["state"] for op in _ops(gw, "t-down")]
        assert states == ["FAILED", "FAILED"]  # nobody is paged for an outage
        gw.stop()
