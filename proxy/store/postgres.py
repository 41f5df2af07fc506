"""The shared store: PostgreSQL (`--store-url postgresql://...`), for replicas on several machines.

psycopg 3's async pool, on the event loop; every operation is one statement or one transaction. Writes about one
response take a transaction-scoped advisory lock on its id (and appends to a conversation one on the conversation's
id), so an owner's save, another replica's cancel request and a sweep of abandoned jobs follow each other as they
do under SQLite's single writer, without serializing unrelated work. Heartbeats use the database's clock, so the
replicas' clocks need not agree. A database that cannot be reached is `StoreUnavailable` (a 503): the pool checks a
connection before lending it and reconnects when the server is back. An outage is logged as two lines, when the
store stops answering (with psycopg's reason) and when it answers again: the pool's own warnings, one per
connection attempt, are kept for that reason instead of logged (`postgres_connection.PoolLog`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from proxy.store.base import (
    UNFINISHED,
    DuplicateItem,
    OnOperation,
    StoredResponse,
    StoreUnavailable,
    Unstorable,
    chain_items,
    conversation_object,
    loads,
    new_owner,
)
from proxy.store.postgres_connection import CONNECT_TIMEOUT, PoolLog, one_line, where
from proxy.store.postgres_schema import MIGRATION_LOCK, MIGRATIONS

T = TypeVar("T")
logger = logging.getLogger("harmony_proxy")
Connection = psycopg.AsyncConnection[Any]
POOL_SIZE = 10
_NOW = "extract(epoch from clock_timestamp())"


_UNFINISHED = """SELECT r.id, j.heartbeat FROM responses r LEFT JOIN jobs j ON j.response_id = r.id
                 WHERE r.status IN ('queued', 'in_progress')"""


class PostgresResponseStore:
    def __init__(self, url: str, on_operation: OnOperation | None = None, pool_size: int = POOL_SIZE) -> None:
        """`on_operation(name, seconds, ok)` is told each operation's latency, waiting for a connection included."""
        self._on_operation = on_operation
        self.owner = new_owner()
        self._where = where(url)
        self._pool = AsyncConnectionPool(url, min_size=1, max_size=pool_size, open=False, timeout=CONNECT_TIMEOUT,
                                         kwargs={"autocommit": True}, check=AsyncConnectionPool.check_connection,
                                         reconnect_timeout=0, name=f"harmony-proxy-{self.owner}")
        self._pool_log = PoolLog(self._pool.name)
        self._down_since: float | None = None  # while the store does not answer: since when (monotonic)

    async def open(self) -> None:
        logging.getLogger("psycopg.pool").addFilter(self._pool_log)
        try:
            await self._pool.open(wait=True, timeout=CONNECT_TIMEOUT * 2)
        except PoolTimeout:
            await self._pool.close()
            logging.getLogger("psycopg.pool").removeFilter(self._pool_log)
            raise StoreUnavailable(f"cannot connect to the PostgreSQL store {self._where}: "
                                   f"{self._pool_log.reason or 'no connection within the time allowed'}") from None
        async with self._pool.connection() as db, db.transaction():
            await db.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            await db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            row = await (await db.execute("SELECT max(version) FROM schema_version")).fetchone()
            version = row[0] or 0
            for number, migration in enumerate(MIGRATIONS[version:], start=version + 1):
                await db.execute(migration)
                await db.execute("INSERT INTO schema_version VALUES (%s)", (number,))

    async def _run(self, operation: str, work: Callable[[Connection], Awaitable[T]]) -> T:
        started = time.perf_counter()
        ok = False
        try:
            async with self._pool.connection() as db:
                result = await work(db)
            ok = True
            return result
        except (psycopg.DataError, psycopg.errors.ProgramLimitExceeded) as exc:
            raise Unstorable(str(exc)) from None
        except (psycopg.OperationalError, PoolTimeout) as exc:
            reason = self._pool_log.reason if isinstance(exc, PoolTimeout) and self._pool_log.reason else one_line(exc)
            if self._down_since is None:
                self._down_since = time.monotonic()
                logger.warning("the PostgreSQL store %s does not answer: %s", self._where, reason)
            raise StoreUnavailable(f"the database cannot be reached: {reason}") from exc
        finally:
            if self._on_operation is not None:
                self._on_operation(operation, time.perf_counter() - started, ok)
            if ok and self._down_since is not None:
                logger.info("the PostgreSQL store %s answers again, after %.1f s", self._where,
                            time.monotonic() - self._down_since)
                self._down_since = None
                self._pool_log.reason = None

    async def _fetchone(self, operation: str, sql: str, values: tuple[Any, ...]) -> tuple[Any, ...] | None:
        async def read(db: Connection) -> tuple[Any, ...] | None:
            return await (await db.execute(sql, values)).fetchone()

        return await self._run(operation, read)

    async def check(self) -> None:
        await self._fetchone("check", "SELECT 1", ())

    async def save(self, record: StoredResponse) -> None:
        async def write(db: Connection) -> None:
            async with db.transaction():
                await _lock(db, record.id)
                await self._write(db, record)

        await self._run("save", write)

    async def save_owned(self, record: StoredResponse) -> bool:
        async def write(db: Connection) -> bool:
            async with db.transaction():
                await _lock(db, record.id)
                owned = await (await db.execute("SELECT 1 FROM jobs WHERE response_id = %s AND owner = %s",
                                                (record.id, self.owner))).fetchone()
                if owned:
                    await self._write(db, record)
                return owned is not None

        return await self._run("save", write)

    async def _write(self, db: Connection, record: StoredResponse) -> None:
        resource = record.resource
        items = [item for item in [*record.input_items, *resource.get("output", [])] if item.get("id")]
        await db.execute(
            """INSERT INTO responses VALUES (%s, %s, %s, %s, %s, %s)
               ON CONFLICT (id) DO UPDATE SET previous_response_id = excluded.previous_response_id,
                   status = excluded.status, created_at = excluded.created_at, resource = excluded.resource,
                   input_items = excluded.input_items""",
            (record.id, resource.get("previous_response_id"), resource["status"], resource["created_at"],
             json.dumps(resource), json.dumps(record.input_items)),
        )
        await db.execute("DELETE FROM items WHERE response_id = %s", (record.id,))
        async with db.cursor() as cursor:
            await cursor.executemany(
                """INSERT INTO items VALUES (%s, %s, %s)
                   ON CONFLICT (response_id, id) DO UPDATE SET item = excluded.item""",
                [(record.id, item["id"], json.dumps(item)) for item in items],
            )
            if record.events:
                await cursor.executemany(
                    "INSERT INTO response_events VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
                    [(record.id, number, frame) for number, frame in record.events],
                )
            if resource["status"] in UNFINISHED:
                await db.execute(
                    f"""INSERT INTO jobs VALUES (%s, %s, {_NOW}, false)
                        ON CONFLICT (response_id) DO UPDATE SET heartbeat = excluded.heartbeat
                        WHERE jobs.owner = excluded.owner""",
                    (record.id, self.owner),
                )
                return
            await db.execute("DELETE FROM jobs WHERE response_id = %s", (record.id,))
            conversation = resource.get("conversation")
            if conversation:  # an item already there (a repeated final save) stays where it is
                await _lock(db, conversation["id"])
                await cursor.executemany(
                    """INSERT INTO conversation_items (conversation_id, id, item)
                       SELECT %s, %s, %s WHERE EXISTS (SELECT 1 FROM conversations WHERE id = %s)
                       ON CONFLICT (conversation_id, id) DO NOTHING""",
                    [(conversation["id"], item["id"], json.dumps(item), conversation["id"]) for item in items],
                )

    async def load(self, response_id: str) -> StoredResponse | None:
        row = await self._fetchone("load", "SELECT resource, input_items FROM responses WHERE id = %s",
                                   (response_id,))
        return StoredResponse(loads(row[0]), loads(row[1])) if row else None

    async def delete(self, response_id: str) -> bool:
        async def remove(db: Connection) -> bool:
            async with db.transaction():
                await _lock(db, response_id)
                await db.execute("DELETE FROM items WHERE response_id = %s", (response_id,))
                await db.execute("DELETE FROM jobs WHERE response_id = %s", (response_id,))
                await db.execute("DELETE FROM response_events WHERE response_id = %s", (response_id,))
                return (await db.execute("DELETE FROM responses WHERE id = %s", (response_id,))).rowcount > 0

        return await self._run("delete", remove)

    async def events(self, response_id: str, after: int) -> tuple[str | None, list[str]]:
        async def read(db: Connection) -> tuple[str | None, list[str]]:
            row = await (await db.execute("SELECT status FROM responses WHERE id = %s", (response_id,))).fetchone()
            frames = await (await db.execute(
                """SELECT frame FROM response_events WHERE response_id = %s AND sequence_number > %s
                   ORDER BY sequence_number""", (response_id, after))).fetchall()
            return (row[0] if row else None), [frame for (frame,) in frames]

        return await self._run("events", read)

    async def history(self, response_id: str) -> list[dict[str, Any]] | None:
        async def read(db: Connection) -> list[tuple[str, str]]:
            return await (await db.execute(
                """WITH RECURSIVE chain(id, previous, depth) AS (
                       SELECT id, previous_response_id, 0 FROM responses WHERE id = %s
                       UNION ALL
                       SELECT r.id, r.previous_response_id, c.depth + 1
                       FROM responses r JOIN chain c ON r.id = c.previous)
                   SELECT r.input_items, r.resource FROM chain c JOIN responses r ON r.id = c.id
                   ORDER BY c.depth DESC""",
                (response_id,),
            )).fetchall()

        return chain_items(await self._run("history", read))

    async def items(self, item_ids: list[str]) -> dict[str, dict[str, Any]]:
        if not item_ids:
            return {}

        async def read(db: Connection) -> list[tuple[str, str]]:
            return await (await db.execute("SELECT id, item FROM items WHERE id = ANY(%s)", (item_ids,))).fetchall()

        return {item_id: loads(item) for item_id, item in await self._run("items", read)}

    async def request_cancel(self, response_id: str) -> bool:
        async def write(db: Connection) -> bool:
            async with db.transaction():
                await _lock(db, response_id)
                return (await db.execute("UPDATE jobs SET cancel_requested = true WHERE response_id = %s",
                                         (response_id,))).rowcount > 0

        return await self._run("request_cancel", write)

    async def cancel_requests(self) -> list[str]:
        async def read(db: Connection) -> list[tuple[str]]:
            return await (await db.execute("SELECT response_id FROM jobs WHERE owner = %s AND cancel_requested",
                                           (self.owner,))).fetchall()

        return [row[0] for row in await self._run("cancel_requests", read)]

    async def renew(self) -> None:
        async def write(db: Connection) -> None:
            await db.execute(f"UPDATE jobs SET heartbeat = {_NOW} WHERE owner = %s", (self.owner,))

        await self._run("renew", write)

    async def heartbeats(self) -> dict[str, float | None]:
        async def read(db: Connection) -> list[tuple[str, float | None]]:
            return await (await db.execute(_UNFINISHED)).fetchall()

        return dict(await self._run("heartbeats", read))

    async def end_abandoned(self, stale: dict[str, float | None],
                            end: Callable[[StoredResponse, bool], None]) -> list[str]:
        async def sweep(db: Connection) -> list[str]:
            ended = []
            for response_id, heartbeat in stale.items():
                async with db.transaction():  # look again under the lock: the owner may have renewed or saved
                    await _lock(db, response_id)
                    row = await (await db.execute(
                        """SELECT j.heartbeat, r.resource, r.input_items, coalesce(j.cancel_requested, false)
                           FROM responses r LEFT JOIN jobs j ON j.response_id = r.id
                           WHERE r.id = %s AND r.status IN ('queued', 'in_progress') FOR UPDATE OF r""",
                        (response_id,))).fetchone()
                    if row is None or row[0] != heartbeat:
                        continue
                    record = StoredResponse(loads(row[1]), loads(row[2]))
                    end(record, bool(row[3]))
                    await self._write(db, record)
                    ended.append(response_id)
            return ended

        return await self._run("end_abandoned", sweep)

    async def close(self) -> None:
        async def release(db: Connection) -> None:
            await db.execute("DELETE FROM jobs WHERE owner = %s", (self.owner,))

        try:
            await self._run("close", release)
        except StoreUnavailable as exc:  # the jobs stay ours until their heartbeat is older than the lease
            logger.warning("giving up this process's jobs failed: %s", exc)
        finally:
            await self._pool.close()
            logging.getLogger("psycopg.pool").removeFilter(self._pool_log)

    # -- conversations ---------------------------------------------------------------------------------------------

    async def create_conversation(self, conversation: dict[str, Any], items: list[dict[str, Any]]) -> None:
        async def write(db: Connection) -> None:
            async with db.transaction():
                await db.execute("INSERT INTO conversations VALUES (%s, %s, %s)",
                                 (conversation["id"], conversation["created_at"], json.dumps(conversation["metadata"])))
                await _append(db, conversation["id"], items)

        await self._run("create_conversation", write)

    async def load_conversation(self, conversation_id: str) -> dict[str, Any] | None:
        row = await self._fetchone("load_conversation",
                                   "SELECT id, created_at, metadata FROM conversations WHERE id = %s",
                                   (conversation_id,))
        return conversation_object(row[0], row[1], loads(row[2])) if row else None

    async def update_conversation(self, conversation_id: str, metadata: dict[str, str]) -> dict[str, Any] | None:
        row = await self._fetchone(
            "update_conversation",
            "UPDATE conversations SET metadata = %s WHERE id = %s RETURNING id, created_at, metadata",
            (json.dumps(metadata), conversation_id))
        return conversation_object(row[0], row[1], loads(row[2])) if row else None

    async def delete_conversation(self, conversation_id: str) -> bool:
        async def remove(db: Connection) -> bool:
            async with db.transaction():
                await _lock(db, conversation_id)
                await db.execute("DELETE FROM conversation_items WHERE conversation_id = %s", (conversation_id,))
                return (await db.execute("DELETE FROM conversations WHERE id = %s",
                                         (conversation_id,))).rowcount > 0

        return await self._run("delete_conversation", remove)

    async def add_conversation_items(self, conversation_id: str, items: list[dict[str, Any]]) -> bool:
        async def write(db: Connection) -> bool:
            async with db.transaction():
                await _lock(db, conversation_id)
                if not await (await db.execute("SELECT 1 FROM conversations WHERE id = %s",
                                               (conversation_id,))).fetchone():
                    return False
                await _append(db, conversation_id, items)
                return True

        return await self._run("add_conversation_items", write)

    async def conversation_items(self, conversation_id: str, after: str | None = None, limit: int | None = None,
                                 newest_first: bool = False) -> list[dict[str, Any]] | None:
        direction, beyond = ("DESC", "<") if newest_first else ("ASC", ">")
        sql, values = "SELECT item FROM conversation_items WHERE conversation_id = %s", [conversation_id]
        if after is not None:
            sql += (f" AND position {beyond} (SELECT position FROM conversation_items"
                    " WHERE conversation_id = %s AND id = %s)")
            values += [conversation_id, after]
        sql += f" ORDER BY position {direction}"
        if limit is not None:
            sql += " LIMIT %s"
            values.append(limit)

        async def read(db: Connection) -> list[tuple[str]] | None:
            async with db.transaction():  # one snapshot: the conversation and its items
                await db.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                if not await (await db.execute("SELECT 1 FROM conversations WHERE id = %s",
                                               (conversation_id,))).fetchone():
                    return None
                return await (await db.execute(sql, values)).fetchall()

        rows = await self._run("conversation_items", read)
        return None if rows is None else [loads(row[0]) for row in rows]

    async def conversation_item(self, conversation_id: str, item_id: str) -> dict[str, Any] | None:
        row = await self._fetchone("conversation_item",
                                   "SELECT item FROM conversation_items WHERE conversation_id = %s AND id = %s",
                                   (conversation_id, item_id))
        return loads(row[0]) if row else None

    async def delete_conversation_item(self, conversation_id: str, item_id: str) -> bool:
        async def remove(db: Connection) -> bool:
            return (await db.execute("DELETE FROM conversation_items WHERE conversation_id = %s AND id = %s",
                                     (conversation_id, item_id))).rowcount > 0

        return await self._run("delete_conversation_item", remove)


async def _lock(db: Connection, key: str) -> None:
    """Until the transaction ends, other writes about `key` (a response's or a conversation's id) wait."""
    await db.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (key,))


async def _append(db: Connection, conversation_id: str, items: list[dict[str, Any]]) -> None:
    for item in items:
        try:
            async with db.transaction():  # a savepoint, so the error below leaves a transaction to roll back
                await db.execute("INSERT INTO conversation_items (conversation_id, id, item) VALUES (%s, %s, %s)",
                                 (conversation_id, item["id"], json.dumps(item)))
        except psycopg.errors.UniqueViolation:
            raise DuplicateItem(item["id"]) from None
