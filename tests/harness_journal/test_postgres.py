"""What only the PostgreSQL journal has: its schema, NOTIFY wake-ups, timeouts, typed errors from the database."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import psycopg
import pytest

from loopd._infra.clock import VirtualClock
from loopd.harness import JournalCorruptError, JournalError
from loopd.harness.journal import PostgresJournal, Record
from tests.support.postgres import free_port
from tests.support.waiting import eventually

from .conftest import records

pytestmark = pytest.mark.postgres

Opener = Callable[..., Awaitable[PostgresJournal]]


@pytest.fixture
def schema() -> str:
    return f"j_{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def open_journal(journal_database: str, schema: str) -> AsyncIterator[Opener]:
    opened: list[PostgresJournal] = []

    async def opener(**options: object) -> PostgresJournal:
        journal = await PostgresJournal.open(journal_database, **{"schema": schema, **options})  # type: ignore[arg-type]
        opened.append(journal)
        return journal

    try:
        yield opener
    finally:
        for journal in opened:
            await journal.aclose()


_LISTENERS = "SELECT pid FROM pg_stat_activity WHERE application_name = 'loopd-journal' AND query LIKE 'LISTEN%%'"


async def listening(dsn: str) -> set[object]:
    """The backends of the journals' LISTEN connections."""
    return {pid for (pid,) in await sql(dsn, _LISTENERS)}


async def sql(dsn: str, statement: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        cur = await conn.execute(statement, params)
        return await cur.fetchall() if cur.description else []


async def test_the_class_is_exported_lazily_from_the_journal_package() -> None:
    import loopd.harness.journal as journal_package

    assert journal_package.PostgresJournal is PostgresJournal
    assert "PostgresJournal" in journal_package.__all__


async def test_schema_is_created_once_with_a_version_row(open_journal: Opener, journal_database: str) -> None:
    first, second = await asyncio.gather(open_journal(), open_journal())  # two replicas starting together
    writer = await first.create_session("s", at=1.0)
    await writer.append(records(2))
    third = await open_journal()  # a restart finds the schema and keeps the data
    assert [r.seq for r in await third.read("s")] == [1, 2]
    rows = await sql(journal_database, f"SELECT value FROM {first.schema}.journal_meta WHERE key = 'schema_version'")
    assert rows == [("3",)]
    assert second.schema == first.schema


async def test_a_newer_schema_version_is_refused(open_journal: Opener, journal_database: str, schema: str) -> None:
    await open_journal()
    await sql(
        journal_database,
        f"INSERT INTO {schema}.journal_migrations (version, name, applied_at) VALUES (99, 'future', 'now')",
    )
    with pytest.raises(JournalError, match="version 99, newer than this build"):
        await open_journal()


async def test_a_schema_versioned_by_its_meta_row_alone_keeps_opening(
    open_journal: Opener, journal_database: str, schema: str
) -> None:
    """A schema made before the floor's migrator (its version only in ``journal_meta``) is adopted with its data;
    one whose row names a version this build does not know is refused."""
    first = await open_journal()
    await (await first.create_session("s", at=1.0)).append(records(2))
    await first.aclose()
    await sql(journal_database, f"DROP TABLE {schema}.journal_migrations")  # what the previous scheme left
    again = await open_journal()
    assert [r.seq for r in await again.read("s")] == [1, 2]
    rows = await sql(journal_database, f"SELECT version FROM {schema}.journal_migrations ORDER BY version")
    assert rows == [(1,), (2,), (3,)]
    await again.aclose()
    await sql(journal_database, f"DROP TABLE {schema}.journal_migrations")
    await sql(journal_database, f"UPDATE {schema}.journal_meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(JournalError, match="version 99, newer than this build"):
        await open_journal()


async def test_a_schema_of_step_2_gets_state_snapshots_and_keeps_its_records(
    open_journal: Opener, journal_database: str, schema: str
) -> None:
    """A schema the previous build made (step 2: forks, no snapshots table) is migrated by step 3 alone."""
    first = await open_journal()
    await (await first.create_session("s", at=1.0)).append(records(3))
    await (await first.fork_session("s", 2, "f", at=1.0)).append(records(1))
    await first.aclose()
    await sql(journal_database, f"DROP TABLE {schema}.journal_snapshots")  # back to what step 2 left
    await sql(journal_database, f"DELETE FROM {schema}.journal_migrations WHERE version = 3")
    await sql(journal_database, f"UPDATE {schema}.journal_meta SET value = '2' WHERE key = 'schema_version'")
    again = await open_journal()
    assert [r.seq for r in await again.read("f")] == [1, 2, 3]
    await again.save_snapshot("s", 2, "v1", b"s@2", at=2.0)
    got = await again.load_snapshot("f", "v1")
    assert got is not None and (got.seq, got.data) == (2, b"s@2")
    rows = await sql(journal_database, f"SELECT max(version) FROM {schema}.journal_migrations")
    assert rows == [(3,)]


async def test_schemas_in_one_database_are_separate(open_journal: Opener) -> None:
    one = await open_journal(schema=f"a_{uuid.uuid4().hex[:8]}")
    two = await open_journal(schema=f"b_{uuid.uuid4().hex[:8]}")
    await (await one.create_session("s", at=1.0)).append(records(3))
    writer = await two.create_session("s", at=1.0)  # the same id is free in the other schema
    assert await writer.append(records(1)) == [1]
    assert len(await one.read("s")) == 3


@pytest.mark.parametrize(
    "options",
    [{"schema": "Bad-Name"}, {"schema": "x; DROP TABLE y"}, {"timeout": 0}, {"max_connections": 1}],
)
def test_bad_options_are_refused_up_front(options: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        PostgresJournal("postgresql://127.0.0.1:1/x", **options)  # type: ignore[arg-type]


async def test_an_unreachable_server_is_a_journal_error_within_the_timeout() -> None:
    async with asyncio.timeout(30):  # bounds a hang only: a refused connection is an error, not a wait
        with pytest.raises(JournalError):
            await PostgresJournal.open(f"postgresql://postgres@127.0.0.1:{free_port()}/none", timeout=1.0)


async def test_notify_wakes_a_follower_on_another_replica(open_journal: Opener, journal_database: str) -> None:
    clock = VirtualClock()
    replica_a = await open_journal()
    replica_b = await open_journal(clock=clock)
    writer = await replica_a.create_session("s", at=1.0)
    got: list[Record] = []

    async def follow() -> None:
        # The poll interval is on a clock that never moves: only a notification can wake this follower.
        async for record in replica_b.follow("s", 1, poll_interval=60):
            got.append(record)
            if record.seq == 2:
                return

    task = asyncio.create_task(follow())
    # The follower has read the empty journal, waits, and its replica listens.
    await eventually(lambda: clock.sleepers == 1, what="the follower to wait")
    await eventually(lambda: listening(journal_database), what="the replica to listen")
    await writer.append(records(2))
    await asyncio.wait_for(task, 5)
    assert [r.seq for r in got] == [1, 2]


async def test_the_listener_reconnects_after_losing_its_connection(open_journal: Opener, journal_database: str) -> None:
    clock = VirtualClock()
    replica_a = await open_journal()
    replica_b = await open_journal(clock=clock)
    writer = await replica_a.create_session("s", at=1.0)
    seen = asyncio.Event()
    got: list[int] = []

    async def follow() -> None:
        async for record in replica_b.follow("s", 1, poll_interval=60):
            got.append(record.seq)
            seen.set()

    task = asyncio.create_task(follow())
    await eventually(lambda: clock.sleepers == 1, what="the follower to wait")
    first = await eventually(lambda: listening(journal_database), what="the replica to listen")
    killed = await sql(
        journal_database,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE application_name = 'loopd-journal' AND query LIKE 'LISTEN%%'",
    )
    assert killed == [(True,)]

    async def listening_again() -> bool:
        now = await listening(journal_database)
        return bool(now) and not now & first

    # The listener notices, backs off (real time: the floor's reconnect) and listens on a new connection.
    await eventually(listening_again, what="the listener to listen again")
    await writer.append(records(1))
    try:
        await asyncio.wait_for(seen.wait(), 5)
    finally:
        task.cancel()
    assert got == [1]


async def test_an_append_blocked_by_a_lock_fails_in_time_and_stores_nothing(
    open_journal: Opener, journal_database: str, schema: str
) -> None:
    journal = await open_journal(timeout=1.0)
    writer = await journal.create_session("s", at=1.0)
    await writer.append(records(1))
    async with await psycopg.AsyncConnection.connect(journal_database, connect_timeout=10) as blocker:
        await blocker.execute(f"SELECT 1 FROM {schema}.journal_sessions WHERE id = 's' FOR UPDATE")
        async with asyncio.timeout(30):  # the lock is held until the rollback below: only the 1 s timeout ends this
            with pytest.raises(JournalError):
                await writer.append(records(2))
        await blocker.rollback()
    assert await writer.append(records(1)) == [2]
    assert [r.seq for r in await journal.read("s")] == [1, 2]


async def test_a_gap_in_the_stored_records_is_reported_as_corruption(
    open_journal: Opener, journal_database: str, schema: str
) -> None:
    journal = await open_journal()
    await (await journal.create_session("s", at=1.0)).append(records(5))
    await sql(
        journal_database,
        f"DELETE FROM {schema}.journal_records WHERE seq = 3 AND sid = "
        f"(SELECT sid FROM {schema}.journal_sessions WHERE id = 's')",
    )
    assert [r.seq for r in await journal.read("s", 1, 2)] == [1, 2]
    with pytest.raises(JournalCorruptError, match="expected seq 3"):
        await journal.read("s")


async def test_a_closed_journal_refuses_work_and_its_followers_stop(open_journal: Opener) -> None:
    clock = VirtualClock()
    journal = await open_journal(clock=clock)
    writer = await journal.create_session("s", at=1.0)
    await writer.append(records(1))

    async def follow() -> None:
        async for _ in journal.follow("s", 1, poll_interval=60):
            pass

    task = asyncio.create_task(follow())
    await eventually(lambda: clock.sleepers == 1, what="the follower to wait")
    await journal.aclose()
    with pytest.raises(JournalError, match="closed"):
        await asyncio.wait_for(task, 5)
    with pytest.raises(JournalError, match="closed"):
        await writer.append(records(1))
    with pytest.raises(JournalError, match="closed"):
        await journal.read("s")
    with pytest.raises(JournalError, match="closed"):
        await journal.create_session("t", at=1.0)
    await journal.aclose()  # closing twice is fine


async def test_appends_in_flight_at_close_are_answered(open_journal: Opener) -> None:
    journal = await open_journal()
    writers = [await journal.create_session(f"s{i}", at=1.0) for i in range(20)]
    appends = [asyncio.create_task(w.append(records(3))) for w in writers]
    await asyncio.sleep(0)
    await journal.aclose()
    results = await asyncio.gather(*appends, return_exceptions=True)
    assert results == [[1, 2, 3]] * len(writers)
