"""Completed effects re-entering a loop's mailbox, and the effects `decide` asks the runtime to perform."""

from __future__ import annotations

from typing import Literal

from loopd.harness.core._values import Frozen, Message, ToolCall, ToolOutcome, Usage

# --- completions (inputs besides commands) -------------------------------------------------------------------


class ModelCompleted(Frozen):
    kind: Literal["model_completed"] = "model_completed"
    turn_id: str
    step: int
    text: str
    tool_calls: tuple[ToolCall, ...]
    usage: Usage


class ModelFailed(Frozen):
    kind: Literal["model_failed"] = "model_failed"
    turn_id: str
    step: int
    error_type: str
    message: str
    usage: Usage = Usage()


class ToolFinished(Frozen):
    kind: Literal["tool_finished"] = "tool_finished"
    turn_id: str
    step: int
    outcome: ToolOutcome


Completion = ModelCompleted | ModelFailed | ToolFinished


# --- effects -------------------------------------------------------------------------------------------------


class CallModel(Frozen):
    """Stream one model call for `step` of `turn_id` over `messages`."""

    kind: Literal["call_model"] = "call_model"
    turn_id: str
    step: int
    messages: tuple[Message, ...]


class RunTools(Frozen):
    """Run a batch of tool calls (in parallel, bounded)."""

    kind: Literal["run_tools"] = "run_tools"
    turn_id: str
    step: int
    calls: tuple[ToolCall, ...]


class CancelTurn(Frozen):
    """Cancel every effect still running for `turn_id`; their late completions are ignored."""

    kind: Literal["cancel_turn"] = "cancel_turn"
    turn_id: str


Effect = CallModel | RunTools | CancelTurn
