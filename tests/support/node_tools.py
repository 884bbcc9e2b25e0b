"""The Node tooling of the tests: the official MCP conformance suite, the TypeScript SDK, the
clients the gateway tests drive (stripe-node, Octokit, the Vercel AI SDK) and the Node 22 binary
they run on, all installed from ``tests/node/package-lock.json`` into ``tests/node/node_modules``
(``scripts/check`` runs ``npm ci`` there when it is missing).

The conformance suite needs Node 22 (https://github.com/modelcontextprotocol/conformance);
the npm package ``node`` ships that binary, so nothing is installed outside the directory.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
from pathlib import Path

import pytest

NODE_DIR = Path(__file__).resolve().parents[1] / "node"
NODE = NODE_DIR / "node_modules" / ".bin" / "node"
CONFORMANCE = (
    NODE_DIR / "node_modules" / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"
)
TS_SDK = NODE_DIR / "node_modules" / "@modelcontextprotocol" / "sdk" / "package.json"
#: The npm packages the gateway client scripts (tests/node/gateway_*.mjs) import.
GATEWAY_CLIENTS = ("stripe", "@octokit/rest", "ai", "zod")


@functools.cache
def node_problem() -> str | None:
    """Why the Node tests cannot run here, or None if they can."""
    for path in (NODE, CONFORMANCE, TS_SDK):
        if not path.exists():
            return (
                f"{path.relative_to(NODE_DIR.parent.parent)} is missing: run "
                "'npm ci' in tests/node (scripts/check does, where npm is installed)"
            )
    try:
        version = subprocess.run(
            [str(NODE), "--version"], capture_output=True, text=True, timeout=60, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{NODE} does not run: {exc}"
    if not version.startswith("v22."):
        return f"{NODE} is {version}, the conformance suite needs Node 22"
    return None


def need_node() -> None:
    """Skip the calling test where the Node tooling is absent, but fail where CI=true: there
    these tests must run."""
    _skip_or_fail(node_problem())


def packages_problem(names: tuple[str, ...]) -> str | None:
    """Why Node cannot run scripts importing the npm packages ``names``, or None if it can."""
    problem = node_problem()
    if problem is not None:
        return problem
    for name in names:
        path = NODE_DIR / "node_modules" / name / "package.json"
        if not path.exists():
            return (
                f"{path.relative_to(NODE_DIR.parent.parent)} is missing: run 'npm ci' in "
                "tests/node (scripts/check does, where npm is installed)"
            )
    return None


def need_node_packages(*names: str) -> None:
    """Like `need_node`, for tests whose scripts import the npm packages ``names`` too (see
    `GATEWAY_CLIENTS`): skip where they are absent, fail where CI=true."""
    _skip_or_fail(packages_problem(names))


def node_command(script: str, spec: object) -> list[str]:
    """The command running ``tests/node/SCRIPT`` on the pinned Node with ``spec`` as its one
    JSON argument (the gateway client scripts take their settings so)."""
    return [str(NODE), str(NODE_DIR / script), json.dumps(spec)]


def _skip_or_fail(problem: str | None) -> None:
    if problem is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"{problem} (CI=true: the Node tests must run, not skip)", pytrace=False)
    pytest.skip(problem)
