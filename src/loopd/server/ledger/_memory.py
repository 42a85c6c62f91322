"""``MemoryLedgerStore``: the ledger contract in process memory, for tests and ephemeral runs.

Owns: dictionaries of entities, events, append receipts and checkpoints. Every method runs without awaiting
anything that yields to other tasks between its checks and its writes, so each call is atomic on the event loop.
Must not do: persist anything.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from datetime import datetime

from loopd.server.storage import Conflict, NotFound, utc_now

from ._errors import IdempotencyViolation, LaneConflict, RevisionConflict
from ._records import (
    Action,
    Actor,
    AppendReceipt,
    Attempt,
    Checkpoint,
    Event,
    Lane,
    LedgerView,
    NewEvent,
    Scope,
    Turn,
    UnresolvedAttempt,
    Usage,
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
from ._vocabulary import ATTEMPT_TERMINAL_EVENTS, EventType, SubjectKind


class MemoryLedgerStore:
    """A ``LedgerStore`` held in memory."""

    def __init__(self, *, clock: Callable[[], datetime] = utc_now) -> None:
        self._clock = clock
        self._actors: dict[str, Actor] = {}
        self._actor_keys: dict[str, str] = {}
        self._lanes: dict[str, Lane] = {}
        self._lane_names: dict[tuple[str, str, str], str] = {}
        self._turns: dict[str, Turn] = {}
        self._actions: dict[str, Action] = {}
        self._attempts: dict[str, Attempt] = {}
        self._attempt_numbers: dict[tuple[str, int], str] = {}
        self._events: dict[str, list[Event]] = {}
        self._events_by_id: dict[str, Event] = {}
        self._usage: dict[str, Usage] = {}
        self._requested: dict[str, Event] = {}
        self._finished: set[str] = set()
        self._appends: dict[str, AppendReceipt] = {}
        self._checkpoints: dict[str, Checkpoint] = {}
        self._checkpoint_heads: dict[str, list[Checkpoint]] = {}

    # -- lookups for the shared batch rules ------------------------------------------------------------------

    async def entity_lane(self, kind: SubjectKind, entity_id: str) -> str | None:
        entity: Turn | Action | Attempt | None
        if kind is SubjectKind.TURN:
            entity = self._turns.get(entity_id)
        elif kind is SubjectKind.ACTION:
            entity = self._actions.get(entity_id)
        else:
            entity = self._attempts.get(entity_id)
        return None if entity is None else entity.lane_id

    async def lane_session(self, lane_id: str) -> str | None:
        lane = self._lanes.get(lane_id)
        return None if lane is None else lane.session_id

    async def event_session(self, event_id: str) -> str | None:
        event = self._events_by_id.get(event_id)
        return None if event is None else self._lanes[event.lane_id].session_id

    async def actor_exists(self, actor_id: str) -> bool:
        return actor_id in self._actors

    async def attempt_progress(self, attempt_id: str) -> tuple[bool, bool]:
        return attempt_id in self._requested, attempt_id in self._finished

    # -- entities --------------------------------------------------------------------------------------------

    async def create_actor(self, actor: Actor) -> Actor:
        actor = normalize_actor(actor)
        existing = self._actors.get(actor.id)
        if existing is not None:
            same_identity(existing, actor, "actor")
            return existing
        if actor.key is not None and actor.key in self._actor_keys:
            raise Conflict(f"actor key {actor.key!r} already names actor {self._actor_keys[actor.key]}")
        stored = dataclasses.replace(actor, created_at=self._clock())
        self._actors[actor.id] = stored
        if actor.key is not None:
            self._actor_keys[actor.key] = actor.id
        return stored

    async def get_actor(self, actor_id: str) -> Actor:
        actor = self._actors.get(actor_id)
        if actor is None:
            raise NotFound(f"actor {actor_id} not found")
        return actor

    async def get_actor_by_key(self, key: str) -> Actor | None:
        actor_id = self._actor_keys.get(key)
        return None if actor_id is None else self._actors[actor_id]

    async def ensure_actor(self, actor: Actor) -> Actor:
        actor = normalize_actor(actor)
        if actor.key is None:
            raise Conflict("ensure_actor needs an actor key")
        existing = await self.get_actor_by_key(actor.key)
        if existing is None:
            return await self.create_actor(actor)
        same_identity(existing, dataclasses.replace(actor, id=existing.id), "actor")
        return existing

    async def create_lane(self, lane: Lane) -> Lane:
        lane = normalize_lane(lane)
        existing = self._lanes.get(lane.id)
        if existing is not None:
            same_identity(existing, lane, "lane")
            return existing
        name = (lane.session_id, lane.run_id, lane.name)
        if name in self._lane_names:
            raise Conflict(f"run {lane.run_id} of session {lane.session_id} already has a lane {lane.name!r}")
        if lane.parent_lane_id is not None:
            parent = await self.get_lane(lane.parent_lane_id)
            if parent.session_id != lane.session_id:
                raise Conflict(f"parent lane {parent.id} belongs to another session")
        stored = dataclasses.replace(lane, created_at=self._clock())
        self._lanes[lane.id] = stored
        self._lane_names[name] = lane.id
        self._events[lane.id] = []
        return stored

    async def get_lane(self, lane_id: str) -> Lane:
        lane = self._lanes.get(lane_id)
        if lane is None:
            raise NotFound(f"lane {lane_id} not found")
        return lane

    async def find_lane(self, session_id: str, run_id: str, name: str) -> Lane | None:
        lane_id = self._lane_names.get((session_id, run_id, name))
        return None if lane_id is None else self._lanes[lane_id]

    async def find_lanes(self, scope: Scope) -> list[Lane]:
        scope.filters()
        return [lane for lane in self._ordered_lanes() if scope.matches(lane)]

    async def create_turn(self, turn: Turn) -> Turn:
        turn = normalize_turn(turn)
        existing = self._turns.get(turn.id)
        if existing is not None:
            same_identity(existing, turn, "turn")
            return existing
        await self.get_lane(turn.lane_id)
        stored = dataclasses.replace(turn, created_at=self._clock())
        self._turns[turn.id] = stored
        return stored

    async def create_action(self, action: Action) -> Action:
        action = normalize_action(action)
        existing = self._actions.get(action.id)
        if existing is not None:
            same_identity(existing, action, "action")
            return existing
        turn = self._turns.get(action.turn_id)
        if turn is None:
            raise NotFound(f"turn {action.turn_id} not found")
        if action.parent_action_id is not None:
            parent = self._actions.get(action.parent_action_id)
            if parent is None:
                raise NotFound(f"parent action {action.parent_action_id} not found")
            if parent.lane_id != turn.lane_id:
                raise Conflict(f"parent action {parent.id} belongs to another lane")
        stored = dataclasses.replace(action, lane_id=turn.lane_id, created_at=self._clock())
        self._actions[action.id] = stored
        return stored

    async def create_attempt(self, attempt: Attempt) -> Attempt:
        attempt = normalize_attempt(attempt)
        existing = self._attempts.get(attempt.id)
        if existing is not None:
            if attempt.attempt_no is None:
                attempt = dataclasses.replace(attempt, attempt_no=existing.attempt_no)
            same_identity(existing, attempt, "attempt")
            return existing
        action = self._actions.get(attempt.action_id)
        if action is None:
            raise NotFound(f"action {attempt.action_id} not found")
        number = attempt.attempt_no
        if number is None:
            used = [no for (action_id, no) in self._attempt_numbers if action_id == action.id]
            number = max(used, default=0) + 1
        if (action.id, number) in self._attempt_numbers:
            raise Conflict(f"action {action.id} already has attempt {number}")
        stored = dataclasses.replace(attempt, attempt_no=number, lane_id=action.lane_id, created_at=self._clock())
        self._attempts[attempt.id] = stored
        self._attempt_numbers[(action.id, number)] = attempt.id
        return stored

    async def get_attempt(self, attempt_id: str) -> Attempt:
        attempt = self._attempts.get(attempt_id)
        if attempt is None:
            raise NotFound(f"attempt {attempt_id} not found")
        return attempt

    # -- events ----------------------------------------------------------------------------------------------

    async def append(
        self, lane_id: str, expected_last_seq: int, append_id: str, events: Sequence[NewEvent]
    ) -> AppendReceipt:
        check_expected_seq(expected_last_seq)
        lane = await self.get_lane(lane_id)
        events = list(events)
        digest = batch_digest(events)
        previous = self._appends.get(append_id)
        if previous is not None:
            if previous.lane_id != lane_id or previous.digest != digest:
                raise IdempotencyViolation(f"append {append_id} was already used for different events")
            return previous
        if lane.last_seq != expected_last_seq:
            raise LaneConflict(lane_id, expected_last_seq, lane.last_seq)
        usages = await check_batch(lane, events, self)
        # No await below: the batch lands as a whole.
        now = self._clock()
        stored = [
            Event(
                id=event.id,
                lane_id=lane_id,
                seq=lane.last_seq + offset,
                subject_id=event.subject_id,
                event_type=event.event_type,
                actor_id=event.actor_id,
                occurred_at=event.occurred_at,
                payload=event.payload,
                extensions=event.extensions,
                causation_id=event.causation_id,
                schema_version=event.schema_version,
                append_id=append_id,
                committed_at=now,
            )
            for offset, event in enumerate(events, start=1)
        ]
        for event, usage in zip(stored, usages, strict=True):
            self._events[lane_id].append(event)
            self._events_by_id[event.id] = event
            if usage is not None:
                self._usage[event.id] = usage
            if event.event_type == EventType.ATTEMPT_REQUESTED:
                self._requested[event.subject_id] = event
            elif event.event_type in ATTEMPT_TERMINAL_EVENTS:
                self._finished.add(event.subject_id)
        receipt = AppendReceipt(
            append_id=append_id,
            lane_id=lane_id,
            first_seq=stored[0].seq,
            last_seq=stored[-1].seq,
            digest=digest,
            event_ids=tuple(event.id for event in stored),
            committed_at=now,
        )
        self._appends[append_id] = receipt
        self._lanes[lane_id] = dataclasses.replace(lane, last_seq=receipt.last_seq)
        return receipt

    async def load_lane(self, lane_id: str, after_seq: int = 0) -> list[Event]:
        check_expected_seq(after_seq, "after_seq")
        await self.get_lane(lane_id)
        return self._events[lane_id][after_seq:]

    def _ordered_lanes(self) -> list[Lane]:
        return sorted(self._lanes.values(), key=lambda lane: (lane.created_at or self._clock(), lane.id))

    def _view(self, lanes: list[Lane]) -> LedgerView:
        return LedgerView(lanes=lanes, events=[event for lane in lanes for event in self._events[lane.id]])

    async def load_run(self, session_id: str, run_id: str) -> LedgerView:
        return self._view(await self.find_lanes(Scope(session_id=session_id, run_id=run_id)))

    async def load_session(self, session_id: str) -> LedgerView:
        return self._view(await self.find_lanes(Scope(session_id=session_id)))

    async def unresolved_attempts(self, scope: Scope) -> list[UnresolvedAttempt]:
        found: list[UnresolvedAttempt] = []
        for lane in await self.find_lanes(scope):
            for event in self._events[lane.id]:
                if event.event_type == EventType.ATTEMPT_REQUESTED and event.subject_id not in self._finished:
                    attempt = self._attempts[event.subject_id]
                    found.append(UnresolvedAttempt(attempt, self._actions[attempt.action_id], event))
        return found

    async def usage(self, scope: Scope) -> UsageTotals:
        tokens_in = tokens_out = completed = estimated = 0
        cost = 0.0
        for lane in await self.find_lanes(scope):
            for event in self._events[lane.id]:
                if event.event_type not in ATTEMPT_TERMINAL_EVENTS:
                    continue
                usage = self._usage.get(event.id, Usage())
                tokens_in += usage.input_tokens
                tokens_out += usage.output_tokens
                cost += usage.cost_usd
                completed += event.event_type == EventType.ATTEMPT_COMPLETED
                estimated += event.payload.get("usage_estimated") is True
        return UsageTotals(tokens_in, tokens_out, cost, completed, estimated, estimated > 0)

    # -- checkpoints -----------------------------------------------------------------------------------------

    async def save_checkpoint(self, expected_revision: int, checkpoint: Checkpoint) -> Checkpoint:
        check_expected_seq(expected_revision, "expected_revision")
        checkpoint = normalize_checkpoint(checkpoint)
        existing = self._checkpoints.get(checkpoint.id)
        if existing is not None:
            if checkpoint_digest(existing) != checkpoint_digest(checkpoint):
                raise IdempotencyViolation(f"checkpoint {checkpoint.id} was already saved with different content")
            return existing
        history = self._checkpoint_heads.setdefault(checkpoint.key, [])
        current = history[-1].revision if history else 0
        if current != expected_revision:
            raise RevisionConflict(checkpoint.key, expected_revision, current)
        anchor = checkpoint.anchor
        if anchor is not None:
            await self.get_lane(anchor.lane_id)
            events = self._events[anchor.lane_id]
            if len(events) < anchor.last_applied_seq or events[anchor.last_applied_seq - 1].id != (
                anchor.last_applied_event_id
            ):
                raise Conflict("the checkpoint anchor does not match the lane's event at that seq")
        if not await self.actor_exists(checkpoint.actor_id):
            raise NotFound(f"actor {checkpoint.actor_id} not found")
        stored = dataclasses.replace(checkpoint, revision=current + 1, created_at=self._clock())
        history.append(stored)
        self._checkpoints[stored.id] = stored
        return stored

    async def get_checkpoint(self, checkpoint_id: str) -> Checkpoint:
        checkpoint = self._checkpoints.get(checkpoint_id)
        if checkpoint is None:
            raise NotFound(f"checkpoint {checkpoint_id} not found")
        return checkpoint

    async def load_latest_checkpoint(self, key: str) -> Checkpoint | None:
        history = self._checkpoint_heads.get(key)
        return history[-1] if history else None
