"""The PostgreSQL backend: psycopg 3 (async) with a bounded ``psycopg_pool`` connection pool.

Owns: the pool (connect, statement and lock timeouts set per session), explicit ``BEGIN``/``COMMIT``/``ROLLBACK``
so every step is bounded by the operation timeout, READ COMMITTED write transactions (repositories take row locks
where order matters), REPEATABLE READ read-only transactions, and ``psycopg`` errors → storage errors. A ``COMMIT``
that times out or loses its connection is ``CommitOutcomeUnknown``: the server may have committed it.
Must not do: SQL of any table.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from ._backend import Connection, Dialect
from ._errors import CommitOutcomeUnknown, Conflict, StorageUnavailable

try:
    import psycopg
    from psycopg_pool import AsyncConnectionPool, PoolTimeout
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("PostgreSQL storage needs the 'postgres' extra: pip install 'pyloopd[postgres]'") from exc


def _translate(sql: str) -> str:
    return sql.replace("?", "%s")


@asynccontextmanager
async def _mapped(timeout: float) -> AsyncIterator[None]:
    try:
        async with asyncio.timeout(timeout):
            yield
    except TimeoutError as exc:
        raise StorageUnavailable(f"PostgreSQL did not answer within {timeout:g} s") from exc
    except PoolTimeout as exc:
        raise StorageUnavailable("no PostgreSQL connection became free in time") from exc
    except psycopg.errors.IntegrityError as exc:
        raise Conflict(f"constraint violated: {exc}") from exc
    except psycopg.Error as exc:
        raise StorageUnavailable(f"PostgreSQL error: {exc}") from exc


class _PostgresConnection:
    def __init__(self, conn: psycopg.AsyncConnection[Any], timeout: float) -> None:
        self._conn = conn
        self._timeout = timeout

    async def fetch(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        async with _mapped(self._timeout):
            cursor = await self._conn.execute(_translate(sql), tuple(params))
            return await cursor.fetchall()

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        async with _mapped(self._timeout):
            cursor = await self._conn.execute(_translate(sql), tuple(params))
            return cursor.rowcount


def _outcome_unknown(cause: BaseException | None) -> bool:
    """Whether a failed ``COMMIT`` may have committed: no answer in time, or the connection (SQLSTATE class 08) or
    the server (class 57: shutdown, cancel) went away under it. A refusal such as a serialization failure is not."""
    if isinstance(cause, TimeoutError):
        return True
    if isinstance(cause, psycopg.OperationalError):
        state = cause.sqlstate
        return state is None or state.startswith(("08", "57"))
    return False


async def _commit(conn: _PostgresConnection, timeout: float) -> None:
    try:
        await conn.execute("COMMIT")
    except StorageUnavailable as exc:
        if _outcome_unknown(exc.__cause__):
            raise CommitOutcomeUnknown(
                f"the PostgreSQL COMMIT did not complete ({exc.message}); it may or may not have committed"
            ) from exc
        raise


class PostgresBackend:
    """A ``Backend`` on a PostgreSQL database named by a DSN."""

    def __init__(self, pool: AsyncConnectionPool[Any], timeout: float) -> None:
        self._pool = pool
        self._timeout = timeout

    @property
    def dialect(self) -> Dialect:
        return "postgres"

    @classmethod
    async def connect(cls, dsn: str, timeout: float, max_connections: int) -> PostgresBackend:
        millis = int(timeout * 1000)
        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            dsn,
            min_size=1,
            max_size=max_connections,
            timeout=timeout,
            open=False,
            kwargs={
                "autocommit": True,
                "connect_timeout": max(1, int(timeout)),
                "options": f"-c statement_timeout={millis} -c lock_timeout={millis} -c TimeZone=UTC",
            },
        )
        try:
            async with _mapped(timeout):
                await pool.open(wait=True, timeout=timeout)
        except BaseException as exc:
            await pool.close()
            if isinstance(exc, StorageUnavailable):
                raise StorageUnavailable(f"cannot connect to PostgreSQL: {exc.message}") from exc
            raise
        return cls(pool, timeout)

    @asynccontextmanager
    async def _transaction(self, read_only: bool) -> AsyncIterator[Connection]:
        if self._pool.closed:
            raise StorageUnavailable("the PostgreSQL database is closed")
        async with _mapped(self._timeout):
            conn = await self._pool.getconn(timeout=self._timeout)
        try:
            wrapped = _PostgresConnection(conn, self._timeout)
            await wrapped.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY" if read_only else "BEGIN")
            committed = False
            try:
                yield wrapped
                await _commit(wrapped, self._timeout)
                committed = True
            finally:
                if not committed:
                    await asyncio.shield(self._rollback(conn))
        finally:
            await asyncio.shield(self._pool.putconn(conn))

    async def _rollback(self, conn: psycopg.AsyncConnection[Any]) -> None:
        try:
            async with asyncio.timeout(self._timeout):
                await conn.execute("ROLLBACK")
        except (psycopg.Error, TimeoutError, OSError):
            # A connection that cannot roll back is not reused: the pool discards closed connections.
            with contextlib.suppress(psycopg.Error, OSError):
                await conn.close()

    def transaction(self, *, read_only: bool) -> AbstractAsyncContextManager[Connection]:
        return self._transaction(read_only)

    async def aclose(self) -> None:
        if not self._pool.closed:
            await self._pool.close(timeout=self._timeout)
