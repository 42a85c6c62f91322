"""The ledger (AgentLedger): the append-only trail of what agents did, separate from visible chat.

Public face only. Hierarchy: Session → Run → Lane → Turn → Action → Attempt, with immutable Events about any of
them, each by an Actor. Session and run ids are opaque strings (no rows); a Lane is a serial line of events and
the unit of optimistic concurrency; an Action is classified before it runs (type, effect kind, idempotency).

One store keeps the contract (``LedgerStore``, rules in ``_store``): ``SqlLedgerStore`` on the loop-server
``Database`` (tests run it on a temporary SQLite file and on PostgreSQL; tables ``ledger_actors``, ``ledger_lanes``,
``ledger_turns``, ``ledger_actions``, ``ledger_attempts``, ``ledger_events``, ``ledger_appends``,
``ledger_checkpoints``, ``ledger_artifacts``, ``ledger_artifact_uses``; see ``_sql``). Prompts and replies are
content-addressed, redacted artifacts (``_artifacts``) that events reference by ``artifact_ref``.
``append(lane_id, expected_last_seq, append_id, events)`` is atomic and
idempotent by ``append_id`` (digest: SHA-256 of canonical JSON, an approximation of RFC 8785 — see
``loopd.server.storage.canonical_json``). Lanes carry ``task_id``, ``conversation_id`` and ``harness_call_id`` so
facts, unresolved attempts and token/USD roll-ups can be queried from the chat side (``Scope``).

This package imports loopd.server.storage and nothing else of loopd (besides the floor, ``loopd._infra``: ids, clock,
redaction).
"""

from __future__ import annotations

from ._artifacts import (
    MESSAGES_TYPE,
    REDACTED,
    REPLY_TYPE,
    REQUEST_TYPE,
    TOOLS_TYPE,
    ArtifactBlob,
    Redactor,
    artifact_blob,
    canonical_bytes,
    parse_duration,
    ref_from_payload,
    ref_payload,
)
from ._errors import IdempotencyViolation, LaneConflict, RevisionConflict
from ._facts import LedgerFacts
from ._recording import LaneRecorder, completed, failed, requested
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
    Usage,
    UsageTotals,
)
from ._retention import ArtifactRetention
from ._rules import batch_digest
from ._sql import SqlLedgerStore
from ._store import LedgerStore
from ._vocabulary import (
    ATTEMPT_TERMINAL_EVENTS,
    CORE_EVENT_TYPES,
    SCHEMA_VERSION,
    ActionType,
    ActorType,
    EffectKind,
    EventType,
    Idempotency,
    SubjectKind,
    subject_kind,
)

__all__ = [
    "ATTEMPT_TERMINAL_EVENTS",
    "CORE_EVENT_TYPES",
    "MESSAGES_TYPE",
    "REDACTED",
    "REPLY_TYPE",
    "REQUEST_TYPE",
    "SCHEMA_VERSION",
    "TOOLS_TYPE",
    "Action",
    "ActionType",
    "Actor",
    "ActorType",
    "AppendReceipt",
    "ArtifactBlob",
    "ArtifactRef",
    "ArtifactRetention",
    "Attempt",
    "Checkpoint",
    "CheckpointAnchor",
    "CostRow",
    "EffectKind",
    "Event",
    "EventType",
    "Idempotency",
    "IdempotencyViolation",
    "Lane",
    "LaneConflict",
    "LaneRecorder",
    "LedgerFacts",
    "LedgerStore",
    "LedgerStructure",
    "LedgerView",
    "NewEvent",
    "Redactor",
    "RevisionConflict",
    "Scope",
    "SqlLedgerStore",
    "SubjectKind",
    "Turn",
    "UnresolvedAttempt",
    "Usage",
    "UsageTotals",
    "artifact_blob",
    "batch_digest",
    "canonical_bytes",
    "completed",
    "failed",
    "parse_duration",
    "ref_from_payload",
    "ref_payload",
    "requested",
    "subject_kind",
]
