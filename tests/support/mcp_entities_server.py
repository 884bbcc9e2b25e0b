"""A real MCP server (the MCP SDK) whose tools take arrays and write files, shaped like the
reference servers server-memory and server-filesystem, for the proxy's lookup tests.

    python tests/support/mcp_entities_server.py --ledger PATH --root DIR

- ``create_entities(entities)``: every call inserts each entity as a new row of the SQLite
  ledger (it does not deduplicate), as server-memory's tool of that name takes a list.
- ``open_nodes(names)`` (read-only): the entities with those names, ``{"entities": [...]}``.
- ``search_nodes(query)`` (read-only): the entities whose name or type holds ``query``
  (case-insensitive), as server-memory's tool of that name answers: "Ada" finds "Adam".
- ``find_node(name)`` (read-only): ``{"node": {...}}`` for the first entity of that name,
  ``{"node": null}`` when there is none.
- ``write_file(path, content)``: replaces the file under ``DIR``; ``edit_file(path, old,
  new)``: replaces text in it; ``read_file(path)`` (read-only): its text.
"""

from __future__ import annotations

import argparse
import contextlib
import sqlite3
import sys
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations
from pydantic import BaseModel

WRITE = ToolAnnotations(readOnlyHint=False, idempotentHint=False, destructiveHint=True)
READ = ToolAnnotations(readOnlyHint=True)


class Entity(BaseModel):
    name: str
    entityType: str


def connect(path: str | Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, timeout=30, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE IF NOT EXISTS entities (name TEXT, type TEXT)")
    return conn


def entity_rows(path: str | Path) -> list[tuple[str, str]]:
    """What the server applied: one row per entity created, in order."""
    with contextlib.closing(connect(path)) as conn:
        return list(conn.execute("SELECT name, type FROM entities ORDER BY rowid"))


def build(ledger: str, root: Path) -> MCPServer[Any]:
    app: MCPServer[Any] = MCPServer("entities", log_level="WARNING")
    conn = connect(ledger)

    @app.tool(annotations=WRITE)
    async def create_entities(entities: list[Entity]) -> dict[str, Any]:
        """Create entities (every call creates them again)."""
        for entity in entities:
            conn.execute("INSERT INTO entities VALUES (?, ?)", (entity.name, entity.entityType))
        return {"created": [entity.model_dump() for entity in entities]}

    @app.tool(annotations=READ)
    async def open_nodes(names: list[str]) -> dict[str, Any]:
        """The entities with these names."""
        rows = conn.execute(
            f"SELECT name, type FROM entities WHERE name IN ({','.join('?' * len(names))})",
            names,
        )
        return {"entities": [{"name": n, "entityType": t} for n, t in rows]}

    @app.tool(annotations=READ)
    async def search_nodes(query: str) -> dict[str, Any]:
        """The entities whose name or type holds the query."""
        like = f"%{query.lower()}%"
        rows = conn.execute(
            "SELECT name, type FROM entities WHERE lower(name) LIKE ? OR lower(type) LIKE ?",
            (like, like),
        )
        return {"entities": [{"name": n, "entityType": t} for n, t in rows], "relations": []}

    @app.tool(annotations=READ)
    async def find_node(name: str) -> dict[str, Any]:
        """The first entity of this name, or null."""
        row = conn.execute("SELECT name, type FROM entities WHERE name = ?", (name,)).fetchone()
        return {"node": {"name": row[0], "entityType": row[1]} if row else None}

    @app.tool(annotations=WRITE)
    def write_file(path: str, content: str) -> str:
        """Replace a file's text."""
        (root / path).write_text(content)
        return f"wrote {path}"

    @app.tool(annotations=WRITE)
    def edit_file(path: str, old: str, new: str) -> str:
        """Replace text in a file."""
        target = root / path
        target.write_text(target.read_text().replace(old, new))
        return f"edited {path}"

    @app.tool(annotations=READ)
    def read_file(path: str) -> str:
        """A file's text."""
        return (root / path).read_text()

    return app


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ledger", required=True)
    parser.add_argument("--root", required=True)
    args = parser.parse_args()
    build(args.ledger, Path(args.root)).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
