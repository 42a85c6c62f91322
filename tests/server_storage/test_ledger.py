"""The ledger contract on every store (memory, SQLite, PostgreSQL): entities, append, queries, checkpoints."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from loopd.server.ledger import (
    Action,
    ActionType,
    Actor,
    ArtifactRef,
    Attempt,
    Checkpoint,
    CheckpointAnchor,
    EffectKind,
    EventType,
    Idempotency,
    IdempotencyViolation,
    Lane,
    LaneConflict,
    LaneRecorder,
    LedgerStore,
    NewEvent,
    RevisionConflict,
    Scope,
    SqlLedgerStore,
    SubjectKind,
    Turn,
    Usage,
    completed,
    failed,
    requested,
    subject_kind,
)
from loopd.server.ledger._rules import check_batch
from loopd.server.storage import Conflict, Database, InvalidRecord, NotFound


@dataclass
class World:
    actor: Actor
    lane: Lane
    turn: Turn
    action: Action


async def world(ledger: LedgerStore, *, run_id: str = "run-1", name: str = "main", **lane: str) -> World:
    actor = await ledger.ensure_actor(Actor(type="harness", key="builtin", framework="loopd"))
    created = await ledger.create_lane(Lane(session_id="s1", run_id=run_id, name=name, **lane))  # type: ignore[arg-type]
    turn = await ledger.create_turn(Turn(lane_id=created.id))
    action = await ledger.create_action(
        Action(turn.id, ActionType.MODEL_CALL, effect_kind=EffectKind.READ, idempotency=Idempotency.INHERENT)
    )
    return World(actor, created, turn, action)


def started(w: World) -> NewEvent:
    return NewEvent(EventType.TURN_STARTED, w.turn.id, w.actor.id, payload={"input": "hi"})


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("attempt.requested", True),
        ("lane.framework.snapshot.saved", True),
        ("run.acme.paused", True),
        ("attempt.retried", False),  # two segments are core only
        ("widget.started", False),
        ("attempt", False),
        ("Attempt.Requested", False),
        ("attempt..x", False),
    ],
)
def test_event_names_start_with_their_subject_kind(name: str, ok: bool) -> None:
    if ok:
        assert subject_kind(name).value == name.split(".")[0]
    else:
        with pytest.raises(InvalidRecord):
            subject_kind(name)


async def test_actors_are_immutable_and_keys_name_one_actor(ledger: LedgerStore) -> None:
    model = await ledger.create_actor(Actor(type="model", key="gpt", attributes={"provider": "x"}))
    assert model.created_at is not None
    assert await ledger.create_actor(dataclasses.replace(model, created_at=None)) == model  # same id, same fields
    assert await ledger.ensure_actor(Actor(type="model", key="gpt", attributes={"provider": "x"})) == model
    assert await ledger.get_actor_by_key("gpt") == model and await ledger.get_actor(model.id) == model
    with pytest.raises(Conflict):
        await ledger.ensure_actor(Actor(type="model", key="gpt", attributes={"provider": "y"}))
    with pytest.raises(Conflict):
        await ledger.create_actor(dataclasses.replace(model, type="tool"))
    with pytest.raises(Conflict):
        await ledger.create_actor(Actor(type="tool", key="gpt"))
    assert await ledger.get_actor_by_key("nobody") is None


async def test_ownership_is_fixed_at_creation(ledger: LedgerStore) -> None:
    w = await world(ledger)
    assert await ledger.create_lane(dataclasses.replace(w.lane, last_seq=0, created_at=None)) == w.lane
    # what a create returned (the inserted row) is what reading the stored one returns
    assert await ledger.ensure_actor(Actor(type="harness", key="builtin", framework="loopd")) == w.actor
    assert await ledger.get_actor(w.actor.id) == w.actor
    assert await ledger.create_turn(dataclasses.replace(w.turn, created_at=None)) == w.turn
    assert await ledger.create_action(dataclasses.replace(w.action, lane_id=None, created_at=None)) == w.action
    attempt = await ledger.create_attempt(Attempt(w.action.id))
    assert await ledger.get_attempt(attempt.id) == attempt and attempt.attempt_no == 1
    with pytest.raises(Conflict):
        await ledger.create_lane(Lane(session_id="s1", run_id="run-1", name="main"))  # name taken
    with pytest.raises(Conflict):
        await ledger.create_lane(dataclasses.replace(w.lane, task_id="t9"))
    other = await ledger.create_lane(Lane(session_id="s1", run_id="run-1", name="side", parent_lane_id=w.lane.id))
    with pytest.raises(Conflict):
        await ledger.create_turn(dataclasses.replace(w.turn, lane_id=other.id))
    with pytest.raises(NotFound):
        await ledger.create_turn(Turn(lane_id="missing"))
    with pytest.raises(NotFound):
        await ledger.create_action(Action("missing", ActionType.TOOL_CALL))
    with pytest.raises(InvalidRecord):
        await ledger.create_action(Action(w.turn.id, "teleport"))  # type: ignore[arg-type]
    assert w.action.lane_id == w.lane.id and w.action.effect_kind is EffectKind.READ
    assert await ledger.find_lane("s1", "run-1", "side") == other


async def test_attempt_numbers_are_unique_per_action(ledger: LedgerStore) -> None:
    w = await world(ledger)
    one = await ledger.create_attempt(Attempt(w.action.id))
    two = await ledger.create_attempt(Attempt(w.action.id))
    assert (one.attempt_no, two.attempt_no, two.lane_id) == (1, 2, w.lane.id)
    assert await ledger.create_attempt(Attempt(w.action.id, id=one.id)) == one  # a retry of the create
    with pytest.raises(Conflict):
        await ledger.create_attempt(Attempt(w.action.id, attempt_no=2))
    with pytest.raises(InvalidRecord):
        await ledger.create_attempt(Attempt(w.action.id, attempt_no=0))
    assert await ledger.get_attempt(two.id) == two


async def test_append_is_idempotent_by_append_id(ledger: LedgerStore) -> None:
    w = await world(ledger)
    events = [started(w), NewEvent(EventType.ACTION_STARTED, w.action.id, w.actor.id)]
    receipt = await ledger.append(w.lane.id, 0, "append-1", events)
    assert (receipt.first_seq, receipt.last_seq, receipt.event_ids) == (1, 2, tuple(e.id for e in events))
    assert receipt.digest.startswith("sha256:")
    await ledger.append(w.lane.id, 2, "append-2", [NewEvent(EventType.ACTION_COMPLETED, w.action.id, w.actor.id)])
    rebuilt = [dataclasses.replace(e, payload=dict(e.payload)) for e in events]  # equal content, new objects
    assert await ledger.append(w.lane.id, 0, "append-1", rebuilt) == receipt  # stale seq, but a replay
    with pytest.raises(IdempotencyViolation):
        await ledger.append(w.lane.id, 3, "append-1", [dataclasses.replace(events[0], payload={"input": "bye"})])
    other = await ledger.create_lane(Lane(session_id="s1", run_id="run-1", name="other"))
    with pytest.raises(IdempotencyViolation):
        await ledger.append(other.id, 0, "append-1", events)
    stored = await ledger.load_lane(w.lane.id)
    assert [(e.seq, e.append_id) for e in stored] == [(1, "append-1"), (2, "append-1"), (3, "append-2")]
    assert stored[0].payload == {"input": "hi"} and stored[0].occurred_at == events[0].occurred_at
    assert [e.seq for e in await ledger.load_lane(w.lane.id, after_seq=2)] == [3]
    assert (await ledger.get_lane(w.lane.id)).last_seq == 3


async def test_a_stale_expected_seq_is_a_lane_conflict(ledger: LedgerStore) -> None:
    w = await world(ledger)
    await ledger.append(w.lane.id, 0, "a1", [started(w)])
    with pytest.raises(LaneConflict) as conflict:
        await ledger.append(w.lane.id, 0, "a2", [NewEvent(EventType.ACTION_STARTED, w.action.id, w.actor.id)])
    assert (conflict.value.expected, conflict.value.actual) == (0, 1)
    with pytest.raises(NotFound):
        await ledger.append("missing", 0, "a3", [started(w)])


async def test_a_batch_with_one_bad_event_writes_nothing(ledger: LedgerStore) -> None:
    w = await world(ledger)
    attempt = await ledger.create_attempt(Attempt(w.action.id))
    other = await world(ledger, name="other")
    foreign_turn = other.turn.id
    bad_batches: list[tuple[type[Exception], NewEvent]] = [
        (InvalidRecord, NewEvent("attempt.retried", attempt.id, w.actor.id)),
        (NotFound, NewEvent(EventType.ATTEMPT_REQUESTED, w.turn.id, w.actor.id)),  # a turn is not an attempt
        (InvalidRecord, NewEvent(EventType.TURN_STARTED, foreign_turn, w.actor.id)),  # another lane's turn
        (InvalidRecord, NewEvent(EventType.RUN_STARTED, "run-2", w.actor.id)),
        (InvalidRecord, NewEvent(EventType.SESSION_STARTED, "s2", w.actor.id)),
        (NotFound, NewEvent(EventType.TURN_STARTED, w.turn.id, "nobody")),
        (NotFound, NewEvent(EventType.TURN_STARTED, w.turn.id, w.actor.id, causation_id="missing")),
        (InvalidRecord, completed(attempt, w.actor.id)),  # no attempt.requested before it
        (InvalidRecord, NewEvent(EventType.TURN_STARTED, w.turn.id, w.actor.id, payload={"x": float("nan")})),
    ]
    for error, bad in bad_batches:
        with pytest.raises(error):
            await ledger.append(w.lane.id, 0, f"bad-{bad.id}", [started(w), bad])
    with pytest.raises(InvalidRecord):
        await ledger.append(w.lane.id, 0, "empty", [])
    assert await ledger.load_lane(w.lane.id) == [] and (await ledger.get_lane(w.lane.id)).last_seq == 0
    ok = [
        NewEvent(EventType.SESSION_STARTED, "s1", w.actor.id),
        NewEvent(EventType.RUN_STARTED, "run-1", w.actor.id),
        NewEvent(EventType.LANE_CREATED, other.lane.id, w.actor.id),  # a lane of the same session
        NewEvent("lane.acme.note", w.lane.id, w.actor.id, extensions={"acme": True}),  # an extension, kept
    ]
    receipt = await ledger.append(w.lane.id, 0, "good", ok)
    assert receipt.last_seq == 4
    assert (await ledger.load_lane(w.lane.id))[-1].extensions == {"acme": True}


async def test_an_event_id_is_used_once(ledger: LedgerStore) -> None:
    w = await world(ledger)
    first = started(w)
    await ledger.append(w.lane.id, 0, "a1", [first])
    again = NewEvent(EventType.ACTION_STARTED, w.action.id, w.actor.id, id=first.id)
    with pytest.raises(Conflict, match="already used"):  # stored by an earlier batch
        await ledger.append(w.lane.id, 1, "a2", [NewEvent(EventType.ACTION_STARTED, w.action.id, w.actor.id), again])
    twin = NewEvent(EventType.ACTION_STARTED, w.action.id, w.actor.id)
    with pytest.raises(Conflict, match="already used"):  # twice in one batch
        await ledger.append(
            w.lane.id, 1, "a3", [twin, dataclasses.replace(twin, event_type=EventType.ACTION_COMPLETED)]
        )
    many = [NewEvent("lane.acme.note", w.lane.id, w.actor.id) for _ in range(600)]  # over one id lookup's chunk
    assert (await ledger.append(w.lane.id, 1, "a4", many)).last_seq == 601
    with pytest.raises(Conflict, match=f"event id {many[550].id} is already used"):
        await ledger.append(w.lane.id, 601, "a5", [NewEvent("lane.acme.note", w.lane.id, w.actor.id), many[550]])
    assert (await ledger.get_lane(w.lane.id)).last_seq == 601


async def test_causation_stays_inside_the_session(ledger: LedgerStore) -> None:
    w = await world(ledger)
    first = started(w)
    caused = NewEvent(EventType.ACTION_STARTED, w.action.id, w.actor.id, causation_id=first.id)
    await ledger.append(w.lane.id, 0, "a1", [first, caused])  # earlier in the same batch is fine
    later = NewEvent(EventType.ACTION_COMPLETED, w.action.id, w.actor.id, causation_id=caused.id)
    await ledger.append(w.lane.id, 2, "a2", [later])
    elsewhere = await ledger.create_lane(Lane(session_id="s2", run_id="r", name="main"))
    turn = await ledger.create_turn(Turn(lane_id=elsewhere.id))
    with pytest.raises(InvalidRecord, match="another session"):
        await ledger.append(
            elsewhere.id, 0, "a3", [NewEvent(EventType.TURN_STARTED, turn.id, w.actor.id, causation_id=first.id)]
        )
    with pytest.raises(Conflict):  # event ids are unique
        await ledger.append(w.lane.id, 3, "a4", [dataclasses.replace(first)])


async def test_unresolved_attempts_are_those_without_a_terminal_event(ledger: LedgerStore) -> None:
    w = await world(ledger, task_id="t1", conversation_id="c1", harness_call_id="call-1")
    recorder = await LaneRecorder.open(ledger, w.lane.id)
    done = await ledger.create_attempt(Attempt(w.action.id))
    crashed = await ledger.create_attempt(Attempt(w.action.id))
    broken = await ledger.create_attempt(Attempt(w.action.id))
    for attempt in (done, crashed, broken):
        await recorder.request(attempt, w.actor.id, payload={"model": "m"})
    await recorder.complete(done, w.actor.id, usage=Usage(10, 5, 0.01))
    await recorder.fail(broken, w.actor.id, error={"code": "rate_limited"})
    with pytest.raises(Conflict, match="already has its terminal event"):
        await recorder.complete(done, w.actor.id)
    with pytest.raises(Conflict, match="already requested"):
        await recorder.request(done, w.actor.id)
    for scope in (Scope(task_id="t1"), Scope(conversation_id="c1"), Scope(harness_call_id="call-1")):
        unresolved = await ledger.unresolved_attempts(scope)
        assert [(u.attempt.id, u.action.id, u.requested.event_type) for u in unresolved] == [
            (crashed.id, w.action.id, "attempt.requested")
        ]
    assert await ledger.unresolved_attempts(Scope(task_id="t2")) == []
    with pytest.raises(InvalidRecord):
        await ledger.unresolved_attempts(Scope())
    assert recorder.last_seq == 5


async def test_usage_rolls_up_per_task_conversation_and_call(ledger: LedgerStore) -> None:
    a = await world(ledger, name="a", task_id="t1", conversation_id="c1", harness_call_id="call-a")
    b = await world(ledger, name="b", task_id="t1", conversation_id="c1", harness_call_id="call-b")
    c = await world(ledger, name="c", task_id="t2", conversation_id="c1", harness_call_id="call-c")
    for w, usages in ((a, [Usage(100, 20, 0.5), Usage(1, 2, 0.25)]), (b, [Usage(7, 3, 1.0)]), (c, [Usage(5, 5, 2.0)])):
        recorder = LaneRecorder(ledger, w.lane)
        for usage in usages:
            attempt = await ledger.create_attempt(Attempt(w.action.id))
            await recorder.append([requested(attempt, w.actor.id), completed(attempt, w.actor.id, usage=usage)])
        failing = await ledger.create_attempt(Attempt(w.action.id))
        await recorder.append([requested(failing, w.actor.id), failed(failing, w.actor.id, error={"code": "x"})])
    t1 = await ledger.usage(Scope(task_id="t1"))
    assert (t1.input_tokens, t1.output_tokens, t1.cost_usd, t1.completed_attempts) == (108, 25, 1.75, 3)
    c1 = await ledger.usage(Scope(conversation_id="c1"))
    assert (c1.input_tokens, c1.output_tokens, c1.cost_usd, c1.completed_attempts) == (113, 30, 3.75, 4)
    call = await ledger.usage(Scope(harness_call_id="call-b"))
    assert (call.input_tokens, call.output_tokens, call.cost_usd) == (7, 3, 1.0)
    assert (await ledger.usage(Scope(task_id="none"))).completed_attempts == 0
    attempt = await ledger.create_attempt(Attempt(a.action.id))
    bad = completed(attempt, a.actor.id, payload={"usage": {"input_tokens": -1}})
    with pytest.raises(InvalidRecord):
        await ledger.append(
            a.lane.id, (await ledger.get_lane(a.lane.id)).last_seq, "bad", [requested(attempt, a.actor.id), bad]
        )


async def test_run_reads_exclude_sibling_runs_and_sessions_keep_lane_seqs(ledger: LedgerStore) -> None:
    one = await world(ledger, run_id="run-1")
    two = await world(ledger, run_id="run-2")
    await ledger.append(
        one.lane.id, 0, "x1", [started(one), NewEvent(EventType.ACTION_STARTED, one.action.id, one.actor.id)]
    )
    await ledger.append(two.lane.id, 0, "x2", [started(two)])
    run = await ledger.load_run("s1", "run-1")
    assert [lane.id for lane in run.lanes] == [one.lane.id]
    assert [(e.lane_id, e.seq) for e in run.events] == [(one.lane.id, 1), (one.lane.id, 2)]
    session = await ledger.load_session("s1")
    seqs = {one.lane.id: [1, 2], two.lane.id: [1]}
    assert {lane.id for lane in session.lanes} == set(seqs)
    assert [(e.lane_id, e.seq) for e in session.events] == [
        (lane.id, s) for lane in session.lanes for s in seqs[lane.id]
    ]
    assert (await ledger.load_session("nothing")).events == []


async def test_checkpoints_get_revisions_and_anchors_are_verified(ledger: LedgerStore) -> None:
    w = await world(ledger)
    receipt = await ledger.append(w.lane.id, 0, "a1", [started(w)])
    anchor = CheckpointAnchor(w.lane.id, 1, receipt.event_ids[0])
    first = await ledger.save_checkpoint(
        0, Checkpoint("loop/main", w.actor.id, "loopd.v1", state={"n": 1}, anchor=anchor)
    )
    assert first.revision == 1 and await ledger.get_checkpoint(first.id) == first
    assert await ledger.save_checkpoint(0, dataclasses.replace(first, revision=0, created_at=None)) == first
    with pytest.raises(IdempotencyViolation):
        await ledger.save_checkpoint(1, dataclasses.replace(first, state={"n": 2}))
    with pytest.raises(RevisionConflict):
        await ledger.save_checkpoint(0, Checkpoint("loop/main", w.actor.id, "loopd.v1", state={"n": 2}))
    ref = ArtifactRef("file:///state.bin", "ab" * 32, 10, "application/octet-stream")
    second = await ledger.save_checkpoint(1, Checkpoint("loop/main", w.actor.id, "loopd.v1", artifact_ref=ref))
    assert second.revision == 2 and second.artifact_ref == ref and second.state is None
    assert await ledger.load_latest_checkpoint("loop/main") == second
    assert await ledger.load_latest_checkpoint("other") is None
    with pytest.raises(Conflict, match="anchor"):
        await ledger.save_checkpoint(
            2, Checkpoint("loop/main", w.actor.id, "f", state={}, anchor=CheckpointAnchor(w.lane.id, 1, "wrong"))
        )
    with pytest.raises(InvalidRecord):
        await ledger.save_checkpoint(2, Checkpoint("loop/main", w.actor.id, "f"))  # neither state nor artifact
    with pytest.raises(InvalidRecord):
        await ledger.save_checkpoint(2, Checkpoint("loop/main", w.actor.id, "f", state={}, artifact_ref=ref))


async def test_checkpoint_link_and_run_completed_land_in_one_batch(ledger: LedgerStore) -> None:
    w = await world(ledger)
    checkpoint = await ledger.save_checkpoint(0, Checkpoint("loop/main", w.actor.id, "f", state={"done": True}))
    link = NewEvent(
        EventType.LANE_CHECKPOINT_LINKED,
        w.lane.id,
        w.actor.id,
        payload={"checkpoint_id": checkpoint.id, "profile": "loopd", "profile_version": "1"},
    )
    finish = NewEvent(EventType.RUN_COMPLETED, "run-1", w.actor.id, causation_id=link.id)
    receipt = await ledger.append(w.lane.id, 0, "finish", [link, finish])
    assert [e.event_type for e in await ledger.load_lane(w.lane.id)] == [link.event_type, finish.event_type]
    assert receipt.last_seq == 2


async def test_concurrent_appends_to_one_lane_have_one_winner_per_seq(ledger: LedgerStore) -> None:
    w = await world(ledger)

    async def write(i: int) -> bool:
        try:
            await ledger.append(w.lane.id, 0, f"race-{i}", [NewEvent("lane.test.mark", w.lane.id, w.actor.id)])
        except LaneConflict:
            return False
        return True

    results = await asyncio.gather(*(write(i) for i in range(6)))
    assert results.count(True) == 1
    assert [e.seq for e in await ledger.load_lane(w.lane.id)] == [1]


async def test_ledger_writes_join_the_callers_transaction(db: Database) -> None:
    setup = SqlLedgerStore(db)
    w = await world(setup)
    with pytest.raises(RuntimeError):
        async with db.transaction() as tx:
            joined = SqlLedgerStore.within(tx)
            await joined.append(w.lane.id, 0, "in-tx", [started(w)])
            assert (await joined.get_lane(w.lane.id)).last_seq == 1  # visible inside
            raise RuntimeError("the harness call checkpoint failed")
    assert await setup.load_lane(w.lane.id) == []
    async with db.transaction() as tx:
        await SqlLedgerStore.within(tx).append(w.lane.id, 0, "in-tx", [started(w)])
    assert [e.append_id for e in await setup.load_lane(w.lane.id)] == ["in-tx"]


async def test_a_lanes_one_writer_appends_after_whatever_it_holds(ledger: LedgerStore) -> None:
    # `append_next` reads the lane's last seq under its lock (the writer would only have read it first); a replay
    # of the same append returns its first receipt, as `append` does.
    assert isinstance(ledger, SqlLedgerStore)
    w = await world(ledger)
    opening = [started(w)]
    first = await ledger.append_next(w.lane.id, "n1", opening)
    second = await ledger.append_next(w.lane.id, "n2", [NewEvent(EventType.ACTION_STARTED, w.action.id, w.actor.id)])
    assert (first.first_seq, second.first_seq, second.last_seq) == (1, 2, 2)
    assert await ledger.append_next(w.lane.id, "n1", opening) == first
    assert (await ledger.get_lane(w.lane.id)).last_seq == 2


async def test_a_batch_checks_each_subject_and_actor_once() -> None:
    # Events of one batch often share their subject and actor: the stored facts are looked up once for each.
    lane = Lane(session_id="s1", run_id="run-1", name="main", id="lane-1")
    calls: list[str] = []

    class Counting:
        async def entity_lane(self, kind: SubjectKind, entity_id: str) -> str | None:
            calls.append(f"entity {entity_id}")
            return "lane-1"

        async def lane_session(self, lane_id: str) -> str | None:
            return "s1"

        async def event_session(self, event_id: str) -> str | None:
            return None

        async def used_event_ids(self, event_ids: Sequence[str]) -> set[str]:
            calls.append(f"used {len(event_ids)}")
            return set()

        async def actor_exists(self, actor_id: str) -> bool:
            calls.append(f"actor {actor_id}")
            return True

        async def attempt_progress(self, attempt_id: str) -> tuple[bool, bool]:
            calls.append(f"progress {attempt_id}")
            return (False, False)

    events = [
        NewEvent(EventType.ACTION_STARTED, "action-1", "actor-1"),
        NewEvent(EventType.ACTION_COMPLETED, "action-1", "actor-1"),
        NewEvent(EventType.ACTION_STARTED, "action-2", "actor-1"),
        NewEvent(EventType.ATTEMPT_REQUESTED, "attempt-1", "actor-1"),
        NewEvent(EventType.ATTEMPT_COMPLETED, "attempt-1", "actor-1"),
    ]
    await check_batch(lane, events, Counting())
    assert calls.count("entity action-1") == 1 and calls.count("entity action-2") == 1
    assert calls.count("actor actor-1") == 1
    assert calls.count("used 5") == 1  # the batch's event ids are looked up together
    assert calls.count("progress attempt-1") == 1  # an attempt's stored progress once, its batch events after
