"""The public surface stays curated, complete and light to import."""

from __future__ import annotations

import inspect
import subprocess
import sys
import types

import pytest

import intentlog
import intentlog.testing


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
    ):
        assert issubclass(error, intentlog.Error)


def test_import_needs_only_the_standard_library() -> None:
    code = (
        "import sys, intentlog\n"
        "third = sorted(m for m in ('click', 'pytest', 'psycopg', 'httpx') if m in sys.modules)\n"
        "print(','.join(third))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
