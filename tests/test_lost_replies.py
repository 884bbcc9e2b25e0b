"""Replies lost after the commit: the store retries, and recognises what it already wrote.

A small TCP proxy in front of the PostgreSQL server lets a chosen statement reach the server
and commit, then drops the connection before its reply reaches the client.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable
from typing import Any

import pytest

import intentlog
from conftest import with_query


class _LoseReplyProxy:
    """A TCP proxy in front of PostgreSQL. Armed with a marker, it forwards the client's
    statement that contains the marker, waits until the server has answered it (so it is
    committed: ReadyForQuery), runs ``hook``, then drops the connection without forwarding
    the answer: the client sees a lost connection after its write committed. Once."""

    def __init__(self, upstream: tuple[str, int], marker: bytes, hook: Callable[[], None]):
        self._upstream = upstream
        self._marker = marker
        self._hook = hook
        self._fired = False
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._sockets: list[socket.socket] = []
        self.port = self._listener.getsockname()[1]
        self.fired = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self._upstream)
            self._sockets += [client, server]
            state = {"marked": False}
            threading.Thread(target=self._up, args=(client, server, state), daemon=True).start()
            threading.Thread(target=self._down, args=(server, client, state), daemon=True).start()

    def _up(self, client: socket.socket, server: socket.socket, state: dict[str, bool]) -> None:
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                with self._lock:
                    if not self._fired and self._marker in data:
                        self._fired = True
                        state["marked"] = True
                server.sendall(data)
        with contextlib.suppress(OSError):
            server.shutdown(socket.SHUT_WR)

    def _down(self, server: socket.socket, client: socket.socket, state: dict[str, bool]) -> None:
        held = b""
        with contextlib.suppress(OSError):
            while data := server.recv(65536):
                if not state["marked"]:
                    client.sendall(data)
                    continue
                held += data
                if b"Z\x00\x00\x00\x05" in held:  # ReadyForQuery: the statement committed
                    self._hook()
                    self.fired.set()
                    for sock in (client, server):
                        with contextlib.suppress(OSError):
                            sock.shutdown(socket.SHUT_RDWR)
                        sock.close()
                    return
        with contextlib.suppress(OSError):
            client.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self._listener.close()
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


def test_retried_resolve_is_not_applied_a_second_time(pg_url: str, pg_schema: str) -> None:
    """An operator resolves an UNRESOLVED operation of an effect that can neither deduplicate
    nor reconcile with "retry". The statement commits but its reply is lost; meanwhile a
    worker picks the now-PLANNED operation up and sends it. The store retries the resolve and
    must recognise its own committed decision (by its audit record), not apply "retry" again
    to the worker's send in flight: that would send an effect that cannot be deduplicated
    twice, with two audit records for one decision."""
    landed: list[str] = []
    attempts = {"n": 0}
    in_submit = threading.Event()
    let_go = threading.Event()

    def send_mail(key: str, to: str) -> dict[str, Any]:
        attempts["n"] += 1
        if attempts["n"] == 1:
            raise ConnectionResetError("reset before the request left")  # did not land
        in_submit.set()
        let_go.wait(20)
        landed.append(key)
        return {"sent": len(landed)}

    mail = intentlog.Effect("mail_once", send_mail)  # no key, no lookup: "neither"
    direct = intentlog.open(pg_url, max_wait=1.0)
    worker_errors: list[BaseException] = []

    def worker() -> None:
        try:
            with direct.task("order-1") as task:
                task.run(mail, to="ana@example.com")
        except intentlog.OutcomeUnknown as exc:
            worker_errors.append(exc)

    worker_thread = threading.Thread(target=worker)

    def while_the_reply_is_lost() -> None:
        worker_thread.start()
        assert in_submit.wait(20), "the worker did not reach its send"

    with direct.task("order-1") as task, pytest.raises(intentlog.OutcomeUnknown):
        task.run(mail, to="ana@example.com")
    (op,) = direct.operations("order-1")
    assert op.state is intentlog.State.UNRESOLVED

    marker = f'INSERT INTO "{pg_schema}".resolutions'.encode()
    proxy = _LoseReplyProxy(("127.0.0.1", 5432), marker, while_the_reply_is_lost)
    proxied = with_query(
        pg_url.replace("127.0.0.1:5432", f"127.0.0.1:{proxy.port}"),
        sslmode="disable",
        gssencmode="disable",
    )
    operator = intentlog.open(proxied)
    try:
        operator.resolve(
            op.key, "retry", note="checked the mail server: never sent", accept_risk=True
        )
        assert proxy.fired.is_set()
        let_go.set()
        worker_thread.join(20)
        # The next run (a worker picking the task up again) does what the journal says.
        with contextlib.suppress(intentlog.Error), direct.task("order-1") as task:
            task.run(mail, to="ana@example.com")
        resolutions = direct.resolutions(op.key)
    finally:
        let_go.set()
        operator.close()
        proxy.close()
        direct.close()
    assert (len(landed), len(resolutions)) == (1, 1), (
        f"an effect that cannot be deduplicated was sent {len(landed)} times; "
        f"one operator decision left {len(resolutions)} audit records"
    )
