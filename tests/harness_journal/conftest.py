"""One journal storage per test on each backend, and replicas (journals) opened on it.

A *replica* is a second journal instance over the same storage, as a second server process would open it:
another `SqliteJournal` on the same file, another `PostgresJournal` on the same database and schema. The
in-memory journal cannot be shared between instances, so its replicas are the one instance.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from loopd._infra.clock import VirtualClock
from loopd.harness.journal import Journal, MemoryJournal, NewRecord, SqliteJournal
from tests.support.postgres import PostgresServer, postgres_server

__all__ = ["postgres_server"]  # fixture re-exported for pytest


def records(n: int, *, kind: str = "k", tag: str = "") -> list[NewRecord]:
    """``n`` distinct records (the data says which one it is)."""
    return [NewRecord(kind, 1, f'{{"tag":"{tag}","i":{i}}}'.encode(), float(i)) for i in range(n)]


@dataclass
class Storage:
    """Where journals of one backend live during a test, and how to open replicas on it.

    Every journal opened here measures its followers' polls on ``clock``: a test moves it to make a poll come due,
    and ``clock.sleepers`` counts the followers waiting for a wake-up or their next poll.
    """

    backend: str
    tmp_path: Path
    dsn: str = ""
    schema: str = ""
    journals: list[Journal] = field(default_factory=list)
    clock: VirtualClock = field(default_factory=VirtualClock)
    _memory: MemoryJournal | None = None
    _refused: set[str] = field(default_factory=set)

    async def open(self) -> Journal:
        """A journal on this storage: the first one, or another replica."""
        journal: Journal
        if self.backend == "memory":
            if self._memory is None:
                self._memory = MemoryJournal(fail_append=self._refuse_in_memory, clock=self.clock)
            return self._memory
        if self.backend == "sqlite":
            journal = await SqliteJournal.open(self.tmp_path / "journal.db", append_timeout=10.0, clock=self.clock)
        else:
            from loopd.harness.journal import PostgresJournal

            journal = await PostgresJournal.open(self.dsn, schema=self.schema, timeout=10.0, clock=self.clock)
        self.journals.append(journal)
        return journal

    def _refuse_in_memory(self, _session_id: str, batch: object) -> None:
        if any(r.kind in self._refused for r in batch):  # type: ignore[attr-defined]
            raise OSError("injected failure")

    async def refuse_kind(self, kind: str) -> None:
        """Make the storage itself reject any record of ``kind`` (a real failure inside the transaction)."""
        self._refused.add(kind)
        if self.backend == "sqlite":
            db = sqlite3.connect(self.tmp_path / "journal.db")
            try:
                db.execute(
                    f"CREATE TRIGGER refuse_{kind} BEFORE INSERT ON journal_records WHEN NEW.kind = '{kind}' "
                    "BEGIN SELECT RAISE(ABORT, 'injected failure'); END"
                )
                db.commit()
            finally:
                db.close()
        elif self.backend == "postgres":
            import psycopg

            async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True, connect_timeout=10) as conn:
                await conn.execute(
                    f"CREATE FUNCTION {self.schema}.refuse_{kind}() RETURNS trigger LANGUAGE plpgsql AS $$ "
                    f"BEGIN IF NEW.kind = '{kind}' THEN RAISE EXCEPTION 'injected failure'; END IF; RETURN NEW; END $$"
                )
                await conn.execute(
                    f"CREATE TRIGGER refuse_{kind} BEFORE INSERT ON {self.schema}.journal_records "
                    f"FOR EACH ROW EXECUTE FUNCTION {self.schema}.refuse_{kind}()"
                )

    async def aclose(self) -> None:
        for journal in self.journals:
            await journal.aclose()


@pytest.fixture(scope="session")
def journal_database(request: pytest.FixtureRequest) -> Iterator[str]:
    """One database for the postgres journal tests; each test gets its own schema in it."""
    server: PostgresServer = request.getfixturevalue("postgres_server")
    dsn = server.create_database()
    try:
        yield dsn
    finally:
        server.drop_database(dsn)


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def storage(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Storage]:
    backend = str(request.param)
    store = Storage(backend, tmp_path)
    if backend == "postgres":
        store.dsn = str(request.getfixturevalue("journal_database"))
        store.schema = f"j_{uuid.uuid4().hex[:12]}"
    try:
        yield store
    finally:
        await store.aclose()


@pytest.fixture
async def journal(storage: Storage) -> Journal:
    return await storage.open()
