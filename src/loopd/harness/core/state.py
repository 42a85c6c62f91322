"""Session and loop state: immutable values folded from events by `apply`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from loopd.harness.core._history import EMPTY_HISTORY, History
from loopd.harness.core._values import ZERO_USAGE, ToolCall, ToolOutcome, Usage
from loopd.harness.core.events import QueuedInput
from loopd.harness.core.hustles import EMPTY_HUSTLES, HustleInfo
from loopd.harness.core.workspace import EMPTY_WORKSPACE_HISTORY, WorkspaceHistory

TurnPhase = Literal["model", "tools"]


@dataclass(frozen=True, slots=True)
class OpenGate:
    gate_id: str
    call_ids: tuple[str, ...]
    prompt: Mapping[str, Any]
    deadline: float


@dataclass(frozen=True, slots=True)
class OpenAsk:
    """A question the model asked the user (ask_user call ``request_id``), open until answered or ``deadline``."""

    request_id: str
    question: str
    choices: tuple[str, ...]
    deadline: float


@dataclass(frozen=True, slots=True)
class TurnState:
    turn_id: str
    step: int
    phase: TurnPhase
    usage: Usage
    step_usage: Usage = ZERO_USAGE
    calls: tuple[ToolCall, ...] = ()
    outcomes: tuple[ToolOutcome, ...] = ()
    gate: OpenGate | None = None
    mode: str | None = None  # the mode of this step (the loop's mode when the step began)
    asks: tuple[OpenAsk, ...] = ()  # open ask_user questions of this step (each closed by its call's ToolCompleted)

    @property
    def open_calls(self) -> tuple[ToolCall, ...]:
        done = {o.call_id for o in self.outcomes}
        return tuple(c for c in self.calls if c.id not in done)


@dataclass(frozen=True, slots=True)
class LoopState:
    name: str
    history: History = EMPTY_HISTORY
    turn: TurnState | None = None
    queued: tuple[QueuedInput, ...] = ()
    turns: int = 0
    usage: Usage = ZERO_USAGE
    last_reply: str | None = None
    # Context size reported by the last model call, and the history length it covered (see `compaction`).
    context_tokens: int = 0
    context_mark: int = 0
    # Set by LoopModeChanged / LoopInferenceChanged (None: the definition's default) and ContextMeasured.
    mode: str | None = None
    model: str | None = None
    measured_tokens: int = 0
    context_window: int | None = None
    foreign_session_id: str | None = None  # ForeignSessionBound: the foreign CLI's session to resume

    @property
    def idle(self) -> bool:
        return self.turn is None and not self.queued


@dataclass(frozen=True, slots=True)
class AgentInfo:
    """A subagent: a loop started at run time by ``parent`` from the rig's agent definition ``definition``."""

    name: str
    definition: str
    parent: str
    depth: int
    stopped: bool = False


@dataclass(frozen=True, slots=True)
class SessionState:
    session_id: str
    rig: str = ""
    status: Literal["new", "active", "stopped"] = "new"
    loops: Mapping[str, LoopState] = field(default_factory=lambda: MappingProxyType({}))
    last_seq: int = 0
    agents: Mapping[str, AgentInfo] = field(default_factory=lambda: MappingProxyType({}))
    active_loop: str | None = None  # ActiveLoopChanged (None: the rig's first loop)
    fingerprint: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))  # the rig's recorded config
    workspace: WorkspaceHistory = EMPTY_WORKSPACE_HISTORY  # workspace checkpoints (`core.workspace`)
    hustles: Mapping[str, HustleInfo] = field(default_factory=lambda: EMPTY_HUSTLES)  # open runs (`core.hustles`)

    @property
    def usage(self) -> Usage:
        total = ZERO_USAGE
        for loop in self.loops.values():
            total = total + loop.usage
        return total

    def with_loop(self, loop: LoopState) -> SessionState:
        loops = dict(self.loops)
        loops[loop.name] = loop
        return SessionState(
            session_id=self.session_id,
            rig=self.rig,
            status=self.status,
            loops=MappingProxyType(loops),
            last_seq=self.last_seq,
            agents=self.agents,
            active_loop=self.active_loop,
            fingerprint=self.fingerprint,
            workspace=self.workspace,
            hustles=self.hustles,
        )
