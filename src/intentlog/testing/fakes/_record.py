"""The fake services' own record: every request received and every application, in SQLite.

A request is written when it arrives, before any work, and finished with the status it was
answered; an application is written before the answer leaves. WAL and ``synchronous=FULL`` make
every row durable at once, so a test in another process counts what the service applied, and a
request whose client was killed mid-flight is still there.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from dataclasses import dataclass
from typing import Any

from intentlog.testing._loopback import open_record

__all__ = [
    "Application",
    "FakeRecord",
    "RecordedRequest",
    "connect",
    "read_applied",
    "read_requests",
]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS requests (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    service TEXT NOT NULL,
    at REAL NOT NULL,           -- the fake's clock, so advance() shows in the record
    method TEXT NOT NULL,
    path TEXT NOT NULL,
    key TEXT,                   -- the idempotency header as received, NULL when absent
    params TEXT,                -- JSON of the parsed parameters, NULL until parsed
    status INTEGER,             -- NULL: still being handled (or the fake died meanwhile)
    outcome TEXT
);
CREATE TABLE IF NOT EXISTS applied (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    service TEXT NOT NULL,
    at REAL NOT NULL,
    key TEXT,
    id TEXT NOT NULL,
    object TEXT NOT NULL
);
"""


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the service saw it; ``status`` is None while it is still being handled.

    ``outcome`` says what the service did: ``applied``, ``replayed``, ``in_flight`` (refused
    because the key was executing), ``mismatch``, ``failed`` (an injected 5xx), ``rejected``
    (validation or auth), ``read`` (a GET), or a service-specific word documented there.
    """

    seq: int
    service: str
    at: float
    method: str
    path: str
    key: str | None
    params: Any
    status: int | None
    outcome: str | None


@dataclass(frozen=True)
class Application:
    """One object the service created: the ground truth duplicates are counted against."""

    seq: int
    service: str
    at: float
    key: str | None
    id: str
    object: dict[str, Any]


def connect(path: str) -> sqlite3.Connection:
    return open_record(path, _SCHEMA, timeout=10.0)


class FakeRecord:
    """Read a fake's record from its SQLite file, from any process, while it serves or after.

    Each call opens the file afresh, so it always sees every committed row.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)

    def requests(self) -> list[RecordedRequest]:
        """Every request received, oldest first."""
        with contextlib.closing(connect(self.path)) as conn:
            return read_requests(conn)

    def applied(self) -> list[Application]:
        """Every application, oldest first."""
        with contextlib.closing(connect(self.path)) as conn:
            return read_applied(conn)


def read_requests(conn: sqlite3.Connection) -> list[RecordedRequest]:
    rows = conn.execute(
        "SELECT seq, service, at, method, path, key, params, status, outcome FROM requests "
        "ORDER BY seq"
    ).fetchall()
    return [
        RecordedRequest(r[0], r[1], r[2], r[3], r[4], r[5], _loads(r[6]), r[7], r[8]) for r in rows
    ]


def read_applied(conn: sqlite3.Connection) -> list[Application]:
    rows = conn.execute("SELECT seq, service, at, key, id, object FROM applied ORDER BY seq")
    return [Application(r[0], r[1], r[2], r[3], r[4], json.loads(r[5])) for r in rows]


def _loads(raw: str | None) -> Any:
    return None if raw is None else json.loads(raw)
