"""The loop-server database: one handle over SQLite (default) or PostgreSQL, and its transactions.

Owns: ``Database`` (open → migrate → transactions → ``aclose``), ``DatabaseOptions``, ``open_database`` and
``Transaction``, which binds every repository to one open transaction so their writes commit or roll back
together. Must not do: SQL of any table (repositories) or driver details (the floor: ``loopd._infra.sqlite``,
``loopd._infra.postgres``; schema steps run through ``loopd._infra.migrations``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from pathlib import Path
from types import TracebackType
from typing import Final

from loopd._infra.clock import Clock, SystemClock
from loopd._infra.database import Connection, DatabaseErrors, Dialect
from loopd._infra.database import Database as Backend
from loopd._infra.migrations import migrate, schema_version

from ._actor_leases import ActorLeases
from ._conversations import Conversations
from ._errors import CommitOutcomeUnknown, Conflict, InvalidRecord, SchemaTooNew, StorageUnavailable
from ._forks import ConversationForks
from ._harness_calls import HarnessCalls
from ._human_requests import HumanRequests
from ._leases import Leases
from ._message_events import MessageEvents
from ._messages import Messages
from ._migrations import MIGRATIONS, Migration, schema
from ._task_outputs import TaskOutputs
from ._tx import TransactionCore
from ._values import MonotonicIds

ERRORS = DatabaseErrors(
    unavailable=StorageUnavailable,
    conflict=Conflict,
    outcome_unknown=CommitOutcomeUnknown,
    too_new=SchemaTooNew,
    invalid_schema=InvalidRecord,
)
"""The floor's database errors as storage errors."""


@dataclass(frozen=True)
class DatabaseOptions:
    operation_timeout: float = 10.0
    """Upper bound, in seconds, for every database call (and for waiting to start a transaction)."""
    max_connections: int = 10
    """PostgreSQL pool size."""
    clock: Clock = field(default_factory=SystemClock)
    """The process's one ``Clock``: its ``now()`` stamps rows and judges deadlines and lease expiry."""
    migrate: bool = True
    """Apply missing schema steps on open (otherwise a database behind the code is used as it is)."""


class Transaction(TransactionCore):
    """One open transaction and the repositories bound to it.

    ``async with db.transaction() as tx: await tx.messages.insert(...)``: everything done through ``tx``
    commits when the block ends and rolls back if it raises.
    """

    outcome_unknown = False
    """True when the ``COMMIT`` may or may not have happened (`after_commit` callbacks run all the same): a callback
    that hands on what the transaction wrote, rather than only waking readers, checks it."""

    def after_commit(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` once this transaction has committed (never on rollback). For wake-ups, not writes."""
        self._after_commit.append(callback)

    def after_sure_commit(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` once this transaction surely committed: never on rollback, nor when the ``COMMIT``'s
        outcome is unknown. For learning what it wrote (a cache of stored facts), not for wake-ups."""

        def committed() -> None:
            if not self.outcome_unknown:
                callback()

        self._after_commit.append(committed)

    def run_after_commit(self) -> None:
        """Run the `after_commit` callbacks (the database calls this once the transaction committed, or may have)."""
        for callback in self._after_commit:
            callback()

    def release(self) -> None:
        """Drop what refers back to this ended transaction — its repositories (each holds it) and its callbacks
        (closures over it) — so that reference counting frees it and them at once. Left as reference cycles, every
        transaction waited for the cyclic collector: a dozen per chat, the largest source of the full collections
        of a busy server. The database calls this when the transaction's block has ended, whatever the outcome."""
        self._after_commit.clear()
        cached = self.__dict__
        for name in _REPOSITORIES:
            cached.pop(name, None)

    @cached_property
    def conversations(self) -> Conversations:
        return Conversations(self)

    @cached_property
    def conversation_forks(self) -> ConversationForks:
        return ConversationForks(self)

    @cached_property
    def messages(self) -> Messages:
        return Messages(self)

    @cached_property
    def message_events(self) -> MessageEvents:
        return MessageEvents(self)

    @cached_property
    def human_requests(self) -> HumanRequests:
        return HumanRequests(self)

    @cached_property
    def actor_leases(self) -> ActorLeases:
        return ActorLeases(self)

    @cached_property
    def harness_calls(self) -> HarnessCalls:
        return HarnessCalls(self)

    @cached_property
    def leases(self) -> Leases:
        return Leases(self)

    @cached_property
    def task_outputs(self) -> TaskOutputs:
        return TaskOutputs(self)


_REPOSITORIES: Final = tuple(name for name, member in vars(Transaction).items() if isinstance(member, cached_property))
"""The repositories a `Transaction` makes on first use (what `Transaction.release` drops)."""


def _is_postgres(url: str) -> bool:
    return url.startswith(("postgresql://", "postgres://"))


class Database:
    """The loop-server database. Open with ``await Database.open(url)`` or ``async with open_database(url)``.

    ``url`` is a PostgreSQL DSN (``postgresql://…``) or a SQLite file path (optionally ``sqlite:///path``).

    Transactions do not nest: pass ``tx`` down instead of opening another one inside. Keep write transactions
    short: on SQLite they run one at a time (a second writer waits up to ``operation_timeout``, then gets
    ``StorageUnavailable``); on PostgreSQL they run concurrently at READ COMMITTED and the repositories take the
    row locks their rules need. Read-only transactions see one snapshot and never wait for a writer.

    A write transaction whose ``COMMIT`` may or may not have happened raises ``CommitOutcomeUnknown`` (its
    ``after_commit`` callbacks run all the same): read back a row it wrote before retrying or compensating.
    """

    def __init__(self, backend: Backend, options: DatabaseOptions) -> None:
        self._backend = backend
        self._options = options
        self._ids = MonotonicIds()

    @classmethod
    async def open(
        cls, url: str | Path, *, options: DatabaseOptions | None = None, migrations: Sequence[Migration] = MIGRATIONS
    ) -> Database:
        options = options or DatabaseOptions()
        if not (options.operation_timeout > 0) or options.max_connections < 1:
            raise InvalidRecord("operation_timeout must be positive and max_connections at least 1")
        backend: Backend
        text = str(url)
        if isinstance(url, str) and _is_postgres(text):
            from loopd._infra.postgres import PostgresDatabase, PostgresOptions

            backend = await PostgresDatabase.open(
                text,
                PostgresOptions(
                    timeout=options.operation_timeout,
                    max_connections=options.max_connections,
                    settings=(("TimeZone", "UTC"),),
                    errors=ERRORS,
                ),
            )
        else:
            from loopd._infra.sqlite import SqliteDatabase, SqliteOptions

            path = text.removeprefix("sqlite:///") if text.startswith("sqlite:///") else text
            backend = await SqliteDatabase.open(
                path,
                SqliteOptions(timeout=options.operation_timeout, thread_name="loopd-storage-sqlite", errors=ERRORS),
            )
        database = cls(backend, options)
        if options.migrate:
            try:
                await migrate(backend, schema(migrations))
            except BaseException:
                await backend.aclose()
                raise
        return database

    @property
    def dialect(self) -> Dialect:
        return self._backend.dialect

    @property
    def options(self) -> DatabaseOptions:
        return self._options

    @property
    def clock(self) -> Clock:
        """The clock this database stamps and judges time by (``options.clock``)."""
        return self._options.clock

    def now(self) -> datetime:
        """Wall time on the database's clock."""
        return self._options.clock.now()

    def transaction(self, *, read_only: bool = False) -> AbstractAsyncContextManager[Transaction]:
        """A transaction with every repository bound to it; ``read_only`` reads one consistent snapshot."""
        return _TransactionContext(self._backend.transaction(read_only=read_only), self._bind, read_only)

    def _bind(self, conn: Connection, read_only: bool) -> Transaction:
        return Transaction(conn, self._backend.dialect, self._options.clock, read_only=read_only, ids=self._ids)

    async def schema_version(self) -> int:
        return await schema_version(self._backend, schema())

    async def migrate(self, migrations: Sequence[Migration] = MIGRATIONS) -> list[int]:
        """Apply missing steps; returns the versions applied now."""
        return await migrate(self._backend, schema(migrations))

    async def aclose(self) -> None:
        await self._backend.aclose()


@asynccontextmanager
async def open_database(
    url: str | Path, *, options: DatabaseOptions | None = None, migrations: Sequence[Migration] = MIGRATIONS
) -> AsyncIterator[Database]:
    """Open (and migrate) a database for the duration of the block."""
    database = await Database.open(url, options=options, migrations=migrations)
    try:
        yield database
    finally:
        await database.aclose()


class _TransactionContext:
    """`Database.transaction`: the backend's transaction for the block, its `after_commit` callbacks run once it
    committed — or may have (`CommitOutcomeUnknown`: whoever waits for its writes is woken; a wake-up that finds
    nothing is harmless) — and the transaction released when it leaves. A class, not a generator context manager:
    see `loopd._infra.sqlite`'s transaction context."""

    __slots__ = ("_bind", "_entered", "_inner", "_read_only", "_tx")

    def __init__(
        self,
        inner: AbstractAsyncContextManager[Connection],
        bind: Callable[[Connection, bool], Transaction],
        read_only: bool,
    ) -> None:
        self._inner = inner
        self._bind = bind
        self._read_only = read_only
        self._entered = False
        self._tx: Transaction | None = None

    async def __aenter__(self) -> Transaction:
        if self._entered:
            raise RuntimeError("a transaction context is entered once")
        self._entered = True
        conn = await self._inner.__aenter__()
        try:
            self._tx = self._bind(conn, self._read_only)
        except BaseException as exc:
            await self._inner.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        return self._tx

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        tx = self._tx
        assert tx is not None  # entered
        try:
            try:
                await self._inner.__aexit__(exc_type, exc, tb)  # commits, or rolls back when the block raised
            except CommitOutcomeUnknown:
                tx.outcome_unknown = True
                tx.run_after_commit()
                raise
            if isinstance(exc, CommitOutcomeUnknown):  # from inside the block: treated as the commit's own
                tx.outcome_unknown = True
                tx.run_after_commit()
            elif exc_type is None:
                tx.run_after_commit()
        finally:
            tx.release()
