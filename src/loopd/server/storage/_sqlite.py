"""The SQLite backend: one WAL file, a writer connection and a reader connection, each on its own thread.

Owns: connecting (WAL, ``synchronous=NORMAL``, busy timeout), write transactions (``BEGIN IMMEDIATE``, one at a
time in this process and across processes), read transactions on a second connection that sees one snapshot
while a writer works, a timeout around every call, and ``sqlite3`` errors → storage errors. A ``COMMIT`` that
times out keeps running on its thread: the transaction waits (one more timeout) for it to settle and reports what
happened; only when it still has not settled is the outcome unknown (``CommitOutcomeUnknown``).
Must not do: SQL of any table.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

from loopd._paths import ensure_private_file

from ._backend import Connection, Dialect
from ._errors import CommitOutcomeUnknown, Conflict, StorageUnavailable

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
        self.owner: object | None = None
        """The transaction open on the connection; read and written on the lane thread only."""

    def _connect(self) -> None:
        if not self._query_only:
            ensure_private_file(self._path)  # conversations and messages: 0600, and so are its -wal/-shm files
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
    def connection(self) -> sqlite3.Connection | None:
        return self._conn

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

    def submit(self, fn: Callable[[], None]) -> None:
        """Queue ``fn`` on the lane thread without waiting for it (its errors are dropped)."""
        with contextlib.suppress(RuntimeError):  # shut down: the connection is closed, and its transaction with it
            self._executor.submit(fn)

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self._executor, conn.close)
        await asyncio.to_thread(self._executor.shutdown, wait=True)


class _SqliteConnection:
    """One transaction on a lane. ``BEGIN`` rides along with the first statement, so a short transaction costs one
    thread hop per statement plus the ``COMMIT`` (none at all when it runs no statement)."""

    def __init__(self, lane: _Lane, begin: str) -> None:
        self._lane = lane
        self._begin = begin
        self.used = False  # a statement was handed to the lane thread (so BEGIN may have run)
        self.committed: bool | None = None
        """Set on the lane thread when ``COMMIT`` has settled: True once committed, False once rolled back."""

    def _in_transaction(self, fn: Callable[[sqlite3.Connection], _T]) -> Callable[[], _T]:
        lane, conn, begin = self._lane, self._lane.conn, self._begin

        def run() -> _T:  # on the lane thread
            if lane.owner is not self:
                if conn.in_transaction:  # left open by a transaction whose caller timed out or was cancelled
                    conn.execute("ROLLBACK")
                lane.owner = None
                conn.execute(begin)
                lane.owner = self
            elif not conn.in_transaction:  # SQLite rolled the transaction back itself (e.g. disk full)
                raise sqlite3.OperationalError("the transaction was rolled back by SQLite")
            return fn(conn)

        return run

    async def fetch(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        args = tuple(params)
        self.used = True
        return await self._lane.call(self._in_transaction(lambda conn: conn.execute(sql, args).fetchall()))

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        args = tuple(params)
        self.used = True
        return await self._lane.call(self._in_transaction(lambda conn: conn.execute(sql, args).rowcount))

    def end(self, verb: str) -> Callable[[], None]:
        """``COMMIT`` or ``ROLLBACK`` this transaction if it is still the one open on the lane (run on the lane
        thread). A failed ``COMMIT`` rolls back at once, so the outcome is settled in this one call."""
        lane, conn = self._lane, self._lane.connection

        def run() -> None:
            if lane.owner is not self:
                return
            lane.owner = None
            if conn is None:
                raise StorageUnavailable("the SQLite database is closed")
            if not conn.in_transaction:
                if verb == "COMMIT":
                    self.committed = False
                    raise sqlite3.OperationalError("the transaction was rolled back by SQLite")
                return
            try:
                conn.execute(verb)
            except BaseException:
                if conn.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")
                if verb == "COMMIT":
                    self.committed = False
                raise
            if verb == "COMMIT":
                self.committed = True

        return run


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

    async def _acquire(self, lane: _Lane) -> None:
        if self._closed:
            raise StorageUnavailable("the SQLite database is closed")
        try:
            async with asyncio.timeout(self._timeout):
                await lane.lock.acquire()
        except TimeoutError as exc:
            raise StorageUnavailable(f"the SQLite database stayed busy for {self._timeout:g} s") from exc

    @asynccontextmanager
    async def _write(self) -> AsyncIterator[Connection]:
        lane = self._writer
        await self._acquire(lane)
        try:
            tx = _SqliteConnection(lane, "BEGIN IMMEDIATE")
            committed = False
            try:
                yield tx
                if tx.used:
                    await self._commit(lane, tx)
                committed = True
            finally:
                if not committed and tx.used:
                    await asyncio.shield(self._rollback(lane, tx))
        finally:
            lane.lock.release()

    @asynccontextmanager
    async def _read(self) -> AsyncIterator[Connection]:
        lane = self._reader
        await self._acquire(lane)
        try:
            tx = _SqliteConnection(lane, "BEGIN")
            try:
                yield tx
            finally:
                if tx.used:
                    # Ending a read changes nothing, so nobody waits for it: the lane thread runs its calls in
                    # order, so the next transaction's first statement starts after it.
                    lane.submit(tx.end("COMMIT"))
        finally:
            lane.lock.release()

    async def _commit(self, lane: _Lane, tx: _SqliteConnection) -> None:
        try:
            await lane.call(tx.end("COMMIT"))
        except StorageUnavailable as exc:
            if not isinstance(exc.__cause__, TimeoutError):
                raise  # the COMMIT failed and rolled back in the same call: nothing was written
            # The COMMIT is still running on the lane thread. Whatever runs there next runs after it settles.
            with contextlib.suppress(StorageUnavailable):
                await lane.call(lambda: None)
            if tx.committed:
                return
            if tx.committed is False:
                raise StorageUnavailable(f"the SQLite COMMIT failed after {self._timeout:g} s") from exc
            raise CommitOutcomeUnknown(
                f"the SQLite COMMIT did not settle within {2 * self._timeout:g} s; it may or may not have committed"
            ) from exc

    @staticmethod
    async def _rollback(lane: _Lane, tx: _SqliteConnection) -> None:
        try:
            await lane.call(tx.end("ROLLBACK"))
        except StorageUnavailable:
            # The connection is unusable; the transaction dies with it and the next BEGIN reports the failure.
            return

    def transaction(self, *, read_only: bool) -> AbstractAsyncContextManager[Connection]:
        return self._read() if read_only else self._write()

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
