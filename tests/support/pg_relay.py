"""A TCP relay on loopback between a PostgreSQL client and its server that can cut a connection
at one chosen statement, for the tests of a journal write whose COMMIT is cut.

    relay = Relay(("127.0.0.1", 5432)).start()
    url = relay.url(pg_url)                       # the same journal, through the relay
    relay.arm("INSERT INTO", when="after")        # the next such statement reaches the server,
    ...                                           # its answer never reaches the client
    relay.wait_cut()

It reads the client's side of the protocol (https://www.postgresql.org/docs/current/
protocol-message-formats.html): every message after the startup packet is a type byte, a
4-byte length that counts itself, and a body. A statement's text travels in a Query (simple
protocol) or a Parse (extended protocol); a Bind names the statement it runs, so a statement
prepared earlier (psycopg prepares one after a few uses) is recognised by its name. In
autocommit the statement's implicit transaction commits when the server processes the Sync
that ends the extended-protocol batch, or right after a simple Query
(https://www.postgresql.org/docs/current/protocol-flow.html#PROTOCOL-FLOW-EXT-QUERY).

``when="before"``: the connection is cut as the armed statement arrives; nothing of it reaches
the server, so nothing of it commits. ``when="after"``: the statement is forwarded up to and
including the Sync (or the Query) that commits it, the client's side is closed at once, and
the server's answer, read to its ReadyForQuery, is thrown away: the commit landed, the client
never hears of it. SSL and GSS encryption requests are answered "N" by the relay itself, so the
client goes on in plain text (libpq's default ``sslmode=prefer`` accepts that).

``refuse()`` makes the relay close every new connection at once (a server that cannot be
reached); ``accept()`` undoes it.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

_SSL_REQUEST = 80877103
_GSS_REQUEST = 80877104


@dataclass
class _Armed:
    pattern: str
    when: str
    skip: int  # matching statements still to let through
    then_refuse: bool


@dataclass
class Cut:
    """A cut that happened: the statement's text and which side of its commit."""

    text: str
    when: str


@dataclass
class _Conn:
    client: socket.socket
    server: socket.socket
    statements: dict[str, str] = field(default_factory=dict)  # prepared name -> text
    discarding = False  # after a cut "after": the server's answer is read and dropped
    closed = False


class Relay:
    """A loopback relay to ``upstream``, one thread per direction per connection."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._armed: _Armed | None = None
        self._refusing = False
        self._conns: list[_Conn] = []
        self.cuts: list[Cut] = []
        self._cut = threading.Condition(self._lock)
        self.connections = 0  # accepted and relayed

    def start(self) -> Relay:
        threading.Thread(target=self._accept, name="pg-relay", daemon=True).start()
        return self

    def url(self, url: str) -> str:
        """``url`` with its host and port replaced by the relay's."""
        parts = urlsplit(url)
        userinfo = parts.netloc.rpartition("@")[0]
        netloc = f"{userinfo}@127.0.0.1:{self.port}" if userinfo else f"127.0.0.1:{self.port}"
        return urlunsplit(parts._replace(netloc=netloc))

    def arm(self, pattern: str, *, when: str, nth: int = 1, then_refuse: bool = False) -> None:
        """Cut the connection carrying the ``nth`` next statement whose text contains
        ``pattern``; with ``then_refuse``, refuse every connection from then on (until
        :meth:`accept`), as a server gone for good would."""
        assert when in ("before", "after") and nth >= 1, (when, nth)
        with self._lock:
            self._armed = _Armed(pattern, when, nth - 1, then_refuse)

    def wait_cut(self, timeout: float = 60.0) -> Cut:
        """The armed cut, once it happened (AssertionError if it did not within ``timeout``,
        a bound on a failure, never a wait the test relies on)."""
        with self._cut:
            assert self._cut.wait_for(lambda: self._armed is None, timeout), "no cut happened"
            return self.cuts[-1]

    def refuse(self) -> None:
        """Close new connections at once, and cut the open ones."""
        with self._lock:
            self._refusing = True
            conns = list(self._conns)
        for conn in conns:
            self._close(conn)

    def accept(self) -> None:
        with self._lock:
            self._refusing = False

    def close(self) -> None:
        self._listener.close()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            self._close(conn)

    def __enter__(self) -> Relay:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- relaying ------------------------------------------------------------------------------

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            with self._lock:
                refusing = self._refusing
            if refusing:
                client.close()
                continue
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            for sock in (client, server):
                # Message by message, small writes: without this, Nagle's algorithm holds
                # each one back for the peer's delayed ACK (tens of milliseconds a statement).
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Conn(client, server)
            with self._lock:
                self._conns.append(conn)
                self.connections += 1
            threading.Thread(target=self._upstream, args=(conn,), daemon=True).start()
            threading.Thread(target=self._downstream, args=(conn,), daemon=True).start()

    def _close(self, conn: _Conn) -> None:
        with self._lock:
            if conn in self._conns:
                self._conns.remove(conn)
            conn.closed = True
        for sock in (conn.client, conn.server):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _upstream(self, conn: _Conn) -> None:
        """Client to server: the startup packet, then typed messages, watched for the armed
        statement."""
        try:
            self._startup(conn)
            batch: list[bytes] = []  # the messages of the current extended-protocol batch
            cut: _Armed | None = None
            cut_text = ""
            for kind, message in _messages(conn.client):
                text = self._text(conn, kind, message)
                if text is not None and cut is None:
                    cut, cut_text = self._take(text), text
                    if cut is not None and cut.when == "before":
                        self._close(conn)
                        self._record(cut, text, "before")
                        return
                if cut is None:
                    conn.server.sendall(message)
                    continue
                batch.append(message)
                if kind in (b"S", b"Q"):  # the Sync or Query that commits the statement
                    conn.discarding = True  # set before the server can answer
                    conn.server.sendall(b"".join(batch))
                    with contextlib.suppress(OSError):
                        conn.client.shutdown(socket.SHUT_RDWR)
                    conn.client.close()
                    self._record(cut, cut_text, "after", keep=conn)
                    return  # _downstream closes the server side after its answer
        except OSError:
            pass
        finally:
            if not conn.discarding:
                self._close(conn)

    def _startup(self, conn: _Conn) -> None:
        while True:
            (length,) = struct.unpack("!I", _read(conn.client, 4))
            body = _read(conn.client, length - 4)
            (code,) = struct.unpack("!I", body[:4])
            if code in (_SSL_REQUEST, _GSS_REQUEST):
                conn.client.sendall(b"N")  # no encryption: the client goes on in plain text
                continue
            conn.server.sendall(struct.pack("!I", length) + body)
            return

    def _text(self, conn: _Conn, kind: bytes, message: bytes) -> str | None:
        """The statement text a message runs or prepares, if it is one that does."""
        body = message[5:]
        if kind == b"Q":
            return body.split(b"\0", 1)[0].decode()
        if kind == b"P":
            name, rest = body.split(b"\0", 1)
            text = rest.split(b"\0", 1)[0].decode()
            conn.statements[name.decode()] = text
            return text if not name else None  # a named Parse only prepares: its Bind runs it
        if kind == b"B":
            _portal, rest = body.split(b"\0", 1)
            name = rest.split(b"\0", 1)[0].decode()
            return conn.statements.get(name) if name else None
        return None

    def _take(self, text: str) -> _Armed | None:
        with self._lock:
            armed = self._armed
            if armed is None or armed.pattern not in text:
                return None
            if armed.skip:
                armed.skip -= 1
                return None
            if armed.then_refuse:  # before the client can notice the cut and reconnect
                self._refusing = True
            return armed

    def _record(self, armed: _Armed, text: str, when: str, keep: _Conn | None = None) -> None:
        if armed.then_refuse:  # the server is gone: every other connection to it too
            with self._lock:
                others = [c for c in self._conns if c is not keep]
            for other in others:
                self._close(other)
        with self._cut:
            self.cuts.append(Cut(text, when))
            self._armed = None
            self._cut.notify_all()

    def _downstream(self, conn: _Conn) -> None:
        """Server to client, message by message; after a cut "after", the server's answer is
        read to its ReadyForQuery and dropped, then the server's side is closed."""
        try:
            # The server's first byte may answer nothing but the startup: no SSL byte comes
            # from the server, the relay answered those itself.
            for kind, message in _messages(conn.server):
                if conn.discarding:
                    if kind == b"Z":
                        break
                    continue
                conn.client.sendall(message)
        except OSError:
            pass
        finally:
            self._close(conn)


def _read(sock: socket.socket, size: int) -> bytes:
    chunks = []
    while size:
        chunk = sock.recv(size)
        if not chunk:
            raise ConnectionResetError("peer closed")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _messages(sock: socket.socket) -> Iterator[tuple[bytes, bytes]]:
    """Typed protocol messages: (type byte, the whole message)."""
    while True:
        head = _read(sock, 5)
        (length,) = struct.unpack("!I", head[1:])
        yield head[:1], head + _read(sock, length - 4)
