"""Plans and executors: the two halves of a backend.

A *plan* is one store primitive written once for one backend: a generator that yields the
statements it needs (:class:`Q`) and receives each one's :class:`Result`, then returns the
primitive's value. It does no I/O of its own, so the same plan runs blocking or awaited. An
*executor* runs plans on a backend's connections: it executes each statement, feeds the result
back, and owns everything around that (transactions, group commit, retries, error mapping).
:class:`~intentlog.stores.PlanStore` and :class:`~intentlog.stores.AsyncPlanStore` are the
only code that turns a contract call into "this plan on that executor".

How a plan asks for more than "run my statements":

- ``Q(..., alone=True)`` on a write's first statement: "if this statement changes exactly one
  row, it is the whole write". An executor may then run it on its own in autocommit mode (no
  BEGIN and COMMIT) when nothing else is queued; the plan must then end without another
  statement. If it changes no row, the executor throws the attempt away (nothing was written)
  and runs a fresh plan in a transaction, where the same statement runs first again.
- :func:`runs` on a plan method: ``POINT`` (one statement reading one row by its key: an
  executor may run it where it is cheapest), ``SNAPSHOT`` (a read of several statements that
  must see one state), ``TRANSACTION`` (a write of several statements that must commit
  together, where the backend would otherwise run each statement as its own transaction).

Every plan may be run more than once for one call (a retry after a lost connection, the
fallback of ``alone``), so the executor takes the plan method and its arguments and makes a
fresh plan for each attempt.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection, Generator, Iterable, Sequence
from typing import Any, NamedTuple, Protocol, TypeVar

from intentlog._model import Operation, State, TaskRecord
from intentlog.stores._base import Resolution, Store, TaskResolution, TaskUpdate

__all__ = [
    "POINT",
    "SNAPSHOT",
    "TRANSACTION",
    "AsyncExecutor",
    "Executor",
    "Mode",
    "Ops",
    "Plan",
    "PlanMethod",
    "Plans",
    "Q",
    "Result",
    "mode_of",
    "runs",
]

_T = TypeVar("_T")
_F = TypeVar("_F", bound=Callable[..., Any])


class Q(NamedTuple):
    """One statement of a plan, in the backend's own dialect, with its parameters."""

    sql: str
    params: Sequence[Any] = ()
    alone: bool = False  # a whole write if it changes exactly one row (see the module doc)


class Result(NamedTuple):
    """What a statement did: the rows it changed (as the driver counts them) and the rows it
    returned, each a mapping from column name to value."""

    rowcount: int
    rows: list[Any]


#: Operations of the task that ride along in a fenced write (``also`` in the contract).
Ops = Sequence[Operation]
#: A plan returning ``_T``.
Plan = Generator[Q, Result, _T]
#: A plan method: called with the primitive's arguments, it makes a fresh plan.
PlanMethod = Callable[..., Plan[_T]]


class Mode(enum.Enum):
    """How a plan's statements must run together (see the module doc)."""

    POINT = "point"
    SNAPSHOT = "snapshot"
    TRANSACTION = "transaction"


POINT, SNAPSHOT, TRANSACTION = Mode.POINT, Mode.SNAPSHOT, Mode.TRANSACTION


def runs(mode: Mode) -> Callable[[_F], _F]:
    """Mark a plan method with the :class:`Mode` its statements need."""

    def mark(method: _F) -> _F:
        method.__dict__["plan_mode"] = mode
        return method

    return mark


def mode_of(method: Callable[..., Any]) -> Mode | None:
    """The mode :func:`runs` gave a plan method (bound or not), or None."""
    return getattr(method, "plan_mode", None)


class Plans(Protocol):
    """Every store primitive of one backend as a plan method (see :class:`Store` for what
    each guarantees). ``claim_next`` is never asked for no kinds (the store answers None)."""

    def plan_get_task(self, task_id: str) -> Plan[TaskRecord | None]: ...
    def plan_claim_task(
        self, task_id: str, owner: str, ttl: float, expect_epoch: int | None
    ) -> Plan[TaskRecord | None]: ...
    def plan_write_task(
        self, task_id: str, epoch: int, ttl: float, update: TaskUpdate, also: Ops
    ) -> Plan[TaskRecord]: ...
    def plan_create_task(
        self, task_id: str, kind: str, input_json: str
    ) -> Plan[TaskRecord | None]: ...
    def plan_claim_next(
        self, owner: str, ttl: float, kinds: Collection[str]
    ) -> Plan[TaskRecord | None]: ...
    def plan_list_tasks(self, include_completed: bool) -> Plan[list[TaskRecord]]: ...
    def plan_delete_completed(self, before: float) -> Plan[int]: ...
    def plan_get_op(self, key: str) -> Plan[Operation | None]: ...
    def plan_insert_op(
        self, op: Operation, epoch: int, ttl: float, also: Ops
    ) -> Plan[tuple[Operation, bool]]: ...
    def plan_update_op(
        self, op: Operation, epoch: int | None, ttl: float, resolution: Resolution | None, also: Ops
    ) -> Plan[Operation | None]: ...
    def plan_list_ops(
        self, task_id: str | None, states: Iterable[State] | None
    ) -> Plan[list[Operation]]: ...
    def plan_count_ops(self) -> Plan[dict[State, int]]: ...
    def plan_resolutions(self, key: str | None) -> Plan[list[Resolution]]: ...
    def plan_task_resolutions(self, task_id: str) -> Plan[list[TaskResolution]]: ...


class Executor(Protocol):
    """Runs one backend's plans, blocking. ``run`` makes ``method(*args)`` and drives it to
    its end, atomically and durably for a write (``write``: the primitive writes), mapping
    driver errors to intentlog's; a plan's own exceptions (LeaseLost) reach the caller as
    they are. Thread-safe."""

    url: str

    @property
    def commits(self) -> int:
        """Durable write transactions committed through this executor."""

    def now(self) -> float: ...
    def run(self, method: PlanMethod[_T], args: tuple[Any, ...], write: bool) -> _T: ...
    def close(self) -> None: ...


class AsyncExecutor(Protocol):
    """:class:`Executor` for asyncio: ``run`` is awaited and never blocks the event loop;
    ``now`` never blocks. ``sync_store`` opens a blocking store on the same journal."""

    url: str

    @property
    def commits(self) -> int: ...

    def now(self) -> float: ...
    async def run(self, method: PlanMethod[_T], args: tuple[Any, ...], write: bool) -> _T: ...
    async def aclose(self) -> None: ...
    def sync_store(self) -> Store: ...
