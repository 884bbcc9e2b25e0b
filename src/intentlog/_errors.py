"""The exceptions intentlog raises, all under one root.

::

    Error                       root of everything intentlog raises
    ├── InvalidInput            a bad argument: task id, key, effect, URL (also a ValueError)
    ├── UnsafeValue             a secret-like or oversize value the caller asked us to store
    ├── KeyConflict             an operation key reused with other arguments or another effect
    ├── UnknownOperation        no operation has this key (also a LookupError)
    ├── Rejected                the service said "not applied"; the operation is FAILED
    ├── OutcomeUnknown          the operation is UNRESOLVED; a person or a policy must resolve it
    ├── ApprovalRequired        the operation awaits a person's approval; nothing was sent
    ├── StillInFlight           the decision is WAIT and the caller's wait bound ran out
    ├── TaskBusy                another live worker holds the task's lease
    ├── LeaseLost               this worker's lease was taken over; its writes are refused
    ├── NoCurrentTask           a journaled function was called where no task is current
    ├── AmbiguousResponse       an integration's answer does not say whether it applied
    │                           (in intentlog.integrations)
    └── JournalError            the journal itself cannot be used
        ├── JournalCorrupt      the file is not an intentlog journal or is damaged
        ├── JournalReadOnly     read-only filesystem, file or directory, or permission denied
        ├── JournalFull         the disk (or a size limit) is full; the write was not recorded
        ├── JournalUnreachable  the journal's server could not be reached within the bound
        └── SchemaTooNew        the journal was written by a newer intentlog

Every error carries the context it knows (``task_id``, ``key``, ``state``) as attributes,
and some say more: ``path`` (:class:`UnsafeValue`, :class:`InvalidInput`); ``option``,
``phrase``, ``missing`` and ``tool`` (:class:`InvalidInput`); ``status`` (:class:`Rejected`,
:class:`KeyConflict`, ``AmbiguousResponse``); ``not_before`` (:class:`StillInFlight`);
``command`` (:class:`ApprovalRequired`). Each
is declared on its class, typed, None where not known, and given to the constructor as the
keyword of its name. Every error survives pickling with all of them, so it can cross a
process boundary intact.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

__all__ = [
    "ApprovalRequired",
    "Error",
    "InvalidInput",
    "JournalCorrupt",
    "JournalError",
    "JournalFull",
    "JournalReadOnly",
    "JournalUnreachable",
    "KeyConflict",
    "LeaseLost",
    "NoCurrentTask",
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

    Attributes, each None where not known:

    - ``task_id``: the task the error is about.
    - ``key``: the operation key it is about.
    - ``state``: the operation's state when it was raised, by name (``"FAILED"``).

    ``message`` is the text ``str(error)`` gives.
    """

    #: The constructor's keyword arguments, each kept as the attribute of its name: what
    #: pickling carries across. A subclass that declares more extends it.
    _context_names: ClassVar[tuple[str, ...]] = ("task_id", "key", "state")

    message: str
    task_id: str | None = None
    key: str | None = None
    state: str | None = None

    def __init__(
        self,
        message: str,
        *,
        task_id: str | None = None,
        key: str | None = None,
        state: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.task_id = task_id
        self.key = key
        self.state = state

    def __reduce__(self) -> tuple[Any, ...]:
        # Keyword-only context would be lost by the default Exception pickling.
        return (_rebuild, (type(self), self.message, self._context()))

    def _context(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._context_names}

    def __str__(self) -> str:
        return self.message


def _rebuild(cls: type[Error], message: str, context: dict[str, Any]) -> Error:
    return cls(message, **context)


class InvalidInput(Error, ValueError):
    """An argument is not acceptable; the message names it. Nothing was written.

    Besides ``task_id``, ``key`` and ``state``, where they apply (None otherwise):

    - ``option``: the keyword argument or setting at fault (``"key_retention"``,
      ``"lease_ttl"``, ``"create"``).
    - ``path``: where in a value the fault is (``"note"``, ``"actor"``).
    - ``phrase``: when ``resolve`` refused an outcome that risks a duplicate or a lost
      effect, the words that accept the risk (``accept_risk=True``; the CLI's ``--confirm``).
    - ``missing``: when ``resolve(key, "confirmed")`` came without receipt fields the
      effect keeps, their names.
    - ``tool``: in an MCP proxy policy, the tool whose entry is at fault.
    """

    _context_names = (*Error._context_names, "option", "path", "phrase", "missing", "tool")

    option: str | None = None
    path: str | None = None
    phrase: str | None = None
    missing: tuple[str, ...] | None = None
    tool: str | None = None

    def __init__(
        self,
        message: str,
        *,
        option: str | None = None,
        path: str | None = None,
        phrase: str | None = None,
        missing: Sequence[str] | None = None,
        tool: str | None = None,
        task_id: str | None = None,
        key: str | None = None,
        state: str | None = None,
    ) -> None:
        super().__init__(message, task_id=task_id, key=key, state=state)
        self.option = option
        self.path = path
        self.phrase = phrase
        self.missing = None if missing is None else tuple(missing)
        self.tool = tool


class UnsafeValue(Error, ValueError):
    """A value to be stored looks like a credential or exceeds the size bound.

    ``path`` names where in the value it was found, e.g. ``state.user.password`` (None only
    when the raiser did not say). Nothing was written; the previous checkpoint is unchanged.
    """

    _context_names = (*Error._context_names, "path")

    path: str | None = None

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        task_id: str | None = None,
        key: str | None = None,
        state: str | None = None,
    ) -> None:
        super().__init__(message, task_id=task_id, key=key, state=state)
        self.path = path


class _WithStatus(Error):
    """An error that may carry the service's status code (``status``: an HTTP status, an
    SMTP reply code, a NATS error code; None where there was none). The base of
    :class:`Rejected`, :class:`KeyConflict` and ``AmbiguousResponse``: one declaration of
    the attribute, its keyword and its pickling."""

    _context_names = (*Error._context_names, "status")

    status: int | None = None

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        task_id: str | None = None,
        key: str | None = None,
        state: str | None = None,
    ) -> None:
        super().__init__(message, task_id=task_id, key=key, state=state)
        self.status = status


class KeyConflict(_WithStatus):
    """An operation key is already recorded with other arguments or for another effect.

    ``status`` is the service's status code when it was the service that refused the reused
    key (HTTP 422, an S3 412); None when the journal found the conflict itself, and on a
    replay of a recorded conflict.
    """


class UnknownOperation(Error, LookupError):
    """No operation with this key exists in the journal."""


class Rejected(_WithStatus):
    """Raised by an effect's submit when the service said the request was not applied.

    The operation becomes FAILED. Its message is kept in the journal (scrubbed of anything
    credential-like, and bounded), and ``task.run`` raises a Rejected again on replay, whose
    message includes it. ``status`` is the service's status code where the submit knows it
    (an HTTP 4xx, an SMTP 5xx reply, a NATS error code); None otherwise, and on a replay.
    """

    def __init__(
        self,
        message: str = "rejected by the service",
        *,
        status: int | None = None,
        task_id: str | None = None,
        key: str | None = None,
        state: str | None = None,
    ) -> None:
        super().__init__(message, status=status, task_id=task_id, key=key, state=state)


class OutcomeUnknown(Error):
    """The operation is UNRESOLVED: it may or may not have taken effect.

    It is never sent again automatically. Resolve it with ``journal.resolve(key, ...)`` or
    ``intentlog resolve KEY``.
    """


class ApprovalRequired(Error):
    """The operation needs a person's approval before its first send, and has none yet.

    Its intent is journaled (PLANNED, with the arguments the approver is shown) and nothing
    was sent. ``command`` is what a person runs to approve it (``intentlog approve KEY``;
    ``intentlog deny KEY`` refuses it); ``task_id`` and ``key`` name it. Once approved,
    running the same call again (same task, same arguments) sends it, once.
    """

    _context_names = (*Error._context_names, "command")

    command: str | None = None

    def __init__(
        self,
        message: str,
        *,
        command: str | None = None,
        task_id: str | None = None,
        key: str | None = None,
        state: str | None = None,
    ) -> None:
        super().__init__(message, task_id=task_id, key=key, state=state)
        self.command = command


class StillInFlight(Error):
    """The decision is to wait (a request may still land) and the wait bound ran out.

    ``not_before`` is the store-clock time (seconds since the epoch) from which the next step
    can be decided; ``task.run`` always sets it.
    """

    _context_names = (*Error._context_names, "not_before")

    not_before: float | None = None

    def __init__(
        self,
        message: str,
        *,
        not_before: float | None = None,
        task_id: str | None = None,
        key: str | None = None,
        state: str | None = None,
    ) -> None:
        super().__init__(message, task_id=task_id, key=key, state=state)
        self.not_before = not_before


class TaskBusy(Error):
    """Another live worker holds the task's lease and did not release it in time."""


class LeaseLost(Error):
    """This worker's lease on the task was taken over; the write was refused (fencing)."""


class NoCurrentTask(Error):
    """A function decorated with ``@intentlog.journaled`` was called where no task is current
    (outside ``with journal.task(...)``, in another thread, or in an asyncio task not started
    inside the block), or ``intentlog.current_key()`` was asked outside such a function's
    body. The message names the function; nothing was journaled or sent."""


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


class JournalUnreachable(JournalError):
    """The journal's database server could not be reached (its connection was lost, or no
    connection could be made) for as long as the store waits (PostgreSQL: its ``timeout``).
    The message says whether a write was cut off in flight, and so may or may not be
    recorded; the journal never acts on such a write (an intent not known to be durable is
    not sent). A later call may succeed once the server is back: a worker waits and claims
    again."""


class SchemaTooNew(JournalError):
    """The journal's schema is newer than this version of intentlog understands."""


def install_hint(extra: str) -> str:
    """The command that installs the optional ``extra``, for an error that names it.

    intentlog is installed from its clone until it is published, so the clone's command comes
    first and the published name beside it."""
    return (
        f"pip install -e '.[{extra}]' in intentlog's clone "
        f"(pip install 'intentlog[{extra}]' once it is published)"
    )
