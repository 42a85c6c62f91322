"""Leases and recovery: fencing, replicas that never drive a call twice, resume after a crash, replay checks."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from loopd._infra.clock import VirtualClock
from loopd.server.engine import CallRequest, Finished, HarnessEngine, TextSet, _driver, _driving
from loopd.server.engine._driving import lease_resource
from loopd.server.engine._trail import trail_id
from loopd.server.ledger import Scope, SqlLedgerStore
from loopd.server.storage import Database, HarnessCall
from loopd.server.storage._leases import Leases

from .conftest import (
    OpenDb,
    ScriptedAdapter,
    block,
    content_of,
    make_engine,
    new_conversation,
    new_response,
    scripted,
    until,
    until_done,
    until_phase,
    until_true,
)


async def _call(db: Database, engine: HarnessEngine, key: str = "respond") -> tuple[str, str]:
    conversation = await new_conversation(db)
    response = await new_response(db, conversation)
    call = await engine.start(CallRequest("task-uid", key, "scripted", "q", message_id=response, timeout=600))
    return call.id, response


async def _at(engine: HarnessEngine, call_id: str, checkpoint: int) -> bool:
    return (await engine.get(call_id)).checkpoint >= checkpoint


async def test_a_stale_token_cannot_write(db: Database, clock: VirtualClock) -> None:
    adapter = ScriptedAdapter(script=scripted(TextSet("one"), None, TextSet("two"), Finished("two")))
    engine = make_engine(db, {"scripted": adapter}, clock=clock)
    async with engine:
        call_id, response = await _call(db, engine)
        await until(lambda: _at(engine, call_id, 1))
        await clock.advance(31)  # the lease expires and someone else takes it
        async with db.transaction() as tx:
            # As the clock jumps, the engine may renew the lease or take the expired one again (its wake-ups race
            # the jump): hold the row, end whoever holds it, and take it, all in the intruder's one transaction.
            resource = lease_resource(call_id)
            await tx.fetch_one(f"SELECT token FROM leases WHERE resource = ?{tx.for_update}", (resource,))
            await tx.leases.expire_others("intruder")
            intruder = await tx.leases.acquire(resource, "intruder", 30)
        assert intruder is not None
        adapter.last_run(call_id).release()  # the old holder's next write must be refused
        await until_true(lambda: engine.statistics().drives_lost == 1)
    call = await engine.get(call_id)
    assert call.checkpoint == 1 and call.phase == "running"
    assert block(await content_of(db, response), "answer") == {"id": "answer", "type": "text", "content": "one"}


async def test_two_replicas_never_drive_one_call_twice(open_db: OpenDb) -> None:
    first, second = await open_db(), await open_db()
    adapter = ScriptedAdapter(script=scripted(TextSet("a"), TextSet("ab"), Finished("ab")))
    a = make_engine(first, {"scripted": adapter}, replica_id="a", capacity=4)
    b = make_engine(second, {"scripted": adapter}, replica_id="b", capacity=4)
    calls: list[str] = []
    for index in range(6):
        admitting = a if index % 2 else b
        call_id, _ = await _call(first if index % 2 else second, admitting, key=f"work/{index}")
        calls.append(call_id)
    async with a, b:
        finished = await asyncio.gather(*(a.wait(call_id, 15) for call_id in calls))
    assert [call.phase for call in finished] == ["succeeded"] * 6
    assert sorted(adapter.starts) == sorted(calls)  # each call started exactly once …
    assert adapter.resumes == []
    assert adapter.max_active == 1  # … and never observed twice at the same time
    assert a.statistics().claims + b.statistics().claims >= 6


async def test_the_calls_one_scan_finds_are_claimed_together_within_capacity(
    open_db: OpenDb, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Claimed one by one, each claim waited behind the writes of the drives already running: under a burst, calls
    # began one after another. One transaction takes every lease a scan can, and never more slots than are free.
    claims: list[tuple[object, str]] = []  # (its transaction, the lease)
    acquire = Leases.acquire

    async def recorded(self: Leases, resource: str, holder: str, ttl_seconds: float) -> object:
        claims.append((self._tx, resource))
        return await acquire(self, resource, holder, ttl_seconds)

    monkeypatch.setattr(Leases, "acquire", recorded)
    first, second = await open_db(), await open_db()
    adapter = ScriptedAdapter(script=scripted(TextSet("a"), None, Finished("a")))
    engine = make_engine(first, {"scripted": adapter}, capacity=5)
    elsewhere = make_engine(second, {"scripted": adapter}, replica_id="replica-b")  # admits, never drives
    admitted = [(await _call(first, engine, key=f"here/{index}"))[0] for index in range(3)]
    others = [(await _call(second, elsewhere, key=f"elsewhere/{index}"))[0] for index in range(3)]
    async with engine:
        await until_true(lambda: len(adapter.starts) == 5)
        assert len({id(tx) for tx, _ in claims}) == 1  # one transaction took all five leases
        assert set(admitted) <= set(adapter.starts)  # its own admissions first, then as many as slots are free
        stats = engine.statistics()
        assert (stats.slots_used, stats.capacity, stats.claims) == (5, 5, 5)
        adapter.last_run(adapter.starts[0]).release()  # one ends: its slot goes to the call left waiting
        await until_true(lambda: len(adapter.starts) == 6)
        assert engine.statistics().slots_used == 5
        for call_id in adapter.starts[1:]:
            adapter.last_run(call_id).release()
        finished = await asyncio.gather(*(engine.wait(call_id, 15) for call_id in admitted + others))
    assert [call.phase for call in finished] == ["succeeded"] * 6
    assert sorted(adapter.starts) == sorted(admitted + others)


async def test_a_claim_batch_counts_the_slots_that_are_free_when_it_starts(
    sqlite_db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An admission can take a slot while a batch's leases are being written: the next batch counts what is left
    # then, never what was free when the scan began.
    monkeypatch.setattr(_driver, "CLAIM_BATCH", 2)
    adapter = ScriptedAdapter(script=scripted(TextSet("a"), None, Finished("a")))
    engine = make_engine(sqlite_db, {"scripted": adapter}, capacity=4)
    elsewhere = make_engine(sqlite_db, {"scripted": adapter}, replica_id="replica-b")  # admits, never drives
    for index in range(5):
        await _call(sqlite_db, elsewhere, key=f"elsewhere/{index}")
    acquire = Leases.acquire
    admitted: list[str] = []

    async def admitting(self: Leases, resource: str, holder: str, ttl_seconds: float) -> object:
        if not admitted:
            admitted.append(engine._slots.reserve())  # an admission on this replica, mid-batch
        return await acquire(self, resource, holder, ttl_seconds)

    monkeypatch.setattr(Leases, "acquire", admitting)
    async with engine:
        await until_true(lambda: len(adapter.starts) == 3)  # two in the first batch, one left for the second
        await asyncio.sleep(0.2)  # scans come and go: none claims a fourth while the admission holds its slot
        assert len(adapter.starts) == 3 and engine.statistics().slots_used == 4
        engine._slots.release(admitted[0])
        engine._driver.wake()
        await until_true(lambda: len(adapter.starts) == 4)
        for call_id in adapter.starts:
            adapter.last_run(call_id).release()
        await until_true(lambda: len(adapter.starts) == 5)
        adapter.last_run(adapter.starts[-1]).release()
        await until_true(lambda: engine.statistics().driving == 0)


async def test_a_crashed_replica_is_resumed_elsewhere_and_the_replay_is_deduplicated(
    open_db: OpenDb, clock: VirtualClock
) -> None:
    first, second = await open_db(), await open_db()
    adapter = ScriptedAdapter(script=scripted(TextSet("a"), TextSet("ab"), None, Finished("ab")))
    crashed = make_engine(first, {"scripted": adapter}, replica_id="a", clock=clock)
    await crashed.open()
    call_id, response = await _call(first, crashed)
    await until(lambda: _at(crashed, call_id, 2))
    await crashed.abort()  # like a crash: no lease released, nothing written on the way out

    survivor = make_engine(second, {"scripted": adapter}, replica_id="b", clock=clock)
    async with survivor:
        await clock.advance(29)
        assert adapter.resumes == []  # the lease is still live: nobody may touch the call
        await clock.advance(2)
        await until_true(lambda: adapter.resumes == [call_id] and len(adapter.runs[call_id]) == 2)
        adapter.last_run(call_id).release()
        call = await until_done(survivor, call_id, timeout=10)
    assert call.phase == "succeeded" and call.checkpoint == 3
    assert adapter.starts == [call_id]
    async with second.transaction(read_only=True) as tx:
        events = await tx.message_events.read(response)
    ops = [e.event.get("op") for e in events]
    assert ops == ["start", "set", "append", "set"]  # a, then b (no repeats), result
    store = SqlLedgerStore(second)
    assert await store.unresolved_attempts(Scope(harness_call_id=call_id)) == []  # settled by the survivor
    view = await survivor.trail(call_id)
    interrupted = [e for e in view.events if e.event_type == "attempt.failed"]
    assert [e.payload["reason"] for e in interrupted] == ["interrupted"]  # the crashed drive's attempt
    assert interrupted[0].payload["usage"] is None  # nothing shown past the checkpoint: nothing to estimate from
    lanes = await store.find_lanes(Scope(harness_call_id=call_id))
    assert len(lanes) == 1


async def _crash_after(engine: HarnessEngine, call_id: str, checkpoint: int) -> None:
    await until(lambda: _at(engine, call_id, checkpoint))
    await engine.abort()


async def test_a_replay_that_differs_fails_the_call(sqlite_db: Database, clock: VirtualClock) -> None:
    runs = 0

    def script(_call_id: str) -> list[TextSet | Finished | None]:
        nonlocal runs
        runs += 1
        first = "a" if runs == 1 else "something else"
        return [TextSet(first), TextSet("ab"), None, Finished("ab")]

    adapter = ScriptedAdapter(script=script)
    crashed = make_engine(sqlite_db, {"scripted": adapter}, clock=clock, replica_id="a")
    await crashed.open()
    call_id, _ = await _call(sqlite_db, crashed)
    await _crash_after(crashed, call_id, 2)
    await clock.advance(31)
    async with make_engine(sqlite_db, {"scripted": adapter}, clock=clock, replica_id="b") as survivor:
        call = await until_phase(survivor, call_id, "failed")
    assert call.error is not None and call.error["code"] == "replay_differs"


async def test_an_adapter_that_cannot_resume_leaves_the_outcome_unknown(
    sqlite_db: Database, clock: VirtualClock
) -> None:
    adapter = ScriptedAdapter(script=scripted(TextSet("a"), None, Finished("a")), supports_resume=False)
    crashed = make_engine(sqlite_db, {"scripted": adapter}, clock=clock, replica_id="a")
    await crashed.open()
    call_id, _ = await _call(sqlite_db, crashed)
    await _crash_after(crashed, call_id, 1)
    await clock.advance(31)
    async with make_engine(sqlite_db, {"scripted": adapter}, clock=clock, replica_id="b") as survivor:
        call = await until_phase(survivor, call_id, "unknown")
    assert call.error is not None and call.error["code"] == "resume_unsupported"
    assert adapter.starts == [call_id] and adapter.resumes == []


async def test_the_transaction_that_ends_a_call_gives_its_lease_up(
    db: Database, clock: VirtualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No transaction of its own to release the lease after the end: the end releases it, and the driver does not
    try again; the watcher seeing the call ended (its own end) still makes the outcome ``done``."""
    released_by: list[str] = []
    driver_releases: list[str] = []
    release, driver_release = Leases.release, _driver.CallDriver.release

    async def recorded(self: Leases, resource: str, token: int) -> bool:
        ended = await self._tx.fetch_one("SELECT phase FROM harness_calls WHERE id = ?", (resource.split("/")[-1],))
        released_by.append(str(ended[0]) if ended else "?")
        return await release(self, resource, token)

    async def by_driver(self: _driver.CallDriver, call_id: str, token: int) -> None:
        driver_releases.append(call_id)
        await driver_release(self, call_id, token)

    monkeypatch.setattr(Leases, "release", recorded)
    monkeypatch.setattr(_driver.CallDriver, "release", by_driver)
    adapter = ScriptedAdapter(script=scripted(TextSet("one"), Finished("one")))
    engine = make_engine(db, {"scripted": adapter}, clock=clock)
    notices: list[tuple[str, bool]] = []
    engine.add_listener(lambda notice: notices.append((notice.call_id, notice.ended)))
    async with engine:
        call_id, _ = await _call(db, engine)
        assert (await until_done(engine, call_id)).phase == "succeeded"
        await until_true(lambda: (call_id, True) in notices)
        async with db.transaction(read_only=True) as tx:
            lease = await tx.leases.get(lease_resource(call_id))
    assert lease is not None and lease.holder == ""
    assert released_by == ["succeeded"]  # in the transaction that ended it, after the end
    assert driver_releases == []
    assert engine.statistics().drives_lost == 0


async def test_a_freed_slot_scans_again_only_while_a_call_waits_for_one(
    sqlite_db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Calls this engine admitted run without scans, and their ends scan nothing; a call the last scan left for
    want of a slot is claimed as soon as a drive ends (not at the next poll, an hour away here)."""
    scans: list[int] = []
    active = _driver.CallDriver._active

    async def counted(self: _driver.CallDriver) -> list[HarnessCall]:
        found = await active(self)
        scans.append(len(found))
        return found

    monkeypatch.setattr(_driver.CallDriver, "_active", counted)
    adapter = ScriptedAdapter(script=scripted(TextSet("a"), None, Finished("a")))
    idle = make_engine(sqlite_db, {"scripted": adapter}, replica_id="replica-b", capacity=5)  # admits, never drives
    waiting = [(await _call(sqlite_db, idle, key=f"waiting/{index}"))[0] for index in range(2)]
    engine = make_engine(sqlite_db, {"scripted": adapter}, capacity=1, poll_interval=3600.0)
    async with engine:
        await until_true(lambda: len(adapter.starts) == 1)  # the first scan: one slot, two calls
        before = len(scans)
        adapter.last_run(adapter.starts[0]).release()
        await until_true(lambda: len(adapter.starts) == 2)  # the drive's end scanned and claimed the other
        assert len(scans) > before
        adapter.last_run(adapter.starts[1]).release()
        done = await asyncio.gather(*(engine.wait(call_id, 15) for call_id in waiting))
        assert [call.phase for call in done] == ["succeeded"] * 2
        await until_true(lambda: engine.statistics().slots_used == 0)
        settled = len(scans)
        own, _ = await _call(sqlite_db, engine, key="own")  # admitted here: driven at once
        await until_true(lambda: own in adapter.starts)
        adapter.last_run(own).release()
        assert (await engine.wait(own, 15)).phase == "succeeded"
        await asyncio.sleep(0.1)
        assert len(scans) == settled  # nothing waited for a slot: the ends scanned nothing


async def test_a_call_begun_under_uuid5_trail_ids_is_resumed_on_its_own_lane(
    open_db: OpenDb, clock: VirtualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server from before ordered trail ids began the call (its lane, turn, attempts under uuid5 ids) and crashed;
    this one resumes it on that lane — no second lane for the call — while a call it begins itself gets ordered ids."""
    first, second = await open_db(), await open_db()
    adapter = ScriptedAdapter(script=scripted(TextSet("a"), TextSet("ab"), None, Finished("ab")))

    async def older(tx: object, call: object) -> bool:
        return False

    monkeypatch.setattr(_driving, "trail_ordering", older)
    crashed = make_engine(first, {"scripted": adapter}, replica_id="a", clock=clock)
    await crashed.open()
    call_id, _ = await _call(first, crashed)
    await until(lambda: _at(crashed, call_id, 2))
    await crashed.abort()
    monkeypatch.undo()

    survivor = make_engine(second, {"scripted": adapter}, replica_id="b", clock=clock)
    async with survivor:
        await clock.advance(31)
        await until_true(lambda: adapter.resumes == [call_id] and len(adapter.runs[call_id]) == 2)
        adapter.last_run(call_id).release()
        assert (await until_done(survivor, call_id, timeout=10)).phase == "succeeded"
        fresh, _ = await _call(second, survivor, key="again")
        await until_true(lambda: fresh in adapter.runs)
        adapter.last_run(fresh).release()
        assert (await until_done(survivor, fresh, timeout=10)).phase == "succeeded"
    store = SqlLedgerStore(second)
    lanes = await store.find_lanes(Scope(harness_call_id=call_id))
    assert [lane.id for lane in lanes] == [trail_id(call_id, "lane", ordered=False)]
    view = await survivor.trail(call_id)
    assert [e.event_type for e in view.events][-1] == "run.completed"  # ended on the lane it began on
    assert {e.lane_id for e in view.events} == {lanes[0].id}
    [fresh_lane] = await store.find_lanes(Scope(harness_call_id=fresh))
    assert fresh_lane.id == trail_id(fresh, "lane") and uuid.UUID(fresh_lane.id).version == 8
