"""The durable message event log: per-message seqs and the per-conversation cursor used for SSE resume."""

from __future__ import annotations

import asyncio

import pytest

from loopd.server.storage import Conflict, Database, InvalidRecord, Message, NewMessage, NotFound
from tests.server_storage.helpers import question, record_statements, user_conversation


def start(seq: int) -> dict[str, object]:
    return {"op": "start", "seq": seq, "model": {"version": "1.1", "biz": "chat", "meta": {}, "blocks": []}}


def append(seq: int, text: str) -> dict[str, object]:
    return {"op": "append", "seq": seq, "mask": "block.content", "block": {"id": "a", "type": "text", "content": text}}


async def test_seqs_start_at_one_and_have_no_gaps(db: Database) -> None:
    async with db.transaction() as tx:
        _, response = await question(tx, await user_conversation(tx), "t1")
        first, appended = await tx.message_events.append(response.id, 1, start(1))
        assert appended and (first.seq, first.cursor) == (1, 1)
        with pytest.raises(Conflict, match="next event must be 2"):
            await tx.message_events.append(response.id, 3, append(3, "x"))
        with pytest.raises(InvalidRecord):
            await tx.message_events.append(response.id, 0, start(0))
        with pytest.raises(NotFound):
            await tx.message_events.append("missing", 1, start(1))
        await tx.message_events.append(response.id, 2, append(2, "Hel"))
        await tx.message_events.append(response.id, 3, append(3, "lo"))
    async with db.transaction(read_only=True) as tx:
        assert [e.seq for e in await tx.message_events.read(response.id)] == [1, 2, 3]
        assert [e.event["op"] for e in await tx.message_events.read(response.id, after_seq=1)] == ["append"] * 2
        assert await tx.message_events.last_seq(response.id) == 3


async def test_a_repeated_seq_is_idempotent_only_with_identical_content(db: Database) -> None:
    async with db.transaction() as tx:
        _, response = await question(tx, await user_conversation(tx), "t1")
        stored, _ = await tx.message_events.append(response.id, 1, start(1))
        await tx.message_events.append(response.id, 2, append(2, "a"))
    async with db.transaction() as tx:
        again, appended = await tx.message_events.append(response.id, 1, dict(reversed(list(start(1).items()))))
        assert not appended and again == stored  # key order does not matter, content does
        with pytest.raises(Conflict, match="different event at seq 2"):
            await tx.message_events.append(response.id, 2, append(2, "b"))
        assert await tx.message_events.last_cursor(response.conversation_id) == 2


async def test_the_conversation_cursor_spans_every_message_in_commit_order(db: Database) -> None:
    async with db.transaction() as tx:
        conversation = await user_conversation(tx)
        _, first = await question(tx, conversation, "t1")
        _, second = await question(tx, conversation, "t2")
        other = await user_conversation(tx, "bob")
        _, elsewhere = await question(tx, other, "t3")
    order = [(first, 1), (second, 1), (first, 2), (elsewhere, 1), (second, 2)]
    for message, seq in order:
        async with db.transaction() as tx:
            await tx.message_events.append(message.id, seq, start(seq) if seq == 1 else append(seq, "x"))
    async with db.transaction(read_only=True) as tx:
        events = await tx.message_events.read_conversation_events(conversation.id)
        resumed = await tx.message_events.read_conversation_events(conversation.id, after_cursor=2, limit=1)
    assert [(e.message_id, e.seq, e.cursor) for e in events] == [
        (first.id, 1, 1),
        (second.id, 1, 2),
        (first.id, 2, 3),
        (second.id, 2, 4),
    ]
    assert [(e.message_id, e.seq) for e in resumed] == [(first.id, 2)]


@pytest.mark.parametrize("writers_lock", [False, True], ids=["unlocked", "message-locked"])
async def test_concurrent_appends_give_a_gap_free_cursor_that_readers_never_skip(
    db: Database, writers_lock: bool
) -> None:
    """Writers on many messages of one conversation, and a reader resuming by cursor while they run (writers that
    hold their message's lock let the append lock the conversation's counter as it advances it)."""
    writers, per_writer = 6, 8
    async with db.transaction() as tx:
        conversation = await user_conversation(tx)
        messages: list[Message] = []
        for i in range(writers):
            messages.append(
                await tx.messages.insert(NewMessage(conversation.id, "harness", f"h{i}", "output", {}, task_id="t"))
            )
    done = asyncio.Event()

    async def write(message: Message) -> None:
        for seq in range(1, per_writer + 1):
            async with db.transaction() as tx:
                if writers_lock:
                    locked = await tx.messages.lock(message.id)
                    events = [(seq, append(seq, f"{message.key}:{seq}"))]
                    await tx.message_events.append_many(message.id, events, locked=locked, last_seq=seq - 1)
                else:
                    await tx.message_events.append(message.id, seq, append(seq, f"{message.key}:{seq}"))

    async def read() -> list[int]:
        seen: list[int] = []
        while True:
            finished = done.is_set()
            async with db.transaction(read_only=True) as tx:
                batch = await tx.message_events.read_conversation_events(
                    conversation.id, after_cursor=seen[-1] if seen else 0
                )
            seen.extend(e.cursor for e in batch)
            if finished and not batch:
                return seen
            await asyncio.sleep(0)

    reader = asyncio.create_task(read())
    await asyncio.gather(*(write(m) for m in messages))
    done.set()
    seen = await asyncio.wait_for(reader, 20)
    total = writers * per_writer
    assert seen == list(range(1, total + 1))
    async with db.transaction(read_only=True) as tx:
        events = await tx.message_events.read_conversation_events(conversation.id, limit=1000)
    assert [e.cursor for e in events] == list(range(1, total + 1))
    for message in messages:
        assert [e.seq for e in events if e.message_id == message.id] == list(range(1, per_writer + 1))


async def test_racing_writers_of_one_seq_store_it_once(db: Database) -> None:
    async with db.transaction() as tx:
        _, response = await question(tx, await user_conversation(tx), "t1")

    async def write(text: str) -> str:
        try:
            async with db.transaction() as tx:
                _, appended = await tx.message_events.append(response.id, 1, append(1, text))
        except Conflict:
            return "conflict"
        return "appended" if appended else "replayed"

    results = await asyncio.gather(*(write(text) for text in ["a", "a", "b", "c"]))
    assert results.count("appended") == 1
    async with db.transaction(read_only=True) as tx:
        stored = await tx.message_events.read(response.id)
    assert len(stored) == 1 and stored[0].cursor == 1
    winner = stored[0].event["block"]["content"]
    assert all(r == "conflict" for r, t in zip(results, ["a", "a", "b", "c"], strict=True) if t != winner)


async def test_appending_many_at_once_stores_what_appending_one_by_one_does(db: Database) -> None:
    events = [(1, start(1)), *((seq, append(seq, f"p{seq}")) for seq in range(2, 801))]  # over one INSERT's rows
    async with db.transaction() as tx:
        conversation = await user_conversation(tx)
        _, one_by_one = await question(tx, conversation, "t1")
        _, together = await question(tx, conversation, "t2")
    async with db.transaction() as tx:
        singles = [await tx.message_events.append(one_by_one.id, seq, event) for seq, event in events]
    async with db.transaction() as tx:
        batch = await tx.message_events.append_many(together.id, events)
    assert [(e.seq, e.event, appended) for e, appended in batch] == [(e.seq, e.event, a) for e, a in singles]
    assert [e.cursor for e, _ in batch] == list(range(801, 1601))  # after the first message's, without gaps
    async with db.transaction(read_only=True) as tx:
        stored = await tx.message_events.read(together.id, limit=1000)
        assert [(e.seq, e.cursor, e.event) for e in stored] == [(e.seq, e.cursor, e.event) for e, _ in batch]
        assert await tx.message_events.last_cursor(conversation.id) == 1600


async def test_a_batch_may_repeat_stored_events_and_is_refused_whole(db: Database) -> None:
    async with db.transaction() as tx:
        _, response = await question(tx, await user_conversation(tx), "t1")
        await tx.message_events.append_many(response.id, [(1, start(1)), (2, append(2, "a"))])
    async with db.transaction() as tx:
        # a retried write: the stored part comes back as stored, the rest is appended
        repeated = await tx.message_events.append_many(response.id, [(2, append(2, "a")), (3, append(3, "b"))])
        assert [(e.seq, appended) for e, appended in repeated] == [(2, False), (3, True)]
        with pytest.raises(Conflict, match="different event at seq 3"):
            await tx.message_events.append_many(response.id, [(3, append(3, "c")), (4, append(4, "d"))])
        with pytest.raises(Conflict, match="next event must be 4"):
            await tx.message_events.append_many(response.id, [(5, append(5, "e"))])
        with pytest.raises(InvalidRecord, match="consecutive"):
            await tx.message_events.append_many(response.id, [(4, append(4, "d")), (6, append(6, "f"))])
        with pytest.raises(InvalidRecord, match="JSON object"):
            await tx.message_events.append_many(response.id, [(4, append(4, "d")), (5, ["not", "an", "object"])])  # type: ignore[list-item]
        assert await tx.message_events.append_many(response.id, []) == []
    async with db.transaction(read_only=True) as tx:
        assert await tx.message_events.last_seq(response.id) == 3  # nothing of a refused batch was stored
        assert await tx.message_events.last_cursor(response.conversation_id) == 3


async def test_a_writer_holding_the_message_lock_reads_neither_its_conversation_nor_its_counter_first(
    db: Database,
) -> None:
    async with db.transaction() as tx:
        conversation = await user_conversation(tx)
        _, response = await question(tx, conversation, "t1")
        _, other = await question(tx, conversation, "t2")
        await tx.message_events.append_many(other.id, [(1, start(1))])
    async with db.transaction() as tx:
        head = await tx.messages.lock_head(response.id)
        statements = record_statements(tx, writes=True)
        stored = await tx.message_events.append_many(
            response.id, [(1, start(1)), (2, append(2, "a"))], locked=head, last_seq=0
        )
        assert [(e.seq, e.cursor, appended) for e, appended in stored] == [(1, 2, True), (2, 3, True)]
        assert len(statements) == 1 and statements[0].startswith("UPDATE conversation_cursors")  # + the insert
        statements.clear()
        repeated = await tx.message_events.append_many(response.id, [(2, append(2, "a"))], locked=head)
        assert [appended for _, appended in repeated] == [False]  # a repeat is still recognised (seq read)
        assert not any(sql.startswith("UPDATE") for sql in statements)
        with pytest.raises(InvalidRecord, match="is not message"):
            await tx.message_events.append_many(other.id, [(2, append(2, "b"))], locked=head)
    async with db.transaction(read_only=True) as tx:
        assert await tx.message_events.last_cursor(conversation.id) == 3
        assert [e.cursor for e in await tx.message_events.read(response.id)] == [2, 3]


async def test_messages_opened_together_share_one_counter_advance_and_one_insert(db: Database) -> None:
    """A question's input and response, inserted in one transaction, store their opening events with one advance of
    the conversation's counter and one insert: numbered from 1 per message, cursors in the order given, and the
    same rows as appending them one message at a time."""
    async with db.transaction() as tx:
        conversation = await user_conversation(tx)
        input_, response = await question(tx, conversation, "t1")
        statements = record_statements(tx, writes=True)
        stored = await tx.message_events.append_openings(
            [(input_, [(1, start(1)), (2, {"op": "end", "seq": 2})]), (response, [(1, start(1))])]
        )
        assert len(statements) == 1 and statements[0].startswith("UPDATE conversation_cursors")  # (+ insert_rows)
    assert [(e.message_id, e.seq, e.cursor) for e in stored] == [
        (input_.id, 1, 1), (input_.id, 2, 2), (response.id, 1, 3),
    ]  # fmt: skip
    async with db.transaction(read_only=True) as tx:
        assert await tx.message_events.read_conversation_events(conversation.id) == stored
        assert await tx.message_events.last_cursor(conversation.id) == 3
    async with db.transaction() as tx:
        other = await user_conversation(tx, "bob")
        _, elsewhere = await question(tx, other, "t2")
        with pytest.raises(InvalidRecord, match="one conversation"):
            await tx.message_events.append_openings([(elsewhere, [(1, start(1))]), (input_, [(1, start(1))])])
        with pytest.raises(InvalidRecord, match="numbered from 1"):
            await tx.message_events.append_openings([(elsewhere, [(2, start(2))])])
        assert await tx.message_events.append_openings([]) == []
    with pytest.raises(Conflict):  # not a new message: its seq 1 is taken
        async with db.transaction() as tx:
            await tx.message_events.append_openings([(response, [(1, start(1))])])
    async with db.transaction(read_only=True) as tx:
        assert await tx.message_events.last_cursor(conversation.id) == 3  # the refused one left nothing
