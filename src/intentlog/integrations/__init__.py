"""Ready-made effects for common services: ``intentlog.integrations.http`` (HTTP APIs, with
httpx), ``intentlog.integrations.nats`` (NATS JetStream, with nats-py),
``intentlog.integrations.aws`` (S3 conditional puts and SQS FIFO sends, with boto3) and
``intentlog.integrations.smtp`` (mail, with smtplib).

Each builder declares what its service can do (deduplicate on the key, for how long; be asked
about a key) so the decision can settle a lost answer without a duplicate. Importing this
package imports no third-party library; each submodule imports its own lazily and says which
extra to install when it is missing.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from intentlog._errors import _WithStatus, install_hint

__all__ = ["AmbiguousResponse"]


class AmbiguousResponse(_WithStatus):
    """The service's answer (or its absence) does not tell whether the request was applied.

    Raised by an integration's submit for a timeout, a dropped connection, a 5xx, or a 2xx
    that is not the answer it promised (malformed JSON, missing receipt fields). It is not
    :class:`intentlog.Rejected`, on purpose: the operation stays SUBMITTED and the decision
    settles it by lookup, or by resending the same key where the service deduplicates, or
    makes it UNRESOLVED; it is never taken as "not applied". ``status`` is the service's
    status code when there was one (an HTTP status, a NATS error code; None for a transport
    failure), besides the ``task_id``, ``key`` and ``state`` of every :class:`intentlog.Error`.
    """


def _call_body(kwargs: dict[str, Any]) -> Any:
    """The message body of a call: ``run(effect, json=value)`` sends ``value`` (any JSON),
    ``run(effect, **fields)`` sends the object of the fields."""
    if set(kwargs) == {"json"}:
        return kwargs["json"]
    return kwargs


def _require(module: str, extra: str) -> ModuleType:
    """Import an optional dependency, or say which extra installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"intentlog.integrations.{extra} needs {module}: {install_hint(extra)}"
        ) from exc
