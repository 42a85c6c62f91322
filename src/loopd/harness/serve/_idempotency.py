"""Idempotency keys for session creation: key → (body fingerprint, session id, first input's command id).

A key is recorded *before* its session is created, so a crash between the two is healed by the next request with
the same key (the recorded id is created then). `SqliteIdempotencyStore` keeps keys across restarts in a small file
next to the journal; `MemoryIdempotencyStore` is its in-process twin (keys die with the process).

Must not do: create sessions, or know about HTTP.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final, Protocol, TypeVar

_TIMEOUT: Final = 10.0

T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS idempotency_keys (
    key TEXT PRIMARY KEY,
    fingerprint TEXT NOT NULL,
    session_id TEXT NOT NULL,
    command_id TEXT,
    created_at REAL NOT NULL
)
"""


class IdempotencyStoreError(Exception):
    """The key store could not be read or written."""


@dataclass(frozen=True, slots=True)
class KeyRecord:
    key: str
    fingerprint: str
    session_id: str
    command_id: str | None
    created_at: float


class IdempotencyStore(Protocol):
    async def claim(self, record: KeyRecord) -> KeyRecord:
        """Store ``record`` unless its key exists; return whichever record the key now maps to."""
        ...

    async def set_command(self, key: str, command_id: str) -> None: ...

    async def aclose(self) -> None: ...


class MemoryIdempotencyStore:
    """Keys in a dict: for tests and for servers started without a data directory."""

    def __init__(self) -> None:
        self._records: dict[str, KeyRecord] = {}

    async def claim(self, record: KeyRecord) -> KeyRecord:
        return self._records.setdefault(record.key, record)

    async def set_command(self, key: str, command_id: str) -> None:
        current = self._records.get(key)
        if current is not None:
            self._records[key] = replace(current, command_id=command_id)

    async def aclose(self) -> None:
        self._records.clear()


class SqliteIdempotencyStore:
    """Keys in a SQLite file (WAL); every call runs in a worker thread with its own short-lived connection.

    The file is created on first use.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._ready = False  # the schema exists (created by the first call; idempotent if two race)

    def _connect(self) -> sqlite3.Connection:
        if not self._ready:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, timeout=_TIMEOUT, isolation_level=None)
        try:
            conn.execute("PRAGMA busy_timeout = 10000")
            if not self._ready:
                conn.execute("PRAGMA journal_mode = WAL")
                conn.execute(_SCHEMA)
                self._ready = True
        except BaseException:
            conn.close()
            raise
        return conn

    async def _run(self, fn: Callable[[], T]) -> T:
        try:
            return await asyncio.wait_for(asyncio.to_thread(fn), _TIMEOUT)
        except (sqlite3.Error, OSError, TimeoutError) as exc:
            raise IdempotencyStoreError(f"idempotency keys in {self.path}: {exc}") from exc

    async def claim(self, record: KeyRecord) -> KeyRecord:
        def claim() -> KeyRecord:
            conn = self._connect()
            try:
                conn.execute(
                    "INSERT OR IGNORE INTO idempotency_keys (key, fingerprint, session_id, command_id, created_at) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (record.key, record.fingerprint, record.session_id, record.command_id, record.created_at),
                )
                row = conn.execute(
                    "SELECT key, fingerprint, session_id, command_id, created_at FROM idempotency_keys WHERE key = ?",
                    (record.key,),
                ).fetchone()
            finally:
                conn.close()
            return KeyRecord(str(row[0]), str(row[1]), str(row[2]), row[3], float(row[4]))

        return await self._run(claim)

    async def set_command(self, key: str, command_id: str) -> None:
        def update() -> None:
            conn = self._connect()
            try:
                conn.execute("UPDATE idempotency_keys SET command_id = ? WHERE key = ?", (command_id, key))
            finally:
                conn.close()

        await self._run(update)

    async def aclose(self) -> None:
        return None
