"""Ledger records: actors, lanes, turns, actions, attempts, events, receipts, checkpoints and query results.

Entities double as inputs: build one (its ``id`` defaults to a new UUIDv7), hand it to the store, and get the
stored version back with the store-owned fields (``created_at``, a lane's ``last_seq``, an action's or
attempt's ``lane_id``, an attempt's ``attempt_no`` when left empty) filled in. ``identity()`` is what must match
when the same id is created again (then the stored entity is returned; otherwise ``Conflict``).
Must not do: I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from loopd._infra.clock import SystemClock
from loopd._infra.ids import new_id
from loopd.server.storage import InvalidRecord, time_text

from ._vocabulary import SCHEMA_VERSION, ActionType, EffectKind, Idempotency


@dataclass(frozen=True, slots=True)
class Actor:
    """Who did something. Attributes are immutable; a ``key`` names one actor for good."""

    type: str
    key: str | None = None
    framework: str | None = None
    attributes: dict[str, Any] = field(default_factory=dict)
    id: str = field(default_factory=new_id)
    created_at: datetime | None = None

    def identity(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": self.type,
            "key": self.key,
            "framework": self.framework,
            "attributes": self.attributes,
        }


@dataclass(frozen=True, slots=True)
class Lane:
    """A serial line of events and the unit of optimistic concurrency; unique by (session, run, name).

    ``task_id``, ``conversation_id`` and ``harness_call_id`` are indexed so the server can find a lane's facts
    from the chat side.
    """

    session_id: str
    run_id: str
    name: str = "main"
    parent_lane_id: str | None = None
    task_id: str | None = None
    conversation_id: str | None = None
    harness_call_id: str | None = None
    attributes: dict[str, Any] = field(default_factory=dict)
    id: str = field(default_factory=new_id)
    last_seq: int = 0
    created_at: datetime | None = None

    def identity(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "session_id": self.session_id,
            "run_id": self.run_id,
            "name": self.name,
            "parent_lane_id": self.parent_lane_id,
            "task_id": self.task_id,
            "conversation_id": self.conversation_id,
            "harness_call_id": self.harness_call_id,
            "attributes": self.attributes,
        }


@dataclass(frozen=True, slots=True)
class Turn:
    lane_id: str
    attributes: dict[str, Any] = field(default_factory=dict)
    id: str = field(default_factory=new_id)
    created_at: datetime | None = None

    def identity(self) -> dict[str, Any]:
        return {"id": self.id, "lane_id": self.lane_id, "attributes": self.attributes}


@dataclass(frozen=True, slots=True)
class Action:
    """One model call, tool call, compaction or checkpoint, classified before it runs."""

    turn_id: str
    type: ActionType
    effect_kind: EffectKind = EffectKind.UNKNOWN
    idempotency: Idempotency = Idempotency.UNKNOWN
    name: str | None = None
    parent_action_id: str | None = None
    attributes: dict[str, Any] = field(default_factory=dict)
    id: str = field(default_factory=new_id)
    lane_id: str | None = None
    created_at: datetime | None = None

    def identity(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "turn_id": self.turn_id,
            "type": str(self.type),
            "effect_kind": str(self.effect_kind),
            "idempotency": str(self.idempotency),
            "name": self.name,
            "parent_action_id": self.parent_action_id,
            "attributes": self.attributes,
        }


@dataclass(frozen=True, slots=True)
class Attempt:
    """One try of an action; ``attempt_no`` is unique per action (left empty, the store picks the next)."""

    action_id: str
    attempt_no: int | None = None
    id: str = field(default_factory=new_id)
    lane_id: str | None = None
    created_at: datetime | None = None

    def identity(self) -> dict[str, Any]:
        return {"id": self.id, "action_id": self.action_id, "attempt_no": self.attempt_no}


@dataclass(frozen=True, slots=True)
class NewEvent:
    """A proposed event. Its canonical form (``canonical()``) is what an append digest covers."""

    event_type: str
    subject_id: str
    actor_id: str
    payload: dict[str, Any] = field(default_factory=dict)
    extensions: dict[str, Any] = field(default_factory=dict)
    causation_id: str | None = None
    id: str = field(default_factory=new_id)
    occurred_at: datetime = field(default_factory=lambda: SystemClock().now())
    """When it happened; writers on the server's clock pass it (the engine's trail does)."""
    schema_version: str = SCHEMA_VERSION

    def canonical(self) -> dict[str, Any]:
        """The event as JSON: absent optionals are omitted."""
        body: dict[str, Any] = {
            "schema_version": self.schema_version,
            "id": self.id,
            "subject_id": self.subject_id,
            "event_type": self.event_type,
            "actor_id": self.actor_id,
            "occurred_at": time_text(self.occurred_at),
            "payload": self.payload,
            "extensions": self.extensions,
        }
        if self.causation_id is not None:
            body["causation_id"] = self.causation_id
        return body


@dataclass(frozen=True, slots=True)
class Event:
    """A stored event: the proposal plus what the store assigned (lane, seq, append id, commit time)."""

    id: str
    lane_id: str
    seq: int
    subject_id: str
    event_type: str
    actor_id: str
    occurred_at: datetime
    payload: dict[str, Any]
    extensions: dict[str, Any]
    causation_id: str | None
    schema_version: str
    append_id: str
    committed_at: datetime


@dataclass(frozen=True, slots=True)
class AppendReceipt:
    append_id: str
    lane_id: str
    first_seq: int
    last_seq: int
    digest: str
    event_ids: tuple[str, ...]
    committed_at: datetime


@dataclass(frozen=True, slots=True)
class Usage:
    """Token and cost usage of one attempt: ``payload["usage"]`` of ``attempt.completed``, or of an
    ``attempt.failed`` that says what the failed try spent. ``payload["usage_estimated"]: true`` marks the usage
    as an estimate — or, with ``"usage": null``, as unknown (an attempt cut short by a crash)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0

    def to_payload(self) -> dict[str, Any]:
        return {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens, "cost_usd": self.cost_usd}

    @staticmethod
    def estimated_in(payload: dict[str, Any]) -> bool:
        """Whether an attempt's terminal payload marks its usage as estimated or unknown; bad values raise."""
        flag = payload.get("usage_estimated", False)
        if not isinstance(flag, bool):
            raise InvalidRecord("payload.usage_estimated must be true or false")
        return flag

    @classmethod
    def from_payload(cls, payload: dict[str, Any]) -> Usage | None:
        """The usage an attempt's terminal payload reports (None when it reports none); bad values raise."""
        usage = payload.get("usage")
        if usage is None:
            return None
        if not isinstance(usage, dict):
            raise InvalidRecord("payload.usage must be an object")
        tokens = []
        for name in ("input_tokens", "output_tokens"):
            value = usage.get(name, 0)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidRecord(f"payload.usage.{name} must be a non-negative integer")
            tokens.append(value)
        cost = usage.get("cost_usd", 0.0)
        if isinstance(cost, bool) or not isinstance(cost, int | float) or not math.isfinite(cost) or cost < 0:
            raise InvalidRecord("payload.usage.cost_usd must be a non-negative number")
        return cls(tokens[0], tokens[1], float(cost))


@dataclass(frozen=True, slots=True)
class UsageTotals:
    """Sums over the usage the attempts in a scope report: every ``attempt.completed``, and every
    ``attempt.failed`` that reports one (e.g. an estimate for an attempt cut short by a crash).

    ``usage_estimated`` is true when the totals are not exact: ``estimated_attempts`` attempts ended with usage
    marked as estimated (counted) or unknown (``usage`` null: not counted, so the totals are a lower bound).
    """

    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    completed_attempts: int = 0
    estimated_attempts: int = 0
    usage_estimated: bool = False


@dataclass(frozen=True, slots=True)
class Scope:
    """Which lanes a query covers: every lane matching all the fields that are set (at least one must be)."""

    task_id: str | None = None
    conversation_id: str | None = None
    harness_call_id: str | None = None
    session_id: str | None = None
    run_id: str | None = None
    lane_id: str | None = None

    def filters(self) -> dict[str, str]:
        found = {
            "task_id": self.task_id,
            "conversation_id": self.conversation_id,
            "harness_call_id": self.harness_call_id,
            "session_id": self.session_id,
            "run_id": self.run_id,
            "id": self.lane_id,
        }
        filters = {name: value for name, value in found.items() if value is not None}
        if not filters:
            raise InvalidRecord("a ledger scope needs at least one of task, conversation, call, session, run or lane")
        return filters

    def matches(self, lane: Lane) -> bool:
        values = {
            "task_id": lane.task_id,
            "conversation_id": lane.conversation_id,
            "harness_call_id": lane.harness_call_id,
            "session_id": lane.session_id,
            "run_id": lane.run_id,
            "id": lane.id,
        }
        return all(values[name] == value for name, value in self.filters().items())


@dataclass(frozen=True, slots=True)
class UnresolvedAttempt:
    """An attempt whose ``attempt.requested`` has no terminal event: its outcome is unknown."""

    attempt: Attempt
    action: Action
    requested: Event


@dataclass(frozen=True, slots=True)
class LedgerStructure:
    """The turns, actions and attempts of the lanes in a scope, each list by creation time, then id."""

    turns: list[Turn]
    actions: list[Action]
    attempts: list[Attempt]


@dataclass(frozen=True, slots=True)
class LedgerView:
    """Lanes (by creation time, then id) and their events: lane by lane in that order, each lane's by seq."""

    lanes: list[Lane]
    events: list[Event]


@dataclass(frozen=True, slots=True)
class ArtifactRef:
    uri: str
    sha256: str
    size: int
    content_type: str


@dataclass(frozen=True, slots=True)
class CostRow:
    """What the ended attempts of one lane's action name spent (``model``: the name of a model-call action)."""

    lane_id: str
    conversation_id: str | None
    task_id: str | None
    target: str | None
    model: str | None
    input_tokens: int
    output_tokens: int
    cost_usd: float
    attempts: int


@dataclass(frozen=True, slots=True)
class CheckpointAnchor:
    """Where a checkpoint's state stands in a lane; the store verifies the event exists there."""

    lane_id: str
    last_applied_seq: int
    last_applied_event_id: str


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A saved framework state under ``key``; exactly one of ``state`` and ``artifact_ref`` is set.

    ``id`` is the save's idempotency key; ``revision`` is assigned by the store (1, 2, 3… per key).
    """

    key: str
    actor_id: str
    format: str
    state: Any = None
    artifact_ref: ArtifactRef | None = None
    anchor: CheckpointAnchor | None = None
    extensions: dict[str, Any] = field(default_factory=dict)
    id: str = field(default_factory=new_id)
    schema_version: str = "1.0"
    revision: int = 0
    created_at: datetime | None = None

    def identity(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "schema_version": self.schema_version,
            "id": self.id,
            "key": self.key,
            "actor_id": self.actor_id,
            "format": self.format,
            "extensions": self.extensions,
        }
        if self.state is not None:
            body["state"] = self.state
        if self.artifact_ref is not None:
            ref = self.artifact_ref
            body["artifact_ref"] = {
                "uri": ref.uri,
                "sha256": ref.sha256,
                "size": ref.size,
                "content_type": ref.content_type,
            }
        if self.anchor is not None:
            body["anchor"] = {
                "lane_id": self.anchor.lane_id,
                "last_applied_seq": self.anchor.last_applied_seq,
                "last_applied_event_id": self.anchor.last_applied_event_id,
            }
        return body
