"""Completed effects re-entering a loop's mailbox, and the effects `decide` asks the runtime to perform.

Internal values (never stored or sent over a wire), so plain frozen dataclasses: cheap to build per step.
"""

from __future__ import annotations

from dataclasses import dataclass

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


Completion = ModelCompleted | ModelFailed | ToolFinished


# --- effects -------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CallModel:
    """Stream one model call for `step` of `turn_id` over `messages`."""

    turn_id: str
    step: int
    messages: tuple[Message, ...]


@dataclass(frozen=True, slots=True)
class RunTools:
    """Run a batch of tool calls (in parallel, bounded)."""

    turn_id: str
    step: int
    calls: tuple[ToolCall, ...]


@dataclass(frozen=True, slots=True)
class CancelTurn:
    """Cancel every effect still running for `turn_id`; their late completions are ignored."""

    turn_id: str


Effect = CallModel | RunTools | CancelTurn
