"""Value types shared by the pure core: messages, tool calls, usage.

Pure data: no I/O, no clock, no randomness.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict


class Frozen(BaseModel):
    """Base for immutable wire/value models."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class EffectKind(StrEnum):
    """What an effect does to the world (ledger vocabulary)."""

    NONE = "none"
    READ = "read"
    WRITE = "write"
    UNKNOWN = "unknown"


class Idempotency(StrEnum):
    """Whether repeating an effect is safe (ledger vocabulary)."""

    INHERENT = "inherent"
    KEYED = "keyed"
    NONE = "none"
    UNKNOWN = "unknown"

    @property
    def safe_to_repeat(self) -> bool:
        return self in (Idempotency.INHERENT, Idempotency.KEYED)


class Usage(Frozen):
    """Token usage and cost of one or more model calls."""

    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    cost_usd: float = 0.0
    calls: int = 0

    def __add__(self, other: Usage) -> Usage:
        if other is ZERO_USAGE:
            return self
        if self is ZERO_USAGE:
            return other
        # The sum of two valid usages is valid, so it is built without validation, the way `model_construct`
        # does (which is itself slower than validating: it resolves aliases and defaults in Python); restore
        # adds usages for every model call it folds. tests/harness/test_fold_equivalence.py checks the result
        # against a validated construction, including pydantic's per-instance state.
        total = _new_model(Usage)
        _set(
            total,
            "__dict__",
            {
                "input_tokens": self.input_tokens + other.input_tokens,
                "output_tokens": self.output_tokens + other.output_tokens,
                "cached_tokens": self.cached_tokens + other.cached_tokens,
                "cost_usd": self.cost_usd + other.cost_usd,
                "calls": self.calls + other.calls,
            },
        )
        _set(total, "__pydantic_fields_set__", set(_USAGE_FIELDS))
        _set(total, "__pydantic_extra__", None)
        _set(total, "__pydantic_private__", None)
        return total

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens


ZERO_USAGE = Usage()
_USAGE_FIELDS = frozenset(Usage.model_fields)
_new_model = object.__new__
_set = object.__setattr__


class ToolCall(Frozen):
    """A tool call requested by the model."""

    id: str
    name: str
    arguments: dict[str, Any]


ToolStatus = Literal["ok", "error", "denied", "interrupted", "unknown"]


class ToolOutcome(Frozen):
    """The recorded outcome of one tool call."""

    call_id: str
    name: str
    status: ToolStatus
    output: str


Role = Literal["system", "user", "assistant", "tool"]


class Message(Frozen):
    """One entry of a loop's model-facing history (provider roles stay inside the harness)."""

    role: Role
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None


def user_message(text: str) -> Message:
    return Message(role="user", content=text)


def tool_message(outcome: ToolOutcome) -> Message:
    return Message(role="tool", content=outcome.output, tool_call_id=outcome.call_id, name=outcome.name)
