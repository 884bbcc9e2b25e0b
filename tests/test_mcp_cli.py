"""``intentlog mcp`` as a command: without the MCP SDK, with its output in a file, in front
of a server that exits at once, and started as the docs' host configuration says (no ``--``,
which the MCP Inspector splits a configuration's arguments at)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.support.mcp_clients import dump, operation, stdio_session

ROOT = Path(__file__).resolve().parent.parent
TINY = [sys.executable, str(ROOT / "tests" / "support" / "mcp_tiny_server.py")]
PROXY = [sys.executable, "-m", "intentlog.cli", "mcp"]
HELLO = {"protocolVersion": "2025-11-25", "capabilities": {},
         "clientInfo": {"name": "file-agent", "version": "1"}}  # fmt: skip


@pytest.mark.parametrize("face", [["--listen", "127.0.0.1:0"], ["--upstream", "http://x/mcp"]])
def test_http_faces_without_the_sdk_say_what_to_install(tmp_path: Path, face: list[str]) -> None:
    # The SDK made unimportable in the child, as where the extra is not installed.
    run = ("import sys; sys.modules['mcp'] = None; from intentlog.cli import main; "
           "main(sys.argv[1:])")  # fmt: skip
    command = [sys.executable, "-c", run, "mcp", "--db", str(tmp_path / "j.db"), *face]
    if face[0] == "--listen":
        command += ["--", *TINY, "--ledger", str(tmp_path / "l.txt")]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"error: {face[0]} needs the MCP SDK (mcp is not installed): pip install -e '.[mcp]' "
        "in intentlog's clone (pip install 'intentlog[mcp]' once it is published)"
    ]


def _proxy_over_files(tmp_path: Path, *messages: dict[str, Any]) -> dict[Any, Any]:
    """The proxy (in front of the tiny server, its command given without ``--``) reading
    ``messages`` from a file and writing its answers to one; the answers by id."""
    requests, answers = tmp_path / "requests.jsonl", tmp_path / "answers.jsonl"
    requests.write_text("".join(json.dumps(m) + "\n" for m in messages))
    command = [*PROXY, "--db", str(tmp_path / "j.db"), "--task", "t1",
               *TINY, "--ledger", str(tmp_path / "ledger.txt")]  # fmt: skip
    with requests.open("rb") as stdin, answers.open("wb") as stdout:
        done = subprocess.run(command, stdin=stdin, stdout=stdout, stderr=subprocess.PIPE,
                              timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()
    return {m["id"]: m for m in map(json.loads, answers.read_text().splitlines())}


def test_stdio_over_files_and_a_command_without_dashes(tmp_path: Path) -> None:
    """The agent's side read from a file and written to one (asyncio's pipe transports
    refuse files); the server's command given without ``--``, its own options after it."""
    call = {"name": "note", "arguments": {"text": "from a file"}}
    replies = _proxy_over_files(
        tmp_path,
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": HELLO},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": call},
    )
    assert replies[1]["result"]["serverInfo"]["name"] == "tiny"
    assert operation(replies[2]["result"])["state"] == "CONFIRMED", replies[2]
    assert (tmp_path / "ledger.txt").read_text() == "from a file\n"


def test_requests_passed_through_are_answered_after_the_input_ends(tmp_path: Path) -> None:
    """Requests read from a file end before the server has answered them: every one still
    gets its answer (they were dropped when the input ended, leaving the file empty)."""
    replies = _proxy_over_files(
        tmp_path,
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": HELLO},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
        {"jsonrpc": "2.0", "id": 3, "method": "ping"},
    )
    assert sorted(replies) == [1, 2, 3], replies
    assert replies[2]["result"]["tools"][0]["name"] == "note"


def test_a_server_that_exits_at_once_stops_the_proxy_with_an_error(tmp_path: Path) -> None:
    """The agent stays connected (its stdin open): the proxy still ends, non-zero, naming
    the command and its exit code, instead of serving nothing until the agent leaves."""
    gone = [sys.executable, "-c", "import sys; sys.exit(3)"]
    proxy = subprocess.Popen(
        [*PROXY, "--db", str(tmp_path / "j.db"), "--task", "t1", "--", *gone],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proxy.wait(timeout=60) == 1
        assert proxy.stderr is not None
        err = proxy.stderr.read()
    finally:
        if proxy.poll() is None:
            proxy.kill()
            proxy.wait()
        for stream in (proxy.stdin, proxy.stdout, proxy.stderr):
            if stream is not None:
                stream.close()
    assert "the upstream server exited (exit code 3) before it answered anything" in err
    assert "sys.exit(3)" in err


def test_the_docs_host_configuration_runs_as_a_host_starts_it(tmp_path: Path) -> None:
    """The ``mcpServers`` entry of docs/mcp.md, run as a host runs it: its command, its
    arguments (with this test's files for the journal and the tools file) and its
    environment, against the docs' own stand-in server."""
    text = (ROOT / "docs" / "mcp.md").read_text()
    blocks = dict(re.findall(r"```\w+\n# file: (\S+)\n(.*?)```", text, re.S))
    (tmp_path / "payments_server.py").write_text(blocks["payments_server.py"])
    (tmp_path / "tools.toml").write_text(blocks["tools.toml"])
    config = json.loads(re.search(r"```json\n(\{\n  \"mcpServers\".*?)```", text, re.S)[1])
    entry = config["mcpServers"]["payments"]
    assert "--" not in entry["args"], "the MCP Inspector splits a config's arguments at --"
    assert entry["command"] == "intentlog"
    paths = {"/var/lib/agent/journal.db": str(tmp_path / "journal.db"),
             "/etc/agent/payments.toml": str(tmp_path / "tools.toml")}  # fmt: skip
    args = [paths.get(a, a) for a in entry["args"]]
    args = [sys.executable if a == "python" else a for a in args]
    env = {**os.environ, **entry["env"], "PYTHONPATH": os.pathsep.join(sys.path)}

    async def body() -> None:
        async with stdio_session([*PROXY[:3], *args], env=env, cwd=tmp_path) as session:
            names = {tool.name for tool in (await session.list_tools()).tools}
            assert "create_payment" in names
            paid = dump(await session.call_tool("create_payment", {"amount": 5}))
            assert operation(paid)["state"] == "CONFIRMED", paid

    asyncio.run(body())
