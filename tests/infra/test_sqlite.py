"""The floor's SQLite database (``loopd._infra.sqlite``): BEGIN rides with the first statement, read ends are not
awaited, and the guarantees stay (one writer, one snapshot per read, rollback on errors and cancellation,
errors mapped)."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from loopd._infra.database import ConstraintViolation as Conflict
from loopd._infra.database import DatabaseErrors
from loopd._infra.database import DatabaseUnavailable as StorageUnavailable
from loopd._infra.sqlite import CHECKPOINT_PAGES, YIELD_AFTER, SqliteDatabase, SqliteOptions
from tests.support.waiting import opened_despite_load


async def connect(path: Path, timeout: float) -> SqliteDatabase:
    return await SqliteDatabase.open(path, SqliteOptions(timeout=timeout))


@pytest.fixture
async def backend(tmp_path: Path) -> AsyncIterator[SqliteDatabase]:
    backend = await connect(tmp_path / "db.sqlite", 2.0)
    async with backend.transaction(read_only=False) as conn:
        await conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT NOT NULL)")
    try:
        yield backend
    finally:
        await backend.aclose()


def other_connection(tmp_path: Path) -> sqlite3.Connection:
    return sqlite3.connect(tmp_path / "db.sqlite", isolation_level=None, timeout=0)


async def values(backend: SqliteDatabase) -> list[str]:
    async with backend.transaction(read_only=True) as conn:
        return [row[0] for row in await conn.fetch("SELECT v FROM t ORDER BY id")]


async def test_the_write_lock_is_taken_by_the_first_statement_and_held_to_commit(
    backend: SqliteDatabase, tmp_path: Path
) -> None:
    other = other_connection(tmp_path)
    try:
        async with backend.transaction(read_only=False) as conn:
            await conn.fetch("SELECT count(*) FROM t")  # a read, yet BEGIN IMMEDIATE went with it
            with pytest.raises(sqlite3.OperationalError, match="locked"):
                other.execute("BEGIN IMMEDIATE")
            await conn.execute("INSERT INTO t (v) VALUES ('a')")
        other.execute("BEGIN IMMEDIATE")  # free again after the commit
        other.execute("ROLLBACK")
    finally:
        other.close()
    assert await values(backend) == ["a"]


async def test_a_transaction_without_statements_touches_nothing(backend: SqliteDatabase, tmp_path: Path) -> None:
    other = other_connection(tmp_path)
    try:
        other.execute("BEGIN IMMEDIATE")  # another process writes: an empty block must not wait for it
        async with backend.transaction(read_only=False):
            pass
        async with backend.transaction(read_only=True):
            pass
    finally:
        other.close()


async def test_a_busy_database_fails_the_first_statement_and_the_next_transaction_works(
    tmp_path: Path,
) -> None:
    # SQLite gives up on the lock after 0.3 s; every call is bounded at 30 s (a hang only, however slow the machine).
    backend = await SqliteDatabase.open(tmp_path / "db.sqlite", SqliteOptions(timeout=30, busy_timeout=0.3))
    try:
        async with backend.transaction(read_only=False) as conn:
            await conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT NOT NULL)")
        other = other_connection(tmp_path)
        other.execute("BEGIN IMMEDIATE")
        try:
            with pytest.raises(StorageUnavailable):
                async with backend.transaction(read_only=False) as conn:
                    await conn.execute("INSERT INTO t (v) VALUES ('lost')")
        finally:
            other.close()
        async with backend.transaction(read_only=False) as conn:
            await conn.execute("INSERT INTO t (v) VALUES ('kept')")
        assert await values(backend) == ["kept"]
    finally:
        await backend.aclose()


async def test_a_read_sees_one_snapshot_from_its_first_statement(backend: SqliteDatabase) -> None:
    async with backend.transaction(read_only=False) as conn:
        await conn.execute("INSERT INTO t (v) VALUES ('a')")
    async with backend.transaction(read_only=True) as reader:
        assert await reader.fetch("SELECT v FROM t") == [("a",)]
        async with backend.transaction(read_only=False) as conn:
            await conn.execute("INSERT INTO t (v) VALUES ('b')")
        assert await reader.fetch("SELECT v FROM t ORDER BY id") == [("a",)]
    # the next read starts after the previous one ended (its end was queued, not awaited)
    assert await values(backend) == ["a", "b"]


async def test_reads_and_writes_interleaved_each_see_the_latest_commit(backend: SqliteDatabase) -> None:
    for i in range(50):
        async with backend.transaction(read_only=False) as conn:
            await conn.execute("INSERT INTO t (v) VALUES (?)", (str(i),))
        async with backend.transaction(read_only=True) as reader:
            assert await reader.fetch("SELECT count(*) FROM t") == [(i + 1,)]


async def test_a_conflict_on_the_first_statement_leaves_the_transaction_open(backend: SqliteDatabase) -> None:
    async with backend.transaction(read_only=False) as conn:
        await conn.execute("INSERT INTO t (id, v) VALUES (1, 'a')")
    async with backend.transaction(read_only=False) as conn:
        with pytest.raises(Conflict):
            await conn.execute("INSERT INTO t (id, v) VALUES (1, 'again')")
        await conn.execute("INSERT INTO t (id, v) VALUES (2, 'b')")
    with pytest.raises(RuntimeError):
        async with backend.transaction(read_only=False) as conn:
            await conn.execute("INSERT INTO t (id, v) VALUES (3, 'c')")
            raise RuntimeError("boom")
    assert await values(backend) == ["a", "b"]


async def test_a_failed_commit_rolls_back_and_releases_the_write_lock(backend: SqliteDatabase, tmp_path: Path) -> None:
    async with backend.transaction(read_only=False) as conn:
        await conn.execute("CREATE TABLE parent (id INTEGER PRIMARY KEY)")
        await conn.execute(
            "CREATE TABLE child (id INTEGER PRIMARY KEY,"
            " parent INTEGER REFERENCES parent (id) DEFERRABLE INITIALLY DEFERRED)"
        )
    backend._writer.conn.execute("PRAGMA foreign_keys=ON")  # outside a transaction, on the idle writer
    with pytest.raises(Conflict):
        async with backend.transaction(read_only=False) as conn:
            await conn.execute("INSERT INTO t (v) VALUES ('lost')")
            await conn.execute("INSERT INTO child (id, parent) VALUES (1, 42)")  # checked at COMMIT
    other = other_connection(tmp_path)
    try:
        other.execute("BEGIN IMMEDIATE")  # the failed transaction did not keep the lock
        other.execute("ROLLBACK")
    finally:
        other.close()
    assert await values(backend) == []
    async with backend.transaction(read_only=False) as conn:
        await conn.execute("INSERT INTO t (v) VALUES ('kept')")
    assert await values(backend) == ["kept"]


async def test_a_cancelled_writer_leaves_nothing_and_the_next_one_works(backend: SqliteDatabase) -> None:
    started = asyncio.Event()

    async def writer() -> None:
        async with backend.transaction(read_only=False) as conn:
            await conn.execute("INSERT INTO t (v) VALUES ('lost')")
            started.set()
            await asyncio.Event().wait()  # holds the transaction until cancelled

    task = asyncio.create_task(writer())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    async def first_statement_cancelled() -> None:
        async with backend.transaction(read_only=False) as conn:
            await conn.execute("INSERT INTO t (v) VALUES ('lost too')")

    for _ in range(20):  # cancelled at various points around the fused BEGIN + first statement
        # A job on the lane thread, so the BEGIN + first statement go there too (on an idle lane they run inline,
        # without a suspension point to cancel at).
        backend.writer.submit(lambda: time.sleep(0.001))
        task = asyncio.create_task(first_statement_cancelled())
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    async with backend.transaction(read_only=False) as conn:
        await conn.execute("INSERT INTO t (v) VALUES ('kept')")
    assert await values(backend) == ["kept"]


async def test_one_writer_at_a_time(backend: SqliteDatabase) -> None:
    async def bump(k: int) -> None:
        for _ in range(20):
            async with backend.transaction(read_only=False) as conn:
                rows = await conn.fetch("SELECT count(*) FROM t")
                await asyncio.sleep(0)  # other writers get the loop, not the transaction
                await conn.execute("INSERT INTO t (id, v) VALUES (?, ?)", (rows[0][0] + 1, str(k)))

    await asyncio.gather(*(bump(k) for k in range(5)))  # any overlap would hit the primary key: Conflict
    assert len(await values(backend)) == 100


async def test_statements_after_close_are_unavailable(tmp_path: Path) -> None:
    backend = await connect(tmp_path / "db.sqlite", 2.0)
    async with backend.transaction(read_only=True) as conn:
        await conn.fetch("SELECT 1")
    await backend.aclose()
    with pytest.raises(StorageUnavailable):
        async with backend.transaction(read_only=True) as conn:
            await conn.fetch("SELECT 1")


class _SlowBegin:
    """A connection whose BEGIN waits (on the lane thread) until the test lets it go."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self.begun = threading.Event()
        self.release = threading.Event()

    def execute(self, statement: str, *args: Any) -> Any:
        on_lane = threading.current_thread() is not threading.main_thread()
        if statement.startswith("BEGIN") and on_lane and not self.release.is_set():
            self.begun.set()
            self.release.wait(5)
        return self._conn.execute(statement, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


@pytest.mark.parametrize("read_only", [True, False])
async def test_a_transaction_cancelled_while_its_begin_runs_does_not_poison_the_next_one(
    tmp_path: Path, read_only: bool
) -> None:
    """Cancelled while the lane thread still runs its BEGIN, a transaction leaves nothing open behind it (the
    next transaction on the lane rolls it back first; before the floor, the resource store's next BEGIN failed with
    "cannot start a transaction within a transaction")."""
    database = await connect(tmp_path / "db.sqlite", 5.0)
    lane = database.reader if read_only else database.writer
    real = lane.conn
    slow = _SlowBegin(real)
    lane._conn = slow  # type: ignore[assignment]  # duck-typed: only execute/in_transaction are used
    try:

        async def transaction() -> None:
            async with database.transaction(read_only=read_only) as conn:
                await conn.fetch("SELECT 1")

        lane.submit(lambda: time.sleep(0.01))  # the lane thread is busy: the BEGIN goes there, not inline
        task = asyncio.create_task(transaction())
        await asyncio.to_thread(slow.begun.wait, 5)
        task.cancel()
        slow.release.set()  # BEGIN now completes on the lane thread, after its caller has gone
        await asyncio.gather(task, return_exceptions=True)
        async with database.transaction(read_only=read_only) as conn:  # the next transaction begins
            assert await conn.fetch("SELECT 1") == [(1,)]
        await lane.call(lambda: None)  # runs after whatever the transactions queued
        assert not real.in_transaction
    finally:
        lane._conn = real
        await database.aclose()


async def test_options_set_the_pragmas_and_a_private_file(tmp_path: Path) -> None:
    path = tmp_path / "sub.sqlite"
    database = await SqliteDatabase.open(
        path, SqliteOptions(timeout=2.0, synchronous="FULL", pragmas=("foreign_keys=ON",), reader=False)
    )
    try:
        assert database.reader is database.writer  # reads take the writer lane

        def pragmas() -> tuple[object, ...]:
            conn = database.writer.conn
            return tuple(conn.execute(f"PRAGMA {name}").fetchone()[0] for name in ("journal_mode", "synchronous"))

        assert await database.writer.call(pragmas) == ("wal", 2)  # 2: FULL
        assert await database.writer.call(lambda: database.writer.conn.execute("PRAGMA foreign_keys").fetchone()) == (
            1,
        )
        async with database.transaction(read_only=False) as conn:
            await conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY)")
        for name in ("sub.sqlite", "sub.sqlite-wal", "sub.sqlite-shm"):
            assert (tmp_path / name).stat().st_mode & 0o777 == 0o600, name
    finally:
        await database.aclose()


async def test_errors_go_through_the_callers_hooks(tmp_path: Path) -> None:
    class Mine(Exception):
        pass

    class MyConflict(Exception):
        pass

    errors = DatabaseErrors(unavailable=Mine, conflict=MyConflict)
    database = await SqliteDatabase.open(tmp_path / "db.sqlite", SqliteOptions(timeout=2.0, errors=errors))
    async with database.transaction(read_only=False) as conn:
        await conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY)")
        await conn.execute("INSERT INTO t VALUES (1)")
    with pytest.raises(MyConflict):
        async with database.transaction(read_only=False) as conn:
            await conn.execute("INSERT INTO t VALUES (1)")
    with pytest.raises(Mine, match="SQLite error"):
        async with database.transaction(read_only=True) as conn:
            await conn.fetch("SELECT * FROM no_such_table")
    await database.aclose()
    with pytest.raises(Mine, match="closed"):
        async with database.transaction(read_only=True):
            pass


async def test_a_file_that_cannot_be_opened_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(StorageUnavailable, match="cannot open"):
        await connect(tmp_path / "missing-directory" / "db.sqlite", 2.0)


async def test_the_lane_thread_drops_a_late_result_keeps_order_and_skips_a_job_cancelled_before_its_turn(
    tmp_path: Path,
) -> None:
    """The lane's own thread: a caller that timed out gets `unavailable` and the lane goes on; a `submit`ted job
    cancelled while queued never runs; after close the thread has ended and new work is refused."""
    before = set(threading.enumerate())
    backend = await opened_despite_load(lambda: connect(tmp_path / "db.sqlite", 0.2), StorageUnavailable)
    lanes = set(threading.enumerate()) - before  # the writer's and the reader's threads
    lane = backend.writer
    release = threading.Event()
    ran: list[str] = []

    def slow() -> str:
        release.wait(5)
        ran.append("slow")
        return "late"

    with pytest.raises(StorageUnavailable, match="did not answer"):
        await lane.call(slow)  # times out; the job keeps the thread busy

    def note(what: str) -> str:
        ran.append(what)
        return what

    queued = lane.submit(lambda: note("cancelled"))
    assert queued.cancel()  # still waiting behind the slow job
    after = lane.submit(lambda: note("after"))
    release.set()
    assert await asyncio.wrap_future(after) == "after"
    assert await lane.call(lambda: "next") == "next"
    assert ran == ["slow", "after"]
    assert len(lanes) == 2 and all(t.is_alive() for t in lanes)
    await backend.aclose()
    assert not any(t.is_alive() for t in lanes)
    with pytest.raises(RuntimeError):
        lane.submit(lambda: None)


def _thread_ids(backend: SqliteDatabase) -> None:
    """``tid()`` in SQL: the id of the thread running the statement (on both lanes)."""
    for lane in {backend.writer, backend.reader}:
        conn = lane.connection
        assert conn is not None
        conn.create_function("tid", 0, threading.get_ident)


async def test_statements_run_inline_on_an_idle_lane_and_a_busy_lane_thread_keeps_them_in_order(
    backend: SqliteDatabase,
) -> None:
    _thread_ids(backend)
    here = threading.get_ident()
    for read_only in (False, True):
        async with backend.transaction(read_only=read_only) as conn:
            ran_on = [(await conn.fetch("SELECT tid()"))[0][0] for _ in range(4)]
        assert ran_on == [here] * 4, "an idle lane: BEGIN, every statement and the COMMIT need no hop"
    release = threading.Event()
    blocker = backend.writer.submit(lambda: release.wait(5.0))
    async with backend.transaction(read_only=False) as conn:
        first = asyncio.ensure_future(conn.fetch("SELECT tid()"))
        await asyncio.sleep(0.01)
        assert not first.done(), "a busy lane thread: BEGIN and the first statement queue behind its job"
        release.set()
        assert (await first)[0][0] != here
        assert (await conn.fetch("SELECT tid()"))[0][0] == here, "the lane idle again: the next one runs inline"
    assert blocker.done()
    # A job on the lane thread (e.g. a timed-out statement still running): the next statement waits its turn there.
    release = threading.Event()
    async with backend.transaction(read_only=False) as conn:
        await conn.execute("INSERT INTO t (v) VALUES ('a')")
        blocker = backend.writer.submit(lambda: release.wait(5.0))
        statement = asyncio.ensure_future(conn.fetch("SELECT tid(), count(*) FROM t"))
        await asyncio.sleep(0.01)
        assert not statement.done(), "the statement queued behind the lane thread's job"
        release.set()
        ((ran_on, count),) = await statement
        assert blocker.done() and ran_on != here and count == 1
    assert await values(backend) == ["a"]


async def test_inline_statements_roll_back_with_their_transaction_and_map_errors(backend: SqliteDatabase) -> None:
    with pytest.raises(RuntimeError, match="boom"):
        async with backend.transaction(read_only=False) as conn:
            await conn.execute("INSERT INTO t (v) VALUES ('a')")
            await conn.execute("INSERT INTO t (v) VALUES ('b')")  # inline
            raise RuntimeError("boom")
    assert await values(backend) == []
    with pytest.raises(Conflict):
        async with backend.transaction(read_only=False) as conn:
            await conn.execute("INSERT INTO t (id, v) VALUES (1, 'a')")
            await conn.execute("INSERT INTO t (id, v) VALUES (1, 'b')")  # inline: a constraint, mapped
    assert await values(backend) == []
    with pytest.raises(StorageUnavailable, match="SQLite error"):
        async with backend.transaction(read_only=True) as conn:
            await conn.fetch("SELECT 1")
            await conn.fetch("SELECT * FROM no_such_table")  # inline
    async with backend.transaction(read_only=False) as conn:  # the lanes are fine afterwards
        await conn.execute("INSERT INTO t (v) VALUES ('c')")
        await conn.execute("INSERT INTO t (v) VALUES ('d')")
    assert await values(backend) == ["c", "d"]


async def test_a_lane_thread_call_after_inline_statements_waits_for_locks_again(
    backend: SqliteDatabase, tmp_path: Path
) -> None:
    """Inline statements never wait for a lock (busy timeout 0); the lane thread's next BEGIN does wait again."""
    async with backend.transaction(read_only=False) as conn:
        await conn.execute("INSERT INTO t (v) VALUES ('a')")
        await conn.execute("INSERT INTO t (v) VALUES ('b')")  # inline: busy timeout 0 for it
    other = other_connection(tmp_path)
    other.execute("BEGIN IMMEDIATE")
    loop = asyncio.get_running_loop()
    loop.call_later(0.2, other.execute, "ROLLBACK")  # frees the lock while our BEGIN IMMEDIATE waits for it
    try:
        async with backend.transaction(read_only=False) as conn:
            await conn.execute("INSERT INTO t (v) VALUES ('c')")
    finally:
        other.close()
    assert await values(backend) == ["a", "b", "c"]


async def _write_until_a_checkpoint(backend: SqliteDatabase) -> list[tuple[str, str, bool]]:
    """Write enough rows for one checkpoint; every statement of the writer and reader connections as ``(which, sql,
    on the loop's thread)``."""
    seen: list[tuple[str, str, bool]] = []
    here = threading.get_ident()
    connections = {"writer": backend.writer.conn, "reader": backend.reader.conn}
    for name, connection in connections.items():
        connection.set_trace_callback(
            lambda sql, name=name: seen.append((name, sql, threading.get_ident() == here))  # type: ignore[misc]
        )
    try:
        for k in range(CHECKPOINT_PAGES // 3 + 5):  # a row changed ~ 3 pages of the estimate
            async with backend.transaction(read_only=False) as conn:
                await conn.execute("INSERT INTO t (v) VALUES (?)", (str(k),))
        await backend.writer.call(lambda: None)  # after whatever was queued there
        await backend.reader.call(lambda: None)
    finally:
        for connection in connections.values():
            connection.set_trace_callback(None)
    return seen


async def test_write_commits_run_inline_and_wal_checkpoints_run_on_the_reader_thread(backend: SqliteDatabase) -> None:
    """A write on an idle lane never hops (the write lock is held for its statements only); the writer's WAL
    checkpoints never run on the event loop's thread: autocheckpoint is off there and the database queues a
    PASSIVE checkpoint after about ``CHECKPOINT_PAGES`` written pages — on the reader lane's thread, so the writes
    meanwhile stay inline — and it checkpoints the WAL."""
    writer = backend.writer.conn
    assert writer.execute("PRAGMA wal_autocheckpoint").fetchone() == (0,)
    seen = await _write_until_a_checkpoint(backend)
    commits = [inline for name, sql, inline in seen if name == "writer" and sql == "COMMIT"]
    checkpoints = [(name, inline) for name, sql, inline in seen if "wal_checkpoint" in sql]
    assert commits and all(commits), "COMMIT ran on the loop's thread"
    assert checkpoints == [("reader", False)], "one checkpoint, on the reader lane's thread"
    # What the checkpoint copied need not be copied again: the next one has less than a checkpoint's worth left.
    busy, frames, copied = writer.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    assert busy == 0 and frames - copied == 0 and frames < CHECKPOINT_PAGES
    assert len(await values(backend)) == CHECKPOINT_PAGES // 3 + 5


async def test_a_checkpoint_goes_to_the_writer_thread_while_a_read_transaction_is_open(
    backend: SqliteDatabase,
) -> None:
    """A checkpoint cannot run on a connection with an open transaction: while a read transaction holds the reader
    lane, the writer's lane thread checkpoints instead."""
    async with backend.transaction(read_only=True) as reading:
        await reading.fetch("SELECT COUNT(*) FROM t")
        seen = await _write_until_a_checkpoint(backend)
    checkpoints = [(name, inline) for name, sql, inline in seen if "wal_checkpoint" in sql]
    assert checkpoints == [("writer", False)]


async def test_at_synchronous_full_the_commit_and_its_fsync_run_on_the_lane_thread(tmp_path: Path) -> None:
    """``synchronous=FULL`` syncs the WAL at every commit: that wait never runs on the event loop's thread, while the
    transaction's other statements still may."""
    database = await SqliteDatabase.open(tmp_path / "full.sqlite", SqliteOptions(timeout=2.0, synchronous="FULL"))
    try:
        writer = database.writer.conn
        seen: list[tuple[str, bool]] = []
        here = threading.get_ident()
        writer.set_trace_callback(lambda sql: seen.append((sql, threading.get_ident() == here)))
        for k in range(3):
            async with database.transaction(read_only=False) as conn:
                if k == 0:
                    await conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT NOT NULL)")
                await conn.execute("INSERT INTO t (v) VALUES (?)", (str(k),))
        writer.set_trace_callback(None)
    finally:
        await database.aclose()
    commits = [inline for sql, inline in seen if sql == "COMMIT"]
    assert commits == [False, False, False], "each COMMIT (and its fsync) ran on the lane thread"
    assert any(inline for sql, inline in seen if sql.startswith("INSERT")), "other statements still run inline"


async def test_waiting_for_a_busy_lane_is_bounded_and_a_newcomer_queues_behind_the_waiters(tmp_path: Path) -> None:
    """A free lane is taken without a timer; a busy one is waited for at most ``timeout``, also by a newcomer that
    looks the moment the lock was handed to a waiter that has not run yet (free for an instant, yet taken)."""
    backend = await opened_despite_load(lambda: connect(tmp_path / "db.sqlite", 0.2), StorageUnavailable)
    lane = backend.writer
    try:
        await backend._acquire(lane)  # held here, as by a long transaction
        with pytest.raises(StorageUnavailable, match="stayed busy"):
            await backend._acquire(lane)
        assert lane.lock_waiters == 0
        first = asyncio.create_task(backend._acquire(lane))
        await asyncio.sleep(0.05)
        assert lane.lock_waiters == 1  # waiting, with its timer
        newcomer = asyncio.create_task(backend._acquire(lane))
        await asyncio.sleep(0)  # the newcomer yields once; it looks right after the release below
        lane.lock.release()  # handed to `first`, which has not run yet: the lock looks free
        await first  # `first` now holds the lane for good
        with pytest.raises(StorageUnavailable, match="stayed busy"):
            await asyncio.wait_for(newcomer, 5)  # an untimed wait would end here with TimeoutError instead
        assert lane.lock_waiters == 0
        lane.lock.release()
        await backend._acquire(lane)  # free: taken at once
        lane.lock.release()
    finally:
        await backend.aclose()


async def test_a_transaction_on_an_idle_lane_does_not_suspend_its_task(backend: SqliteDatabase) -> None:
    """Nothing to wait for, no hop: another ready task gets its turn after the transaction, not in the middle of it
    (a yield before every transaction sent each behind everything ready)."""
    others: list[str] = []

    async def other() -> None:
        others.append("ran")

    await backend.writer.call(lambda: None)  # the lane threads idle (whatever the fixture left there has run)
    await backend.reader.call(lambda: None)
    await asyncio.sleep(0)  # and this task just had its turn: no streak of transactions behind it
    task = asyncio.create_task(other())
    async with backend.transaction(read_only=False) as conn:
        await conn.execute("INSERT INTO t (v) VALUES ('a')")
    async with backend.transaction(read_only=True) as conn:
        await conn.fetch("SELECT v FROM t")
    assert others == []
    await task
    assert others == ["ran"]


async def test_a_task_running_transaction_after_transaction_still_lets_others_run(backend: SqliteDatabase) -> None:
    """Once one task has started transactions for `YIELD_AFTER` without the loop getting a turn, its next one yields
    first: a busy writer cannot keep the event loop to itself."""
    turns = 0
    stop = False

    async def ticker() -> None:
        nonlocal turns
        while not stop:
            turns += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)  # the ticker starts
    before = turns
    loop = asyncio.get_running_loop()
    end = loop.time() + 20 * YIELD_AFTER
    written = 0
    while loop.time() < end:
        async with backend.transaction(read_only=False) as conn:
            await conn.execute("INSERT INTO t (v) VALUES (?)", (str(written),))
        written += 1
    during = turns - before
    stop = True
    await task
    assert 5 <= during < written  # it ran now and then, not between every two transactions
