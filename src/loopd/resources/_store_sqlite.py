"""The SQLite backend: one WAL connection driven from a single worker thread.

Owns: ``SqliteResourceStore`` / ``open_sqlite_store`` and the SQLite ``Backend`` (``BEGIN IMMEDIATE`` write
transactions, snapshot reads, busy and operation timeouts, sqlite errors → ``StoreUnavailable``).
Must not do: Kubernetes semantics (``_semantics``). Cross-process changes are picked up by the watch pump's poll.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

from loopd._paths import ensure_private_file

from . import _sql as sql
from ._errors import StoreUnavailable
from ._semantics import StoreEngine
from ._store import StoreOptions

_T = TypeVar("_T")


class _SqliteConnection:
    def __init__(self, backend: SqliteBackend) -> None:
        self._backend = backend

    async def fetch(self, statement: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        conn = self._backend.conn
        return await self._backend.call(lambda: conn.execute(statement, tuple(params)).fetchall())

    async def execute(self, statement: str, params: Sequence[Any] = ()) -> None:
        conn = self._backend.conn
        await self._backend.call(lambda: conn.execute(statement, tuple(params)))


class SqliteBackend:
    """Serializes every transaction of this process through one connection and one worker thread."""

    def __init__(self, conn: sqlite3.Connection, executor: ThreadPoolExecutor, timeout: float) -> None:
        self.conn = conn
        self._executor = executor
        self._timeout = timeout
        self._lock = asyncio.Lock()
        self._closed = False

    @classmethod
    async def connect(cls, path: str | Path, timeout: float) -> SqliteBackend:
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="loopd-resources-sqlite")

        def connect() -> sqlite3.Connection:
            ensure_private_file(Path(path))  # the store holds every object: 0600, and so are its -wal/-shm files
            conn = sqlite3.connect(str(path), timeout=timeout, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute(f"PRAGMA busy_timeout={int(timeout * 1000)}")
            conn.execute("BEGIN IMMEDIATE")
            try:
                for statement in sql.SCHEMA_STATEMENTS:
                    conn.execute(statement)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                conn.close()
                raise
            return conn

        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                conn = await loop.run_in_executor(executor, connect)
        except (sqlite3.Error, TimeoutError, OSError) as exc:
            executor.shutdown(wait=False)
            raise StoreUnavailable(f"cannot open the SQLite resource store at {path}: {exc}") from exc
        return cls(conn, executor, timeout)

    async def call(self, fn: Callable[[], _T]) -> _T:
        if self._closed:
            raise StoreUnavailable("the SQLite resource store is closed")
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._timeout):
                return await loop.run_in_executor(self._executor, fn)
        except TimeoutError as exc:
            raise StoreUnavailable("the SQLite resource store timed out") from exc
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"SQLite resource store error: {exc}") from exc

    @asynccontextmanager
    async def _transaction(self, begin: str) -> AsyncIterator[sql.Connection]:
        try:
            async with asyncio.timeout(self._timeout):
                await self._lock.acquire()
        except TimeoutError as exc:
            raise StoreUnavailable("the SQLite resource store is busy") from exc
        try:
            committed = False
            try:
                # BEGIN is inside: cancelled or timed out while the worker thread still runs it, the transaction
                # it opens is rolled back (queued behind it on the one thread) instead of poisoning the next BEGIN.
                await self.call(lambda: self.conn.execute(begin))
                yield _SqliteConnection(self)
                await self.call(lambda: self.conn.execute("COMMIT"))
                committed = True
            finally:
                if not committed:
                    await asyncio.shield(self._rollback())
        finally:
            self._lock.release()

    async def _rollback(self) -> None:
        def rollback() -> None:
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")

        await self.call(rollback)

    def write(self) -> AbstractAsyncContextManager[sql.Connection]:
        return self._transaction("BEGIN IMMEDIATE")

    def read(self) -> AbstractAsyncContextManager[sql.Connection]:
        return self._transaction("BEGIN")

    async def announce(self, conn: sql.Connection) -> None:
        return None

    def listen(self, wake: Any) -> None:
        return None

    async def aclose(self) -> None:
        if self._closed:
            return
        async with self._lock:
            await self.call(self.conn.close)
            self._closed = True
        await asyncio.to_thread(self._executor.shutdown, wait=True)


class SqliteResourceStore(StoreEngine):
    """The embedded store: Kubernetes semantics on one SQLite file (WAL)."""

    @classmethod
    async def open(cls, path: str | Path, *, options: StoreOptions | None = None) -> SqliteResourceStore:
        options = options or StoreOptions()
        backend = await SqliteBackend.connect(path, options.operation_timeout)
        store = cls(backend, options)
        try:
            await store._start()
        except BaseException:
            await store.aclose()
            raise
        return store


@asynccontextmanager
async def open_sqlite_store(
    path: str | Path, *, options: StoreOptions | None = None
) -> AsyncIterator[SqliteResourceStore]:
    store = await SqliteResourceStore.open(path, options=options)
    try:
        yield store
    finally:
        await store.aclose()
