"""Many concurrent async tasks and threads, killed with SIGKILL mid-run, then restarted."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import intentlog
from intentlog.testing import ReferenceService, ServiceInfo

SUPPORT = Path(__file__).parent / "support"


def test_concurrent_async_tasks_and_threads_survive_sigkill(
    tmp_path: Path, journal_url: str
) -> None:
    # On PostgreSQL the asyncio tasks use psycopg's async connections, the threads its
    # blocking ones: both kinds of store are killed mid-write.
    journal_path = journal_url
    env = {**os.environ, "PYTHONPATH": str(SUPPORT)}
    env.pop("INTENTLOG_CRASH", None)
    with ReferenceService("both", db_path=tmp_path / "service.db") as service:
        info = ServiceInfo(service.url, "both", timeout=1.0)
        argv = [sys.executable, "-m", "intentlog.testing._child", "workflows:mixed",
                str(journal_path), json.dumps(dataclasses.asdict(info))]  # fmt: skip
        confirmed: dict[str, object] = {}
        kills = 0
        with intentlog.open(journal_path) as watcher:
            for _ in range(3):
                with subprocess.Popen(argv, env=env) as child:
                    # Kill once another ~40 receipts are durable: mid-run, wherever the many
                    # writers are (intents in flight, receipts in a shared commit, ...).
                    target = len(confirmed) + 40
                    deadline = time.monotonic() + 60
                    while child.poll() is None and time.monotonic() < deadline:
                        if watcher.counts()[intentlog.State.CONFIRMED] >= target:
                            child.kill()
                            kills += 1
                            break
                        time.sleep(0.01)
                    child.wait()
                now = {op.key: op.receipt for op in watcher.operations()
                       if op.state is intentlog.State.CONFIRMED}  # fmt: skip
                for key, receipt in confirmed.items():
                    assert now.get(key) == receipt, f"confirmed receipt of {key} lost or changed"
                assert len(now) < 3 * (32 + 8 * 8), "the run finished before it was killed"
                confirmed = now
        assert kills == 3  # every kill landed mid-run
        assert subprocess.run(argv, env=env, timeout=120).returncode == 0
        applied = service.applied()
        with intentlog.open(journal_path) as journal:
            ops = journal.operations()
            tasks = journal.tasks()
    assert all(len(ids) == 1 for ids in applied.values()), "a key was applied twice"
    assert len(tasks) == 32 + 8 * 8
    assert all(t.completed for t in tasks)
    assert len(ops) == 3 * len(tasks)
    for op in ops:
        assert op.state is intentlog.State.CONFIRMED
        assert op.receipt["id"] in applied[op.key]  # the receipt is what the service applied
        if op.key in confirmed:
            assert op.receipt == confirmed[op.key]
