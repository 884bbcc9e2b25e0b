"""``intentlog mcp``: a journaling proxy in front of any MCP server.

Put it between an agent (an MCP client) and an MCP server: every ``tools/call`` of a tool
that changes something gets its intent journaled before it is forwarded and its result
recorded as the receipt; after a crash, the same call is answered from the receipt,
reconciled through the server's own read tool, resent with the same key where the server
deduplicates, or answered UNRESOLVED (never sent twice). Everything else passes through
unchanged. See docs/mcp.md.
"""

from intentlog.proxy._lookups import NOT_FOUND, Hit, Verdict
from intentlog.proxy._policy import (
    Lookup,
    OnError,
    ProxyFile,
    ToolPolicy,
    default_policy,
    load_tools,
    parse_tools,
)
from intentlog.proxy._serve import ProxyConfig, serve

__all__ = [
    "NOT_FOUND",
    "Hit",
    "Lookup",
    "OnError",
    "ProxyConfig",
    "ProxyFile",
    "ToolPolicy",
    "Verdict",
    "default_policy",
    "load_tools",
    "parse_tools",
    "serve",
]
