"""``intentlog demo``: an agent killed at the worst moment, with and without intentlog.

:func:`run_demo` runs it (``intentlog demo`` calls it); :data:`EFFECTS` are the demo agent's
effects, for ``intentlog check --effects intentlog.demo:EFFECTS``. The agents run as child
processes (``python -m intentlog.demo._agents``), so this package imports its modules only
when one of these names is asked for: a package that imported ``_agents`` itself would have
it in ``sys.modules`` before ``-m`` runs it (Python then warns), and ``import intentlog.demo``
stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from intentlog.demo._agents import EFFECTS
    from intentlog.demo._run import run_demo

__all__ = ["EFFECTS", "run_demo"]

_HOMES = {"EFFECTS": "intentlog.demo._agents", "run_demo": "intentlog.demo._run"}


def __getattr__(name: str) -> Any:
    # Looked up on every access, never cached here: a test that replaces _run.run_demo is
    # seen by whoever asks this package for it.
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
