"""`LedgerFacts`: what a writer remembers of committed ledger rows — only once surely committed, bounded, and
without changing an outcome (the contract suite also runs with it: the ``sqlite+facts`` store)."""

from __future__ import annotations

import pytest

from loopd.server.ledger import (
    Action,
    ActionType,
    Actor,
    Attempt,
    EffectKind,
    EventType,
    Idempotency,
    Lane,
    LedgerFacts,
    NewEvent,
    SqlLedgerStore,
    SubjectKind,
    Turn,
    completed,
    requested,
)
from loopd.server.storage import Database


def test_facts_are_bounded_and_the_oldest_go_first() -> None:
    facts = LedgerFacts(limit=2)
    for name in ("a", "b", "c"):
        facts.add_entity(SubjectKind.TURN, name, "lane")
    assert facts.entity_lane(SubjectKind.TURN, "a") is None
    assert facts.entity_lane(SubjectKind.TURN, "c") == "lane"
    assert facts.entity_lane(SubjectKind.ACTION, "c") is None  # an entity is known by its kind too
    assert not facts.actor_exists("someone")  # unknown, not absent
    with pytest.raises(ValueError, match="at least 1"):
        LedgerFacts(limit=0)


async def test_only_committed_rows_are_remembered(db: Database) -> None:
    facts = LedgerFacts()
    setup = SqlLedgerStore(db)
    actor = await setup.ensure_actor(Actor(type="harness", key="builtin", framework="loopd"))
    lane = await setup.create_lane(Lane(session_id="s1", run_id="r1", name="main"))

    with pytest.raises(RuntimeError):
        async with db.transaction() as tx:
            await SqlLedgerStore.within(tx, facts=facts).create_turn(Turn(lane_id=lane.id, id="rolled-back"))
            raise RuntimeError("the caller fails after the write: everything rolls back")
    assert facts.entity_lane(SubjectKind.TURN, "rolled-back") is None

    async with db.transaction() as tx:
        await SqlLedgerStore.within(tx, facts=facts).create_turn(Turn(lane_id=lane.id, id="unknown"))
        tx.outcome_unknown = True  # as when the COMMIT's outcome could not be learnt: it may not have happened
    assert facts.entity_lane(SubjectKind.TURN, "unknown") is None

    async with db.transaction() as tx:
        store = SqlLedgerStore.within(tx, facts=facts)
        turn = await store.create_turn(Turn(lane_id=lane.id, id="kept"))
        action = await store.create_action(
            Action(turn.id, ActionType.MODEL_CALL, effect_kind=EffectKind.READ, idempotency=Idempotency.INHERENT)
        )
        attempt = await store.create_attempt(Attempt(action_id=action.id, attempt_no=1))
        assert facts.entity_lane(SubjectKind.TURN, "kept") is None, "not before the commit"
    assert facts.entity_lane(SubjectKind.TURN, "kept") == lane.id
    assert facts.entity_lane(SubjectKind.ACTION, action.id) == lane.id
    assert facts.entity_lane(SubjectKind.ATTEMPT, attempt.id) == lane.id
    assert facts.lane_session(lane.id) == "s1"

    async with db.transaction() as tx:
        await SqlLedgerStore.within(tx, facts=facts).append_next(lane.id, "append-1", [requested(attempt, actor.id)])
    assert facts.actor_exists(actor.id)


async def test_a_remembered_fact_saves_its_read(db: Database) -> None:
    """Appends about entities a committed transaction established read none of their rows again."""
    facts = LedgerFacts()
    setup = SqlLedgerStore(db, facts=facts)
    actor = await setup.ensure_actor(Actor(type="harness", key="builtin", framework="loopd"))
    lane = await setup.create_lane(Lane(session_id="s1", run_id="r1", name="main"))
    turn = await setup.create_turn(Turn(lane_id=lane.id))
    action = await setup.create_action(
        Action(turn.id, ActionType.MODEL_CALL, effect_kind=EffectKind.READ, idempotency=Idempotency.INHERENT)
    )
    attempt = await setup.create_attempt(Attempt(action_id=action.id, attempt_no=1))
    await setup.append_next(lane.id, "warm", [requested(attempt, actor.id)])
    reads: list[str] = []
    async with db.transaction() as tx:
        fetch_one, fetch = tx.fetch_one, tx.fetch

        async def counted(sql: str, params: object = ()) -> object:
            reads.append(sql)
            return await fetch_one(sql, params)  # type: ignore[arg-type]

        async def counted_rows(sql: str, params: object = ()) -> object:
            reads.append(sql)
            return await fetch(sql, params)  # type: ignore[arg-type]

        tx.fetch_one = counted  # type: ignore[assignment, method-assign]
        tx.fetch = counted_rows  # type: ignore[assignment, method-assign]
        events = [
            NewEvent(str(EventType.TURN_STARTED), turn.id, actor.id),
            NewEvent(str(EventType.ACTION_STARTED), action.id, actor.id),
            completed(attempt, actor.id),
        ]
        await SqlLedgerStore.within(tx, facts=facts).append_next(lane.id, "second", events)
    looked_up = [sql for sql in reads if sql.startswith(("SELECT lane_id FROM", "SELECT 1 FROM ledger_actors"))]
    assert looked_up == []
    # The append id and the batch's event ids are checked in one read.
    assert [sql for sql in reads if "ledger_appends" in sql or "FROM ledger_events WHERE id IN" in sql] == [
        next(sql for sql in reads if "ledger_appends" in sql)
    ]
