"""The random-kill soak: SIGKILL a multi-effect workflow at random moments, many times over.

Unlike the crash matrix, the kill does not come from a crash point: the parent sends it, so it
lands wherever the child happens to be: inside SQLite's commit, between two syscalls of a
request, in the middle of a lookup, while the interpreter starts. After every kill the
workflow is restarted; at the end the service's own record must show no key applied twice.

Kills are scheduled by the child's observed progress, never by the wall clock alone, so they
fall mid-run however loaded the machine is. The workflow calls :func:`progress` before each
step of work (the default :func:`orders`: before each effect); the call tells the parent how
many steps are done and waits until the parent lets it start the next one. For each cycle the
parent picks a random number of steps to let the child start, then kills it at a random
moment before it can start one more: after a random fraction of the time a step (or, with no
step let through, the start-up) was observed to take, or at once when the child asks to start
the next step, whichever comes first. So a kill lands inside a step or at its start, and the
workflow's last step is never let through while kills remain: every kill falls while work
remains, by construction.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import random
import selectors
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import intentlog
from intentlog.testing._harness import ServiceInfo, load_workflow, resolve_from_record
from intentlog.testing._service import ReferenceService

__all__ = ["SoakReport", "orders", "progress", "soak"]

TASKS_ENV = "INTENTLOG_SOAK_TASKS"
GATE_ENV = "INTENTLOG_SOAK_GATE"  # "REPORT_FD,LEAVE_FD": the child's ends of the two pipes
_STALL = 300.0  # seconds without a sign of life before the soak calls the workflow hung


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
    mid_step: int = 0  # kills that landed inside a step (the rest: at a step's start, or
    # while the child was starting, before its first step)

    @property
    def ok(self) -> bool:
        return self.duplicates == 0 and self.completed == self.tasks

    def render(self) -> str:
        return (
            f"soak [{self.mode}]: {self.cycles} kill/restart cycles ({self.mid_step} inside a "
            f"step), {self.runs} runs, {self.completed}/{self.tasks} tasks completed, "
            f"{self.applied} effects applied, {self.duplicates} duplicates, "
            f"{self.unresolved} unresolved, {self.left_after_kills} tasks left after the last "
            f"kill, {self.seconds:.1f}s"
        )


def progress(done: int, total: int) -> None:
    """In a workflow run by :func:`soak`: ``done`` of ``total`` steps are done and the next
    one is about to start. Returns when the soak lets it start (the soak may SIGKILL the
    process instead). Outside a soak it returns at once."""
    gate = _gate()
    if gate is None:
        return
    report, leave = gate
    os.write(report, f"{done} {total}\n".encode())
    if not os.read(leave, 1):
        raise SystemExit("the soak that ran this workflow is gone")


@functools.cache
def _gate() -> tuple[int, int] | None:
    raw = os.environ.get(GATE_ENV)
    if not raw:
        return None
    report, leave = (int(fd) for fd in raw.split(","))
    return report, leave


def orders(journal: intentlog.Journal, service: ServiceInfo) -> None:
    """The soak's default workflow: tasks order-0..N-1, three effects each, resumable."""
    effects = [service.payment_effect(name) for name in ("charge", "reserve", "notify")]
    count = int(os.environ.get(TASKS_ENV, "50"))
    total = count * len(effects)
    # One read instead of a lease per finished task: a restart late in the soak goes straight
    # to the work that remains, so its kill lands in that work.
    finished = {t.task_id for t in journal.tasks() if t.completed}
    for i in range(count):
        if f"order-{i}" in finished:
            continue
        with journal.task(f"order-{i}") as task:
            if task.completed:
                continue
            for step, effect in enumerate(effects):
                if (task.state or {}).get("done", 0) > step:
                    continue
                progress(i * len(effects) + step, total)
                task.run(effect, amount=100 + step, order=i)
                task.checkpoint(next_step=f"step-{step + 1}", state={"done": step + 1})
            task.complete()


@dataclasses.dataclass
class _Pace:
    """How long the child was seen to take to start up and to do a step (moving means)."""

    startup: float = 0.2
    step: float = 0.02

    def update(self, name: str, seconds: float) -> None:
        setattr(self, name, 0.7 * getattr(self, name) + 0.3 * seconds)


@dataclasses.dataclass
class _Run:
    """One child process's end: killed (and where), or its exit code and output."""

    killed: bool
    mid_step: bool = False
    returncode: int = 0
    output: str = ""
    done: int | None = None  # the last report: steps done, of how many
    total: int | None = None


def soak(
    workflow: str = "intentlog.testing._soak:orders",
    *,
    cycles: int = 200,
    tasks: int = 50,
    mode: str = "both",
    seed: int | None = None,
    timeout: float = 0.3,
    workdir: str | os.PathLike[str] | None = None,
) -> SoakReport:
    """Kill ``workflow`` with SIGKILL ``cycles`` times, each time at a random point of its
    progress (see the module docstring), restarting it each time; then let it finish and count
    duplicates from the reference service's record. UNRESOLVED operations are resolved from
    that record, as a person with the dashboard would. ``workflow`` must call
    :func:`progress` before each step, as :func:`orders` does; one that finishes while kills
    remain raises RuntimeError."""
    load_workflow(workflow)
    rng = random.Random(seed)
    started = time.monotonic()
    env = {**os.environ, TASKS_ENV: str(tasks)}
    env.pop("INTENTLOG_CRASH", None)
    env["PYTHONPATH"] = os.pathsep.join([p for p in sys.path if p])
    pace = _Pace()
    with (
        tempfile.TemporaryDirectory(prefix="intentlog-soak-", dir=workdir) as tmp,
        ReferenceService(mode, db_path=Path(tmp) / "service.db") as service,
    ):
        journal_path = Path(tmp) / "journal.db"
        info = ServiceInfo(service.url, mode, timeout=timeout)
        argv = [sys.executable, "-m", "intentlog.testing._child", workflow, str(journal_path),
                json.dumps(dataclasses.asdict(info))]  # fmt: skip
        kills = runs = unresolved = mid_step = 0
        left: int | None = None
        done, total = 0, 3 * tasks  # refined by the child's reports
        while True:
            runs += 1
            armed = kills < cycles
            if not armed and left is None:
                left = tasks - _completed(journal_path)
            # Spread the progress left over the kills left: on average about as many steps
            # per cycle as remain per kill (the last step is held back, see the docstring).
            share = (total - 1 - done) / (cycles - kills) if armed else 0.0
            let_through = rng.randint(0, max(0, round(2 * share) - 1)) if armed else None
            run = _run_child(argv, env, let_through, rng, pace)
            if run.done is not None and run.total is not None:
                done, total = run.done, run.total
            if run.killed:
                kills += 1
                mid_step += run.mid_step
                continue
            if run.returncode == 3:
                unresolved += 1
                key = json.loads(run.output.strip().splitlines()[-1])["unresolved"]
                _resolve_from_record(journal_path, key, service)
                continue
            if run.returncode != 0:
                raise RuntimeError(f"soak workflow failed with exit code {run.returncode}")
            if armed:
                raise RuntimeError(
                    f"soak workflow {workflow!r} finished while {cycles - kills} kills remained:"
                    " it must call intentlog.testing._soak.progress() before each step"
                )
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
        mid_step=mid_step,
    )


def _run_child(
    argv: list[str],
    env: dict[str, str],
    let_through: int | None,
    rng: random.Random,
    pace: _Pace,
) -> _Run:
    """Run the workflow once. With ``let_through`` None, let every step through and wait for
    the end; else let that many steps start, then kill the child (see the module docstring)."""
    report_r, report_w = os.pipe()
    leave_r, leave_w = os.pipe()
    with contextlib.ExitStack() as stack:
        stack.callback(os.close, leave_w)
        reports = stack.enter_context(open(report_r, "rb", buffering=0))
        try:
            child = subprocess.Popen(
                argv,
                env={**env, GATE_ENV: f"{report_w},{leave_r}"},
                stdout=subprocess.PIPE,
                pass_fds=(report_w, leave_r),
            )
        finally:
            os.close(report_w)  # the child has its own copies: EOF on report_r means it is gone
            os.close(leave_r)
        stack.enter_context(child)
        selector = stack.enter_context(selectors.DefaultSelector())
        assert child.stdout is not None
        selector.register(reports, selectors.EVENT_READ)
        selector.register(child.stdout, selectors.EVENT_READ)
        lines, output = b"", b""
        run = _Run(killed=False)
        let = 0  # steps let through so far
        phase, since = "startup", time.monotonic()  # the phase the child is in, since when
        kill_at = None
        if let_through == 0:
            kill_at = since + rng.uniform(0, 1.2) * pace.startup

        def kill(mid_step: bool) -> _Run:
            child.kill()  # SIGKILL, wherever it is
            child.wait()
            run.killed, run.mid_step = True, mid_step
            return run

        while selector.get_map():
            now = time.monotonic()
            if kill_at is not None and now >= kill_at:
                return kill(mid_step=phase == "step")
            ready = selector.select(_STALL if kill_at is None else kill_at - now)
            if not ready and kill_at is None:
                kill(mid_step=False)
                raise RuntimeError(f"soak workflow showed no sign of life for {_STALL:.0f}s")
            for key, _ in ready:
                chunk = os.read(key.fd, 65536)
                if not chunk:  # the child closed its end: it is exiting
                    selector.unregister(key.fileobj)
                elif key.fileobj is child.stdout:
                    output += chunk
                else:
                    lines += chunk
            while b"\n" in lines:
                line, lines = lines.split(b"\n", 1)
                run.done, run.total = (int(n) for n in line.split())
                pace.update(phase, time.monotonic() - since)
                if let_through is not None and (let >= let_through or run.done >= run.total - 1):
                    return kill(mid_step=False)  # held at the start of a step (never the last)
                let += 1
                phase, since = "step", time.monotonic()
                if let == let_through:
                    kill_at = since + rng.uniform(0, 1.2) * pace.step
                os.write(leave_w, b"g")
        run.returncode = child.wait()
        run.output = output.decode(errors="replace")
        return run


def _completed(journal_path: Path) -> int:
    if not journal_path.exists():
        return 0
    with intentlog.open(journal_path) as journal:
        return sum(t.completed for t in journal.tasks())


def _resolve_from_record(journal_path: Path, key: str, service: ReferenceService) -> None:
    with intentlog.open(journal_path) as journal:
        resolve_from_record(journal, key, service, who="soak")
