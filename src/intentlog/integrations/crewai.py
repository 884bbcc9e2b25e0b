"""CrewAI: tools whose side effects are journaled, across CrewAI's retries and resumes.

``durable_tool(journal, fn)`` returns a CrewAI tool (a ``BaseTool``) with ``fn``'s name, docstring
and parameters. Each call is an operation of the task named by the **CrewAI task's id**
(``Task.id``, which ``Task`` sets as the current task while its agent works: ``crewai.context``):
CrewAI keeps that id when it runs the task again, both on a guardrail's retry and on the agent's
``max_retry_limit`` retry (the same ``Task`` object runs ``Agent.execute_task`` again), and when a
crew is resumed from a checkpoint (``Crew.from_checkpoint`` restores it; a user cannot set it
otherwise). ``task_id=`` names it yourself, from the CrewAI task id it is given (``None`` under
``Agent.kickoff``, which runs no task).

CrewAI runs a task again with the earlier attempt's output and the guardrail's complaint in its
context (``Task._invoke_guardrail_function``), and the model asks for the same action again with
*other* arguments: a reworded message, an added memo. So a call is matched by the identity rule
of :mod:`intentlog.integrations.kernel`: the same arguments are the same operation; otherwise the
``n``-th call of a tool in this execution of the task is the ``n``-th call of the execution before,
and when that one was applied (or may have been) nothing is sent and the model reads an
``ALREADY DONE`` answer naming the action already taken and its receipt. A call the model means to
make again (a second payment) is made again in the same execution and is sent. An execution is
one ``Agent.execute_task`` (CrewAI opens an ``agent_execution_started`` event scope for each).

Guarantees, with a journal that survives the process: the intent is durable before ``fn`` starts
and its receipt before the tool returns it (the receipt, as JSON, is what the model reads). A call
CrewAI makes again after a crash (resumed from a checkpoint) or a retry gets the recorded receipt,
a reconciled one, or a resend of the same key where the service deduplicates it; never a blind
second send. Where nothing can settle the outcome the model reads an ``UNRESOLVED`` answer (do not
retry; a person settles it with ``intentlog resolve KEY``), and after that the same call gets the
resolved receipt without a send. CrewAI hands every exception a tool raises to the model as
"Error executing tool", so the outcomes are answers, not exceptions; ``intentlog.Rejected`` (the
service said "not applied") is reported as such.

Checkpoints: CrewAI records a tool in a checkpoint as its class and fields and rebuilds it on
restore. The tool records ``fn``, ``reconcile`` and ``task_id`` by their dotted paths (define them
at module level; CrewAI resolves them only under ``CREWAI_DESERIALIZE_CALLBACKS=1``) and the
journal by its URL (``journal.url``, without a password): a restored tool uses the journal of that
URL that this process gave to ``durable_tool`` (or :func:`use_journal`), else opens it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from intentlog._async import AsyncJournal
from intentlog._effect import Effect, Reconcile, Seconds
from intentlog._errors import InvalidInput
from intentlog._journal import Journal
from intentlog._service import Retention
from intentlog.integrations._given import key_use, plain
from intentlog.integrations.kernel import (
    KEY_ARG,
    ToolOptions,
    need,
    sync_journal,
)

if TYPE_CHECKING:
    from crewai.tools import BaseTool

__all__ = ["durable_tool", "use_journal"]


def durable_tool(
    journal: Journal | AsyncJournal,
    fn: Callable[..., Any],
    *,
    name: str | None = None,
    description: str | None = None,
    idempotent: bool | None = None,
    key_retention: Seconds | Retention | None = None,
    reconcile: Reconcile | None = None,
    timeout: Seconds | None = None,
    lookup_lag: Seconds | None = None,
    receipt: Sequence[str] | None = None,
    key_arg: str = KEY_ARG,
    task_id: Callable[[str | None], str] | None = None,
) -> BaseTool:
    """A CrewAI tool whose every call runs as ``task.run`` in the CrewAI task's journal task.

    ``fn`` is a plain (sync) function with named parameters; it receives the operation key through
    its ``key_arg`` parameter (``idempotency_key``), which the model never sees, and sends it to
    the service as its idempotency key. Its return value is the receipt: keep it small JSON.
    The effect options mean what they mean on :class:`intentlog.Effect`; ``receipt`` here is a
    list of the fields kept. ``task_id(crewai_task_id)`` names the task (default: the CrewAI
    task's id). For a crew that checkpoints, give module-level functions (see the module
    docstring).
    """
    need("crewai", "crewai")
    from intentlog.integrations._crewai_tool import DurableTool, register, seconds_of

    sync = sync_journal(journal)
    if isinstance(fn, Effect) or not callable(fn):
        raise InvalidInput(f"durable_tool needs a plain function, got {fn!r}")
    tool_name = name or str(getattr(fn, "__name__", ""))
    if not tool_name or tool_name == "<lambda>":
        raise InvalidInput(f"durable_tool needs a named function or name=, got {fn!r}")
    plain(tool_name, fn)
    options = ToolOptions(
        idempotent=idempotent,
        key_retention=key_retention,
        reconcile=reconcile,
        timeout=timeout,
        lookup_lag=lookup_lag,
        receipt=receipt,
    )
    key_use(tool_name, fn, key_arg, options)
    register(sync)
    tool: BaseTool = DurableTool(
        name=tool_name,
        description=description if description is not None else (fn.__doc__ or tool_name),
        function=fn,
        journal_url=sync.url,
        idempotent=idempotent,
        key_retention=seconds_of(key_retention),
        timeout=seconds_of(timeout),
        lookup_lag=seconds_of(lookup_lag),
        reconcile=reconcile,
        receipt=list(receipt) if receipt is not None else None,
        key_arg=key_arg,
        task_id=task_id,
    )
    return tool


def use_journal(journal: Journal | AsyncJournal) -> None:
    """Make ``journal`` the one that durable tools restored from a CrewAI checkpoint use for its
    URL (``durable_tool`` does this for the journal it is given)."""
    need("crewai", "crewai")
    from intentlog.integrations._crewai_tool import register

    register(sync_journal(journal))
