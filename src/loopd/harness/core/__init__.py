"""The pure core of the harness: values, commands, events, state, `decide`, `apply`, the stored codec.

Must not do: any I/O, read a clock, or draw random numbers. Everything here is a function of its arguments.
"""

from loopd.harness.core._history import History
from loopd.harness.core._values import (
    ZERO_USAGE,
    EffectKind,
    Frozen,
    Idempotency,
    Message,
    ToolCall,
    ToolOutcome,
    Usage,
    user_message,
)
from loopd.harness.core.apply import apply, apply_loop, fold
from loopd.harness.core.decide import Decision, LoopConfig, LoopInput, decide, recover
from loopd.harness.core.state import LoopState, SessionState, TurnState

__all__ = [
    "ZERO_USAGE",
    "Decision",
    "EffectKind",
    "Frozen",
    "History",
    "Idempotency",
    "LoopConfig",
    "LoopInput",
    "LoopState",
    "Message",
    "SessionState",
    "ToolCall",
    "ToolOutcome",
    "TurnState",
    "Usage",
    "apply",
    "apply_loop",
    "decide",
    "fold",
    "recover",
    "user_message",
]
