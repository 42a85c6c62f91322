"""The PostgreSQL backend (psycopg 3, async pool) with LISTEN/NOTIFY fan-out across replicas.

Owns: ``PostgresResourceStore`` / ``open_postgres_store`` and the PostgreSQL ``Backend``: write transactions
serialized by a row lock on the resourceVersion counter (so versions commit in order), REPEATABLE READ snapshot
reads, ``NOTIFY`` on commit and a listener task that wakes the watch pump, psycopg errors → ``StoreUnavailable``.
Must not do: Kubernetes semantics (``_semantics``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from loopd._infra.backoff import Backoff

from . import _sql as sql
from ._errors import StoreUnavailable
from ._semantics import StoreEngine
from ._store import StoreOptions

try:
    import psycopg
    from psycopg_pool import AsyncConnectionPool, PoolTimeout
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("PostgresResourceStore needs the 'postgres' extra: pip install 'pyloopd[postgres]'") from exc

_log = logging.getLogger(__name__)
_RETRY = Backoff(base=0.4, factor=2.0, max_delay=5.0)
_CHANNEL = "loopd_resources"
_SCHEMA_LOCK = 7_305_553_211  # pg_advisory_xact_lock key guarding concurrent schema creation


def _translate(statement: str) -> str:
    return statement.replace("?", "%s")


class _PostgresConnection:
    def __init__(self, conn: psycopg.AsyncConnection[Any], timeout: float) -> None:
        self._conn = conn
        self._timeout = timeout

    async def fetch(self, statement: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        async with _errors_mapped(self._timeout):
            cursor = await self._conn.execute(_translate(statement), tuple(params))
            return await cursor.fetchall()

    async def execute(self, statement: str, params: Sequence[Any] = ()) -> None:
        async with _errors_mapped(self._timeout):
            await self._conn.execute(_translate(statement), tuple(params))


@asynccontextmanager
async def _errors_mapped(timeout: float) -> AsyncIterator[None]:
    try:
        async with asyncio.timeout(timeout):
            yield
    except TimeoutError as exc:
        raise StoreUnavailable("the PostgreSQL resource store timed out") from exc
    except PoolTimeout as exc:
        raise StoreUnavailable("no PostgreSQL connection available") from exc
    except psycopg.Error as exc:
        raise StoreUnavailable(f"PostgreSQL resource store error: {exc}") from exc


class PostgresBackend:
    def __init__(self, dsn: str, pool: AsyncConnectionPool[Any], timeout: float) -> None:
        self._dsn = dsn
        self._pool = pool
        self._timeout = timeout
        self._listener: asyncio.Task[None] | None = None

    @classmethod
    async def connect(cls, dsn: str, timeout: float, max_connections: int = 10) -> PostgresBackend:
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
                "options": f"-c statement_timeout={millis} -c lock_timeout={millis}",
            },
        )
        backend = cls(dsn, pool, timeout)
        try:
            async with _errors_mapped(timeout):
                await pool.open(wait=True, timeout=timeout)
            async with backend._transaction(lock=False) as conn:
                await conn.execute("SELECT pg_advisory_xact_lock(?)", (_SCHEMA_LOCK,))
                for statement in sql.SCHEMA_STATEMENTS:
                    await conn.execute(statement)
        except BaseException:
            await pool.close()
            raise
        return backend

    @asynccontextmanager
    async def _transaction(self, *, lock: bool, read_only: bool = False) -> AsyncIterator[sql.Connection]:
        if self._pool.closed:
            raise StoreUnavailable("the PostgreSQL resource store is closed")
        try:
            async with self._pool.connection(timeout=self._timeout) as conn, conn.transaction():
                wrapped = _PostgresConnection(conn, self._timeout)
                if read_only:
                    await wrapped.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                if lock:
                    # Every writer takes this row lock first: writes serialize, versions commit in order.
                    await wrapped.fetch("SELECT value FROM resource_counters WHERE key = 'rv' FOR UPDATE")
                yield wrapped
        except PoolTimeout as exc:
            raise StoreUnavailable("no PostgreSQL connection available") from exc
        except psycopg.Error as exc:
            raise StoreUnavailable(f"PostgreSQL resource store error: {exc}") from exc

    def write(self) -> AbstractAsyncContextManager[sql.Connection]:
        return self._transaction(lock=True)

    def read(self) -> AbstractAsyncContextManager[sql.Connection]:
        return self._transaction(lock=False, read_only=True)

    async def announce(self, conn: sql.Connection) -> None:
        await conn.execute(f"NOTIFY {_CHANNEL}")

    def listen(self, wake: Any) -> None:
        if self._listener is None:
            self._listener = asyncio.create_task(self._listen(wake), name="loopd-resources-pg-listener")

    async def _listen(self, wake: Any) -> None:
        failures = 0
        while True:
            try:
                async with asyncio.timeout(self._timeout):
                    conn = await psycopg.AsyncConnection.connect(
                        self._dsn, autocommit=True, connect_timeout=max(1, int(self._timeout))
                    )
            except (psycopg.Error, OSError, TimeoutError) as exc:
                failures += 1
                _log.warning("resource store listener cannot connect (%s); retrying", exc)
                await asyncio.sleep(_RETRY.after_failures(failures))
                continue
            try:
                async with conn:
                    await conn.execute(f"LISTEN {_CHANNEL}")
                    failures = 0
                    wake.set()  # changes may have happened while we were not listening
                    async for _ in conn.notifies():
                        wake.set()
            except (psycopg.Error, OSError) as exc:
                failures += 1
                _log.warning("resource store listener lost its connection (%s); reconnecting", exc)
                await asyncio.sleep(_RETRY.after_failures(failures))

    async def aclose(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._listener
            self._listener = None
        await self._pool.close(timeout=self._timeout)


class PostgresResourceStore(StoreEngine):
    """The same store contract on PostgreSQL, for distributed loop-server replicas."""

    @classmethod
    async def open(cls, dsn: str, *, options: StoreOptions | None = None) -> PostgresResourceStore:
        options = options or StoreOptions()
        backend = await PostgresBackend.connect(dsn, options.operation_timeout)
        store = cls(backend, options)
        try:
            await store._start()
        except BaseException:
            await store.aclose()
            raise
        return store


@asynccontextmanager
async def open_postgres_store(dsn: str, *, options: StoreOptions | None = None) -> AsyncIterator[PostgresResourceStore]:
    store = await PostgresResourceStore.open(dsn, options=options)
    try:
        yield store
    finally:
        await store.aclose()
