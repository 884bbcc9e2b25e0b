"""Workers: registered task functions, run by whichever worker claims the task.

A worker claims a runnable task of a kind it registered (new, or whose lease expired), renews
its lease while it runs, reconciles the task's SUBMITTED operations first, then calls the task
function, which resumes at the task's ``next_step``. A task that stops on an UNRESOLVED
operation is parked until a person resolves it; one that stops at an operation waiting for a
person's approval is run again every 20 polls, no failure counted; a task whose function
raises is retried later with backoff. A journal whose server cannot be reached for longer
than its store waits (JournalUnreachable) does not end a worker: it logs one line and claims
again after a jittered backoff.
"""

from __future__ import annotations

import contextlib
import logging
import random
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

from intentlog._ambient import Journaled, effect_of, made_current
from intentlog._check import log_at_start
from intentlog._decide import AGENT_TASK_KINDS, PROXY_TASK_KIND
from intentlog._effect import Effect
from intentlog._errors import (
    ApprovalRequired,
    InvalidInput,
    JournalUnreachable,
    LeaseLost,
    OutcomeUnknown,
    StillInFlight,
)
from intentlog._journal import Journal
from intentlog._model import JSON
from intentlog._task import Task, recover_submitted
from intentlog._validate import seconds

__all__ = ["Registry", "Worker"]

#: What ``Registry.task(kind)`` registers: ``fn(task, input)``, run by a worker that claims
#: a task of that kind.
TaskFunction = Callable[[Task, JSON], Any]
_BACKOFF_CAP = 300.0
#: A task whose operation waits for an approval is looked at again after this many polls.
_APPROVAL_POLLS = 20
_OUTAGE_CAP = 30.0  # seconds: the longest wait between claims while the journal is away
log = logging.getLogger("intentlog.worker")


class Registry:
    """Task functions by name, and the effects a worker may reconcile before resuming.

    ::

        registry = intentlog.Registry(effects=[charge, send_mail])

        @registry.task("order")
        def order(task: intentlog.Task, input: dict) -> None:
            ...  # resumes at task.next_step; returning completes the task
    """

    def __init__(self, effects: list[Effect | Journaled[..., Any]] | None = None) -> None:
        self.functions: dict[str, TaskFunction] = {}
        self.effects: dict[str, Effect] = {}
        self.add_effects(*(effects or []))

    def task(self, name: str | None = None) -> Callable[[TaskFunction], TaskFunction]:
        """Decorator: register ``fn(task, input)`` under ``name`` (default: its __name__)."""

        def register(fn: TaskFunction) -> TaskFunction:
            kind = name or fn.__name__
            if kind in AGENT_TASK_KINDS:
                # The proxy's and the gateway's tasks are finished by them or a person; a
                # worker claiming them would run a function they never journaled calls for.
                front = "the MCP proxy" if kind == PROXY_TASK_KIND else "the gateway"
                raise InvalidInput(f"task kind {kind!r} is reserved for {front}")
            if kind in self.functions and self.functions[kind] is not fn:
                raise InvalidInput(f"task kind {kind!r} is registered twice")
            self.functions[kind] = fn
            return fn

        return register

    def add_effects(self, *effects: Effect | Journaled[..., Any]) -> None:
        """Effects whose SUBMITTED operations a worker reconciles before running a task
        (:class:`intentlog.Effect` objects, or functions decorated with
        ``@intentlog.journaled``)."""
        for given in effects:
            effect = effect_of(given)
            if effect is None:
                raise InvalidInput(f"not an intentlog.Effect or journaled function: {given!r}")
            self.effects[effect.name] = effect


class Worker:
    """Runs registered tasks from a journal until stopped.

    ``poll`` is how long to sleep when nothing is runnable. ``stop()`` (or SIGTERM/SIGINT
    under ``run(handle_signals=True)``) lets the current task finish, then returns.
    """

    def __init__(self, journal: Journal, registry: Registry, *, poll: float = 0.5) -> None:
        self.journal = journal
        self.registry = registry
        self.poll = seconds("poll", poll, positive=True)
        self._stop = threading.Event()
        self.completed = 0
        self.parked = 0
        self.failed = 0
        self._outages = 0  # JournalUnreachable in a row

    def stop(self) -> None:
        self._stop.set()

    def run(
        self, *, exit_when_idle: bool = False, handle_signals: bool = False, max_tasks: int = 0
    ) -> None:
        """Claim and run tasks until stopped (or, with ``exit_when_idle``, until nothing is
        runnable; with ``max_tasks``, after that many). First logs, once per registry, what
        :func:`intentlog.check` finds for its effects against the lease time to live, and
        whether a failover of the journal's PostgreSQL server could lose commits those
        effects cannot afford (no synchronous standby)."""
        log_at_start(
            self.registry.effects.values(),
            self.journal.lease_ttl,
            once_for=self.registry,
            store=self.journal.store,
        )
        with self._signals() if handle_signals else contextlib.nullcontext():
            ran = 0
            while not self._stop.is_set():
                ran_one = self._run_once_through_outages()
                if ran_one is None:
                    continue  # the journal was away: waited, claim again
                if ran_one:
                    ran += 1
                    if max_tasks and ran >= max_tasks:
                        return
                elif exit_when_idle:
                    return
                else:
                    self._stop.wait(self.poll)

    @contextlib.contextmanager
    def _signals(self) -> Iterator[None]:
        previous = {
            sig: signal.signal(sig, lambda *_: self._stop.set())
            for sig in (signal.SIGTERM, signal.SIGINT)
        }
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _run_once_through_outages(self) -> bool | None:
        """:meth:`run_once`; or None, after a wait, if the journal's server could not be
        reached (the store gives up after its own bound; a task's run may end so too).

        The wait doubles from ``poll`` up to 30 s, drawn at random below that (full jitter,
        https://aws.amazon.com/blogs/architecture/exponential-backoff-and-jitter/), so that
        the workers of a fleet do not all come back at once. The task it was running, if
        any, is claimable again once its lease expires."""
        try:
            ran_one = self.run_once()
        except JournalUnreachable as exc:
            self._outages += 1
            wait = random.uniform(0.0, min(_OUTAGE_CAP, self.poll * 2.0**self._outages))
            log.warning(
                "intentlog worker: the journal is unreachable (%s); claiming again in %.1f s",
                " ".join(str(exc).split()),
                wait,
            )
            self._stop.wait(wait)
            return None
        self._outages = 0
        return ran_one

    def run_once(self) -> bool:
        """Claim one runnable task of a kind registered here and run it; False if nothing
        such was runnable. A task of another kind (another application's, or a newer
        version's during a rolling deploy) is never claimed, so it never fails or backs
        off here: it waits, untouched, for a worker that has its function."""
        kinds = tuple(self.registry.functions)  # read each time: tasks may be added later
        task = self.journal.claim(kinds)
        if task is None:
            return False
        self._run(task)
        return True

    def _run(self, task: Task) -> None:
        record = task.record
        fn = self.registry.functions.get(record.kind or "")
        try:
            if fn is None:  # not expected: the claim asks only for registered kinds
                raise InvalidInput(f"no task function registered for kind {record.kind!r}")
            # Settle what a dead worker left in flight, first.
            recover_submitted(task, self.registry.effects)
            with made_current(task):  # journaled functions the task function calls run under it
                fn(task, record.input)
            if not task.completed:
                task.complete()
            self.completed += 1
        except OutcomeUnknown:
            self.parked += 1  # parked: not claimable while an operation is UNRESOLVED
            task.close()
        except StillInFlight as exc:
            task.release(not_before=exc.not_before)
        except ApprovalRequired:
            # Waiting for a person is no failure: no run is counted and no backoff grows.
            # The task is run again after a while (its function stops at the same approval
            # until someone approves it, which the next run sends, or denies it, which it
            # sees as Rejected); status names the approval meanwhile.
            self.parked += 1
            task.release(retry_in=min(self.poll * _APPROVAL_POLLS, _BACKOFF_CAP))
        except LeaseLost:
            task.close()  # another worker has it: a lost lease writes nothing more
        except Exception as exc:
            self.failed += 1
            backoff = min(2.0 ** min(record.runs, 16), _BACKOFF_CAP)
            task.release(failed=f"{type(exc).__name__}: {exc}", retry_in=backoff)
