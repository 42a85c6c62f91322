"""The floor's migrator (``loopd._infra.migrations``), the same contract on SQLite and PostgreSQL: numbered steps
applied once each in their own transaction, recorded per schema, adoption of an earlier scheme, and refusal of a
database newer than the code."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from loopd._infra.database import Connection, Database, InvalidSchema, SchemaTooNew
from loopd._infra.migrations import Migration, Schema, migrate, schema_version
from loopd._infra.sqlite import SqliteDatabase, SqliteOptions
from tests.support.postgres import postgres_dsn, postgres_server  # noqa: F401

STEPS = (
    Migration(1, "things", ("CREATE TABLE things (id INTEGER PRIMARY KEY, name TEXT NOT NULL)",)),
    Migration(2, "a thing", ("INSERT INTO things (id, name) VALUES (1, 'first')",)),
)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def db(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Database]:
    database: Database
    if request.param == "postgres":
        from loopd._infra.postgres import PostgresDatabase, PostgresOptions

        dsn = str(request.getfixturevalue("postgres_dsn"))
        database = await PostgresDatabase.open(dsn, PostgresOptions(timeout=10.0))
    else:
        database = await SqliteDatabase.open(tmp_path / "db.sqlite", SqliteOptions(timeout=10.0))
    try:
        yield database
    finally:
        await database.aclose()


async def names(db: Database) -> list[str]:
    async with db.transaction(read_only=True) as conn:
        return [str(row[0]) for row in await conn.fetch("SELECT name FROM things ORDER BY id")]


async def recorded(db: Database, table: str = "demo_migrations") -> list[tuple[int, str]]:
    async with db.transaction(read_only=True) as conn:
        rows = await conn.fetch(f"SELECT version, name FROM {table} ORDER BY version")
    return [(int(v), str(n)) for v, n in rows]


async def test_a_fresh_database_gets_every_step_once(db: Database) -> None:
    schema = Schema("demo", STEPS)
    assert await schema_version(db, schema) == 0
    assert await migrate(db, schema) == [1, 2]
    assert await recorded(db) == [(1, "things"), (2, "a thing")]
    assert await names(db) == ["first"]
    assert await migrate(db, schema) == []  # twice: nothing runs again
    assert await schema_version(db, schema) == 2 == schema.version


async def test_a_later_step_applies_on_top(db: Database) -> None:
    await migrate(db, Schema("demo", STEPS))
    later = Migration(3, "second thing", ("INSERT INTO things (id, name) VALUES (2, 'second')",))
    assert await migrate(db, Schema("demo", (*STEPS, later))) == [3]
    assert await names(db) == ["first", "second"]


async def test_schemas_are_recorded_apart(db: Database) -> None:
    other = Schema("other", (Migration(1, "others", ("CREATE TABLE others (id INTEGER PRIMARY KEY)",)),))
    assert await migrate(db, Schema("demo", STEPS)) == [1, 2]
    assert await migrate(db, other) == [1]
    assert await recorded(db, "other_migrations") == [(1, "others")]
    custom = Schema("named", STEPS[:1], table="named_steps")
    async with db.transaction(read_only=False) as conn:
        await conn.execute("DROP TABLE things")
    assert await migrate(db, custom) == [1]
    assert await recorded(db, "named_steps") == [(1, "things")]


async def test_each_step_is_one_transaction_and_a_failed_one_leaves_nothing(db: Database) -> None:
    broken = Migration(
        2,
        "half a step",
        ("INSERT INTO things (id, name) VALUES (1, 'first')", "INSERT INTO no_such_table VALUES (1)"),
    )
    with pytest.raises(Exception):  # noqa: B017 - the engine's own error, mapped by the floor
        await migrate(db, Schema("demo", (STEPS[0], broken)))
    assert await recorded(db) == [(1, "things")]  # step 1 committed on its own
    assert await names(db) == []  # step 2's first statement rolled back with it
    assert await migrate(db, Schema("demo", STEPS)) == [2]


async def test_callable_steps_run_inside_their_transaction(db: Database) -> None:
    seen: list[str] = []

    async def fill(conn: Connection) -> None:
        seen.append("ran")
        await conn.execute("INSERT INTO things (id, name) VALUES (?, ?)", (7, "from code"))

    assert await migrate(db, Schema("demo", (STEPS[0], Migration(2, "code", (fill,))))) == [1, 2]
    assert seen == ["ran"]
    assert await names(db) == ["from code"]


async def test_a_database_newer_than_the_code_is_refused(db: Database) -> None:
    await migrate(db, Schema("demo", STEPS))
    with pytest.raises(SchemaTooNew, match="version 2, newer than this build"):
        await migrate(db, Schema("demo", STEPS[:1]))


async def test_steps_must_be_numbered_from_one(db: Database) -> None:
    with pytest.raises(InvalidSchema):
        await migrate(db, Schema("demo", (STEPS[1],)))


async def test_an_earlier_scheme_is_adopted_without_running_its_steps(db: Database) -> None:
    async with db.transaction(read_only=False) as conn:  # what the earlier scheme made: step 1's table
        await conn.execute("CREATE TABLE things (id INTEGER PRIMARY KEY, name TEXT NOT NULL)")
    looked: list[str] = []

    async def adopt(conn: Connection) -> int:
        looked.append("adopt")
        rows = await conn.fetch("SELECT COUNT(*) FROM things")
        assert rows == [(0,)]
        return 1

    assert await migrate(db, Schema("demo", STEPS, adopt=adopt)) == [2]
    assert await recorded(db) == [(1, "things"), (2, "a thing")]
    assert await migrate(db, Schema("demo", STEPS, adopt=adopt)) == []
    assert looked == ["adopt"]  # only while the table was empty


async def test_an_earlier_scheme_newer_than_the_code_is_refused(db: Database) -> None:
    async def adopt(conn: Connection) -> int:
        return 5

    with pytest.raises(SchemaTooNew):
        await migrate(db, Schema("demo", STEPS, adopt=adopt))
    assert await schema_version(db, Schema("demo", STEPS)) == 0  # nothing recorded


async def test_migrators_starting_together_apply_each_step_once(db: Database) -> None:
    results = await asyncio.gather(*(migrate(db, Schema("demo", STEPS)) for _ in range(4)))
    assert sorted(v for ran in results for v in ran) == [1, 2]
    assert await names(db) == ["first"]


@pytest.mark.postgres
async def test_replicas_on_separate_pools_take_turns(postgres_dsn: str) -> None:  # noqa: F811
    from loopd._infra.postgres import PostgresDatabase, PostgresOptions

    pools = [await PostgresDatabase.open(postgres_dsn, PostgresOptions(timeout=10.0)) for _ in range(3)]
    try:
        results = await asyncio.gather(*(migrate(pool, Schema("demo", STEPS)) for pool in pools))
        assert sorted(v for ran in results for v in ran) == [1, 2]
        assert await names(pools[0]) == ["first"]
    finally:
        for pool in pools:
            await pool.aclose()
