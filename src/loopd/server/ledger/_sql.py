"""``SqlLedgerStore``: the ledger contract on the loop-server ``Database`` (SQLite or PostgreSQL).

Tables (created by storage migration 2): ``ledger_actors`` (id, actor_type, framework, actor_key UNIQUE,
attributes), ``ledger_lanes`` (id, session/run/name UNIQUE, parent_lane_id, task_id, conversation_id,
harness_call_id — indexed —, attributes, last_seq), ``ledger_turns``, ``ledger_actions`` (type, effect_kind,
idempotency, name, parent_action_id), ``ledger_attempts`` (UNIQUE (action_id, attempt_no)), ``ledger_events``
(UNIQUE (lane_id, seq); the usage an attempt's terminal event reports copied into input_tokens / output_tokens /
cost_usd for roll-ups), ``ledger_appends`` (id, lane_id, digest, first/last seq, event ids) and ``ledger_checkpoints``
(UNIQUE (checkpoint_key, revision)). No foreign keys: the store checks ownership itself.

An append locks its lane row (PostgreSQL ``FOR UPDATE``; SQLite writers are serialized), then checks the append
id, the expected seq and the batch, then writes events, receipt and head in the same transaction.
``SqlLedgerStore(db)`` runs each call in its own transaction; ``SqlLedgerStore.within(tx)`` joins a transaction
the caller already opened (so ledger facts commit together with, say, a harness call checkpoint); the stores joined
to one transaction share a memory of what it wrote and read through them (`_Done`) — which lane each turn, action
and attempt belongs to, each lane's session, the actors found, and the progress and numbering of the attempts and
actions it created — so that later calls in the same transaction do not read those rows back (its ledger writes
must then go through such stores, as the engine's trails' do, not through bare SQL).
Must not do: decide what to record (callers and ``LaneRecorder`` do).
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import datetime
from typing import Any, TypeVar

from loopd.server.storage import (
    Conflict,
    Database,
    NotFound,
    TransactionCore,
    dumps,
    loads,
    optional_time,
    parse_time,
    time_text,
)

from ._artifacts import URI_PREFIX, ArtifactBlob
from ._errors import IdempotencyViolation, LaneConflict, RevisionConflict
from ._facts import LedgerFacts, remember_after_commit
from ._records import (
    Action,
    Actor,
    AppendReceipt,
    ArtifactRef,
    Attempt,
    Checkpoint,
    CheckpointAnchor,
    CostRow,
    Event,
    Lane,
    LedgerStructure,
    LedgerView,
    NewEvent,
    Scope,
    Turn,
    UnresolvedAttempt,
    UsageTotals,
)
from ._rules import (
    batch_digest,
    check_batch,
    check_expected_seq,
    checkpoint_digest,
    normalize_action,
    normalize_actor,
    normalize_attempt,
    normalize_checkpoint,
    normalize_lane,
    normalize_turn,
    same_identity,
)
from ._vocabulary import ATTEMPT_TERMINAL_EVENTS, ActionType, EffectKind, EventType, Idempotency, SubjectKind

_T = TypeVar("_T")
_IDS_PER_QUERY = 500
"""Ids per ``IN (…)`` lookup, well under every driver's parameter limit."""

_ACTOR = "id, actor_type, actor_key, framework, attributes, created_at"
_LANE = (
    "id, session_id, run_id, name, parent_lane_id, task_id, conversation_id, harness_call_id, attributes, "
    "last_seq, created_at"
)
_TURN = "id, lane_id, attributes, created_at"
_ACTION = "id, turn_id, action_type, effect_kind, idempotency, name, parent_action_id, attributes, lane_id, created_at"
_ATTEMPT = "id, action_id, attempt_no, lane_id, created_at"
_EVENT = (
    "id, lane_id, seq, subject_id, event_type, actor_id, occurred_at, payload, extensions, causation_id, "
    "schema_version, append_id, committed_at"
)
_CHECKPOINT = (
    "id, checkpoint_key, revision, actor_id, format, state, artifact_ref, anchor, extensions, schema_version, "
    "created_at"
)
_TERMINAL = "('attempt.completed', 'attempt.failed')"


def _prefixed(columns: str, alias: str) -> str:
    return ", ".join(f"{alias}.{column.strip()}" for column in columns.split(","))


def _actor(row: Sequence[Any]) -> Actor:
    return Actor(
        id=row[0], type=row[1], key=row[2], framework=row[3], attributes=loads(row[4]), created_at=parse_time(row[5])
    )


def _lane(row: Sequence[Any]) -> Lane:
    return Lane(
        id=row[0],
        session_id=row[1],
        run_id=row[2],
        name=row[3],
        parent_lane_id=row[4],
        task_id=row[5],
        conversation_id=row[6],
        harness_call_id=row[7],
        attributes=loads(row[8]),
        last_seq=int(row[9]),
        created_at=parse_time(row[10]),
    )


def _turn(row: Sequence[Any]) -> Turn:
    return Turn(id=row[0], lane_id=row[1], attributes=loads(row[2]), created_at=parse_time(row[3]))


def _action(row: Sequence[Any]) -> Action:
    return Action(
        id=row[0],
        turn_id=row[1],
        type=ActionType(row[2]),
        effect_kind=EffectKind(row[3]),
        idempotency=Idempotency(row[4]),
        name=row[5],
        parent_action_id=row[6],
        attributes=loads(row[7]),
        lane_id=row[8],
        created_at=parse_time(row[9]),
    )


def _attempt(row: Sequence[Any]) -> Attempt:
    return Attempt(id=row[0], action_id=row[1], attempt_no=int(row[2]), lane_id=row[3], created_at=parse_time(row[4]))


def _event(row: Sequence[Any]) -> Event:
    return Event(
        id=row[0],
        lane_id=row[1],
        seq=int(row[2]),
        subject_id=row[3],
        event_type=row[4],
        actor_id=row[5],
        occurred_at=parse_time(row[6]),
        payload=loads(row[7]),
        extensions=loads(row[8]),
        causation_id=row[9],
        schema_version=row[10],
        append_id=row[11],
        committed_at=parse_time(row[12]),
    )


def _checkpoint(row: Sequence[Any]) -> Checkpoint:
    ref = loads(row[6])
    anchor = loads(row[7])
    return Checkpoint(
        id=row[0],
        key=row[1],
        revision=int(row[2]),
        actor_id=row[3],
        format=row[4],
        state=loads(row[5]),
        artifact_ref=None if ref is None else ArtifactRef(**ref),
        anchor=None if anchor is None else CheckpointAnchor(**anchor),
        extensions=loads(row[8]),
        schema_version=row[9],
        created_at=optional_time(row[10]),
    )


def _scope_sql(scope: Scope, alias: str) -> tuple[str, list[Any]]:
    filters = scope.filters()
    return " AND ".join(f"{alias}.{column} = ?" for column in filters), list(filters.values())


class _Done:
    """What one transaction wrote and read through the ledger, true until it ends (`LedgerFacts` learns the
    immutable part only once it committed). One per transaction (`TransactionCore.memo`), shared by every store
    joined to it, so that no store's memory misses another's writes."""

    __slots__ = ("actors", "entity_lanes", "fresh_actions", "fresh_attempts", "held_lanes", "lane_sessions")

    def __init__(self) -> None:
        # The lanes this transaction created or read under their row lock, as it left them (``last_seq`` after its
        # own appends): nobody else can append to them before it ends, so a later append reads none again.
        self.held_lanes: dict[str, Lane] = {}
        self.entity_lanes: dict[tuple[SubjectKind, str], str] = {}
        self.lane_sessions: dict[str, str] = {}
        self.actors: set[str] = set()
        # The attempts this transaction created, with their progress since (requested, finished): no other
        # transaction can have written events about them, and this one writes them through a store sharing this.
        self.fresh_attempts: dict[str, tuple[bool, bool]] = {}
        # The actions this transaction created, with the highest attempt number it gave one of them (0: none):
        # nobody else can have numbered their attempts.
        self.fresh_actions: dict[str, int] = {}


class _LedgerSql:
    """The ledger's SQL on one open transaction; also the ``Lookups`` the batch rules read through."""

    def __init__(self, tx: TransactionCore, facts: LedgerFacts | None = None, done: _Done | None = None) -> None:
        self._tx = tx
        self._facts = facts
        done = done or _Done()
        self._entity_lanes = done.entity_lanes
        self._lane_sessions = done.lane_sessions
        self._actors = done.actors
        self._fresh_attempts = done.fresh_attempts
        self._fresh_actions = done.fresh_actions
        self._held_lanes = done.held_lanes

    # -- immutable facts, remembered once committed (`LedgerFacts`) ------------------------------------------

    def _learn_entity(self, kind: SubjectKind, entity_id: str, lane_id: str) -> None:
        self._entity_lanes[kind, entity_id] = lane_id
        facts = self._facts
        if facts is not None:
            remember_after_commit(self._tx, lambda: facts.add_entity(kind, entity_id, lane_id))

    def _learn_lane(self, lane: Lane) -> Lane:
        self._lane_sessions[lane.id] = lane.session_id
        facts = self._facts
        if facts is not None:
            remember_after_commit(self._tx, lambda: facts.add_lane(lane.id, lane.session_id))
        return lane

    # -- lookups ---------------------------------------------------------------------------------------------

    async def entity_lane(self, kind: SubjectKind, entity_id: str) -> str | None:
        if (known := self._entity_lanes.get((kind, entity_id))) is not None:
            return known
        if self._facts is not None and (known := self._facts.entity_lane(kind, entity_id)) is not None:
            return known
        table = {SubjectKind.TURN: "ledger_turns", SubjectKind.ACTION: "ledger_actions"}.get(kind, "ledger_attempts")
        row = await self._tx.fetch_one(f"SELECT lane_id FROM {table} WHERE id = ?", (entity_id,))
        if row is None:
            return None
        self._learn_entity(kind, entity_id, str(row[0]))
        return str(row[0])

    async def lane_session(self, lane_id: str) -> str | None:
        if (known := self._known_lane_session(lane_id)) is not None:
            return known
        row = await self._tx.fetch_one("SELECT session_id FROM ledger_lanes WHERE id = ?", (lane_id,))
        if row is None:
            return None
        facts, session = self._facts, str(row[0])
        self._lane_sessions[lane_id] = session
        if facts is not None:
            remember_after_commit(self._tx, lambda: facts.add_lane(lane_id, session))
        return session

    def _known_lane_session(self, lane_id: str) -> str | None:
        if (known := self._lane_sessions.get(lane_id)) is not None:
            return known
        return None if self._facts is None else self._facts.lane_session(lane_id)

    async def event_session(self, event_id: str) -> str | None:
        row = await self._tx.fetch_one(
            "SELECT l.session_id FROM ledger_events e JOIN ledger_lanes l ON l.id = e.lane_id WHERE e.id = ?",
            (event_id,),
        )
        return None if row is None else str(row[0])

    async def used_event_ids(self, event_ids: Sequence[str]) -> set[str]:
        used: set[str] = set()
        for start in range(0, len(event_ids), _IDS_PER_QUERY):
            chunk = event_ids[start : start + _IDS_PER_QUERY]
            rows = await self._tx.fetch(
                f"SELECT id FROM ledger_events WHERE id IN ({', '.join('?' * len(chunk))})", tuple(chunk)
            )
            used.update(str(row[0]) for row in rows)
        return used

    async def actor_exists(self, actor_id: str) -> bool:
        facts = self._facts
        if actor_id in self._actors or (facts is not None and facts.actor_exists(actor_id)):
            return True
        if await self._tx.fetch_one("SELECT 1 FROM ledger_actors WHERE id = ?", (actor_id,)) is None:
            return False
        self._actors.add(actor_id)
        if facts is not None:
            remember_after_commit(self._tx, lambda: facts.add_actor(actor_id))
        return True

    async def attempt_progress(self, attempt_id: str) -> tuple[bool, bool]:
        if (fresh := self._fresh_attempts.get(attempt_id)) is not None:
            return fresh
        rows = await self._tx.fetch(
            "SELECT DISTINCT event_type FROM ledger_events WHERE subject_id = ? AND event_type IN "
            "('attempt.requested', 'attempt.completed', 'attempt.failed')",
            (attempt_id,),
        )
        types = {str(row[0]) for row in rows}
        return EventType.ATTEMPT_REQUESTED in types, bool(types - {EventType.ATTEMPT_REQUESTED})

    # -- entities --------------------------------------------------------------------------------------------

    async def get_actor(self, actor_id: str) -> Actor:
        row = await self._tx.fetch_one(f"SELECT {_ACTOR} FROM ledger_actors WHERE id = ?", (actor_id,))
        if row is None:
            raise NotFound(f"actor {actor_id} not found")
        return _actor(row)

    async def get_actor_by_key(self, key: str) -> Actor | None:
        row = await self._tx.fetch_one(f"SELECT {_ACTOR} FROM ledger_actors WHERE actor_key = ?", (key,))
        return None if row is None else _actor(row)

    async def create_actor(self, actor: Actor) -> Actor:
        actor = normalize_actor(actor)
        inserted = await self._tx.execute(
            f"INSERT INTO ledger_actors ({_ACTOR}) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
            (actor.id, actor.type, actor.key, actor.framework, dumps(actor.attributes), time_text(self._tx.now())),
        )
        if inserted == 1:
            return await self.get_actor(actor.id)
        row = await self._tx.fetch_one(f"SELECT {_ACTOR} FROM ledger_actors WHERE id = ?", (actor.id,))
        if row is None:
            raise Conflict(f"actor key {actor.key!r} already names another actor")
        existing = _actor(row)
        same_identity(existing, actor, "actor")
        return existing

    async def ensure_actor(self, actor: Actor) -> Actor:
        actor = normalize_actor(actor)
        if actor.key is None:
            raise Conflict("ensure_actor needs an actor key")
        existing = await self.get_actor_by_key(actor.key)
        if existing is None:
            inserted = await self._tx.fetch(
                f"INSERT INTO ledger_actors ({_ACTOR}) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING "
                f"RETURNING {_ACTOR}",
                (actor.id, actor.type, actor.key, actor.framework, dumps(actor.attributes), time_text(self._tx.now())),
            )
            if inserted:
                return _actor(inserted[0])  # as stored, without reading it again
            existing = await self.get_actor_by_key(actor.key)
            if existing is None:
                raise Conflict(f"actor id {actor.id} is already used by an actor with another key")
        same_identity(existing, dataclasses.replace(actor, id=existing.id), "actor")
        return existing

    async def get_lane(self, lane_id: str, *, lock: bool = False) -> Lane:
        suffix = self._tx.for_update if lock else ""
        row = await self._tx.fetch_one(f"SELECT {_LANE} FROM ledger_lanes WHERE id = ?{suffix}", (lane_id,))
        if row is None:
            raise NotFound(f"lane {lane_id} not found")
        lane = self._learn_lane(_lane(row))
        if lock:
            self._held_lanes[lane_id] = lane
        return lane

    async def _require_lane(self, lane_id: str) -> None:
        """NotFound unless the lane exists (known from a committed transaction or this one, or read)."""
        if self._known_lane_session(lane_id) is None:
            await self.get_lane(lane_id)

    async def find_lane(self, session_id: str, run_id: str, name: str) -> Lane | None:
        row = await self._tx.fetch_one(
            f"SELECT {_LANE} FROM ledger_lanes WHERE session_id = ? AND run_id = ? AND name = ?",
            (session_id, run_id, name),
        )
        return None if row is None else _lane(row)

    async def find_lanes(self, scope: Scope) -> list[Lane]:
        where, params = _scope_sql(scope, "l")
        rows = await self._tx.fetch(
            f"SELECT {_prefixed(_LANE, 'l')} FROM ledger_lanes l WHERE {where} ORDER BY l.created_at, l.id", params
        )
        return [_lane(row) for row in rows]

    async def create_lane(self, lane: Lane) -> Lane:
        lane = normalize_lane(lane)
        if lane.parent_lane_id is not None:
            parent = await self.get_lane(lane.parent_lane_id)
            if parent.session_id != lane.session_id:
                raise Conflict(f"parent lane {parent.id} belongs to another session")
        inserted = await self._tx.fetch(
            f"INSERT INTO ledger_lanes ({_LANE}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 0, ?) ON CONFLICT DO NOTHING "
            f"RETURNING {_LANE}",
            (
                lane.id,
                lane.session_id,
                lane.run_id,
                lane.name,
                lane.parent_lane_id,
                lane.task_id,
                lane.conversation_id,
                lane.harness_call_id,
                dumps(lane.attributes),
                time_text(self._tx.now()),
            ),
        )
        if inserted:
            created = self._held_lanes[lane.id] = self._learn_lane(_lane(inserted[0]))  # as stored, not read again
            return created
        row = await self._tx.fetch_one(f"SELECT {_LANE} FROM ledger_lanes WHERE id = ?", (lane.id,))
        if row is None:
            raise Conflict(f"run {lane.run_id} of session {lane.session_id} already has a lane {lane.name!r}")
        existing = _lane(row)
        same_identity(existing, lane, "lane")
        return self._learn_lane(existing)

    # An entity is inserted first (a new one — the common case — costs one statement) once what it refers to is
    # known to exist; when that check fails, the entity's own row decides first, as a repeat of a stored entity
    # is judged by its identity alone.

    async def create_turn(self, turn: Turn) -> Turn:
        turn = normalize_turn(turn)
        try:
            await self._require_lane(turn.lane_id)
        except NotFound:
            await self._stored_same(_TURN, "ledger_turns", turn, _turn)
            raise
        stored, _ = await self._insert_or_compare(
            "ledger_turns",
            _TURN,
            (turn.id, turn.lane_id, dumps(turn.attributes), time_text(self._tx.now())),
            turn,
            _turn,
        )
        self._learn_entity(SubjectKind.TURN, stored.id, stored.lane_id)
        return stored

    async def _stored_same(
        self, columns: str, table: str, proposed: Any, decode: Callable[[Sequence[Any]], Any]
    ) -> None:
        """If ``proposed``'s id is stored, the stored entity must have its identity (else the identity error)."""
        row = await self._tx.fetch_one(f"SELECT {columns} FROM {table} WHERE id = ?", (proposed.id,))
        if row is not None:
            same_identity(decode(row), proposed, table.removeprefix("ledger_").rstrip("s"))

    async def create_action(self, action: Action) -> Action:
        action = normalize_action(action)
        lane_id = await self.entity_lane(SubjectKind.TURN, action.turn_id)
        problem: Exception | None = None
        if lane_id is None:
            problem = NotFound(f"turn {action.turn_id} not found")
        elif action.parent_action_id is not None:
            parent_lane = await self.entity_lane(SubjectKind.ACTION, action.parent_action_id)
            if parent_lane is None:
                problem = NotFound(f"parent action {action.parent_action_id} not found")
            elif parent_lane != lane_id:
                problem = Conflict(f"parent action {action.parent_action_id} belongs to another lane")
        if problem is not None or lane_id is None:
            row = await self._tx.fetch_one(f"SELECT {_ACTION} FROM ledger_actions WHERE id = ?", (action.id,))
            if row is None:
                raise problem or NotFound(f"turn {action.turn_id} not found")
            existing = _action(row)
            same_identity(existing, action, "action")
            if existing.lane_id is not None:
                self._learn_entity(SubjectKind.ACTION, existing.id, existing.lane_id)
            return existing
        stored, inserted = await self._insert_or_compare(
            "ledger_actions",
            _ACTION,
            (
                action.id,
                action.turn_id,
                str(action.type),
                str(action.effect_kind),
                str(action.idempotency),
                action.name,
                action.parent_action_id,
                dumps(action.attributes),
                lane_id,
                time_text(self._tx.now()),
            ),
            action,
            _action,
        )
        self._learn_entity(SubjectKind.ACTION, stored.id, stored.lane_id or lane_id)
        if inserted:
            self._fresh_actions[stored.id] = 0
        return stored

    async def create_attempt(self, attempt: Attempt) -> Attempt:
        attempt = normalize_attempt(attempt)
        if attempt.attempt_no is not None:
            # Numbered by the caller: no number to pick under the action's lock (the unique (action, number)
            # refuses a taken one), and a new attempt costs its insert alone.
            lane_id = await self.entity_lane(SubjectKind.ACTION, attempt.action_id)
            if lane_id is not None:
                return await self._insert_attempt(attempt, attempt.attempt_no, lane_id)
        elif (numbered := self._fresh_actions.get(attempt.action_id)) is not None:
            # An action this transaction created: its attempts are the ones numbered here, so far.
            return await self._insert_attempt(
                attempt, numbered + 1, self._entity_lanes[SubjectKind.ACTION, attempt.action_id]
            )
        row = await self._tx.fetch_one(f"SELECT {_ATTEMPT} FROM ledger_attempts WHERE id = ?", (attempt.id,))
        if row is not None:
            return self._same_attempt(_attempt(row), attempt)
        # Lock the action: concurrent attempts of one action pick their numbers one at a time.
        action_row = await self._tx.fetch_one(
            f"SELECT lane_id FROM ledger_actions WHERE id = ?{self._tx.for_update}", (attempt.action_id,)
        )
        if action_row is None:
            raise NotFound(f"action {attempt.action_id} not found")
        last = await self._tx.fetch_one(
            "SELECT MAX(attempt_no) FROM ledger_attempts WHERE action_id = ?", (attempt.action_id,)
        )
        number = int(last[0] or 0) + 1 if last is not None else 1
        return await self._insert_attempt(attempt, number, str(action_row[0]))

    async def _insert_attempt(self, attempt: Attempt, number: int, lane_id: str) -> Attempt:
        inserted = await self._tx.fetch(
            f"INSERT INTO ledger_attempts ({_ATTEMPT}) VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING "
            f"RETURNING {_ATTEMPT}",
            (attempt.id, attempt.action_id, number, lane_id, time_text(self._tx.now())),
        )
        if not inserted:
            row = await self._tx.fetch_one(f"SELECT {_ATTEMPT} FROM ledger_attempts WHERE id = ?", (attempt.id,))
            if row is None:
                raise Conflict(f"action {attempt.action_id} already has attempt {number}")
            return self._same_attempt(_attempt(row), attempt)
        self._learn_entity(SubjectKind.ATTEMPT, attempt.id, lane_id)
        self._fresh_attempts[attempt.id] = (False, False)
        if attempt.action_id in self._fresh_actions:
            self._fresh_actions[attempt.action_id] = max(self._fresh_actions[attempt.action_id], number)
        return _attempt(inserted[0])  # as stored, without reading it again

    @staticmethod
    def _same_attempt(existing: Attempt, proposed: Attempt) -> Attempt:
        if proposed.attempt_no is None:
            proposed = dataclasses.replace(proposed, attempt_no=existing.attempt_no)
        same_identity(existing, proposed, "attempt")
        return existing

    async def get_attempt(self, attempt_id: str) -> Attempt:
        return await self._get(_ATTEMPT, "ledger_attempts", attempt_id, _attempt)

    async def _get(self, columns: str, table: str, entity_id: str, decode: Callable[[Sequence[Any]], _T]) -> _T:
        row = await self._tx.fetch_one(f"SELECT {columns} FROM {table} WHERE id = ?", (entity_id,))
        if row is None:
            raise NotFound(f"{table.removeprefix('ledger_').rstrip('s')} {entity_id} not found")
        return decode(row)

    async def _insert_or_compare(
        self, table: str, columns: str, values: tuple[Any, ...], proposed: Any, decode: Callable[[Sequence[Any]], _T]
    ) -> tuple[_T, bool]:
        """Insert the entity and return it as stored (one statement: ``RETURNING``) and True; when its id is stored
        already, the stored one, which must have the same identity, and False."""
        marks = ", ".join("?" for _ in values)
        inserted = await self._tx.fetch(
            f"INSERT INTO {table} ({columns}) VALUES ({marks}) ON CONFLICT DO NOTHING RETURNING {columns}", values
        )
        if inserted:
            return decode(inserted[0]), True
        stored = await self._get(columns, table, proposed.id, decode)
        same_identity(stored, proposed, table.removeprefix("ledger_").rstrip("s"))
        return stored, False

    # -- events ----------------------------------------------------------------------------------------------

    async def append(
        self, lane_id: str, expected_last_seq: int | None, append_id: str, events: Sequence[NewEvent]
    ) -> AppendReceipt:
        """Append ``events`` after ``expected_last_seq`` (None: after whatever the lane holds now, read under its
        lock — for a writer that owns the lane and would only have read it first)."""
        if expected_last_seq is not None:
            check_expected_seq(expected_last_seq)
        events = list(events)
        digest = batch_digest(events)
        lane = self._held_lanes.get(lane_id) or await self.get_lane(lane_id, lock=True)
        if expected_last_seq is None:
            expected_last_seq = lane.last_seq
        row, used_ids = await self._append_and_used_ids(append_id, events)
        if row is not None:
            if row[1] != lane_id or row[2] != digest:
                raise IdempotencyViolation(f"append {append_id} was already used for different events")
            return AppendReceipt(
                append_id=row[0],
                lane_id=row[1],
                digest=row[2],
                first_seq=int(row[3]),
                last_seq=int(row[4]),
                event_ids=tuple(loads(row[5])),
                committed_at=parse_time(row[6]),
            )
        if lane.last_seq != expected_last_seq:
            raise LaneConflict(lane_id, expected_last_seq, lane.last_seq)
        usages = await check_batch(lane, events, self, used_ids=used_ids)
        now = time_text(self._tx.now())
        rows = [
            (
                event.id,
                lane_id,
                lane.last_seq + offset,
                event.subject_id,
                event.event_type,
                event.actor_id,
                time_text(event.occurred_at),
                dumps(event.payload),
                dumps(event.extensions),
                event.causation_id,
                event.schema_version,
                append_id,
                now,
                None if usage is None else usage.input_tokens,
                None if usage is None else usage.output_tokens,
                None if usage is None else usage.cost_usd,
            )
            for offset, (event, usage) in enumerate(zip(events, usages, strict=True), start=1)
        ]
        # one statement per batch, not one per event
        await self._tx.insert_rows("ledger_events", f"{_EVENT}, input_tokens, output_tokens, cost_usd", rows)
        receipt = AppendReceipt(
            append_id=append_id,
            lane_id=lane_id,
            first_seq=lane.last_seq + 1,
            last_seq=lane.last_seq + len(events),
            digest=digest,
            event_ids=tuple(event.id for event in events),
            committed_at=parse_time(now),
        )
        await self._tx.execute(
            "INSERT INTO ledger_appends (id, lane_id, digest, first_seq, last_seq, event_ids, committed_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (append_id, lane_id, digest, receipt.first_seq, receipt.last_seq, dumps(list(receipt.event_ids)), now),
        )
        await self._tx.execute("UPDATE ledger_lanes SET last_seq = ? WHERE id = ?", (receipt.last_seq, lane_id))
        self._held_lanes[lane_id] = dataclasses.replace(lane, last_seq=receipt.last_seq)
        fresh = self._fresh_attempts
        if fresh:
            for event in events:
                if (progress := fresh.get(event.subject_id)) is not None:
                    if event.event_type == EventType.ATTEMPT_REQUESTED:
                        fresh[event.subject_id] = (True, progress[1])
                    elif event.event_type in ATTEMPT_TERMINAL_EVENTS:
                        fresh[event.subject_id] = (progress[0], True)
        return receipt

    async def _append_and_used_ids(
        self, append_id: str, events: Sequence[NewEvent]
    ) -> tuple[tuple[Any, ...] | None, set[str] | None]:
        """The stored append ``append_id`` (a repeat) and which of the batch's event ids are stored already, in one
        read when the batch is small and its ids are plain text (None: left to `check_batch`, which checks them)."""
        columns = "id, lane_id, digest, first_seq, last_seq, event_ids, committed_at"
        ids = [event.id for event in events if isinstance(event, NewEvent)]
        if (
            len(ids) != len(events)
            or not 0 < len(ids) <= _IDS_PER_QUERY
            or not all(isinstance(i, str) and i for i in ids)
        ):
            row = await self._tx.fetch_one(f"SELECT {columns} FROM ledger_appends WHERE id = ?", (append_id,))
            return row, None
        rows = await self._tx.fetch(
            f"SELECT 'append', {columns} FROM ledger_appends WHERE id = ? UNION ALL "
            "SELECT 'event', id, NULL, NULL, NULL, NULL, NULL, NULL FROM ledger_events "
            f"WHERE id IN ({', '.join('?' * len(ids))})",
            (append_id, *ids),
        )
        stored = next((tuple(r[1:]) for r in rows if r[0] == "append"), None)
        return stored, {str(r[1]) for r in rows if r[0] == "event"}

    async def load_lane(self, lane_id: str, after_seq: int = 0) -> list[Event]:
        check_expected_seq(after_seq, "after_seq")
        await self.get_lane(lane_id)
        rows = await self._tx.fetch(
            f"SELECT {_EVENT} FROM ledger_events WHERE lane_id = ? AND seq > ? ORDER BY seq", (lane_id, after_seq)
        )
        return [_event(row) for row in rows]

    async def view(self, scope: Scope) -> LedgerView:
        lanes = await self.find_lanes(scope)
        where, params = _scope_sql(scope, "l")
        rows = await self._tx.fetch(
            f"SELECT {_prefixed(_EVENT, 'e')} FROM ledger_lanes l CROSS JOIN ledger_events e "
            f"WHERE e.lane_id = l.id AND {where} ORDER BY l.created_at, l.id, e.seq",
            params,
        )
        return LedgerView(lanes=lanes, events=[_event(row) for row in rows])

    async def structure(self, scope: Scope) -> LedgerStructure:
        where, params = _scope_sql(scope, "l")
        turns = await self._tx.fetch(
            f"SELECT {_prefixed(_TURN, 't')} FROM ledger_lanes l CROSS JOIN ledger_turns t "
            f"WHERE t.lane_id = l.id AND {where} ORDER BY t.created_at, t.id",
            params,
        )
        actions = await self._tx.fetch(
            f"SELECT {_prefixed(_ACTION, 'c')} FROM ledger_lanes l CROSS JOIN ledger_turns t "
            f"CROSS JOIN ledger_actions c WHERE t.lane_id = l.id AND c.turn_id = t.id AND {where} "
            "ORDER BY c.created_at, c.id",
            params,
        )
        attempts = await self._tx.fetch(
            f"SELECT {_prefixed(_ATTEMPT, 'a')} FROM ledger_lanes l CROSS JOIN ledger_turns t "
            f"CROSS JOIN ledger_actions c CROSS JOIN ledger_attempts a "
            f"WHERE t.lane_id = l.id AND c.turn_id = t.id AND a.action_id = c.id AND {where} "
            "ORDER BY a.created_at, a.id",
            params,
        )
        return LedgerStructure(
            turns=[_turn(row) for row in turns],
            actions=[_action(row) for row in actions],
            attempts=[_attempt(row) for row in attempts],
        )

    async def unresolved_attempts(self, scope: Scope) -> list[UnresolvedAttempt]:
        where, params = _scope_sql(scope, "l")
        rows = await self._tx.fetch(
            f"SELECT {_prefixed(_EVENT, 'e')}, {_prefixed(_ATTEMPT, 'a')}, {_prefixed(_ACTION, 'c')} "
            "FROM ledger_lanes l CROSS JOIN ledger_events e "
            "JOIN ledger_attempts a ON a.id = e.subject_id JOIN ledger_actions c ON c.id = a.action_id "
            f"WHERE e.lane_id = l.id AND e.event_type = 'attempt.requested' AND {where} "
            "AND NOT EXISTS (SELECT 1 FROM ledger_events t "
            f"WHERE t.subject_id = e.subject_id AND t.event_type IN {_TERMINAL}) "
            "ORDER BY l.created_at, l.id, e.seq",
            params,
        )
        event_width, attempt_width = len(_EVENT.split(",")), len(_ATTEMPT.split(","))
        return [
            UnresolvedAttempt(
                attempt=_attempt(row[event_width : event_width + attempt_width]),
                action=_action(row[event_width + attempt_width :]),
                requested=_event(row[:event_width]),
            )
            for row in rows
        ]

    async def usage(self, scope: Scope) -> UsageTotals:
        where, params = _scope_sql(scope, "l")
        row = await self._tx.fetch_one(
            "SELECT COALESCE(SUM(e.input_tokens), 0), COALESCE(SUM(e.output_tokens), 0), "
            "COALESCE(SUM(e.cost_usd), 0), COALESCE(SUM(CASE WHEN e.event_type = 'attempt.completed' THEN 1 ELSE 0 "
            "END), 0) FROM ledger_lanes l CROSS JOIN ledger_events e "
            f"WHERE e.lane_id = l.id AND e.event_type IN {_TERMINAL} AND {where}",
            params,
        )
        if row is None:  # pragma: no cover - an aggregate always returns one row
            return UsageTotals()
        # Estimated / unknown usage is marked in the payload; the LIKE only narrows what is decoded.
        flagged = await self._tx.fetch(
            "SELECT e.payload FROM ledger_lanes l CROSS JOIN ledger_events e "
            f"WHERE e.lane_id = l.id AND e.event_type IN {_TERMINAL} AND e.payload LIKE ? ESCAPE '!' AND {where}",
            ("%usage!_estimated%", *params),
        )
        estimated = sum(1 for (payload,) in flagged if loads(payload).get("usage_estimated") is True)
        return UsageTotals(
            int(row[0]),
            int(row[1]),
            float(row[2]),
            int(row[3]),
            estimated_attempts=estimated,
            usage_estimated=estimated > 0,
        )

    # -- checkpoints -----------------------------------------------------------------------------------------

    async def save_checkpoint(self, expected_revision: int, checkpoint: Checkpoint) -> Checkpoint:
        check_expected_seq(expected_revision, "expected_revision")
        checkpoint = normalize_checkpoint(checkpoint)
        existing = await self._find_checkpoint(checkpoint.id)
        if existing is not None:
            if checkpoint_digest(existing) != checkpoint_digest(checkpoint):
                raise IdempotencyViolation(f"checkpoint {checkpoint.id} was already saved with different content")
            return existing
        current = await self._checkpoint_revision(checkpoint.key)
        if current != expected_revision:
            raise RevisionConflict(checkpoint.key, expected_revision, current)
        anchor = checkpoint.anchor
        if anchor is not None:
            await self.get_lane(anchor.lane_id)
            row = await self._tx.fetch_one(
                "SELECT id FROM ledger_events WHERE lane_id = ? AND seq = ?",
                (anchor.lane_id, anchor.last_applied_seq),
            )
            if row is None or row[0] != anchor.last_applied_event_id:
                raise Conflict("the checkpoint anchor does not match the lane's event at that seq")
        if not await self.actor_exists(checkpoint.actor_id):
            raise NotFound(f"actor {checkpoint.actor_id} not found")
        identity = checkpoint.identity()
        inserted = await self._tx.execute(
            f"INSERT INTO ledger_checkpoints ({_CHECKPOINT}, digest) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT DO NOTHING",
            (
                checkpoint.id,
                checkpoint.key,
                current + 1,
                checkpoint.actor_id,
                checkpoint.format,
                None if checkpoint.state is None else dumps(checkpoint.state),
                None if "artifact_ref" not in identity else dumps(identity["artifact_ref"]),
                None if "anchor" not in identity else dumps(identity["anchor"]),
                dumps(checkpoint.extensions),
                checkpoint.schema_version,
                time_text(self._tx.now()),
                checkpoint_digest(checkpoint),
            ),
        )
        if inserted != 1:  # a concurrent save took this revision (or this id)
            existing = await self._find_checkpoint(checkpoint.id)
            if existing is not None and checkpoint_digest(existing) == checkpoint_digest(checkpoint):
                return existing
            raise RevisionConflict(checkpoint.key, expected_revision, await self._checkpoint_revision(checkpoint.key))
        return await self.get_checkpoint(checkpoint.id)

    async def _checkpoint_revision(self, key: str) -> int:
        row = await self._tx.fetch_one("SELECT MAX(revision) FROM ledger_checkpoints WHERE checkpoint_key = ?", (key,))
        return int(row[0]) if row is not None and row[0] is not None else 0

    async def _find_checkpoint(self, checkpoint_id: str) -> Checkpoint | None:
        row = await self._tx.fetch_one(f"SELECT {_CHECKPOINT} FROM ledger_checkpoints WHERE id = ?", (checkpoint_id,))
        return None if row is None else _checkpoint(row)

    async def get_checkpoint(self, checkpoint_id: str) -> Checkpoint:
        found = await self._find_checkpoint(checkpoint_id)
        if found is None:
            raise NotFound(f"checkpoint {checkpoint_id} not found")
        return found

    async def load_latest_checkpoint(self, key: str) -> Checkpoint | None:
        row = await self._tx.fetch_one(
            f"SELECT {_CHECKPOINT} FROM ledger_checkpoints WHERE checkpoint_key = ? ORDER BY revision DESC LIMIT 1",
            (key,),
        )
        return None if row is None else _checkpoint(row)

    # -- artifacts (prompts and replies) --------------------------------------------------------------------

    async def put_artifacts(self, lane_id: str, blobs: Sequence[ArtifactBlob]) -> None:
        """Store ``blobs`` (once per content) and note that ``lane_id`` uses them: two statements in all."""
        unique = list({blob.ref.sha256: blob for blob in blobs}.values())
        if not unique:
            return
        now = time_text(self._tx.now())
        await self._tx.execute(
            "INSERT INTO ledger_artifacts (sha256, content_type, size, body, created_at) VALUES "
            + ", ".join(["(?, ?, ?, ?, ?)"] * len(unique))
            + " ON CONFLICT (sha256) DO NOTHING",
            [
                value
                for blob in unique
                for value in (blob.ref.sha256, blob.ref.content_type, blob.ref.size, blob.body.decode(), now)
            ],
        )
        await self._tx.execute(
            "INSERT INTO ledger_artifact_uses (sha256, lane_id) VALUES "
            + ", ".join(["(?, ?)"] * len(unique))
            + " ON CONFLICT (sha256, lane_id) DO NOTHING",
            [value for blob in unique for value in (blob.ref.sha256, lane_id)],
        )

    async def get_artifact(self, sha256: str) -> ArtifactBlob:
        row = await self._tx.fetch_one(
            "SELECT sha256, content_type, size, body FROM ledger_artifacts WHERE sha256 = ?", (sha256,)
        )
        if row is None:
            raise NotFound(f"artifact {sha256} not found (never stored, or removed by the ledger's retention)")
        body = str(row[3]).encode()
        return ArtifactBlob(ArtifactRef(f"{URI_PREFIX}{row[0]}", str(row[0]), int(row[2]), str(row[1])), body)

    async def prune_artifacts(self, before: datetime) -> int:
        """Forget the artifacts of lanes with no event committed since ``before``; returns how many were deleted
        (an artifact another, newer lane uses too stays)."""
        cutoff = time_text(before)
        await self._tx.execute(
            "DELETE FROM ledger_artifact_uses WHERE lane_id IN (SELECT l.id FROM ledger_lanes l WHERE NOT EXISTS "
            "(SELECT 1 FROM ledger_events e WHERE e.lane_id = l.id AND e.committed_at >= ?))",
            (cutoff,),
        )
        return await self._tx.execute(
            "DELETE FROM ledger_artifacts WHERE created_at < ? AND NOT EXISTS "
            "(SELECT 1 FROM ledger_artifact_uses u WHERE u.sha256 = ledger_artifacts.sha256)",
            (cutoff,),
        )

    async def cost_rows(self, since: datetime) -> list[CostRow]:
        """What the attempts that ended since ``since`` spent, summed per lane and action name."""
        rows = await self._tx.fetch(
            "SELECT l.id, l.conversation_id, l.task_id, l.attributes, c.name, c.action_type, SUM(e.input_tokens), "
            "SUM(e.output_tokens), SUM(e.cost_usd), COUNT(*) FROM ledger_events e "
            "JOIN ledger_attempts a ON a.id = e.subject_id JOIN ledger_actions c ON c.id = a.action_id "
            f"JOIN ledger_lanes l ON l.id = e.lane_id WHERE e.event_type IN {_TERMINAL} "
            "AND e.input_tokens IS NOT NULL AND e.occurred_at >= ? "
            "GROUP BY l.id, l.conversation_id, l.task_id, l.attributes, c.name, c.action_type",
            (time_text(since),),
        )
        return [
            CostRow(
                lane_id=row[0],
                conversation_id=row[1],
                task_id=row[2],
                target=_text_or_none(loads(row[3]).get("target")),
                model=row[4] if row[5] in (str(ActionType.MODEL_CALL), str(ActionType.COMPACT)) else None,
                input_tokens=int(row[6] or 0),
                output_tokens=int(row[7] or 0),
                cost_usd=float(row[8] or 0.0),
                attempts=int(row[9]),
            )
            for row in rows
        ]


def _text_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


class _Joined:
    """The SQL of a transaction a store joined, for one call (nothing to begin or end)."""

    __slots__ = ("_sql",)

    def __init__(self, sql: _LedgerSql) -> None:
        self._sql = sql

    async def __aenter__(self) -> _LedgerSql:
        return self._sql

    async def __aexit__(self, *_exc: object) -> None:
        return None


class SqlLedgerStore:
    """A ``LedgerStore`` on the loop-server database."""

    def __init__(
        self,
        database: Database | None = None,
        *,
        transaction: TransactionCore | None = None,
        facts: LedgerFacts | None = None,
    ) -> None:
        if (database is None) == (transaction is None):
            raise TypeError("SqlLedgerStore needs exactly one of a database or an open transaction")
        self._database = database
        self._facts = facts
        # Bound to a transaction: one `_LedgerSql` for the store's life, which remembers what the transaction did.
        self._bound = None if transaction is None else _LedgerSql(transaction, facts, transaction.memo(_Done, _Done))

    @classmethod
    def within(cls, transaction: TransactionCore, *, facts: LedgerFacts | None = None) -> SqlLedgerStore:
        """A store whose calls run inside ``transaction`` (committed or rolled back by its owner). With ``facts``
        (one per writer, see `LedgerFacts`), what earlier committed transactions established is not read again."""
        return cls(transaction=transaction, facts=facts)

    def _sql(self, *, read_only: bool = False) -> AbstractAsyncContextManager[_LedgerSql]:
        if self._bound is not None:
            return _Joined(self._bound)  # (no generator context manager per call: the trail makes ~15 a chat)
        return self._own_transaction(read_only)

    @asynccontextmanager
    async def _own_transaction(self, read_only: bool) -> AsyncIterator[_LedgerSql]:
        assert self._database is not None  # guaranteed by __init__
        async with self._database.transaction(read_only=read_only) as tx:
            yield _LedgerSql(tx, self._facts)

    async def create_actor(self, actor: Actor) -> Actor:
        async with self._sql() as sql:
            return await sql.create_actor(actor)

    async def get_actor(self, actor_id: str) -> Actor:
        async with self._sql(read_only=True) as sql:
            return await sql.get_actor(actor_id)

    async def get_actor_by_key(self, key: str) -> Actor | None:
        async with self._sql(read_only=True) as sql:
            return await sql.get_actor_by_key(key)

    async def ensure_actor(self, actor: Actor) -> Actor:
        async with self._sql() as sql:
            return await sql.ensure_actor(actor)

    async def create_lane(self, lane: Lane) -> Lane:
        async with self._sql() as sql:
            return await sql.create_lane(lane)

    async def get_lane(self, lane_id: str) -> Lane:
        async with self._sql(read_only=True) as sql:
            return await sql.get_lane(lane_id)

    async def find_lane(self, session_id: str, run_id: str, name: str) -> Lane | None:
        async with self._sql(read_only=True) as sql:
            return await sql.find_lane(session_id, run_id, name)

    async def find_lanes(self, scope: Scope) -> list[Lane]:
        async with self._sql(read_only=True) as sql:
            return await sql.find_lanes(scope)

    async def create_turn(self, turn: Turn) -> Turn:
        async with self._sql() as sql:
            return await sql.create_turn(turn)

    async def create_action(self, action: Action) -> Action:
        async with self._sql() as sql:
            return await sql.create_action(action)

    async def create_attempt(self, attempt: Attempt) -> Attempt:
        async with self._sql() as sql:
            return await sql.create_attempt(attempt)

    async def get_attempt(self, attempt_id: str) -> Attempt:
        async with self._sql(read_only=True) as sql:
            return await sql.get_attempt(attempt_id)

    async def append(
        self, lane_id: str, expected_last_seq: int, append_id: str, events: Sequence[NewEvent]
    ) -> AppendReceipt:
        async with self._sql() as sql:
            return await sql.append(lane_id, expected_last_seq, append_id, events)

    async def append_next(self, lane_id: str, append_id: str, events: Sequence[NewEvent]) -> AppendReceipt:
        """`append` after whatever the lane holds now (read under the lane's lock, in the same statement sequence):
        for the lane's one writer, which would otherwise read the lane only to name its last seq."""
        async with self._sql() as sql:
            return await sql.append(lane_id, None, append_id, events)

    async def load_lane(self, lane_id: str, after_seq: int = 0) -> list[Event]:
        async with self._sql(read_only=True) as sql:
            return await sql.load_lane(lane_id, after_seq)

    async def load_run(self, session_id: str, run_id: str) -> LedgerView:
        async with self._sql(read_only=True) as sql:
            return await sql.view(Scope(session_id=session_id, run_id=run_id))

    async def load_session(self, session_id: str) -> LedgerView:
        async with self._sql(read_only=True) as sql:
            return await sql.view(Scope(session_id=session_id))

    async def structure(self, scope: Scope) -> LedgerStructure:
        async with self._sql(read_only=True) as sql:
            return await sql.structure(scope)

    async def unresolved_attempts(self, scope: Scope) -> list[UnresolvedAttempt]:
        async with self._sql(read_only=True) as sql:
            return await sql.unresolved_attempts(scope)

    async def usage(self, scope: Scope) -> UsageTotals:
        async with self._sql(read_only=True) as sql:
            return await sql.usage(scope)

    async def save_checkpoint(self, expected_revision: int, checkpoint: Checkpoint) -> Checkpoint:
        async with self._sql() as sql:
            return await sql.save_checkpoint(expected_revision, checkpoint)

    async def get_checkpoint(self, checkpoint_id: str) -> Checkpoint:
        async with self._sql(read_only=True) as sql:
            return await sql.get_checkpoint(checkpoint_id)

    async def load_latest_checkpoint(self, key: str) -> Checkpoint | None:
        async with self._sql(read_only=True) as sql:
            return await sql.load_latest_checkpoint(key)

    async def put_artifacts(self, lane_id: str, blobs: Sequence[ArtifactBlob]) -> None:
        """Store content-addressed artifacts used by ``lane_id`` (identical content once)."""
        async with self._sql() as sql:
            await sql.put_artifacts(lane_id, blobs)

    async def get_artifact(self, sha256: str) -> ArtifactBlob:
        """The stored artifact, or ``NotFound`` (never stored, or pruned by retention)."""
        async with self._sql(read_only=True) as sql:
            return await sql.get_artifact(sha256)

    async def prune_artifacts(self, before: datetime) -> int:
        """Retention: delete the artifacts of lanes idle since before ``before``; returns how many went."""
        async with self._sql() as sql:
            return await sql.prune_artifacts(before)

    async def cost_rows(self, since: datetime) -> list[CostRow]:
        """Spend since ``since`` per lane and action name (the input of ``loopd cost``)."""
        async with self._sql(read_only=True) as sql:
            return await sql.cost_rows(since)
