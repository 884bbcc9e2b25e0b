"""The journal: opening it, leasing tasks, and the views and verbs that need no task code."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from intentlog._decide import DEFAULT_LOOKUP_LIMIT, LookupFailed, decide, task_action
from intentlog._driver import Call, Protocol, run_sync
from intentlog._effect import Effect
from intentlog._errors import InvalidInput, KeyConflict, TaskBusy, UnknownOperation
from intentlog._hygiene import DEFAULT_MAX_BYTES, check_safe
from intentlog._keys import validate_task_id
from intentlog._lease import Renewer
from intentlog._model import JSON, Action, LookupResult, Operation, State, TaskRecord
from intentlog._owner import holder_is_dead
from intentlog._protocol import Options, TaskCore, p_acquire
from intentlog._task import Task
from intentlog.stores._base import Resolution, Store

__all__ = [
    "DEFAULT_PATH",
    "BlockingCallWarning",
    "Journal",
    "Pending",
    "Recovered",
    "TaskInfo",
    "open",
]

DEFAULT_PATH = Path(".intentlog") / "journal.db"
ENV_URL = "INTENTLOG_URL"
_OPEN_STATES = (State.PLANNED, State.SUBMITTED, State.UNRESOLVED)


@dataclasses.dataclass(frozen=True, slots=True)
class Pending:
    """An operation that is not yet CONFIRMED or FAILED, with its one next action.

    ``not_before`` (store clock) is set when the action is WAIT: the time from which the next
    step can be decided.
    """

    key: str
    task_id: str
    effect: str
    state: State
    next_action: Action
    reason: str
    not_before: float | None
    operation: Operation


@dataclasses.dataclass(frozen=True, slots=True)
class Recovered:
    """What ``recover`` did with one SUBMITTED operation (or why it left it alone)."""

    key: str
    task_id: str
    effect: str
    state: State  # the state after recovery
    action: Action  # the next action from here
    reason: str


@dataclasses.dataclass(frozen=True, slots=True)
class TaskInfo:
    """A task with its operations and its next action (None once complete)."""

    record: TaskRecord
    operations: list[Operation]
    next_action: Action | None
    holder_alive: bool


class Journal:
    """The durable store of tasks and operations. Thread-safe; close it when done.

    ``lease_ttl``: seconds a task lease lasts without renewal. ``lease_wait``: how long
    ``task()`` waits for a live holder before raising TaskBusy. ``max_wait``: how long ``run``
    waits for an in-flight window to pass before raising StillInFlight. ``max_bytes``: size
    bound of every stored JSON value. ``lookup_limit``: inconclusive lookups before an
    operation becomes UNRESOLVED. ``attempts_per_run``: sends one ``run`` call may make.
    """

    def __init__(
        self,
        store: Store,
        *,
        lease_ttl: float = 30.0,
        lease_wait: float = 10.0,
        max_wait: float = 60.0,
        max_bytes: int = DEFAULT_MAX_BYTES,
        lookup_limit: int = DEFAULT_LOOKUP_LIMIT,
        attempts_per_run: int = 3,
    ) -> None:
        for name, value in (("lease_ttl", lease_ttl), ("max_bytes", max_bytes)):
            if not value > 0:
                raise InvalidInput(f"{name} must be > 0, got {value!r}")
        if lookup_limit < 1 or attempts_per_run < 1 or lease_wait < 0 or max_wait < 0:
            raise InvalidInput("lookup_limit and attempts_per_run must be >= 1, waits >= 0")
        self._store = store
        self.options = Options(
            lease_ttl=float(lease_ttl),
            lease_wait=float(lease_wait),
            max_wait=float(max_wait),
            max_bytes=int(max_bytes),
            lookup_limit=int(lookup_limit),
            attempts_per_run=int(attempts_per_run),
        )
        self._renewer = Renewer(self.options.lease_ttl)

    @property
    def lease_ttl(self) -> float:
        return self.options.lease_ttl

    @property
    def max_bytes(self) -> int:
        return self.options.max_bytes

    @property
    def lookup_limit(self) -> int:
        return self.options.lookup_limit

    @property
    def store(self) -> Store:
        return self._store

    @property
    def url(self) -> str:
        """Where the journal lives, safe to print."""
        return self._store.url

    def close(self) -> None:
        """Stop renewing leases and close the store. Open task handles lose their leases
        when these expire."""
        self._renewer.close()
        self._store.close()

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Journal {self.url}>"

    # -- tasks -----------------------------------------------------------------------------

    def task(self, task_id: str, *, wait: float | None = None) -> Task:
        """Lease the task (creating it on first use) and return its handle.

        Waits up to ``wait`` seconds (default ``lease_wait``) while another live worker holds
        it, then raises TaskBusy. A lease whose holder is known dead (same host, process gone)
        or has expired is taken at once; every takeover is a compare-and-set on the epoch, so
        two workers can never both win.
        """
        task_id = validate_task_id(task_id)
        _warn_if_in_event_loop()
        record, owner = run_sync(p_acquire(self._store, self.options, task_id, wait))
        return Task(
            TaskCore(self._store, self.options, record, owner, is_async=False), self._renewer
        )

    def start(self, kind: str, task_id: str, input: JSON = None) -> bool:
        """Create a task for workers to run with the task function registered as ``kind``.

        Idempotent: starting the same id again with the same kind and input changes nothing
        and returns False (True when this call created it). Another kind or input for an
        existing id raises KeyConflict. ``input`` is JSON, checked like task state.
        """
        task_id = validate_task_id(task_id)
        if not isinstance(kind, str) or not kind.strip() or len(kind) > 100:
            raise InvalidInput(f"task kind must be a non-empty string of <= 100 chars: {kind!r}")
        input_json = check_safe(input, what="input", max_bytes=self.max_bytes)
        if self._store.create_task(task_id, kind, input_json) is not None:
            return True
        existing = self._store.get_task(task_id)
        if existing is None or existing.kind != kind or existing.input != json.loads(input_json):
            raise KeyConflict(
                f"task {task_id!r} already exists with another kind or input",
                task_id=task_id,
            )
        return False

    def tasks(self, *, include_completed: bool = True) -> list[TaskRecord]:
        """Every task record, oldest first."""
        return self._store.list_tasks(include_completed=include_completed)

    def task_info(self, task_id: str) -> TaskInfo:
        """The task, its operations and its next action. Raises InvalidInput if unknown."""
        record = self._store.get_task(validate_task_id(task_id))
        if record is None:
            raise InvalidInput(f"no task {task_id!r} in the journal at {self.url}", task_id=task_id)
        return self._info(record)

    def _info(self, record: TaskRecord) -> TaskInfo:
        ops = self._store.list_ops(task_id=record.task_id)
        alive = (
            record.owner is not None
            and record.lease_expires > self._store.now()
            and not holder_is_dead(record.owner)
        )
        return TaskInfo(record, ops, task_action((o.state for o in ops), record.completed), alive)

    def attention(self) -> list[TaskInfo]:
        """Unfinished tasks that nobody is working on now, or that need a person."""
        infos = [self._info(r) for r in self._store.list_tasks(include_completed=False)]
        return [i for i in infos if i.next_action is Action.ESCALATE or not i.holder_alive]

    # -- operations ------------------------------------------------------------------------

    def operations(self, task_id: str | None = None) -> list[Operation]:
        """Every operation (of one task if given), oldest first."""
        if task_id is not None:
            task_id = validate_task_id(task_id)
        return self._store.list_ops(task_id=task_id)

    def operation(self, key: str) -> Operation:
        """The operation with this key; raises UnknownOperation if there is none."""
        op = self._store.get_op(key) if isinstance(key, str) else None
        if op is None:
            raise UnknownOperation(f"no operation with key {key!r} in {self.url}", key=str(key))
        return op

    def counts(self) -> dict[State, int]:
        """How many operations are in each state."""
        return self._store.count_ops()

    def pending(self) -> list[Pending]:
        """Operations not yet CONFIRMED or FAILED, each with its next action. No I/O besides
        the journal: the decision uses the service policy recorded with each operation."""
        now = self._store.now()
        result = []
        for op in self._store.list_ops(states=_OPEN_STATES):
            decision = decide(
                op,
                op.policy,
                now,
                submitter_gone=holder_is_dead(op.submitted_by),
                lookup_limit=self.lookup_limit,
            )
            action = Action.ESCALATE if decision.mark is State.UNRESOLVED else decision.action
            result.append(
                Pending(
                    op.key,
                    op.task_id,
                    op.effect,
                    op.state,
                    action,
                    decision.reason,
                    decision.not_before,
                    op,
                )
            )
        return result

    def recover(self, effects: Iterable[Effect], *, wait: float = 0.0) -> list[Recovered]:
        """Reconcile every SUBMITTED operation with its service, without running any task.

        Found operations become CONFIRMED; operations nothing can settle become UNRESOLVED.
        Nothing is ever sent: an operation that needs a (re)send stays SUBMITTED for the task
        to do. Tasks leased by a live worker are left alone (reported with action WAIT).
        Operations of effects not given are reported and left as they are.
        """
        return run_sync(self.p_recover(effects, wait, is_async=False))

    def p_recover(
        self, effects: Iterable[Effect], wait: float, *, is_async: bool
    ) -> Protocol[list[Recovered]]:
        """The protocol behind ``recover`` (shared with AsyncJournal)."""
        by_name = {e.name: e for e in effects}
        report: list[Recovered] = []
        submitted = yield Call(self._store.list_ops, (), {"states": [State.SUBMITTED]})
        for task_id in dict.fromkeys(op.task_id for op in submitted):
            ops: list[Operation] = yield Call(
                self._store.list_ops, (), {"task_id": task_id, "states": [State.SUBMITTED]}
            )
            try:
                record, owner = yield from p_acquire(self._store, self.options, task_id, wait)
            except TaskBusy:
                report.extend(_report(op, Action.WAIT, "its task is leased by a live worker")
                              for op in ops)  # fmt: skip
                continue
            core = TaskCore(self._store, self.options, record, owner, is_async=is_async)
            try:
                ops = yield Call(
                    self._store.list_ops, (), {"task_id": task_id, "states": [State.SUBMITTED]}
                )
                for op in ops:
                    effect = by_name.get(op.effect)
                    if effect is not None and effect.is_async and not is_async:
                        raise InvalidInput(
                            f"effect {effect.name!r} is async: recover it with AsyncJournal"
                        )
                    report.append((yield from self._p_recover_one(core, op, effect)))
            finally:
                yield from core.p_close()
        return report

    def _p_recover_one(
        self, core: TaskCore, op: Operation, effect: Effect | None
    ) -> Protocol[Recovered]:
        if effect is None:
            return _report(op, Action.RECONCILE, f"effect {op.effect!r} was not given to recover")
        now = self._store.now()
        gone = holder_is_dead(op.submitted_by)
        kwargs: dict[str, Any] = {"submitter_gone": gone, "lookup_limit": self.lookup_limit}
        decision = decide(op, effect.policy, now, **kwargs)
        if decision.action is Action.RECONCILE:
            lookup: LookupResult | LookupFailed = yield from core.p_lookup(effect, op.key)
            decision = decide(op, effect.policy, now, lookup=lookup, **kwargs)
        if decision.mark is not None or decision.lookup_failed:
            marked = yield from core.p_mark(op, decision, effect)
            op = marked if marked is not None else (yield from core.p_reload(op))
        action = decision.action
        if decision.mark is State.CONFIRMED:
            action = Action.USE_RECEIPT
        return _report(op, action, decision.reason)

    def resolve(
        self,
        key: str,
        outcome: str,
        *,
        receipt: JSON = None,
        note: str | None = None,
        actor: str | None = None,
    ) -> Operation:
        """Settle an operation by hand; the resolution is kept as an audit record.

        ``outcome``: "confirmed" (it happened; ``receipt`` is what you saw), "failed" (it did
        not happen and must not be retried with this key) or "retry" (it did not happen; the
        next run sends it again with the same key). Allowed from PLANNED, SUBMITTED and
        UNRESOLVED ("retry" not from PLANNED). Raises UnknownOperation for an unknown key,
        InvalidInput for an outcome that does not fit, UnsafeValue for a receipt holding a
        credential; in every error case nothing is written.
        """
        targets = {"confirmed": State.CONFIRMED, "failed": State.FAILED, "retry": State.PLANNED}
        if outcome not in targets:
            raise InvalidInput(
                f"outcome must be one of {', '.join(targets)}, got {outcome!r}", key=str(key)
            )
        if note is not None and (
            not isinstance(note, str) or len(note) > 2000 or _has_control(note, allow="\n\t")
        ):
            raise InvalidInput(
                "note must be a string of at most 2000 characters without control characters",
                key=str(key),
            )
        if receipt is not None and outcome != "confirmed":
            raise InvalidInput("a receipt only goes with outcome 'confirmed'", key=str(key))
        if receipt is not None:
            check_safe(receipt, what="receipt", max_bytes=self.max_bytes)
        to_state = targets[outcome]
        while True:
            op = self.operation(key)
            allowed = {State.SUBMITTED, State.UNRESOLVED} | (
                {State.PLANNED} if outcome != "retry" else set()
            )
            if op.state not in allowed:
                raise InvalidInput(
                    f"operation {key!r} is {op.state}; '{outcome}' applies only to "
                    f"{', '.join(sorted(allowed))} operations",
                    key=key,
                    state=op.state.value,
                )
            now = self._store.now()
            new = op.replace(
                state=to_state,
                updated_at=now,
                receipt=receipt if to_state is State.CONFIRMED else op.receipt,
                error={"message": note or "resolved as failed by an operator"}
                if to_state is State.FAILED
                else op.error,
                note=note,
                lookup_failures=0,
            )
            audit = Resolution(
                key=op.key,
                task_id=op.task_id,
                at=now,
                from_state=op.state,
                to_state=to_state,
                note=note,
                receipt=receipt,
                actor=actor or _default_actor(),
            )
            stored = self._store.update_op(new, None, self.lease_ttl, resolution=audit)
            if stored is not None:
                return stored

    def resolutions(self, key: str | None = None) -> list[Resolution]:
        """The audit log of operator resolutions (of one key if given), oldest first."""
        return self._store.resolutions(key)

    def gc(self, older_than: float) -> int:
        """Delete tasks completed more than ``older_than`` seconds ago, with their operations.

        Never removes a task that is not complete or that has an operation that is not
        CONFIRMED or FAILED. Returns how many tasks were removed.
        """
        if older_than < 0:
            raise InvalidInput(f"older_than must be >= 0 seconds, got {older_than!r}")
        return self._store.delete_completed(self._store.now() - older_than)


class BlockingCallWarning(RuntimeWarning):
    """The synchronous journal was used inside a running event loop, which it blocks."""


def _warn_if_in_event_loop() -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    warnings.warn(
        "the synchronous intentlog journal blocks the running event loop; use "
        "intentlog.open_async(...) and 'async with journal.task(...)' in async code",
        BlockingCallWarning,
        stacklevel=3,
    )


def _has_control(text: str, allow: str = "") -> bool:
    return any(ch not in allow and (ord(ch) < 32 or ord(ch) == 127) for ch in text)


def _report(op: Operation, action: Action, reason: str) -> Recovered:
    return Recovered(op.key, op.task_id, op.effect, op.state, action, reason)


def _default_actor() -> str:
    try:
        return os.getlogin()
    except OSError:
        return os.environ.get("USER", "unknown")


def open(url: str | os.PathLike[str] | None = None, **options: Any) -> Journal:
    """Open (creating if needed) a journal.

    ``url``: a file path, ``sqlite:///path``, or ``postgresql://...``; default
    ``$INTENTLOG_URL``, else ``./.intentlog/journal.db``. ``options`` go to :class:`Journal`.
    """
    store = open_store(url)
    try:
        return Journal(store, **options)
    except BaseException:
        store.close()  # bad options: do not leave a connection (or a pool) behind
        raise


def open_store(url: str | os.PathLike[str] | None = None) -> Store:
    """The store a journal URL names (see :func:`open`)."""
    if url is None:
        url = os.environ.get(ENV_URL) or DEFAULT_PATH
    text = os.fspath(url)
    if not text:
        raise InvalidInput("journal URL is empty")
    scheme, sep, rest = text.partition("://")
    if not sep:
        return _sqlite(text)
    if scheme == "sqlite":
        if not rest.startswith("/") or len(rest) < 2:
            raise InvalidInput(
                f"sqlite URL needs a path (sqlite:///path/journal.db), got {_masked(text)!r}"
            )
        return _sqlite(rest)
    if scheme in ("postgresql", "postgres"):
        return _postgres(text)
    raise InvalidInput(f"unknown journal URL scheme {scheme!r}; use a path or sqlite:///path")


def _masked(url: str) -> str:
    """The URL with any password replaced, so it is safe in an error message."""
    return re.sub(r"(://[^/:@]*:)[^/@]*@", r"\1***@", url)


def _sqlite(path: str) -> Store:
    from intentlog.stores.sqlite import SQLiteStore

    return SQLiteStore(path)


def _postgres(url: str) -> Store:
    try:  # psycopg is an optional extra: import it only for a postgresql:// journal
        from intentlog.stores.postgres import PostgresStore
    except ImportError as exc:
        raise InvalidInput(
            f"postgresql:// journals need psycopg 3: pip install 'intentlog[postgres]' ({exc})"
        ) from exc
    return PostgresStore(url)
