"""The closed vocabulary of harness events.

Every event declares its lifecycle (ephemeral: never stored; enduring: stored before anyone sees it; terminal:
enduring and ends a turn) and its scope (session or loop). The stored form is versioned: each class has a
``version``; `loopd.harness.core.codec` upgrades older stored versions on read.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field

from loopd.harness.core._values import Frozen, ToolCall, ToolOutcome, Usage


class Lifecycle(StrEnum):
    EPHEMERAL = "ephemeral"
    ENDURING = "enduring"
    TERMINAL = "terminal"

    @property
    def stored(self) -> bool:
        return self is not Lifecycle.EPHEMERAL


class Scope(StrEnum):
    SESSION = "session"
    LOOP = "loop"


class _Event(Frozen):
    lifecycle: ClassVar[Lifecycle]
    scope: ClassVar[Scope]
    version: ClassVar[int] = 1


class _SessionEvent(_Event):
    scope: ClassVar[Scope] = Scope.SESSION
    lifecycle: ClassVar[Lifecycle] = Lifecycle.ENDURING


class _LoopEvent(_Event):
    scope: ClassVar[Scope] = Scope.LOOP
    lifecycle: ClassVar[Lifecycle] = Lifecycle.ENDURING
    loop: str


# --- session scope -------------------------------------------------------------------------------------------


class SessionStarted(_SessionEvent):
    kind: Literal["session_started"] = "session_started"
    session_id: str
    rig: str
    loops: tuple[str, ...]
    at: float
    fingerprint: dict[str, str] = Field(default_factory=dict)
    """The rig's configuration, one digest per aspect (see `loopd.harness.core.config`); {} in older journals."""


class SessionRestored(_SessionEvent):
    """A writer reopened the session from its journal."""

    kind: Literal["session_restored"] = "session_restored"
    from_seq: int
    mode: Literal["interrupt", "resume"]
    at: float


class SessionForked(_SessionEvent):
    """The first record of a fork: ``session_id`` continues ``parent_id``'s history as it was at ``parent_seq``
    (those records are shared by the journal, not copied; see `loopd.harness.journal`)."""

    kind: Literal["session_forked"] = "session_forked"
    session_id: str
    parent_id: str
    parent_seq: int
    at: float


class SessionStopped(_SessionEvent):
    kind: Literal["session_stopped"] = "session_stopped"
    reason: str
    at: float


class AgentStarted(_SessionEvent):
    """A loop started a subagent: a new loop ``agent`` built from the rig's agent definition ``definition``."""

    kind: Literal["agent_started"] = "agent_started"
    agent: str
    definition: str
    parent: str
    depth: int
    at: float


class AgentStopped(_SessionEvent):
    kind: Literal["agent_stopped"] = "agent_stopped"
    agent: str
    reason: str
    at: float


class ActiveLoopChanged(_SessionEvent):
    """Input without a loop now goes to ``active`` (was ``previous``)."""

    kind: Literal["active_loop_changed"] = "active_loop_changed"
    active: str
    previous: str | None = None
    at: float


class ConfigChange(Frozen):
    """One aspect of the rig's configuration that differs from what the session recorded ("" = absent)."""

    aspect: str
    before: str
    after: str


class ConfigurationAdopted(_SessionEvent):
    """A restore under a changed rig: the session continues with ``fingerprint`` (``changes`` say what differs)."""

    kind: Literal["configuration_adopted"] = "configuration_adopted"
    changes: tuple[ConfigChange, ...]
    fingerprint: dict[str, str]
    at: float


class WorkspaceCheckpointed(_SessionEvent):
    """A snapshot of the workspace was stored as ``ref`` (content-addressed; see `loopd.harness.snapshots`).

    ``trigger``: turn_started, turn_done, step_done, idle or manual; ``loop`` / ``turn_id``: the turn it followed
    ("" for a manual one). ``files`` and ``bytes_new`` (bytes the store did not hold yet) are for reports."""

    kind: Literal["workspace_checkpointed"] = "workspace_checkpointed"
    ref: str
    trigger: str
    loop: str = ""
    turn_id: str = ""
    files: int = 0
    bytes_new: int = 0
    at: float


class WorkspaceRestored(_SessionEvent):
    """The workspace was put back to snapshot ``ref`` (checkpoint number ``index`` of the session, -1: another)."""

    kind: Literal["workspace_restored"] = "workspace_restored"
    ref: str
    index: int
    previous_ref: str | None = None
    reason: str = ""
    at: float


class WorkspaceForked(_SessionEvent):
    """A fork's workspace is being put back to its parent's snapshot ``ref`` — journaled before any file is written.

    ``checkpoint_seq``: the parent's seq that recorded ``ref`` (the checkpoint the workspace was at after
    ``parent_seq``); ``directory``: the workspace the fork works in (a new one, or the parent's own when
    ``overwrite``). The restore is done when a `WorkspaceRestored` (reason ``fork``) follows; a restore of the session
    before that finishes it (see `loopd.harness.core.workspace.pending_fork`)."""

    kind: Literal["workspace_forked"] = "workspace_forked"
    ref: str
    parent_id: str
    parent_seq: int
    checkpoint_seq: int
    directory: str
    overwrite: bool = False
    at: float


class HustleStarted(_SessionEvent):
    """A named background inference run ("hustle") was admitted to a lane; ``params`` lets a restore resume it."""

    kind: Literal["hustle_started"] = "hustle_started"
    hustle_id: str
    name: str
    lane: Literal["blocking", "background"]
    for_loop: str | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    at: float


class HustleCompleted(_SessionEvent):
    kind: Literal["hustle_completed"] = "hustle_completed"
    hustle_id: str
    usage: Usage
    at: float


class HustleFailed(_SessionEvent):
    """A hustle ended without a result (its model failed, the lane refused it, or a restore could not resume it)."""

    kind: Literal["hustle_failed"] = "hustle_failed"
    hustle_id: str
    error_type: str
    message: str
    at: float


class HustleRefused(_SessionEvent):
    """A hustle was not admitted: its lane's queue was full (``reason`` says so). Nothing was started."""

    kind: Literal["hustle_refused"] = "hustle_refused"
    name: str
    lane: Literal["blocking", "background"]
    for_loop: str | None = None
    reason: str
    at: float


# --- loop scope: enduring ------------------------------------------------------------------------------------


class QueuedInput(Frozen):
    command_id: str
    text: str


class TurnStarted(_LoopEvent):
    """A turn opens with one or more user inputs (inputs queued while idle start one turn together)."""

    kind: Literal["turn_started"] = "turn_started"
    turn_id: str
    inputs: tuple[QueuedInput, ...]
    at: float


class InputQueued(_LoopEvent):
    """An input arrived while a turn was running; see `decide` for the queueing rule."""

    kind: Literal["input_queued"] = "input_queued"
    command_id: str
    text: str


class InputsFolded(_LoopEvent):
    """Queued inputs were folded into the running turn at a step boundary."""

    kind: Literal["inputs_folded"] = "inputs_folded"
    turn_id: str
    inputs: tuple[QueuedInput, ...]


class InputCancelled(_LoopEvent):
    kind: Literal["input_cancelled"] = "input_cancelled"
    command_id: str
    reason: str


class InputRejected(_LoopEvent):
    kind: Literal["input_rejected"] = "input_rejected"
    command_id: str
    reason: str


class ModelReplied(_LoopEvent):
    """The model asked for tools; the tool batch of this step starts after this is durable."""

    kind: Literal["model_replied"] = "model_replied"
    turn_id: str
    step: int
    text: str
    tool_calls: tuple[ToolCall, ...]
    usage: Usage


class ToolCompleted(_LoopEvent):
    kind: Literal["tool_completed"] = "tool_completed"
    turn_id: str
    step: int
    outcome: ToolOutcome


class StepDone(_LoopEvent):
    kind: Literal["step_done"] = "step_done"
    turn_id: str
    step: int
    usage: Usage


class GateOpened(_LoopEvent):
    """A tool batch needs permission: one combined prompt for ``call_ids``, answered by ``deadline`` or denied."""

    kind: Literal["gate_opened"] = "gate_opened"
    turn_id: str
    step: int
    gate_id: str
    call_ids: tuple[str, ...]
    prompt: dict[str, Any]
    deadline: float
    at: float


class GateResolved(_LoopEvent):
    """The gate's answer; ``granted`` is false for deny, timeout, or a failure to store an "always" grant."""

    kind: Literal["gate_resolved"] = "gate_resolved"
    turn_id: str
    step: int
    gate_id: str
    answer: Literal["approve", "approve_always", "deny"]
    granted: bool
    reason: str = ""
    at: float


class HistoryCompacted(_LoopEvent):
    """The oldest ``replaced`` messages of the history were replaced by ``summary`` (written by the model)."""

    kind: Literal["history_compacted"] = "history_compacted"
    turn_id: str
    step: int
    summary: str
    replaced: int
    usage: Usage
    at: float


class LoopModeChanged(_LoopEvent):
    """The loop's mode (which tools it offers, its mode prompt); the running step keeps its mode, the next uses this."""

    kind: Literal["loop_mode_changed"] = "loop_mode_changed"
    mode: str
    previous: str | None = None
    at: float


class LoopInferenceChanged(_LoopEvent):
    """The loop's model: the next model call uses ``model``."""

    kind: Literal["loop_inference_changed"] = "loop_inference_changed"
    model: str
    previous: str | None = None
    at: float


class ContextMeasured(_LoopEvent):
    """The context size after a model call: ``tokens`` (prompt + completion, as reported or estimated) of
    ``window`` (the loop's context window, None when not declared)."""

    kind: Literal["context_measured"] = "context_measured"
    turn_id: str
    step: int
    tokens: int
    window: int | None = None
    at: float


class UserInputRequested(_LoopEvent):
    """The model asked the user ``question`` (the ask_user call ``request_id``); the turn parks until the answer
    (`ProvideUserInput`) or ``deadline``. The call's `ToolCompleted` carries the answer and closes the question."""

    kind: Literal["user_input_requested"] = "user_input_requested"
    turn_id: str
    step: int
    request_id: str
    question: str
    choices: tuple[str, ...] = ()
    deadline: float
    at: float


class ForeignSessionBound(_LoopEvent):
    """A foreign loop's CLI (``engine``: claude, codex) named its own session: later turns resume
    ``foreign_session_id`` (see `loopd.harness.foreign`)."""

    kind: Literal["foreign_session_bound"] = "foreign_session_bound"
    engine: str
    foreign_session_id: str
    at: float


class ForeignToolUsed(_LoopEvent):
    """A foreign loop's CLI ran one of its own tools (or was refused it) during the turn: the record of it (the CLI's
    own session holds the rest). ``output`` is cut to `FOREIGN_OUTPUT_LIMIT` characters."""

    kind: Literal["foreign_tool_used"] = "foreign_tool_used"
    turn_id: str
    call_id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    output: str = ""
    is_error: bool = False
    at: float


FOREIGN_OUTPUT_LIMIT = 4000


# --- loop scope: terminal ------------------------------------------------------------------------------------


class _Terminal(_LoopEvent):
    lifecycle: ClassVar[Lifecycle] = Lifecycle.TERMINAL


class TurnDone(_Terminal):
    """The model answered without tools; `text` is the final reply."""

    kind: Literal["turn_done"] = "turn_done"
    turn_id: str
    step: int
    text: str
    step_usage: Usage
    usage: Usage
    at: float


class TurnFailed(_Terminal):
    kind: Literal["turn_failed"] = "turn_failed"
    turn_id: str
    error_type: str
    message: str
    usage: Usage
    outcomes: tuple[ToolOutcome, ...] = ()
    at: float


class TurnInterrupted(_Terminal):
    """The turn was stopped (interrupt, shutdown or restore); `outcomes` close tool calls left open."""

    kind: Literal["turn_interrupted"] = "turn_interrupted"
    turn_id: str
    reason: str
    usage: Usage
    outcomes: tuple[ToolOutcome, ...] = ()
    at: float


# --- loop scope: ephemeral -----------------------------------------------------------------------------------


class _Ephemeral(_LoopEvent):
    lifecycle: ClassVar[Lifecycle] = Lifecycle.EPHEMERAL


class TokenDelta(_Ephemeral):
    """A piece of the step's model text. ``offset``: characters of this model call's text before ``text`` (so a
    subscriber that missed pieces knows it; None from a peer that does not say)."""

    kind: Literal["token_delta"] = "token_delta"
    turn_id: str
    step: int
    text: str
    offset: int | None = None


class ToolCallStarted(_Ephemeral):
    kind: Literal["tool_call_started"] = "tool_call_started"
    turn_id: str
    call_id: str
    name: str
    summary: str = ""


class ToolProgress(_Ephemeral):
    kind: Literal["tool_progress"] = "tool_progress"
    turn_id: str
    call_id: str
    message: str


class ContextPressure(_Ephemeral):
    """The context passed the loop's pressure threshold: ``tokens`` of ``limit`` (``ratio`` = tokens / limit)."""

    kind: Literal["context_pressure"] = "context_pressure"
    turn_id: str
    tokens: int
    limit: int
    ratio: float


class ModelRetrying(_Ephemeral):
    """An attempt of the step's model call failed and another follows: the same provider again (``next`` retry,
    after ``delay`` s when the provider said Retry-After) or the next model of a fallback chain (``next``
    fallback). ``attempt``: 1 for the first failure; ``model`` / ``provider`` / ``status_code``: the failed try."""

    kind: Literal["model_retrying"] = "model_retrying"
    turn_id: str
    step: int
    attempt: int
    delay: float
    error: str
    model: str = ""
    provider: str = ""
    status_code: int | None = None
    next: Literal["retry", "fallback"] = "retry"


SessionEvent = (
    SessionStarted
    | SessionRestored
    | SessionForked
    | SessionStopped
    | AgentStarted
    | AgentStopped
    | ActiveLoopChanged
    | ConfigurationAdopted
    | WorkspaceCheckpointed
    | WorkspaceRestored
    | WorkspaceForked
    | HustleStarted
    | HustleCompleted
    | HustleFailed
    | HustleRefused
)
LoopEvent = (
    TurnStarted
    | InputQueued
    | InputsFolded
    | InputCancelled
    | InputRejected
    | ModelReplied
    | ToolCompleted
    | StepDone
    | GateOpened
    | GateResolved
    | HistoryCompacted
    | UserInputRequested
    | LoopModeChanged
    | LoopInferenceChanged
    | ContextMeasured
    | ForeignSessionBound
    | ForeignToolUsed
    | TurnDone
    | TurnFailed
    | TurnInterrupted
)
EphemeralEvent = TokenDelta | ToolCallStarted | ToolProgress | ModelRetrying | ContextPressure
StoredEvent = Annotated[SessionEvent | LoopEvent, Field(discriminator="kind")]
Event = Annotated[SessionEvent | LoopEvent | EphemeralEvent, Field(discriminator="kind")]
TerminalEvent = TurnDone | TurnFailed | TurnInterrupted

ALL_EVENT_TYPES: tuple[type[_Event], ...] = (
    SessionStarted,
    SessionRestored,
    SessionForked,
    SessionStopped,
    AgentStarted,
    AgentStopped,
    ActiveLoopChanged,
    ConfigurationAdopted,
    WorkspaceCheckpointed,
    WorkspaceRestored,
    WorkspaceForked,
    HustleStarted,
    HustleCompleted,
    HustleFailed,
    HustleRefused,
    TurnStarted,
    InputQueued,
    InputsFolded,
    InputCancelled,
    InputRejected,
    ModelReplied,
    ToolCompleted,
    StepDone,
    GateOpened,
    GateResolved,
    HistoryCompacted,
    UserInputRequested,
    LoopModeChanged,
    LoopInferenceChanged,
    ContextMeasured,
    ForeignSessionBound,
    ForeignToolUsed,
    TurnDone,
    TurnFailed,
    TurnInterrupted,
    TokenDelta,
    ToolCallStarted,
    ToolProgress,
    ModelRetrying,
    ContextPressure,
)


def lifecycle_of(event: SessionEvent | LoopEvent | EphemeralEvent) -> Lifecycle:
    return event.lifecycle


def kind_of(event_type: type[_Event]) -> str:
    default = event_type.model_fields["kind"].default
    assert isinstance(default, str)
    return default
