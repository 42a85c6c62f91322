"""The bus learns from the commits it is handed which answers show nothing yet (`FirstOutputs`): a writer that has
just shown an answer's first text lets those go first, for a bounded time, before it writes the rest."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from loopd._infra.clock import VirtualClock
from loopd._infra.ids import new_id
from loopd.server.storage import Database, MessagePurpose, open_database
from loopd.server.streams import ConversationBus, StreamStates, emit, finish, locked_state, state_of
from loopd.server.streams._bus import FIRST_OUTPUT_HORIZON, FIRST_OUTPUT_YIELD, FirstOutputs
from tests.server_storage.helpers import record_statements

from .helpers import streaming_answer


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[Database]:
    async with open_database(tmp_path / "loopd.db") as database:
        yield database


async def _open(db: Database, bus: ConversationBus, purpose: MessagePurpose = "response") -> str:
    return await streaming_answer(db, bus=bus, purpose=purpose, task_id=f"t-{purpose}-{new_id()}")


async def _say(db: Database, bus: ConversationBus, message_id: str, text: str) -> None:
    async with db.transaction() as tx:
        await emit(tx, message_id, [{"op": "set", "block": {"id": "a", "type": "text", "content": text}}], bus=bus)


async def test_a_started_answer_is_blank_until_it_shows_something(db: Database) -> None:
    bus = ConversationBus()
    first, second = await _open(db, bus), await _open(db, bus)
    blank = bus.first_outputs
    assert len(blank) == 2
    assert blank.others_blank(first) and blank.others_blank(second)
    await _say(db, bus, first, "hel")
    assert len(blank) == 1
    assert blank.others_blank(first) and not blank.others_blank(second)
    async with db.transaction() as tx:  # an end shows something too (an answer that fails before any text)
        await finish(tx, second, "failed", error={"code": "x", "message": "x"}, bus=bus)
    assert len(blank) == 0 and not blank.others_blank(first)


async def test_only_responses_count(db: Database) -> None:
    bus = ConversationBus()
    await _open(db, bus, purpose="input")
    await _open(db, bus, purpose="output")
    assert len(bus.first_outputs) == 0


async def test_a_yield_ends_when_no_answer_is_blank_or_after_its_bound() -> None:
    clock = VirtualClock()
    blank = FirstOutputs(clock)
    blank.started("a")
    blank.started("b")
    waiter = asyncio.ensure_future(blank.yield_to_blank())
    await clock.advance(FIRST_OUTPUT_YIELD / 2)
    assert not waiter.done()
    blank.shown("a")
    await clock.advance(0)
    assert not waiter.done()
    blank.shown("b")
    await clock.advance(0)
    assert waiter.done() and clock.monotonic() == FIRST_OUTPUT_YIELD / 2

    blank.started("c")  # never shows anything here (another replica writes it): the yield is bounded
    start = clock.monotonic()
    waiter = asyncio.ensure_future(blank.yield_to_blank())
    await clock.run_until(waiter.done)
    assert clock.monotonic() - start == pytest.approx(FIRST_OUTPUT_YIELD)


async def test_a_yield_covers_a_burst_of_a_hundred_chats() -> None:
    """Under a burst of 100 chats the last answers show their first text ≈ 400 ms after the first ones (≈ 4 ms of
    event-loop time each: the question, the start, the model's stream, the first write). A yield shorter than
    that ends while they are still blank, and the writers that stop yielding then compete with them again (with
    200 ms the burst's TTFT p95 was 628 ms against 513 ms with 500 ms, side by side: `benchmarks._chats_ab`)."""
    clock = VirtualClock()
    blank = FirstOutputs(clock)
    for index in range(100):
        blank.started(f"m{index}")
    blank.shown("m0")
    waiter = asyncio.ensure_future(blank.yield_to_blank())
    for index in range(1, 100):
        await clock.advance(0.004)
        assert not waiter.done()
        blank.shown(f"m{index}")
    await clock.advance(0)
    assert waiter.done() and clock.monotonic() == pytest.approx(0.396)


async def test_an_answer_blank_past_the_horizon_is_forgotten() -> None:
    clock = VirtualClock()
    blank = FirstOutputs(clock)
    blank.started("elsewhere")
    await clock.advance(FIRST_OUTPUT_HORIZON + 1)
    blank.started("here")
    assert len(blank) == 1 and not blank.others_blank("here")
    await clock.advance(FIRST_OUTPUT_HORIZON + 1)
    assert len(blank) == 0
    await asyncio.wait_for(blank.yield_to_blank(), 1)  # nothing blank: no wait at all


async def test_a_blank_answer_s_first_writer_starts_from_its_opening_without_reading_it(db: Database) -> None:
    """A writer's first lock of an answer this process opened takes the state its opening commit left (the same
    content and seq a read gives) instead of reading the row and its last seq; once the answer was written (its
    revision moved) or shows something, it is read as usual."""
    bus = ConversationBus()
    answer = await _open(db, bus)
    async with db.transaction() as tx:
        statements = record_statements(tx)
        head, state = await locked_state(tx, answer, StreamStates(seed=bus.first_outputs.opened_state))
        made = list(statements)
        assert state == await state_of(tx, await tx.messages.get(answer)) and state.seq == 1
    assert made == [s for s in made if s.startswith("SELECT id, conversation_id, status, revision")]  # the head only
    assert bus.first_outputs.opened_state(answer, head.revision + 1) is None  # another revision: not known
    await _say(db, bus, answer, "hel")
    assert bus.first_outputs.opened_state(answer, head.revision) is None  # shown: forgotten
    async with db.transaction() as tx:
        statements = record_statements(tx)
        _, state = await locked_state(tx, answer, StreamStates(seed=bus.first_outputs.opened_state))
    assert state.model is not None and state.seq == 2 and [s for s in statements if "MAX(seq)" in s]
