"""Stored responses: a small interface, and an embedded SQLite store so responses survive a restart.

The interface is what the Responses routes need and no more, so a shared database can later serve several
replicas. SQLite runs on one worker thread (never on the event loop); each save is one transaction, so a crash
leaves either the old record or the new one, never half of one.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

T = TypeVar("T")
UNFINISHED = ("queued", "in_progress")


@dataclass
class StoredResponse:
    resource: dict[str, Any]  # the response object, as GET /v1/responses/{id} returns it
    input_items: list[dict[str, Any]]  # the request's own input items, with ids

    @property
    def id(self) -> str:
        return self.resource["id"]


class ResponseStore(Protocol):
    async def save(self, record: StoredResponse) -> None: ...

    async def load(self, response_id: str) -> StoredResponse | None: ...

    async def delete(self, response_id: str) -> bool: ...

    async def history(self, response_id: str) -> list[dict[str, Any]] | None:
        """Input and output items of the chain of responses ending at `response_id`, oldest first."""
        ...

    async def items(self, item_ids: list[str]) -> dict[str, dict[str, Any]]:
        """Stored items (input or output) by id; ids not found are left out."""
        ...

    async def unfinished(self) -> list[str]:
        """Ids of responses saved as queued or in progress."""
        ...

    async def close(self) -> None: ...


_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    previous_response_id TEXT,
    status TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    resource TEXT NOT NULL,
    input_items TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS items (
    response_id TEXT NOT NULL,
    id TEXT NOT NULL,
    item TEXT NOT NULL,
    PRIMARY KEY (response_id, id)
);
-- Clients replay earlier output items, ids and all, as input: one id can belong to several responses.
CREATE INDEX IF NOT EXISTS items_by_id ON items (id);
"""


class SQLiteResponseStore:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._path = path
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="response-store")
        self._db = self._worker.submit(self._open).result()

    def _open(self) -> sqlite3.Connection:
        db = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.executescript(_SCHEMA)
        return db

    async def _run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._worker, work, self._db)

    async def save(self, record: StoredResponse) -> None:
        resource = record.resource
        items = [*record.input_items, *resource.get("output", [])]

        def write(db: sqlite3.Connection) -> None:
            with _transaction(db):
                db.execute(
                    "INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?, ?)",
                    (record.id, resource.get("previous_response_id"), resource["status"], resource["created_at"],
                     json.dumps(resource), json.dumps(record.input_items)),
                )
                db.execute("DELETE FROM items WHERE response_id = ?", (record.id,))
                db.executemany(
                    "INSERT OR REPLACE INTO items VALUES (?, ?, ?)",
                    [(record.id, item["id"], json.dumps(item)) for item in items if item.get("id")],
                )

        await self._run(write)

    async def load(self, response_id: str) -> StoredResponse | None:
        def read(db: sqlite3.Connection) -> tuple[str, str] | None:
            return db.execute("SELECT resource, input_items FROM responses WHERE id = ?", (response_id,)).fetchone()

        row = await self._run(read)
        return StoredResponse(json.loads(row[0]), json.loads(row[1])) if row else None

    async def delete(self, response_id: str) -> bool:
        def remove(db: sqlite3.Connection) -> bool:
            with _transaction(db):
                db.execute("DELETE FROM items WHERE response_id = ?", (response_id,))
                return db.execute("DELETE FROM responses WHERE id = ?", (response_id,)).rowcount > 0

        return await self._run(remove)

    async def history(self, response_id: str) -> list[dict[str, Any]] | None:
        def read(db: sqlite3.Connection) -> list[tuple[str, str]]:
            return db.execute(
                """WITH RECURSIVE chain(id, previous, depth) AS (
                       SELECT id, previous_response_id, 0 FROM responses WHERE id = ?
                       UNION ALL
                       SELECT r.id, r.previous_response_id, c.depth + 1
                       FROM responses r JOIN chain c ON r.id = c.previous)
                   SELECT r.input_items, r.resource FROM chain c JOIN responses r ON r.id = c.id
                   ORDER BY c.depth DESC""",
                (response_id,),
            ).fetchall()

        rows = await self._run(read)
        if not rows:
            return None
        items: list[dict[str, Any]] = []
        for input_items, resource in rows:
            items += json.loads(input_items) + json.loads(resource)["output"]
        return items

    async def items(self, item_ids: list[str]) -> dict[str, dict[str, Any]]:
        def read(db: sqlite3.Connection) -> list[tuple[str, str]]:
            rows = []
            for start in range(0, len(item_ids), 500):  # SQLite caps the variables of one statement
                chunk = item_ids[start : start + 500]
                marks = ",".join("?" * len(chunk))
                rows += db.execute(f"SELECT id, item FROM items WHERE id IN ({marks})", chunk).fetchall()
            return rows

        return {item_id: json.loads(item) for item_id, item in await self._run(read)} if item_ids else {}

    async def unfinished(self) -> list[str]:
        def read(db: sqlite3.Connection) -> list[tuple[str]]:
            return db.execute("SELECT id FROM responses WHERE status IN (?, ?)", UNFINISHED).fetchall()

        return [row[0] for row in await self._run(read)]

    async def close(self) -> None:
        await self._run(lambda db: db.close())
        self._worker.shutdown(wait=True)


class _transaction:
    """BEGIN IMMEDIATE ... COMMIT, or ROLLBACK on any error: one save is all or nothing."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, kind: object, error: object, trace: object) -> None:
        self._db.execute("COMMIT" if kind is None else "ROLLBACK")
