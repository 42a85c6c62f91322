"""A transaction cancelled while its BEGIN still runs on the SQLite worker thread leaves nothing open behind it
(before: the next transaction failed with "cannot start a transaction within a transaction" — seen at shutdown
as a watch-pump warning)."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path
from typing import Any

from loopd.resources._store_sqlite import SqliteBackend


class _SlowBegin:
    """A connection whose BEGIN waits (on the worker thread) until the test lets it go."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self.begun = threading.Event()
        self.release = threading.Event()

    def execute(self, statement: str, *args: Any) -> Any:
        if statement.startswith("BEGIN") and not self.release.is_set():
            self.begun.set()
            self.release.wait(5)
        return self._conn.execute(statement, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


async def test_a_cancelled_begin_does_not_poison_the_next_transaction(tmp_path: Path) -> None:
    backend = await SqliteBackend.connect(tmp_path / "store.db", 5.0)  # the backend alone: no watch pump around
    try:
        slow = _SlowBegin(backend.conn)
        backend.conn = slow  # type: ignore[assignment]  # duck-typed: only execute/in_transaction are used

        async def read() -> None:
            async with backend.read():
                pass

        reader = asyncio.create_task(read())
        await asyncio.to_thread(slow.begun.wait, 5)
        reader.cancel()
        slow.release.set()  # BEGIN now completes on the worker thread, after its caller has gone
        await asyncio.gather(reader, return_exceptions=True)
        # The worker thread runs one job at a time, in order: once a no-op has run, whatever the cancelled
        # transaction left queued (its BEGIN, and the rollback that must follow it) has run too.
        await backend.call(lambda: None)
        assert not slow.in_transaction, "the cancelled transaction's BEGIN left a transaction open"
        async with backend.write() as conn:  # and the next transaction begins
            await conn.execute("SELECT 1")
    finally:
        backend.conn = slow._conn  # type: ignore[assignment]
        await backend.aclose()
