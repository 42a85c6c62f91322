"""Budgets: the Policy seam's spending side.

Before every model call the runtime asks the session's `BudgetPolicy` whether the session may spend more. A spent
budget fails the turn with error type ``BudgetExceeded`` (a `TurnFailed` event, journaled like any failure). The
check is a pre-flight: a call that starts under budget may finish over it; the *next* call is refused. Usage counts
every loop of the session (subagents included) and survives restore, because it is folded from the journal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from loopd.harness._errors import BudgetExceeded
from loopd.harness.core import Usage


class BudgetPolicy(Protocol):
    def check(self, usage: Usage) -> BudgetExceeded | None:
        """The reason the session (having spent ``usage``) may not call a model again, or None."""
        ...


@dataclass(frozen=True, slots=True)
class Budget:
    """Per-session limits; None means unlimited. Tokens are input + output tokens."""

    max_tokens: int | None = None
    max_usd: float | None = None

    def __post_init__(self) -> None:
        if self.max_tokens is not None and self.max_tokens < 0:
            raise ValueError("max_tokens must be >= 0")
        if self.max_usd is not None and self.max_usd < 0:
            raise ValueError("max_usd must be >= 0")

    def check(self, usage: Usage) -> BudgetExceeded | None:
        if self.max_tokens is not None and usage.total_tokens >= self.max_tokens:
            return BudgetExceeded("tokens", self.max_tokens, usage.total_tokens)
        if self.max_usd is not None and usage.cost_usd >= self.max_usd:
            return BudgetExceeded("usd", self.max_usd, usage.cost_usd)
        return None


UNLIMITED = Budget()
