"""A writer's cache of the stream states it left (`StreamStates`): the same snapshots and events as without it, no
rebuild of the stored snapshot for a message it wrote last, and never a state from a rolled-back or foreign write."""

from __future__ import annotations

from typing import Any

import pytest

from loopd.agentue import StreamState
from loopd.server import streams as streams_module
from loopd.server.storage import Database
from loopd.server.streams import CommittedStates, ConversationBus, StreamStates, emit, emit_held, finish, store_held
from tests.server_storage.helpers import record_statements
from tests.server_streams.helpers import streaming_answer


def _piece(text: str) -> dict[str, Any]:
    return {"op": "append", "mask": "block.text", "block": {"id": "answer", "text": text}}


SET = {"op": "set", "block": {"id": "answer", "type": "text", "text": ""}}


def _count_rebuilds(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The ids of the messages whose stream state is rebuilt from the stored snapshot, in order."""
    rebuilt: list[str] = []
    real_state_of = streams_module._log.state_of

    async def counting_state_of(tx: Any, message: Any) -> StreamState:
        rebuilt.append(message.id)
        return await real_state_of(tx, message)

    monkeypatch.setattr(streams_module._log, "state_of", counting_state_of)
    return rebuilt


async def test_emits_through_the_cache_store_what_emits_without_it_store(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    cached, plain = await streaming_answer(db), await streaming_answer(db)
    states = StreamStates()
    rebuilt = _count_rebuilds(monkeypatch)
    for batch in ([SET], [_piece("Hel")], [_piece("lo")], [_piece(", "), _piece("world")]):
        async with db.transaction() as tx:
            await emit(tx, cached, batch, states=states)
        async with db.transaction() as tx:
            await emit(tx, plain, batch)
    async with db.transaction(read_only=True) as tx:
        one, two = await tx.messages.get(cached), await tx.messages.get(plain)
        events = [e.event for e in await tx.message_events.read(cached)]
        other = [e.event for e in await tx.message_events.read(plain)]
    assert one.content == two.content and one.content["blocks"][0]["text"] == "Hello, world"
    assert events == other
    assert rebuilt.count(cached) == 1 and rebuilt.count(plain) == 4  # only the first batch read the snapshot


async def test_a_rolled_back_or_foreign_write_never_answers_from_the_cache(db: Database) -> None:
    message_id = await streaming_answer(db)
    states = StreamStates()
    async with db.transaction() as tx:
        await emit(tx, message_id, [SET, _piece("a")], states=states)
    with pytest.raises(RuntimeError):
        async with db.transaction() as tx:
            await emit(tx, message_id, [_piece("LOST")], states=states)
            raise RuntimeError("the commit failed")
    async with db.transaction() as tx:
        await emit(tx, message_id, [_piece("b")])  # another writer: the revision moves past the cached one
    async with db.transaction() as tx:
        await emit(tx, message_id, [_piece("c")], states=states)
    async with db.transaction(read_only=True) as tx:
        stored = await tx.messages.get(message_id)
    assert stored.content["blocks"][0]["text"] == "abc"


def test_the_cache_keeps_the_newest_messages_only() -> None:
    states = StreamStates(limit=2)
    made = []
    for index in range(3):
        message: Any = type("M", (), {"id": f"m{index}", "revision": 1})()
        states.put(message, StreamState(stream_id=str(index)))
        made.append(message)
    assert states.get(made[0]) is None
    assert states.get(made[2]) is not None and states.get(made[1]) is not None
    with pytest.raises(ValueError):
        StreamStates(limit=0)


async def test_emit_held_stores_what_emit_stores_and_reads_the_snapshot_once(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Several emits in one transaction and across transactions: the held state carries over inside the
    # transaction (before its commit) and after it, so only the very first emit rebuilds it from the stored snapshot.
    held, plain = await streaming_answer(db), await streaming_answer(db)
    states = StreamStates()
    rebuilt = _count_rebuilds(monkeypatch)
    for batches in ([[SET], [_piece("Hel")]], [[_piece("lo")]], [[_piece(", ")], [], [_piece("world")]]):
        async with db.transaction() as tx:
            for batch in batches:
                head, state, stored = await emit_held(tx, held, batch, states=states)
                assert len(stored) == len(batch)
                assert state.model is not None and head.revision == (await tx.messages.get(held)).revision
        async with db.transaction() as tx:
            for batch in batches:
                await emit(tx, plain, batch)
    async with db.transaction(read_only=True) as tx:
        one, two = await tx.messages.get(held), await tx.messages.get(plain)
        events = [e.event for e in await tx.message_events.read(held)]
        other = [e.event for e in await tx.message_events.read(plain)]
    assert one.content == two.content and one.content["blocks"][0]["text"] == "Hello, world"
    assert events == other
    assert rebuilt.count(held) == 1


async def test_a_state_held_in_a_rolled_back_transaction_answers_nowhere_else(db: Database) -> None:
    message_id = await streaming_answer(db)
    states = StreamStates()
    async with db.transaction() as tx:
        await emit_held(tx, message_id, [SET, _piece("a")], states=states)
    with pytest.raises(RuntimeError):
        async with db.transaction() as tx:
            await emit_held(tx, message_id, [_piece("LOST")], states=states)
            await emit_held(tx, message_id, [_piece("LOST AGAIN")], states=states)  # from the held state
            raise RuntimeError("the commit failed")
    async with db.transaction() as tx:
        await emit(tx, message_id, [_piece("b")])  # another writer: the same revision the lost write had
    async with db.transaction() as tx:
        _, state, _ = await emit_held(tx, message_id, [_piece("c")], states=states)
    async with db.transaction(read_only=True) as tx:
        stored = await tx.messages.get(message_id)
    assert stored.content["blocks"][0]["text"] == "abc"
    assert state.model is not None and state.model.to_json() == stored.content


class _Tx:
    """Just enough of a transaction for `StreamStates.hold`: its after-commit callbacks and its commit outcome."""

    def __init__(self, *, outcome_unknown: bool = False) -> None:
        self.outcome_unknown = outcome_unknown
        self.callbacks: list[Any] = []

    def after_commit(self, callback: Any) -> None:
        self.callbacks.append(callback)

    def commit(self) -> None:
        for callback in self.callbacks:
            callback()


def test_a_held_state_answers_its_own_transaction_then_everyone_once_surely_committed() -> None:
    states = StreamStates()
    message: Any = type("M", (), {"id": "m", "revision": 3})()
    tx, other = _Tx(), _Tx()
    state = StreamState(stream_id="held")
    states.hold(tx, message, state)  # type: ignore[arg-type]
    assert states.get(message, tx) is state  # type: ignore[arg-type]
    assert states.get(message, other) is None and states.get(message) is None  # type: ignore[arg-type]
    tx.commit()
    assert states.get(message) is state and states.get(message, other) is state  # type: ignore[arg-type]

    unsure = _Tx(outcome_unknown=True)
    later: Any = type("M", (), {"id": "m", "revision": 4})()
    states.hold(unsure, later, StreamState(stream_id="maybe"))  # type: ignore[arg-type]
    unsure.commit()  # the callbacks run, but the COMMIT may not have happened: nothing is promoted
    assert states.get(later) is None


async def test_emits_that_defer_the_content_store_it_once_per_transaction(db: Database) -> None:
    message_id = await streaming_answer(db)
    states = StreamStates()
    async with db.transaction() as tx:
        before = (await tx.messages.get(message_id)).revision
        for batch in ([SET], [_piece("Hel")], [_piece("lo")]):
            head, state, _ = await emit_held(tx, message_id, batch, states=states, store=False)
            assert head.revision == before  # events only, so far
        stored = await store_held(tx, message_id, states)
        assert stored is not None and stored.revision == before + 1  # one content write for the three emits
        assert await store_held(tx, message_id, states) is None  # nothing left to store
        assert (await tx.messages.get(message_id)).content == state.model.to_json()  # type: ignore[union-attr]
    async with db.transaction() as tx:
        _, state, _ = await emit_held(tx, message_id, [_piece("!")], states=states)
    async with db.transaction(read_only=True) as tx:
        row = await tx.messages.get(message_id)
        events = [e.event for e in await tx.message_events.read(message_id)]
    assert row.content["blocks"][0]["text"] == "Hello!" and len(events) == 5  # start + four


async def test_a_state_whose_content_was_not_stored_never_answers_after_its_transaction(db: Database) -> None:
    message_id = await streaming_answer(db)
    states = StreamStates()
    async with db.transaction() as tx:
        await emit_held(tx, message_id, [SET, _piece("a")], states=states)
    async with db.transaction() as tx:
        head = await tx.messages.lock_head(message_id)
        _, state, _ = await emit_held(tx, message_id, [_piece("x")], states=states, store=False)
        assert states.get(head, tx) is state and states.unsaved(message_id, tx) == (state, 3)
    # That transaction committed its event but (a writer bug) not the content: no later transaction trusts the
    # state it held, so the content is rebuilt from what is stored.
    async with db.transaction() as tx:
        head = await tx.messages.lock_head(message_id)
        assert states.get(head, tx) is not state and states.unsaved(message_id, tx) is None


async def test_an_emit_numbers_its_events_from_the_state_it_holds_without_reading_the_last_seq(db: Database) -> None:
    """A state is made for one revision of its message and that message's every event is in it, so once held its
    seq is what the message holds: an emit (held or not) numbers its events from it, with no MAX(seq) read. The
    first emit of a message whose state nobody holds reads it once, to rebuild the state."""
    held, plain = await streaming_answer(db), await streaming_answer(db)
    states = StreamStates()
    for message, write in ((held, "held"), (plain, "plain")):
        for batch in ([SET], [_piece("Hel")], [_piece("lo")]):
            async with db.transaction() as tx:
                statements = record_statements(tx)
                if write == "held":
                    await emit_held(tx, message, batch, states=states)
                else:
                    await emit(tx, message, batch, states=states)
            reads = [s for s in statements if "MAX(seq)" in s]
            assert len(reads) == (1 if batch == [SET] else 0), (write, batch, statements)
    async with db.transaction(read_only=True) as tx:
        for message in (held, plain):
            assert [e.seq for e in await tx.message_events.read(message)] == [1, 2, 3, 4]


def test_committed_states_answer_at_their_revision_only_and_forget_what_is_taken() -> None:
    shared = CommittedStates(limit=2)
    one, two = StreamState(stream_id="one"), StreamState(stream_id="two")
    shared.put("a", 3, one)
    assert shared.get("a", 3) is one and shared.get("a", 4) is None
    assert shared.take("a", 4) is None and len(shared) == 0  # a later write moved the message on: forgotten
    shared.put("a", 3, one)
    assert shared.take("a", 3) is one and shared.take("a", 3) is None
    for index, state in enumerate((one, two, one)):
        shared.put(f"m{index}", 1, state)
    assert shared.get("m0", 1) is None and shared.get("m2", 1) is one and len(shared) == 2  # oldest out
    shared.forget("m2")
    shared.forget("never put")
    assert shared.get("m2", 1) is None and len(shared) == 1
    with pytest.raises(ValueError):
        CommittedStates(limit=0)


async def test_a_writers_committed_state_ends_its_message_without_a_read_back(db: Database) -> None:
    """The process's `CommittedStates` (``bus.states``) hears of every state a writer's cache saw committed; the
    message's end (`finish` with the bus, e.g. a Task's completion) starts from it — no MAX(seq) read, no decode of
    the stored content — and stores what an end rebuilt from the row stores."""
    bus = ConversationBus()
    shared, plain = await streaming_answer(db, bus=bus), await streaming_answer(db, bus=bus)
    states = StreamStates(shared=bus.states)
    for message in (shared, plain):
        for batch in ([SET], [_piece("Hel")], [_piece("lo")]):
            async with db.transaction() as tx:
                await emit_held(tx, message, batch, states=states if message == shared else StreamStates())
    assert bus.states.get(plain, 4) is None  # a writer without ``shared`` tells nobody
    ended = {}
    for message in (shared, plain):
        async with db.transaction() as tx:
            statements = record_statements(tx)
            ended[message] = await finish(tx, message, "completed", bus=bus)
        assert len([s for s in statements if "MAX(seq)" in s]) == (0 if message == shared else 1), statements
    assert len(bus.states) == 0  # the end took it
    async with db.transaction(read_only=True) as tx:
        stored = {m: await tx.messages.get(m) for m in (shared, plain)}
        events = {m: [(e.seq, e.event) for e in await tx.message_events.read(m)] for m in (shared, plain)}
    assert stored[shared].content == stored[plain].content == ended[shared].content
    assert stored[shared].content["blocks"][0]["text"] == "Hello" and stored[shared].status == "completed"
    assert events[shared] == events[plain] and events[shared][-1] == (5, {"op": "end", "seq": 5})


async def test_an_end_after_another_writer_rebuilds_the_state_from_the_row(db: Database) -> None:
    bus = ConversationBus()
    message = await streaming_answer(db, bus=bus)
    states = StreamStates(shared=bus.states)
    async with db.transaction() as tx:
        await emit_held(tx, message, [SET, _piece("a")], states=states)
    async with db.transaction() as tx:
        await emit(tx, message, [_piece("b")])  # not through the cache: the committed state is one revision behind
    async with db.transaction() as tx:
        statements = record_statements(tx)
        ended = await finish(tx, message, "completed", bus=bus)
    assert [s for s in statements if "MAX(seq)" in s]
    assert ended.content["blocks"][0]["text"] == "ab"
