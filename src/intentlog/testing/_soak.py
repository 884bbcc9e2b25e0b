"""The random-kill soak: SIGKILL a multi-effect workflow at random moments, many times over.

Unlike the crash matrix, the kill comes from a timer in the parent, not from a crash point, so
it lands wherever the child happens to be: inside SQLite's commit, between two syscalls of a
request, in the middle of a lookup. After every kill the workflow is restarted; at the end the
service's own record must show no key applied twice.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import intentlog
from intentlog.testing._harness import ServiceInfo, load_workflow, resolve_from_record
from intentlog.testing._service import ReferenceService

__all__ = ["SoakReport", "orders", "soak"]

TASKS_ENV = "INTENTLOG_SOAK_TASKS"


@dataclasses.dataclass
class SoakReport:
    """What a soak did and found. ``ok`` means no duplicate and every task completed."""

    mode: str
    cycles: int  # kill/restart cycles
    runs: int  # child processes started
    tasks: int
    completed: int
    applied: int  # effects the service applied
    duplicates: int  # keys the service applied more than once
    unresolved: int  # operations that became UNRESOLVED (resolved from the service's record)
    left_after_kills: int  # tasks still unfinished after the last kill: > 0 means every kill
    # fell while there was work to interrupt
    seconds: float

    @property
    def ok(self) -> bool:
        return self.duplicates == 0 and self.completed == self.tasks

    def render(self) -> str:
        return (
            f"soak [{self.mode}]: {self.cycles} kill/restart cycles, {self.runs} runs, "
            f"{self.completed}/{self.tasks} tasks completed, {self.applied} effects applied, "
            f"{self.duplicates} duplicates, {self.unresolved} unresolved, "
            f"{self.left_after_kills} tasks left after the last kill, {self.seconds:.1f}s"
        )


def orders(journal: intentlog.Journal, service: ServiceInfo) -> None:
    """The soak's default workflow: tasks order-0..N-1, three effects each, resumable."""
    effects = [service.payment_effect(name) for name in ("charge", "reserve", "notify")]
    for i in range(int(os.environ.get(TASKS_ENV, "50"))):
        with journal.task(f"order-{i}") as task:
            if task.completed:
                continue
            for step, effect in enumerate(effects):
                if (task.state or {}).get("done", 0) > step:
                    continue
                task.run(effect, amount=100 + step, order=i)
                task.checkpoint(next_step=f"step-{step + 1}", state={"done": step + 1})
            task.complete()


def soak(
    workflow: str = "intentlog.testing._soak:orders",
    *,
    cycles: int = 200,
    tasks: int = 50,
    mode: str = "both",
    min_delay: float = 0.1,
    max_delay: float = 0.3,
    seed: int | None = None,
    timeout: float = 0.3,
    workdir: str | os.PathLike[str] | None = None,
) -> SoakReport:
    """Kill ``workflow`` with SIGKILL after a random delay (``min_delay`` to ``max_delay``
    seconds after its start; an interpreter takes about 0.1 s to start) ``cycles`` times,
    restarting it each time, then let it finish and count duplicates from the reference
    service's record. UNRESOLVED operations are resolved from that record,
    as a person with the dashboard would."""
    load_workflow(workflow)
    rng = random.Random(seed)
    started = time.monotonic()
    env = {**os.environ, TASKS_ENV: str(tasks)}
    env.pop("INTENTLOG_CRASH", None)
    env["PYTHONPATH"] = os.pathsep.join([p for p in sys.path if p])
    with (
        tempfile.TemporaryDirectory(prefix="intentlog-soak-", dir=workdir) as tmp,
        ReferenceService(mode, db_path=Path(tmp) / "service.db") as service,
    ):
        journal_path = Path(tmp) / "journal.db"
        info = ServiceInfo(service.url, mode, timeout=timeout)
        argv = [sys.executable, "-m", "intentlog.testing._child", workflow, str(journal_path),
                json.dumps(dataclasses.asdict(info))]  # fmt: skip
        kills = runs = unresolved = 0
        left: int | None = None
        while True:
            runs += 1
            if kills == cycles and left is None:
                left = tasks - _completed(journal_path)
            with subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True) as child:
                armed = kills < cycles
                try:
                    out, _ = child.communicate(
                        timeout=rng.uniform(min_delay, max_delay) if armed else 300
                    )
                except subprocess.TimeoutExpired:
                    child.kill()  # SIGKILL, wherever it is
                    child.communicate()
                    kills += 1
                    continue
            if child.returncode == 3:
                unresolved += 1
                key = json.loads(out.strip().splitlines()[-1])["unresolved"]
                _resolve_from_record(journal_path, key, service)
                continue
            if child.returncode != 0:
                raise RuntimeError(f"soak workflow failed with exit code {child.returncode}")
            if not armed:
                break  # finished with no kill pending: the soak is over

        completed = _completed(journal_path)
        applied = service.applied()
    return SoakReport(
        mode=mode,
        cycles=kills,
        runs=runs,
        tasks=tasks,
        completed=completed,
        applied=sum(map(len, applied.values())),
        duplicates=sum(1 for ids in applied.values() if len(ids) > 1),
        unresolved=unresolved,
        left_after_kills=left if left is not None else 0,
        seconds=time.monotonic() - started,
    )


def _completed(journal_path: Path) -> int:
    if not journal_path.exists():
        return 0
    with intentlog.open(journal_path) as journal:
        return sum(t.completed for t in journal.tasks())


def _resolve_from_record(journal_path: Path, key: str, service: ReferenceService) -> None:
    with intentlog.open(journal_path) as journal:
        resolve_from_record(journal, key, service, who="soak")
