"""The exceptions intentlog raises, all under one root.

::

    Error                       root of everything intentlog raises
    ├── InvalidInput            a bad argument: task id, key, effect, URL (also a ValueError)
    ├── UnsafeValue             a secret-like or oversize value the caller asked us to store
    ├── KeyConflict             an operation key reused with other arguments or another effect
    ├── UnknownOperation        no operation has this key (also a LookupError)
    ├── Rejected                the service said "not applied"; the operation is FAILED
    ├── OutcomeUnknown          the operation is UNRESOLVED; a person or a policy must resolve it
    ├── StillInFlight           the decision is WAIT and the caller's wait bound ran out
    ├── TaskBusy                another live worker holds the task's lease
    ├── LeaseLost               this worker's lease was taken over; its writes are refused
    └── JournalError            the journal itself cannot be used
        ├── JournalCorrupt      the file is not an intentlog journal or is damaged
        ├── JournalReadOnly     read-only filesystem, file or directory, or permission denied
        ├── JournalFull         the disk (or a size limit) is full; the write was not recorded
        └── SchemaTooNew        the journal was written by a newer intentlog

Every error carries the context it knows (``task_id``, ``key``, ``state``) as attributes
and survives pickling, so it can cross a process boundary intact.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "Error",
    "InvalidInput",
    "JournalCorrupt",
    "JournalError",
    "JournalFull",
    "JournalReadOnly",
    "KeyConflict",
    "LeaseLost",
    "OutcomeUnknown",
    "Rejected",
    "SchemaTooNew",
    "StillInFlight",
    "TaskBusy",
    "UnknownOperation",
    "UnsafeValue",
]


class Error(Exception):
    """Root of every exception intentlog raises.

    ``task_id``, ``key`` and ``state`` name what the error is about, where known.
    """

    def __init__(
        self,
        message: str,
        *,
        task_id: str | None = None,
        key: str | None = None,
        state: str | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.task_id = task_id
        self.key = key
        self.state = state
        self.extra = extra
        for name, value in extra.items():
            setattr(self, name, value)

    def __reduce__(self) -> tuple[Any, ...]:
        # Keyword-only context would be lost by the default Exception pickling.
        return (_rebuild, (type(self), self.message, self._context()))

    def _context(self) -> dict[str, Any]:
        return {"task_id": self.task_id, "key": self.key, "state": self.state, **self.extra}

    def __str__(self) -> str:
        return self.message


def _rebuild(cls: type[Error], message: str, context: dict[str, Any]) -> Error:
    return cls(message, **context)


class InvalidInput(Error, ValueError):
    """An argument is not acceptable; the message names it. Nothing was written."""


class UnsafeValue(Error, ValueError):
    """A value to be stored looks like a credential or exceeds the size bound.

    ``path`` names where in the value it was found, e.g. ``state.user.password``.
    Nothing was written; the previous checkpoint is unchanged.
    """


class KeyConflict(Error):
    """An operation key is already recorded with other arguments or for another effect."""


class UnknownOperation(Error, LookupError):
    """No operation with this key exists in the journal."""


class Rejected(Error):
    """Raised by an effect's submit when the service said the request was not applied.

    The operation becomes FAILED and ``task.run`` raises this again on replay. ``detail``
    is kept in the journal (it must be JSON and free of secrets).
    """

    def __init__(self, message: str = "rejected by the service", **context: Any) -> None:
        super().__init__(message, **context)


class OutcomeUnknown(Error):
    """The operation is UNRESOLVED: it may or may not have taken effect.

    It is never sent again automatically. Resolve it with ``journal.resolve(key, ...)`` or
    ``intentlog resolve KEY``.
    """


class StillInFlight(Error):
    """The decision is to wait (a request may still land) and the wait bound ran out.

    ``not_before`` is the store-clock time from which the next step can be decided.
    """


class TaskBusy(Error):
    """Another live worker holds the task's lease and did not release it in time."""


class LeaseLost(Error):
    """This worker's lease on the task was taken over; the write was refused (fencing)."""


class JournalError(Error):
    """The journal cannot be used as it is. It was left untouched."""


class JournalCorrupt(JournalError):
    """The journal file is damaged or is not an intentlog journal."""


class JournalReadOnly(JournalError):
    """This process may not write the journal, or not even read it: the filesystem, the file
    or its directory is read-only, or permission is denied (for PostgreSQL: a read-only server
    or missing privileges). The message says which. Nothing was written."""


class JournalFull(JournalError):
    """The disk holding the journal is full, or the journal reached a size limit. The write
    that failed was not recorded; everything recorded before it is intact. Free space and
    retry."""


class SchemaTooNew(JournalError):
    """The journal's schema is newer than this version of intentlog understands."""
