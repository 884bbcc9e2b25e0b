"""exactly-once: ``@once(store, key=...)`` around each effect, ``Store.sqlite(path)``.

Per effect it commits twice: ``claim`` (INSERT IN_FLIGHT, BEGIN IMMEDIATE/COMMIT) before the
call and ``commit`` (SELECT + upsert COMMITTED with the result) after it.

Variants:
  full     after ``Store.sqlite(path)`` we run ``PRAGMA synchronous=FULL`` on its one
           connection (``store._conn``), so every commit is fsync'ed as intentlog's are. This
           is the only change; the store itself sets WAL and synchronous=NORMAL.
  default  the store as shipped: WAL, synchronous=NORMAL (a commit survives a process kill
           but not a power loss: the WAL is not fsync'ed at each commit).
  off      synchronous=OFF: no fsync at all, so the rate is its CPU per effect (compare
           benchmarks/split.py's OFF line for ours). Not a row of run.py: a diagnosis.
  store    synchronous=OFF, the store's own two calls per effect (``claim`` then ``commit``,
           as ``@once`` makes them) without the decorator: its statements and the little
           Python of its store. The decorator's share is the difference from ``off``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from _peer import main, version


def _run(directory: Path, n: int, warm: int, variant: str) -> tuple[float, str]:
    from exactly_once import Store, once

    store = Store.sqlite(str(directory / "effects.db"))
    conn = store._conn  # type: ignore[attr-defined]
    if variant == "full":
        conn.execute("PRAGMA synchronous = FULL")
    elif variant in ("off", "store"):
        conn.execute("PRAGMA synchronous = OFF")
    mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
    sync = conn.execute("PRAGMA synchronous").fetchone()[0]

    @once(store, key=lambda i: f"charge:{i}")
    def effect(i: int) -> dict[str, Any]:
        return {"id": f"ch_{i}", "ok": True}

    result = b'{"id":"ch_0","ok":true}'
    if variant == "store":

        def effect(i: int) -> dict[str, Any]:  # the store's two calls, as @once makes them
            key = f"charge:{i}"
            store.claim(key, fingerprint="0" * 64, lease_ttl=None)
            store.commit(key, result)
            return {"id": "ch_0", "ok": True}

    for i in range(n, n + warm):  # warm-up in the same file (past the first WAL checkpoint)
        effect(i)
    start = time.perf_counter()
    for i in range(n):
        effect(i)
    rate = n / (time.perf_counter() - start)
    if variant == "store":
        record = store.get("charge:0")
        if record is None or record.result != result:
            raise RuntimeError("the store did not keep the committed result")
    elif effect(0) != {"id": "ch_0", "ok": True}:
        raise RuntimeError("replay did not return the stored result")
    store.close()
    return rate, f"journal_mode={mode}, synchronous={sync} (1=NORMAL, 2=FULL)"


def measure(args: argparse.Namespace, directory: Path) -> dict[str, Any]:
    rate, pragmas = _run(directory, args.n, args.warmup, args.variant)
    return {
        "rate": rate,
        "version": version("exactly-once"),
        "config": f"Store.sqlite(<tmp>/effects.db), {pragmas}; @once per effect, key per call",
    }


if __name__ == "__main__":
    main(measure, ["full", "default", "off", "store"])
