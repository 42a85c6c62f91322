"""A writer's commit hands the events it stored to this process's followers of the conversation (the live feed), so
they need not read them back — only once it surely committed; every other notice tells followers to read the log."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from loopd.server.storage import Database, MessageEvent, NewMessage, open_database
from loopd.server.streams import ConversationBus, Headers, emit, empty_model, finish, open_message

Told = list[list[tuple[int, str]] | None]
HeadersTold = list[dict[str, str]]


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


def _follower(
    told: Told, headers_told: HeadersTold | None = None
) -> Callable[[Sequence[MessageEvent] | None, Headers], None]:
    def follower(events: Sequence[MessageEvent] | None, headers: Headers) -> None:
        told.append(None if events is None else [(e.cursor, e.event["op"]) for e in events])
        if headers_told is not None:
            headers_told.append({mid: message.status for mid, message in headers.items()})

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
    bus.notify(cid)  # anyone else's notice: read the log
    assert told[-1] is None
    stop()
    async with db.transaction() as tx:
        conversation = await tx.conversations.create(actor_kind="user", actor_key="bob")
    bus.notify(conversation.id)  # another conversation
    assert len(told) == 2
    assert bus.watched == 0


async def test_a_start_and_an_end_are_handed_over_with_their_messages_header(db: Database) -> None:
    """``open_message`` and ``finish`` hand their events over too, with the message as the commit left it (the
    header a ``start`` / ``end`` frame carries): the live feed reads nothing back for them either."""
    bus = ConversationBus()
    async with db.transaction() as tx:
        cid = (await tx.conversations.create(actor_kind="user", actor_key="alice")).id
    told: Told = []
    headers: HeadersTold = []
    bus.follow(cid, _follower(told, headers))
    new = NewMessage(conversation_id=cid, kind="user", key="alice", purpose="input", content=empty_model())
    async with db.transaction() as tx:
        asked = await open_message(tx, replace(new, status="completed"), bus=bus)
        answer = await open_message(
            tx, replace(new, kind="operator", key="echo", purpose="response", status="streaming"), bus=bus
        )
    assert told == [[(1, "start"), (2, "end")], [(3, "start")]]
    assert headers == [{asked.id: "completed"}, {answer.id: "streaming"}]
    async with db.transaction() as tx:
        await finish(tx, answer.id, "failed", error={"code": "boom", "message": "it broke"}, bus=bus)
    assert told[-1] == [(4, "error"), (5, "end")]
    assert headers[-1] == {answer.id: "failed"}
    async with db.transaction(read_only=True) as tx:
        stored = await tx.message_events.read_conversation_events(cid, after_cursor=0)
    assert [(e.cursor, e.event["op"]) for e in stored] == [pair for handed in told if handed for pair in handed]


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

    def broken(events: Sequence[MessageEvent] | None, headers: Headers) -> None:
        raise ValueError("a bug")

    bus.follow("c1", broken)
    bus.follow("c1", _follower(told))
    bus.committed("c1", [])
    bus.notify("c1")
    assert told == [[], None]
