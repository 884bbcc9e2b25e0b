"""tests/support/README.md maps each support module to the tests that use it: the map names
every module of tests/support and nothing that is gone."""

from __future__ import annotations

import re
from pathlib import Path

SUPPORT = Path(__file__).parent / "support"
ROW = re.compile(r"^\| `(\w+)` \|.*\| ([^|]*) \|$")


def rows() -> dict[str, list[str]]:
    """Each module the map names, with the modules its "Used by" column names."""
    found: dict[str, list[str]] = {}
    for line in (SUPPORT / "README.md").read_text().splitlines():
        match = ROW.match(line)
        if match:
            module, users = match.groups()
            assert module not in found, f"{module} has two rows"
            found[module] = re.findall(r"\w+", users)
    return found


def test_the_map_names_every_support_module_and_no_other() -> None:
    modules = {path.stem for path in SUPPORT.glob("*.py")}
    named = set(rows())
    assert not modules - named, f"missing from tests/support/README.md: {sorted(modules - named)}"
    assert not named - modules, f"no longer in tests/support: {sorted(named - modules)}"


def test_the_map_names_only_tests_and_modules_that_exist() -> None:
    exist = {path.stem for path in SUPPORT.parent.glob("*.py")} | set(rows())
    gone = {user for users in rows().values() for user in users} - exist
    assert not gone, f"tests/support/README.md names files that are gone: {sorted(gone)}"
