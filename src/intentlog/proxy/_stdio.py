"""The agent's side over this process's stdin and stdout, whatever they are.

asyncio's pipe transports take pipes, sockets and character devices only ("Pipe transport
is only for pipes, sockets and character devices"), so an agent's input read from a file or
the proxy's output redirected to one (``intentlog mcp ... > log.jsonl``) would fail. A
regular file (or ``/dev/null``, which epoll refuses) is read in a thread and written with
plain blocking writes instead: a file never blocks for long, and has no flow control.
"""

from __future__ import annotations

import asyncio
import os
import stat
import threading
from typing import cast

from intentlog.proxy import _wire

__all__ = ["StdioAgent"]

_CHUNK = 64 * 1024


class StdioAgent(_wire.StdioAgent):
    """:class:`intentlog.proxy._wire.StdioAgent`, also over regular files."""

    async def start(self) -> None:
        if _is_stream(0) and _is_stream(1):
            await super().start()
            return
        loop = asyncio.get_running_loop()
        reader = self._reader = asyncio.StreamReader(limit=_wire._LINE_LIMIT)
        if _is_stream(0):
            await loop.connect_read_pipe(
                lambda: asyncio.StreamReaderProtocol(reader),
                os.fdopen(0, "rb", buffering=0, closefd=False),
            )
        else:
            threading.Thread(target=_read_file, args=(loop, reader), daemon=True).start()
        if _is_stream(1):
            transport, protocol = await loop.connect_write_pipe(
                asyncio.streams.FlowControlMixin, os.fdopen(1, "wb", buffering=0, closefd=False)
            )
            self._writer = asyncio.StreamWriter(transport, protocol, None, loop)
        else:
            # The line protocol needs write, drain and close; a file has nothing to wait for.
            self._writer = cast(asyncio.StreamWriter, _FileWriter(1))


def _is_stream(fd: int) -> bool:
    """Whether ``fd`` is something asyncio's pipe transports take."""
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return True  # closed: let the pipe transport report it as it always has
    # A terminal polls; other character devices (/dev/null) do not: epoll refuses them.
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or os.isatty(fd)


def _read_file(loop: asyncio.AbstractEventLoop, reader: asyncio.StreamReader) -> None:
    try:
        while chunk := os.read(0, _CHUNK):
            loop.call_soon_threadsafe(reader.feed_data, chunk)
    except OSError:
        pass
    finally:
        loop.call_soon_threadsafe(reader.feed_eof)


class _FileWriter:
    def __init__(self, fd: int) -> None:
        self._fd = fd

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]

    async def drain(self) -> None:
        pass

    def close(self) -> None:
        pass
