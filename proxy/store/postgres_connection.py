"""Reaching PostgreSQL: where a URL points (never its password), the start-up check that says why a database
cannot be reached, and the filter that keeps psycopg_pool's per-attempt warnings (hundreds in an outage) out of the
log, holding the last reason for the store's own one line per state change."""

from __future__ import annotations

import logging

import psycopg
from psycopg.conninfo import conninfo_to_dict

from proxy.store.base import StoreUnavailable

CONNECT_TIMEOUT = 2.0  # seconds an operation waits for a connection before it is a 503


def where(url: str) -> str:
    """host:port/database, for messages: never the password."""
    parts = conninfo_to_dict(url)
    return f"{parts.get('host', 'localhost')}:{parts.get('port', 5432)}/{parts.get('dbname', '')}"


def check_reachable(url: str) -> None:
    """Connect once, at start-up, before anything else starts: StoreUnavailable saying why not (psycopg's reason:
    refused, unknown host, authentication failed, no such database)."""
    try:
        psycopg.connect(url, connect_timeout=int(CONNECT_TIMEOUT * 2)).close()
    except psycopg.Error as exc:
        raise StoreUnavailable(f"cannot connect to the PostgreSQL store {where(url)}: {one_line(exc)}") from None


def one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


class PoolLog(logging.Filter):
    """psycopg_pool warns once per failed connection attempt (hundreds in an outage) and once per broken connection
    it discards. Of our pool's, keep the last attempt's reason for our own line, and let none through."""

    def __init__(self, pool_name: str) -> None:
        super().__init__()
        self.pool_name = pool_name
        self.reason: str | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        args = record.args if isinstance(record.args, tuple) else ()
        message = str(record.msg)
        if message.startswith("error connecting in") and args[:1] == (self.pool_name,):
            self.reason = one_line(args[1])
            return False
        ours = self.pool_name in args or any(getattr(arg, "name", None) == self.pool_name for arg in args)
        return not (ours or message.startswith("discarding broken connection"))
