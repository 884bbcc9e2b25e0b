"""The one synchronous store: any backend's plans on that backend's executor.

Every primitive of :class:`~intentlog.stores.Store` is forwarded here, once, to
``executor.read`` or ``executor.write`` with the backend's plan method for it: a backend
writes plans and an executor, never a store class of its own (its public class may subclass
this one to keep a constructor of its own). The asyncio twin is
:class:`~intentlog.stores.AsyncPlanStore`.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from intentlog._model import Operation, State, TaskRecord
from intentlog.stores._base import Resolution, Store, TaskResolution, TaskUpdate
from intentlog.stores._plan import AsyncExecutor, Executor, Ops, PlanMethod, Plans

__all__ = ["PlanStore", "PlanStoreBase", "task_write"]


class PlanStoreBase:
    """What the synchronous and the asyncio plan store share: their plans and executor."""

    url: str

    def __init__(self, plans: Plans, executor: Executor | AsyncExecutor) -> None:
        self.plans = plans
        self.executor = executor
        self.url = executor.url
        # Read several times per effect: the executor's own method, not a call through this.
        self.now = executor.now  # type: ignore[method-assign]

    @property
    def commits(self) -> int:
        """Durable write transactions committed through this store's executor."""
        return self.executor.commits

    def now(self) -> float:  # replaced by the executor's in __init__
        return self.executor.now()


class PlanStore(PlanStoreBase, Store):  # type: ignore[override]
    """A :class:`Store` whose primitives are ``plans``' plan methods run by ``executor``.
    Its guarantees are the executor's (atomic, durable on return) and the plans' (fences,
    compare-and-sets); thread-safe if the executor is."""

    executor: Executor

    def __init__(self, plans: Plans, executor: Executor) -> None:
        super().__init__(plans, executor)
        self._read, self._write = executor.read, executor.write

    def close(self) -> None:
        self.executor.close()

    def get_task(self, task_id: str) -> TaskRecord | None:
        return self._read(self.plans.plan_get_task, (task_id,))

    def claim_task(
        self, task_id: str, owner: str, ttl: float, expect_epoch: int | None
    ) -> TaskRecord | None:
        return self._write(self.plans.plan_claim_task, (task_id, owner, ttl, expect_epoch))

    def write_task(
        self, task_id: str, epoch: int, ttl: float, update: TaskUpdate, also: Ops = ()
    ) -> TaskRecord:
        plan = task_write(self.plans, update, also)
        return self._write(plan, (task_id, epoch, ttl, update, also))

    def create_task(self, task_id: str, kind: str, input_json: str) -> TaskRecord | None:
        return self._write(self.plans.plan_create_task, (task_id, kind, input_json))

    def claim_next(self, owner: str, ttl: float, kinds: Collection[str]) -> TaskRecord | None:
        if not kinds:
            return None
        return self._write(self.plans.plan_claim_next, (owner, ttl, kinds))

    def list_tasks(self, *, include_completed: bool = True) -> list[TaskRecord]:
        return self._read(self.plans.plan_list_tasks, (include_completed,))

    def delete_completed(self, before: float) -> int:
        return self._write(self.plans.plan_delete_completed, (before,))

    def get_op(self, key: str) -> Operation | None:
        return self._read(self.plans.plan_get_op, (key,))

    def insert_op(
        self, op: Operation, epoch: int, ttl: float, also: Ops = ()
    ) -> tuple[Operation, bool]:
        return self._write(self.plans.plan_insert_op, (op, epoch, ttl, also))

    # fmt: off
    def update_op(self, op: Operation, epoch: int | None, ttl: float,
                  resolution: Resolution | None = None, also: Ops = ()) -> Operation | None:
        return self._write(self.plans.plan_update_op, (op, epoch, ttl, resolution, also))
    # fmt: on

    def list_ops(
        self, *, task_id: str | None = None, states: Iterable[State] | None = None
    ) -> list[Operation]:
        return self._read(self.plans.plan_list_ops, (task_id, states))

    def count_ops(self) -> dict[State, int]:
        return self._read(self.plans.plan_count_ops, ())

    def resolutions(self, key: str | None = None) -> list[Resolution]:
        return self._read(self.plans.plan_resolutions, (key,))

    def task_resolutions(self, task_id: str) -> list[TaskResolution]:
        return self._read(self.plans.plan_task_resolutions, (task_id,))


def task_write(plans: Plans, update: TaskUpdate, also: Ops) -> PlanMethod[TaskRecord]:
    """The plan of a task write: a backend's ``plan_write_lease`` for a write of the lease
    alone where it has one (a host-bound write, see ``intentlog.stores._plan.host_bound``),
    else its ``plan_write_task``. One that carries operations (lazy receipts) never is."""
    if update.lease_only and not also:
        lease: PlanMethod[TaskRecord] | None = getattr(plans, "plan_write_lease", None)
        if lease is not None:
            return lease
    return plans.plan_write_task
