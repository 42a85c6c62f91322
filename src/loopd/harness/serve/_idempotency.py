"""Idempotency keys for session creation: key → (body fingerprint, session id, first input's command id).

A key is recorded *before* its session is created, so a crash between the two is healed by the next request with
the same key (the recorded id is created then). `SqliteIdempotencyStore` keeps keys across restarts in a small file
next to the journal; `MemoryIdempotencyStore` is its in-process twin (keys die with the process).

Must not do: create sessions, or know about HTTP.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final, Protocol

from loopd._infra.migrations import Migration, Schema
from loopd.harness._errors import HarnessError
from loopd.harness.serve._sqlite_file import PrivateSqliteFile

_TIMEOUT: Final = 10.0

_SCHEMA = Schema(
    "idempotency",
    (
        Migration(
            1,
            "idempotency keys",
            # IF NOT EXISTS: a file made before the migrator adopts this step as it is.
            (
                """CREATE TABLE IF NOT EXISTS idempotency_keys (
    key TEXT PRIMARY KEY,
    fingerprint TEXT NOT NULL,
    session_id TEXT NOT NULL,
    command_id TEXT,
    created_at REAL NOT NULL
)""",
            ),
        ),
    ),
)


class IdempotencyStoreError(HarnessError):
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
    """Keys in a SQLite file (WAL) through the floor's SQLite database: one connection on its own thread, opened
    (and its schema migrated) by the first call; `aclose` closes it.

    The file is created on first use, 0600 in a 0700 directory when it makes the directory.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = PrivateSqliteFile(
            path,
            _SCHEMA,
            error=lambda message: IdempotencyStoreError(f"idempotency keys in {path}: {message}"),
            thread_name="loopd-idempotency",
            label=f"the idempotency key store {path}",
            timeout=_TIMEOUT,
        )

    async def claim(self, record: KeyRecord) -> KeyRecord:
        db = await self._file.database()
        async with db.transaction(read_only=False) as conn:
            await conn.execute(
                "INSERT INTO idempotency_keys (key, fingerprint, session_id, command_id, created_at) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT (key) DO NOTHING",
                (record.key, record.fingerprint, record.session_id, record.command_id, record.created_at),
            )
            rows = await conn.fetch(
                "SELECT key, fingerprint, session_id, command_id, created_at FROM idempotency_keys WHERE key = ?",
                (record.key,),
            )
        row = rows[0]
        return KeyRecord(str(row[0]), str(row[1]), str(row[2]), row[3], float(row[4]))

    async def set_command(self, key: str, command_id: str) -> None:
        db = await self._file.database()
        async with db.transaction(read_only=False) as conn:
            await conn.execute("UPDATE idempotency_keys SET command_id = ? WHERE key = ?", (command_id, key))

    async def aclose(self) -> None:
        await self._file.aclose()
