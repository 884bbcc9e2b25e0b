"""The CrewAI tool class behind :func:`intentlog.integrations.crewai.durable_tool`.

It imports CrewAI, so :mod:`intentlog.integrations.crewai` imports it only when a tool is made.
The class lives at a stable dotted path because CrewAI's checkpoints record a tool as its class
path and its fields (``tool_type`` in ``crewai/tools/base_tool.py``) and rebuild it from them on
``Crew.from_checkpoint``: every field here is plain JSON or a function named by its dotted path
(CrewAI's own ``SerializableCallable``, resolved on restore only under
``CREWAI_DESERIALIZE_CALLBACKS=1``), and the journal is named by its printable URL.
"""

from __future__ import annotations

import inspect
import json
import threading
import weakref
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from crewai.context import get_current_task_id
from crewai.tools import BaseTool
from crewai.types.callback import SerializableCallable
from pydantic import BaseModel, PrivateAttr, create_model

from intentlog._errors import InvalidInput
from intentlog._journal import Journal
from intentlog._journal import open as open_journal
from intentlog._service import Retention
from intentlog.integrations.kernel import (
    KEY_ARG,
    ToolOptions,
    ToolSpec,
    attempt,
    handles,
    invoke,
    takes_key,
    tool_effect,
)

_journals: weakref.WeakValueDictionary[str, Journal] = weakref.WeakValueDictionary()
_opened: dict[str, Journal] = {}  # opened here for a restored tool: kept for the process
_journals_lock = threading.Lock()


def register(journal: Journal) -> None:
    """Make ``journal`` the one a tool restored from a checkpoint uses for its URL."""
    with _journals_lock:
        _journals[journal.url] = journal


def _journal_at(url: str) -> Journal:
    with _journals_lock:
        found = _journals.get(url) or _opened.get(url)
        if found is None:
            found = _opened[url] = open_journal(url)
        return found


class DurableTool(BaseTool):  # type: ignore[misc]  # CrewAI is untyped for mypy here
    """A CrewAI tool whose every call is an operation of the CrewAI task's journal task.

    Made by :func:`intentlog.integrations.crewai.durable_tool`; see that module for what it
    guarantees.
    """

    function: SerializableCallable
    journal_url: str
    idempotent: bool | None = None
    key_retention: float | str | None = None  # seconds, or a Retention's value ("forever")
    timeout: float | None = None
    lookup_lag: float | None = None
    reconcile: SerializableCallable | None = None
    receipt: list[str] | None = None
    key_arg: str = KEY_ARG
    task_id: SerializableCallable | None = None

    _spec: ToolSpec | None = PrivateAttr(default=None)

    def model_post_init(self, context: Any) -> None:
        # The model-facing schema is the function's own, whether made here or restored.
        self.args_schema = schema_of(self.function, self.key_arg, self.name)
        super().model_post_init(context)

    def _run(self, **kwargs: Any) -> Any:
        journal = _journal_at(self.journal_url)
        crew_task = get_current_task_id()
        if self.task_id is not None:
            task_id = str(self.task_id(crew_task))
        elif crew_task:
            task_id = crew_task
        else:
            raise InvalidInput(
                f"durable tool {self.name!r} was called outside a CrewAI task (Agent.kickoff "
                "runs none): pass task_id= to durable_tool to name the task"
            )
        args: dict[str, Any] = self.args_schema.model_validate(kwargs).model_dump(mode="json")
        scope = attempt(journal, task_id, f"crewai-task:{crew_task}", _execution())
        answer = invoke(handles(journal), task_id, self.spec(), args, scope=scope)
        return answer if isinstance(answer, str) else json.dumps(answer)

    def spec(self) -> ToolSpec:
        """The journal's view of this tool (made once per tool object)."""
        if self._spec is None:
            self._spec = self._make_spec()
        return self._spec

    def _make_spec(self) -> ToolSpec:
        fn, key_arg, schema = self.function, self.key_arg, self.args_schema
        has_key = takes_key(fn, key_arg)

        def call(key: str, args: dict[str, Any]) -> Any:
            # The arguments crossed the journal as JSON: give fn the types it declares.
            validated = schema.model_validate(args)
            typed = {field: getattr(validated, field) for field in args}
            return fn(**typed, **({key_arg: key} if has_key else {}))

        options = ToolOptions(
            idempotent=self.idempotent,
            key_retention=retention_of(self.key_retention),
            reconcile=self.reconcile,
            timeout=self.timeout,
            lookup_lag=self.lookup_lag,
            receipt=self.receipt,
        )
        effect = tool_effect(self.name, call, options)
        return ToolSpec(self.name, self.description, schema, effect, spread=False)


def _execution() -> object:
    """The id of the agent execution this call runs in: CrewAI opens an event scope
    ``agent_execution_started`` with a fresh event id each time ``Agent.execute_task`` runs the
    task (the first run, a guardrail's retry, a ``max_retry_limit`` retry), and tool calls run
    inside it (``crewai/events/event_context.py``; ``Agent.execute_task`` in
    ``crewai/agent/core.py``)."""
    from crewai.events import event_context

    stack = getattr(event_context, "_event_id_stack", None)
    scopes: tuple[tuple[str, str], ...] = stack.get() if stack is not None else ()
    for event_id, event_type in reversed(scopes):
        if event_type in ("agent_execution_started", "lite_agent_execution_started"):
            return event_id
    raise InvalidInput(
        "a durable tool runs inside a CrewAI agent's execution; none is running here "
        "(called directly, or a CrewAI without the agent_execution_started event scope)"
    )


def schema_of(fn: Callable[..., Any], key_arg: str, name: str) -> type[BaseModel]:
    """A pydantic model of ``fn``'s parameters, less ``key_arg``: what the model may send."""
    fields: dict[str, Any] = {}
    hints = inspect.get_annotations(fn, eval_str=True)
    for param in inspect.signature(fn).parameters.values():
        if param.name == key_arg:
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.POSITIONAL_ONLY):
            raise InvalidInput(
                f"tool {name!r}: durable_tool needs a function whose parameters are passed by "
                f"name; {param.name!r} is {param.kind.description}"
            )
        annotation = hints.get(param.name, Any)
        default = ... if param.default is param.empty else param.default
        fields[param.name] = (annotation, default)
    model: type[BaseModel] = create_model(f"{name}_arguments", **fields)
    return model


def seconds_of(value: float | timedelta | Retention | None) -> float | str | None:
    """An effect option's time as JSON for the checkpoint: seconds, or a Retention's value."""
    if isinstance(value, Retention):
        return value.value
    if isinstance(value, timedelta):
        return value.total_seconds()
    return value


def retention_of(value: float | str | None) -> float | Retention | None:
    """The inverse of :func:`seconds_of` for ``key_retention``."""
    return Retention(value) if isinstance(value, str) else value
