"""Servers the tests start: a free loopback port for any of them, and Prefect's own server
(``prefect server start``, once per session) with its database in a folder of its own; and
the person who settles an engine's UNRESOLVED call with ``intentlog resolve``."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the server binds it next; a
    start that loses the port to someone else is retried on another)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def resolve_confirmed(directory: Path, key: str, receipt: dict[str, Any]) -> None:
    """``intentlog resolve KEY --confirmed`` on ``directory/journal.db``, as a person would
    type it; tried again while it is refused because the lost request could still land."""
    command = [sys.executable, "-m", "intentlog.cli", "resolve", key, "--confirmed",
               "--receipt", json.dumps(receipt), "--note", "seen in the payments dashboard",
               "--db", str(directory / "journal.db")]  # fmt: skip
    while True:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
        if done.returncode == 0:
            return
        # Refused only while the lost request could still land (its timeout, 2 s, from send).
        assert "may still land" in done.stdout + done.stderr, done.stdout + done.stderr
        time.sleep(0.1)


class PrefectServer:
    """``prefect server start`` in a session of its own (stopped with its whole group)."""

    def __init__(self, directory: Path) -> None:
        self.home = directory
        self.log = (directory / "server.log").open("w")
        for _ in range(3):  # the port is free when chosen; another process may take it first
            port = free_port()
            self.api_url = f"http://127.0.0.1:{port}/api"
            self.process = subprocess.Popen(
                [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                 "--port", str(port)],
                env={**os.environ, **self.settings(), "PREFECT_UI_ENABLED": "false"},
                stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
            if self._wait_until_healthy():
                return
        raise RuntimeError(
            f"prefect server did not start: {(directory / 'server.log').read_text()}"
        )

    def settings(self) -> dict[str, str]:
        """The environment a process needs to use this server."""
        return {"PREFECT_API_URL": self.api_url, "PREFECT_HOME": str(self.home),
                "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                "PREFECT_LOGGING_LEVEL": "WARNING"}  # fmt: skip

    def mark_crashed(self, flow_run: str) -> None:
        """Set flow run ``flow_run`` Crashed, as Prefect's worker does when the process running
        it died (a flow run killed by SIGKILL stays Running otherwise, and cannot be retried)."""
        state = {"state": {"type": "CRASHED", "name": "Crashed", "message": "process killed"},
                 "force": True}  # fmt: skip
        request = urllib.request.Request(
            f"{self.api_url}/flow_runs/{flow_run}/set_state", json.dumps(state).encode(),
            headers={"Content-Type": "application/json"}, method="POST",
        )  # fmt: skip
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status in (200, 201)

    def _wait_until_healthy(self) -> bool:
        while self.process.poll() is None:  # bounded by the test timeout
            try:
                with urllib.request.urlopen(self.api_url + "/health", timeout=5) as response:
                    if response.status == 200:
                        return True
            except OSError:
                time.sleep(0.2)
        return False

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.log.close()
