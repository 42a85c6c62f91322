"""The Tool seam: prepare (pure validation into a typed request) → gate → run.

A tool never lets the gate parse raw arguments: `prepare` decodes and validates them into a `PreparedCall`
whose `requirements` say exactly what permission the call needs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from loopd.harness.core import EffectKind, Frozen, Idempotency, ToolCall
from loopd.harness.models import ToolSpec


class GrantCandidate(Frozen):
    """A rule that "Approve always" would store for this workspace (e.g. kind=exec, pattern="git status*")."""

    kind: str
    pattern: str
    description: str = ""


class Requirement(Frozen):
    """One permission a prepared call needs."""

    kind: str
    scope: str
    match: str
    description: str
    candidates: tuple[GrantCandidate, ...] = ()


class PreparedCall(Frozen):
    """A validated tool call: typed arguments and the permissions it needs."""

    call_id: str
    tool: str
    arguments: dict[str, Any]
    requirements: tuple[Requirement, ...] = ()
    summary: str = ""


class ToolResult(Frozen):
    output: str
    is_error: bool = False


def _no_progress(_: str) -> None:
    return None


@dataclass(frozen=True, slots=True)
class ToolContext:
    """What a running tool may know about its surroundings."""

    session_id: str
    loop: str
    call_id: str
    workspace: Path | None = None
    progress: Callable[[str], None] = field(default=_no_progress)


@runtime_checkable
class Tool(Protocol):
    """A tool the model can call."""

    @property
    def spec(self) -> ToolSpec: ...

    @property
    def effect(self) -> EffectKind: ...

    @property
    def idempotency(self) -> Idempotency: ...

    def prepare(self, call: ToolCall) -> PreparedCall:
        """Validate arguments (raise `ToolArgumentsError`) and state the requirements. Pure."""
        ...

    async def run(self, call: PreparedCall, ctx: ToolContext) -> ToolResult:
        """Do the work. Cancellation must stop the work promptly."""
        ...
