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
    Scope,
    SqlLedgerStore,
    SubjectKind,
    Turn,
    completed,
    requested,
)
from loopd.server.storage import Conflict, Database, InvalidRecord
from tests.server_storage.helpers import record_statements


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
    async with db.transaction() as tx:
        reads = record_statements(tx)
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


# --- what one transaction wrote, remembered while it lasts (a store `within` it) --------------------------------


async def _trail(store: SqlLedgerStore, actor: str, lane_id: str) -> tuple[Turn, Action, Attempt, Attempt]:
    """The shape of a harness call's trail: a turn, an execution action with a store-numbered attempt, a child
    model call with a numbered one, and their opening events."""
    turn = await store.create_turn(Turn(lane_id=lane_id))
    execution = await store.create_action(
        Action(turn.id, ActionType.TOOL_CALL, effect_kind=EffectKind.WRITE, idempotency=Idempotency.NONE)
    )
    first = await store.create_attempt(Attempt(action_id=execution.id))
    child = await store.create_action(
        Action(
            turn.id,
            ActionType.MODEL_CALL,
            effect_kind=EffectKind.READ,
            idempotency=Idempotency.INHERENT,
            parent_action_id=execution.id,
        )
    )
    model = await store.create_attempt(Attempt(action_id=child.id, attempt_no=1))
    await store.append_next(
        lane_id,
        "opened",
        [
            NewEvent(str(EventType.TURN_STARTED), turn.id, actor),
            NewEvent(str(EventType.ACTION_STARTED), execution.id, actor),
            requested(first, actor),
            requested(model, actor),
        ],
    )
    return turn, execution, first, model


@pytest.mark.parametrize("facts", [None, LedgerFacts()], ids=["no-facts", "facts"])
async def test_a_transaction_does_not_read_back_the_rows_it_wrote(db: Database, facts: LedgerFacts | None) -> None:
    """A call's trail in one transaction: each new turn, action and attempt costs its insert alone, and the checks
    of the appends about them read none of their rows (lane, numbering, progress) back."""
    setup = SqlLedgerStore(db)
    actor = await setup.ensure_actor(Actor(type="harness", key="builtin", framework="loopd"))
    async with db.transaction() as tx:
        store = SqlLedgerStore.within(tx, facts=facts)
        lane = await store.create_lane(Lane(session_id="s1", run_id="r1", name="main"))
        reads = record_statements(tx)
        turn, execution, first, model = await _trail(store, actor.id, lane.id)
        await store.append_next(lane.id, "model", [completed(model, actor.id)])
        await store.append_next(lane.id, "closed", [completed(first, actor.id)])
    entity_reads = [
        sql
        for sql in reads
        if sql.startswith("SELECT")
        and any(table in sql for table in ("ledger_turns", "ledger_actions", "ledger_attempts", "DISTINCT event_type"))
    ]
    assert entity_reads == []
    # what is left: per append the append id with the batch's event ids; the actor once. The lane this transaction
    # created is not read back for its appends (its last seq is what its own appends left)
    assert len([sql for sql in reads if sql.startswith("SELECT")]) == 3 + 1
    assert not [sql for sql in reads if sql.startswith("SELECT") and "ledger_lanes" in sql]
    assert len([sql for sql in reads if "ledger_actors" in sql]) == 1
    stored = await setup.load_run("s1", "r1")
    assert [e.event_type for e in stored.events][-2:] == ["attempt.completed", "attempt.completed"]
    assert [e.seq for e in stored.events] == list(range(1, len(stored.events) + 1))
    async with db.transaction() as tx:  # a later transaction locks the lane once, then appends after its own
        store = SqlLedgerStore.within(tx, facts=facts)
        reads = record_statements(tx)
        await store.append_next(lane.id, "later/1", [NewEvent(str(EventType.ACTION_COMPLETED), execution.id, actor.id)])
        await store.append_next(lane.id, "later/2", [NewEvent(str(EventType.TURN_COMPLETED), turn.id, actor.id)])
    assert len([sql for sql in reads if sql.startswith("SELECT") and "FROM ledger_lanes" in sql]) == 1
    stored = await setup.load_run("s1", "r1")
    assert [e.seq for e in stored.events] == list(range(1, len(stored.events) + 1))
    assert (await setup.get_lane(lane.id)).last_seq == len(stored.events)
    assert (await setup.get_attempt(first.id)).attempt_no == 1


async def test_the_rules_hold_for_rows_written_earlier_in_the_same_transaction(db: Database) -> None:
    setup = SqlLedgerStore(db)
    actor = (await setup.ensure_actor(Actor(type="harness", key="builtin", framework="loopd"))).id
    other = await setup.create_lane(Lane(session_id="s1", run_id="r0", name="other"))

    async def refused(case: str) -> None:
        async with db.transaction() as tx:
            store = SqlLedgerStore.within(tx)
            lane = await store.create_lane(Lane(session_id="s1", run_id=case, name="main"))
            turn, execution, _, model = await _trail(store, actor, lane.id)
            if case == "requested twice":
                await store.append_next(lane.id, "again", [requested(model, actor)])
            elif case == "completed twice":
                await store.append_next(lane.id, "once", [completed(model, actor)])
                await store.append_next(lane.id, "twice", [completed(model, actor)])
            elif case == "completed before requested":
                fresh = await store.create_attempt(Attempt(action_id=execution.id))
                assert fresh.attempt_no == 2  # numbered after the one this transaction gave the action
                await store.append_next(lane.id, "early", [completed(fresh, actor)])
            elif case == "another lane's turn":
                await store.append_next(other.id, "foreign", [NewEvent(str(EventType.TURN_COMPLETED), turn.id, actor)])

    with pytest.raises(Conflict, match="already requested"):
        await refused("requested twice")
    with pytest.raises(Conflict, match="already has its terminal event"):
        await refused("completed twice")
    with pytest.raises(InvalidRecord, match=r"needs attempt\.requested"):
        await refused("completed before requested")
    with pytest.raises(InvalidRecord, match="belongs to another lane"):
        await refused("another lane's turn")
    assert await setup.find_lanes(Scope(session_id="s1")) == [other]  # each refusal rolled its transaction back


async def test_attempts_of_an_action_this_transaction_created_are_numbered_without_reads(db: Database) -> None:
    setup = SqlLedgerStore(db)
    lane = await setup.create_lane(Lane(session_id="s1", run_id="r1", name="main"))
    turn = await setup.create_turn(Turn(lane_id=lane.id))
    async with db.transaction() as tx:
        store = SqlLedgerStore.within(tx)
        action = await store.create_action(
            Action(turn.id, ActionType.TOOL_CALL, effect_kind=EffectKind.WRITE, idempotency=Idempotency.NONE)
        )
        reads = record_statements(tx)
        one = await store.create_attempt(Attempt(action_id=action.id, id="one"))
        given = await store.create_attempt(Attempt(action_id=action.id, attempt_no=5, id="five"))
        after = await store.create_attempt(Attempt(action_id=action.id, id="six"))
        again = await store.create_attempt(Attempt(action_id=action.id, id="one"))  # a repeat: the stored one
        assert [one.attempt_no, given.attempt_no, after.attempt_no, again.attempt_no] == [1, 5, 6, 1]
        assert [sql for sql in reads if sql.startswith("SELECT") and "ledger_attempts WHERE id" not in sql] == []
        with pytest.raises(Conflict, match="already has attempt 5"):
            await store.create_attempt(Attempt(action_id=action.id, attempt_no=5, id="another five"))
    # a later transaction did not create the action: it reads the numbers taken
    assert (await setup.create_attempt(Attempt(action_id=action.id))).attempt_no == 7


async def test_stores_joined_to_one_transaction_share_what_it_did(db: Database) -> None:
    """The engine records a transaction's updates through several stores (a trail per update): what one store
    wrote is what the others know, so an attempt one store created and another requested cannot be requested again."""
    setup = SqlLedgerStore(db)
    actor = (await setup.ensure_actor(Actor(type="harness", key="builtin", framework="loopd"))).id
    with pytest.raises(Conflict, match="already requested"):
        async with db.transaction() as tx:
            first, second = SqlLedgerStore.within(tx), SqlLedgerStore.within(tx)
            lane = await first.create_lane(Lane(session_id="s1", run_id="r1", name="main"))
            turn = await first.create_turn(Turn(lane_id=lane.id))
            action = await first.create_action(
                Action(turn.id, ActionType.MODEL_CALL, effect_kind=EffectKind.READ, idempotency=Idempotency.INHERENT)
            )
            attempt = await first.create_attempt(Attempt(action_id=action.id, attempt_no=1))
            await second.append_next(lane.id, "requested", [requested(attempt, actor)])
            await first.append_next(lane.id, "again", [requested(attempt, actor)])
