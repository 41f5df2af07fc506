"""The SQLite store's tables, as numbered migrations (`PRAGMA user_version` records the version): a store opened
on an older file brings it up to date, each migration in its own transaction."""

from __future__ import annotations

# Version n is MIGRATIONS[n - 1]. Version 1 is the schema before versions were kept, so its statements must
# tolerate tables that exist already.
MIGRATIONS = [
    """
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
-- The few unfinished responses, found without reading them all.
CREATE INDEX IF NOT EXISTS unfinished_responses ON responses (id) WHERE status IN ('queued', 'in_progress');
-- Who runs each unfinished response: owner token, heartbeat (Unix time), and whether a cancel was asked for.
CREATE TABLE IF NOT EXISTS jobs (
    response_id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    heartbeat REAL NOT NULL,
    cancel_requested INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS jobs_by_owner ON jobs (owner);
    """,
    """
CREATE TABLE IF NOT EXISTS conversations (
    id TEXT PRIMARY KEY,
    created_at INTEGER NOT NULL,
    metadata TEXT NOT NULL
);
-- `position` orders every conversation's items: the order they were added in.
CREATE TABLE IF NOT EXISTS conversation_items (
    position INTEGER PRIMARY KEY AUTOINCREMENT,
    conversation_id TEXT NOT NULL,
    id TEXT NOT NULL,
    item TEXT NOT NULL,
    UNIQUE (conversation_id, id)
);
CREATE INDEX IF NOT EXISTS conversation_items_in_order ON conversation_items (conversation_id, position);
    """,
    """
CREATE TABLE IF NOT EXISTS response_events (
    response_id TEXT NOT NULL,
    sequence_number INTEGER NOT NULL,
    frame TEXT NOT NULL,
    PRIMARY KEY (response_id, sequence_number)
) WITHOUT ROWID;
    """,
]
