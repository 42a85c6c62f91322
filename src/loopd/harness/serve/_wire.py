"""Request and response bodies of the HTTP API (pydantic v2, so the OpenAPI document is the real contract).

Events travel as `EventItem`: ``{"seq", "kind", "lifecycle", "loop", "event"}`` where ``event`` is the event's own
JSON (with its ``kind``) and ``seq`` its journal seq (``null`` for ephemeral events). The SSE stream's ``data:``
lines and the journal pages use this one shape.

Must not do: I/O. Builders here are functions of a session state or an envelope.
"""

from __future__ import annotations

import json
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from loopd.harness.core import Usage
from loopd.harness.core.events import EphemeralEvent, Event, Lifecycle, LoopEvent, SessionEvent
from loopd.harness.core.state import LoopState, SessionState

MAX_TEXT: Final = 200_000
MAX_NAME: Final = 200

SessionStatus = Literal["active", "faulted", "stopped", "dormant"]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Response(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --- requests ----------------------------------------------------------------------------------------------


class CreateSessionRequest(_Request):
    """Optional first input, submitted once when the session is created (not again on an idempotent replay)."""

    input: str | None = Field(default=None, min_length=1, max_length=MAX_TEXT)
    loop: str | None = Field(default=None, min_length=1, max_length=MAX_NAME)


class ForkSessionRequest(_Request):
    """Fork at journal seq ``at_seq`` (a settled point of the parent); ``session_id`` names the fork (default: new)."""

    at_seq: int = Field(ge=1, le=2**62)
    session_id: str | None = Field(default=None, min_length=1, max_length=MAX_NAME, pattern=r"^[A-Za-z0-9._:-]+$")
    workspace: Literal["keep", "new", "overwrite"] = "keep"
    """``keep`` the workspace as it is now (default); ``new``: the fork's own directory (a server with
    ``--session-workspaces``; otherwise its one workspace, which must be empty) filled with the parent's snapshot
    at ``at_seq``; ``overwrite``: the parent's workspace put back to that snapshot. The last two need snapshots."""


class InputRequest(_Request):
    text: str = Field(min_length=1, max_length=MAX_TEXT)
    loop: str | None = Field(default=None, min_length=1, max_length=MAX_NAME)


class InterruptRequest(_Request):
    loop: str | None = Field(default=None, min_length=1, max_length=MAX_NAME)
    reason: str = Field(default="interrupted", min_length=1, max_length=500)


class GateAnswerRequest(_Request):
    """``approve`` (once), ``always`` (approve and remember for this workspace; ``approve_always`` too) or ``deny``."""

    answer: Literal["approve", "always", "approve_always", "deny"]


class UserInputRequest(_Request):
    """The answer to an open ask_user question (the model reads it as the question's tool result)."""

    text: str = Field(min_length=1, max_length=65536)


class ActiveLoopRequest(_Request):
    """Make ``loop`` the session's active loop: inputs without a loop go there."""

    loop: str = Field(min_length=1, max_length=MAX_NAME)


class LoopModeRequest(_Request):
    """Switch the loop to one of its declared modes (e.g. ``plan``: read-only tools); from its next step on."""

    mode: str = Field(min_length=1, max_length=MAX_NAME)


class LoopInferenceRequest(_Request):
    """Switch the loop's model for its next model calls."""

    model: str = Field(min_length=1, max_length=MAX_NAME)


# --- responses ---------------------------------------------------------------------------------------------


class QueuedInputBody(_Response):
    command_id: str
    text: str


class GateBody(_Response):
    gate_id: str
    loop: str
    turn_id: str
    step: int
    call_ids: list[str]
    prompt: dict[str, Any]
    deadline: float


class QuestionBody(_Response):
    """An ask_user question waiting for its answer (answer it at ``POST …/questions/{request_id}``)."""

    request_id: str
    loop: str
    turn_id: str
    step: int
    question: str
    choices: list[str]
    deadline: float


class UserInputResult(_Response):
    request_id: str
    status: Literal["accepted"]


class LoopSettingResult(_Response):
    """A setting accepted: ``active_loop`` is set when answered; a mode or model applies from the loop's next step."""

    session_id: str
    loop: str
    setting: Literal["active_loop", "mode", "model"]
    value: str
    status: Literal["set", "accepted"]


class LoopBody(_Response):
    name: str
    busy: bool
    turn_id: str | None
    step: int | None
    phase: Literal["model", "tools"] | None
    queued: list[QueuedInputBody]
    turns: int
    usage: Usage
    last_reply: str | None
    mode: str | None = None
    """The mode set in this session (``POST …/loops/{loop}/mode``); None: the loop's default mode."""
    model: str | None = None
    """The model set in this session (``POST …/loops/{loop}/inference``); None: the loop's own."""
    context_tokens: int = 0
    """The context size measured after the loop's last model call."""
    context_window: int | None = None


class SessionBody(_Response):
    id: str
    status: SessionStatus
    live: bool
    rig: str
    created_at: float | None
    last_seq: int
    turns: int
    usage: Usage
    loops: list[LoopBody]
    gates: list[GateBody]
    questions: list[QuestionBody] = []
    active_loop: str | None = None
    """Where an input without a loop goes (``POST …/active-loop``)."""


class CreatedSession(SessionBody):
    input_command_id: str | None = None


class ForkedSession(SessionBody):
    parent_id: str
    parent_seq: int
    workspace: Literal["keep", "new", "overwrite"] = "keep"
    """What the fork did with its workspace (the request's ``workspace``)."""


class RestoredSession(SessionBody):
    restored: bool


class SessionSummary(_Response):
    id: str
    created_at: float
    last_seq: int
    live: bool
    status: SessionStatus


class SessionList(_Response):
    items: list[SessionSummary]


class InputAccepted(_Response):
    session_id: str
    command_id: str
    loop: str


class InterruptResult(_Response):
    session_id: str
    interrupted: bool


class GateAnswerResult(_Response):
    gate_id: str
    status: Literal["resolved", "pending"]
    answer: Literal["approve", "approve_always", "deny"] | None = None
    granted: bool | None = None
    reason: str = ""


class CancelResult(_Response):
    command_id: str
    status: Literal["cancelled"]


class EventItem(_Response):
    seq: int | None
    kind: str
    lifecycle: Lifecycle
    loop: str | None
    event: Event


class JournalPage(_Response):
    items: list[EventItem]
    next_from_seq: int
    has_more: bool
    last_seq: int


class ModelCallPage(_Response):
    """A page of a session's recorded model calls (``GET /v1/sessions/{id}/model-calls``)."""

    items: list[dict[str, Any]]
    next_after: int
    has_more: bool


class Health(_Response):
    status: Literal["ok"]
    live_sessions: int


# --- builders ----------------------------------------------------------------------------------------------


def event_item(seq: int | None, event: SessionEvent | LoopEvent | EphemeralEvent) -> EventItem:
    return EventItem(
        seq=seq, kind=event.kind, lifecycle=event.lifecycle, loop=getattr(event, "loop", None), event=event
    )


def event_json(seq: int | None, event: SessionEvent | LoopEvent | EphemeralEvent) -> str:
    """The `EventItem` JSON of one event, built without re-validating it (the SSE hot path)."""
    return json.dumps(
        {
            "seq": seq,
            "kind": event.kind,
            "lifecycle": event.lifecycle.value,
            "loop": getattr(event, "loop", None),
            "event": event.model_dump(mode="json"),
        },
        separators=(",", ":"),
        ensure_ascii=False,
    )


def _loop_body(loop: LoopState) -> LoopBody:
    turn = loop.turn
    return LoopBody(
        name=loop.name,
        busy=turn is not None,
        turn_id=turn.turn_id if turn else None,
        step=turn.step if turn else None,
        phase=turn.phase if turn else None,
        queued=[QueuedInputBody(command_id=q.command_id, text=q.text) for q in loop.queued],
        turns=loop.turns,
        usage=loop.usage,
        last_reply=loop.last_reply,
        mode=loop.mode,
        model=loop.model,
        context_tokens=loop.measured_tokens,
        context_window=loop.context_window,
    )


def open_gates(state: SessionState) -> list[GateBody]:
    gates: list[GateBody] = []
    for loop in state.loops.values():
        turn = loop.turn
        if turn is not None and turn.gate is not None:
            gate = turn.gate
            gates.append(
                GateBody(
                    gate_id=gate.gate_id,
                    loop=loop.name,
                    turn_id=turn.turn_id,
                    step=turn.step,
                    call_ids=list(gate.call_ids),
                    prompt=dict(gate.prompt),
                    deadline=gate.deadline,
                )
            )
    return gates


def open_questions(state: SessionState) -> list[QuestionBody]:
    return [
        QuestionBody(
            request_id=ask.request_id,
            loop=loop.name,
            turn_id=loop.turn.turn_id,
            step=loop.turn.step,
            question=ask.question,
            choices=list(ask.choices),
            deadline=ask.deadline,
        )
        for loop in state.loops.values()
        if loop.turn is not None
        for ask in loop.turn.asks
    ]


def session_body(
    state: SessionState, *, status: SessionStatus, live: bool, created_at: float | None, session_id: str
) -> dict[str, Any]:
    """The fields of `SessionBody` (a dict, so the `CreatedSession` / `RestoredSession` variants can extend it)."""
    return {
        "id": session_id,
        "status": status,
        "live": live,
        "rig": state.rig,
        "created_at": created_at,
        "last_seq": state.last_seq,
        "turns": sum(loop.turns for loop in state.loops.values()),
        "usage": state.usage,
        "loops": [_loop_body(loop) for loop in state.loops.values()],
        "gates": open_gates(state),
        "questions": open_questions(state),
        "active_loop": state.active_loop or next(iter(state.loops), None),
    }
