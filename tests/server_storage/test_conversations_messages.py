"""Conversations and messages: ownership, work conversations, public roles, paging, compare-and-set updates."""

from __future__ import annotations

import pytest

from loopd._infra.clock import VirtualClock
from loopd.server.storage import Conflict, Database, InvalidRecord, Message, NewMessage, NotFound
from tests.server_storage.helpers import question, record_statements, text_content, user_conversation


async def test_user_conversations_are_listed_per_owner_with_paging(db: Database) -> None:
    async with db.transaction() as tx:
        mine = [await user_conversation(tx, "alice", f"c{i}") for i in range(5)]
        await user_conversation(tx, "bob")
        await tx.conversations.create(actor_kind="operator", actor_key="router", task_id="t1")
    async with db.transaction(read_only=True) as tx:
        first = await tx.conversations.list_for_owner("alice", limit=2)
        rest = await tx.conversations.list_for_owner("alice", after=first[-1].id, limit=10)
        oldest_first = await tx.conversations.list_for_owner("alice", newest_first=False, limit=10)
        with pytest.raises(InvalidRecord):
            await tx.conversations.list_for_owner("alice", limit=0)
    assert [c.name for c in first + rest] == ["c4", "c3", "c2", "c1", "c0"]
    assert [c.id for c in oldest_first] == [c.id for c in mine]


async def test_a_task_has_at_most_one_work_conversation(db: Database) -> None:
    async with db.transaction() as tx:
        work = await tx.conversations.create(actor_kind="operator", actor_key="router", task_id="t1", name="detail")
    with pytest.raises(Conflict, match="already has a work conversation"):
        async with db.transaction() as tx:
            await tx.conversations.create(actor_kind="harness", actor_key="h", task_id="t1")
    async with db.transaction(read_only=True) as tx:
        assert await tx.conversations.find_work("t1") == work
        assert await tx.conversations.find_work("t2") is None


@pytest.mark.parametrize(
    ("kind", "key", "task_id"),
    [("user", "alice", "t1"), ("operator", "router", None), ("assistant", "x", None), ("user", "", None)],
)
async def test_conversation_shape_rules(db: Database, kind: str, key: str, task_id: str | None) -> None:
    with pytest.raises(InvalidRecord):
        async with db.transaction() as tx:
            await tx.conversations.create(actor_kind=kind, actor_key=key, task_id=task_id)  # type: ignore[arg-type]


async def test_rename_and_touch_update_the_conversation(db: Database, clock: VirtualClock) -> None:
    async with db.transaction() as tx:
        conversation = await user_conversation(tx)
    await clock.advance(5)
    async with db.transaction() as tx:
        renamed = await tx.conversations.rename(conversation.id, "renamed")
        with pytest.raises(NotFound):
            await tx.conversations.touch("missing")
    assert renamed.name == "renamed" and renamed.updated_at > conversation.updated_at
    await clock.advance(5)
    async with db.transaction() as tx:
        touched = await tx.conversations.touch(conversation.id)
        assert touched == await tx.conversations.get(conversation.id)  # what it returns is what a read returns
    assert touched.updated_at > renamed.updated_at and touched.name == "renamed"


@pytest.mark.parametrize("kind", ["assistant", "tool", "system", "model", ""])
async def test_only_public_roles_are_stored(db: Database, kind: str) -> None:
    async with db.transaction() as tx:
        conversation = await user_conversation(tx)
    with pytest.raises(InvalidRecord, match="message kind"):
        async with db.transaction() as tx:
            await tx.messages.insert(NewMessage(conversation.id, kind, "k", "output", {}))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("field", "value"),
    [("purpose", "answer"), ("status", "done"), ("content", "text"), ("key", ""), ("conversation_id", "missing")],
)
async def test_message_fields_are_checked(db: Database, field: str, value: str) -> None:
    async with db.transaction() as tx:
        conversation = await user_conversation(tx)
    fields = {
        "conversation_id": conversation.id,
        "kind": "user",
        "key": "alice",
        "purpose": "input",
        "content": text_content("x"),
        field: value,
    }
    with pytest.raises((InvalidRecord, NotFound)):
        async with db.transaction() as tx:
            await tx.messages.insert(NewMessage(**fields))  # type: ignore[arg-type]


async def test_messages_page_by_id_in_insertion_order(db: Database) -> None:
    async with db.transaction() as tx:
        conversation = await user_conversation(tx)
        work = await tx.conversations.create(actor_kind="operator", actor_key="router", task_id="t1")
        inserted: list[Message] = []
        for i in range(7):  # several per millisecond: ids must still sort in insertion order
            pair = await question(tx, conversation, f"t{i}", f"q{i}")
            inserted.extend(pair)
        output = await tx.messages.insert(NewMessage(work.id, "harness", "h1", "output", {}, task_id="t1"))
    async with db.transaction(read_only=True) as tx:
        pages, after = [], None
        while page := await tx.messages.list_conversation(conversation.id, after=after, limit=3):
            pages.append(page)
            after = page[-1].id
        task_messages = await tx.messages.list_task("t1")
    assert [m.id for page in pages for m in page] == [m.id for m in inserted]
    assert [len(page) for page in pages] == [3, 3, 3, 3, 2]
    assert [m.purpose for m in task_messages] == ["input", "response", "output"]  # both conversations
    assert task_messages[-1] == output


async def test_task_pair_finds_input_and_response_by_purpose(db: Database) -> None:
    async with db.transaction() as tx:
        conversation = await user_conversation(tx)
        input_, response = await question(tx, conversation, "t1")
        with pytest.raises(NotFound):
            await tx.messages.task_pair("t-missing")  # not committed yet / never created: the reconcile retries
    async with db.transaction(read_only=True) as tx:
        assert await tx.messages.task_pair("t1") == (input_, response)
        assert await tx.messages.task_pair_ids("t1") == (input_.id, response.id)
        assert response.reply_to_message_id == input_.id and response.revision == 1
    async with db.transaction() as tx:
        await tx.messages.insert(NewMessage(conversation.id, "operator", "router", "response", {}, task_id="t1"))
    for read in ("task_pair", "task_pair_ids"):  # the same refusals, with or without the content
        with pytest.raises(Conflict, match="more than one response"):
            async with db.transaction(read_only=True) as tx:
                await getattr(tx.messages, read)("t1")
    async with db.transaction() as tx:
        lone = await tx.messages.insert(NewMessage(conversation.id, "user", "alice", "input", {}, task_id="t2"))
        assert lone == await tx.messages.get(lone.id)  # what insert returns is what a read returns
        with pytest.raises(NotFound, match="no response"):
            await tx.messages.task_pair("t2")
        for _ in range(4):  # more inputs than one read takes of a purpose: still a conflict, not a missing response
            await tx.messages.insert(NewMessage(conversation.id, "user", "alice", "input", {}, task_id="t2"))
        await tx.messages.insert(NewMessage(conversation.id, "harness", "h", "response", {}, task_id="t2"))
        for _ in range(3):  # responses only: the input is what is missing, however many responses there are
            await tx.messages.insert(NewMessage(conversation.id, "harness", "h", "response", {}, task_id="t3"))
        for read in ("task_pair", "task_pair_ids"):
            with pytest.raises(Conflict, match="more than one input"):
                await getattr(tx.messages, read)("t2")
            with pytest.raises(NotFound, match="no input"):
                await getattr(tx.messages, read)("t3")
            with pytest.raises(NotFound):
                await getattr(tx.messages, read)("t-missing")


async def test_updates_compare_and_set_the_revision(db: Database) -> None:
    async with db.transaction() as tx:
        _, response = await question(tx, await user_conversation(tx), "t1")
    async with db.transaction() as tx:
        locked = await tx.messages.lock(response.id)
        closing = await tx.messages.update(
            locked.id, expected_revision=locked.revision, delivery_state="closing", completion={"code": "x"}
        )
    assert (closing.revision, closing.delivery_state, closing.completion) == (2, "closing", {"code": "x"})
    with pytest.raises(Conflict, match="revision 2, not 1"):
        async with db.transaction() as tx:
            await tx.messages.update(response.id, expected_revision=1, status="completed")
    async with db.transaction() as tx:
        assert [m.id for m in await tx.messages.list_closing()] == [response.id]
        done = await tx.messages.update(
            response.id,
            expected_revision=2,
            status="completed",
            content=text_content("answer"),
            delivery_state="closed",
            completion=None,
        )
        with pytest.raises(InvalidRecord):
            await tx.messages.update(response.id, expected_revision=3, delivery_state="open")  # type: ignore[arg-type]
        with pytest.raises(NotFound):
            await tx.messages.update("missing", expected_revision=1, status="failed")
    assert (done.revision, done.status, done.delivery_state, done.completion) == (3, "completed", "closed", None)
    assert done.content["blocks"][0]["content"] == "answer"


async def test_concurrent_updates_of_one_revision_have_one_winner(db: Database) -> None:
    import asyncio

    async with db.transaction() as tx:
        _, response = await question(tx, await user_conversation(tx), "t1")

    async def close(status: str) -> str:
        try:
            async with db.transaction() as tx:
                await tx.messages.update(response.id, expected_revision=1, status=status)  # type: ignore[arg-type]
        except Conflict:
            return "lost"
        return status

    results = await asyncio.gather(*(close(s) for s in ["completed", "failed", "cancelled", "expired"]))
    winners = [r for r in results if r != "lost"]
    assert len(winners) == 1
    async with db.transaction(read_only=True) as tx:
        stored = await tx.messages.get(response.id)
    assert (stored.status, stored.revision) == (winners[0], 2)


async def test_a_writer_locks_the_head_and_writes_encoded_content(db: Database) -> None:
    async with db.transaction() as tx:
        _, response = await question(tx, await user_conversation(tx), "t1")
    async with db.transaction() as tx:
        head = await tx.messages.lock_head(response.id)
        assert (head.id, head.conversation_id, head.status, head.revision, head.delivery_state) == (
            response.id, response.conversation_id, response.status, response.revision, response.delivery_state,
        )  # fmt: skip
        written = await tx.messages.write_content(
            response.id, expected_revision=head.revision, text='{"version":"1.1","biz":"x","meta":{},"blocks":[]}'
        )
        assert written.revision == head.revision + 1
        with pytest.raises(Conflict, match=f"revision {written.revision}, not {head.revision}"):
            await tx.messages.write_content(response.id, expected_revision=head.revision, text="{}")
        with pytest.raises(NotFound):
            await tx.messages.lock_head("missing")
    async with db.transaction(read_only=True) as tx:
        stored = await tx.messages.get(response.id)
    assert stored.revision == written.revision
    assert stored.content == {"version": "1.1", "biz": "x", "meta": {}, "blocks": []}


async def test_an_update_returns_what_a_fresh_read_returns(db: Database) -> None:
    async with db.transaction() as tx:
        _, response = await question(tx, await user_conversation(tx), "t1")
    async with db.transaction() as tx:
        updated = await tx.messages.update(
            response.id, expected_revision=response.revision, content=text_content("hi"), status="completed"
        )
        assert updated == await tx.messages.get(response.id)
        only_status = await tx.messages.update(response.id, expected_revision=updated.revision, delivery_state="closed")
        assert only_status == await tx.messages.get(response.id)


async def test_a_snapshot_with_a_tail_reads_as_the_fold_of_every_event(db: Database) -> None:
    """`advance` stores events without a new snapshot; every read (get, lock, lists, an update's result) folds the
    tail onto the stored snapshot, and a content write leaves no tail."""
    empty = {"version": "1.1", "biz": "chat", "meta": {}, "blocks": []}
    async with db.transaction() as tx:
        conversation = await user_conversation(tx)
        _, response = await question(tx, conversation, "t1")
        await tx.message_events.append(response.id, 1, {"op": "start", "seq": 1, "model": empty})
        await tx.message_events.append(
            response.id, 2, {"op": "set", "seq": 2, "block": {"id": "a", "type": "text", "text": "He"}}
        )
        head = await tx.messages.lock_head(response.id)
        head = await tx.messages.write_content(
            response.id,
            expected_revision=head.revision,
            text='{"version":"1.1","biz":"chat","meta":{},"blocks":[{"id":"a","type":"text","text":"He"}]}',
        )
        assert head.content_seq is None
    async with db.transaction() as tx:
        for seq, text in ((3, "ll"), (4, "o")):
            event = {"op": "append", "seq": seq, "mask": "block.text", "block": {"id": "a", "text": text}}
            await tx.message_events.append(response.id, seq, event)
        head = await tx.messages.advance(response.id, expected_revision=head.revision, content_seq=2)
        assert (head.revision, head.content_seq) == (response.revision + 2, 2)
        await tx.message_events.append(
            response.id, 5, {"op": "set", "seq": 5, "block": {"id": "b", "type": "text", "text": "!"}}
        )
        # A later advance keeps where the tail starts: the stored snapshot still folds only up to seq 2.
        head = await tx.messages.advance(response.id, expected_revision=head.revision, content_seq=4)
        assert head.content_seq == 2
        with pytest.raises(Conflict):
            await tx.messages.advance(response.id, expected_revision=head.revision - 1, content_seq=5)
        with pytest.raises(InvalidRecord):
            await tx.messages.advance(response.id, expected_revision=head.revision, content_seq=0)
    folded = [{"id": "a", "type": "text", "text": "Hello"}, {"id": "b", "type": "text", "text": "!"}]
    async with db.transaction() as tx:
        reads = [
            await tx.messages.get(response.id),
            await tx.messages.lock(response.id),
            *[m for m in await tx.messages.list_conversation(conversation.id) if m.id == response.id],
            *[m for m in await tx.messages.list_task("t1") if m.id == response.id],
        ]
        assert all(m.content["blocks"] == folded and m.revision == head.revision for m in reads)
        moved = await tx.messages.update(response.id, expected_revision=head.revision, delivery_state="closing")
        assert moved.content["blocks"] == folded  # the tail stays, and the result folds it
        assert (await tx.messages.lock_head(response.id)).content_seq == 2
        rewritten = await tx.messages.update(
            response.id, expected_revision=moved.revision, content={**empty, "blocks": folded}
        )
        assert (await tx.messages.lock_head(response.id)).content_seq is None
    async with db.transaction(read_only=True) as tx:
        stored = await tx.messages.get(response.id)
    assert stored.content["blocks"] == folded and stored.revision == rewritten.revision


async def test_a_question_checks_its_conversation_and_reply_once_per_transaction(db: Database) -> None:
    """A conversation read (or a message written) in the transaction is known to exist: inserting the question's
    input and its response looks neither up again. Rows that were never seen are still checked."""
    async with db.transaction() as tx:
        conversation = await user_conversation(tx)
    async with db.transaction() as tx:
        statements = record_statements(tx)
        await tx.conversations.get(conversation.id)
        input_, response = await question(tx, conversation, "t1")
    assert response.reply_to_message_id == input_.id
    assert [s for s in statements if "FROM conversations" in s] == [statements[0]]  # the read itself
    assert not [s for s in statements if "FROM messages" in s and not s.startswith("INSERT")]
    async with db.transaction() as tx:
        statements = record_statements(tx)
        await question(tx, conversation, "t2")
    assert sum("SELECT 1 FROM conversations" in s for s in statements) == 1
    with pytest.raises(NotFound, match="conversation"):
        async with db.transaction() as tx:
            await tx.messages.insert(NewMessage("nope", "user", "alice", "input", text_content("x")))
    with pytest.raises(NotFound, match="message"):
        async with db.transaction() as tx:
            await tx.messages.insert(
                NewMessage(conversation.id, "user", "alice", "input", text_content("x"), reply_to_message_id="nope")
            )


async def test_a_locked_head_is_read_once_per_transaction_and_follows_its_writes(db: Database) -> None:
    """A writer locks a message's head for its lock, its emit and its store of one batch: the row this transaction
    locked or wrote is read once, and every write through `Messages` leaves the held head current (what a fresh
    read in the same transaction returns). A look without the lock (`head`) holds nothing; the next transaction
    reads again."""
    async with db.transaction() as tx:
        _, response = await question(tx, await user_conversation(tx), "t1")

    def reads(statements: list[str]) -> int:
        return sum(s.startswith("SELECT") and "FROM messages" in s for s in statements)

    async with db.transaction() as tx:
        statements = record_statements(tx)
        first = await tx.messages.head(response.id)  # no lock: not held
        locked = await tx.messages.lock_head(response.id)
        assert first == locked and await tx.messages.lock_head(response.id) == locked
        assert await tx.messages.head(response.id) == locked
        assert reads(statements) == 2
        written = await tx.messages.write_content(
            response.id, expected_revision=locked.revision, text='{"version":"1.1","biz":"x","meta":{},"blocks":[]}'
        )
        assert await tx.messages.lock_head(response.id) == written
        advanced = await tx.messages.advance(response.id, expected_revision=written.revision, content_seq=1)
        assert await tx.messages.lock_head(response.id) == advanced
        updated = await tx.messages.update(response.id, expected_revision=advanced.revision, delivery_state="closing")
        held = await tx.messages.lock_head(response.id)
        assert (held.revision, held.delivery_state, held.content_seq) == (updated.revision, "closing", 1)
        assert reads(statements) == 2
        fresh = await tx.messages._head(response.id, "")  # what a read returns, bypassing what is held
        assert held == fresh
        with pytest.raises(Conflict):  # a stale expected revision is still refused by the row itself
            await tx.messages.write_content(response.id, expected_revision=locked.revision, text="{}")
        assert await tx.messages.lock_head(response.id) == held
    async with db.transaction() as tx:
        statements = record_statements(tx)
        assert await tx.messages.lock_head(response.id) == held
        assert reads(statements) == 1


async def test_a_message_task_is_known_once_the_transaction_saw_the_row(db: Database) -> None:
    """A message's Task is fixed when it is stored: once this transaction inserted, read or locked the row, asking
    for it again needs no statement (a call's start reads its message, then its drive asks for the Task)."""
    async with db.transaction() as tx:
        statements = record_statements(tx)
        input_, response = await question(tx, await user_conversation(tx), "t1")
        assert await tx.messages.task_id_of(response.id) == "t1"
        assert not [s for s in statements if s.startswith("SELECT") and "FROM messages" in s]
    async with db.transaction() as tx:
        statements = record_statements(tx)
        assert (await tx.messages.head(input_.id)).task_id == await tx.messages.task_id_of(input_.id) == "t1"
        assert await tx.messages.task_id_of(response.id) == "t1"  # not seen yet in this transaction: read
        assert await tx.messages.task_id_of(response.id) == "t1"
        assert sum(s.startswith("SELECT") and "FROM messages" in s for s in statements) == 2
        with pytest.raises(NotFound):
            await tx.messages.task_id_of("missing")


async def test_a_conversation_and_where_it_was_forked_from_come_in_one_read(db: Database) -> None:
    async with db.transaction() as tx:
        parent = await user_conversation(tx, "alice", "parent")
        asked, _ = await question(tx, parent, "t1")
        fork = await user_conversation(tx, "alice", "fork")
        origin = await tx.conversation_forks.insert(
            fork.id,
            parent_conversation_id=parent.id,
            parent_message_id=asked.id,
            source_message_id=asked.id,
            mode="retry",
        )
    async with db.transaction(read_only=True) as tx:
        statements = record_statements(tx)
        assert await tx.conversations.get_with_fork(fork.id) == (await tx.conversations.get(fork.id), origin)
        assert await tx.conversations.get_with_fork(parent.id) == (parent, None)
        assert len(statements) == 3  # the fork's and the parent's reads, one each; and the plain get
        with pytest.raises(NotFound):
            await tx.conversations.get_with_fork("missing")
