"""intentlog: a durable journal of intents and receipts around external side effects.

Before an external action it records the intent (a stable operation key), submits with that key
as the idempotency key, records the receipt after confirmation, and after a crash reconciles
with the service before it would ever send again. Where nothing can settle an outcome it says
UNRESOLVED and never duplicates the effect automatically.
"""

from intentlog._async import AsyncJournal, AsyncTask, AsyncTaskOpening, open_async
from intentlog._check import Finding, FindingKind, check
from intentlog._decide import Decision, Doer, LookupFailed, Outlook, decide
from intentlog._effect import Effect, EffectOptions, ReceiptSelector, Reconcile, Submit, effect
from intentlog._errors import (
    Error,
    InvalidInput,
    JournalCorrupt,
    JournalError,
    JournalFull,
    JournalReadOnly,
    JournalUnreachable,
    KeyConflict,
    LeaseLost,
    OutcomeUnknown,
    Rejected,
    SchemaTooNew,
    StillInFlight,
    TaskBusy,
    UnknownOperation,
    UnsafeValue,
)
from intentlog._hygiene import REDACTED, ReceiptWarning
from intentlog._journal import BlockingCallWarning, Journal, Pending, Recovered, TaskInfo, open
from intentlog._model import (
    Action,
    Found,
    Indeterminate,
    LookupResult,
    NotFound,
    Operation,
    Outcome,
    OutcomeName,
    Policy,
    State,
    TaskRecord,
)
from intentlog._options import JournalOptions, Options
from intentlog._service import (
    FOREVER,
    PROCESS,
    AnswerError,
    BodyPath,
    Encoding,
    KeyKind,
    KeyPlace,
    KeyReuse,
    LookupKind,
    MarkerPlace,
    Replay,
    Retention,
    Search,
    Seconds,
    Service,
)
from intentlog._task import Task
from intentlog._worker import Registry, TaskFunction, Worker
from intentlog.stores._base import Resolution, TaskResolution

__version__ = "0.1.0"

__all__ = [
    "FOREVER",
    "PROCESS",
    "REDACTED",
    "Action",
    "AnswerError",
    "AsyncJournal",
    "AsyncTask",
    "AsyncTaskOpening",
    "BlockingCallWarning",
    "BodyPath",
    "Decision",
    "Doer",
    "Effect",
    "EffectOptions",
    "Encoding",
    "Error",
    "Finding",
    "FindingKind",
    "Found",
    "Indeterminate",
    "InvalidInput",
    "Journal",
    "JournalCorrupt",
    "JournalError",
    "JournalFull",
    "JournalOptions",
    "JournalReadOnly",
    "JournalUnreachable",
    "KeyConflict",
    "KeyKind",
    "KeyPlace",
    "KeyReuse",
    "LeaseLost",
    "LookupFailed",
    "LookupKind",
    "LookupResult",
    "MarkerPlace",
    "NotFound",
    "Operation",
    "Options",
    "Outcome",
    "OutcomeName",
    "OutcomeUnknown",
    "Outlook",
    "Pending",
    "Policy",
    "ReceiptSelector",
    "ReceiptWarning",
    "Reconcile",
    "Recovered",
    "Registry",
    "Rejected",
    "Replay",
    "Resolution",
    "Retention",
    "SchemaTooNew",
    "Search",
    "Seconds",
    "Service",
    "State",
    "StillInFlight",
    "Submit",
    "Task",
    "TaskBusy",
    "TaskFunction",
    "TaskInfo",
    "TaskRecord",
    "TaskResolution",
    "UnknownOperation",
    "UnsafeValue",
    "Worker",
    "__version__",
    "check",
    "decide",
    "effect",
    "open",
    "open_async",
]
