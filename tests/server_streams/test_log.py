"""The visible stream of a message: ordered durable events, snapshot == fold, terminal is final, readers woken."""

from __future__ import annotations

import asyncio

import pytest

from loopd.agentue import fold
from loopd.server.storage import Conflict, Database, InvalidRecord, NewMessage
from loopd.server.streams import ConversationBus, emit, empty_model, finish, open_message
from tests.server_storage.helpers import record_statements


async def _conversation(db: Database) -> str:
    async with db.transaction() as tx:
        return (await tx.conversations.create(actor_kind="user", actor_key="alice")).id


def _streaming(conversation_id: str) -> NewMessage:
    return NewMessage(
        conversation_id=conversation_id,
        kind="harness",
        key="assistant",
        purpose="response",
        content=empty_model(),
        task_id="t1",
        status="streaming",
    )


async def test_snapshot_is_the_fold_of_the_stored_events(db: Database) -> None:
    cid = await _conversation(db)
    bus = ConversationBus()
    async with db.transaction() as tx:
        message = await open_message(tx, _streaming(cid), bus=bus)
    async with db.transaction() as tx:
        await emit(
            tx,
            message.id,
            [
                {"op": "set", "block": {"id": "answer", "type": "text", "text": ""}},
                {"op": "append", "mask": "block.text", "block": {"id": "answer", "text": "Hel"}},
                {"op": "ping"},
                {"op": "append", "mask": "block.text", "block": {"id": "answer", "text": "lo"}},
            ],
            bus=bus,
        )
    async with db.transaction() as tx:
        done = await finish(tx, message.id, "completed", bus=bus)
        again = await finish(tx, message.id, "completed", bus=bus)  # idempotent
        events = await tx.message_events.read(message.id)
    assert again.revision == done.revision
    assert [e.seq for e in events] == [1, 2, 3, 4, 5]
    assert [e.event["op"] for e in events] == ["start", "set", "append", "append", "end"]
    folded = fold([e.event for e in events])
    assert folded.model is not None and folded.ended
    assert folded.model.to_json() == done.content
    assert done.content["blocks"] == [{"id": "answer", "type": "text", "text": "Hello"}]
    assert done.status == "completed"
    # Cursors order every event of the conversation.
    async with db.transaction(read_only=True) as tx:
        cursors = [e.cursor for e in await tx.message_events.read_conversation_events(cid)]
    assert cursors == [1, 2, 3, 4, 5]


async def test_bad_events_are_refused_and_nothing_is_stored(db: Database) -> None:
    cid = await _conversation(db)
    async with db.transaction() as tx:
        message = await open_message(tx, _streaming(cid))
    bad = [
        [{"op": "start", "model": empty_model()}],
        [{"op": "end"}],
        [{"op": "set", "block": {"id": "q", "type": "ask", "prompt": "?"}}],
        [{"op": "set", "mask": "meta.human", "meta": {"human": {"x": 1}}}],
        [{"op": "append", "mask": "block.text", "block": {"id": "nope", "text": 3}}],
        [{"op": "teleport"}],
        [
            {"op": "set", "block": {"id": "a", "type": "text", "text": ""}},
            {"op": "append", "mask": "block.text", "block": {"id": "a", "text": ["not", "text"]}},
        ],
    ]
    for events in bad:
        with pytest.raises(InvalidRecord):
            async with db.transaction() as tx:
                await emit(tx, message.id, events)
    async with db.transaction(read_only=True) as tx:
        assert [e.seq for e in await tx.message_events.read(message.id)] == [1]


async def test_a_terminal_message_takes_no_more_events(db: Database) -> None:
    cid = await _conversation(db)
    async with db.transaction() as tx:
        message = await open_message(tx, _streaming(cid))
        failed = await finish(tx, message.id, "failed", error={"code": "harness_failed", "message": "boom"})
    assert failed.content["meta"]["error"]["code"] == "harness_failed"
    with pytest.raises(Conflict):
        async with db.transaction() as tx:
            await emit(tx, message.id, [{"op": "set", "block": {"id": "a", "type": "text", "text": "late"}}])


async def test_readers_are_woken_after_commit_and_not_on_rollback(db: Database) -> None:
    cid = await _conversation(db)
    bus = ConversationBus()
    waiter = asyncio.create_task(bus.wait(cid, timeout=0.5))
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError):
        async with db.transaction() as tx:
            await open_message(tx, _streaming(cid), bus=bus)
            raise RuntimeError("rolled back")
    assert await waiter is False
    waiter = asyncio.create_task(bus.wait(cid, timeout=5))
    await asyncio.sleep(0)
    async with db.transaction() as tx:
        await open_message(tx, _streaming(cid), bus=bus)
    assert await waiter is True
    assert bus.watched == 0


async def test_finishing_a_message_this_transaction_locked_reads_its_row_once(db: Database) -> None:
    """A writer that locked (or just wrote) the message hands the row to `finish`, which neither locks nor reads it
    again; the stream ends as it would otherwise."""
    cid = await _conversation(db)
    async with db.transaction() as tx:
        message = await open_message(tx, _streaming(cid))
        other = await open_message(tx, _streaming(cid))
        await emit(tx, message.id, [{"op": "set", "block": {"id": "answer", "type": "text", "text": "hi"}}])
    async with db.transaction() as tx:
        locked = await tx.messages.lock(message.id)
        with pytest.raises(InvalidRecord, match="is not message"):
            await finish(tx, other.id, "completed", locked=locked)
        statements = record_statements(tx)
        ended = await finish(tx, message.id, "completed", locked=locked)
        assert not any(sql.startswith("SELECT") and "FROM messages WHERE id" in sql for sql in statements)
        events = await tx.message_events.read(message.id)
    assert [e.event["op"] for e in events] == ["start", "set", "end"]
    folded = fold([e.event for e in events])
    assert ended.status == "completed" and folded.model is not None and folded.model.to_json() == ended.content


async def test_finishing_a_whole_snapshot_does_not_write_its_content_again(db: Database) -> None:
    """An end changes no block: a message whose stored content already folds every event (no tail) ends by a write
    of its status alone — the content stays as stored, and still reads as the fold of every event. An error event
    changes the content, so a failure writes it."""
    cid = await _conversation(db)
    async with db.transaction() as tx:
        ok = await open_message(tx, _streaming(cid))
        failing = await open_message(tx, _streaming(cid))
        for message in (ok, failing):
            await emit(tx, message.id, [{"op": "set", "block": {"id": "answer", "type": "text", "text": "hi"}}])
    for message, error in ((ok, None), (failing, {"code": "x", "message": "boom"})):
        async with db.transaction() as tx:
            locked = await tx.messages.lock(message.id)
            statements = record_statements(tx)
            ended = await finish(tx, message.id, "completed" if error is None else "failed", locked=locked, error=error)
        (update,) = [sql for sql in statements if sql.startswith("UPDATE messages")]
        assert ("content = ?" in update) is (error is not None)
        async with db.transaction(read_only=True) as tx:
            stored = await tx.messages.get(message.id)
            events = await tx.message_events.read(message.id)
        folded = fold([e.event for e in events])
        assert folded.model is not None and stored.content == folded.model.to_json() == ended.content
        assert stored.status == ("completed" if error is None else "failed")
