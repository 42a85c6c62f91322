"""Completed effects re-entering a loop's mailbox, and the effects `decide` asks the runtime to perform.

Internal values (never stored or sent over a wire), so plain frozen dataclasses: cheap to build per step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from loopd.harness.core._values import ZERO_USAGE, Message, ToolCall, ToolOutcome, Usage

# --- completions (inputs besides commands) -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ModelCompleted:
    turn_id: str
    step: int
    text: str
    tool_calls: tuple[ToolCall, ...]
    usage: Usage


@dataclass(frozen=True, slots=True)
class ModelFailed:
    turn_id: str
    step: int
    error_type: str
    message: str
    usage: Usage = ZERO_USAGE


@dataclass(frozen=True, slots=True)
class ToolFinished:
    turn_id: str
    step: int
    outcome: ToolOutcome


@dataclass(frozen=True, slots=True)
class GateNeeded:
    """The runtime evaluated a batch and some calls need a human answer."""

    turn_id: str
    step: int
    gate_id: str
    call_ids: tuple[str, ...]
    prompt: dict[str, Any]
    deadline: float


@dataclass(frozen=True, slots=True)
class GateAnswered:
    """An answer was resolved (an "always" grant stored first) — or the gate timed out (``answer="deny"``)."""

    turn_id: str
    step: int
    gate_id: str
    answer: str
    granted: bool
    reason: str = ""


@dataclass(frozen=True, slots=True)
class CompactionDone:
    """The model summarized the history prefix ``messages[:replaced]`` of a `Compact` effect."""

    turn_id: str
    step: int
    summary: str
    replaced: int
    usage: Usage = ZERO_USAGE
    blocking: bool = True
    """A turn waits for it (at ``turn_id``/``step``); False: a background compaction, nobody waits."""


@dataclass(frozen=True, slots=True)
class CompactionFailed:
    turn_id: str
    step: int
    error_type: str
    message: str
    blocking: bool = True


@dataclass(frozen=True, slots=True)
class UserInputNeeded:
    """The model called ask_user: the runtime validated the question and fixed its deadline."""

    turn_id: str
    step: int
    request_id: str
    question: str
    choices: tuple[str, ...]
    deadline: float


@dataclass(frozen=True, slots=True)
class UserInputExpired:
    """Nobody answered the question ``request_id`` by its deadline."""

    turn_id: str
    step: int
    request_id: str


@dataclass(frozen=True, slots=True)
class ForeignSessionSeen:
    """A foreign loop's CLI (``engine``) named its session ``session_id`` (in or after any turn: it exists)."""

    engine: str
    session_id: str


@dataclass(frozen=True, slots=True)
class ForeignToolFinished:
    """A foreign loop's CLI reported the result of one of its own tools (``arguments`` from its tool use)."""

    turn_id: str
    step: int
    call_id: str
    name: str
    arguments: dict[str, Any]
    output: str
    is_error: bool


Completion = (
    CompactionDone
    | CompactionFailed
    | ModelCompleted
    | ModelFailed
    | ToolFinished
    | GateNeeded
    | GateAnswered
    | UserInputNeeded
    | UserInputExpired
    | ForeignSessionSeen
    | ForeignToolFinished
)


# --- effects -------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Compact:
    """Ask the model for a summary of ``messages`` (the history prefix that will be replaced)."""

    turn_id: str
    step: int
    messages: tuple[Message, ...]
    blocking: bool = True
    """The turn waits for the summary; False: it runs on the background lane while the turn goes on."""


@dataclass(frozen=True, slots=True)
class CallModel:
    """Stream one model call for `step` of `turn_id` over `messages` (the loop's `History` itself: immutable, and
    equal to the tuple of its messages)."""

    turn_id: str
    step: int
    messages: Sequence[Message]


@dataclass(frozen=True, slots=True)
class RunTools:
    """Run a batch of tool calls (in parallel, bounded)."""

    turn_id: str
    step: int
    calls: tuple[ToolCall, ...]
    gated: bool = True
    """False when a gate already approved these calls."""


@dataclass(frozen=True, slots=True)
class ArmGate:
    """Deny the gate if nobody answers by ``deadline`` (wall-clock seconds)."""

    turn_id: str
    step: int
    gate_id: str
    deadline: float


@dataclass(frozen=True, slots=True)
class ArmAsk:
    """Close the question ``request_id`` with "no answer" if nobody answers by ``deadline``."""

    turn_id: str
    step: int
    request_id: str
    deadline: float


@dataclass(frozen=True, slots=True)
class ResolveGate:
    """Turn an answer into a grant; for "approve_always", store the shown grants before granting."""

    turn_id: str
    step: int
    gate_id: str
    answer: str
    prompt: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class CancelTurn:
    """Cancel every effect still running for `turn_id`; their late completions are ignored."""

    turn_id: str


Effect = Compact | CallModel | RunTools | ArmGate | ArmAsk | ResolveGate | CancelTurn
