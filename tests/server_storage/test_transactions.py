"""Transactions: all-or-nothing across repositories, the chat-create flow, timeouts, closing."""

from __future__ import annotations

import asyncio
import sqlite3
import sys
from collections.abc import AsyncGenerator
from pathlib import Path

import pytest

from loopd.resources import TASK_KIND, AlreadyExists, open_sqlite_store
from loopd.server.storage import Database, NotFound, StorageUnavailable
from tests.server_storage.conftest import DatabaseFactory
from tests.server_storage.helpers import question, user_conversation
from tests.support.waiting import opened_despite_load


class Boom(Exception):
    pass


async def test_an_exception_inside_the_block_leaves_nothing(db: Database) -> None:
    async with db.transaction() as tx:
        conversation = await user_conversation(tx)
    with pytest.raises(Boom):
        async with db.transaction() as tx:
            input_, response = await question(tx, conversation, "task-1")
            await tx.message_events.append(response.id, 1, {"op": "start", "seq": 1})
            await tx.actor_leases.upsert("operator", "router")
            raise Boom
    async with db.transaction(read_only=True) as tx:
        assert await tx.messages.list_conversation(conversation.id) == []
        assert await tx.message_events.read_conversation_events(conversation.id) == []
        assert await tx.message_events.last_cursor(conversation.id) == 0
        assert await tx.actor_leases.list_live() == []
        with pytest.raises(NotFound):
            await tx.messages.get(input_.id)


async def test_chat_create_rolls_back_the_messages_when_the_task_cannot_be_created(
    db: Database, tmp_path: Path
) -> None:
    """Messages are inserted, then the Task is created in the resource store before commit; if that fails, the
    messages vanish with the transaction (no orphan messages)."""
    async with open_sqlite_store(tmp_path / "resources.db") as resources:
        async with db.transaction() as tx:
            conversation = await user_conversation(tx)

        async def create(task_id: str) -> None:
            async with db.transaction() as tx:
                await question(tx, conversation, task_id)
                await resources.create(
                    TASK_KIND,
                    {
                        "apiVersion": "loopd.dev/v1alpha1",
                        "kind": "Task",
                        "metadata": {"name": task_id, "namespace": "default"},
                        "spec": {"target": {"kind": "operator", "key": "router"}, "revision": 1},
                    },
                )

        await create("task-ok")
        with pytest.raises(AlreadyExists):
            await create("task-ok")  # same task id again: the Task exists, so the new pair must not
        async with db.transaction(read_only=True) as tx:
            messages = await tx.messages.list_conversation(conversation.id)
            assert [m.purpose for m in messages] == ["input", "response"]
            assert {m.task_id for m in messages} == {"task-ok"}
        assert (await resources.get(TASK_KIND, "task-ok", namespace="default"))["spec"]["revision"] == 1


async def test_read_only_transactions_see_committed_state(db: Database) -> None:
    async with db.transaction() as tx:
        conversation = await user_conversation(tx)
    async with db.transaction(read_only=True) as tx:
        assert (await tx.conversations.get(conversation.id)).actor_key == "alice"


async def test_a_blocked_database_times_out_as_unavailable(
    backend: str, database_url: str, open_db: DatabaseFactory
) -> None:
    await open_db()  # migrated by a handle with the usual timeout: the short one below only has to open it
    db = await opened_despite_load(lambda: open_db(operation_timeout=0.3), StorageUnavailable)
    if backend == "sqlite":
        blocker = sqlite3.connect(database_url, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        release = blocker.close
    else:
        import psycopg

        blocker_pg = await psycopg.AsyncConnection.connect(database_url, autocommit=True)
        await blocker_pg.execute("BEGIN")
        await blocker_pg.execute("LOCK TABLE conversations IN ACCESS EXCLUSIVE MODE")

        def release() -> None:
            pass

    try:
        # The blocker holds its lock until `finally`: only the 0.3 s operation timeout can end this (30 s: a hang).
        async with asyncio.timeout(30):
            with pytest.raises(StorageUnavailable):
                async with db.transaction() as tx:
                    await user_conversation(tx)
    finally:
        if backend == "sqlite":
            release()
        else:
            await blocker_pg.close()
    async with db.transaction() as tx:  # usable again once the blocker is gone
        await user_conversation(tx)


async def test_a_closed_database_is_unavailable(open_db: DatabaseFactory) -> None:
    db = await open_db()
    await db.aclose()
    with pytest.raises(StorageUnavailable):
        async with db.transaction() as tx:
            await user_conversation(tx)


async def test_an_unreachable_database_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(StorageUnavailable):
        await Database.open(tmp_path / "missing-folder" / "loopd.db")


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_a_transaction_is_entered_without_an_async_generator(db: Database) -> None:
    """A server opens tens of transactions per request: entering and leaving one creates no async generator (a
    generator context manager costs each an object, its registration with the event loop and more frames) — on
    the SQLite backend, a write that commits, one that rolls back and a read."""
    started: list[object] = []
    hooks = sys.get_asyncgen_hooks()

    def first_iteration(generator: AsyncGenerator[object, None]) -> None:
        started.append(generator)
        if hooks.firstiter is not None:
            hooks.firstiter(generator)

    sys.set_asyncgen_hooks(firstiter=first_iteration, finalizer=hooks.finalizer)
    try:
        async with db.transaction() as tx:
            conversation = await user_conversation(tx)
        with pytest.raises(Boom):
            async with db.transaction() as tx:
                await tx.conversations.touch(conversation.id)
                raise Boom
        async with db.transaction(read_only=True) as tx:
            assert (await tx.conversations.get(conversation.id)).id == conversation.id
    finally:
        sys.set_asyncgen_hooks(*hooks)
    assert started == []
