"""What every framework integration shares: a tool call as a journaled operation.

A framework module (``langgraph``, ``pydantic_ai``, ``openai_agents``, ...) is only the framework's
seam: it turns the framework's tool into a :class:`ToolSpec`, names the task, names the *scope*
the framework runs again (a graph step, an agent run, a crew task) and hands each call to
:func:`invoke`. Everything else is here, written once:

- **Task handles.** :func:`handles` gives one leased handle per task id in a process; the calls
  of one task take turns on it (one writer per task) and the task is released, and completed when
  every operation is settled, once its last concurrent call ends (:class:`TaskHandles`).
- **Which operation a call is** (the identity rule, docs/concepts.md "Which operation a tool call
  is"). Models do not repeat themselves word for word: a framework that retries or resumes a
  step asks the model again, and the same logical action comes back with other arguments (a
  reworded email, a rounded amount). So a call of tool ``T`` in a task is matched in this order:

  1. **the same call**: an operation of ``T`` in the task with the same canonical arguments is
     this call, whatever scope made it: it gets that operation's receipt (or the journal settles
     it first). One call with the same arguments is one effect per task, as before;
  2. **the same position**: otherwise the call takes the next position ``n`` of ``T`` in this
     execution of its scope (the first ``T`` call of the step is 1, the next 2, ...). If an
     earlier execution of the scope already made an operation at that position with other
     arguments, this is a rewritten retry of it: if that operation was applied or may have been,
     nothing is sent and the model is shown :class:`AlreadyDone` (the action already taken, with
     its receipt); if it was not applied (FAILED), the position is passed over;
  3. **a new call**: a free position gets a new operation, keyed by task, tool, scope and
     position (``derive_key``), so the same position after a crash finds it.

  A call the caller *means* to repeat is simply made again: within one execution it takes the
  next position and is sent. Positions are counted per execution: the framework's attempt marker
  (:func:`attempt`) tells a re-run of the scope from the calls of one run.
- **What the model reads** for each outcome: the receipt; :data:`ALREADY_DONE_PREFIX` text;
  :data:`UNRESOLVED_PREFIX` text (may have been applied, do not retry, a person settles it); the
  service's rejection. Every other intentlog error is raised, never turned into a message the
  model could work around.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import importlib.util
import inspect
import json
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from intentlog._async import AsyncJournal
from intentlog._effect import Effect, ReceiptSelector, Reconcile, Seconds
from intentlog._errors import (
    InvalidInput,
    LeaseLost,
    OutcomeUnknown,
    Rejected,
    UnknownOperation,
    install_hint,
)
from intentlog._hygiene import redact
from intentlog._journal import Journal
from intentlog._keys import canonical_json, derive_key, fingerprint
from intentlog._model import JSON, Operation, State
from intentlog._service import Retention
from intentlog._task import Task

__all__ = [
    "ALREADY_DONE_PREFIX",
    "DENIED_PREFIX",
    "KEY_ARG",
    "UNRESOLVED_PREFIX",
    "AlreadyDone",
    "Attempt",
    "TaskHandles",
    "ToolEffect",
    "ToolOptions",
    "ToolSpec",
    "answer_approval",
    "attempt",
    "call_tool",
    "check_key_use",
    "handles",
    "invoke",
    "kept_args",
    "need",
    "refusal_answer",
    "rejected_answer",
    "sync_journal",
    "takes_key",
    "tool_effect",
    "unresolved_answer",
]

KEY_ARG = "idempotency_key"
"""The parameter through which a wrapped tool or function receives the operation key."""

ALREADY_DONE_PREFIX = "ALREADY DONE"
"""The first words of the tool's answer when a rewritten retry found its action already taken."""

DENIED_PREFIX = "DENIED"
"""The first word of the tool's answer when a person denied the call: it was not sent."""

UNRESOLVED_PREFIX = "UNRESOLVED"
"""The first word of the tool's answer when the outcome of a call is unknown."""


# -- options and specs ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ToolOptions:
    """The effect options a tool wrapper accepts; each means what it means on
    :class:`intentlog.Effect`, and None means "not given" (the Effect's default)."""

    idempotent: bool | None = None
    key_retention: Seconds | Retention | None = None
    reconcile: Reconcile | None = None
    timeout: Seconds | None = None
    lookup_lag: Seconds | None = None
    receipt: ReceiptSelector | None = None
    # True: each call waits for a person's approval before its first send (the run raises
    # intentlog.ApprovalRequired, which each framework maps onto its own human-in-the-loop).
    approval: bool | None = None

    def given(self) -> dict[str, Any]:
        """The options that were given, as keyword arguments of :class:`Effect`."""
        return {
            field.name: getattr(self, field.name)
            for field in dataclasses.fields(self)
            if getattr(self, field.name) is not None
        }


@dataclasses.dataclass(frozen=True)
class ToolSpec:
    """A tool as the journal sees it: ``spread`` runs ``task.run(effect, **args)`` (a user's
    Effect), otherwise ``task.run(effect, args)`` (a :class:`ToolEffect`)."""

    name: str
    description: str
    schema: Any
    effect: Effect
    spread: bool

    def run(self, task: Task, args: dict[str, Any], key: str | None = None) -> JSON:
        """``task.run`` of this tool's effect with ``args`` (and an explicit ``key``, if given)."""
        if not self.spread:
            return task.run(self.effect, args, key=key)
        if "key" in args:
            raise InvalidInput(
                f"effect {self.effect.name!r}: an argument named 'key' clashes with task.run's "
                "key=; rename it"
            )
        return task.run(self.effect, key=key, **args)

    def fingerprint(self, args: dict[str, Any]) -> str:
        """The fingerprint ``task.run`` records for a call with ``args``."""
        named = self.effect.bind((), args) if self.spread else self.effect.bind((args,), {})
        return fingerprint(canonical_json(named, what=f"arguments of tool {self.name!r}"))


class ToolEffect(Effect):
    """An Effect called with one JSON object of arguments: ``task.run(effect, args)``, submitted
    as ``submit(key, args)``. An argument may be named ``key``."""

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        if kwargs or len(args) != 1 or not isinstance(args[0], dict):
            raise InvalidInput(f"effect {self.name!r} is run as task.run(effect, args_dict)")
        return dict(args[0])


def tool_effect(
    name: str, call: Callable[[str, dict[str, Any]], Any], options: ToolOptions
) -> ToolEffect:
    """The effect behind a tool: ``call(key, args)`` performs it. It keeps the call's arguments
    in the journal (see :func:`kept_args`)."""
    return ToolEffect(name, call, store_args=kept_args, **options.given())


def kept_args(args: Any) -> Any:
    """A tool call's arguments as the journal keeps them: whole, so that a rewritten retry can
    settle the earlier call with that call's own arguments and an operator sees what the model
    asked for (``intentlog show``); not at all when they hold anything credential-like, which
    intentlog never stores (such a call is then settled by a person if it is ever in doubt)."""
    return args if redact(args) is args else None


def takes_key(fn: Callable[..., Any], key_arg: str) -> bool:
    """Whether ``fn`` has a parameter ``key_arg`` that can be passed by name."""
    try:
        param = inspect.signature(fn).parameters.get(key_arg)
    except (TypeError, ValueError):
        return False
    return param is not None and param.kind in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY)


def check_key_use(name: str, has_key: bool, key_arg: str, options: ToolOptions) -> None:
    """Refuse a deduplicating or reconcilable declaration for a tool that never sees the key."""
    if not has_key and (options.idempotent or options.reconcile):
        raise InvalidInput(
            f"tool {name!r}: idempotent=True and reconcile= need the service to know the "
            f"operation key, but the tool has no {key_arg!r} parameter to receive it"
        )


def need(module: str, extra: str) -> None:
    """Raise ImportError with the install command if the framework ``module`` is missing."""
    if importlib.util.find_spec(module) is None:
        raise ImportError(f"{module} is not installed: {install_hint(extra)}")


def sync_journal(journal: Journal | AsyncJournal) -> Journal:
    """The synchronous journal behind ``journal`` (tools run it in a worker thread)."""
    if isinstance(journal, AsyncJournal):
        return journal.sync_journal()
    if not isinstance(journal, Journal):
        raise InvalidInput(f"expected an intentlog Journal or AsyncJournal, got {journal!r}")
    return journal


# -- task handles ---------------------------------------------------------------------------------


@dataclasses.dataclass(eq=False)
class _Entry:
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    users: int = 0
    task: Task | None = None


class TaskHandles:
    """One leased handle per task id, shared by the concurrent calls of that task in a process.

    A task has one writer at a time (its lease) and a handle serves one thread at a time, so calls
    of one task take turns here, on a lock rather than by polling the lease (which would give up
    with TaskBusy behind a slow effect); calls of different tasks run in parallel. The first call
    leases the task and the last concurrent one releases it, so no lease is held while the agent
    thinks. When it releases, it marks the task complete if every operation is CONFIRMED or FAILED,
    so an idle thread is not reported as unfinished work (``intentlog status``) and ``intentlog gc``
    may collect it; a later call on the same task records its operations as before.
    """

    def __init__(self, journal: Journal) -> None:
        self._journal = weakref.ref(journal)
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}

    @contextlib.contextmanager
    def task(self, task_id: str) -> Iterator[Task]:
        """The task's leased handle, for this thread until the block ends."""
        with self._lock:
            entry = self._entries.setdefault(task_id, _Entry())
            entry.users += 1
        try:
            with entry.lock:
                if entry.task is None:
                    journal = self._journal()
                    if journal is None:
                        raise InvalidInput("the journal of these durable tools is gone")
                    entry.task = journal.task(task_id)
                try:
                    yield entry.task
                except LeaseLost:
                    lost, entry.task = entry.task, None
                    lost.close()  # fenced off for good; the next call leases the task again
                    raise
        finally:
            with self._lock:
                entry.users -= 1
                idle = entry.users == 0
                if idle:
                    del self._entries[task_id]
            if idle and entry.task is not None:
                _release(entry.task)


def _release(task: Task) -> None:
    with contextlib.suppress(LeaseLost):  # taken over: nothing of ours is left to release
        settled = all(op.state in (State.CONFIRMED, State.FAILED) for op in task.operations())
        if settled:
            task.complete()
            return
    task.close()


_registry: weakref.WeakKeyDictionary[Journal, TaskHandles] = weakref.WeakKeyDictionary()
_registry_lock = threading.Lock()


def handles(journal: Journal | AsyncJournal) -> TaskHandles:
    """The process-wide :class:`TaskHandles` of a journal, shared by all its durable tools."""
    sync = sync_journal(journal)
    with _registry_lock:
        found = _registry.get(sync)
        if found is None:
            found = _registry[sync] = TaskHandles(sync)
        return found


# -- which operation a call is --------------------------------------------------------------------


class Attempt:
    """One execution of a scope: the positions its calls took, tool by tool.

    Get it from :func:`attempt`, which hands the same object to every call of one execution and a
    fresh one when the framework runs the scope again.
    """

    def __init__(self, task_id: str, scope: str) -> None:
        self.task_id = task_id
        self.scope = scope
        self._taken: dict[str, set[int]] = collections.defaultdict(set)
        self._lock = threading.Lock()

    def key(self, tool: str, position: int, variant: str | None = None) -> str:
        """The key of the operation at ``position`` of ``tool`` in this scope (``variant``: of
        a call with other arguments at a position whose first call was not applied)."""
        named: dict[str, Any] = {"scope": self.scope, "position": position}
        if variant is not None:
            named["variant"] = variant
        return derive_key(self.task_id, tool, canonical_json(named))

    def take(self, tool: str, position: int) -> None:
        with self._lock:
            self._taken[tool].add(position)

    def free_positions(self, tool: str) -> Iterator[int]:
        """Positions of ``tool`` not yet taken in this execution, lowest first."""
        position = 0
        while True:
            position += 1
            with self._lock:
                taken = position in self._taken[tool]
            if not taken:
                yield position


_ATTEMPTS_KEPT = 4096  # per process: an evicted scope only makes its next call match from 1 again
_attempts: collections.OrderedDict[tuple[int, str, str], tuple[Callable[[], object], Attempt]] = (
    collections.OrderedDict()
)
_attempts_lock = threading.Lock()


def attempt(
    journal: Journal | AsyncJournal, task_id: str, scope: str, marker: object = None
) -> Attempt:
    """The execution of ``scope`` in ``task_id`` that a call belongs to.

    ``scope`` names the unit the framework runs again (a graph step, an agent run, a crew task);
    ``marker`` is an object that is the same (the same object) during one execution and another
    one when the framework starts the unit again in the same process: a per-run object such as
    the run's usage counter. It is held weakly where it can be, so a finished run's object is not
    kept alive, and a new object at a dead one's address is never taken for it. A process that
    died and started again begins a fresh execution of every scope.
    """
    sync = sync_journal(journal)
    entry = (id(sync), task_id, scope)
    with _attempts_lock:
        found = _attempts.get(entry)
        if found is not None and _same(found[0](), marker):
            _attempts.move_to_end(entry)
            return found[1]
        fresh = Attempt(task_id, scope)
        _attempts[entry] = (_hold(marker), fresh)
        while len(_attempts) > _ATTEMPTS_KEPT:
            _attempts.popitem(last=False)
        return fresh


def _same(held: object, marker: object) -> bool:
    # An object held weakly is this execution's only if it is that very object; a value held
    # strongly (a retry count, a run id) is compared by equality.
    return held is marker or (held is not None and held == marker and not _weak(marker))


def _weak(marker: object) -> bool:
    try:
        weakref.ref(marker)
    except TypeError:
        return False
    return True


def _hold(marker: object) -> Callable[[], object]:
    try:
        return weakref.ref(marker)
    except TypeError:  # None, a str, a tuple: held strongly, they keep no run alive
        return lambda: marker


@dataclasses.dataclass(frozen=True)
class AlreadyDone:
    """A rewritten retry: this call's position was already taken by an applied operation.

    Nothing was sent for this call. ``text`` is what the model reads: the action already taken,
    with its receipt, and how to make another one if it is really wanted.
    """

    tool: str
    key: str
    receipt: JSON
    recorded_args: JSON

    @property
    def text(self) -> str:
        earlier = (
            f" with arguments {_short(self.recorded_args)}"
            if self.recorded_args is not None
            else ""
        )
        return (
            f"{ALREADY_DONE_PREFIX}: this {self.tool} call repeats one already made in an earlier "
            f"attempt of this step{earlier}, which was applied (operation {self.key}; result: "
            f"{_short(self.receipt)}). This call was NOT sent, so it did not happen a second "
            f"time. If another {self.tool} really is needed as well, call {self.tool} again."
        )

    def __str__(self) -> str:
        return self.text


def call_tool(
    task: Task,
    spec: ToolSpec,
    args: dict[str, Any],
    scope: Attempt | None = None,
    *,
    key: str | None = None,
    position: int | None = None,
) -> JSON | AlreadyDone:
    """Run one tool call as an operation of ``task``, by the identity rule of this module.

    ``key`` is an identity the framework gives (it names this call across its replays): the call
    is that operation. Without ``key`` or ``scope`` the key is derived from the arguments alone
    (the same call is one effect per task). ``position`` is the call's position among the
    tool's calls in the scope's execution where the framework's own record tells it (a run's
    message history); without it, the lowest position ``scope`` has not handed out yet.
    Returns the receipt, or :class:`AlreadyDone` for a rewritten retry (nothing sent). Raises
    what ``task.run`` raises: Rejected, OutcomeUnknown, and the journal's errors.
    """
    if key is not None or scope is None:
        return spec.run(task, args, key=key)
    fp = spec.fingerprint(args)
    ops = [op for op in task.operations() if op.effect == spec.effect.name]
    same = next((op for op in ops if op.fingerprint == fp), None)
    if same is not None:
        # Replayed at its own position, that position is this execution's too: a later call
        # with other arguments is then a new action, not a rewrite of this one.
        positions = {scope.key(spec.name, p): p for p in range(1, len(ops) + 1)}
        if same.key in positions:
            scope.take(spec.name, positions[same.key])
        return spec.run(task, args, key=same.key)
    by_key = {op.key: op for op in ops}
    if position is not None:
        return _at_position(task, spec, args, scope, position, fp, by_key)
    for position in scope.free_positions(spec.name):
        key = scope.key(spec.name, position)
        earlier = by_key.get(key)
        scope.take(spec.name, position)
        if earlier is None:
            return spec.run(task, args, key=key)
        earlier = _settled(task, spec, earlier)
        if earlier.state is not State.FAILED:
            return AlreadyDone(spec.name, key, earlier.receipt, earlier.args)
    raise AssertionError("unreachable: free positions never run out")  # pragma: no cover


def _at_position(
    task: Task,
    spec: ToolSpec,
    args: dict[str, Any],
    scope: Attempt,
    position: int,
    fp: str,
    by_key: dict[str, Operation],
) -> JSON | AlreadyDone:
    """A call at the position the framework's record gives it (it is not counted here)."""
    if position < 1:
        raise InvalidInput(f"tool {spec.name!r}: a call's position starts at 1, got {position}")
    key = scope.key(spec.name, position)
    earlier = by_key.get(key)
    if earlier is None:
        return spec.run(task, args, key=key)
    earlier = _settled(task, spec, earlier)
    if earlier.state is not State.FAILED:
        return AlreadyDone(spec.name, key, earlier.receipt, earlier.args)
    # The position's first call was not applied: this one is a call of its own there.
    return spec.run(task, args, key=scope.key(spec.name, position, variant=fp))


def _settled(task: Task, spec: ToolSpec, op: Operation) -> Operation:
    """``op`` once the journal has settled it with its own recorded arguments, where it can.

    A rewritten retry must never send its new arguments in the place of an operation that may
    have been applied, and must never send the earlier arguments blindly either: the earlier
    operation is driven by the journal's own rules (replay, lookup, resend of the same key),
    which needs its arguments. Without them, an unsettled operation is reported as unknown.
    """
    if op.state in (State.CONFIRMED, State.FAILED):
        return op
    if op.state is State.UNRESOLVED or op.args is None or not isinstance(op.args, dict):
        raise OutcomeUnknown(
            f"an earlier {spec.name} call at this position ({op.key}) is {op.state.value} and "
            f"this call has other arguments: nothing was sent; settle {op.key} first "
            f"(intentlog resolve {op.key}, or run the earlier call again)",
            task_id=task.id,
            key=op.key,
            state=op.state.value,
        )
    with contextlib.suppress(Rejected):  # the earlier call was not applied: FAILED below
        spec.run(task, op.args, key=op.key)
    return next(o for o in task.operations() if o.key == op.key)


def invoke(
    tasks: TaskHandles,
    task_id: str,
    spec: ToolSpec,
    args: dict[str, Any],
    *,
    scope: Attempt | None = None,
    key: str | None = None,
    position: int | None = None,
    rejected_to_model: bool = True,
    unresolved_to_model: bool = True,
) -> Any:
    """One tool call from a framework: what the tool answers the model.

    The receipt; the :class:`AlreadyDone` text for a rewritten retry; :func:`rejected_answer` when
    the service said "not applied" (unless ``rejected_to_model=False``, which raises Rejected);
    :func:`unresolved_answer` when nothing can settle it (unless ``unresolved_to_model=False``,
    which raises OutcomeUnknown). Every other error is raised.
    """
    try:
        with tasks.task(task_id) as task:
            result = call_tool(task, spec, args, scope, key=key, position=position)
    except Rejected as exc:
        if not rejected_to_model:
            raise
        return rejected_answer(spec.name, exc)
    except OutcomeUnknown as exc:
        if not unresolved_to_model:
            raise
        return unresolved_answer(spec.name, exc)
    return result.text if isinstance(result, AlreadyDone) else result


def rejected_answer(tool: str, exc: Rejected) -> str:
    """What the model reads when the service refused the call: it was not applied."""
    return f"{tool} was rejected by the service (not applied): {exc}"


def unresolved_answer(tool: str, exc: OutcomeUnknown) -> str:
    """What the model reads when a call's outcome is unknown: not a failure it may retry."""
    key = exc.key or "?"
    return (
        f"{UNRESOLVED_PREFIX}: the {tool} call may or may not have been applied by the "
        f"service, and nothing can tell which (operation key {key}). Do NOT call {tool} "
        "again for this and do not try another way to do it: a person has to check the service "
        f"and settle it (intentlog resolve {key} --confirmed/--failed). Tell the user it is "
        "waiting for that review."
    )


# -- a person's answer given through the framework ----------------------------------------------


def answer_approval(
    journal: Journal | AsyncJournal,
    task_id: str,
    spec: ToolSpec,
    args: dict[str, Any],
    *,
    approved: bool,
    actor: str,
    reason: str | None = None,
) -> Operation | None:
    """Record the answer a person gave through the framework's own human-in-the-loop, before
    anything is sent: ``journal.approve`` (``approved``) or ``journal.deny`` of the operation
    that a call of ``spec`` with ``args`` in ``task_id`` is by the identity rule's first clause
    (the same call: exactly these arguments), so the approval is bound to them and the next run
    of that call sends it once.

    Returns that operation as the answer left it, or None when the task has none (the call's
    next run journals it and asks again). An answer that comes too late changes nothing and is
    not an error: once the send has begun the approval was spent, and a "yes" after a "no"
    leaves the denial standing (the run then reads the denial). Raises InvalidInput for an
    actor or reason the journal refuses, with nothing written.
    """
    sync = sync_journal(journal)
    fp = spec.fingerprint(args)
    ops = sync.operations(task_id)
    op = next((o for o in ops if o.effect == spec.effect.name and o.fingerprint == fp), None)
    if op is None or not _answerable(op):
        return op
    answer = sync.approve if approved else sync.deny
    try:
        return answer(op.key, actor=actor, reason=reason)
    except InvalidInput:
        now = sync.operation(op.key)
        if _answerable(now):  # the actor or reason was refused, not the moment
            raise
        return now  # a send began, or a denial landed, meanwhile: that stands


def _answerable(op: Operation) -> bool:
    approval = op.approval
    return (
        approval is not None
        and approval.status != "denied"
        and op.state is State.PLANNED
        and not op.attempts
    )


def refusal_answer(journal: Journal | AsyncJournal, tool: str, exc: Rejected) -> str:
    """What the model reads when a call was not applied: who denied it, for an operation a
    person denied (never sent), else :func:`rejected_answer` (the service refused it)."""
    op = None
    if exc.key:
        with contextlib.suppress(UnknownOperation):  # a key the journal never held: the service's
            op = sync_journal(journal).operation(exc.key)
    approval = op.approval if op is not None else None
    if op is None or approval is None or approval.status != "denied":
        return rejected_answer(tool, exc)
    why = f" ({approval.reason})" if approval.reason else ""
    return (
        f"{DENIED_PREFIX}: {approval.actor} denied this {tool} call{why}, so it was NOT sent "
        f"and never will be (operation {op.key}). Do not call {tool} again for it unless the "
        "user asks for it anew; tell the user it was denied."
    )


def _short(value: JSON, limit: int = 300) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."
