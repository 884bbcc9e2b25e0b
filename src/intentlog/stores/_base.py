"""The store contract: a handful of primitives the journal logic is written once above.

A backend implements :class:`Store`. Every primitive is atomic on its own: it either happens
completely and durably (committed and synced before it returns) or not at all. Writes made on
behalf of a task are *fenced*: they name the epoch of the lease they were made under and fail
with LeaseLost, changing nothing, if the task's epoch has moved on. ``write_task`` also extends
the task's lease to ``now + ttl`` in the same transaction (operation writes may, but need not:
the journal renews leases in the background and checks the time left before every send).
The fence must be serialised with ``claim_task``: a single writer (SQLite), or a row lock on
the task taken by the write itself (in PostgreSQL ``SELECT ... FOR SHARE`` on the task row,
which waits for a takeover in progress and re-reads the epoch it committed, without writing
the row; a plain ``WHERE EXISTS`` subquery is not enough under READ COMMITTED, where a takeover
that commits meanwhile is not seen).

Times are seconds since the Unix epoch on the store's clock (:meth:`Store.now`), never the
worker's, so leases and retention windows mean the same thing to every worker.
"""

from __future__ import annotations

import abc
import dataclasses
import json
from collections.abc import Collection, Iterable, Sequence
from typing import Any

from intentlog._errors import LeaseLost
from intentlog._keys import json_encoder
from intentlog._model import Approval, Operation, Policy, State, TaskRecord

__all__ = [
    "OP_COLUMNS",
    "TASK_COLUMNS",
    "Resolution",
    "Store",
    "TaskResolution",
    "TaskUpdate",
    "columns_of",
    "lease_lost",
    "op_from_row",
    "op_to_row",
    "op_values",
    "resolution_from_row",
]

OP_COLUMNS = (
    "key",
    "task_id",
    "effect",
    "fingerprint",
    "state",
    "version",
    "can_reconcile",
    "idempotent",
    "key_retention",
    "timeout",
    "lookup_lag",
    "created_at",
    "updated_at",
    "attempts",
    "submitted_at",
    "first_submitted_at",
    "submitted_by",
    "lookup_failures",
    "receipt",
    "error",
    "args",
    "note",
    "locks_in_flight",
    "service",
    "receipt_fields",
    "approval",
)
_POLICY_COLUMNS = frozenset(
    ("can_reconcile", "idempotent", "key_retention", "timeout", "lookup_lag",
     "locks_in_flight", "service", "receipt_fields")
)  # fmt: skip


def columns_of(changed: frozenset[str] | None) -> tuple[str, ...]:
    """The columns of :data:`OP_COLUMNS`, in order, that a write of an operation whose
    ``Operation.changed`` is ``changed`` assigns: the version and those holding the fields
    named (its ``policy`` is eight columns; every other field is the column of its name);
    all of them for None (nothing is known to be as stored)."""
    if changed is None:
        return OP_COLUMNS
    return tuple(
        c
        for c in OP_COLUMNS
        if c == "version" or c in changed or ("policy" in changed and c in _POLICY_COLUMNS)
    )


TASK_COLUMNS = (
    "task_id",
    "epoch",
    "owner",
    "lease_expires",
    "next_step",
    "state",
    "completed",
    "created_at",
    "updated_at",
)
_JSON_FIELDS = ("receipt", "error", "args")
_dumps = json_encoder(separators=(",", ":"))


@dataclasses.dataclass(frozen=True, slots=True)
class Resolution:
    """An operator's resolution of an operation, kept as an audit record."""

    key: str
    task_id: str
    at: float
    from_state: State
    to_state: State
    note: str | None
    receipt: Any
    actor: str


#: The ``key`` of an audit row about a whole task (completed or cancelled by a person), kept
#: in the same table as the resolutions of operations: no operation key is empty.
TASK_AUDIT_KEY = ""
#: The ``from_state`` of such a row: the task was open (not complete).
TASK_AUDIT_FROM = "OPEN"


@dataclasses.dataclass(frozen=True, slots=True)
class TaskResolution:
    """A person's ending of a whole task, kept as an audit record: ``outcome`` is
    ``"completed"`` (the work is done) or ``"cancelled"`` (it will not be done)."""

    task_id: str
    at: float
    outcome: str
    note: str | None
    actor: str

    def audit_values(self) -> tuple[Any, ...]:
        """The row's values in (key, task_id, at, from_state, to_state, note, receipt,
        actor) order, as both stores insert them."""
        to_state = self.outcome.upper()
        return (TASK_AUDIT_KEY, self.task_id, self.at, TASK_AUDIT_FROM, to_state, self.note,
                None, self.actor)  # fmt: skip


def task_resolution_from_row(row: Any) -> TaskResolution:
    """A stored task-level audit row as a TaskResolution."""
    return TaskResolution(
        task_id=row["task_id"],
        at=row["at"],
        outcome=str(row["to_state"]).lower(),
        note=row["note"],
        actor=row["actor"],
    )


def op_to_row(op: Operation, version: int) -> dict[str, Any]:
    """An operation as column values (JSON fields as text, booleans as integers)."""
    row: dict[str, Any] = {
        "key": op.key,
        "task_id": op.task_id,
        "effect": op.effect,
        "fingerprint": op.fingerprint,
        "state": op.state.value,
        "version": version,
        "can_reconcile": int(op.policy.can_reconcile),
        "idempotent": int(op.policy.idempotent),
        "key_retention": op.policy.key_retention,
        "timeout": op.policy.timeout,
        "lookup_lag": op.policy.lookup_lag,
        "created_at": op.created_at,
        "updated_at": op.updated_at,
        "attempts": op.attempts,
        "submitted_at": op.submitted_at,
        "first_submitted_at": op.first_submitted_at,
        "submitted_by": op.submitted_by,
        "lookup_failures": op.lookup_failures,
        "note": op.note,
        "locks_in_flight": int(op.policy.locks_in_flight),
        "service": op.policy.service,
        "receipt_fields": _fields_text(op.policy.receipt_fields),
        "approval": _approval_text(op.approval),
    }
    for name in _JSON_FIELDS:
        value = getattr(op, name)
        row[name] = None if value is None else _dumps(value)
    return row


def op_values(op: Operation, version: int) -> tuple[Any, ...]:
    """The values of :func:`op_to_row`, as a tuple in :data:`OP_COLUMNS` order (what an
    INSERT binds), built without the intermediate dict: this runs on every write."""
    policy = op.policy
    receipt, error, args = op.receipt, op.error, op.args
    return (
        op.key,
        op.task_id,
        op.effect,
        op.fingerprint,
        op.state.value,
        version,
        int(policy.can_reconcile),
        int(policy.idempotent),
        policy.key_retention,
        policy.timeout,
        policy.lookup_lag,
        op.created_at,
        op.updated_at,
        op.attempts,
        op.submitted_at,
        op.first_submitted_at,
        op.submitted_by,
        op.lookup_failures,
        None if receipt is None else _dumps(receipt),
        None if error is None else _dumps(error),
        None if args is None else _dumps(args),
        op.note,
        int(policy.locks_in_flight),
        policy.service,
        _fields_text(policy.receipt_fields),
        _approval_text(op.approval),
    )


def _approval_text(approval: Approval | None) -> str | None:
    # Keys in a fixed order, so that the same approval is always the same text (PostgreSQL's
    # retried insert compares a stored row with the one it meant to write).
    if approval is None:
        return None
    return _dumps(
        {
            "status": approval.status,
            "fingerprint": approval.fingerprint,
            "actor": approval.actor,
            "at": approval.at,
            "reason": approval.reason,
        }
    )


def _approval_of(text: str | None) -> Approval | None:
    # NULL: an effect without approval, or a row written before the column existed.
    if text is None:
        return None
    data = json.loads(text)
    return Approval(
        status=data["status"],
        fingerprint=data["fingerprint"],
        actor=data.get("actor"),
        at=data.get("at"),
        reason=data.get("reason"),
    )


def _fields_text(fields: tuple[str, ...] | None) -> str | None:
    return None if fields is None else _dumps(list(fields))


def _fields_of(text: str | None) -> tuple[str, ...] | None:
    # NULL: written before the column existed, or by an effect without a field list.
    return None if text is None else tuple(json.loads(text))


def op_from_row(row: Any) -> Operation:
    """The inverse of :func:`op_to_row`."""
    policy = Policy(
        can_reconcile=bool(row["can_reconcile"]),
        idempotent=bool(row["idempotent"]),
        key_retention=row["key_retention"],
        timeout=row["timeout"],
        lookup_lag=row["lookup_lag"],
        locks_in_flight=bool(row["locks_in_flight"]),
        service=row["service"],
        receipt_fields=_fields_of(row["receipt_fields"]),
    )
    json_values = {
        name: None if row[name] is None else json.loads(row[name]) for name in _JSON_FIELDS
    }
    return Operation(
        key=row["key"],
        task_id=row["task_id"],
        effect=row["effect"],
        fingerprint=row["fingerprint"],
        state=State(row["state"]),
        policy=policy,
        version=row["version"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        attempts=row["attempts"],
        submitted_at=row["submitted_at"],
        first_submitted_at=row["first_submitted_at"],
        submitted_by=row["submitted_by"],
        lookup_failures=row["lookup_failures"],
        note=row["note"],
        approval=_approval_of(row["approval"]),
        **json_values,
    )


def task_from_row(row: Any) -> TaskRecord:
    return TaskRecord(
        task_id=row["task_id"],
        epoch=row["epoch"],
        owner=row["owner"],
        lease_expires=row["lease_expires"],
        next_step=row["next_step"],
        state=json.loads(row["state"]) if row["state"] is not None else None,
        completed=bool(row["completed"]),
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        kind=row["kind"],
        input=json.loads(row["input"]) if row["input"] is not None else None,
        runs=row["runs"],
        last_error=row["last_error"],
        not_before=row["not_before"],
    )


def resolution_from_row(row: Any) -> Resolution:
    """A stored audit record (its receipt as JSON text) as a Resolution."""
    return Resolution(
        key=row["key"],
        task_id=row["task_id"],
        at=row["at"],
        from_state=State(row["from_state"]),
        to_state=State(row["to_state"]),
        note=row["note"],
        receipt=None if row["receipt"] is None else json.loads(row["receipt"]),
        actor=row["actor"],
    )


@dataclasses.dataclass(frozen=True, slots=True)
class TaskUpdate:
    """Fields a fenced task write may change; ``None`` leaves a field as it is."""

    next_step: str | None = None
    state_json: str | None = None
    completed: bool | None = None
    release: bool = False  # give up the lease (owner cleared, lease expired) in the same write
    failed: str | None = None  # a worker's run failed: count it and keep this reason
    not_before: float | None = None  # do not claim the task again before this time
    audit: TaskResolution | None = None  # a person's ending of the task, kept in the same write

    @property
    def lease_only(self) -> bool:
        """Whether this update touches the lease alone: a renewal (no field) or a release
        (what ``task.close`` writes)."""
        return self in (_RENEWAL, _RELEASE)

    def assignments(self, mark: str) -> tuple[list[str], list[Any]]:
        """The SET clauses (``column = <mark>``) and parameters of the fields this update
        changes, the same for every store; the lease columns are each store's own (a
        release also expires the lease there)."""
        sets: list[str] = []
        params: list[Any] = []
        changes = (
            ("next_step", self.next_step),
            ("state", self.state_json),
            ("completed", self.completed),
            ("last_error", self.failed),
            ("not_before", self.not_before),
        )
        for column, value in changes:
            if value is not None:
                sets.append(f"{column} = {mark}")
                params.append(value)
        if self.failed is not None:
            sets.append("runs = runs + 1")
        if self.release:
            sets.append("owner = NULL")
        return sets, params


_RENEWAL, _RELEASE = TaskUpdate(), TaskUpdate(release=True)


def lease_lost(task_id: str, epoch: int) -> LeaseLost:
    """The error of a fenced write refused because the task's epoch moved on."""
    return LeaseLost(
        f"task {task_id!r}: lease epoch {epoch} was taken over by another worker; "
        "this write was refused",
        task_id=task_id,
    )


class Store(abc.ABC):
    """The contract every journal backend implements. See the module docstring."""

    #: A description of where the journal lives, safe to print (no password).
    url: str
    #: Durable write transactions committed through this object (for tests and benchmarks).
    commits: int = 0

    @abc.abstractmethod
    def now(self) -> float:
        """The store's clock, in seconds since the Unix epoch."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release connections. Idempotent."""

    # -- tasks ------------------------------------------------------------------------------

    @abc.abstractmethod
    def get_task(self, task_id: str) -> TaskRecord | None:
        """The task, or None if it was never started (or was collected)."""

    @abc.abstractmethod
    def claim_task(
        self, task_id: str, owner: str, ttl: float, expect_epoch: int | None
    ) -> TaskRecord | None:
        """Take the task's lease by compare-and-set on its epoch.

        With ``expect_epoch`` None the task must not exist: it is created at epoch 1. Else the
        task's epoch must still equal ``expect_epoch``: it becomes ``expect_epoch + 1`` with
        ``owner`` and ``lease_expires = now + ttl``. Returns the new record, or None when the
        compare-and-set lost (another worker got there first). Never blocks on a live holder;
        deciding whether the holder's lease may be taken is the caller's job.
        """

    @abc.abstractmethod
    def write_task(
        self,
        task_id: str,
        epoch: int,
        ttl: float,
        update: TaskUpdate,
        also: Sequence[Operation] = (),
    ) -> TaskRecord:
        """Fenced write of the task's position, state or completion; extends the lease.

        Raises LeaseLost if the task's epoch is no longer ``epoch``. ``also``: see below.
        ``update.audit``: appended to the audit log in the same transaction (only if the
        fence held).
        """

    @abc.abstractmethod
    def create_task(self, task_id: str, kind: str, input_json: str) -> TaskRecord | None:
        """Insert-if-absent a task for workers to run: ``kind`` names the registered task
        function, ``input_json`` its JSON input. Unleased (owner None), epoch 0. Returns the
        new record, or None if a task with this id already exists (nothing changed)."""

    @abc.abstractmethod
    def claim_next(self, owner: str, ttl: float, kinds: Collection[str]) -> TaskRecord | None:
        """Claim one runnable task for a worker, atomically: a task whose ``kind`` is one of
        ``kinds`` (the task functions the worker has), not completed, ``not_before`` passed,
        unleased or with an expired lease, and with no UNRESOLVED operation (such a task is
        parked until a person resolves it); the one due first. Its epoch rises by one (a
        compare-and-set, like ``claim_task``). A task of another kind is not touched at all:
        the filter is part of the claim, never a claim and a release. Concurrent callers
        never get the same task (PostgreSQL: ``FOR UPDATE SKIP LOCKED``; SQLite: one writer).
        Returns the claimed record, or None if nothing is runnable now (always, for no
        ``kinds``)."""

    @abc.abstractmethod
    def list_tasks(self, *, include_completed: bool = True) -> list[TaskRecord]:
        """Every task, oldest first."""

    @abc.abstractmethod
    def delete_completed(self, before: float) -> int:
        """Delete tasks completed before ``before`` whose operations are all CONFIRMED or
        FAILED, with their operations and resolutions; returns how many tasks were removed.
        Atomic."""

    # -- operations -------------------------------------------------------------------------

    @abc.abstractmethod
    def get_op(self, key: str) -> Operation | None:
        """The operation with this key, or None."""

    @abc.abstractmethod
    def insert_op(
        self, op: Operation, epoch: int, ttl: float, also: Sequence[Operation] = ()
    ) -> tuple[Operation, bool]:
        """Fenced insert-if-absent on the key (a unique constraint, never read-then-write).

        Returns ``(op, True)`` if this call created it, or ``(existing, False)`` if the key was
        already taken (by any task). Raises LeaseLost if the task's epoch moved on.

        ``also`` (on every fenced write): operations of the same task to store in the same
        transaction, each a compare-and-set on its version like ``update_op``; one whose
        version moved on is skipped (its newer state stands). This is how a lazy receipt rides
        in the task's next write.
        """

    @abc.abstractmethod
    def update_op(
        self,
        op: Operation,
        epoch: int | None,
        ttl: float,
        resolution: Resolution | None = None,
        also: Sequence[Operation] = (),
    ) -> Operation | None:
        """Replace the stored operation by ``op`` if its version is still ``op.version``.

        The stored version becomes ``op.version + 1``. With ``epoch`` the write is fenced (and
        extends the lease); with ``epoch`` None it is an operator's write, not fenced, and
        ``resolution`` is appended to the audit log in the same transaction. Returns the new
        record, or None if the version had moved on (nothing was written). The stored row
        equals ``op`` in every field (but the version) afterwards; since the row at
        ``op.version`` is the one replaced, writing the fields ``op.changed`` names is enough
        (all of them when it is None).
        """

    @abc.abstractmethod
    def list_ops(
        self, *, task_id: str | None = None, states: Iterable[State] | None = None
    ) -> list[Operation]:
        """Operations, oldest first, optionally of one task and/or in some states."""

    @abc.abstractmethod
    def count_ops(self) -> dict[State, int]:
        """How many operations are in each state."""

    @abc.abstractmethod
    def resolutions(self, key: str | None = None) -> list[Resolution]:
        """The audit log of operator resolutions of operations, oldest first (never the
        task-level records of :meth:`task_resolutions`)."""

    @abc.abstractmethod
    def task_resolutions(self, task_id: str) -> list[TaskResolution]:
        """The audit log of a person's endings of the task (``write_task`` with an
        ``audit``: completed or cancelled by hand), oldest first; removed with the task by
        ``delete_completed``."""
