"""`apply(state, event) -> state`: the pure fold shared by the live runtime and restore."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from types import MappingProxyType

from loopd.harness.core._history import History
from loopd.harness.core._values import ZERO_USAGE, Message, ToolOutcome, tool_message, user_message
from loopd.harness.core.agents import apply_agents
from loopd.harness.core.compaction import summary_message
from loopd.harness.core.events import (
    AgentStarted,
    AgentStopped,
    GateOpened,
    GateResolved,
    HistoryCompacted,
    InputCancelled,
    InputQueued,
    InputRejected,
    InputsFolded,
    LoopEvent,
    ModelReplied,
    QueuedInput,
    SessionEvent,
    SessionRestored,
    SessionStarted,
    SessionStopped,
    StepDone,
    ToolCompleted,
    TurnDone,
    TurnFailed,
    TurnInterrupted,
    TurnStarted,
)
from loopd.harness.core.state import LoopState, OpenGate, SessionState, TurnState


def _without(queued: tuple[QueuedInput, ...], taken: Iterable[str]) -> tuple[QueuedInput, ...]:
    ids = set(taken)
    return tuple(q for q in queued if q.command_id not in ids)


def _close_calls(history: History, outcomes: tuple[ToolOutcome, ...]) -> History:
    return history.appended(*(tool_message(o) for o in outcomes)) if outcomes else history


def apply_loop(state: LoopState, event: LoopEvent) -> LoopState:
    """Fold one loop-scoped event into the loop's state."""
    match event:
        case TurnStarted(turn_id=turn_id, inputs=inputs):
            return replace(
                state,
                history=state.history.appended(*(user_message(i.text) for i in inputs)),
                turn=TurnState(turn_id=turn_id, step=1, phase="model", usage=ZERO_USAGE),
                queued=_without(state.queued, (i.command_id for i in inputs)),
                turns=state.turns + 1,
            )
        case InputQueued(command_id=command_id, text=text):
            return replace(state, queued=(*state.queued, QueuedInput(command_id=command_id, text=text)))
        case InputsFolded(inputs=inputs):
            return replace(
                state,
                history=state.history.appended(*(user_message(i.text) for i in inputs)),
                queued=_without(state.queued, (i.command_id for i in inputs)),
            )
        case InputCancelled(command_id=command_id):
            return replace(state, queued=_without(state.queued, (command_id,)))
        case InputRejected():
            return state
        case ModelReplied(text=text, tool_calls=calls, usage=usage):
            turn = state.turn
            assert turn is not None, "ModelReplied outside a turn"
            history = state.history.appended(Message(role="assistant", content=text, tool_calls=calls))
            return replace(
                state,
                history=history,
                turn=replace(turn, phase="tools", calls=calls, outcomes=(), step_usage=usage, usage=turn.usage + usage),
                usage=state.usage + usage,
                context_tokens=usage.input_tokens + usage.output_tokens,
                context_mark=len(history),
            )
        case HistoryCompacted(summary=summary, replaced=replaced, usage=usage):
            turn = state.turn
            assert turn is not None, "HistoryCompacted outside a turn"
            kept = state.history[replaced:]
            return replace(
                state,
                history=History((summary_message(summary), *kept)),
                turn=replace(turn, usage=turn.usage + usage),
                usage=state.usage + usage,
                context_tokens=0,
                context_mark=0,
            )
        case ToolCompleted(outcome=outcome):
            turn = state.turn
            assert turn is not None, "ToolCompleted outside a turn"
            return replace(
                state,
                history=state.history.appended(tool_message(outcome)),
                turn=replace(turn, outcomes=(*turn.outcomes, outcome)),
            )
        case GateOpened(gate_id=gate_id, call_ids=call_ids, prompt=prompt, deadline=deadline):
            turn = state.turn
            assert turn is not None, "GateOpened outside a turn"
            gate = OpenGate(gate_id=gate_id, call_ids=call_ids, prompt=prompt, deadline=deadline)
            return replace(state, turn=replace(turn, gate=gate))
        case GateResolved():
            turn = state.turn
            assert turn is not None, "GateResolved outside a turn"
            return replace(state, turn=replace(turn, gate=None))
        case StepDone():
            turn = state.turn
            assert turn is not None, "StepDone outside a turn"
            return replace(
                state,
                turn=replace(turn, step=turn.step + 1, phase="model", calls=(), outcomes=(), step_usage=ZERO_USAGE),
            )
        case TurnDone(text=text, step_usage=step_usage):
            history = state.history.appended(Message(role="assistant", content=text))
            return replace(
                state,
                history=history,
                turn=None,
                usage=state.usage + step_usage,
                last_reply=text,
                context_tokens=step_usage.input_tokens + step_usage.output_tokens,
                context_mark=len(history),
            )
        case TurnFailed(outcomes=outcomes) | TurnInterrupted(outcomes=outcomes):
            return replace(state, history=_close_calls(state.history, outcomes), turn=None)
    raise TypeError(f"not a loop event: {event!r}")  # pragma: no cover - the union is closed


def apply(state: SessionState, event: SessionEvent | LoopEvent, seq: int | None = None) -> SessionState:
    """Fold one stored event (optionally with its journal seq) into the session state."""
    match event:
        case SessionStarted(session_id=session_id, rig=rig, loops=names):
            new = SessionState(
                session_id=session_id,
                rig=rig,
                status="active",
                loops=MappingProxyType({n: LoopState(name=n) for n in names}),
            )
        case SessionRestored():
            new = replace(state, status="active")
        case SessionStopped():
            new = replace(state, status="stopped")
        case AgentStarted(agent=name):
            loops = dict(state.loops)
            loops.setdefault(name, LoopState(name=name))
            new = replace(state, loops=MappingProxyType(loops), agents=apply_agents(state.agents, event))
        case AgentStopped():
            new = replace(state, agents=apply_agents(state.agents, event))
        case _:
            loop = state.loops.get(event.loop) or LoopState(name=event.loop)
            new = state.with_loop(apply_loop(loop, event))
    if seq is not None:
        new = replace(new, last_seq=seq)
    return new


def fold(events: Iterable[tuple[int, SessionEvent | LoopEvent]], state: SessionState | None = None) -> SessionState:
    """Rebuild a session state from (seq, event) pairs: restore is exactly this fold."""
    current = state if state is not None else SessionState(session_id="")
    for seq, event in events:
        current = apply(current, event, seq)
    return current
