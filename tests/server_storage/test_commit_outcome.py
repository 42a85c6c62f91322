"""A COMMIT that times out is not "unavailable" (nothing written) but, until settled, "outcome unknown".

SQLite settles it by waiting (one more timeout) for the COMMIT still running on its thread; PostgreSQL cannot, so
a COMMIT without an answer is `CommitOutcomeUnknown` there, and the caller reads back.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import psycopg
import pytest

from loopd._infra.clock import VirtualClock
from loopd._infra.postgres import commit_outcome_unknown as _outcome_unknown
from loopd.server.storage import (
    CommitOutcomeUnknown,
    Database,
    DatabaseOptions,
    NotFound,
    StorageError,
    StorageUnavailable,
    open_database,
)
from tests.server_storage.conftest import database_url_for
from tests.server_storage.helpers import user_conversation
from tests.server_storage.slow_commits import SlowCommit, slow_commits
from tests.support.waiting import opened_despite_load

TIMEOUT = 0.3


async def _exists(db: Database, conversation_id: str) -> bool:
    try:
        async with db.transaction(read_only=True) as tx:
            await tx.conversations.get(conversation_id)
    except NotFound:
        return False
    return True


@pytest.fixture
async def sqlite_db(tmp_path: Path, clock: VirtualClock) -> AsyncIterator[Database]:
    """SQLite, where the slow COMMIT is injected (PostgreSQL has its own test below). The file is created and
    migrated first with the default timeout, so the short one bounds the operations under test, not the set-up (a
    loaded machine can take longer than 0.3 s to create the schema), and opening it again is retried
    (`opened_despite_load`: on a loaded machine the lane thread may not connect within 0.3 s)."""
    async with open_database(tmp_path / "loopd.db", options=DatabaseOptions(clock=clock)):
        pass
    options = DatabaseOptions(clock=clock, operation_timeout=TIMEOUT)
    async with contextlib.AsyncExitStack() as stack:
        opening = open_database(tmp_path / "loopd.db", options=options)
        yield await opened_despite_load(lambda: stack.enter_async_context(opening), StorageUnavailable)


async def test_a_commit_that_times_out_then_succeeds_is_reported_as_committed(
    sqlite_db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    woken: list[str] = []
    with slow_commits(monkeypatch, SlowCommit(release_after_timeouts=1)) as slow:
        async with sqlite_db.transaction() as tx:
            conversation = await user_conversation(tx)
            tx.after_commit(lambda: woken.append("woken"))
            tx.after_sure_commit(lambda: woken.append("learnt"))
    assert slow.timeouts == 1  # the COMMIT itself timed out; waiting for it to settle did not
    assert await _exists(sqlite_db, conversation.id)
    assert woken == ["woken", "learnt"]  # settled as committed: both run


async def test_a_commit_that_times_out_then_fails_is_unavailable(
    sqlite_db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    learnt: list[str] = []
    with (
        slow_commits(monkeypatch, SlowCommit(release_after_timeouts=1, fail=True)),
        pytest.raises(StorageUnavailable) as caught,
    ):
        async with sqlite_db.transaction() as tx:
            conversation = await user_conversation(tx)
            tx.after_sure_commit(lambda: learnt.append("learnt"))
    assert learnt == []  # rolled back: never
    assert not isinstance(caught.value, CommitOutcomeUnknown)
    assert not await _exists(sqlite_db, conversation.id)


async def test_a_commit_that_does_not_settle_is_outcome_unknown_and_reading_back_resolves_it(
    sqlite_db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    woken: list[str] = []
    with slow_commits(monkeypatch, SlowCommit()) as slow:
        with pytest.raises(CommitOutcomeUnknown) as caught:
            async with sqlite_db.transaction() as tx:
                conversation = await user_conversation(tx)
                tx.after_commit(lambda: woken.append("woken"))
                tx.after_sure_commit(lambda: woken.append("learnt"))
        assert isinstance(caught.value, StorageError) and not caught.value.retryable
        assert caught.value.type == "service_unavailable"
        assert woken == ["woken"]  # it may have committed: waiters look, but nothing is learnt from it
        slow.release()  # the COMMIT goes through after all
        async with sqlite_db.transaction() as tx:  # a write transaction starts after the COMMIT settled
            assert (await tx.conversations.get(conversation.id)).id == conversation.id


@pytest.fixture
async def postgres_db(tmp_path: Path, clock: VirtualClock, request: pytest.FixtureRequest) -> AsyncIterator[Database]:
    options = DatabaseOptions(clock=clock, operation_timeout=1.0)
    async with open_database(database_url_for("postgres", tmp_path, request), options=options) as db:
        yield db


@pytest.mark.postgres
async def test_a_postgres_commit_without_an_answer_is_outcome_unknown(postgres_db: Database) -> None:
    db = postgres_db
    async with db.transaction() as tx:  # a deferred constraint trigger makes COMMIT itself slow
        await tx.execute("CREATE TABLE IF NOT EXISTS slow_commit (id integer)")
        await tx.execute(
            "CREATE OR REPLACE FUNCTION slow_commit_sleep() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN PERFORM pg_sleep(3); RETURN NULL; END $$"
        )
        await tx.execute("DROP TRIGGER IF EXISTS slow_commit_trigger ON slow_commit")
        await tx.execute(
            "CREATE CONSTRAINT TRIGGER slow_commit_trigger AFTER INSERT ON slow_commit "
            "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit_sleep()"
        )
    try:
        with pytest.raises(CommitOutcomeUnknown):
            async with db.transaction() as tx:
                await tx.execute("INSERT INTO slow_commit VALUES (1)")
        async with asyncio.timeout(10):  # the handle still works afterwards
            async with db.transaction() as tx:
                await tx.execute("DROP TABLE slow_commit")
    finally:
        async with db.transaction() as tx:
            await tx.execute("DROP TABLE IF EXISTS slow_commit")
            await tx.execute("DROP FUNCTION IF EXISTS slow_commit_sleep()")


def test_which_postgres_commit_failures_leave_the_outcome_unknown() -> None:
    assert _outcome_unknown(TimeoutError())
    assert _outcome_unknown(psycopg.OperationalError("server closed the connection unexpectedly"))
    assert _outcome_unknown(psycopg.errors.AdminShutdown("terminating connection"))
    assert _outcome_unknown(psycopg.errors.QueryCanceled("canceling statement due to statement timeout"))
    assert not _outcome_unknown(psycopg.errors.SerializationFailure("could not serialize access"))
    assert not _outcome_unknown(psycopg.errors.UniqueViolation("duplicate key"))
    assert not _outcome_unknown(sqlite3.OperationalError("not postgres"))
