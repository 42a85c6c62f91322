"""Schema migrations: fresh, repeated, extended, and refused when the database is newer than the code."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from loopd.server.storage import MIGRATIONS, InvalidRecord, Migration, SchemaTooNew, open_database
from tests.server_storage.conftest import DatabaseFactory


@pytest.fixture
def database_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """Migration tests change the schema itself, so each gets a database of its own."""
    if backend == "postgres":
        return str(request.getfixturevalue("postgres_dsn"))
    return str(tmp_path / "migrations.db")


async def test_a_fresh_database_gets_every_step(open_db: DatabaseFactory) -> None:
    db = await open_db()
    assert await db.schema_version() == len(MIGRATIONS) == MIGRATIONS[-1].version
    async with db.transaction(read_only=True) as tx:
        rows = await tx.fetch("SELECT version, name FROM schema_migrations ORDER BY version")
        assert [(int(v), n) for v, n in rows] == [(m.version, m.name) for m in MIGRATIONS]
        for table in ("conversations", "messages", "message_events", "human_requests", "harness_calls", "leases"):
            assert await tx.fetch(f"SELECT COUNT(*) FROM {table}") == [(0,)]
        assert await tx.fetch("SELECT COUNT(*) FROM ledger_events") == [(0,)]


async def test_migrating_twice_is_a_no_op(open_db: DatabaseFactory) -> None:
    first = await open_db()
    async with first.transaction() as tx:
        await tx.conversations.create(actor_kind="user", actor_key="alice")
    assert await first.migrate() == []
    second = await open_db()  # a second process (or replica) opening the same database
    assert await second.migrate() == []
    async with second.transaction(read_only=True) as tx:
        assert await tx.fetch("SELECT COUNT(*) FROM schema_migrations") == [(len(MIGRATIONS),)]
        assert len(await tx.conversations.list_for_owner("alice")) == 1


async def test_a_new_step_is_applied_once_on_top(open_db: DatabaseFactory) -> None:
    await open_db()
    extra = Migration(len(MIGRATIONS) + 1, "notes", ("CREATE TABLE notes (id TEXT PRIMARY KEY, body TEXT NOT NULL)",))
    newer = await open_db(migrations=(*MIGRATIONS, extra))
    assert await newer.schema_version() == extra.version
    assert await newer.migrate((*MIGRATIONS, extra)) == []
    async with newer.transaction() as tx:
        await tx.execute("INSERT INTO notes (id, body) VALUES (?, ?)", ("n1", "kept"))
        assert await tx.fetch("SELECT body FROM notes") == [("kept",)]


async def test_a_database_newer_than_the_code_is_refused(open_db: DatabaseFactory) -> None:
    db = await open_db()
    async with db.transaction() as tx:
        await tx.execute(
            "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)",
            (len(MIGRATIONS) + 5, "from the future", "2031-01-01T00:00:00.000000Z"),
        )
    with pytest.raises(SchemaTooNew, match="newer loopd"):
        await open_db()
    with pytest.raises(SchemaTooNew):
        await db.migrate()


async def test_steps_must_be_numbered_without_gaps(open_db: DatabaseFactory) -> None:
    db = await open_db()
    with pytest.raises(InvalidRecord):
        await db.migrate((*MIGRATIONS, Migration(len(MIGRATIONS) + 2, "gap", ())))


async def test_a_file_migrated_by_the_previous_migrator_keeps_opening(tmp_path: Path) -> None:
    """A database made before the floor's migrator (every step in one transaction, rows in ``schema_migrations``)
    opens as it is: nothing runs again, its rows are there, and a step added later applies on top."""
    path = tmp_path / "old.db"
    old = sqlite3.connect(path, isolation_level=None)
    try:
        old.execute("BEGIN IMMEDIATE")
        old.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            "version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)"
        )
        for step in MIGRATIONS:
            for statement in step.statements:
                assert isinstance(statement, str)
                old.execute(statement)
            old.execute(
                "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)",
                (step.version, step.name, "2026-01-01T00:00:00.000000Z"),
            )
        old.execute(
            "INSERT INTO conversations (id, name, actor_kind, actor_key, task_id, created_at, updated_at) "
            "VALUES ('c1', 'kept', 'user', 'alice', NULL, '2026-01-01T00:00:00.000000Z', '2026-01-01T00:00:00.000000Z')"
        )
        old.execute("COMMIT")
    finally:
        old.close()
    async with open_database(path) as db:
        assert await db.schema_version() == len(MIGRATIONS)
        assert await db.migrate() == []
        async with db.transaction(read_only=True) as tx:
            assert await tx.fetch("SELECT name FROM conversations WHERE id = 'c1'") == [("kept",)]
        extra = Migration(len(MIGRATIONS) + 1, "later", ("CREATE TABLE later_step (id TEXT PRIMARY KEY)",))
        assert await db.migrate((*MIGRATIONS, extra)) == [extra.version]
