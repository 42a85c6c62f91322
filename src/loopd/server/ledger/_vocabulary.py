"""The ledger's closed vocabulary: action types, effect classification, subject kinds and core event names.

Owns: the enums and the event-name rule. A name is dot-separated lowercase segments; the first segment is the
subject kind (session, run, lane, turn, action, attempt). Two-segment names are reserved for the core list;
extensions use ``<subject>.<namespace>.<name…>`` and are stored as given. Must not do: I/O.
"""

from __future__ import annotations

import functools
import re
from enum import StrEnum
from typing import Final

from loopd.server.storage import InvalidRecord


class ActionType(StrEnum):
    MODEL_CALL = "model_call"
    TOOL_CALL = "tool_call"
    COMPACT = "compact"
    CHECKPOINT = "checkpoint"


class EffectKind(StrEnum):
    """What an action does to the world, fixed before it runs."""

    NONE = "none"
    READ = "read"
    WRITE = "write"
    UNKNOWN = "unknown"


class Idempotency(StrEnum):
    """Whether repeating an action is safe, fixed before it runs."""

    NOT_APPLICABLE = "not_applicable"
    INHERENT = "inherent"
    KEYED = "keyed"
    NONE = "none"
    UNKNOWN = "unknown"


class SubjectKind(StrEnum):
    SESSION = "session"
    RUN = "run"
    LANE = "lane"
    TURN = "turn"
    ACTION = "action"
    ATTEMPT = "attempt"


class EventType(StrEnum):
    SESSION_STARTED = "session.started"
    SESSION_COMPLETED = "session.completed"
    RUN_STARTED = "run.started"
    RUN_COMPLETED = "run.completed"
    RUN_FAILED = "run.failed"
    RUN_CANCELLED = "run.cancelled"
    LANE_CREATED = "lane.created"
    TURN_STARTED = "turn.started"
    TURN_COMPLETED = "turn.completed"
    TURN_FAILED = "turn.failed"
    ACTION_STARTED = "action.started"
    ACTION_COMPLETED = "action.completed"
    ACTION_FAILED = "action.failed"
    ATTEMPT_REQUESTED = "attempt.requested"
    ATTEMPT_COMPLETED = "attempt.completed"
    ATTEMPT_FAILED = "attempt.failed"
    LANE_SNAPSHOT_SAVED = "lane.framework.snapshot.saved"
    LANE_CHECKPOINT_LINKED = "lane.framework.checkpoint.linked"


class ActorType(StrEnum):
    """Common actor types; the set is open (any non-empty string is accepted)."""

    USER = "user"
    AGENT = "agent"
    ORCHESTRATOR = "orchestrator"
    HARNESS = "harness"
    MODEL = "model"
    TOOL = "tool"
    SYSTEM = "system"


CORE_EVENT_TYPES: Final = frozenset(str(name) for name in EventType)
ATTEMPT_TERMINAL_EVENTS: Final = frozenset({str(EventType.ATTEMPT_COMPLETED), str(EventType.ATTEMPT_FAILED)})
SCHEMA_VERSION: Final = "1.0"

_SEGMENT = re.compile(r"[a-z][a-z0-9_]*\Z")


@functools.lru_cache(maxsize=1024)  # a few dozen names, checked for every ledger event
def subject_kind(event_type: str) -> SubjectKind:
    """The subject kind named by ``event_type``, or ``InvalidRecord`` if the name breaks the naming rule."""
    if not isinstance(event_type, str):
        raise InvalidRecord(f"event type must be a string, not {event_type!r}")
    segments = event_type.split(".")
    if len(segments) < 2 or not all(_SEGMENT.match(segment) for segment in segments):
        raise InvalidRecord(f"event type {event_type!r} must be dot-separated lowercase segments")
    try:
        kind = SubjectKind(segments[0])
    except ValueError:
        kinds = ", ".join(kind.value for kind in SubjectKind)
        raise InvalidRecord(f"event type {event_type!r} must start with a subject kind ({kinds})") from None
    if len(segments) == 2 and event_type not in CORE_EVENT_TYPES:
        raise InvalidRecord(
            f"event type {event_type!r}: two-segment names are reserved for core events; "
            f"extensions use '{kind.value}.<namespace>.<name>'"
        )
    return kind
