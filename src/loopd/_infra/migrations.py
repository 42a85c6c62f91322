"""The one schema migrator of loopd: numbered steps per schema, recorded in a table, on SQLite and PostgreSQL.

Owns: ``Migration`` (a numbered step: SQL statements and/or async callables run in order), ``Schema`` (a
schema's name, its ordered steps, the table that records them, and how to adopt a database made before this
migrator existed), ``migrate`` and ``schema_version``.

How it works: a schema's table (``<name>_migrations`` unless the schema names another; columns ``version``,
``name``, ``applied_at``) records the steps that ran. ``migrate`` applies each missing step in its own write
transaction, together with its row, lowest first; on PostgreSQL each of those transactions first takes an
advisory lock of the schema, so replicas starting together take turns. Applying twice is a no-op. A database
that records a step this code does not know is refused with ``errors.too_new`` (databases are never
downgraded). Steps are append-only: never edit one that has shipped.

Adopting an older database: when the table is empty, ``Schema.adopt`` (if given) looks at the database inside the
same transaction and returns how many steps its old scheme had already made (e.g. from ``PRAGMA user_version`` or
from the tables it finds); those are recorded as applied without running them.
Must not do: data access beyond the schema.
"""

from __future__ import annotations

import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from loopd._infra.database import Connection, Database

Step = str | Callable[[Connection], Awaitable[None]]
"""A SQL statement (``?`` placeholders, no parameters), or an async callable run inside the step's transaction."""


@dataclass(frozen=True)
class Migration:
    """One numbered schema step: its statements run in one transaction, in order."""

    version: int
    name: str
    statements: tuple[Step, ...]


@dataclass(frozen=True)
class Schema:
    name: str
    migrations: tuple[Migration, ...]
    table: str = ""
    """The table that records applied steps; ``<name>_migrations`` when empty."""
    adopt: Callable[[Connection], Awaitable[int]] | None = None
    """For a database whose table is empty: how many steps an earlier scheme already made (0: none)."""
    lock_key: int | None = None
    """PostgreSQL advisory lock key; derived from the table name when ``None``."""

    @property
    def table_name(self) -> str:
        return self.table or f"{self.name}_migrations"

    @property
    def advisory_lock(self) -> int:
        if self.lock_key is not None:
            return self.lock_key
        return 7_305_000_000 + zlib.crc32(self.table_name.encode())

    @property
    def version(self) -> int:
        """The schema version this code needs (its last step)."""
        return self.migrations[-1].version if self.migrations else 0


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


async def _applied(conn: Connection, schema: Schema) -> list[int]:
    table = schema.table_name
    await conn.execute(
        f"CREATE TABLE IF NOT EXISTS {table} "
        "(version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)"
    )
    rows = await conn.fetch(f"SELECT version FROM {table} ORDER BY version")
    return [int(row[0]) for row in rows]


async def _record(conn: Connection, schema: Schema, step: Migration) -> None:
    await conn.execute(
        f"INSERT INTO {schema.table_name} (version, name, applied_at) VALUES (?, ?, ?)",
        (step.version, step.name, _now()),
    )


def _refuse_newer(db: Database, schema: Schema, version: int) -> None:
    if version > len(schema.migrations):
        raise db.errors.too_new(
            f"the {schema.name} schema is at version {version}, newer than this build ({len(schema.migrations)}): "
            "run a newer loopd (databases are never downgraded)"
        )


async def migrate(db: Database, schema: Schema) -> list[int]:
    """Bring ``schema`` up to its last step; returns the versions applied now (empty when current; adopted steps
    are not listed). Raises ``db.errors.too_new`` when the database has a step this code does not know."""
    steps = schema.migrations
    for expected, step in enumerate(steps, start=1):
        if step.version != expected:
            raise db.errors.invalid_schema(
                f"migration steps must be numbered 1, 2, 3…; step {expected} of {schema.name} is {step.version}"
            )
    ran: list[int] = []
    while True:
        async with db.transaction(read_only=False) as conn:
            if db.dialect == "postgres":
                await conn.fetch("SELECT pg_advisory_xact_lock(?)", (schema.advisory_lock,))
            applied = await _applied(conn, schema)
            if not applied and schema.adopt is not None:
                adopted = await schema.adopt(conn)
                _refuse_newer(db, schema, adopted)
                for step in steps[:adopted]:
                    await _record(conn, schema, step)
                applied = [step.version for step in steps[:adopted]]
            if applied:
                _refuse_newer(db, schema, applied[-1])
            done = set(applied)
            missing = [step for step in steps if step.version not in done]
            if not missing:
                return ran
            step = missing[0]
            for statement in step.statements:
                if isinstance(statement, str):
                    await conn.execute(statement)
                else:
                    await statement(conn)
            await _record(conn, schema, step)
        ran.append(step.version)


async def schema_version(db: Database, schema: Schema) -> int:
    """The highest step recorded for ``schema`` (0 for a database it never migrated)."""
    async with db.transaction(read_only=False) as conn:
        applied = await _applied(conn, schema)
    return applied[-1] if applied else 0
