"""The crash-matrix harness: kill a real workflow process at every boundary and check the result.

For each service mode, crash point and effect occurrence, the harness starts a fresh
reference service and journal, runs the workflow in a child process armed to SIGKILL itself at
that point, restarts it (unarmed) until it completes or stops on an UNRESOLVED operation,
resolves such an operation from the service's ground truth as a person would, and checks:

- no key was applied twice (the service's own record);
- every CONFIRMED receipt is what the service applied for that key;
- an operation is UNRESOLVED only for an effect that can neither deduplicate nor reconcile,
  and only when the kill fell in the in-flight window;
- the task ends where a run without crashes ends (same next_step, state and operations), so it
  resumed at the right step.

A matrix takes a while (every cell starts two or more processes, and a restart may wait out
the in-flight window of the request its predecessor was killed in), so it shows its progress
the way pytest shows collection: a line on stderr rewritten in place where stderr is a
terminal, counting cells and naming what the longest-running one is doing and why it waits
(see :mod:`intentlog.testing._progress`; the pytest plugin writes it through pytest's terminal).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import intentlog
from intentlog._crash import CRASH_POINTS, ENV_VAR
from intentlog._effect import Effect
from intentlog._model import Action
from intentlog._words import duration
from intentlog.testing._effects import payment_effect
from intentlog.testing._progress import ProgressSink, sink_for
from intentlog.testing._service import MODES, ReferenceService

__all__ = ["Cell", "MatrixReport", "ServiceInfo", "crash_matrix", "load_workflow"]

Workflow = Callable[[Any, "ServiceInfo"], Any]  # a Journal, or an AsyncJournal if async


@dataclasses.dataclass(frozen=True)
class ServiceInfo:
    """What a workflow under test is told about the reference service it talks to."""

    url: str
    mode: str
    retention: float | None = None
    lookup_lag: float = 0.0
    timeout: float = 1.0

    def payment_effect(self, name: str = "charge", *, lazy_receipt: bool = False) -> Effect:
        """An Effect for this service that declares exactly what its mode can do.
        ``lazy_receipt`` applies where the mode allows it (not in mode "neither")."""
        return payment_effect(
            self.url,
            self.mode,
            name=name,
            key_retention=self.retention,
            lookup_lag=self.lookup_lag,
            timeout=self.timeout,
            lazy_receipt=lazy_receipt and self.mode != "neither",
        )


def load_workflow(ref: str) -> Workflow:
    """Import ``module:function``; the function takes ``(journal, service)``."""
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"workflow must be given as 'module:function', got {ref!r}")
    fn = getattr(importlib.import_module(module_name), attr, None)
    if not callable(fn):
        raise ValueError(f"{ref!r} is not a function")
    return fn  # type: ignore[no-any-return]


@dataclasses.dataclass
class Cell:
    """One run of the matrix: a kill at ``point`` on the ``occurrence``-th ``effect``."""

    mode: str
    point: str
    effect: str
    occurrence: int
    outcome: str = "pending"  # recovered | resolved | not reached | FAIL
    restarts: int = 0
    unresolved: list[str] = dataclasses.field(default_factory=list)
    problems: list[str] = dataclasses.field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.effect}#{self.occurrence}"


@dataclasses.dataclass
class _Outcome:
    """What the journal and the service hold after a run."""

    tasks: dict[str, tuple[bool, str | None, Any]]
    ops: dict[str, tuple[str, str, str, Any]]  # key -> (task, effect, state, receipt)
    applied: dict[str, list[str]]


@dataclasses.dataclass
class MatrixReport:
    """All cells of a crash matrix; ``ok`` when no invariant failed anywhere."""

    workflow: str
    cells: list[Cell]

    @property
    def ok(self) -> bool:
        return all(cell.outcome != "FAIL" for cell in self.cells)

    @property
    def problems(self) -> list[str]:
        return [
            f"[{c.mode}] kill at {c.point} on {c.label}: {p}"
            for c in self.cells
            for p in c.problems
        ]

    def render(self) -> str:
        """The matrix as text: one table per mode, crash points down, effects across."""
        glyph = {"recovered": "ok", "resolved": "ok*", "not reached": "-", "FAIL": "FAIL"}
        lines = [f"crash matrix for {self.workflow}"]
        for mode in dict.fromkeys(c.mode for c in self.cells):
            cells = [c for c in self.cells if c.mode == mode]
            labels = list(dict.fromkeys(c.label for c in cells))
            width = max(8, *(len(label) for label in labels))
            lines.append(f"\nservice mode: {mode}")
            lines.append(f"{'':<20}" + "".join(f"{label:>{width + 2}}" for label in labels))
            for point in dict.fromkeys(c.point for c in cells):
                row = {c.label: glyph.get(c.outcome, c.outcome) for c in cells if c.point == point}
                lines.append(
                    f"{point:<20}"
                    + "".join(f"{row.get(label, ''):>{width + 2}}" for label in labels)
                )
        lines.append(
            "\nok: recovered with no duplicate; ok*: UNRESOLVED (allowed here), resolved from "
            "the service's record, then completed; -: the point was not reached"
        )
        if not self.ok:
            lines.append("\nFAILURES:")
            lines.extend(f"  {p}" for p in self.problems)
        return "\n".join(lines)

    def raise_for_problems(self) -> None:
        """Raise AssertionError with the rendered matrix if any invariant failed."""
        if not self.ok:
            raise AssertionError(self.render())


#: A cell's outcome in a progress line (the rendered matrix's glyphs, "-" spelled out).
_WORDS = {"recovered": "ok", "resolved": "ok*", "not reached": "not reached", "FAIL": "FAIL"}


class _Watch:
    """What a matrix is doing, for its progress line: the cells done, and the cells running
    with what each is at (set from the pool's threads; the line is written from the thread
    that runs the matrix only)."""

    def __init__(self, workflow: str, sink: ProgressSink) -> None:
        self.workflow = workflow
        self.sink = sink
        self.started = time.monotonic()
        self.total = 0
        self.done: list[Cell] = []
        self._running: dict[int, tuple[Cell, float, str]] = {}  # id(cell): since, doing what
        self._lock = threading.Lock()

    @staticmethod
    def _name(cell: Cell) -> str:
        return f"mode={cell.mode} point={cell.point} {cell.label}"

    def _head(self) -> str:
        elapsed = duration(time.monotonic() - self.started)
        return f"crash matrix: {len(self.done)}/{self.total} cells, {elapsed}"

    def reference(self, mode: str, index: int, count: int) -> None:
        self.sink.update(
            f"crash matrix for {self.workflow}: a run without crashes, mode={mode} "
            f"({index}/{count}), {duration(time.monotonic() - self.started)}"
        )

    def step(self, cell: Cell, what: str) -> None:
        with self._lock:
            since = self._running.get(id(cell), (cell, time.monotonic(), ""))[1]
            self._running[id(cell)] = (cell, since, what)

    def finished(self, cell: Cell) -> None:
        with self._lock:
            self._running.pop(id(cell), None)
        self.done.append(cell)
        restarts = f", {cell.restarts} restart{'s' if cell.restarts != 1 else ''}"
        word = _WORDS.get(cell.outcome, cell.outcome)
        self.sink.update(f"{self._head()} ({self._name(cell)}: {word}{restarts})")

    def tick(self) -> None:
        """Refresh a live line: the elapsed time, and what the longest-running cell does."""
        with self._lock:
            oldest = min(self._running.values(), key=lambda r: r[1], default=None)
        doing = f" ({self._name(oldest[0])}: {oldest[2]})" if oldest else ""
        self.sink.update(f"{self._head()}{doing}")

    def close(self) -> None:
        counts = dict.fromkeys(_WORDS.values(), 0)
        for cell in self.done:
            word = _WORDS.get(cell.outcome, cell.outcome)
            counts[word] = counts.get(word, 0) + 1
        tally = ", ".join(f"{n} {word}" for word, n in counts.items() if n) or "none"
        self.sink.finish(
            f"crash matrix for {self.workflow}: {len(self.done)}/{self.total} cells in "
            f"{duration(time.monotonic() - self.started)} ({tally})"
        )


class _Runner:
    def __init__(
        self,
        workflow: str,
        workdir: Path,
        *,
        retention: float | None,
        lookup_lag: float,
        timeout: float,
        max_restarts: int,
        child_timeout: float,
        env: dict[str, str] | None,
        watch: _Watch | None = None,
    ) -> None:
        self.workflow = workflow
        self.watch = watch
        self.workdir = workdir
        self.retention = retention
        self.lookup_lag = lookup_lag
        self.timeout = timeout
        self.max_restarts = max_restarts
        self.child_timeout = child_timeout
        self.env = {**os.environ, **(env or {})}
        self.env.pop(ENV_VAR, None)
        # The child must import the workflow's module exactly as this process does.
        self.env["PYTHONPATH"] = os.pathsep.join(
            [p for p in sys.path if p] + [self.env.get("PYTHONPATH", "")]
        )

    def run(self, name: str, mode: str, crash: str | None, cell: Cell | None) -> _Outcome:
        """One scenario: fresh service and journal, a (possibly armed) first run, restarts."""
        place = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self.workdir))
        journal_path = place / "journal.db"
        with ReferenceService(
            mode, retention=self.retention, lookup_lag=self.lookup_lag,
            db_path=place / "service.db",
        ) as service:  # fmt: skip
            info = ServiceInfo(service.url, mode, self.retention, self.lookup_lag, self.timeout)
            self._step(cell, f"first run, SIGKILL at {crash.partition(':')[0]}" if crash else "")
            first = self._child(journal_path, info, crash)
            runs = [first]
            if cell is not None and crash is not None and first.returncode == 0:
                cell.outcome = "not reached"
            # Operation states when the latest run started: an operation may become
            # UNRESOLVED in a run only if it was in flight (SUBMITTED) when that run started,
            # left so by a worker that died or stopped.
            before: dict[str, str] = {}
            while runs[-1].returncode != 0 and len(runs) <= self.max_restarts:
                last = runs[-1]
                if last.returncode == 3:
                    # Settle every UNRESOLVED operation, not only the one that stopped the run:
                    # concurrent tasks may have left several.
                    for key, state in self._states(journal_path).items():
                        if state == "UNRESOLVED":
                            self._resolve(journal_path, key, service, cell, before.get(key))
                elif last.returncode != -signal.SIGKILL:
                    raise _ChildFailed(last)
                before = self._states(journal_path)
                self._step(cell, f"restart {len(runs)}{self._waits(journal_path, cell)}")
                runs.append(self._child(journal_path, info, None))
            if runs[-1].returncode != 0:
                raise _ChildFailed(runs[-1])
            if cell is not None:
                cell.restarts = len(runs) - 1
            return self._outcome(journal_path, service)

    def _child(
        self, journal: Path, info: ServiceInfo, crash: str | None
    ) -> subprocess.CompletedProcess[str]:
        env = dict(self.env)
        if crash is not None:
            env[ENV_VAR] = crash
        args = [self.workflow, str(journal), json.dumps(dataclasses.asdict(info))]
        return subprocess.run(
            [sys.executable, "-m", "intentlog.testing._child", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=self.child_timeout,
        )

    @staticmethod
    def _states(journal_path: Path) -> dict[str, str]:
        with intentlog.open(journal_path) as journal:
            return {op.key: op.state.value for op in journal.operations()}

    def _step(self, cell: Cell | None, what: str) -> None:
        if self.watch is not None and cell is not None and what:
            self.watch.step(cell, what)

    def _waits(self, journal_path: Path, cell: Cell | None) -> str:
        """For the progress line: why the restart about to start will wait, as the journal's
        own decision says (a request that may still be in flight), or nothing."""
        if self.watch is None or cell is None:
            return ""
        with intentlog.open(journal_path) as journal:
            now = journal.store.now()
            waits = [p for p in journal.pending() if p.next_action is Action.WAIT]
        latest = max(waits, key=lambda p: p.not_before or now, default=None)
        if latest is None or (latest.not_before or now) <= now:
            return ""
        return f", which waits {duration((latest.not_before or now) - now)}: {latest.reason}"

    def _resolve(
        self,
        journal_path: Path,
        key: str,
        service: ReferenceService,
        cell: Cell | None,
        state_before: str | None,
    ) -> None:
        """Check an UNRESOLVED operation was allowed to be, then settle it the way a person
        with the service's dashboard would."""
        self._step(cell, f"{key} is UNRESOLVED: resolving it from the service's record once "
                         "every request it received is handled")  # fmt: skip
        with intentlog.open(journal_path) as journal:
            op = journal.operation(key)
            if cell is not None:
                cell.unresolved.append(key)
                if op.policy.can_reconcile or op.policy.idempotent:
                    cell.problems.append(f"{key} ({op.effect}) UNRESOLVED though its service "
                                         "can deduplicate or be asked")  # fmt: skip
                # In flight means SUBMITTED: intent durable, no receipt. With concurrent tasks
                # that need not be the operation the crash point targeted: a sibling cut off
                # mid-request (killed, or cancelled when the run stopped) counts too.
                if state_before != "SUBMITTED":
                    cell.problems.append(
                        f"{key} UNRESOLVED though it was {state_before or 'not recorded'} when "
                        "the previous worker stopped, outside its in-flight window"
                    )
            resolve_from_record(journal, key, service, who="crash harness")

    @staticmethod
    def _outcome(journal_path: Path, service: ReferenceService) -> _Outcome:
        with intentlog.open(journal_path) as journal:
            tasks = {t.task_id: (t.completed, t.next_step, t.state) for t in journal.tasks()}
            ops = {
                op.key: (op.task_id, op.effect, op.state.value, op.receipt)
                for op in journal.operations()
            }
        return _Outcome(tasks, ops, service.applied())


def resolve_from_record(
    journal: intentlog.Journal, key: str, service: ReferenceService, *, who: str
) -> None:
    """Resolve an UNRESOLVED operation from the service's own record, as a person with its
    dashboard would: confirmed with the payment it applied (its id and status, as the
    dashboard shows them), or retry if it applied none.

    The record is read only after every request that reached the service has been handled
    (`ReferenceService.settle`): a worker killed mid-request, or one that timed out, leaves
    its request executing, and a record read before it commits would call for a retry that
    applies the payment twice. A person waits out the in-flight window for the same reason
    (the risk that ``resolve`` names)."""
    service.settle()
    ids = service.applied().get(key)
    if ids:
        seen = {"id": ids[-1], "status": "succeeded"}  # every payment it applies succeeded
        journal.resolve(key, "confirmed", receipt=seen, note=who, accept_risk=True)
    else:
        journal.resolve(key, "retry", note=f"{who}: not in the service record", accept_risk=True)


class _ChildFailed(Exception):
    def __init__(self, run: subprocess.CompletedProcess[str]) -> None:
        tail = (run.stderr or run.stdout).strip().splitlines()[-8:]
        super().__init__(f"workflow process exited {run.returncode}: " + " | ".join(tail))


def _normal(outcome: _Outcome) -> dict[str, tuple[bool, str | None, Any]]:
    """Tasks with every payment id in their state replaced by the key it was applied for, so
    runs against different service instances (with other random ids) compare equal."""
    owner = {pid: key for key, ids in outcome.applied.items() for pid in ids}

    def swap(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: swap(v) for k, v in value.items()}
        if isinstance(value, list):
            return [swap(v) for v in value]
        return (
            f"<receipt of {owner[value]}>" if isinstance(value, str) and value in owner else value
        )

    return {tid: (done, step, swap(state)) for tid, (done, step, state) in outcome.tasks.items()}


def _check(cell: Cell, got: _Outcome, want: _Outcome) -> None:
    for key, ids in got.applied.items():
        if len(ids) > 1:
            cell.problems.append(f"key {key} applied {len(ids)} times by the service")
    for key, (_task, effect, state, receipt) in got.ops.items():
        if state == "CONFIRMED" and isinstance(receipt, dict) and "id" in receipt:
            if receipt["id"] not in got.applied.get(key, []):
                cell.problems.append(
                    f"{effect} {key}: CONFIRMED receipt {receipt['id']} is not what the "
                    f"service applied ({got.applied.get(key, [])})"
                )
        elif state != "CONFIRMED" and want.ops.get(key, ("", "", ""))[2] == "CONFIRMED":
            cell.problems.append(f"{effect} {key} ended {state}, not CONFIRMED")
    if _normal(got) != _normal(want):
        cell.problems.append(
            f"tasks ended as {_normal(got)}; a run without crashes ends {_normal(want)}"
        )
    if set(got.ops) != set(want.ops):
        odd = sorted(set(got.ops) ^ set(want.ops))
        cell.problems.append(f"operation keys differ from a run without crashes: {odd}")
    total, expected = sum(map(len, got.applied.values())), sum(map(len, want.applied.values()))
    if total != expected:
        cell.problems.append(
            f"the service applied {total} effects; a run without crashes applies {expected}"
        )
    if set(got.applied) != set(want.applied):
        cell.problems.append("the service applied other keys than in a run without crashes")


def crash_matrix(
    workflow: str,
    *,
    modes: Sequence[str] = MODES,
    points: Iterable[str] = CRASH_POINTS,
    retention: float | None = None,
    lookup_lag: float = 0.0,
    # Long enough that a loopback request does not time out on a loaded machine (a timeout
    # is an ambiguous answer, and in mode "neither" that is a person's question), short enough
    # that a restart does not wait long for an in-flight window to pass.
    timeout: float = 1.0,
    max_restarts: int = 6,
    child_timeout: float = 60.0,
    workdir: str | os.PathLike[str] | None = None,
    env: dict[str, str] | None = None,
    parallel: int | None = None,
    progress: bool | ProgressSink | None = None,
) -> MatrixReport:
    """Run ``workflow`` (``"module:function"``, called as ``function(journal, service)``) under
    a SIGKILL at every crash point, for every occurrence of every effect, in every mode.

    ``retention``, ``lookup_lag`` and ``timeout`` configure the reference service and the
    effects built by ``service.payment_effect()``. Returns a MatrixReport; call
    ``raise_for_problems()`` (or check ``.ok``) to fail a test with a readable matrix.

    ``progress``: None (the default) shows a progress line on stderr where stderr is a
    terminal and prints nothing elsewhere; True shows progress on stderr even where it is not
    a terminal (a plain line every few seconds); False never shows any. A
    :class:`~intentlog.testing.ProgressSink` gets the lines instead: the pytest fixture passes
    one that writes through pytest's terminal (see :mod:`intentlog.testing.plugin`).
    """
    for mode in modes:
        if mode not in MODES:
            raise ValueError(f"unknown service mode {mode!r}; choose from {', '.join(MODES)}")
    points = list(points)
    unknown = [p for p in points if p not in CRASH_POINTS]
    if unknown:
        raise ValueError(f"unknown crash points {unknown}; choose from {', '.join(CRASH_POINTS)}")
    load_workflow(workflow)  # fail here, clearly, rather than in every child
    if progress is None or isinstance(progress, bool):
        sink = sink_for(progress, sys.stderr)
    else:
        sink = progress
    watch = _Watch(workflow, sink) if sink is not None else None
    with tempfile.TemporaryDirectory(prefix="intentlog-matrix-", dir=workdir) as tmp:
        runner = _Runner(
            workflow, Path(tmp), retention=retention, lookup_lag=lookup_lag, timeout=timeout,
            max_restarts=max_restarts, child_timeout=child_timeout, env=env, watch=watch,
        )  # fmt: skip
        cells: list[Cell] = []
        references: dict[str, _Outcome] = {}
        for index, mode in enumerate(modes, 1):
            if watch is not None:
                watch.reference(mode, index, len(modes))
            references[mode] = runner.run(f"reference-{mode}", mode, None, None)
            counts: dict[str, int] = {}
            for _task, effect, _state, _receipt in references[mode].ops.values():
                counts[effect] = counts.get(effect, 0) + 1
            cells.extend(
                Cell(mode, point, effect, n)
                for point in points
                for effect, total in counts.items()
                for n in range(1, total + 1)
            )

        def one(cell: Cell) -> Cell:
            crash = f"{cell.point}:{cell.effect}:{cell.occurrence}"
            try:
                got = runner.run(f"{cell.mode}-{cell.point}-{cell.label}", cell.mode, crash, cell)
            except (_ChildFailed, subprocess.TimeoutExpired) as exc:
                cell.problems.append(str(exc))
            else:
                _check(cell, got, references[cell.mode])
            if cell.problems:
                cell.outcome = "FAIL"
            elif cell.outcome == "pending":
                cell.outcome = "resolved" if cell.unresolved else "recovered"
            return cell

        workers = parallel or max(2, os.cpu_count() or 2)
        with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
            if watch is None:
                done = list(pool.map(one, cells))
            else:
                watch.total = len(cells)
                try:
                    _watch_cells(pool, one, cells, watch)
                finally:
                    watch.close()  # the line ends, even when a cell raised
                done = cells
    return MatrixReport(workflow, done)


def _watch_cells(
    pool: concurrent.futures.Executor, one: Callable[[Cell], Cell], cells: list[Cell], watch: _Watch
) -> None:
    """Run ``one`` on every cell in ``pool``, telling ``watch`` as each ends (and, for a live
    line, every second in between), from this thread only."""
    futures = {pool.submit(one, cell): cell for cell in cells}
    waiting = set(futures)
    tick = 1.0 if watch.sink.live else None
    while waiting:
        finished, waiting = concurrent.futures.wait(
            waiting, timeout=tick, return_when=concurrent.futures.FIRST_COMPLETED
        )
        for future in finished:
            future.result()  # a cell's error is the matrix's, as it was with map
            watch.finished(futures[future])
        if not finished:
            watch.tick()
