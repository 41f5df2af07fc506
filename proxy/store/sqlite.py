"""The embedded store: one SQLite file, the default (`--store-path`).

SQLite runs on one worker thread (never on the event loop). Several server processes (`--workers`) may open the
same file: WAL lets readers go on while one process writes, writers wait for each other (busy timeout) instead of
failing, and every read is one statement or one read transaction, so it sees whole saves only. The schema's
version is SQLite's `user_version`.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from proxy.store.base import (
    UNFINISHED,
    DuplicateItem,
    OnOperation,
    StoredResponse,
    chain_items,
    conversation_object,
    loads,
    new_owner,
)
from proxy.store.sqlite_schema import MIGRATIONS

T = TypeVar("T")
BUSY_TIMEOUT = 30.0  # seconds a write waits for another process's write; it waits on the store thread, not the loop


# Literal statuses, matching the partial index's condition so that SQLite uses it.
_UNFINISHED = """SELECT r.id, j.heartbeat FROM responses r LEFT JOIN jobs j ON j.response_id = r.id
                 WHERE r.status IN ('queued', 'in_progress')"""
_ABANDONED = """SELECT j.heartbeat, r.resource, r.input_items, coalesce(j.cancel_requested, 0)
                FROM responses r LEFT JOIN jobs j ON j.response_id = r.id
                WHERE r.id = ? AND r.status IN ('queued', 'in_progress')"""


class SQLiteResponseStore:
    def __init__(self, path: Path, on_operation: OnOperation | None = None) -> None:
        """`on_operation(name, seconds, ok)` is told each operation's latency, queueing included (the metrics)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        self._path = path
        self._on_operation = on_operation
        self.owner = new_owner()
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="response-store")
        self._db = self._worker.submit(self._open).result()

    def _open(self) -> sqlite3.Connection:
        db = sqlite3.connect(self._path, timeout=BUSY_TIMEOUT, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        with _transaction(db):  # one process creates or migrates the schema while the others wait
            version = db.execute("PRAGMA user_version").fetchone()[0]
            for number, migration in enumerate(MIGRATIONS[version:], start=version + 1):
                for statement in migration.split(";"):
                    db.execute(statement)
                db.execute(f"PRAGMA user_version = {number}")
        return db

    async def open(self) -> None:
        """Opened when made: the file is local, and the schema is ready before the server starts."""

    async def _run(self, operation: str, work: Callable[[sqlite3.Connection], T]) -> T:
        started = time.perf_counter()
        try:
            result = await asyncio.get_running_loop().run_in_executor(self._worker, work, self._db)
        except Exception:
            if self._on_operation is not None:
                self._on_operation(operation, time.perf_counter() - started, False)
            raise
        if self._on_operation is not None:
            self._on_operation(operation, time.perf_counter() - started, True)
        return result

    async def check(self) -> None:
        await self._run("check", lambda db: db.execute("SELECT 1").fetchone())

    async def save(self, record: StoredResponse) -> None:
        def write(db: sqlite3.Connection) -> None:
            with _transaction(db):
                self._write(db, record)

        await self._run("save", write)

    async def save_owned(self, record: StoredResponse) -> bool:
        def write(db: sqlite3.Connection) -> bool:
            with _transaction(db):
                owned = db.execute("SELECT 1 FROM jobs WHERE response_id = ? AND owner = ?",
                                   (record.id, self.owner)).fetchone()
                if owned:
                    self._write(db, record)
                return owned is not None

        return await self._run("save", write)

    def _write(self, db: sqlite3.Connection, record: StoredResponse) -> None:
        resource = record.resource
        items = [*record.input_items, *resource.get("output", [])]
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
        db.executemany("INSERT OR IGNORE INTO response_events VALUES (?, ?, ?)",
                       [(record.id, number, frame) for number, frame in record.events])
        if resource["status"] in UNFINISHED:
            db.execute(
                """INSERT INTO jobs VALUES (?, ?, ?, 0)
                   ON CONFLICT (response_id) DO UPDATE SET heartbeat = excluded.heartbeat
                   WHERE owner = excluded.owner""",
                (record.id, self.owner, time.time()),
            )
        else:
            db.execute("DELETE FROM jobs WHERE response_id = ?", (record.id,))
            conversation = resource.get("conversation")
            if conversation:  # an item already there (a repeated final save) stays where it is
                db.executemany(
                    """INSERT OR IGNORE INTO conversation_items (conversation_id, id, item)
                       SELECT ?, ?, ? WHERE EXISTS (SELECT 1 FROM conversations WHERE id = ?)""",
                    [(conversation["id"], item["id"], json.dumps(item), conversation["id"])
                     for item in items if item.get("id")],
                )

    async def load(self, response_id: str) -> StoredResponse | None:
        def read(db: sqlite3.Connection) -> tuple[str, str] | None:
            return db.execute("SELECT resource, input_items FROM responses WHERE id = ?", (response_id,)).fetchone()

        row = await self._run("load", read)
        return StoredResponse(loads(row[0]), loads(row[1])) if row else None

    async def delete(self, response_id: str) -> bool:
        def remove(db: sqlite3.Connection) -> bool:
            with _transaction(db):
                db.execute("DELETE FROM items WHERE response_id = ?", (response_id,))
                db.execute("DELETE FROM jobs WHERE response_id = ?", (response_id,))
                db.execute("DELETE FROM response_events WHERE response_id = ?", (response_id,))
                return db.execute("DELETE FROM responses WHERE id = ?", (response_id,)).rowcount > 0

        return await self._run("delete", remove)

    async def events(self, response_id: str, after: int) -> tuple[str | None, list[str]]:
        def read(db: sqlite3.Connection) -> tuple[str | None, list[str]]:
            row = db.execute("SELECT status FROM responses WHERE id = ?", (response_id,)).fetchone()
            frames = db.execute("""SELECT frame FROM response_events WHERE response_id = ? AND sequence_number > ?
                                   ORDER BY sequence_number""", (response_id, after)).fetchall()
            return (row[0] if row else None), [frame for (frame,) in frames]

        return await self._run("events", read)

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

        return chain_items(await self._run("history", read))

    async def items(self, item_ids: list[str]) -> dict[str, dict[str, Any]]:
        def read(db: sqlite3.Connection) -> list[tuple[str, str]]:
            rows = []
            db.execute("BEGIN")  # one snapshot for all the chunks
            try:
                for start in range(0, len(item_ids), 500):  # SQLite caps the variables of one statement
                    chunk = item_ids[start : start + 500]
                    marks = ",".join("?" * len(chunk))
                    rows += db.execute(f"SELECT id, item FROM items WHERE id IN ({marks})", chunk).fetchall()
            finally:
                db.execute("COMMIT")
            return rows

        return {item_id: loads(item) for item_id, item in await self._run("items", read)} if item_ids else {}

    async def request_cancel(self, response_id: str) -> bool:
        def write(db: sqlite3.Connection) -> bool:
            return db.execute("UPDATE jobs SET cancel_requested = 1 WHERE response_id = ?", (response_id,)).rowcount > 0

        return await self._run("request_cancel", write)

    async def cancel_requests(self) -> list[str]:
        def read(db: sqlite3.Connection) -> list[tuple[str]]:
            return db.execute("SELECT response_id FROM jobs WHERE owner = ? AND cancel_requested",
                              (self.owner,)).fetchall()

        return [row[0] for row in await self._run("cancel_requests", read)]

    async def renew(self) -> None:
        await self._run("renew", lambda db: db.execute("UPDATE jobs SET heartbeat = ? WHERE owner = ?",
                                                       (time.time(), self.owner)))

    async def heartbeats(self) -> dict[str, float | None]:
        return await self._run("heartbeats", lambda db: dict(db.execute(_UNFINISHED).fetchall()))

    async def end_abandoned(self, stale: dict[str, float | None],
                            end: Callable[[StoredResponse, bool], None]) -> list[str]:
        def sweep(db: sqlite3.Connection) -> list[str]:
            ended = []
            with _transaction(db):  # look again: an owner may have renewed or saved in between
                for response_id, heartbeat in stale.items():
                    row = db.execute(_ABANDONED, (response_id,)).fetchone()
                    if row is None or row[0] != heartbeat:
                        continue
                    record = StoredResponse(loads(row[1]), loads(row[2]))
                    end(record, bool(row[3]))
                    self._write(db, record)
                    ended.append(response_id)
            return ended

        return await self._run("end_abandoned", sweep)

    async def close(self) -> None:
        def release(db: sqlite3.Connection) -> None:
            db.execute("DELETE FROM jobs WHERE owner = ?", (self.owner,))
            db.close()

        await self._run("close", release)
        self._worker.shutdown(wait=True)

    async def create_conversation(self, conversation: dict[str, Any], items: list[dict[str, Any]]) -> None:
        def write(db: sqlite3.Connection) -> None:
            with _transaction(db):
                db.execute("INSERT INTO conversations VALUES (?, ?, ?)",
                           (conversation["id"], conversation["created_at"], json.dumps(conversation["metadata"])))
                _append(db, conversation["id"], items)

        await self._run("create_conversation", write)

    async def load_conversation(self, conversation_id: str) -> dict[str, Any] | None:
        row = await self._run("load_conversation", lambda db: db.execute(
            "SELECT id, created_at, metadata FROM conversations WHERE id = ?", (conversation_id,)).fetchone())
        return _conversation(*row) if row else None

    async def update_conversation(self, conversation_id: str, metadata: dict[str, str]) -> dict[str, Any] | None:
        def write(db: sqlite3.Connection) -> tuple[str, int, str] | None:
            return db.execute("UPDATE conversations SET metadata = ? WHERE id = ? RETURNING id, created_at, metadata",
                              (json.dumps(metadata), conversation_id)).fetchone()

        row = await self._run("update_conversation", write)
        return _conversation(*row) if row else None

    async def delete_conversation(self, conversation_id: str) -> bool:
        def remove(db: sqlite3.Connection) -> bool:
            with _transaction(db):
                db.execute("DELETE FROM conversation_items WHERE conversation_id = ?", (conversation_id,))
                return db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,)).rowcount > 0

        return await self._run("delete_conversation", remove)

    async def add_conversation_items(self, conversation_id: str, items: list[dict[str, Any]]) -> bool:
        def write(db: sqlite3.Connection) -> bool:
            with _transaction(db):
                if not db.execute("SELECT 1 FROM conversations WHERE id = ?", (conversation_id,)).fetchone():
                    return False
                _append(db, conversation_id, items)
                return True

        return await self._run("add_conversation_items", write)

    async def conversation_items(self, conversation_id: str, after: str | None = None, limit: int | None = None,
                                 newest_first: bool = False) -> list[dict[str, Any]] | None:
        direction, beyond = ("DESC", "<") if newest_first else ("ASC", ">")
        query = f"SELECT item FROM conversation_items WHERE conversation_id = ?{{}} ORDER BY position {direction}"
        after_clause = (f" AND position {beyond} (SELECT position FROM conversation_items"
                        " WHERE conversation_id = ? AND id = ?)")

        def read(db: sqlite3.Connection) -> list[tuple[str]] | None:
            db.execute("BEGIN")  # one snapshot: the conversation and its items
            try:
                if not db.execute("SELECT 1 FROM conversations WHERE id = ?", (conversation_id,)).fetchone():
                    return None
                if after is None:
                    sql, values = query.format(""), [conversation_id]
                else:
                    sql, values = query.format(after_clause), [conversation_id, conversation_id, after]
                if limit is not None:
                    sql, values = sql + " LIMIT ?", [*values, limit]
                return db.execute(sql, values).fetchall()
            finally:
                db.execute("COMMIT")

        rows = await self._run("conversation_items", read)
        return None if rows is None else [loads(row[0]) for row in rows]

    async def conversation_item(self, conversation_id: str, item_id: str) -> dict[str, Any] | None:
        row = await self._run("conversation_item", lambda db: db.execute(
            "SELECT item FROM conversation_items WHERE conversation_id = ? AND id = ?",
            (conversation_id, item_id)).fetchone())
        return loads(row[0]) if row else None

    async def delete_conversation_item(self, conversation_id: str, item_id: str) -> bool:
        return await self._run("delete_conversation_item", lambda db: db.execute(
            "DELETE FROM conversation_items WHERE conversation_id = ? AND id = ?",
            (conversation_id, item_id)).rowcount > 0)


def _append(db: sqlite3.Connection, conversation_id: str, items: list[dict[str, Any]]) -> None:
    for item in items:
        try:
            db.execute("INSERT INTO conversation_items (conversation_id, id, item) VALUES (?, ?, ?)",
                       (conversation_id, item["id"], json.dumps(item)))
        except sqlite3.IntegrityError:  # the transaction rolls back: nothing is added
            raise DuplicateItem(item["id"]) from None


def _conversation(conversation_id: str, created_at: int, metadata: str) -> dict[str, Any]:
    return conversation_object(conversation_id, created_at, loads(metadata))


class _transaction:
    """BEGIN IMMEDIATE ... COMMIT, or ROLLBACK on any error: one save is all or nothing."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, kind: object, error: object, trace: object) -> None:
        self._db.execute("COMMIT" if kind is None else "ROLLBACK")
