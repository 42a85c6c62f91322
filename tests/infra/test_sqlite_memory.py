"""The floor's inline in-memory SQLite: transactions commit or roll back without suspending the caller."""

from __future__ import annotations

import asyncio

import pytest

from loopd._infra.database import DatabaseUnavailable
from loopd._infra.sqlite_memory import MemorySqliteDatabase, run_inline


async def _count(database: MemorySqliteDatabase) -> int:
    async with database.transaction(read_only=True) as conn:
        rows = await conn.fetch("SELECT count(*) FROM t")
    return int(rows[0][0])


async def test_a_transaction_commits_when_its_block_ends_and_rolls_back_when_it_raises() -> None:
    database = MemorySqliteDatabase()
    async with database.transaction(read_only=False) as conn:
        await conn.execute("CREATE TABLE t (v INTEGER)")
        assert await conn.execute("INSERT INTO t (v) VALUES (?)", (1,)) == 1
    with pytest.raises(ValueError):
        async with database.transaction(read_only=False) as conn:
            await conn.execute("INSERT INTO t (v) VALUES (?)", (2,))
            raise ValueError("undo")
    assert await _count(database) == 1
    await database.aclose()


async def test_sql_errors_and_a_second_open_transaction_are_the_databases_errors() -> None:
    database = MemorySqliteDatabase()
    async with database.transaction(read_only=False) as conn:
        with pytest.raises(DatabaseUnavailable):
            await conn.fetch("SELECT * FROM missing")
        with pytest.raises(DatabaseUnavailable):
            async with database.transaction(read_only=True):
                pass
    await database.aclose()
    with pytest.raises(DatabaseUnavailable):
        async with database.transaction(read_only=True):
            pass


def test_run_inline_finishes_work_on_the_database_without_an_event_loop() -> None:
    database = MemorySqliteDatabase()

    async def work() -> int:
        async with database.transaction(read_only=False) as conn:
            await conn.execute("CREATE TABLE t (v INTEGER)")
            await conn.execute("INSERT INTO t (v) VALUES (1), (2)")
        return await _count(database)

    assert run_inline(work()) == 2


async def test_run_inline_refuses_work_that_suspends() -> None:
    with pytest.raises(RuntimeError):
        run_inline(asyncio.sleep(0.01))
