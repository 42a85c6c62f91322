"""Checks shared by every ledger store: entity shapes, the append batch rules, digests.

Owns: ``normalize_*`` (validate an entity and coerce its enums), ``batch_digest`` and ``check_batch``, which
reads what it needs through the small ``Lookups`` protocol so the memory and SQL stores apply identical rules.
Must not do: write anything.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Protocol

from loopd.server.storage import (
    Conflict,
    InvalidRecord,
    NotFound,
    digest,
    dumps,
    require_object,
    require_text,
    time_text,
)

from ._records import Action, Actor, Attempt, Checkpoint, Lane, NewEvent, Turn, Usage
from ._vocabulary import (
    ATTEMPT_TERMINAL_EVENTS,
    ActionType,
    EffectKind,
    EventType,
    Idempotency,
    SubjectKind,
    subject_kind,
)


def _optional_text(value: Any, what: str) -> None:
    if value is not None:
        require_text(value, what)


def _enum(enum_type: Any, value: Any, what: str) -> Any:
    try:
        return enum_type(value)
    except ValueError:
        allowed = ", ".join(member.value for member in enum_type)
        raise InvalidRecord(f"{what} must be one of {allowed}, not {value!r}") from None


def same_identity(stored: Any, proposed: Any, what: str) -> None:
    """Creating an id again is fine only with the identical fields (ownership is immutable)."""
    if digest(stored.identity()) != digest(proposed.identity()):
        raise Conflict(f"{what} {proposed.id} already exists with different fields")


def normalize_actor(actor: Actor) -> Actor:
    require_text(actor.id, "actor id")
    require_text(actor.type, "actor type")
    _optional_text(actor.key, "actor key")
    _optional_text(actor.framework, "actor framework")
    require_object(actor.attributes, "actor attributes")
    dumps(actor.identity())  # JSON-able (InvalidRecord otherwise)
    return actor


def normalize_lane(lane: Lane) -> Lane:
    for name in ("id", "session_id", "run_id", "name"):
        require_text(getattr(lane, name), f"lane {name}")
    for name in ("parent_lane_id", "task_id", "conversation_id", "harness_call_id"):
        _optional_text(getattr(lane, name), f"lane {name}")
    require_object(lane.attributes, "lane attributes")
    dumps(lane.identity())  # JSON-able (InvalidRecord otherwise)
    return dataclasses.replace(lane, last_seq=0)


def normalize_turn(turn: Turn) -> Turn:
    require_text(turn.id, "turn id")
    require_text(turn.lane_id, "turn lane_id")
    require_object(turn.attributes, "turn attributes")
    dumps(turn.identity())  # JSON-able (InvalidRecord otherwise)
    return turn


def normalize_action(action: Action) -> Action:
    require_text(action.id, "action id")
    require_text(action.turn_id, "action turn_id")
    _optional_text(action.name, "action name")
    _optional_text(action.parent_action_id, "action parent_action_id")
    require_object(action.attributes, "action attributes")
    action = dataclasses.replace(
        action,
        type=_enum(ActionType, action.type, "action type"),
        effect_kind=_enum(EffectKind, action.effect_kind, "effect kind"),
        idempotency=_enum(Idempotency, action.idempotency, "idempotency"),
    )
    dumps(action.identity())  # JSON-able (InvalidRecord otherwise)
    return action


def normalize_attempt(attempt: Attempt) -> Attempt:
    require_text(attempt.id, "attempt id")
    require_text(attempt.action_id, "attempt action_id")
    number = attempt.attempt_no
    if number is not None and (isinstance(number, bool) or not isinstance(number, int) or number < 1):
        raise InvalidRecord(f"attempt_no must be a positive integer, not {number!r}")
    return attempt


def normalize_checkpoint(checkpoint: Checkpoint) -> Checkpoint:
    for name in ("id", "key", "actor_id", "format", "schema_version"):
        require_text(getattr(checkpoint, name), f"checkpoint {name}")
    if (checkpoint.state is None) == (checkpoint.artifact_ref is None):
        raise InvalidRecord("a checkpoint has exactly one of state and artifact_ref")
    ref = checkpoint.artifact_ref
    if ref is not None:
        for name in ("uri", "sha256", "content_type"):
            require_text(getattr(ref, name), f"artifact_ref {name}")
        if isinstance(ref.size, bool) or not isinstance(ref.size, int) or ref.size < 0:
            raise InvalidRecord("artifact_ref size must be a non-negative integer")
    anchor = checkpoint.anchor
    if anchor is not None:
        require_text(anchor.lane_id, "anchor lane_id")
        require_text(anchor.last_applied_event_id, "anchor last_applied_event_id")
        seq = anchor.last_applied_seq
        if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
            raise InvalidRecord("anchor last_applied_seq must be a positive integer")
    require_object(checkpoint.extensions, "checkpoint extensions")
    dumps(checkpoint.identity())  # JSON-able (InvalidRecord otherwise)
    return dataclasses.replace(checkpoint, revision=0, created_at=None)


def checkpoint_digest(checkpoint: Checkpoint) -> str:
    """What must match when a checkpoint id is saved again."""
    return digest(checkpoint.identity())


def check_expected_seq(value: Any, what: str = "expected_last_seq") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidRecord(f"{what} must be a non-negative integer, not {value!r}")
    return value


def batch_digest(events: Sequence[NewEvent]) -> str:
    """SHA-256 of the canonical JSON of the ordered proposed events (see ``storage.canonical_json``)."""
    return digest([event.canonical() for event in events])


class Lookups(Protocol):
    """What ``check_batch`` needs to know about stored facts."""

    async def entity_lane(self, kind: SubjectKind, entity_id: str) -> str | None:
        """The lane of a turn, action or attempt (None if it does not exist)."""
        ...

    async def lane_session(self, lane_id: str) -> str | None: ...

    async def event_session(self, event_id: str) -> str | None:
        """The session of a stored event's lane (None if no such event)."""
        ...

    async def used_event_ids(self, event_ids: Sequence[str]) -> set[str]:
        """Which of ``event_ids`` stored events already have."""
        ...

    async def actor_exists(self, actor_id: str) -> bool: ...

    async def attempt_progress(self, attempt_id: str) -> tuple[bool, bool]:
        """Whether the attempt has a stored ``attempt.requested`` and a stored terminal event."""
        ...


async def check_batch(
    lane: Lane, events: Sequence[NewEvent], lookups: Lookups, *, used_ids: set[str] | None = None
) -> list[Usage | None]:
    """Validate a proposed batch for ``lane``; returns the usage each event reports (for roll-ups). ``used_ids``:
    which of the batch's event ids are already stored, when the caller read that itself (else it is looked up)."""
    if not events:
        raise InvalidRecord("an append needs at least one event")
    seen: set[str] = set()
    requested: set[str] = set()
    finished: set[str] = set()
    subjects: set[tuple[SubjectKind, str]] = set()
    actors: set[str] = set()
    usages: list[Usage | None] = []
    progress: dict[str, tuple[bool, bool]] = {}  # an attempt's stored progress, read once per batch
    for event in events:
        if not isinstance(event, NewEvent):
            raise InvalidRecord("append takes NewEvent values")
        require_text(event.id, "event id")
    used = used_ids if used_ids is not None else await lookups.used_event_ids([event.id for event in events])
    for event in events:
        for name in ("subject_id", "actor_id", "schema_version"):
            require_text(getattr(event, name), f"event {name}")
        kind = subject_kind(event.event_type)
        time_text(event.occurred_at)
        require_object(event.payload, "event payload")
        require_object(event.extensions, "event extensions")
        if event.id in seen or event.id in used:
            raise Conflict(f"event id {event.id} is already used")
        if (kind, event.subject_id) not in subjects:  # a batch's events often share a subject: checked once
            await _check_subject(lane, kind, event, lookups)
            subjects.add((kind, event.subject_id))
        if event.actor_id not in actors:
            if not await lookups.actor_exists(event.actor_id):
                raise NotFound(f"actor {event.actor_id} not found")
            actors.add(event.actor_id)
        if event.causation_id is not None and event.causation_id not in seen:
            cause_session = await lookups.event_session(event.causation_id)
            if cause_session is None:
                raise NotFound(f"causation event {event.causation_id} not found")
            if cause_session != lane.session_id:
                raise InvalidRecord(f"causation event {event.causation_id} belongs to another session")
        if kind is SubjectKind.ATTEMPT:
            stored = progress.get(event.subject_id)
            if stored is None:
                stored = progress[event.subject_id] = await lookups.attempt_progress(event.subject_id)
            stored_requested, stored_finished = stored
            was_requested = stored_requested or event.subject_id in requested
            was_finished = stored_finished or event.subject_id in finished
            if event.event_type == EventType.ATTEMPT_REQUESTED:
                if was_requested:
                    raise Conflict(f"attempt {event.subject_id} was already requested; a retry is a new attempt")
                requested.add(event.subject_id)
            elif event.event_type in ATTEMPT_TERMINAL_EVENTS:
                if not was_requested:
                    raise InvalidRecord(f"attempt {event.subject_id} needs attempt.requested before its outcome")
                if was_finished:
                    raise Conflict(f"attempt {event.subject_id} already has its terminal event")
                finished.add(event.subject_id)
        if event.event_type in ATTEMPT_TERMINAL_EVENTS:
            Usage.estimated_in(event.payload)
            usages.append(Usage.from_payload(event.payload))
        else:
            usages.append(None)
        seen.add(event.id)
    return usages


async def _check_subject(lane: Lane, kind: SubjectKind, event: NewEvent, lookups: Lookups) -> None:
    subject = event.subject_id
    if kind is SubjectKind.SESSION:
        if subject != lane.session_id:
            raise InvalidRecord(f"{event.event_type} must be about this lane's session {lane.session_id}")
    elif kind is SubjectKind.RUN:
        if subject != lane.run_id:
            raise InvalidRecord(f"{event.event_type} must be about this lane's run {lane.run_id}")
    elif kind is SubjectKind.LANE:
        session = await lookups.lane_session(subject)
        if session is None:
            raise NotFound(f"lane {subject} not found")
        if session != lane.session_id:
            raise InvalidRecord(f"lane {subject} belongs to another session")
    else:
        owner = await lookups.entity_lane(kind, subject)
        if owner is None:
            raise NotFound(f"{kind.value} {subject} not found")
        if owner != lane.id:
            raise InvalidRecord(f"{kind.value} {subject} belongs to another lane")
