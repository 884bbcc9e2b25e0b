"""The worker application the worker-scaling benchmark runs: tasks of trivial effects."""

from __future__ import annotations

import os
from typing import Any

import intentlog

EFFECTS_PER_TASK = int(os.environ.get("BENCH_EFFECTS_PER_TASK", "5"))


@intentlog.effect(idempotent=True, key_retention=intentlog.FOREVER, timeout=5)
def step(key: str, task: str, n: int) -> dict[str, Any]:
    return {"id": f"{task}-{n}"}  # a trivial side effect: the journal's cost is what we measure


registry = intentlog.Registry(effects=[step])


@registry.task("bench")
def bench(task: intentlog.Task, input: Any) -> None:
    for n in range(EFFECTS_PER_TASK):
        task.run(step, task=task.id, n=n)
