"""Fixtures for loop-server storage: a ``Database`` on each backend, a virtual clock, ledger stores."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from loopd._infra.clock import VirtualClock
from loopd.server.ledger import LedgerFacts, LedgerStore, SqlLedgerStore
from loopd.server.storage import MIGRATIONS, Database, DatabaseOptions, Migration
from tests.support.postgres import PostgresServer, postgres_dsn, postgres_server

__all__ = ["postgres_dsn", "postgres_server"]  # fixtures re-exported for pytest


DatabaseFactory = Callable[..., Awaitable[Database]]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def clock() -> VirtualClock:
    """The database's clock: leases, deadlines and expiry move only when the test advances it."""
    return VirtualClock()


@pytest.fixture(scope="session")
def shared_postgres_dsn(postgres_server: PostgresServer) -> str:
    """One database for the whole suite (dropped with the server): creating one per test costs ~0.5 s."""
    return postgres_server.create_database()


def reset_postgres(dsn: str) -> None:
    """Empty every table but ``schema_migrations`` (the schema stays migrated)."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        rows = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND tablename <> 'schema_migrations'"
        ).fetchall()
        if rows:
            conn.execute("TRUNCATE " + ", ".join(f'"{row[0]}"' for row in rows))


def database_url_for(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A clean database on ``backend``: a new SQLite file, or the shared PostgreSQL database emptied."""
    if backend == "postgres":
        dsn = str(request.getfixturevalue("shared_postgres_dsn"))
        reset_postgres(dsn)
        return dsn
    return str(tmp_path / "loopd.db")


@pytest.fixture
def database_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    return database_url_for(backend, tmp_path, request)


@pytest.fixture
async def open_db(database_url: str, clock: VirtualClock) -> AsyncIterator[DatabaseFactory]:
    """Open handles on one database (several may be open at once, like replicas); all closed afterwards."""
    opened: list[Database] = []

    async def factory(*, migrations: Sequence[Migration] = MIGRATIONS, **overrides: Any) -> Database:
        options = DatabaseOptions(**{"clock": clock, "operation_timeout": 30.0, **overrides})
        database = await Database.open(database_url, options=options, migrations=migrations)
        opened.append(database)
        return database

    try:
        yield factory
    finally:
        for database in opened:
            await database.aclose()


@pytest.fixture
async def db(open_db: DatabaseFactory) -> Database:
    return await open_db()


@pytest.fixture(
    params=["sqlite", "sqlite+facts", pytest.param("postgres", marks=pytest.mark.postgres)],
)
async def ledger(request: pytest.FixtureRequest, tmp_path: Path, clock: VirtualClock) -> AsyncIterator[LedgerStore]:
    """The ledger contract on each backend of the one store (``SqlLedgerStore``); ``+facts``: with the committed
    facts a writer remembers (`LedgerFacts`), which must change no outcome."""
    backend, _, facts = str(request.param).partition("+")
    url = database_url_for(backend, tmp_path, request)
    database = await Database.open(url, options=DatabaseOptions(clock=clock, operation_timeout=30.0))
    try:
        yield SqlLedgerStore(database, facts=LedgerFacts() if facts else None)
    finally:
        await database.aclose()
