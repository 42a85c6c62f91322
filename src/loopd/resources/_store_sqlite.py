"""The SQLite backend: the floor's SQLite database (``loopd._infra.sqlite``) on one WAL file.

Owns: ``SqliteResourceStore`` / ``open_sqlite_store`` and the SQLite ``Backend``: ``BEGIN IMMEDIATE`` write
transactions on the writer lane, snapshot reads on the reader lane, the store's schema migrated on open, and
every failure as ``StoreUnavailable`` (the floor's lanes bound every call by the operation timeout and roll back a
transaction whose caller was cancelled or timed out while its thread still ran).
Must not do: Kubernetes semantics (``_semantics``). Cross-process changes are picked up by the watch pump's poll.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

from loopd._infra.database import Database
from loopd._infra.migrations import migrate
from loopd._infra.sqlite import SqliteDatabase, SqliteOptions

from . import _sql as sql
from ._semantics import SemanticStore
from ._store import StoreOptions


class SqliteBackend:
    """The store's transactions on one SQLite database: one writer at a time (across processes too), snapshot
    reads. ``connect`` opens a file; the in-memory store (``_store_memory``) passes the floor's inline in-memory
    database instead. Nothing to announce: other processes' changes are picked up by the watch pump's poll."""

    def __init__(self, database: Database) -> None:
        self.database = database

    @classmethod
    async def connect(cls, path: str | Path, timeout: float) -> SqliteBackend:
        database = await SqliteDatabase.open(
            path,
            SqliteOptions(
                timeout=timeout,
                thread_name="loopd-resources-sqlite",
                label="the SQLite resource store",
                errors=sql.ERRORS,
            ),
        )
        try:
            await migrate(database, sql.SCHEMA)
        except BaseException:
            await database.aclose()
            raise
        return cls(database)

    def write(self) -> AbstractAsyncContextManager[sql.Connection]:
        return self.database.transaction(read_only=False)

    def read(self) -> AbstractAsyncContextManager[sql.Connection]:
        return self.database.transaction(read_only=True)

    async def announce(self, conn: sql.Connection) -> None:
        return None

    def listen(self, wake: Any) -> None:
        return None

    async def aclose(self) -> None:
        await self.database.aclose()


class SqliteResourceStore(SemanticStore):
    """The embedded store: Kubernetes semantics on one SQLite file (WAL)."""

    @classmethod
    async def open(cls, path: str | Path, *, options: StoreOptions | None = None) -> SqliteResourceStore:
        options = options or StoreOptions()
        backend = await SqliteBackend.connect(path, options.operation_timeout)
        return await cls._open_on(backend, options)


@asynccontextmanager
async def open_sqlite_store(
    path: str | Path, *, options: StoreOptions | None = None
) -> AsyncIterator[SqliteResourceStore]:
    store = await SqliteResourceStore.open(path, options=options)
    try:
        yield store
    finally:
        await store.aclose()
