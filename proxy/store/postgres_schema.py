"""The PostgreSQL store's tables, as numbered migrations: each replica brings an older schema up to date at start,
one at a time (an advisory lock), and a version is recorded in the transaction that makes it."""

from __future__ import annotations

MIGRATION_LOCK = 7_200_211  # an advisory lock key: one replica migrates while the others wait

# Version n is MIGRATIONS[n - 1]; each runs in the transaction that records it.
MIGRATIONS = [
    """
CREATE TABLE responses (
    id TEXT PRIMARY KEY,
    previous_response_id TEXT,
    status TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    resource TEXT NOT NULL,
    input_items TEXT NOT NULL
);
CREATE TABLE items (
    response_id TEXT NOT NULL,
    id TEXT NOT NULL,
    item TEXT NOT NULL,
    PRIMARY KEY (response_id, id)
);
CREATE INDEX items_by_id ON items (id);
CREATE INDEX unfinished_responses ON responses (id) WHERE status IN ('queued', 'in_progress');
CREATE TABLE jobs (
    response_id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    heartbeat DOUBLE PRECISION NOT NULL,
    cancel_requested BOOLEAN NOT NULL DEFAULT false
);
CREATE INDEX jobs_by_owner ON jobs (owner);
    """,
    """
CREATE TABLE conversations (
    id TEXT PRIMARY KEY,
    created_at BIGINT NOT NULL,
    metadata TEXT NOT NULL
);
CREATE TABLE conversation_items (
    position BIGSERIAL PRIMARY KEY,
    conversation_id TEXT NOT NULL,
    id TEXT NOT NULL,
    item TEXT NOT NULL,
    UNIQUE (conversation_id, id)
);
CREATE INDEX conversation_items_in_order ON conversation_items (conversation_id, position);
    """,
    """
CREATE TABLE response_events (
    response_id TEXT NOT NULL,
    sequence_number INTEGER NOT NULL,
    frame TEXT NOT NULL,
    PRIMARY KEY (response_id, sequence_number)
);
    """,
]
