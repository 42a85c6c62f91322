"""Two replicas on one database, woken by the notifier instead of polls: a reader on one replica sees the writes
of the other, cancels and released leases reach the replica that must act, call ends reach the other replica's
listeners, and a replica that lost its lease cannot write any more (the fencing token is checked in the write's
transaction) while the replica that took the call over finishes it from the checkpoint.

On SQLite the two engines share one `MemoryNotifier` (two replicas in one process); on PostgreSQL each has its own
`PostgresNotifier` (LISTEN/NOTIFY between them). Every clock here is virtual and never advanced unless a test says
so: no poll, tick or renewal comes due, so whatever happens was woken by a notice.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta

import pytest

from loopd._infra.clock import VirtualClock
from loopd._infra.notify import MemoryNotifier, Notifier, PostgresNotifier
from loopd.server import streams
from loopd.server.engine import CallRequest, Finished, HarnessEngine, TextSet
from loopd.server.engine._engine import CALLS_CHANNEL, EngineNotice
from loopd.server.ledger import Scope, SqlLedgerStore
from loopd.server.storage import Database, DatabaseOptions, NewMessage
from loopd.server.streams import ConversationBus
from tests.support.waiting import eventually

from .conftest import ScriptedAdapter, block, content_of, make_engine, new_conversation, new_response, scripted

NEVER = 3600.0  # a poll interval / wait that no virtual clock here reaches
GUARD = 15.0  # real seconds: bounds a hang (a notice that never came), not a measurement


@dataclass
class Replica:
    db: Database
    bus: ConversationBus
    clock: VirtualClock


Replicas = Callable[..., Awaitable[tuple[Replica, Replica]]]


@pytest.fixture
async def replicas(database_url: str, backend: str) -> AsyncIterator[Replicas]:
    """``await replicas()``: two replicas (database handle, bus on its notifier, frozen clock) on one database.
    ``ahead`` puts the second replica's clock that many seconds ahead (it judges leases by it)."""
    closers: list[Callable[[], Awaitable[None]]] = []

    async def notifier() -> Notifier:
        if backend == "postgres":
            opened = await PostgresNotifier.open(database_url, timeout=10.0)
            closers.append(opened.aclose)
            assert await opened.listening(10.0)
            return opened
        return shared

    async def replica(clock: VirtualClock) -> Replica:
        db = await Database.open(database_url, options=DatabaseOptions(clock=clock, operation_timeout=30.0))
        closers.append(db.aclose)
        return Replica(db, ConversationBus(clock=clock, notifier=await notifier()), clock)

    async def factory(*, ahead: float = 0.0) -> tuple[Replica, Replica]:
        first = VirtualClock()
        return await replica(first), await replica(VirtualClock(wall_start=first.now() + timedelta(seconds=ahead)))

    shared = MemoryNotifier()
    try:
        yield factory
    finally:
        for close in reversed(closers):
            await close()


def _engine(replica: Replica, adapter: ScriptedAdapter, name: str) -> HarnessEngine:
    return make_engine(
        replica.db, {"scripted": adapter}, replica_id=name, bus=replica.bus, clock=replica.clock, poll_interval=NEVER
    )


async def _call(db: Database, engine: HarnessEngine, key: str = "respond") -> tuple[str, str]:
    conversation = await new_conversation(db)
    response = await new_response(db, conversation)
    call = await engine.start(CallRequest("task-uid", key, "scripted", "q", message_id=response, timeout=600))
    return call.id, response


async def _checkpoint(engine: HarnessEngine, call_id: str) -> int:
    return (await engine.get(call_id)).checkpoint


async def test_a_reader_on_one_replica_wakes_when_the_other_commits(replicas: Replicas) -> None:
    a, b = await replicas()
    conversation = await new_conversation(a.db)
    waiter = asyncio.ensure_future(b.bus.wait(conversation, NEVER))  # only a notice ends it: b's clock never moves
    await eventually(lambda: b.bus.watched == 1, timeout=10.0, what="the reader waiting")
    message = NewMessage(
        conversation_id=conversation,
        kind="user",
        key="alice",
        purpose="input",
        content=streams.empty_model(),
        status="completed",
    )
    async with a.db.transaction() as tx:
        await streams.open_message(tx, message, bus=a.bus)
    async with asyncio.timeout(GUARD):
        assert await waiter is True


async def test_a_call_driven_on_one_replica_is_followed_on_the_other(replicas: Replicas) -> None:
    a, b = await replicas()
    adapter = ScriptedAdapter(script=scripted(TextSet("Hel"), TextSet("Hello"), Finished("Hello")))
    driver, follower = _engine(a, adapter, "a"), _engine(b, adapter, "b")
    notices: list[EngineNotice] = []
    follower.add_listener(notices.append)
    async with driver, follower:
        call_id, response = await _call(a.db, driver)
        async with asyncio.timeout(GUARD):
            streamed = [event async for event in follower.stream(call_id)]  # woken on b by a's commits
            ended = await follower.wait(call_id, NEVER)  # woken by the call's end, published on a
        await eventually(lambda: any(n.ended for n in notices), timeout=10.0, what="the end notice on b")
    assert ended.phase == "succeeded"
    async with b.db.transaction(read_only=True) as tx:
        stored = await tx.message_events.read(response)
    assert [(e.seq, e.event) for e in streamed] == [(e.seq, e.event) for e in stored]  # no gap, no duplicate
    assert len(streamed) == 4  # start, Hel, lo, the result
    notice = next(n for n in notices if n.ended)
    assert (notice.call_id, notice.owner_uid, notice.effect_key) == (call_id, "task-uid", "respond")
    assert adapter.starts == [call_id]  # driven on a only


async def test_a_cancel_on_one_replica_stops_the_drive_on_the_other(replicas: Replicas) -> None:
    a, b = await replicas()
    adapter = ScriptedAdapter(script=scripted(TextSet("one"), None, Finished("one")))
    driver, other = _engine(a, adapter, "a"), _engine(b, adapter, "b")
    async with driver, other:
        call_id, _ = await _call(a.db, driver)
        await eventually(lambda: _checkpoint(driver, call_id), timeout=10.0, what="the first update applied")
        await other.cancel(call_id)  # the poke travels to a, whose watcher (no tick ever due) re-reads
        ended = await asyncio.wait_for(other.wait(call_id, NEVER), GUARD)
    assert ended.phase == "cancelled"
    assert adapter.last_run(call_id).cancelled


async def test_leases_released_at_close_are_claimed_by_the_other_replica_at_once(replicas: Replicas) -> None:
    a, b = await replicas()
    adapter = ScriptedAdapter(script=scripted(TextSet("one"), None, Finished("one")))
    leaving, staying = _engine(a, adapter, "a"), _engine(b, adapter, "b")
    async with staying:
        await leaving.open()
        call_id, _ = await _call(a.db, leaving)
        await eventually(lambda: _checkpoint(leaving, call_id), timeout=10.0, what="the first update applied")
        await leaving.aclose()  # releases the lease and says so: b's driver scans now (its poll never comes)
        await eventually(lambda: adapter.resumes == [call_id], timeout=10.0, what="b resuming the call")
        adapter.last_run(call_id).release()
        ended = await asyncio.wait_for(staying.wait(call_id, NEVER), GUARD)
    assert ended.phase == "succeeded" and ended.checkpoint == 2


async def test_a_replica_that_lost_its_lease_cannot_write_and_the_new_holder_finishes(replicas: Replicas) -> None:
    # b's clock runs 31 s ahead: to b, a's 30 s lease has expired, while a (its clock frozen) still thinks it holds
    # it — a replica paused long enough to lose its lease without noticing.
    a, b = await replicas(ahead=31.0)
    adapter = ScriptedAdapter(script=scripted(TextSet("one"), None, TextSet("two"), Finished("two")))
    stale, taker = _engine(a, adapter, "a"), _engine(b, adapter, "b")
    async with stale, taker:
        call_id, response = await _call(a.db, stale)
        await eventually(lambda: _checkpoint(stale, call_id), timeout=10.0, what="a applying the first update")
        b.bus.notifier.publish(CALLS_CHANNEL, '{"k":"wake"}')  # b's driver scans now (its poll never comes)
        await eventually(lambda: adapter.resumes == [call_id], timeout=10.0, what="b taking the call over")
        # a's parked run goes on: its next write must be refused by the token check inside that transaction.
        adapter.runs[call_id][0].release()
        await eventually(lambda: stale.statistics().drives_lost == 1, timeout=10.0, what="a's drive fenced off")
        assert await _checkpoint(taker, call_id) == 1  # nothing of a's second update was written
        assert block(await content_of(b.db, response), "answer") == {"id": "answer", "type": "text", "content": "one"}
        adapter.last_run(call_id).release()  # b's run, resumed from the checkpoint
        ended = await asyncio.wait_for(taker.wait(call_id, NEVER), GUARD)
    assert ended.phase == "succeeded" and ended.checkpoint == 3
    assert adapter.starts == [call_id] and adapter.resumes == [call_id]
    async with b.db.transaction(read_only=True) as tx:
        events = await tx.message_events.read(response)
    answers = [e.event["block"].get("content") for e in events if (e.event.get("block") or {}).get("id") == "answer"]
    assert answers == ["one", "two"]  # each update shown once: a's refused write left nothing behind
    ledger = SqlLedgerStore(b.db)
    assert await ledger.unresolved_attempts(Scope(harness_call_id=call_id)) == []
    assert len(await ledger.find_lanes(Scope(harness_call_id=call_id))) == 1  # one execution for the effect key
