"""What ``intentlog mcp`` tells a person: an upstream server that dies at start is named with
its command and its exit code, on every path the proxy can meet it; a call that waits on a
request in flight says what it waits for, until when and why (on stderr, and to an agent
that asked for progress)."""

from __future__ import annotations

import asyncio
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

if os.environ.get("CI") != "true":  # where CI=true these tests must run, not skip
    pytest.importorskip("mcp", reason="the MCP SDK is not installed (pip install 'intentlog[mcp]')")

from tests.support.mcp_clients import DEADLINE_S, INIT, RawStdio, proxy_command, server_command
from tests.support.mcp_ledger_server import ledger_count

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


# -- a wait on a request in flight -----------------------------------------------------------

# A long request deadline: the restarted proxy waits out the in-flight window of the request
# its killed predecessor sent, and the test sees it say so long before that window ends.
WAITING_TOOLS = """
[tools.charge]
key_argument = "idempotency_key"
key_retention = "24h"
timeout = "300s"

[tools.open_ticket]
key_argument = "request_id"
deduplicates = false
timeout = "300s"
lookup_lag = "0s"
[tools.open_ticket.lookup]
tool = "find_ticket"
arguments = { request_id = "{key}" }
found = "ticket"
"""
WAITS = [
    # Deduplicates on its key, no lookup: the resend waits for the first request's deadline.
    ("charge", {"amount": 1250}, "after_send", "2025-11-25",
     "the latest request may still be executing"),
    # A lookup that finds nothing yet is trusted only after that deadline.
    ("open_ticket", {"title": "the printer is on fire"}, "after_submit_mark", "2024-11-05",
     "not found yet, but the request could still land"),
]  # fmt: skip


@pytest.mark.parametrize(("tool", "arguments", "point", "revision", "why"), WAITS)
def test_a_restarted_call_that_waits_on_a_request_in_flight_says_so(
    tmp_path: Path, tool: str, arguments: dict[str, Any], point: str, revision: str, why: str
) -> None:
    """The proxy is killed with the call in flight and started again; the same call must
    wait for the first request's deadline before it can be looked up or resent. It says so
    on stderr (the call, until when, who sent the request, the decision's reason), and the
    agent, which asked for progress, hears it too (with a message from 2025-03-26 on)."""
    tools, ledger = tmp_path / "tools.toml", tmp_path / "ledger.db"
    tools.write_text(WAITING_TOOLS)
    # --max-wait beyond the window: the call waits it out (else it answers "still in flight").
    command = proxy_command(tmp_path / "journal.db", server_command(ledger), tools=tools,
                            extra=("--max-wait", "600"))  # fmt: skip

    async def body() -> None:
        armed = {**os.environ, "INTENTLOG_CRASH": f"{point}:{tool}"}
        async with await RawStdio.start(command, armed) as dying:
            await dying.initialize()
            await dying.call(1, tool, arguments)
            assert await dying.recv(timeout=DEADLINE_S) is None  # killed, unanswered
            assert await dying.process.wait() == -9
        await _gone(ledger)
        client = await RawStdio.start(command, stderr=asyncio.subprocess.PIPE)
        async with client:
            hello = {**INIT, "protocolVersion": revision}
            await client.send(
                {"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": hello}
            )
            await client.response("init")
            await client.call(2, tool, arguments, {"progressToken": "wait-2"})
            assert client.process.stderr is not None
            while True:  # the line that says the call waits
                line = await asyncio.wait_for(client.process.stderr.readline(), DEADLINE_S)
                assert line, "the proxy ended without a word"
                said = line.decode()
                if " waits " in said:
                    break
            assert said.startswith(f"intentlog mcp: call of {tool!r} (operation {tool}-"), said
            assert "until" in said and "UTC" in said and why in said, said
            assert "sent at" in said and "by a process that has since stopped" in said, said
            message = await client.recv(timeout=DEADLINE_S)
            assert message is not None and message["method"] == "notifications/progress"
            params = message["params"]
            assert params["progressToken"] == "wait-2" and params["total"] > 60, params
            assert params["progress"] < params["total"], params
            if revision >= "2025-03-26":
                assert why in params["message"], params
            else:
                assert "message" not in params, params
        await _gone(ledger)  # the proxy was killed waiting; nothing was resent meanwhile
        assert ledger_count(ledger, tool) == (1 if point == "after_send" else 0)

    asyncio.run(body())


async def _gone(ledger: Path) -> None:
    """Return once no server process of ``ledger`` is left (it could still apply a call)."""
    deadline = time.monotonic() + DEADLINE_S
    while _alive(str(ledger)):
        assert time.monotonic() < deadline, "the upstream server outlived its proxy"
        await asyncio.sleep(0.02)


def _alive(marker: str) -> bool:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
                status = (entry / "stat").read_text().split()[2]
            except OSError:
                continue
            if marker.encode() in cmdline and status != "Z":
                return True
    return False
