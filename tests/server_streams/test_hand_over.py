"""A writer's commit hands the events it stored to this process's followers of the conversation (the live feed), so
they need not read them back — only once it surely committed; every other notice tells followers to read the log."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

import pytest

from loopd.server.storage import Database, MessageEvent, NewMessage, open_database
from loopd.server.streams import ConversationBus, emit, empty_model, finish, open_message

Told = list[list[tuple[int, str]] | None]


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[Database]:
    async with open_database(tmp_path / "loopd.db") as database:
        yield database


async def _streaming(db: Database, bus: ConversationBus) -> tuple[str, str]:
    async with db.transaction() as tx:
        conversation = await tx.conversations.create(actor_kind="user", actor_key="alice")
        message = await open_message(
            tx,
            NewMessage(
                conversation_id=conversation.id,
                kind="operator",
                key="echo",
                purpose="response",
                content=empty_model(),
                task_id="t1",
                status="streaming",
            ),
            bus=bus,
        )
    return conversation.id, message.id


def _follower(told: Told) -> Callable[[Sequence[MessageEvent] | None], None]:
    def follower(events: Sequence[MessageEvent] | None) -> None:
        told.append(None if events is None else [(e.cursor, e.event["op"]) for e in events])

    return follower


def _pieces(*texts: str) -> list[dict[str, object]]:
    return [{"op": "append", "mask": "block.content", "block": {"id": "a", "content": text}} for text in texts]


async def test_an_emit_hands_its_stored_events_to_the_followers_after_the_commit(db: Database) -> None:
    bus = ConversationBus()
    cid, mid = await _streaming(db, bus)
    told: Told = []
    stop = bus.follow(cid, _follower(told))
    async with db.transaction() as tx:
        await emit(
            tx, mid, [{"op": "set", "block": {"id": "a", "type": "text", "content": ""}}, *_pieces("x")], bus=bus
        )
        assert told == []  # nothing before the commit
    assert told == [[(2, "set"), (3, "append")]]  # exactly what the log holds after the start (cursor 1)
    async with db.transaction(read_only=True) as tx:
        stored = await tx.message_events.read_conversation_events(cid, after_cursor=1)
    assert [(e.cursor, e.event["op"]) for e in stored] == told[0]
    async with db.transaction() as tx:
        await finish(tx, mid, "completed", bus=bus)  # not an emit: the end carries a header, read from the log
    assert told[-1] is None
    bus.notify(cid)  # anyone else's notice: read the log
    assert told[-1] is None
    stop()
    async with db.transaction() as tx:
        conversation = await tx.conversations.create(actor_kind="user", actor_key="bob")
    bus.notify(conversation.id)  # another conversation
    assert len(told) == 3
    assert bus.watched == 0


async def test_a_commit_whose_outcome_is_unknown_only_wakes_the_followers(db: Database) -> None:
    bus = ConversationBus()
    cid, mid = await _streaming(db, bus)
    told: Told = []
    bus.follow(cid, _follower(told))
    async with db.transaction() as tx:
        await emit(tx, mid, [{"op": "set", "block": {"id": "a", "type": "text", "content": "maybe"}}], bus=bus)
        tx.outcome_unknown = True  # as the database marks a transaction whose COMMIT may not have happened
    assert told == [None]  # read the log: never pass on what may not be durable


async def test_a_rolled_back_emit_tells_no_one(db: Database) -> None:
    bus = ConversationBus()
    cid, mid = await _streaming(db, bus)
    told: Told = []
    bus.follow(cid, _follower(told))
    with pytest.raises(RuntimeError):
        async with db.transaction() as tx:
            await emit(tx, mid, [{"op": "set", "block": {"id": "a", "type": "text", "content": "no"}}], bus=bus)
            raise RuntimeError("rolled back")
    assert told == []


def test_a_failing_follower_does_not_keep_the_notice_from_the_others() -> None:
    bus = ConversationBus()
    told: Told = []

    def broken(events: Sequence[MessageEvent] | None) -> None:
        raise ValueError("a bug")

    bus.follow("c1", broken)
    bus.follow("c1", _follower(told))
    bus.committed("c1", [])
    bus.notify("c1")
    assert told == [[], None]
