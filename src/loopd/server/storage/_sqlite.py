"""The SQLite backend: one WAL file, a writer connection and a reader connection, each on its own thread.

Owns: connecting (WAL, ``synchronous=NORMAL``, busy timeout), write transactions (``BEGIN IMMEDIATE``, one at a
time in this process and across processes), read transactions on a second connection that sees one snapshot
while a writer works, a timeout around every call, and ``sqlite3`` errors → storage errors.
Must not do: SQL of any table.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

from ._backend import Connection, Dialect
from ._errors import Conflict, StorageUnavailable

_T = TypeVar("_T")


class _Lane:
    """One sqlite3 connection, the single thread that uses it, and the lock that admits one transaction."""

    def __init__(self, path: Path, timeout: float, *, query_only: bool, name: str) -> None:
        self._path = path
        self._timeout = timeout
        self._query_only = query_only
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._conn: sqlite3.Connection | None = None
        self.lock = asyncio.Lock()

    def _connect(self) -> None:
        conn = sqlite3.connect(str(self._path), timeout=self._timeout, isolation_level=None, check_same_thread=False)
        try:
            # SQLite gives up on a lock a little before our own timeout, so the worker thread is free again.
            conn.execute(f"PRAGMA busy_timeout={int(self._timeout * 800)}")
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            if self._query_only:
                conn.execute("PRAGMA query_only=ON")
        except BaseException:
            conn.close()
            raise
        self._conn = conn

    async def open(self) -> None:
        await self.call(self._connect, opening=True)

    @property
    def conn(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StorageUnavailable("the SQLite database is closed")
        return self._conn

    async def call(self, fn: Callable[[], _T], *, opening: bool = False) -> _T:
        if self._conn is None and not opening:
            raise StorageUnavailable("the SQLite database is closed")
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._timeout):
                return await loop.run_in_executor(self._executor, fn)
        except TimeoutError as exc:
            raise StorageUnavailable(f"the SQLite database did not answer within {self._timeout:g} s") from exc
        except sqlite3.IntegrityError as exc:
            raise Conflict(f"constraint violated: {exc}") from exc
        except sqlite3.Error as exc:
            raise StorageUnavailable(f"SQLite error: {exc}") from exc
        except RuntimeError as exc:  # the executor was shut down under us
            raise StorageUnavailable("the SQLite database is closed") from exc

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self._executor, conn.close)
        await asyncio.to_thread(self._executor.shutdown, wait=True)


class _SqliteConnection:
    def __init__(self, lane: _Lane) -> None:
        self._lane = lane

    async def fetch(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        conn = self._lane.conn
        args = tuple(params)
        return await self._lane.call(lambda: conn.execute(sql, args).fetchall())

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        conn = self._lane.conn
        args = tuple(params)
        return await self._lane.call(lambda: conn.execute(sql, args).rowcount)


class SqliteBackend:
    """A ``Backend`` on one SQLite file."""

    def __init__(self, writer: _Lane, reader: _Lane, timeout: float) -> None:
        self._writer = writer
        self._reader = reader
        self._timeout = timeout
        self._closed = False

    @property
    def dialect(self) -> Dialect:
        return "sqlite"

    @classmethod
    async def connect(cls, path: str | Path, timeout: float) -> SqliteBackend:
        path = Path(path)
        writer = _Lane(path, timeout, query_only=False, name="loopd-storage-sqlite-write")
        reader = _Lane(path, timeout, query_only=True, name="loopd-storage-sqlite-read")
        try:
            await writer.open()  # first: it creates the file and switches it to WAL
            await reader.open()
        except BaseException as exc:
            await writer.close()
            await reader.close()
            if isinstance(exc, StorageUnavailable):
                raise StorageUnavailable(f"cannot open the SQLite database at {path}: {exc.message}") from exc
            raise
        return cls(writer, reader, timeout)

    @asynccontextmanager
    async def _transaction(self, lane: _Lane, begin: str) -> AsyncIterator[Connection]:
        if self._closed:
            raise StorageUnavailable("the SQLite database is closed")
        try:
            async with asyncio.timeout(self._timeout):
                await lane.lock.acquire()
        except TimeoutError as exc:
            raise StorageUnavailable(f"the SQLite database stayed busy for {self._timeout:g} s") from exc
        try:
            conn = lane.conn

            def start() -> None:
                if conn.in_transaction:  # left open by a transaction whose caller timed out or was cancelled
                    conn.execute("ROLLBACK")
                conn.execute(begin)

            await lane.call(start)
            committed = False
            try:
                yield _SqliteConnection(lane)
                await lane.call(lambda: conn.execute("COMMIT"))
                committed = True
            finally:
                if not committed:
                    await asyncio.shield(self._rollback(lane, conn))
        finally:
            lane.lock.release()

    @staticmethod
    async def _rollback(lane: _Lane, conn: sqlite3.Connection) -> None:
        def rollback() -> None:
            if conn.in_transaction:
                conn.execute("ROLLBACK")

        try:
            await lane.call(rollback)
        except StorageUnavailable:
            # The connection is unusable; the transaction dies with it and the next BEGIN reports the failure.
            return

    def transaction(self, *, read_only: bool) -> AbstractAsyncContextManager[Connection]:
        if read_only:
            return self._transaction(self._reader, "BEGIN")
        return self._transaction(self._writer, "BEGIN IMMEDIATE")

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        for lane in (self._reader, self._writer):
            try:
                async with asyncio.timeout(self._timeout):
                    await lane.lock.acquire()
            except TimeoutError:
                pass  # a transaction is stuck: close under it, its next call fails with StorageUnavailable
            else:
                lane.lock.release()
            await lane.close()
