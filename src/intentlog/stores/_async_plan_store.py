"""The one asyncio store: any backend's plans on that backend's asyncio executor.

Every primitive of :class:`~intentlog.stores.AsyncStore` is forwarded here, once, and
awaited, to ``executor.read`` or ``executor.write`` with the backend's plan method for it
(see :class:`~intentlog.stores.PlanStore`, its synchronous twin).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from intentlog._model import Operation, State, TaskRecord
from intentlog.stores._async_store import AsyncStore
from intentlog.stores._base import Resolution, Store, TaskResolution, TaskUpdate
from intentlog.stores._plan import AsyncExecutor, Ops, Plans
from intentlog.stores._plan_store import PlanStoreBase, task_write

__all__ = ["AsyncPlanStore"]


class AsyncPlanStore(PlanStoreBase, AsyncStore):  # type: ignore[override]
    """An :class:`AsyncStore` whose primitives are ``plans``' plan methods run by the asyncio
    ``executor``; the same guarantees as :class:`~intentlog.stores.PlanStore`."""

    executor: AsyncExecutor

    def __init__(self, plans: Plans, executor: AsyncExecutor) -> None:
        super().__init__(plans, executor)
        self._read, self._write = executor.read, executor.write

    async def aclose(self) -> None:
        await self.executor.aclose()

    def sync_store(self) -> Store:
        return self.executor.sync_store()

    async def get_task(self, task_id: str) -> TaskRecord | None:
        return await self._read(self.plans.plan_get_task, (task_id,))

    async def claim_task(
        self, task_id: str, owner: str, ttl: float, expect_epoch: int | None
    ) -> TaskRecord | None:
        return await self._write(self.plans.plan_claim_task, (task_id, owner, ttl, expect_epoch))

    async def write_task(
        self, task_id: str, epoch: int, ttl: float, update: TaskUpdate, also: Ops = ()
    ) -> TaskRecord:
        plan = task_write(self.plans, update, also)
        return await self._write(plan, (task_id, epoch, ttl, update, also))

    async def create_task(self, task_id: str, kind: str, input_json: str) -> TaskRecord | None:
        return await self._write(self.plans.plan_create_task, (task_id, kind, input_json))

    async def claim_next(self, owner: str, ttl: float, kinds: Collection[str]) -> TaskRecord | None:
        if not kinds:
            return None
        return await self._write(self.plans.plan_claim_next, (owner, ttl, kinds))

    async def list_tasks(self, *, include_completed: bool = True) -> list[TaskRecord]:
        return await self._read(self.plans.plan_list_tasks, (include_completed,))

    async def delete_completed(self, before: float) -> int:
        return await self._write(self.plans.plan_delete_completed, (before,))

    async def get_op(self, key: str) -> Operation | None:
        return await self._read(self.plans.plan_get_op, (key,))

    async def insert_op(
        self, op: Operation, epoch: int, ttl: float, also: Ops = ()
    ) -> tuple[Operation, bool]:
        return await self._write(self.plans.plan_insert_op, (op, epoch, ttl, also))

    # fmt: off
    async def update_op(self, op: Operation, epoch: int | None, ttl: float,
                        resolution: Resolution | None = None, also: Ops = ()) -> Operation | None:
        return await self._write(self.plans.plan_update_op, (op, epoch, ttl, resolution, also))
    # fmt: on

    async def list_ops(
        self, *, task_id: str | None = None, states: Iterable[State] | None = None
    ) -> list[Operation]:
        return await self._read(self.plans.plan_list_ops, (task_id, states))

    async def count_ops(self) -> dict[State, int]:
        return await self._read(self.plans.plan_count_ops, ())

    async def resolutions(self, key: str | None = None) -> list[Resolution]:
        return await self._read(self.plans.plan_resolutions, (key,))

    async def task_resolutions(self, task_id: str) -> list[TaskResolution]:
        return await self._read(self.plans.plan_task_resolutions, (task_id,))
