"""The PostgreSQL backend (the floor's pool, ``loopd._infra.postgres``) with LISTEN/NOTIFY fan-out across replicas.

Owns: ``PostgresResourceStore`` / ``open_postgres_store`` and the PostgreSQL ``Backend``: write transactions
serialized by a row lock on the resourceVersion counter (so versions commit in order), REPEATABLE READ snapshot
reads, the store's schema migrated on open, ``NOTIFY`` on commit and a listener task that wakes the watch pump;
every failure is ``StoreUnavailable``.
Must not do: Kubernetes semantics (``_semantics``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from loopd._infra.backoff import Backoff
from loopd._infra.migrations import migrate
from loopd._infra.tasks import cancel_and_wait

from . import _sql as sql
from ._semantics import SemanticStore
from ._store import StoreOptions

try:
    from loopd._infra.postgres import PostgresDatabase, PostgresOptions
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("PostgresResourceStore needs the 'postgres' extra: pip install 'pyloopd[postgres]'") from exc

_log = logging.getLogger(__name__)
_RETRY = Backoff(base=0.4, factor=2.0, max_delay=5.0)
_CHANNEL = "loopd_resources"


class PostgresBackend:
    """The store's transactions on the floor's PostgreSQL pool (``loopd._infra.postgres``)."""

    def __init__(self, database: PostgresDatabase) -> None:
        self.database = database
        self._timeout = database.options.timeout
        self._listener: asyncio.Task[None] | None = None

    @classmethod
    async def connect(cls, dsn: str, timeout: float, max_connections: int = 10) -> PostgresBackend:
        database = await PostgresDatabase.open(
            dsn,
            PostgresOptions(
                timeout=timeout, max_connections=max_connections, label="PostgreSQL resource store", errors=sql.ERRORS
            ),
        )
        try:
            await migrate(database, sql.SCHEMA)
        except BaseException:
            await database.aclose()
            raise
        return cls(database)

    @asynccontextmanager
    async def _transaction(self, *, lock: bool, read_only: bool = False) -> AsyncIterator[sql.Connection]:
        async with self.database.transaction(read_only=read_only) as conn:
            if lock:
                # Every writer takes this row lock first: writes serialize, versions commit in order.
                await conn.fetch("SELECT value FROM resource_counters WHERE key = 'rv' FOR UPDATE")
            yield conn

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
        await self.database.listen(
            _CHANNEL,
            lambda _payload: wake.set(),
            on_listening=wake.set,  # changes may have happened while we were not listening
            backoff=_RETRY,
            log=_log,
            what="resource store listener",
        )

    async def aclose(self) -> None:
        if self._listener is not None:
            await cancel_and_wait(self._listener)
            self._listener = None
        await self.database.aclose()


class PostgresResourceStore(SemanticStore):
    """The same store contract on PostgreSQL, for distributed loop-server replicas."""

    @classmethod
    async def open(cls, dsn: str, *, options: StoreOptions | None = None) -> PostgresResourceStore:
        options = options or StoreOptions()
        backend = await PostgresBackend.connect(dsn, options.operation_timeout)
        return await cls._open_on(backend, options)


@asynccontextmanager
async def open_postgres_store(dsn: str, *, options: StoreOptions | None = None) -> AsyncIterator[PostgresResourceStore]:
    store = await PostgresResourceStore.open(dsn, options=options)
    try:
        yield store
    finally:
        await store.aclose()
