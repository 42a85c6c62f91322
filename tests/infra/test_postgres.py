"""The floor's PostgreSQL database (``loopd._infra.postgres``): transactions, error mapping through the caller's
hooks, timeouts, closing, and which failed COMMITs leave the outcome unknown."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import psycopg
import pytest

from loopd._infra.backoff import Backoff
from loopd._infra.database import ConstraintViolation, DatabaseErrors, DatabaseUnavailable
from loopd._infra.postgres import PostgresDatabase, PostgresOptions, commit_outcome_unknown, translate
from tests.support.postgres import postgres_dsn, postgres_server  # noqa: F401


class MyUnavailable(Exception):
    pass


class MyConflict(Exception):
    pass


@pytest.fixture
async def db(postgres_dsn: str) -> AsyncIterator[PostgresDatabase]:  # noqa: F811
    database = await PostgresDatabase.open(postgres_dsn, PostgresOptions(timeout=5.0, max_connections=4))
    async with database.transaction(read_only=False) as conn:
        await conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT NOT NULL)")
    try:
        yield database
    finally:
        await database.aclose()


async def values(db: PostgresDatabase) -> list[str]:
    async with db.transaction(read_only=True) as conn:
        return [str(row[0]) for row in await conn.fetch("SELECT v FROM t ORDER BY id")]


def test_placeholders_are_translated() -> None:
    assert translate("SELECT ? WHERE a = ?") == "SELECT %s WHERE a = %s"


@pytest.mark.postgres
async def test_a_transaction_commits_at_the_end_and_rolls_back_on_error(db: PostgresDatabase) -> None:
    async with db.transaction(read_only=False) as conn:
        assert await conn.execute("INSERT INTO t (id, v) VALUES (?, ?)", (1, "a")) == 1
    with pytest.raises(RuntimeError):
        async with db.transaction(read_only=False) as conn:
            await conn.execute("INSERT INTO t (id, v) VALUES (?, ?)", (2, "b"))
            raise RuntimeError("the caller fails")
    assert await values(db) == ["a"]


@pytest.mark.postgres
async def test_a_read_only_transaction_refuses_writes(db: PostgresDatabase) -> None:
    with pytest.raises(DatabaseUnavailable, match="read-only"):
        async with db.transaction(read_only=True) as conn:
            await conn.execute("INSERT INTO t (id, v) VALUES (1, 'a')")
    assert await values(db) == []


@pytest.mark.postgres
async def test_errors_go_through_the_callers_hooks(postgres_dsn: str) -> None:  # noqa: F811
    errors = DatabaseErrors(unavailable=MyUnavailable, conflict=MyConflict)
    # 2 s: room for the statements that must succeed on a loaded machine; the pg_sleep below outlasts it.
    database = await PostgresDatabase.open(postgres_dsn, PostgresOptions(timeout=2.0, errors=errors))
    try:
        async with database.transaction(read_only=False) as conn:
            await conn.execute("CREATE TABLE u (id INTEGER PRIMARY KEY)")
            await conn.execute("INSERT INTO u VALUES (1)")
        with pytest.raises(MyConflict, match="constraint violated") as conflict:
            async with database.transaction(read_only=False) as conn:
                await conn.execute("INSERT INTO u VALUES (1)")
        assert isinstance(conflict.value.__cause__, psycopg.errors.UniqueViolation)
        with pytest.raises(MyUnavailable) as slow:  # the server's statement timeout or ours, whichever first
            async with database.transaction(read_only=True) as conn:
                await conn.fetch("SELECT pg_sleep(10)")
        assert isinstance(slow.value.__cause__, (TimeoutError, psycopg.Error))
        async with database.transaction(read_only=True) as conn:  # the pool still works
            assert await conn.fetch("SELECT COUNT(*) FROM u") == [(1,)]
    finally:
        await database.aclose()
    with pytest.raises(MyUnavailable, match="closed"):
        async with database.transaction(read_only=True):
            pass


@pytest.mark.postgres
async def test_mapped_bounds_a_call_and_maps_only_the_drivers_failures(postgres_dsn: str) -> None:  # noqa: F811
    # The client's deadline (0.5 s) ends the call long before the server's statement timeout (30 s) would.
    options = PostgresOptions(timeout=0.5, server_timeout=30.0)
    database = await PostgresDatabase.open(postgres_dsn, options)
    try:
        with pytest.raises(DatabaseUnavailable, match=r"^sleeping: PostgreSQL did not answer within 0.5 s") as slow:
            async with database.mapped("sleeping"), database.pooled() as conn:
                await conn.execute("SELECT pg_sleep(5)")
        assert isinstance(slow.value.__cause__, TimeoutError)
        with pytest.raises(DatabaseUnavailable, match=r"^PostgreSQL error: .*syntax") as bad:
            async with database.mapped(), database.pooled() as conn:
                await conn.execute("SELEC 1")
        assert isinstance(bad.value.__cause__, psycopg.errors.SyntaxError)
        with pytest.raises(KeyError):  # not the driver's: unchanged
            async with database.mapped("anything"):
                raise KeyError("mine")
        # A cancellation from outside is a cancellation, not an unavailable database.
        started = asyncio.Event()

        async def waits() -> None:
            async with database.mapped("waiting"):
                started.set()
                await asyncio.sleep(10)

        task = asyncio.create_task(waits())
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        async with database.mapped("after"), database.pooled() as conn:  # still usable
            assert await (await conn.execute("SELECT 2")).fetchone() == (2,)
    finally:
        await database.aclose()


@pytest.mark.postgres
async def test_a_constraint_violation_with_the_default_hooks(db: PostgresDatabase) -> None:
    async with db.transaction(read_only=False) as conn:
        await conn.execute("INSERT INTO t (id, v) VALUES (1, 'a')")
    with pytest.raises(ConstraintViolation):
        async with db.transaction(read_only=False) as conn:
            await conn.execute("INSERT INTO t (id, v) VALUES (1, 'again')")


@pytest.mark.postgres
async def test_an_unreachable_server_is_unavailable() -> None:
    from tests.support.postgres import free_port

    with pytest.raises(DatabaseUnavailable, match="cannot connect"):
        await PostgresDatabase.open(f"postgresql://127.0.0.1:{free_port()}/none", PostgresOptions(timeout=1.0))


@pytest.mark.postgres
async def test_pooled_and_dedicated_connections(db: PostgresDatabase) -> None:
    async with db.mapped("one statement"), db.pooled() as conn:
        cursor = await conn.execute("SELECT 1")
        assert await cursor.fetchone() == (1,)
    dedicated = await db.connect()
    async with dedicated:
        cursor = await dedicated.execute("SHOW statement_timeout")
        assert await cursor.fetchone() == ("5s",)


def test_which_commit_failures_leave_the_outcome_unknown() -> None:
    assert commit_outcome_unknown(TimeoutError())
    assert commit_outcome_unknown(psycopg.OperationalError("the connection broke"))
    assert not commit_outcome_unknown(psycopg.errors.SerializationFailure("refused"))
    assert not commit_outcome_unknown(None)


@pytest.mark.postgres
async def test_listen_delivers_notifications_until_cancelled(db: PostgresDatabase) -> None:
    listening = asyncio.Event()
    payloads: asyncio.Queue[str] = asyncio.Queue(maxsize=10)
    task = asyncio.create_task(
        db.listen(
            "floor_test",
            payloads.put_nowait,
            on_listening=listening.set,
            backoff=Backoff(base=0.01, max_delay=0.1),
            log=logging.getLogger(__name__),
            what="test listener",
        )
    )
    try:
        await asyncio.wait_for(listening.wait(), 10)
        async with db.transaction(read_only=False) as conn:
            await conn.fetch("SELECT pg_notify('floor_test', 'hello')")
        assert await asyncio.wait_for(payloads.get(), 10) == "hello"
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
