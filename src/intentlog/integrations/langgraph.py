"""LangGraph and LangChain: tools (and ``@task`` code) whose side effects are journaled.

``durable_tool(journal, tool)`` returns a LangChain tool with the name, description and model-facing
argument schema of ``tool``. Each call is an operation of the task named by the LangGraph thread
(``config["configurable"]["thread_id"]``): its key is derived from the thread id, the tool name and
the canonical JSON of the arguments, and is handed to the tool as its idempotency key. With a
checkpointer that resumes the thread, this guarantees:

- the call's intent is durable before the tool's side effect starts, and its receipt is durable
  before the tool returns it (the receipt is what the model sees as the tool message);
- when LangGraph re-runs a tools node whose process died after the effect landed but before the
  node's checkpoint was written, the same call in the same thread gets the recorded receipt, or the
  journal asks the service, or resends the same key where the service deduplicates it; it is never
  sent blindly a second time;
- an outcome nothing can settle raises ``intentlog.OutcomeUnknown`` and stops the run, rather than
  becoming a message the model could work around; only ``intentlog.Rejected`` (the service said
  "not applied") is reported to the model, as a tool error, unless ``rejected_to_model=False``.

``run_effect(journal, effect, ...)`` does the same for code that is not a tool (a node, a
``@task`` of the functional API), taking the thread id from the running graph's config.

Concurrency: ToolNode runs the calls of one model turn in parallel threads. One task admits one
writer (its lease), so the calls of one thread share one leased handle and take turns on it (see
:class:`TaskHandles`); calls of different threads run in parallel. The framework-neutral pieces at
the end of this module are shared by the other framework integrations.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import inspect
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from intentlog._async import AsyncJournal
from intentlog._effect import Effect, ReceiptSelector, Reconcile, Seconds
from intentlog._errors import InvalidInput, LeaseLost, Rejected, install_hint
from intentlog._journal import Journal
from intentlog._model import JSON, State
from intentlog._service import Retention
from intentlog._task import Task

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig
    from langchain_core.tools import BaseTool

__all__ = ["KEY_ARG", "TaskHandles", "durable_tool", "handles", "run_effect", "thread_task_id"]

KEY_ARG = "idempotency_key"
"""The parameter through which a wrapped tool or function receives the operation key."""


def durable_tool(
    journal: Journal | AsyncJournal,
    tool: BaseTool | Effect | Callable[..., Any],
    *,
    name: str | None = None,
    description: str | None = None,
    args_schema: Any = None,
    idempotent: bool | None = None,
    key_retention: Seconds | Retention | None = None,
    reconcile: Reconcile | None = None,
    timeout: Seconds | None = None,
    lookup_lag: Seconds | None = None,
    receipt: ReceiptSelector | None = None,
    key_arg: str = KEY_ARG,
    task_id: Callable[[RunnableConfig], str] | None = None,
    rejected_to_model: bool = True,
) -> BaseTool:
    """A LangChain tool whose every call runs as ``task.run`` in the thread's task.

    ``tool`` is a function, a LangChain tool, or an :class:`intentlog.Effect`. A function or tool
    receives the operation key through its ``key_arg`` parameter (``idempotency_key``), which the
    model never sees (on a LangChain tool, annotate it ``Annotated[str, InjectedToolArg]``); send
    it to the service as its idempotency key. An Effect is called as ``submit(key, **args)``.
    The effect options (``idempotent``, ``key_retention``, ``reconcile``, ``timeout``,
    ``lookup_lag``, ``receipt``) mean what they mean on :class:`intentlog.Effect`; an Effect
    already declares them. ``args_schema`` overrides the argument schema (needed for an Effect
    whose submit takes ``**kwargs``). ``task_id(config)`` names the task (default: the thread id).
    The tool's return value is its receipt: keep it small JSON (an id, a status).
    """
    need("langchain_core", "langgraph")
    from langchain_core.runnables import RunnableConfig
    from langchain_core.tools import BaseTool, StructuredTool, ToolException

    sync = sync_journal(journal)
    options = effect_options(idempotent, key_retention, reconcile, timeout, lookup_lag, receipt)
    if isinstance(tool, Effect):
        spec = _from_effect(tool, name, description, args_schema, options)
    elif isinstance(tool, BaseTool):
        spec = _from_tool(tool, name, description, args_schema, options, key_arg)
    elif callable(tool):
        spec = _from_function(tool, name, description, args_schema, options, key_arg)
    else:
        raise InvalidInput(
            f"durable_tool needs a function, a LangChain tool or an Effect: {tool!r}"
        )
    name_task = task_id or thread_task_id
    tasks = handles(sync)

    def invoke(config: RunnableConfig, **kwargs: Any) -> Any:
        args = _json_args(spec.schema, kwargs)
        try:
            with tasks.task(name_task(config)) as task:
                return spec.run(task, args)
        except Rejected as exc:
            if not rejected_to_model:
                raise
            raise ToolException(f"{spec.name} was rejected by the service: {exc}") from exc

    def rejected_only(error: ToolException) -> str:
        if isinstance(error.__cause__, Rejected):
            return str(error)  # the model reads it as the tool's error message
        raise error  # the tool's own ToolException is ambiguous, like any other error

    # Real objects, not strings: LangChain finds the config parameter by its type hint.
    invoke.__annotations__ = {"config": RunnableConfig, "kwargs": Any, "return": Any}
    return StructuredTool(
        name=spec.name,
        description=spec.description,
        args_schema=spec.schema,
        func=invoke,
        handle_tool_error=rejected_only if rejected_to_model else False,
    )


def run_effect(
    journal: Journal | AsyncJournal,
    effect: Effect,
    /,
    *args: Any,
    key: str | None = None,
    **kwargs: Any,
) -> JSON:
    """``task.run(effect, ...)`` in the task of the running graph's thread; returns the receipt.

    For LangGraph code that is not a tool: a node, or a ``@task`` of the functional API, which
    LangGraph runs again when its process died before the task's result was checkpointed. Raises
    InvalidInput outside a graph run or without a thread id.
    """
    need("langgraph", "langgraph")
    from langgraph.config import get_config

    try:
        config = get_config()
    except RuntimeError as exc:
        raise InvalidInput(f"run_effect needs a running LangGraph graph: {exc}") from exc
    with handles(journal).task(thread_task_id(config)) as task:
        return task.run(effect, *args, key=key, **kwargs)


def thread_task_id(config: RunnableConfig) -> str:
    """The task id of a graph run: its thread id. Raises InvalidInput if there is none."""
    thread = (config.get("configurable") or {}).get("thread_id")
    if thread is None or thread == "":
        raise InvalidInput(
            "a durable tool needs the LangGraph thread id: compile the graph with a checkpointer "
            "and invoke it with config={'configurable': {'thread_id': ...}}"
        )
    return str(thread)


def _from_function(
    fn: Callable[..., Any],
    name: str | None,
    description: str | None,
    schema: Any,
    options: dict[str, Any],
    key_arg: str,
) -> ToolSpec:
    tool_name: str = name or str(getattr(fn, "__name__", ""))
    has_key = takes_key(fn, key_arg)
    check_key_use(tool_name, has_key, key_arg, options)
    if schema is None:
        from langchain_core.tools import create_schema_from_function

        filtered = [key_arg, "callbacks", "run_manager"]
        schema = create_schema_from_function(tool_name, fn, filter_args=filtered)
    model = schema

    def call(key: str, args: dict[str, Any]) -> Any:
        if isinstance(model, type) and hasattr(model, "model_validate"):
            validated = model.model_validate(args)  # the types the function declares
            args = {field: getattr(validated, field) for field in args}
        return fn(**args, **({key_arg: key} if has_key else {}))

    text = description if description is not None else inspect.getdoc(fn) or ""
    return ToolSpec(tool_name, text, schema, tool_effect(tool_name, call, options), spread=False)


def _from_tool(
    tool: BaseTool,
    name: str | None,
    description: str | None,
    schema: Any,
    options: dict[str, Any],
    key_arg: str,
) -> ToolSpec:
    if tool.response_format != "content":
        raise InvalidInput(f"tool {tool.name!r}: only response_format='content' can be durable")
    model_schema = tool.tool_call_schema
    visible = model_schema.get("properties", {}) if isinstance(model_schema, dict) else (
        getattr(model_schema, "model_fields", {})
    )  # fmt: skip
    if key_arg in visible:
        raise InvalidInput(
            f"tool {tool.name!r}: annotate its {key_arg!r} parameter as "
            "Annotated[str, InjectedToolArg], so that the model never chooses the key"
        )
    full = tool.get_input_schema()
    has_key = key_arg in getattr(full, "model_fields", {})
    check_key_use(tool.name, has_key, key_arg, options)

    def call(key: str, args: dict[str, Any]) -> Any:
        return tool.invoke({**args, key_arg: key} if has_key else args)

    text = description if description is not None else tool.description
    effect = tool_effect(name or tool.name, call, options)
    return ToolSpec(effect.name, text, schema or model_schema, effect, spread=False)


def _from_effect(
    effect: Effect, name: str | None, description: str | None, schema: Any, options: dict[str, Any]
) -> ToolSpec:
    if options:
        raise InvalidInput(
            f"effect {effect.name!r} already declares {', '.join(sorted(options))}: set them on "
            "the Effect, not on durable_tool"
        )
    params = list(inspect.signature(effect.submit).parameters.values())
    if schema is None:
        if any(p.kind is p.VAR_KEYWORD for p in params):
            raise InvalidInput(
                f"effect {effect.name!r}: its submit takes **kwargs; pass args_schema= (a "
                "pydantic model of the arguments the model may send)"
            )
        from langchain_core.tools import create_schema_from_function

        first = params[0].name
        schema = create_schema_from_function(effect.name, effect.submit, filter_args=[first])
    text = description if description is not None else inspect.getdoc(effect.submit) or ""
    return ToolSpec(name or effect.name, text, schema, effect, spread=True)


def _json_args(schema: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The call's arguments as plain JSON, defaults filled in, so that equal calls get one key."""
    if isinstance(schema, type) and hasattr(schema, "model_validate"):
        dumped: dict[str, Any] = schema.model_validate(kwargs).model_dump(mode="json")
        return dumped
    return dict(kwargs)


# -- framework-neutral pieces, shared by the other framework integrations ----------------------


@dataclasses.dataclass(frozen=True)
class ToolSpec:
    """A tool as the journal sees it: ``spread`` runs ``task.run(effect, **args)`` (a user's
    Effect), otherwise ``task.run(effect, args)`` (a :class:`ToolEffect`)."""

    name: str
    description: str
    schema: Any
    effect: Effect
    spread: bool

    def run(self, task: Task, args: dict[str, Any]) -> JSON:
        if not self.spread:
            return task.run(self.effect, args)
        if "key" in args:
            raise InvalidInput(
                f"effect {self.effect.name!r}: an argument named 'key' clashes with task.run's "
                "key=; rename it"
            )
        return task.run(self.effect, **args)


class ToolEffect(Effect):
    """An Effect called with one JSON object of arguments: ``task.run(effect, args)``, submitted
    as ``submit(key, args)``. Key and fingerprint are those that ``task.run`` derives from the
    arguments themselves (task id, effect name, canonical JSON of ``args``), and an argument may
    be named ``key``."""

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        if kwargs or len(args) != 1 or not isinstance(args[0], dict):
            raise InvalidInput(f"effect {self.name!r} is run as task.run(effect, args_dict)")
        return dict(args[0])


def tool_effect(
    name: str, call: Callable[[str, dict[str, Any]], Any], options: dict[str, Any]
) -> ToolEffect:
    """The effect behind a tool: ``call(key, args)`` performs it."""
    return ToolEffect(name, call, **options)


def effect_options(
    idempotent: bool | None,
    key_retention: Seconds | Retention | None,
    reconcile: Reconcile | None,
    timeout: Seconds | None,
    lookup_lag: Seconds | None,
    receipt: ReceiptSelector | None,
) -> dict[str, Any]:
    """The effect options that were given (None means not given)."""
    given = {
        "idempotent": idempotent,
        "key_retention": key_retention,
        "reconcile": reconcile,
        "timeout": timeout,
        "lookup_lag": lookup_lag,
        "receipt": receipt,
    }
    return {option: value for option, value in given.items() if value is not None}


def takes_key(fn: Callable[..., Any], key_arg: str) -> bool:
    """Whether ``fn`` has a parameter ``key_arg`` that can be passed by name."""
    try:
        param = inspect.signature(fn).parameters.get(key_arg)
    except (TypeError, ValueError):
        return False
    return param is not None and param.kind in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY)


def check_key_use(name: str, has_key: bool, key_arg: str, options: dict[str, Any]) -> None:
    """Refuse a deduplicating or reconcilable declaration for a tool that never sees the key."""
    if not has_key and (options.get("idempotent") or options.get("reconcile")):
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
