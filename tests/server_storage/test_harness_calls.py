"""Harness calls: identity (owner, effect key), fingerprint conflicts, phases, checkpoints, capacity."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from loopd._infra.clock import VirtualClock
from loopd.server.storage import Conflict, Database, InvalidRecord, NewHarnessCall, NotFound


def call(clock: VirtualClock, key: str = "work/0", owner: str = "uid-1", text: str = "hi") -> NewHarnessCall:
    return NewHarnessCall(owner, key, "builtin", {"text": text}, deadline_at=clock.now() + timedelta(minutes=30))


async def test_the_same_identity_and_parameters_return_the_same_call(db: Database, clock: VirtualClock) -> None:
    async with db.transaction() as tx:
        first, created = await tx.harness_calls.get_or_create(call(clock))
        assert created and (first.phase, first.checkpoint, first.cancel_requested) == ("pending", 0, False)
    await clock.advance(60)
    async with db.transaction() as tx:
        again, created = await tx.harness_calls.get_or_create(call(clock))  # a replay: its deadline is not moved
        assert not created and again == first
        with pytest.raises(Conflict, match="different parameters"):
            await tx.harness_calls.get_or_create(call(clock, text="changed"))
        other_owner, created = await tx.harness_calls.get_or_create(call(clock, owner="uid-2"))
        assert created and other_owner.id != first.id
        assert await tx.harness_calls.find("uid-1", "work/0") == first
        assert [c.id for c in await tx.harness_calls.list_by_owner("uid-1")] == [first.id]


async def test_racing_submissions_create_one_call(db: Database, clock: VirtualClock) -> None:
    async def submit() -> tuple[str, bool]:
        async with db.transaction() as tx:
            found, created = await tx.harness_calls.get_or_create(call(clock))
        return found.id, created

    results = await asyncio.gather(*(submit() for _ in range(6)))
    assert len({call_id for call_id, _ in results}) == 1
    assert sum(created for _, created in results) == 1


async def test_phases_end_at_a_terminal_one(db: Database, clock: VirtualClock) -> None:
    async with db.transaction() as tx:
        created, _ = await tx.harness_calls.get_or_create(call(clock))
        running = await tx.harness_calls.update(created.id, phase="running", execution_ref="exec-1")
        assert (running.phase, running.execution_ref) == ("running", "exec-1")
        assert running == await tx.harness_calls.get(created.id)
        done = await tx.harness_calls.update(created.id, phase="succeeded", result={"text": "ok"})
        assert done.is_terminal and done.result == {"text": "ok"}
        with pytest.raises(Conflict, match="already succeeded"):
            await tx.harness_calls.update(created.id, phase="failed", error={"code": "late"})
        assert (await tx.harness_calls.request_cancel(created.id)).cancel_requested is False
        with pytest.raises(InvalidRecord):
            await tx.harness_calls.update(created.id, phase="exploded")  # type: ignore[arg-type]
        with pytest.raises(NotFound):
            await tx.harness_calls.update("missing", phase="running")


async def test_the_checkpoint_moves_forward_by_compare_and_set(db: Database, clock: VirtualClock) -> None:
    async with db.transaction() as tx:
        created, _ = await tx.harness_calls.get_or_create(call(clock))
        one = await tx.harness_calls.advance_checkpoint(
            created.id, expected_checkpoint=0, checkpoint=1, replay_hash="h1"
        )
        assert (one.checkpoint, one.replay_hash) == (1, "h1")
        assert one == await tx.harness_calls.get(created.id)  # the updated row, as a fresh read returns it
        with pytest.raises(Conflict, match="checkpoint 1"):
            await tx.harness_calls.advance_checkpoint(created.id, expected_checkpoint=0, checkpoint=1, replay_hash="x")
        with pytest.raises(InvalidRecord):
            await tx.harness_calls.advance_checkpoint(created.id, expected_checkpoint=1, checkpoint=1, replay_hash="x")
        cancelled = await tx.harness_calls.request_cancel(created.id)
        assert cancelled.cancel_requested and cancelled.phase == "pending"
        assert cancelled == await tx.harness_calls.get(created.id)


async def test_active_calls_are_counted_for_capacity(db: Database, clock: VirtualClock) -> None:
    async with db.transaction() as tx:
        ids = [(await tx.harness_calls.get_or_create(call(clock, key=f"work/{i}")))[0].id for i in range(4)]
        await tx.harness_calls.update(ids[0], phase="running")
        await tx.harness_calls.update(ids[1], phase="waiting_input")
        await tx.harness_calls.update(ids[2], phase="timed_out")
        assert await tx.harness_calls.count_active() == 3
        assert [c.id for c in await tx.harness_calls.list_active(limit=2)] == [ids[0], ids[1]]
        assert [c.id for c in await tx.harness_calls.list_active(after=ids[1])] == [ids[3]]


async def test_two_calls_never_stream_into_one_message(db: Database, clock: VirtualClock) -> None:
    deadline = clock.now() + timedelta(minutes=30)
    async with db.transaction() as tx:
        await tx.harness_calls.get_or_create(NewHarnessCall("uid-1", "a", "builtin", {}, deadline, message_id="m-1"))
        await tx.harness_calls.get_or_create(NewHarnessCall("uid-1", "b", "builtin", {}, deadline))  # no message: fine
        await tx.harness_calls.get_or_create(NewHarnessCall("uid-1", "c", "builtin", {}, deadline))
    with pytest.raises(Conflict, match="constraint"):
        async with db.transaction() as tx:
            await tx.harness_calls.get_or_create(
                NewHarnessCall("uid-2", "a", "builtin", {}, deadline, message_id="m-1")
            )
    async with db.transaction(read_only=True) as tx:
        assert await tx.harness_calls.find("uid-2", "a") is None
