"""Who holds a lease: host, pid, process start time and a per-handle nonce.

The start time makes a reused pid distinguishable from the process that took the lease, so a
restarted worker can take over its dead predecessor's lease at once instead of waiting it out.

The host is the host name and, on Linux, the process's pid namespace and the machine's boot
id: containers on one machine often share its host name (host networking) while each numbers
its processes itself, so a pid read in one means nothing in another; and two machines may
share a host name, while the initial pid namespace has the same number on every Linux
machine, so only the boot id tells them apart. A holder in another namespace, on another
machine, or from before this machine's last boot is judged as one on another host: unknown,
so alive (its lease is waited out, never taken at once).
"""

from __future__ import annotations

import functools
import os
import secrets
import socket

__all__ = ["holder_is_dead", "new_owner"]


def _start_ticks(pid: int) -> str | None:
    """The process start time in clock ticks since boot (Linux), or None if unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read().decode("ascii", "replace")
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else None


@functools.cache  # a process never leaves its pid namespace
def _pid_namespace() -> str:
    """``/<inode>`` of this process's pid namespace (Linux), else empty."""
    try:
        link = os.readlink("/proc/self/ns/pid")  # "pid:[4026531836]"
    except OSError:
        return ""
    digits = "".join(c for c in link if c.isdigit())
    return f"/{digits}" if digits else ""


@functools.cache  # a process never outlives its machine's boot
def _boot_id() -> str:
    """``/<12 hex digits>`` of this machine's boot id (Linux), else empty."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            digits = fh.read().strip().replace("-", "")
    except OSError:
        return ""
    return f"/{digits[:12]}" if digits else ""


def _host() -> str:
    return socket.gethostname() + _pid_namespace() + _boot_id()


#: This process's identity (host, pid, start time), made once per pid: a forked child makes
#: its own. Read on every task opened, where /proc and the host name cost ~40 µs.
_own: tuple[int, str] | None = None


def new_owner() -> str:
    """A fresh owner identity for one task handle of this process."""
    global _own
    pid = os.getpid()
    if _own is None or _own[0] != pid:
        _own = (pid, f"{_host()}:{pid}:{_start_ticks(pid) or '?'}")
    return f"{_own[1]}:{secrets.token_hex(4)}"


def holder_is_dead(owner: str | None) -> bool:
    """True only when ``owner`` is known to be gone: same host and pid namespace, and its
    process is not there (or is another process that reused the pid). Unknown means alive
    (another host, another namespace, or an owner written before namespaces were)."""
    if not owner:
        return True
    parts = owner.rsplit(":", 3)
    if len(parts) != 4 or parts[0] != _host():
        return False
    _where, pid_text, ticks, _nonce = parts
    try:
        pid = int(pid_text)
    except ValueError:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # exists, owned by someone else
    current = _start_ticks(pid)
    return ticks != "?" and current is not None and current != ticks


def same_process(owner: str | None) -> bool:
    """True when ``owner`` is a handle of this very process."""
    if not owner:
        return False
    parts = owner.rsplit(":", 3)
    return len(parts) == 4 and parts[0] == _host() and parts[1] == str(os.getpid())
