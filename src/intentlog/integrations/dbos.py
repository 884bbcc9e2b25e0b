"""DBOS: side effects inside durable workflows, journaled so that a re-run step cannot repeat them.

DBOS checkpoints a step's output after the step returns. A process that dies after the step's
side effect landed and before that checkpoint makes DBOS run the step again on recovery, and the
effect happens twice unless the service deduplicates it. ``run_effect(journal, effect, ...)``
inside the step runs ``task.run(effect, ...)`` in the task named by the workflow id
(``DBOS.workflow_id``), so the re-run step gets the recorded receipt, or a reconciled one, or a
resend of the same key where the service deduplicates it; never a blind second send.

Steps of one workflow that run concurrently share one leased handle of the workflow's task and
take turns on it (see :class:`intentlog.integrations.kernel.TaskHandles`). With DBOS step
retries (``@DBOS.step(retries_allowed=True)``) a retried step goes through the journal too: an
ambiguous failure is settled, not resent blindly. Let ``intentlog.OutcomeUnknown`` fail the
workflow: it needs a person (``intentlog resolve``), not another attempt.
"""

from __future__ import annotations

from typing import Any

from intentlog._async import AsyncJournal
from intentlog._effect import Effect
from intentlog._errors import InvalidInput
from intentlog._journal import Journal
from intentlog._model import JSON
from intentlog.integrations.kernel import handles, need

__all__ = ["run_effect", "workflow_task_id"]


def run_effect(
    journal: Journal | AsyncJournal,
    effect: Effect,
    /,
    *args: Any,
    key: str | None = None,
    **kwargs: Any,
) -> JSON:
    """``task.run(effect, ...)`` in the task of the current DBOS workflow; returns the receipt.

    Call it inside a ``@DBOS.step()`` (or the workflow function). Raises InvalidInput outside a
    DBOS workflow.
    """
    with handles(journal).task(workflow_task_id()) as task:
        return task.run(effect, *args, key=key, **kwargs)


def workflow_task_id() -> str:
    """The id of the DBOS workflow this code runs in (stable across its recoveries)."""
    need("dbos", "dbos")
    from dbos import DBOS

    workflow_id = DBOS.workflow_id
    if not workflow_id:
        raise InvalidInput("run_effect must be called inside a DBOS workflow or one of its steps")
    return workflow_id
