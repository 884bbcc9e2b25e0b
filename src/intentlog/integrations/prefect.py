"""Prefect 3: side effects inside tasks and flows, journaled so that a retried task or a retried
flow run cannot repeat them.

Prefect runs a task again when it raised and has retries left ("To rerun your workflow when an
exception is raised, set the retries parameter to an integer",
https://docs.prefect.io/v3/how-to-guides/workflows/retries), and runs a whole flow run again,
under the same id, when it is retried ("Use prefect flow-run retry to re-execute a failed or
cancelled flow run. The flow run keeps its original ID and parameters, but the run_count
increments", https://docs.prefect.io/v3/how-to-guides/workflows/retry-flow-runs). A task whose
process died after its side effect landed is run again by the retried flow run, and the effect
happens twice unless the service deduplicates it.

``run_effect(journal, effect, ...)`` inside a ``@task`` (or the ``@flow`` function) runs
``task.run(effect, ...)`` in the intentlog task named by what stays the same across those
retries: the flow run id and the Prefect task's name (``FLOW_RUN_ID/TASK_NAME``; in the flow
function, the flow run id). Never the attempt (``run_count``) nor the task run id: a retried
flow run makes new task runs. The operation key is derived from that, the effect name and the
arguments, as Prefect's default cache key is from the flow run, the task and its inputs: the
same task called twice with the same arguments in one flow run is one effect (pass ``key=`` to
tell them apart). A retried task gets the recorded receipt, a reconciled one, or a resend of the
same key where the service deduplicates it; never a blind second send.

Pass ``retry_condition_fn=retry_condition`` to ``@task(retries=...)``: it stops Prefect from
retrying what another attempt cannot change (``Rejected``, ``KeyConflict``, ``OutcomeUnknown``,
``InvalidInput``). An UNRESOLVED operation then fails the task and the flow run with
``OutcomeUnknown``; after a person ran ``intentlog resolve KEY``, ``prefect flow-run retry``
runs the flow run again under its id, so the task finds the same operation and returns the
resolved receipt (or sends again, after ``--retry``) without a second send.
"""

from __future__ import annotations

from typing import Any

from intentlog._async import AsyncJournal
from intentlog._effect import Effect
from intentlog._errors import InvalidInput, KeyConflict, OutcomeUnknown, Rejected
from intentlog._journal import Journal
from intentlog._model import JSON
from intentlog.integrations.kernel import handles, need

__all__ = ["FINAL_ERRORS", "flow_task_id", "retry_condition", "run_effect"]

FINAL_ERRORS: tuple[type[Exception], ...] = (Rejected, KeyConflict, OutcomeUnknown, InvalidInput)
"""The errors :func:`retry_condition` does not retry: another attempt cannot change them."""


def run_effect(
    journal: Journal | AsyncJournal,
    effect: Effect,
    /,
    *args: Any,
    key: str | None = None,
    **kwargs: Any,
) -> JSON:
    """``task.run(effect, ...)`` in the intentlog task of the current Prefect task (or flow) run;
    returns the receipt.

    Call it inside a ``@task`` or a ``@flow`` function. Raises InvalidInput outside a flow run
    (a task run on its own has no id that stays the same when it is run again).
    """
    if not isinstance(effect, Effect):
        raise InvalidInput(f"run_effect needs an intentlog Effect, got {effect!r}")
    with handles(journal).task(flow_task_id()) as task:
        return task.run(effect, *args, key=key, **kwargs)


def flow_task_id() -> str:
    """``FLOW_RUN_ID/TASK_NAME`` inside a task of a flow run, ``FLOW_RUN_ID`` in the flow
    function: the same across task retries and across retries of the flow run."""
    need("prefect", "prefect")
    from prefect.context import FlowRunContext, TaskRunContext

    task_context = TaskRunContext.get()
    if task_context is not None:
        flow_run_id = task_context.task_run.flow_run_id
        if flow_run_id is None:
            raise InvalidInput(
                f"run_effect in task {task_context.task.name!r} needs a flow run: a task run "
                "outside a flow has no id that stays the same when it is run again"
            )
        return f"{flow_run_id}/{task_context.task.name}"
    flow_context = FlowRunContext.get()
    if flow_context is not None and flow_context.flow_run is not None:
        return str(flow_context.flow_run.id)
    raise InvalidInput("run_effect must be called inside a Prefect flow run or one of its tasks")


def retry_condition(task: Any, task_run: Any, state: Any) -> bool:
    """For ``@task(retries=N, retry_condition_fn=retry_condition)``: False (do not retry) when the
    task failed with one of :data:`FINAL_ERRORS`, True otherwise (Prefect's retry policy)."""
    return not isinstance(getattr(state, "data", None), FINAL_ERRORS)
