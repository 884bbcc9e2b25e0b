"""What ``intentlog mcp`` tells a person: an upstream server that dies at start is named with
its command and its exit code, on every path the proxy can meet it."""

from __future__ import annotations

import asyncio
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

if os.environ.get("CI") != "true":  # where CI=true these tests must run, not skip
    pytest.importorskip("mcp", reason="the MCP SDK is not installed (pip install 'intentlog[mcp]')")

from tests.mcp_clients import RawStdio, proxy_command

#: A server command that fails before it says anything, as a missing module would.
DIES = [sys.executable, "-c", "import sys; sys.stderr.write('no module payments\\n'); sys.exit(3)"]
KEYED = '[tools.charge]\nkey_argument = "idempotency_key"\nkey_retention = "24h"\n'


def _named(stderr: str) -> None:
    """The proxy's error line names the command and its exit code; the server's own stderr
    is there too (it is the proxy's)."""
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert errors, stderr
    assert "exit code 3" in errors[-1] and shlex.join(DIES) in errors[-1], stderr
    assert "no module payments" in stderr


@pytest.mark.parametrize("extra", [(), ("--list-tools",)])
def test_an_upstream_that_exits_at_start_is_named_when_the_tools_file_is_checked(
    tmp_path: Path, extra: tuple[str, ...]
) -> None:
    """A tools file with a key argument is checked against the server's tools before an
    agent is served (or for --list-tools): the server's death there is named too."""
    tools = tmp_path / "tools.toml"
    tools.write_text(KEYED)
    done = subprocess.run(
        proxy_command(tmp_path / "journal.db", DIES, tools=tools, extra=extra),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done
    _named(done.stderr)


def test_an_upstream_that_exits_at_start_is_named_to_the_agent_and_on_stderr(
    tmp_path: Path,
) -> None:
    """An agent's first request reaches a server that has already died: the proxy exits 1
    naming it, and an answer the agent gets (the proxy may stop before it reads the
    request) says which server closed and how."""

    async def body() -> tuple[dict[str, object] | None, str, int]:
        client = await RawStdio.start(
            proxy_command(tmp_path / "journal.db", DIES), stderr=asyncio.subprocess.PIPE
        )
        async with client:
            await client.send(
                {"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": {}}
            )
            answer = await client.recv(timeout=120)
            assert client.process.stderr is not None
            stderr = (await asyncio.wait_for(client.process.stderr.read(), 120)).decode()
            return answer, stderr, await client.process.wait()

    answer, stderr, code = asyncio.run(body())
    assert code == 1, stderr
    _named(stderr)
    if answer is not None:
        error = answer["error"]
        assert isinstance(error, dict), answer
        assert "exit code 3" in error["message"] and shlex.join(DIES) in error["message"]


#: A server command that is killed before it says anything (as the OOM killer would).
KILLED = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"]


@pytest.mark.parametrize(("command", "how"), [(DIES, "exit code 3"), (KILLED, "killed by SIGKILL")])
def test_an_upstream_that_ends_at_start_is_named_when_no_agent_comes(
    tmp_path: Path, command: list[str], how: str
) -> None:
    """The agent leaves at once (no input) and the server has ended without a word: an
    error, whether it exited with a code or was killed by a signal."""
    done = subprocess.run(
        proxy_command(tmp_path / "journal.db", command),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert errors and how in errors[-1] and shlex.join(command) in errors[-1], done.stderr
