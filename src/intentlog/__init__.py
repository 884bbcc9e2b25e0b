"""intentlog: a durable journal of intents and receipts around external side effects.

Before an external action it records the intent (a stable operation key), submits with that key
as the idempotency key, records the receipt after confirmation, and after a crash reconciles
with the service before it would ever send again. Where nothing can settle an outcome it says
UNRESOLVED and never duplicates the effect automatically.
"""

from intentlog._async import AsyncJournal, AsyncTask, open_async
from intentlog._check import Finding, check
from intentlog._decide import Decision, decide
from intentlog._effect import Effect, EffectOptions, effect
from intentlog._errors import (
    Error,
    InvalidInput,
    JournalCorrupt,
    JournalError,
    JournalFull,
    JournalReadOnly,
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
    NotFound,
    Operation,
    Outcome,
    Policy,
    State,
    TaskRecord,
)
from intentlog._options import JournalOptions, Options
from intentlog._service import FOREVER, PROCESS, KeyPlace, Replay, Retention, Service
from intentlog._task import Task
from intentlog._worker import Registry, Worker

__version__ = "0.1.0"

__all__ = [
    "FOREVER",
    "PROCESS",
    "REDACTED",
    "Action",
    "AsyncJournal",
    "AsyncTask",
    "BlockingCallWarning",
    "Decision",
    "Effect",
    "EffectOptions",
    "Error",
    "Finding",
    "Found",
    "Indeterminate",
    "InvalidInput",
    "Journal",
    "JournalCorrupt",
    "JournalError",
    "JournalFull",
    "JournalOptions",
    "JournalReadOnly",
    "KeyConflict",
    "KeyPlace",
    "LeaseLost",
    "NotFound",
    "Operation",
    "Options",
    "Outcome",
    "OutcomeUnknown",
    "Pending",
    "Policy",
    "ReceiptWarning",
    "Recovered",
    "Registry",
    "Rejected",
    "Replay",
    "Retention",
    "SchemaTooNew",
    "Service",
    "State",
    "StillInFlight",
    "Task",
    "TaskBusy",
    "TaskInfo",
    "TaskRecord",
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
