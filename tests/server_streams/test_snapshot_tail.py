"""A long answer is stored as a snapshot plus a tail of events (`emit_held`), and every read still gives the fold of
every stored event: whichever writers take turns (a held writer storing once per transaction or at each emit, a
plain `emit`, a writer that starts over with a fresh cache, `finish`), the tail stays within its bounds and a new
snapshot is written once it grows past them."""

from __future__ import annotations

import random
from typing import Any

from loopd.agentue import fold
from loopd.server.storage import Database
from loopd.server.streams import (
    BLOCKS_PER_TAIL_EVENT,
    MAX_TAIL,
    StreamStates,
    emit,
    emit_held,
    finish,
    store_held,
)
from tests.server_streams.helpers import streaming_answer


def _block(number: int) -> dict[str, Any]:
    return {"op": "set", "block": {"id": f"b{number}", "type": "text", "text": f"step {number} " + "x" * 40}}


def _grow(number: int) -> dict[str, Any]:
    return {"op": "append", "mask": "block.text", "block": {"id": f"b{number}", "text": "+"}}


async def _check(db: Database, message_id: str) -> int:
    """Every read equals the fold of the stored events, and the tail is within its bounds; returns its length."""
    async with db.transaction(read_only=True) as tx:
        message = await tx.messages.get(message_id)
        head = await tx.messages.lock_head(message_id)
        events: list[dict[str, Any]] = []
        while page := await tx.message_events.read(message_id, after_seq=len(events), limit=1000):
            events += [event.event for event in page]
    folded = fold(events)
    assert folded.model is not None
    assert message.content == folded.model.to_json()
    if head.content_seq is None:
        return 0
    tail = len(events) - head.content_seq
    blocks = len(message.content["blocks"])
    assert 0 < tail <= MAX_TAIL and tail <= max(1, blocks // BLOCKS_PER_TAIL_EVENT) + 32  # one batch past the rule
    return tail


async def test_a_long_answer_keeps_a_bounded_tail_and_reads_whole(db: Database) -> None:
    message_id = await streaming_answer(db)
    states = StreamStates()
    tails: list[int] = []
    for number in range(300):
        async with db.transaction() as tx:
            await emit_held(tx, message_id, [_block(number)], states=states, store=False)
            await emit_held(tx, message_id, [_grow(number)], states=states, store=False)
            await store_held(tx, message_id, states)
        tails.append(await _check(db, message_id))
    assert max(tails) > 300 // BLOCKS_PER_TAIL_EVENT - 10  # a long answer is stored with a tail…
    assert 5 < tails.count(0) < 40  # …most of the time, and a new snapshot is written when it is full
    assert tails[:7] == [0] * 7  # a short answer is stored whole (under 2 × BLOCKS_PER_TAIL_EVENT blocks)
    async with db.transaction() as tx:
        await finish(tx, message_id, "completed")
    assert await _check(db, message_id) == 0  # an ended message has no tail


async def test_writers_taking_turns_always_read_the_fold_of_every_event(db: Database) -> None:
    rng = random.Random(20261202)
    for _ in range(4):
        message_id = await streaming_answer(db)
        states = StreamStates()
        async with db.transaction() as tx:
            await emit_held(tx, message_id, [_block(0)], states=states)
        number = 1
        for _ in range(100):
            action = rng.random()
            async with db.transaction() as tx:
                if action < 0.05:
                    states = StreamStates()  # another drive (a restart, another replica) takes over
                elif action < 0.12:
                    await emit(tx, message_id, [_grow(rng.randrange(number))])  # a writer without a cache
                elif action < 0.5:
                    for _ in range(rng.randint(1, 4)):
                        await emit_held(tx, message_id, [_block(number)], states=states)
                        number += 1
                else:
                    for _ in range(rng.randint(1, 6)):
                        if rng.random() < 0.6:
                            event = _block(number)
                            number += 1
                        else:
                            event = _grow(rng.randrange(number))
                        await emit_held(tx, message_id, [event], states=states, store=False)
                    await store_held(tx, message_id, states)
            await _check(db, message_id)
        async with db.transaction() as tx:
            await finish(tx, message_id, "completed", error={"code": "x", "message": "done"})
        assert await _check(db, message_id) == 0
