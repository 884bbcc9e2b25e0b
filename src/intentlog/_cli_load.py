"""What the command line loads: the journal an operator's command reads, and the user's code
(effects modules, worker registries)."""

from __future__ import annotations

import functools
import importlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import intentlog
from intentlog._ambient import effect_of
from intentlog._open import DEFAULT_PATH, check_not_a_url

__all__ = ["CliFailure", "load_effects", "load_registry", "open_existing"]


class CliFailure(Exception):
    """A CLI-level error (bad option value, module that will not import): exit 1."""


def open_existing(url: str | None) -> intentlog.Journal:
    """Open the existing journal at ``url`` (None: ``$INTENTLOG_URL``, else
    ``./.intentlog/journal.db``), creating nothing: a missing SQLite file, PostgreSQL schema or
    database (likely a wrong path or a typo) is an error naming it (CliFailure or
    intentlog.Error: exit 1). Every command that works on what is journaled opens it here
    (status, show, resolve, recover, gc, the console); only ``start`` and ``worker`` create a
    journal."""
    path: str | None = None
    if url is None:
        path = str(DEFAULT_PATH)
    elif "://" not in url:
        check_not_a_url(url)
        path = url
    elif url.startswith("sqlite:///"):
        path = url[len("sqlite://") :]
    if path and not Path(path).exists():
        where = Path(path).resolve()
        raise CliFailure(f"no journal at {where}; pass --db URL or set INTENTLOG_URL")
    return intentlog.open(url, create=False)


def load_effects(specs: Sequence[str]) -> list[intentlog.Effect]:
    """Import ``module`` or ``module:attr`` specs and collect their intentlog.Effect objects."""
    cwd = os.getcwd()
    if not sys.path or sys.path[0] != cwd:
        sys.path.insert(0, cwd)
    found: dict[str, intentlog.Effect] = {}
    for spec in specs:
        module_name, _, attr = spec.partition(":")
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:
            raise CliFailure(
                f"cannot import effects module {module_name!r}: {type(exc).__name__}: {exc}"
            ) from None
        if attr:
            try:
                obj: Any = functools.reduce(getattr, attr.split("."), module)
            except AttributeError:
                raise CliFailure(f"module {module_name!r} has no attribute {attr!r}") from None
            many = isinstance(obj, list | tuple | set | frozenset)
            given = [effect_of(e) for e in (obj if many else [obj])]
            effects = [e for e in given if e is not None]
            if not given or len(effects) != len(given):
                raise CliFailure(f"{spec} is not an intentlog.Effect or a list of them")
        else:
            # Effects, and the effects of functions decorated with @intentlog.journaled.
            effects = [e for e in map(effect_of, vars(module).values()) if e is not None]
            if not effects:
                raise CliFailure(f"no intentlog.Effect found in module {module_name!r}")
        for effect in effects:
            other = found.setdefault(effect.name, effect)
            if other is not effect:
                raise CliFailure(f"two different effects are named {effect.name!r} (in {spec})")
    return list(found.values())


def load_registry(spec: str) -> intentlog.Registry:
    """Import ``module:attr`` naming an intentlog.Registry."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise CliFailure(f"--app must be module:attribute, got {spec!r}")
    cwd = os.getcwd()
    if not sys.path or sys.path[0] != cwd:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
        registry = functools.reduce(getattr, attr.split("."), module)
    except Exception as exc:
        raise CliFailure(f"cannot load {spec!r}: {type(exc).__name__}: {exc}") from None
    if not isinstance(registry, intentlog.Registry):
        raise CliFailure(f"{spec} is not an intentlog.Registry")
    return registry
