"""The typed rows of loop-server storage and their closed vocabularies.

Owns: frozen record dataclasses (what a repository returns), ``New*`` inputs, and the literal sets each column
accepts. Must not do: I/O or validation of content models (AgentUE content is stored as a JSON object as given).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Literal, get_args

ConversationActorKind = Literal["user", "operator", "harness"]
MessageKind = Literal["user", "harness", "operator"]
MessagePurpose = Literal["input", "response", "human_request", "human_reply", "output"]
MessageStatus = Literal["streaming", "completed", "failed", "cancelled", "expired"]
DeliveryState = Literal["", "closing", "closed"]
HumanRequestType = Literal["ask", "confirm"]
HumanOutcome = Literal["pending", "success", "dismissed", "timeout", "failure"]
RegistryKind = Literal["operator", "harness"]
HarnessPhase = Literal[
    "pending", "starting", "running", "waiting_input", "succeeded", "failed", "cancelled", "timed_out", "unknown"
]

CONVERSATION_ACTOR_KINDS: Final = frozenset(get_args(ConversationActorKind))
MESSAGE_KINDS: Final = frozenset(get_args(MessageKind))
MESSAGE_PURPOSES: Final = frozenset(get_args(MessagePurpose))
MESSAGE_STATUSES: Final = frozenset(get_args(MessageStatus))
DELIVERY_STATES: Final = frozenset(get_args(DeliveryState))
HUMAN_REQUEST_TYPES: Final = frozenset(get_args(HumanRequestType))
HUMAN_OUTCOMES: Final = frozenset(get_args(HumanOutcome))
HUMAN_TERMINAL_OUTCOMES: Final = HUMAN_OUTCOMES - {"pending"}
REGISTRY_KINDS: Final = frozenset(get_args(RegistryKind))
HARNESS_PHASES: Final = frozenset(get_args(HarnessPhase))
HARNESS_TERMINAL_PHASES: Final = frozenset({"succeeded", "failed", "cancelled", "timed_out", "unknown"})
HARNESS_ACTIVE_PHASES: Final = HARNESS_PHASES - HARNESS_TERMINAL_PHASES


@dataclass(frozen=True, slots=True)
class Conversation:
    """A user conversation (``task_id`` None) or the one work conversation of a Task."""

    id: str
    name: str
    actor_kind: ConversationActorKind
    actor_key: str
    task_id: str | None
    created_at: datetime
    updated_at: datetime
    title: str = ""
    """Written by a background run after the first question (see ``loopd.server.chat._titles``); "" until then."""
    summary: str = ""
    title_state: str = ""
    """"" (no run yet), "running" (a run was started: a restart resumes it), "done" or "failed"."""
    title_run: str = ""
    mode: str = ""
    """The mode its built-in harness calls start in (e.g. ``plan``); "": each harness's own."""


@dataclass(frozen=True, slots=True)
class Message:
    """A visible message; ``content`` is an AgentUE model stored as given."""

    id: str
    conversation_id: str
    task_id: str | None
    kind: MessageKind
    key: str
    reply_to_message_id: str | None
    purpose: MessagePurpose
    status: MessageStatus
    revision: int
    content: dict[str, Any]
    delivery_state: DeliveryState
    completion: dict[str, Any] | None
    """The stored completion intent (e.g. a failure ``{code, message}``) once delivery is closing."""
    human_due_at: datetime | None
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class MessageHead:
    """What a writer of a message's stream needs of its row without its content: where it lives, whether it still
    takes events, and the revision its compare-and-set writes expect (`Messages.lock_head`)."""

    id: str
    conversation_id: str
    status: MessageStatus
    revision: int
    delivery_state: DeliveryState
    content_seq: int | None = None
    """The last event seq the stored content snapshot folds when later events are not folded into it yet (readers
    of the message get them folded: `Messages`); None when the snapshot folds every stored event."""
    task_id: str | None = None
    """The Task the message belongs to (a question's input and response, a Task's outputs); None for others."""


@dataclass(frozen=True, slots=True)
class NewMessage:
    conversation_id: str
    kind: MessageKind
    key: str
    purpose: MessagePurpose
    content: dict[str, Any]
    task_id: str | None = None
    reply_to_message_id: str | None = None
    status: MessageStatus = "completed"
    human_due_at: datetime | None = None
    id: str | None = None
    """Normally left empty (a new UUIDv7); set only when the id must be known before the insert."""


@dataclass(frozen=True, slots=True)
class MessageEvent:
    """One durable AgentUE event of a message: ``seq`` counts per message, ``cursor`` per conversation."""

    message_id: str
    seq: int
    conversation_id: str
    cursor: int
    event: dict[str, Any]
    created_at: datetime


@dataclass(frozen=True, slots=True)
class NewHumanRequest:
    """An Ask or Confirm. Identity: (``task_id``, ``effect_key``); every other field is a parameter."""

    message_id: str
    task_id: str
    conversation_id: str
    effect_key: str
    type: HumanRequestType
    title: str
    prompt: str
    timeout_seconds: float
    asker_kind: MessageKind
    asker_key: str
    choices: tuple[dict[str, Any], ...] = ()
    allow_other: bool = False
    confirm_label: str | None = None
    decline_label: str | None = None

    def params(self) -> dict[str, Any]:
        """What the params hash covers (everything but the server-assigned message and conversation ids)."""
        return {
            "type": self.type,
            "title": self.title,
            "prompt": self.prompt,
            "timeout_seconds": self.timeout_seconds,
            "asker": {"kind": self.asker_kind, "key": self.asker_key},
            "choices": list(self.choices),
            "allow_other": self.allow_other,
            "confirm_label": self.confirm_label,
            "decline_label": self.decline_label,
        }


@dataclass(frozen=True, slots=True)
class HumanRequest:
    message_id: str
    task_id: str
    conversation_id: str
    effect_key: str
    params_hash: str
    type: HumanRequestType
    title: str
    prompt: str
    choices: tuple[dict[str, Any], ...]
    allow_other: bool
    confirm_label: str | None
    decline_label: str | None
    asker_kind: MessageKind
    asker_key: str
    timeout_seconds: float
    due_at: datetime
    outcome: HumanOutcome
    value: Any
    reason: str | None
    reply_message_id: str | None
    resolved_by: str | None
    resolved_at: datetime | None
    created_at: datetime

    @property
    def is_terminal(self) -> bool:
        return self.outcome != "pending"


@dataclass(frozen=True, slots=True)
class RegisteredActor:
    """An operator or harness that announced itself; live while ``expires_at`` is in the future."""

    id: str
    kind: RegistryKind
    key: str
    display_name: str
    description: str
    expires_at: datetime
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class NewHarnessCall:
    """A call's identity is (``owner_uid``, ``effect_key``); ``target`` and ``params`` make its fingerprint."""

    owner_uid: str
    effect_key: str
    target: str
    params: dict[str, Any]
    deadline_at: datetime
    conversation_id: str | None = None
    message_id: str | None = None


@dataclass(frozen=True, slots=True)
class HarnessCall:
    id: str
    owner_uid: str
    effect_key: str
    params: dict[str, Any]
    fingerprint: str
    target: str
    conversation_id: str | None
    message_id: str | None
    phase: HarnessPhase
    result: Any
    error: dict[str, Any] | None
    deadline_at: datetime
    checkpoint: int
    """How many adapter events have been applied (and published) so far."""
    replay_hash: str
    """Chained hash over the applied events, to detect a resume that replays something different."""
    execution_ref: str | None
    cancel_requested: bool
    created_at: datetime
    updated_at: datetime

    @property
    def is_terminal(self) -> bool:
        return self.phase in HARNESS_TERMINAL_PHASES


@dataclass(frozen=True, slots=True)
class Lease:
    """A fenced lease: every acquisition gets a larger ``token``; writes under the lease present it."""

    resource: str
    holder: str
    token: int
    expires_at: datetime
    acquired_at: datetime
