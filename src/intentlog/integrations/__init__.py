"""Ready-made effects for common services, and adapters that journal what the tools and steps
of agent and workflow frameworks do.

- Effects: ``http`` (HTTP APIs, with httpx), ``nats`` (NATS JetStream, with nats-py), ``aws``
  (S3 conditional puts, SQS FIFO sends and SES mail, with boto3) and ``smtp`` (mail, with
  smtplib). Each builder declares what its service can do (deduplicate on the key, for how
  long; be asked about a key) so the decision can settle a lost answer without a duplicate.
- Framework adapters: each module is only its framework's seam over ``kernel``, which holds
  what they share (a tool call as a journaled operation): ``agent_framework``, ``agno``,
  ``crewai``, ``google_adk``, ``langgraph``, ``openai_agents`` and ``pydantic_ai`` (tools),
  ``mcp_server`` (your own MCP server's tools), and ``dbos``, ``prefect``, ``restate`` and
  ``temporal`` (steps of durable workflows).

This package itself holds what the effects share: :class:`AmbiguousResponse`, a call's body,
and the import of an optional library. Importing it imports no third-party library; each
submodule imports its own only when used, and says which extra to install when it is missing.
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
