"""SQLite on worker threads: one file, a writer lane and (optionally) a reader lane, every call with a timeout.

Owns: ``SqliteLane`` (one ``sqlite3`` connection, the single thread that uses it, the lock that admits one
transaction; opening with the pragmas of ``SqliteOptions`` and a private 0600 file), and ``SqliteDatabase``, the
``loopd._infra.database.Database`` on it: write transactions (``BEGIN IMMEDIATE``, one at a time in this process
and across processes), read transactions on the reader lane (one snapshot, never waiting for a writer), and
``sqlite3`` errors → the caller's ``DatabaseErrors``.
Must not do: SQL of any table; schema versions (``loopd._infra.migrations``).

Cancellation and timeouts: ``BEGIN`` rides along with a transaction's first statement, on the lane thread. A
caller that is cancelled or times out while that thread still runs its ``BEGIN`` (or any statement) leaves the
transaction open there; the next transaction on the lane rolls it back first (the lane knows which transaction
owns the connection), and an abandoned write transaction queues its ``ROLLBACK`` behind it (shielded). A
``COMMIT`` that times out keeps running on its thread: the transaction waits (one more timeout) for it to settle
and reports what happened; only when it still has not settled is the outcome unknown (``errors.outcome_unknown``).

Inline statements: while the lane thread has nothing queued or running, a transaction's statements run on the event
loop's thread, without a hop: its ``BEGIN`` with its first statement too (``BEGIN IMMEDIATE`` takes the write lock; a
read's first statement takes its WAL snapshot), and in WAL mode with ``synchronous`` below ``FULL`` its ``COMMIT`` (a
write lock already held: such a commit appends to the WAL, waits for nobody and syncs nothing; at ``FULL`` the commit's
fsync runs on the lane thread). Inline calls never wait for a lock: SQLite's busy timeout is 0 for them, and
one that would wait (``SQLITE_BUSY``: another process writes) runs again on the lane thread, which waits. So a write
transaction holds the process's write lock for the time its statements take, not for two thread hops (under load each
hop waits for the GIL and the scheduler: measured, 4x the lock's held time). The writer's WAL checkpoints never run
inline: ``wal_autocheckpoint`` is off on the writer connection and a ``PASSIVE`` checkpoint is queued after about as
many written pages as SQLite's default (1000) — on the reader lane's thread when no read transaction is open there
(a checkpoint needs none on its connection; the writer's statements stay inline while it runs), else on the
writer's.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import sqlite3
import threading
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Future
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Literal, TypeVar

from loopd._infra.database import Connection, DatabaseErrors, Dialect
from loopd._infra.files import ensure_private_file
from loopd._infra.tasks import finish_shielded

_T = TypeVar("_T")

CHECKPOINT_PAGES = 1000
"""About how many written WAL pages between two checkpoints of a database's writer (SQLite's own default)."""
YIELD_AFTER: Final = 0.002
"""Seconds one task may go on starting transactions on a database without the event loop getting a turn before its
next one first yields to it once (see `SqliteDatabase._acquire`)."""


@dataclass(frozen=True, slots=True)
class SqliteOptions:
    timeout: float = 10.0
    """Upper bound, in seconds, for every call on a lane and for waiting to start a transaction."""
    busy_timeout: float | None = None
    """SQLite's own wait for another connection's lock; default 0.8 × ``timeout`` (so SQLite gives up a little
    before our timeout and the lane thread is free again)."""
    wal: bool = True
    """``journal_mode=WAL`` (readers never wait for the writer)."""
    synchronous: Literal["OFF", "NORMAL", "FULL"] = "NORMAL"
    """In WAL mode ``NORMAL`` survives a process crash; ``FULL`` also survives power loss (an fsync per commit)."""
    pragmas: tuple[str, ...] = ()
    """More ``PRAGMA`` settings for every connection, e.g. ``("foreign_keys=OFF",)``."""
    private: bool = True
    """Create the file 0600 (and tighten an existing one and its ``-wal``/``-shm`` files)."""
    reader: bool = True
    """A second connection, on its own thread, for read transactions; without it reads take the writer lane."""
    thread_name: str = "loopd-sqlite"
    label: str = "the SQLite database"
    """How error messages name the database."""
    errors: DatabaseErrors = field(default_factory=DatabaseErrors)


class _LaneThread:
    """One thread running jobs in order from an unbounded-by-design queue: every job is a statement its caller
    awaits (bounded by the callers, one transaction at a time per lane). Cheaper per hop than a
    ``ThreadPoolExecutor`` (no concurrent future, no chained callback for an awaited call)."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], bool | None] | None] = queue.SimpleQueue()
        self._closed = False
        self._queued = 0  # written by the queuing thread only
        self._finished = 0  # written by the lane thread only
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            counted = False
            try:
                counted = bool(job())
            finally:
                if not counted:
                    self._finished += 1

    def finished(self) -> bool:
        """Count the running job as finished before it tells its caller (so the caller finds the lane idle); the
        job then returns True. On the lane thread only."""
        self._finished += 1
        return True

    @property
    def idle(self) -> bool:
        """Whether every queued job has finished (read on the thread that queues; each counter has one writer)."""
        return self._finished == self._queued

    def put(self, job: Callable[[], bool | None]) -> None:
        """Queue ``job``; ``RuntimeError`` once shut down."""
        if self._closed:
            raise RuntimeError("the SQLite lane is shut down")
        self._queued += 1
        self._jobs.put(job)

    def shutdown(self) -> None:
        """Run what is queued, then stop (idempotent)."""
        if not self._closed:
            self._closed = True
            self._jobs.put(None)

    def join(self) -> None:
        self._thread.join()


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
    return code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


def _settle(future: asyncio.Future[_T], result: _T | None, error: BaseException | None) -> None:
    if future.done():  # the caller timed out or was cancelled: nobody waits for this any more
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)  # type: ignore[arg-type]


class SqliteLane:
    """One ``sqlite3`` connection, the single thread that uses it, and the lock that admits one transaction."""

    def __init__(self, path: Path, options: SqliteOptions, *, query_only: bool, name: str) -> None:
        self.path = path
        self.options = options
        self._query_only = query_only
        self._thread = _LaneThread(name)
        self._conn: sqlite3.Connection | None = None
        self._busy_ms = 0
        self._busy_waits = True  # the connection's busy timeout is the configured one (False: 0, for inline calls)
        self.lock = asyncio.Lock()
        self.lock_waiters = 0
        """Transactions waiting for ``lock`` (with a timeout): while any waits, a newcomer queues behind them too."""
        self.owner: object | None = None
        """The transaction open on the connection; read and written on the lane thread only."""

    def _connect(self) -> None:
        options = self.options
        if options.private and not self._query_only:
            ensure_private_file(self.path)  # SQLite then creates the -wal/-shm files with the same mode
        busy = options.timeout * 0.8 if options.busy_timeout is None else options.busy_timeout
        conn = sqlite3.connect(str(self.path), timeout=busy, isolation_level=None, check_same_thread=False)
        self._busy_ms = max(0, int(busy * 1000))
        try:
            conn.execute(f"PRAGMA busy_timeout={self._busy_ms}")
            if options.wal:
                conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={options.synchronous}")
            for pragma in options.pragmas:
                conn.execute(f"PRAGMA {pragma}")
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
        """The connection (``None`` once closed). Use it on the lane thread only, or while nothing else can."""
        return self._conn

    @property
    def conn(self) -> sqlite3.Connection:
        if self._conn is None:
            raise self.options.errors.unavailable(f"{self.options.label} is closed")
        return self._conn

    def busy_waits(self, conn: sqlite3.Connection, wait: bool) -> None:
        """Set SQLite's busy timeout for the next statement: the configured one on the lane thread, 0 inline."""
        if self._busy_waits != wait:
            conn.execute(f"PRAGMA busy_timeout={self._busy_ms if wait else 0}")
            self._busy_waits = wait

    @property
    def can_run_inline(self) -> bool:
        """Whether a statement may run on the calling thread now: the connection is open and the lane thread has
        nothing queued or running (so nothing else uses the connection meanwhile)."""
        return self._conn is not None and self._thread.idle

    def run_inline(self, fn: Callable[[], _T]) -> _T:
        """Run ``fn`` here, with the same error mapping as `call` (the caller checked `can_run_inline`)."""
        errors = self.options.errors
        try:
            return fn()
        except sqlite3.IntegrityError as exc:
            raise errors.conflict(f"constraint violated: {exc}") from exc
        except sqlite3.Error as exc:
            raise errors.unavailable(f"SQLite error: {exc}") from exc

    def _run_on_thread(self, fn: Callable[[], _T]) -> asyncio.Future[_T]:
        """Queue ``fn`` on the lane thread; its outcome settles the returned future on this loop."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[_T] = loop.create_future()

        def job() -> bool:
            try:
                if self._conn is not None:
                    self.busy_waits(self._conn, True)
                result, error = fn(), None
            except BaseException as exc:  # handed to the caller, whatever it is
                result, error = None, exc
            counted = self._thread.finished()
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
                loop.call_soon_threadsafe(_settle, future, result, error)
            return counted

        self._thread.put(job)
        return future

    async def call(self, fn: Callable[[], _T], *, opening: bool = False) -> _T:
        """Run ``fn`` on the lane thread, waiting at most ``timeout`` (it keeps running there after that)."""
        options = self.options
        errors = options.errors
        if self._conn is None and not opening:
            raise errors.unavailable(f"{options.label} is closed")
        try:
            async with asyncio.timeout(options.timeout):
                return await self._run_on_thread(fn)
        except TimeoutError as exc:
            raise errors.unavailable(f"{options.label} did not answer within {options.timeout:g} s") from exc
        except sqlite3.IntegrityError as exc:
            raise errors.conflict(f"constraint violated: {exc}") from exc
        except sqlite3.Error as exc:
            raise errors.unavailable(f"SQLite error: {exc}") from exc
        except RuntimeError as exc:  # the lane was shut down under us
            raise errors.unavailable(f"{options.label} is closed") from exc

    def submit(self, fn: Callable[[], _T]) -> Future[_T]:
        """Queue ``fn`` on the lane thread; the caller bounds its wait for the returned future (``RuntimeError``
        once the lane is closed). A future cancelled before its turn does not run."""
        future: Future[_T] = Future()

        def job() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(fn())
            except BaseException as exc:  # handed to the caller, whatever it is
                future.set_exception(exc)

        self._thread.put(job)
        return future

    def submit_and_forget(self, fn: Callable[[], None]) -> None:
        """Queue ``fn`` on the lane thread without waiting for it (its errors are dropped)."""

        def job() -> None:
            with contextlib.suppress(Exception):
                fn()

        with contextlib.suppress(RuntimeError):  # shut down: the connection is closed, and its transaction with it
            self._thread.put(job)

    async def close(self) -> None:
        """Close the connection on its thread (bounded by ``timeout``) and stop the thread."""
        conn, self._conn = self._conn, None
        with contextlib.suppress(TimeoutError, RuntimeError):  # stuck: the thread ends when its call returns
            async with asyncio.timeout(self.options.timeout):
                if conn is not None:
                    await self._run_on_thread(conn.close)
                self._thread.shutdown()
                await asyncio.to_thread(self._thread.join)
        self._thread.shutdown()


class _SqliteTransaction:
    """One transaction on a lane. ``BEGIN`` rides along with the first statement, so a short transaction costs one
    thread hop per statement plus the ``COMMIT`` (none at all when it runs no statement)."""

    def __init__(self, lane: SqliteLane, begin: str) -> None:
        self._lane = lane
        self._begin = begin
        self.used = False  # a statement was handed to the lane thread (so BEGIN may have run)
        self._begun = False  # a statement of this transaction has returned: it owns the connection's transaction
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

    def _inline(self, fn: Callable[[sqlite3.Connection], _T]) -> tuple[bool, _T | None]:
        """Run ``fn`` on this thread if the lane thread is idle (beginning the transaction first when this is its
        first statement): ``(True, result)``; ``(False, None)`` when it must go to the lane thread (lane busy, or
        a lock to wait for)."""
        lane = self._lane
        if not lane.can_run_inline:
            return False, None
        conn, begun = lane.conn, self._begun

        def run() -> _T:
            lane.busy_waits(conn, False)
            if not begun:
                if lane.owner is not self:
                    if conn.in_transaction:  # left open by a transaction whose caller timed out or was cancelled
                        conn.execute("ROLLBACK")
                    lane.owner = None
                    conn.execute(self._begin)  # SQLITE_BUSY here (another process writes): the lane thread waits
                    lane.owner = self
            elif lane.owner is not self or not conn.in_transaction:
                raise sqlite3.OperationalError("the transaction was rolled back by SQLite")
            return fn(conn)

        try:
            result = lane.run_inline(run)
        except Exception as exc:
            cause = exc.__cause__
            if isinstance(cause, sqlite3.OperationalError) and _is_busy(cause):
                return False, None  # it would wait for a lock: the lane thread waits instead
            raise
        self._begun = True
        return True, result

    async def _statement(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        self.used = True
        lane = self._lane
        if self._begun and lane.owner is self and lane.can_run_inline:
            # A later statement of a transaction that runs here (most of them): straight on the connection, the
            # checks of `_inline` already made by its first statement — the same errors, the same busy fallback.
            conn = lane.conn
            if conn.in_transaction:
                lane.busy_waits(conn, False)
                errors = lane.options.errors
                try:
                    return fn(conn)
                except sqlite3.IntegrityError as exc:
                    raise errors.conflict(f"constraint violated: {exc}") from exc
                except sqlite3.OperationalError as exc:
                    if not _is_busy(exc):
                        raise errors.unavailable(f"SQLite error: {exc}") from exc
                    # it would wait for a lock: the lane thread waits instead (below)
                except sqlite3.Error as exc:
                    raise errors.unavailable(f"SQLite error: {exc}") from exc
        done, result = self._inline(fn)
        if done:
            return result  # type: ignore[return-value]
        result = await self._lane.call(self._in_transaction(fn))
        self._begun = True
        return result

    async def fetch(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        args = tuple(params)
        return await self._statement(lambda conn: conn.execute(sql, args).fetchall())

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        args = tuple(params)
        return await self._statement(lambda conn: conn.execute(sql, args).rowcount)

    def end(self, verb: str) -> Callable[[], None]:
        """``COMMIT`` or ``ROLLBACK`` this transaction if it is still the one open on the lane (run on the lane
        thread). A failed ``COMMIT`` rolls back at once, so the outcome is settled in this one call."""
        lane, conn = self._lane, self._lane.connection

        def run() -> None:
            if lane.owner is not self:
                return
            lane.owner = None
            if conn is None:
                raise sqlite3.OperationalError("the database is closed")
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


class SqliteDatabase:
    """A ``Database`` on one SQLite file. Open with ``await SqliteDatabase.open(path, options)``."""

    def __init__(self, writer: SqliteLane, reader: SqliteLane | None, options: SqliteOptions) -> None:
        self._writer = writer
        self._reader = reader
        self._options = options
        self._closed = False
        self._own_checkpoints = False  # the writer's wal_autocheckpoint is off: `_commit` queues checkpoints
        self._changes = 0  # the writer connection's total_changes at the last count
        self._wal_pages = 0  # about how many pages were written to the WAL since the last checkpoint
        # The streak of transactions one task starts without the loop getting a turn: the task's id (a finished task
        # is not kept alive for it), since when, and whether it goes on (a callback ends it at the loop's next turn).
        self._streak: tuple[int, float] = (0, 0.0)
        self._streak_open = False

    @property
    def dialect(self) -> Dialect:
        return "sqlite"

    @property
    def errors(self) -> DatabaseErrors:
        return self._options.errors

    @property
    def writer(self) -> SqliteLane:
        return self._writer

    @property
    def reader(self) -> SqliteLane:
        return self._writer if self._reader is None else self._reader

    @classmethod
    async def open(cls, path: str | Path, options: SqliteOptions | None = None) -> SqliteDatabase:
        options = options or SqliteOptions()
        path = Path(path)
        # In WAL mode the writer's checkpoints run on its lane thread, never inline (see the module docstring).
        written = replace(options, pragmas=(*options.pragmas, "wal_autocheckpoint=0")) if options.wal else options
        writer = SqliteLane(path, written, query_only=False, name=f"{options.thread_name}-w")
        reader = SqliteLane(path, options, query_only=True, name=f"{options.thread_name}-r") if options.reader else None
        try:
            await writer.open()  # first: it creates the file and switches it to WAL
            if reader is not None:
                await reader.open()
        except BaseException as exc:
            await writer.close()
            if reader is not None:
                await reader.close()
            if isinstance(exc, (sqlite3.Error, OSError)) or isinstance(exc.__cause__, (sqlite3.Error, TimeoutError)):
                raise options.errors.unavailable(f"cannot open {options.label} at {path}: {exc}") from exc
            raise
        database = cls(writer, reader, options)
        database._own_checkpoints = options.wal
        return database

    async def _acquire(self, lane: SqliteLane) -> None:
        options = self._options
        if self._closed:
            raise options.errors.unavailable(f"{options.label} is closed")
        # A transaction on an idle lane may run start to end without a hop, so a task running transaction after
        # transaction would not let others run: once it has gone on for `YIELD_AFTER` without the loop getting a turn,
        # its next one yields first (where being cancelled undoes nothing). Not before every transaction: each yield
        # sends the task behind everything ready, and under a burst of requests that cost the server ≈ 15 % of its
        # CPU (a round of 100 chats: ×0.84 CPU per chat, ×1.21 chats/s without it).
        task = id(asyncio.current_task())
        loop = asyncio.get_running_loop()
        now = loop.time()
        starter, since = self._streak
        if not self._streak_open or starter != task:
            self._streak, self._streak_open = (task, now), True
            loop.call_soon(self._end_streak)  # runs once the loop gets a turn: whoever waited has had theirs
        elif now - since >= YIELD_AFTER:
            await asyncio.sleep(0)  # the streak ends here (its callback runs meanwhile)
        lock = lane.lock
        if not lock.locked() and not lane.lock_waiters:
            await lock.acquire()  # free and nobody queued: taken without suspending, so no timer to arm
            return
        lane.lock_waiters += 1
        try:
            async with asyncio.timeout(options.timeout):
                await lock.acquire()
        except TimeoutError as exc:
            raise options.errors.unavailable(f"{options.label} stayed busy for {options.timeout:g} s") from exc
        finally:
            lane.lock_waiters -= 1

    def _end_streak(self) -> None:
        self._streak_open = False

    async def _begin_read(self) -> tuple[SqliteLane, _SqliteTransaction]:
        lane = self.reader
        await self._acquire(lane)
        return lane, _SqliteTransaction(lane, "BEGIN")

    async def _begin_write(self) -> tuple[SqliteLane, _SqliteTransaction]:
        lane = self._writer
        await self._acquire(lane)
        return lane, _SqliteTransaction(lane, "BEGIN IMMEDIATE")

    async def _leave_read(self, lane: SqliteLane, tx: _SqliteTransaction, failed: bool) -> None:
        """The end of a read transaction (its block ended, however) — `_Transaction.__aexit__`."""
        try:
            if tx.used:
                # Ending a read changes nothing, so nobody waits for it: here when the lane thread is idle,
                # else queued there (it runs its calls in order: the next transaction's first statement
                # starts after it).
                end = tx.end("COMMIT")
                if lane.can_run_inline:
                    with contextlib.suppress(Exception):  # like a queued end: nothing to report
                        lane.run_inline(end)
                else:
                    lane.submit_and_forget(end)
        finally:
            lane.lock.release()

    async def _leave_write(self, lane: SqliteLane, tx: _SqliteTransaction, failed: bool) -> None:
        """The end of a write transaction — `_Transaction.__aexit__`: commit it if its block ended normally (and it
        ran a statement), else roll it back (shielded: a cancelled caller still waits for the rollback)."""
        try:
            committed = False
            try:
                if not failed:
                    if tx.used:
                        await self._commit(lane, tx)
                    committed = True
            finally:
                if not committed and tx.used:
                    await finish_shielded(self._rollback(lane, tx))
        finally:
            lane.lock.release()

    async def _commit(self, lane: SqliteLane, tx: _SqliteTransaction) -> None:
        try:
            await self._end_write(lane, tx)
        finally:
            self._count_pages(lane)

    def _count_pages(self, lane: SqliteLane) -> None:
        """After a write: queue a ``PASSIVE`` checkpoint once about ``CHECKPOINT_PAGES`` pages went to the WAL
        since the last one (estimated from the rows changed: a row and an index entry or two) — on the reader
        lane's thread when no read transaction is open there (the writer's statements then stay inline while it
        copies pages: queued behind it, each of them would wait for it and hop), else on the writer's."""
        conn = lane.connection
        if not self._own_checkpoints or conn is None or not lane.can_run_inline:
            return  # a call still runs there (it may use the connection): count after a later commit
        changes = conn.total_changes
        self._wal_pages += 1 + 2 * max(0, changes - self._changes)
        self._changes = changes
        if self._wal_pages >= CHECKPOINT_PAGES:
            self._wal_pages = 0
            reader = self._reader
            target = lane
            if reader is not None and reader.connection is not None and not reader.lock.locked():
                target = reader  # a checkpoint may run on a query-only connection with no transaction open
            checkpointing = target.connection
            assert checkpointing is not None

            def checkpoint() -> None:  # on the lane thread; a failure only delays the next one
                checkpointing.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()

            target.submit_and_forget(checkpoint)

    async def _end_write(self, lane: SqliteLane, tx: _SqliteTransaction) -> None:
        options = self._options
        if options.wal and options.synchronous != "FULL" and lane.can_run_inline:
            conn, end = lane.conn, tx.end("COMMIT")

            def commit() -> None:  # it holds the write lock: a WAL commit waits for nobody
                lane.busy_waits(conn, False)
                end()

            lane.run_inline(commit)
            return
        try:
            await lane.call(tx.end("COMMIT"))
        except Exception as exc:
            if not isinstance(exc.__cause__, TimeoutError):
                raise  # the COMMIT failed and rolled back in the same call: nothing was written
            # The COMMIT is still running on the lane thread. Whatever runs there next runs after it settles.
            with contextlib.suppress(Exception):
                await lane.call(lambda: None)
            if tx.committed:
                return
            if tx.committed is False:
                raise options.errors.unavailable(f"the SQLite COMMIT failed after {options.timeout:g} s") from exc
            raise options.errors.outcome_unknown(
                f"the SQLite COMMIT did not settle within {2 * options.timeout:g} s; it may or may not have committed"
            ) from exc

    @staticmethod
    async def _rollback(lane: SqliteLane, tx: _SqliteTransaction) -> None:
        with contextlib.suppress(Exception):
            # Failing: the connection is unusable; the transaction dies with it and the next BEGIN reports it.
            await lane.call(tx.end("ROLLBACK"))

    def transaction(self, *, read_only: bool) -> AbstractAsyncContextManager[Connection]:
        if read_only:
            return _Transaction(self._begin_read, self._leave_read)
        return _Transaction(self._begin_write, self._leave_write)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        lanes = [self._writer] if self._reader is None else [self._reader, self._writer]
        for lane in lanes:
            try:
                async with asyncio.timeout(self._options.timeout):
                    await lane.lock.acquire()
            except TimeoutError:
                pass  # a transaction is stuck: close under it, its next call fails as unavailable
            else:
                lane.lock.release()
            await lane.close()


class _Transaction:
    """`SqliteDatabase.transaction`: the lane's lock for the block, ``BEGIN`` with its first statement, the end
    when it leaves (`SqliteDatabase._leave_read`, `SqliteDatabase._leave_write`). A class rather than a generator
    context manager: a server opens tens of transactions per request, and a generator costs each of them an async
    generator object, its registration with the event loop and two more frames."""

    __slots__ = ("_begin", "_lane", "_leave", "_tx")

    def __init__(
        self,
        begin: Callable[[], Awaitable[tuple[SqliteLane, _SqliteTransaction]]],
        leave: Callable[[SqliteLane, _SqliteTransaction, bool], Awaitable[None]],
    ) -> None:
        self._begin = begin
        self._leave = leave
        self._lane: SqliteLane | None = None
        self._tx: _SqliteTransaction | None = None

    async def __aenter__(self) -> Connection:
        if self._lane is not None:
            raise RuntimeError("a transaction context is entered once")
        self._lane, self._tx = await self._begin()
        return self._tx

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        lane, tx = self._lane, self._tx
        assert lane is not None and tx is not None  # entered
        await self._leave(lane, tx, exc_type is not None)
