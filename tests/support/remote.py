"""A "remote service" for tests: a separate SQLite database that records what it applied.

It plays the external side of an effect in the core tests (the HTTP reference service is in
intentlog.testing). ``dedupe=True`` makes it honour idempotency keys; ``lookup`` answers by key.
"""

from __future__ import annotations

import sqlite3
import uuid
from typing import Any

import intentlog


class Remote:
    def __init__(self, path: str) -> None:
        self.path = path
        with self._conn() as conn:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS applied"
                " (seq INTEGER PRIMARY KEY, key TEXT NOT NULL, id TEXT NOT NULL, amount INTEGER)"
            )

    def _conn(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = FULL")
        return conn

    def apply(self, key: str, amount: int, *, dedupe: bool) -> dict[str, Any]:
        conn = self._conn()
        try:
            conn.execute("BEGIN IMMEDIATE")
            if dedupe:
                row = conn.execute("SELECT id FROM applied WHERE key = ?", (key,)).fetchone()
                if row is not None:
                    conn.execute("COMMIT")
                    return {"id": row[0], "key": key, "amount": amount}
            pid = f"pay_{uuid.uuid4().hex[:12]}"
            conn.execute(
                "INSERT INTO applied (key, id, amount) VALUES (?, ?, ?)", (key, pid, amount)
            )
            conn.execute("COMMIT")  # the remote commit: durable before anything else happens
            return {"id": pid, "key": key, "amount": amount}
        finally:
            conn.close()

    def lookup(self, key: str) -> intentlog.Found | intentlog.NotFound:
        conn = self._conn()
        try:
            row = conn.execute(
                "SELECT id, amount FROM applied WHERE key = ? ORDER BY seq DESC", (key,)
            ).fetchone()
        finally:
            conn.close()
        if row is None:
            return intentlog.NotFound()
        return intentlog.Found({"id": row[0], "key": key, "amount": row[1]})

    def count(self, key: str | None = None) -> int:
        conn = self._conn()
        try:
            if key is None:
                return int(conn.execute("SELECT count(*) FROM applied").fetchone()[0])
            return int(
                conn.execute("SELECT count(*) FROM applied WHERE key = ?", (key,)).fetchone()[0]
            )
        finally:
            conn.close()

    def ids(self) -> list[str]:
        conn = self._conn()
        try:
            return [r[0] for r in conn.execute("SELECT id FROM applied ORDER BY seq")]
        finally:
            conn.close()


def make_effect(kind: str, remote: Remote, *, timeout: float = 0.5) -> intentlog.Effect:
    """An effect of one kind: "reconcilable", "dedupe", "both" or "neither"."""
    dedupe = kind in ("dedupe", "both")

    def charge(key: str, amount: int) -> dict[str, Any]:
        return remote.apply(key, amount, dedupe=dedupe)

    return intentlog.Effect(
        "charge",
        charge,
        reconcile=remote.lookup if kind in ("reconcilable", "both") else None,
        idempotent=dedupe,
        key_retention=3600 if dedupe else None,
        timeout=timeout,
    )
