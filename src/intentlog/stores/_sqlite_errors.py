"""What a failed SQLite call means, said once for every SQLite store: driver errors become ours.

SQLite's own messages do not tell an operator what to do ("unable to open database file" is
what a read-only mount gives; "attempt to write a readonly database" is what a directory the
process may not write gives), and a damaged page in the middle of the file only shows when a
read reaches it. Every call of the SQLite stores (opening, each read, each write transaction,
each group commit) turns a driver error into an :class:`intentlog.Error` here, saying what is
wrong and what to do, with the driver's error as its ``__cause__``.
"""

from __future__ import annotations

import errno
import os
import sqlite3
import stat
from pathlib import Path

from intentlog._errors import (
    Error,
    InvalidInput,
    JournalCorrupt,
    JournalError,
    JournalFull,
    JournalReadOnly,
)

__all__ = ["DRIVER_ERRORS", "describe", "describe_os_error"]

#: What a call into the sqlite3 module may raise besides our own errors: its own errors, and
#: a value it cannot bind (a lone surrogate in a text, an integer beyond 64 bits).
DRIVER_ERRORS = (sqlite3.Error, UnicodeEncodeError, OverflowError)

# Primary result codes (https://sqlite.org/rescode.html); extended codes keep them in the low
# byte (SQLITE_READONLY_DIRECTORY is 1544 = 8 | 6 << 8).
_PERM, _BUSY, _LOCKED, _READONLY, _IOERR, _CORRUPT = 3, 5, 6, 8, 10, 11
_FULL, _CANTOPEN, _TOOBIG, _AUTH, _NOTADB = 13, 14, 18, 23, 26


def describe(exc: BaseException, path: Path, *, closed: bool = False) -> Error:
    """The intentlog error for ``exc``, raised by SQLite on the journal file ``path``.

    ``closed``: the store was closed (SQLite then says only "Cannot operate on a closed
    database").
    """
    where = path.absolute()
    if isinstance(exc, UnicodeEncodeError | OverflowError):
        return InvalidInput(f"the journal cannot store a value: {type(exc).__name__}: {exc}")
    if closed and isinstance(exc, sqlite3.ProgrammingError):
        return JournalError(f"the journal {where} is closed")
    code = getattr(exc, "sqlite_errorcode", None)
    primary = None if code is None else code & 0xFF
    said = f"SQLite: {exc}"
    if primary in (_CORRUPT, _NOTADB):
        return JournalCorrupt(
            f"the journal file {where} is damaged ({said}); nothing more was written to it. "
            "Stop every process that uses it, keep a copy of it with its -wal file, then "
            f"restore it from a backup or salvage what it holds with: sqlite3 {where} .recover"
        )
    if primary == _FULL:
        return JournalFull(
            f"the disk holding the journal {where} is full, or the journal reached a size "
            f"limit ({said}): this write was not recorded, and everything recorded before it "
            "is intact. Free space, then retry."
        )
    if primary in (_READONLY, _PERM, _CANTOPEN, _AUTH):
        problem = access_problem(where)
        if problem is not None:
            return JournalReadOnly(
                f"cannot write the journal {where}, nothing was written: {problem}"
            )
        if primary == _READONLY:
            return JournalReadOnly(
                f"the journal {where} is read-only for this process ({said}); nothing was "
                "written. Give it write access to the file, its -wal and -shm files and their "
                "directory."
            )
        return JournalError(f"cannot open the journal {where} ({said})")
    if primary in (_BUSY, _LOCKED):
        return JournalError(
            f"journal write failed: {where} stayed locked by another connection for longer "
            f"than the busy timeout ({said}); nothing was written. Retry; if it lasts, look "
            "for a process that holds a write transaction open."
        )
    if primary == _IOERR:
        # Some filesystems report a full disk as a failed write, not as SQLITE_FULL.
        full = " The disk holding it has no space left." if _no_space(where) else ""
        return JournalError(
            f"I/O error on the journal {where} ({said}); the write may or may not be recorded."
            f"{full} Check the disk and the system log before going on."
        )
    if primary == _TOOBIG:
        return InvalidInput(f"a value is too large for the journal {where} ({said})")
    return JournalError(f"journal call failed on {where} ({said})")


def describe_os_error(exc: OSError, path: Path, doing: str) -> Error:
    """The intentlog error for ``exc``, raised by the file system while ``doing`` ("create",
    "read") the journal file ``path``."""
    where = path.absolute()
    if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        problem = access_problem(where) or f"{exc.strerror or exc} for {_who()}"
        return JournalReadOnly(f"cannot {doing} the journal {where}: {problem}")
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return JournalFull(
            f"cannot {doing} the journal {where}: the disk holding it is full ({exc.strerror}). "
            "Free space, then retry."
        )
    if exc.errno == errno.ENOTDIR:
        blocker = next((p for p in where.parents if _exists(p) and not p.is_dir()), where.parent)
        return JournalError(f"cannot {doing} the journal {where}: {blocker} is not a directory")
    if exc.errno == errno.EISDIR:
        return JournalError(f"journal path {where} is a directory")
    return JournalError(f"cannot {doing} the journal {where}: {exc.strerror or exc}")


def access_problem(path: Path) -> str | None:
    """Why this process cannot read or write the journal ``path`` and the files SQLite keeps
    beside it, then what to do, as one sentence; None if the file system allows what SQLite
    needs."""
    # The directory that holds the file, or will once the missing ones are created.
    directory = next((p for p in path.parents if _exists(p)), path.parent)
    try:
        read_only_fs = bool(os.statvfs(directory).f_flag & os.ST_RDONLY)
    except OSError:
        read_only_fs = False
    if read_only_fs:
        return (
            f"the filesystem holding {directory} is mounted read-only. Remount it read-write, "
            "or copy the journal (with its -wal and -shm files) to a writable place"
        )
    who = _who()
    sides = [path.with_name(path.name + suffix) for suffix in ("-wal", "-shm")]
    for file in (path, *sides):
        if not _exists(file):
            continue
        if not _can(file, os.R_OK):
            return (
                f"permission denied: {who} may not read {file} ({_owner(file)}). Run as its "
                "owner, or give this user read and write access to it"
            )
        if not _can(file, os.W_OK):
            return (
                f"{file} ({_owner(file)}) is read-only for {who}. Give this user write access "
                "to the journal, its -wal and -shm files and their directory"
            )
    missing = [file for file in (path, *sides) if not _exists(file)]
    if missing and not _can(directory, os.W_OK | os.X_OK):
        if directory != path.parent:
            needs = f"the journal's directory {path.parent} would be created there"
        elif path in missing:
            needs = "the journal and SQLite's -wal and -shm files beside it go there"
        else:
            needs = f"SQLite creates the journal's {' and '.join(f.name for f in missing)} there"
        return (
            f"{who} may not create files in {directory} ({_owner(directory)}), and {needs}. "
            "Give this user write access to that directory"
        )
    return None


def _no_space(path: Path) -> bool:
    try:
        info = os.statvfs(path.parent)
    except OSError:
        return False
    return info.f_bavail * info.f_frsize < 64 * 1024


def _exists(path: Path) -> bool:
    return os.path.lexists(path)  # False, not an error, where a parent may not be searched


def _can(path: Path, mode: int) -> bool:
    effective = os.access in os.supports_effective_ids
    return os.access(path, mode, effective_ids=effective)


def _who() -> str:
    return f"this process (user id {os.geteuid()})" if hasattr(os, "geteuid") else "this process"


def _owner(path: Path) -> str:
    try:
        info = path.stat()
    except OSError:
        return "not readable"
    return f"mode {stat.S_IMODE(info.st_mode):04o}, owned by user id {info.st_uid}"
