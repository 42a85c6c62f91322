"""SQLite in memory, on the event loop's thread: the backend of the in-memory twins.

Owns: ``MemorySqliteDatabase``, a ``Database`` over one private ``:memory:`` connection whose statements run
inline (no worker thread, no lock to wait on), so a transaction never suspends the task that runs it.
Must not do: hold anything that outlives the process, or serve real traffic (a statement blocks the event loop
while it runs; in memory that is microseconds). Files go through ``loopd._infra.sqlite``.

Why inline: tests drive code on a virtual clock (``loopd._infra.clock.VirtualClock``) that advances once the event
loop is idle; a worker thread's result arriving later would race that. Everything here completes within the call,
so a twin built on it behaves as a synchronous one would, with the real engine's semantics.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import AsyncIterator, Coroutine, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, TypeVar, cast

from .database import Connection, DatabaseErrors, Dialect


class _InlineConnection:
    """One transaction on the shared connection; each call runs at once on the calling thread."""

    def __init__(self, conn: sqlite3.Connection, errors: DatabaseErrors) -> None:
        self._conn = conn
        self._errors = errors

    async def fetch(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        try:
            return self._conn.execute(sql, tuple(params)).fetchall()
        except sqlite3.Error as exc:
            raise self._errors.unavailable(f"in-memory SQLite: {exc}") from exc

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        try:
            return self._conn.execute(sql, tuple(params)).rowcount
        except sqlite3.Error as exc:
            raise self._errors.unavailable(f"in-memory SQLite: {exc}") from exc


class MemorySqliteDatabase:
    """A ``Database`` (``loopd._infra.database``) on a private in-memory SQLite database.

    Transactions are serialized by construction: one runs from its first statement to its ``COMMIT`` without
    suspending, unless its caller awaits something else inside the block — then a second transaction opened
    meanwhile is refused with ``errors.unavailable`` rather than interleaved.
    """

    def __init__(self, errors: DatabaseErrors | None = None) -> None:
        self._errors = errors or DatabaseErrors()
        self._conn: sqlite3.Connection | None = sqlite3.connect(":memory:", isolation_level=None)
        self._in_transaction = False

    @property
    def dialect(self) -> Dialect:
        return "sqlite"

    @property
    def errors(self) -> DatabaseErrors:
        return self._errors

    @property
    def connection(self) -> sqlite3.Connection:
        """The raw connection, for synchronous test controls between transactions."""
        if self._conn is None:
            raise self._errors.unavailable("the in-memory database is closed")
        return self._conn

    def transaction(self, *, read_only: bool) -> AbstractAsyncContextManager[Connection]:
        return self._transaction(read_only)

    @asynccontextmanager
    async def _transaction(self, read_only: bool) -> AsyncIterator[Connection]:
        conn = self.connection
        if self._in_transaction:
            raise self._errors.unavailable("the in-memory database already has a transaction open")
        self._in_transaction = True
        try:
            conn.execute("BEGIN DEFERRED" if read_only else "BEGIN IMMEDIATE")
            try:
                yield _InlineConnection(conn, self._errors)
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            try:
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                if conn.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")
                raise self._errors.unavailable(f"in-memory SQLite: {exc}") from exc
        finally:
            self._in_transaction = False

    async def aclose(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


_T = TypeVar("_T")


def run_inline(work: Coroutine[Any, Any, _T]) -> _T:
    """Run ``work`` to its end now, without an event loop: for calls that only use a ``MemorySqliteDatabase``
    (whose awaits never suspend). Raises ``RuntimeError`` if ``work`` does suspend."""
    try:
        work.send(None)
    except StopIteration as done:
        return cast(_T, done.value)
    work.close()
    raise RuntimeError("run_inline: the work suspended; it must only use an in-memory database")
