"""Admission: a call's durable identity, parameter conflicts, bounded capacity, and bad requests."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from loopd.server.engine import CallRequest, CapacityExceeded, Finished, HistoryEntry, TextSet, UnknownTarget, _driver
from loopd.server.engine._driving import lease_resource
from loopd.server.storage import Conflict, Database, HarnessCall, InvalidRecord, NotFound
from loopd.server.storage._harness_calls import HarnessCalls
from loopd.server.streams import finish

from .conftest import ScriptedAdapter, make_engine, new_conversation, new_response, scripted, until_done


def request(
    conversation_id: str, *, key: str = "work/1", text: str = "hi", timeout: float = 60, **options: object
) -> CallRequest:
    return CallRequest(
        owner_uid="uid-1",
        effect_key=key,
        target="scripted",
        text=text,
        conversation_id=conversation_id,
        asker="user:alice",
        timeout=timeout,
        **options,  # type: ignore[arg-type]
    )


async def messages_in(db: Database, conversation_id: str) -> int:
    async with db.transaction(read_only=True) as tx:
        return len(await tx.messages.list_conversation(conversation_id))


async def test_same_identity_and_parameters_is_the_same_call(db: Database) -> None:
    engine = make_engine(db, {"scripted": ScriptedAdapter()})
    conversation = await new_conversation(db)
    first = await engine.start(request(conversation, history=(HistoryEntry("user", "alice", "before"),)))
    again = await engine.start(request(conversation, history=(HistoryEntry("user", "alice", "before"),)))
    assert again.id == first.id
    assert again.deadline_at == first.deadline_at
    assert first.phase == "pending" and first.message_id is not None
    assert await messages_in(db, conversation) == 1  # the replay opened no second output message
    async with db.transaction(read_only=True) as tx:
        output = await tx.messages.get(first.message_id)
    assert (output.kind, output.key, output.purpose, output.status) == ("harness", "scripted", "output", "streaming")


async def test_changed_parameters_conflict(db: Database) -> None:
    engine = make_engine(db, {"scripted": ScriptedAdapter()})
    conversation = await new_conversation(db)
    await engine.start(request(conversation))
    with pytest.raises(Conflict, match="different parameters"):
        await engine.start(request(conversation, text="something else"))
    with pytest.raises(Conflict):
        await engine.start(request(conversation, timeout=61))


async def test_capacity_full_creates_nothing_and_a_replay_still_works(db: Database) -> None:
    engine = make_engine(db, {"scripted": ScriptedAdapter()}, capacity=1)
    conversation = await new_conversation(db)
    held = await engine.start(request(conversation, key="work/1"))
    async with db.transaction(read_only=True) as tx:
        cursor_before = await tx.message_events.last_cursor(conversation)

    with pytest.raises(CapacityExceeded) as refused:
        await engine.start(request(conversation, key="work/2"))
    assert refused.value.type == "too_many_requests" and refused.value.retryable

    async with db.transaction(read_only=True) as tx:
        assert await tx.harness_calls.find("uid-1", "work/2") is None
        assert await tx.message_events.last_cursor(conversation) == cursor_before
    assert await messages_in(db, conversation) == 1
    replay = await engine.start(request(conversation, key="work/1"))  # an idempotent replay takes no slot
    assert replay.id == held.id
    assert engine.statistics().slots_used == 1


async def test_a_full_engine_refuses_without_a_write_transaction(db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    # Under a burst, responders that saw a free slot a moment ago reach a full engine: each refusal used to take
    # the write lock (queued behind every drive's writes) only to roll back. A read tells a replay from a new call.
    engine = make_engine(db, {"scripted": ScriptedAdapter()}, capacity=1)
    conversation = await new_conversation(db)
    held = await engine.start(request(conversation, key="work/1"))
    opened: list[bool] = []  # read_only of each transaction opened from here on
    transaction = db.transaction

    def recorded(*, read_only: bool = False) -> Any:
        opened.append(read_only)
        return transaction(read_only=read_only)

    monkeypatch.setattr(db, "transaction", recorded)
    with pytest.raises(CapacityExceeded):
        await engine.start(request(conversation, key="work/2"))
    with pytest.raises(UnknownTarget):  # what a new call would be refused for anyway is said first, as before
        await engine.start(dataclasses.replace(request(conversation, key="work/3"), target="nobody"))
    assert (await engine.start(request(conversation, key="work/1"))).id == held.id  # a replay still gets its call
    with pytest.raises(Conflict):
        await engine.start(request(conversation, key="work/1", timeout=61))
    assert opened and all(opened)  # reads only


async def test_concurrent_admission_never_exceeds_capacity(db: Database) -> None:
    import asyncio

    engine = make_engine(db, {"scripted": ScriptedAdapter()}, capacity=3)
    conversation = await new_conversation(db)
    outcomes = await asyncio.gather(
        *(engine.start(request(conversation, key=f"work/{i}")) for i in range(8)), return_exceptions=True
    )
    admitted = [o for o in outcomes if not isinstance(o, BaseException)]
    refused = [o for o in outcomes if isinstance(o, CapacityExceeded)]
    assert len(admitted) == 3 and len(refused) == 5
    assert await messages_in(db, conversation) == 3


async def test_a_call_into_a_given_message(db: Database) -> None:
    engine = make_engine(db, {"scripted": ScriptedAdapter()})
    conversation = await new_conversation(db)
    response = await new_response(db, conversation)
    call = await engine.start(
        CallRequest(owner_uid="task-uid", effect_key="respond", target="scripted", text="q", message_id=response)
    )
    assert (call.message_id, call.conversation_id) == (response, conversation)
    with pytest.raises(NotFound):
        await engine.start(
            CallRequest(owner_uid="task-uid", effect_key="other", target="scripted", text="q", message_id="nope")
        )


@pytest.mark.parametrize("timeout", [0, -1, math.inf, math.nan, 10**9])
async def test_the_timeout_must_be_finite_and_positive(db: Database, timeout: float) -> None:
    engine = make_engine(db, {"scripted": ScriptedAdapter()})
    conversation = await new_conversation(db)
    with pytest.raises(InvalidRecord, match="timeout"):
        await engine.start(request(conversation, timeout=timeout))


async def test_unknown_target_and_missing_destination_are_refused(db: Database) -> None:
    engine = make_engine(db, {"scripted": ScriptedAdapter()})
    conversation = await new_conversation(db)
    with pytest.raises(UnknownTarget) as unknown:
        await engine.start(CallRequest("uid", "k", "nowhere", "hi", conversation_id=conversation))
    assert unknown.value.type == "invalid_request"
    with pytest.raises(InvalidRecord, match="message_id"):
        await engine.start(CallRequest("uid", "k", "scripted", "hi"))
    with pytest.raises(InvalidRecord, match="text"):
        await engine.start(CallRequest("uid", "k", "scripted", "  ", conversation_id=conversation))


async def test_a_call_admitted_while_the_engine_runs_is_begun_by_its_admission(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The admitting transaction takes the lease and records the start: the drive runs at once, with no scan
    claiming it and no transaction of its own to begin. An engine not yet driving admits a pending call, which
    its driver claims once it runs."""
    claimed: list[str] = []
    claim = _driver.CallDriver._claim

    async def recorded(self: _driver.CallDriver, batch: list[tuple[HarnessCall, bool]]) -> None:
        claimed.extend(call.id for call, _ in batch)
        await claim(self, batch)

    monkeypatch.setattr(_driver.CallDriver, "_claim", recorded)
    adapter = ScriptedAdapter(script=scripted(TextSet("one"), Finished("one")))
    async with make_engine(db, {"scripted": adapter}) as engine:
        conversation = await new_conversation(db)
        call = await engine.start(request(conversation))
        assert call.phase == "starting"  # begun in the admission's transaction
        async with db.transaction(read_only=True) as tx:
            lease = await tx.leases.get(lease_resource(call.id))
        assert lease is not None and lease.holder == engine.replica_id
        assert (await until_done(engine, call.id)).phase == "succeeded"
        assert claimed == [] and adapter.starts == [call.id]
        assert engine.statistics().claims == 1
    idle = make_engine(db, {"scripted": ScriptedAdapter(script=scripted(Finished("two")))})
    later = await idle.start(request(await new_conversation(db), key="work/2"))
    assert later.phase == "pending"
    async with idle:
        assert (await until_done(idle, later.id)).phase == "succeeded"
    assert claimed == [later.id]


async def test_a_call_into_a_given_message_is_not_looked_for_first_yet_every_replay_finds_it(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    conversation = await new_conversation(db)
    response = await new_response(db, conversation)
    ask = CallRequest(owner_uid="task-uid", effect_key="respond", target="scripted", text="q", message_id=response)
    looked_for: list[str] = []
    find = HarnessCalls.find

    async def counted(self: HarnessCalls, owner_uid: str, effect_key: str) -> HarnessCall | None:
        looked_for.append(effect_key)
        return await find(self, owner_uid, effect_key)

    monkeypatch.setattr(HarnessCalls, "find", counted)
    adapter = ScriptedAdapter(script=scripted(TextSet("one"), Finished("one")))
    async with make_engine(db, {"scripted": adapter}) as engine:
        call = await engine.start(ask)
        assert looked_for == []  # a new call: its insert alone admits it
        assert (await engine.start(ask)).id == call.id  # a replay while the message streams: the insert finds it
        with pytest.raises(Conflict, match="different parameters"):
            await engine.start(dataclasses.replace(ask, text="something else"))
        assert (await until_done(engine, call.id)).phase == "succeeded"
        async with db.transaction() as tx:  # its Task's responder ends the answer once the call has
            assert (await finish(tx, response, "completed")).status == "completed"
        # The message has ended, so a new call into it is refused — but a replay of the stored one still gets it,
        # and so does one on a replica that no longer runs its target.
        assert (await engine.start(ask)).id == call.id
        with pytest.raises(Conflict, match="streaming message"):
            await engine.start(dataclasses.replace(ask, effect_key="again"))
    elsewhere = make_engine(db, {"other": ScriptedAdapter()}, replica_id="replica-b")
    assert (await elsewhere.start(ask)).id == call.id
    with pytest.raises(UnknownTarget):
        await elsewhere.start(dataclasses.replace(ask, effect_key="again"))
