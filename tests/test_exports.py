"""The public surface stays curated, complete and light to import."""

from __future__ import annotations

import ast
import builtins
import collections.abc
import importlib
import inspect
import subprocess
import sys
import tomllib
import types
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

import intentlog
import intentlog.testing

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("module", [intentlog, intentlog.testing], ids=lambda m: m.__name__)
def test_all_is_complete_and_importable(module: types.ModuleType) -> None:
    for name in module.__all__:
        assert hasattr(module, name), name
    public = {
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and (inspect.isclass(value) or inspect.isfunction(value))
        and getattr(value, "__module__", "").startswith("intentlog")
    }
    assert public <= set(module.__all__), public - set(module.__all__)


def test_design_surface_exists() -> None:
    for name in ("PLANNED", "SUBMITTED", "CONFIRMED", "FAILED", "UNRESOLVED"):
        assert intentlog.State[name].value == name
    for name in ("SUBMIT", "RECONCILE", "USE_RECEIPT", "REPLAN", "ESCALATE", "RESUME", "WAIT"):
        assert intentlog.Action[name].value == name
    for error in (
        intentlog.OutcomeUnknown,
        intentlog.KeyConflict,
        intentlog.LeaseLost,
        intentlog.UnsafeValue,
        intentlog.Rejected,
        intentlog.NoCurrentTask,
    ):
        assert issubclass(error, intentlog.Error)
    # The ambient task: a journaled function is called like the plain function under the task
    # that 'with journal.task(...)' makes current.
    for verb in (intentlog.journaled, intentlog.current_task, intentlog.current_key):
        assert callable(verb) and verb.__module__ == "intentlog._ambient"


def test_import_needs_only_the_standard_library() -> None:
    code = (
        "import sys, intentlog\n"
        "third = sorted(m for m in ('click', 'pytest', 'psycopg', 'httpx') if m in sys.modules)\n"
        "print(','.join(third))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


# -- every type in a public signature is exported --------------------------------------------

#: The modules whose ``__all__`` is walked: every class and function in it, its annotations,
#: and those of a class's public methods, properties and constructor.
WALKED = (
    "intentlog",
    "intentlog.demo",
    "intentlog.integrations",
    "intentlog.integrations.agent_framework",
    "intentlog.integrations.agno",
    "intentlog.integrations.aws",
    "intentlog.integrations.crewai",
    "intentlog.integrations.dbos",
    "intentlog.integrations.google_adk",
    "intentlog.integrations.http",
    "intentlog.integrations.kernel",
    "intentlog.integrations.langgraph",
    "intentlog.integrations.mcp_server",
    "intentlog.integrations.nats",
    "intentlog.integrations.openai_agents",
    "intentlog.integrations.prefect",
    "intentlog.integrations.pydantic_ai",
    "intentlog.integrations.restate",
    "intentlog.integrations.smtp",
    "intentlog.metrics",
    "intentlog.profiles",
    "intentlog.proxy",
    "intentlog.stores",
    "intentlog.testing",
    "intentlog.tracing",
)
#: Where a user may import a type from: these modules' ``__all__`` (the backends name theirs).
PUBLIC = (
    *WALKED,
    "intentlog.stores.postgres",
    "intentlog.stores.sqlite",
    "intentlog.stores.sqlite_async",
)
#: Classes the journal makes and hands out (``journal.task()``): their constructors take the
#: journal's internals and are not for users, so only their other members are walked.
HANDED_OUT = {"intentlog.Task", "intentlog.AsyncTask"}
#: Dunder members that are part of how a public class is used.
_USED_DUNDERS = ("__init__", "__call__", "__enter__", "__aenter__", "__await__", "__iter__")
_STANDARD = (typing, collections.abc, types, builtins)


class _Unavailable:
    """Stands for a type from an optional library that is not installed (not intentlog's)."""

    def __class_getitem__(cls, item: Any) -> Any:
        return Any


def _checking_names(module: types.ModuleType) -> dict[str, Any]:
    """The names a module imports under ``if TYPE_CHECKING:``, so its annotations resolve."""
    names: dict[str, Any] = {}
    try:
        tree = ast.parse(inspect.getsource(module))
    except (OSError, TypeError):  # a module without a source file
        return names
    where = {"__name__": module.__name__, "__package__": module.__package__}
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for statement in node.body:
                if not isinstance(statement, ast.Import | ast.ImportFrom):
                    continue
                code = compile(ast.Module([statement], []), module.__name__, "exec")
                try:
                    exec(code, where, names)
                except ImportError:
                    for alias in statement.names:
                        names[(alias.asname or alias.name).split(".")[0]] = _Unavailable
    return names


def _ours(module_name: str) -> bool:
    return module_name == "intentlog" or module_name.startswith("intentlog.")


def unexported(walked: Iterable[types.ModuleType], public: Iterable[types.ModuleType]) -> list[str]:
    """Every annotation in the walked modules' public signatures that names a type defined in
    intentlog (a class, or a type alias such as ``Seconds``) which no public module's
    ``__all__`` exports, as "where: what"."""
    exported = {(name, id(getattr(m, name))) for m in public for name in m.__all__}
    exported_ids = {object_id for _, object_id in exported}
    found: set[str] = set()
    namespaces: dict[str, dict[str, Any]] = {}

    def classes(hint: Any, where: str) -> None:
        if isinstance(hint, typing.TypeVar | typing.ParamSpec):
            return
        origin = typing.get_origin(hint)
        if origin is typing.Literal:
            return
        for arg in typing.get_args(hint):
            for each in arg if isinstance(arg, list) else [arg]:  # Callable[[...], ...]
                classes(each, where)
        if origin is not None:
            classes(origin, where)
        elif isinstance(hint, type) and _ours(hint.__module__) and id(hint) not in exported_ids:
            found.add(f"{where}: {hint.__module__}.{hint.__qualname__}")

    def aliases(obj: Any, where: str) -> None:
        # get_type_hints expands an alias (Seconds becomes float | int | timedelta), so the
        # names are read from the annotations as written and looked up where obj is defined.
        module = sys.modules[obj.__module__]
        for name, written in getattr(obj, "__annotations__", {}).items():
            if name.startswith("_") or not isinstance(written, str):
                continue
            for node in ast.walk(ast.parse(written, mode="eval")):
                if not isinstance(node, ast.Name):
                    continue
                value = vars(module).get(node.id, namespaces[obj.__module__].get(node.id))
                if value is None or isinstance(
                    value, type | types.ModuleType | typing.TypeVar | typing.ParamSpec
                ):
                    continue  # a class is checked above; JSON is Any (a class in 3.11)
                if any(getattr(std, node.id, None) is value for std in _STANDARD):
                    continue  # Callable, Literal, Optional, ... spelled as typing spells them
                if (node.id, id(value)) not in exported:
                    found.add(f"{where}:{name}: {obj.__module__}.{node.id} (a type alias)")

    def signature(obj: Any, where: str) -> None:
        module = obj.__module__
        if module not in namespaces:
            namespaces[module] = _checking_names(sys.modules[module])
        hints = typing.get_type_hints(obj, localns=namespaces[module])
        for name, hint in hints.items():
            if not name.startswith("_"):
                classes(hint, f"{where}:{name}")
        aliases(obj, where)

    for module in walked:
        for name in module.__all__:
            obj = getattr(module, name)
            where = f"{module.__name__}.{name}"
            if inspect.isclass(obj):
                signature(obj, where)  # its fields and class attributes
                for cls in obj.__mro__:
                    if not _ours(cls.__module__):
                        continue
                    for member, value in vars(cls).items():
                        if member.startswith("_") and member not in _USED_DUNDERS:
                            continue
                        if member == "__init__" and where in HANDED_OUT:
                            continue
                        if isinstance(value, property):
                            value = value.fget
                        elif isinstance(value, staticmethod | classmethod):
                            value = value.__func__
                        if inspect.isfunction(value):
                            signature(value, f"{where}.{member}")
            elif inspect.isfunction(obj):
                signature(obj, where)
    return sorted(found)


def test_every_type_in_a_public_signature_is_exported() -> None:
    walked = [importlib.import_module(name) for name in WALKED]
    public = [importlib.import_module(name) for name in PUBLIC]
    assert unexported(walked, public) == []


_THROWAWAY = """
from __future__ import annotations

from collections.abc import Callable
from typing import Literal

Mode = Literal["fast", "safe"]


class Hidden:
    pass


class Shown:
    def run(self, mode: Mode, then: Callable[[Hidden], None]) -> Shown:
        return self


def make() -> list[Shown]:
    return [Shown()]
"""


def test_the_export_check_finds_a_private_class_and_alias(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    module = types.ModuleType("intentlog._throwaway")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    exec(_THROWAWAY, vars(module))
    module.__all__ = ["Shown", "make"]
    assert unexported([module], [module]) == [
        "intentlog._throwaway.Shown.run:mode: intentlog._throwaway.Mode (a type alias)",
        "intentlog._throwaway.Shown.run:then: intentlog._throwaway.Hidden",
    ]
    module.__all__ = ["Hidden", "Mode", "Shown", "make"]
    assert unexported([module], [module]) == []


def test_the_users_view_is_type_checked_strictly() -> None:
    # tests/typing holds real usage (effects, lookups, errors' attributes, sync and async
    # journals) that the check command's mypy run must pass under --strict.
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert config["strict"] is True
    assert {"src/intentlog", "tests/typing"} <= set(config["files"])
    assert {p.name for p in (ROOT / "tests" / "typing").glob("*.py")} >= {"api.py", "usage.py"}
