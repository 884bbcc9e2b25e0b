"""intentlog.metrics against real journals (SQLite files, PostgreSQL) and a real worker process
serving /metrics over HTTP; every exposition is read back by Prometheus's own text parser."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

import intentlog
import intentlog.metrics
from intentlog.testing import ReferenceService

SUPPORT = Path(__file__).parent / "support"
Labels = tuple[tuple[str, str], ...]
Samples = dict[tuple[str, Labels], float]


def scrape(text: str) -> Samples:
    """Every sample of an exposition, by (name, sorted labels)."""
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def render(journal: intentlog.Journal) -> Samples:
    body, content_type = intentlog.metrics.render(journal)
    assert content_type.startswith("text/plain")
    return scrape(body.decode())


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def by_effect(samples: Samples, name: str, tag: str) -> dict[str, float]:
    """A per-effect gauge's series for this test's effects (their names end in ``tag``)."""
    return {
        dict(labels)["effect"].removesuffix(tag): v
        for (n, labels), v in samples.items()
        if n == name and dict(labels).get("effect", "").endswith(tag)
    }


@pytest.fixture
def counting() -> Iterator[None]:
    intentlog.metrics.enable()
    intentlog.metrics.enable()  # idempotent: one observer, so each event is counted once
    try:
        yield
    finally:
        intentlog.metrics.disable()


class Flaky:
    """A submit that raises an ambiguous error (no answer) on its first ``fails`` calls."""

    def __init__(self, fails: int) -> None:
        self.fails = fails
        self.calls = 0

    def __call__(self, key: str, **args: Any) -> dict[str, Any]:
        self.calls += 1
        if self.calls <= self.fails:
            raise ConnectionError("no answer")
        return {"id": f"r-{self.calls}"}


class Lookup:
    """A reconciler answering from a script (an exception is raised), counting its answers."""

    def __init__(self, *script: Any) -> None:
        self.script = list(script)
        self.answers: dict[str, int] = {}

    def __call__(self, key: str) -> intentlog.LookupResult:
        answer = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        kind = {
            intentlog.Found: "found",
            intentlog.NotFound: "not_found",
            intentlog.Indeterminate: "indeterminate",
        }.get(type(answer), "failed")
        self.answers[kind] = self.answers.get(kind, 0) + 1
        if isinstance(answer, BaseException):
            raise answer
        return answer  # type: ignore[no-any-return]


def refuse(key: str, **args: Any) -> dict[str, Any]:
    raise intentlog.Rejected("card declined")


def test_render_reads_real_operations(journal_url: str, counting: None) -> None:
    tag = f"_{uuid.uuid4().hex[:8]}"  # counters and known effects are the process's own

    def effect(name: str, submit: Callable[..., Any], **policy: Any) -> intentlog.Effect:
        return intentlog.Effect(name + tag, submit, **policy)

    dedupe = {"idempotent": True, "key_retention": 3600}
    fine = effect("fine", Flaky(0), **dedupe)
    forever = effect(
        "forever", Flaky(0), idempotent=True, key_retention=intentlog.FOREVER
    )  # keys kept forever: no series
    neither = effect("neither", Flaky(1))  # raised ambiguously, cannot dedupe nor be asked
    retried = effect("retried", Flaky(1))
    refused = effect("refused", refuse)
    stuck = effect("stuck", Flaky(1), idempotent=True, key_retention=7200, timeout=600)
    redo = effect("redo", Flaky(1), timeout=0.05, **dedupe)
    asked_lookup = Lookup(OSError("lookup down"), intentlog.Found({"id": "found-1"}))
    asked = effect("asked", Flaky(1), reconcile=asked_lookup, timeout=0.05)
    again_lookup = Lookup(intentlog.NotFound())
    again = effect("again", Flaky(1), reconcile=again_lookup, timeout=0.05)
    idle = effect("idle", Flaky(0), idempotent=True, key_retention=600)  # never run
    intentlog.metrics.know([idle])

    with (
        intentlog.open(journal_url, max_wait=10.0) as journal,
        intentlog.open(journal_url, max_wait=0.0) as hasty,
    ):
        before = render(journal)
        with hasty.task("t") as task:
            for i in range(3):
                task.run(fine, n=i)
            task.run(forever, n=0)
            for neither_effect in (neither, retried):
                with pytest.raises(intentlog.OutcomeUnknown):
                    task.run(neither_effect, n=0)
            with pytest.raises(intentlog.Rejected):
                task.run(refused, n=0)
            with pytest.raises(intentlog.StillInFlight):
                task.run(stuck, n=0)  # its request may run for 600 s: SUBMITTED, in flight
            with pytest.raises(intentlog.StillInFlight):
                task.run(redo, n=0)  # in flight for 0.15 s, beyond a max_wait of 0
        retry_key = next(op.key for op in journal.operations() if op.effect == retried.name)
        journal.resolve(retry_key, "retry", actor="test", accept_risk=True)
        with journal.task("t") as task:
            task.run(redo, n=0)  # another handle, after the deadline: resent (dedupe)
            task.run(retried, n=0)  # a person said retry
            task.run(asked, n=0)  # the lookup raised, then found it
            task.run(again, n=0)  # not found: resent after this run's own error
        ops = {op.effect.removesuffix(tag): op for op in journal.operations()}
        t0 = journal.store.now()
        after = render(journal)
        t1 = journal.store.now()

    counts = {
        dict(labels)["state"]: v for (n, labels), v in after.items() if n == "intentlog_operations"
    }
    assert counts == {"PLANNED": 0, "SUBMITTED": 1, "CONFIRMED": 8, "FAILED": 1, "UNRESOLVED": 1}
    assert value(after, "intentlog_unresolved") == 1
    sent = ops["stuck"].submitted_at
    first = ops["stuck"].first_submitted_at
    assert sent is not None and first is not None
    age = value(after, "intentlog_oldest_submitted_age_seconds")
    assert t0 - sent <= age <= t1 - sent
    headroom = by_effect(after, "intentlog_retention_headroom_seconds", tag)
    assert set(headroom) == {"fine", "stuck", "redo", "idle"}
    assert headroom["fine"] == headroom["redo"] == 3600  # nothing of theirs in flight
    assert headroom["idle"] == 600  # known to this process, never run
    assert first + 7200 - t1 <= headroom["stuck"] <= first + 7200 - t0 < 7200

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    reconciles = {
        (e, r): delta("intentlog_reconciles_total", effect=e + tag, result=r)
        for e in ("asked", "again", "stuck", "redo")
        for r in ("found", "not_found", "indeterminate", "failed")
    }
    assert {k: v for k, v in reconciles.items() if v} == {
        ("asked", "failed"): asked_lookup.answers["failed"],
        ("asked", "found"): asked_lookup.answers["found"],
        ("again", "not_found"): again_lookup.answers["not_found"],
    }
    assert asked_lookup.answers == {"failed": 1, "found": 1}
    resends = {
        (dict(labels)["effect"].removesuffix(tag), dict(labels)["reason"]): v
        for (n, labels), v in after.items()
        if n == "intentlog_resends_total" and dict(labels)["effect"].endswith(tag)
    }
    assert resends == {
        ("redo", "dedupe_after_timeout"): 1,
        ("retried", "retry_resolved"): 1,
        ("again", "after_error"): 1,
    }
    assert ops["again"].attempts == ops["redo"].attempts == ops["retried"].attempts == 2
    # Every run wrote at least its intent and its outcome, each timed.
    assert delta("intentlog_commit_seconds_count") >= 13  # thirteen runs, each writes
    assert delta("intentlog_commit_seconds_sum") > 0
    buckets = [
        v for (n, labels), v in sorted(after.items()) if n == "intentlog_commit_seconds_bucket"
    ]
    assert value(after, "intentlog_commit_seconds_bucket", le="+Inf") == max(buckets)


def test_async_runs_are_counted_too(journal_url: str, counting: None) -> None:
    tag = f"_{uuid.uuid4().hex[:8]}"
    calls = {"submit": 0}

    async def submit(key: str, n: int) -> dict[str, Any]:
        calls["submit"] += 1
        if calls["submit"] == 1:
            raise ConnectionError("no answer")
        return {"id": "a-1"}

    async def lookup(key: str) -> intentlog.LookupResult:
        return intentlog.Found({"id": "a-1"})

    effect = intentlog.Effect("async" + tag, submit, reconcile=lookup, timeout=0.05)
    with intentlog.open(journal_url) as journal:
        before = render(journal)

        async def main() -> Any:
            async with intentlog.open_async(journal_url) as aj, aj.task("a") as task:
                return await task.run(effect, n=1)

        assert asyncio.run(main()) == {"id": "a-1"}
        after = render(journal)
    name = "intentlog_reconciles_total"
    assert value(after, name, effect=effect.name, result="found") == 1
    assert value(before, "intentlog_commit_seconds_count") < value(
        after, "intentlog_commit_seconds_count"
    )


def test_counters_stay_empty_until_enabled(tmp_path: Path) -> None:
    tag = f"_{uuid.uuid4().hex[:8]}"
    effect = intentlog.Effect(
        "off" + tag, Flaky(1), reconcile=lambda key: intentlog.Found({"id": "x"})
    )
    intentlog.metrics.disable()
    with intentlog.open(tmp_path / "j.db") as journal:
        before = render(journal)
        with journal.task("t") as task:
            task.run(effect, n=1)
        after = render(journal)
    assert value(after, "intentlog_reconciles_total", effect=effect.name, result="found") == 0
    assert value(after, "intentlog_commit_seconds_count") == value(
        before, "intentlog_commit_seconds_count"
    )
    assert value(after, "intentlog_operations", state="CONFIRMED") == 1  # gauges: always


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )


def test_nothing_is_imported_while_off(tmp_path: Path) -> None:
    code = f"""
import sys, intentlog
effect = intentlog.Effect(
    "e", lambda key, n: {{"id": n}}, idempotent=True, key_retention=intentlog.FOREVER
)
with intentlog.open({str(tmp_path / "j.db")!r}) as journal, journal.task("t") as task:
    task.run(effect, n=1)
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("prometheus_client", "opentelemetry"))
print("loaded:", loaded)
"""
    done = run_python(code)
    assert done.returncode == 0, done.stderr
    assert "loaded: []" in done.stdout


def test_missing_prometheus_client_names_the_extra(tmp_path: Path) -> None:
    code = f"""
import sys
sys.modules["prometheus_client"] = None  # as if not installed
import intentlog, intentlog.metrics
with intentlog.open({str(tmp_path / "j.db")!r}) as journal:
    for call in (lambda: intentlog.metrics.render(journal), intentlog.metrics.enable):
        try:
            call()
        except intentlog.InvalidInput as exc:
            print("refused:", exc)
"""
    done = run_python(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("pip install 'intentlog[metrics]'") == 2


# -- intentlog worker --metrics -------------------------------------------------------------


def fetch(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as answer:
            return answer.status, answer.headers["Content-Type"], answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read().decode()


def wait_for(check: Callable[[], Any], what: str, deadline: float = 120.0) -> Any:
    """Poll ``check`` until it returns something true; the deadline only bounds a hang."""
    give_up = time.monotonic() + deadline
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > give_up:
            raise AssertionError(f"{what}: not within {deadline:.0f} s")
        time.sleep(0.05)


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_worker_serves_metrics_while_it_runs(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    url = request.getfixturevalue("pg_url") if backend == "postgres" else str(tmp_path / "j.db")
    with ReferenceService("both", db_path=tmp_path / "service.db") as service:
        with intentlog.open(url) as journal:
            for i in range(5):
                journal.start("bill", f"b-{i}", {"amount": i + 1})
        env = {**os.environ, "PYTHONPATH": str(SUPPORT), "INTENTLOG_URL": url}
        env["INTENTLOG_TEST_SERVICE"] = service.url
        log = tmp_path / "worker.log"
        with log.open("wb") as stderr:
            worker = subprocess.Popen(
                [sys.executable, "-m", "intentlog.cli", "worker", "--app",
                 "metrics_app:registry", "--poll", "0.05", "--metrics", "127.0.0.1:0"],
                env=env, stdout=subprocess.DEVNULL, stderr=stderr,
            )  # fmt: skip
        try:
            line = wait_for(
                lambda: re.search(r"metrics at (http://\S+)", log.read_text()), "metrics address"
            )
            metrics_url = line.group(1)
            assert metrics_url.startswith("http://127.0.0.1:")

            def confirmed() -> Samples | None:
                status, content_type, text = fetch(metrics_url)
                assert status == 200 and content_type.startswith("text/plain")
                samples = scrape(text)
                done = value(samples, "intentlog_operations", state="CONFIRMED") == 5
                return samples if done else None

            samples = wait_for(confirmed, "five tasks confirmed, seen through /metrics")
            assert value(samples, "intentlog_unresolved") == 0
            assert value(samples, "intentlog_oldest_submitted_age_seconds") == 0
            headroom = value(samples, "intentlog_retention_headroom_seconds", effect="pay")
            assert headroom == 3600  # the registry's effect, nothing in flight
            assert value(samples, "intentlog_commit_seconds_count") >= 10  # the worker's own
            status, _, _ = fetch(metrics_url.removesuffix("/metrics") + "/other")
            assert status == 404
            worker.send_signal(signal.SIGTERM)
            assert worker.wait(timeout=60) == 0
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
        with pytest.raises(urllib.error.URLError):
            fetch(metrics_url)  # stopped with the worker
    assert sorted(service.truth().values()) == [1] * 5


def test_worker_refuses_a_bad_metrics_address(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "intentlog.cli", "--db", str(tmp_path / "j.db"), "worker",
         "--app", "metrics_app:registry", "--metrics", "localhost:http"],
        env={**os.environ, "PYTHONPATH": str(SUPPORT)}, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "HOST:PORT" in done.stderr
