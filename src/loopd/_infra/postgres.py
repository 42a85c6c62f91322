"""PostgreSQL through psycopg 3 (async) and a bounded ``psycopg_pool`` pool, every call with a timeout.

Owns: ``PostgresOptions`` and ``PostgresDatabase``, the ``loopd._infra.database.Database`` on a DSN: the pool
(connect, statement and lock timeouts set per session), explicit ``BEGIN``/``COMMIT``/``ROLLBACK`` so that every
step is bounded by the timeout, READ COMMITTED write transactions, REPEATABLE READ read-only transactions, and
``psycopg`` errors → the caller's ``DatabaseErrors`` (``mapped``). A ``COMMIT`` that times out or loses its
connection is ``errors.outcome_unknown``: the server may have committed it. For users that speak psycopg
directly (single statements), ``connection``/``pooled`` lend a pooled connection and ``connect`` makes a
dedicated one; ``listen`` keeps a ``LISTEN`` connection up (keepalive, reconnect with backoff).
Must not do: SQL of any table; schema versions (``loopd._infra.migrations``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from loopd._infra.backoff import Backoff
from loopd._infra.database import Connection, DatabaseErrors, Dialect
from loopd._infra.tasks import finish_shielded

try:
    import psycopg
    from psycopg import sql
    from psycopg_pool import AsyncConnectionPool, PoolTimeout
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("PostgreSQL needs the 'postgres' extra: pip install 'pyloopd[postgres]'") from exc

PgConnection = psycopg.AsyncConnection[Any]


@dataclass(frozen=True, slots=True)
class PostgresOptions:
    timeout: float = 10.0
    """Upper bound, in seconds, for every call (pool checkout included) on the client."""
    max_connections: int = 10
    min_connections: int = 1
    server_timeout: float | None = None
    """The server's ``statement_timeout``/``lock_timeout``; default ``timeout``."""
    settings: tuple[tuple[str, str], ...] = ()
    """More session settings, e.g. ``(("TimeZone", "UTC"),)``."""
    application_name: str | None = None
    pool_name: str | None = None
    label: str = "PostgreSQL"
    """How error messages name the database."""
    errors: DatabaseErrors = field(default_factory=DatabaseErrors)


def translate(sql: str) -> str:
    """``?`` placeholders → psycopg's ``%s``."""
    return sql.replace("?", "%s")


def commit_outcome_unknown(cause: BaseException | None) -> bool:
    """Whether a failed ``COMMIT`` may have committed: no answer in time, or the connection (SQLSTATE class 08) or
    the server (class 57: shutdown, cancel) went away under it. A refusal such as a serialization failure is not."""
    if isinstance(cause, TimeoutError):
        return True
    if isinstance(cause, psycopg.OperationalError):
        state = cause.sqlstate
        return state is None or state.startswith(("08", "57"))
    return False


class _Mapped:
    """`PostgresDatabase.mapped`: a class rather than a generator-based context manager, because every statement
    enters one (≈ 4 µs less each)."""

    __slots__ = ("_options", "_timeout", "_what")

    def __init__(self, options: PostgresOptions, what: str) -> None:
        self._options = options
        self._what = what
        self._timeout: asyncio.Timeout | None = None

    async def __aenter__(self) -> None:
        self._timeout = asyncio.timeout(self._options.timeout)
        await self._timeout.__aenter__()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        timeout, self._timeout = self._timeout, None
        try:
            if timeout is not None:
                await timeout.__aexit__(exc_type, exc, tb)  # an expired deadline: the cancellation → TimeoutError
        except TimeoutError as expired:
            exc = expired
        if exc is None:
            return
        options = self._options
        errors = options.errors
        prefix = f"{self._what}: " if self._what else ""
        if isinstance(exc, TimeoutError):
            raise errors.unavailable(f"{prefix}{options.label} did not answer within {options.timeout:g} s") from exc
        if isinstance(exc, PoolTimeout):
            raise errors.unavailable(f"{prefix}no {options.label} connection became free in time") from exc
        if isinstance(exc, psycopg.errors.IntegrityError):
            raise errors.conflict(f"{prefix}constraint violated: {exc}") from exc
        if isinstance(exc, psycopg.Error):
            raise errors.unavailable(f"{prefix}{options.label} error: {exc}") from exc
        return  # anything else goes on as it is


class _PostgresTransaction:
    def __init__(self, database: PostgresDatabase, conn: PgConnection) -> None:
        self._database = database
        self._conn = conn

    async def fetch(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        async with self._database.mapped():
            cursor = await self._conn.execute(translate(sql), tuple(params))
            return await cursor.fetchall()

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        async with self._database.mapped():
            cursor = await self._conn.execute(translate(sql), tuple(params))
            return cursor.rowcount


class PostgresDatabase:
    """A ``Database`` on a PostgreSQL DSN. Open with ``await PostgresDatabase.open(dsn, options)``."""

    def __init__(self, dsn: str, pool: AsyncConnectionPool[PgConnection], options: PostgresOptions) -> None:
        self.dsn = dsn
        self._pool = pool
        self._options = options

    @property
    def dialect(self) -> Dialect:
        return "postgres"

    @property
    def errors(self) -> DatabaseErrors:
        return self._options.errors

    @property
    def options(self) -> PostgresOptions:
        return self._options

    @property
    def closed(self) -> bool:
        return self._pool.closed

    def connect_kwargs(self) -> dict[str, Any]:
        return _connect_kwargs(self._options)

    @classmethod
    async def open(cls, dsn: str, options: PostgresOptions | None = None) -> PostgresDatabase:
        options = options or PostgresOptions()
        extra: dict[str, Any] = {}
        if options.pool_name is not None:
            extra["name"] = options.pool_name
        pool: AsyncConnectionPool[PgConnection] = AsyncConnectionPool(
            dsn,
            min_size=options.min_connections,
            max_size=options.max_connections,
            timeout=options.timeout,
            open=False,
            kwargs=_connect_kwargs(options),
            **extra,
        )
        database = cls(dsn, pool, options)
        try:
            async with database.mapped():
                await pool.open(wait=True, timeout=options.timeout)
        except BaseException as exc:
            await pool.close()
            if isinstance(exc.__cause__, (psycopg.Error, PoolTimeout, TimeoutError)):
                raise options.errors.unavailable(f"cannot connect to {options.label}: {exc}") from exc
            raise
        return database

    def mapped(self, what: str = "") -> _Mapped:
        """A deadline of ``timeout`` for one call, and psycopg failures → ``errors`` (``what`` prefixes messages)."""
        return _Mapped(self._options, what)

    def _check_open(self) -> None:
        if self._pool.closed:
            raise self._options.errors.unavailable(f"the {self._options.label} database is closed")

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[PgConnection]:
        """A pooled connection (autocommit) for the block; the checkout is bounded by ``timeout``."""
        self._check_open()
        async with self.mapped():
            conn = await self._pool.getconn(timeout=self._options.timeout)
        try:
            yield conn
        finally:
            await asyncio.shield(self._pool.putconn(conn))

    def pooled(self) -> AbstractAsyncContextManager[PgConnection]:
        """A pooled connection (autocommit), for a caller that bounds and maps the whole block itself
        (``async with db.mapped("reading"), db.pooled() as conn:``): the cheapest way to one statement."""
        self._check_open()
        return self._pool.connection(timeout=self._options.timeout)

    async def connect(self) -> PgConnection:
        """A new connection outside the pool (e.g. for ``LISTEN``), with the same session settings."""
        async with self.mapped():
            return await psycopg.AsyncConnection.connect(self.dsn, **_connect_kwargs(self._options))

    async def listen(
        self,
        channel: str,
        on_notify: Callable[[str], None],
        *,
        on_listening: Callable[[], None],
        backoff: Backoff,
        log: logging.Logger,
        what: str,
        keepalive: float = 30.0,
    ) -> None:
        """Keep one ``LISTEN channel`` connection up until cancelled: ``on_notify(payload)`` per notification,
        ``on_listening()`` each time listening (re)starts (notifications sent meanwhile are lost), a ``SELECT 1``
        after ``keepalive`` quiet seconds to find a dead connection, and reconnecting with ``backoff`` (each
        failure logged as a warning naming ``what``)."""
        failures = 0
        timeout = self._options.timeout
        while True:
            try:
                conn = await self.connect()  # bounded by the timeout
            except Exception as exc:  # whatever broke, keep trying with backoff
                failures += 1
                log.warning("%s cannot connect (%s); retrying", what, exc)
                await asyncio.sleep(backoff.after_failures(failures))
                continue
            try:
                async with conn:
                    async with asyncio.timeout(timeout):
                        await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
                    failures = 0
                    on_listening()
                    while True:
                        async for note in conn.notifies(timeout=keepalive):
                            on_notify(note.payload)
                        async with asyncio.timeout(timeout):  # a quiet channel: is the connection alive?
                            await conn.execute("SELECT 1")
            except Exception as exc:
                failures += 1
                log.warning("%s lost its connection (%s); reconnecting", what, exc)
                await asyncio.sleep(backoff.after_failures(failures))

    @asynccontextmanager
    async def _transaction(self, read_only: bool) -> AsyncIterator[Connection]:
        async with self.connection() as conn:
            tx = _PostgresTransaction(self, conn)
            await tx.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY" if read_only else "BEGIN")
            committed = False
            try:
                yield tx
                await self._commit(tx)
                committed = True
            finally:
                if not committed:
                    await finish_shielded(self._rollback(conn))

    async def _commit(self, tx: _PostgresTransaction) -> None:
        try:
            await tx.execute("COMMIT")
        except Exception as exc:
            if commit_outcome_unknown(exc.__cause__):
                raise self._options.errors.outcome_unknown(
                    f"the {self._options.label} COMMIT did not complete ({exc}); it may or may not have committed"
                ) from exc
            raise

    async def _rollback(self, conn: PgConnection) -> None:
        try:
            async with asyncio.timeout(self._options.timeout):
                await conn.execute("ROLLBACK")
        except (psycopg.Error, TimeoutError, OSError):
            # A connection that cannot roll back is not reused: the pool discards closed connections.
            with contextlib.suppress(psycopg.Error, OSError):
                await conn.close()

    def transaction(self, *, read_only: bool) -> AbstractAsyncContextManager[Connection]:
        return self._transaction(read_only)

    async def aclose(self) -> None:
        if not self._pool.closed:
            await self._pool.close(timeout=self._options.timeout)


def _connect_kwargs(options: PostgresOptions) -> dict[str, Any]:
    millis = max(1, int((options.timeout if options.server_timeout is None else options.server_timeout) * 1000))
    settings = [("statement_timeout", str(millis)), ("lock_timeout", str(millis)), *options.settings]
    kwargs: dict[str, Any] = {
        "autocommit": True,
        "connect_timeout": max(1, int(options.timeout)),
        "options": " ".join(f"-c {name}={value}" for name, value in settings),
    }
    if options.application_name is not None:
        kwargs["application_name"] = options.application_name
    return kwargs
