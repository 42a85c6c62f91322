"""`apply(state, event) -> state`: the pure fold shared by the live runtime and restore.

`apply_loop` is the one definition of what a loop-scoped event does: the live loop actors call it for every
committed event, and `apply` / `fold` call it for restore, so "live state == fold of the journal" holds by
construction. `fold` keeps one `LoopState` per loop while it runs and builds the `SessionState` once at the end
(or when a session-scoped event needs it), which gives the same state as applying `apply` event by event.

Restore folds every stored event, so the frequent events (a step's `ModelReplied`, `ToolCompleted`, `StepDone`,
a turn's start and end) build their new states with direct constructor calls, about twice as cheap as
`dataclasses.replace`; those constructors list every field, and tests/harness/test_fold_equivalence.py fails if
a field is added to `LoopState` or `TurnState` without updating them. Rare events keep `replace`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from types import MappingProxyType

from loopd.harness._errors import InvalidTransitionError
from loopd.harness.core._history import History
from loopd.harness.core._values import ZERO_USAGE, Message, ToolOutcome, tool_message, user_message
from loopd.harness.core.agents import apply_agents
from loopd.harness.core.compaction import summary_message
from loopd.harness.core.events import (
    ActiveLoopChanged,
    AgentStarted,
    AgentStopped,
    ConfigurationAdopted,
    ContextMeasured,
    ForeignSessionBound,
    ForeignToolUsed,
    GateOpened,
    GateResolved,
    HistoryCompacted,
    HustleCompleted,
    HustleFailed,
    HustleRefused,
    HustleStarted,
    InputCancelled,
    InputQueued,
    InputRejected,
    InputsFolded,
    LoopEvent,
    LoopInferenceChanged,
    LoopModeChanged,
    ModelReplied,
    QueuedInput,
    Scope,
    SessionEvent,
    SessionForked,
    SessionRestored,
    SessionStarted,
    SessionStopped,
    StepDone,
    ToolCompleted,
    TurnDone,
    TurnFailed,
    TurnInterrupted,
    TurnStarted,
    UserInputRequested,
    WorkspaceCheckpointed,
    WorkspaceForked,
    WorkspaceRestored,
)
from loopd.harness.core.hustles import apply_hustles
from loopd.harness.core.state import LoopState, OpenAsk, OpenGate, SessionState, TurnState
from loopd.harness.core.workspace import apply_workspace


def _without(queued: tuple[QueuedInput, ...], taken: Iterable[str]) -> tuple[QueuedInput, ...]:
    ids = set(taken)
    return tuple(q for q in queued if q.command_id not in ids)


def _close_calls(history: History, outcomes: tuple[ToolOutcome, ...]) -> History:
    return history.appended(*(tool_message(o) for o in outcomes)) if outcomes else history


def _turn_of(state: LoopState, kind: str) -> TurnState:
    """The loop's open turn; `InvalidTransitionError` when ``kind`` arrives outside one (a corrupt journal)."""
    if state.turn is None:
        raise InvalidTransitionError(f"{kind} outside a turn (loop {state.name!r})")
    return state.turn


def apply_loop(state: LoopState, event: LoopEvent) -> LoopState:
    """Fold one loop-scoped event into the loop's state."""
    # The most frequent events come first: a class pattern is an isinstance check, tried in order.
    match event:
        case ToolCompleted(outcome=outcome):
            turn = _turn_of(state, "ToolCompleted")
            return LoopState(
                name=state.name,
                history=state.history.appended(tool_message(outcome)),
                turn=TurnState(
                    turn_id=turn.turn_id,
                    step=turn.step,
                    phase=turn.phase,
                    usage=turn.usage,
                    step_usage=turn.step_usage,
                    calls=turn.calls,
                    outcomes=(*turn.outcomes, outcome),
                    gate=turn.gate,
                    mode=turn.mode,
                    asks=tuple(a for a in turn.asks if a.request_id != outcome.call_id) if turn.asks else (),
                ),
                queued=state.queued,
                turns=state.turns,
                usage=state.usage,
                last_reply=state.last_reply,
                context_tokens=state.context_tokens,
                context_mark=state.context_mark,
                mode=state.mode,
                model=state.model,
                measured_tokens=state.measured_tokens,
                context_window=state.context_window,
                foreign_session_id=state.foreign_session_id,
            )
        case ModelReplied(text=text, tool_calls=calls, usage=usage):
            turn = _turn_of(state, "ModelReplied")
            history = state.history.appended(Message(role="assistant", content=text, tool_calls=calls))
            return LoopState(
                name=state.name,
                history=history,
                turn=TurnState(
                    turn_id=turn.turn_id,
                    step=turn.step,
                    phase="tools",
                    usage=turn.usage + usage,
                    step_usage=usage,
                    calls=calls,
                    outcomes=(),
                    gate=turn.gate,
                    mode=turn.mode,
                ),
                queued=state.queued,
                turns=state.turns,
                usage=state.usage + usage,
                last_reply=state.last_reply,
                context_tokens=usage.input_tokens + usage.output_tokens,
                context_mark=len(history),
                mode=state.mode,
                model=state.model,
                measured_tokens=state.measured_tokens,
                context_window=state.context_window,
                foreign_session_id=state.foreign_session_id,
            )
        case StepDone():
            turn = _turn_of(state, "StepDone")
            return LoopState(
                name=state.name,
                history=state.history,
                turn=TurnState(
                    turn_id=turn.turn_id,
                    step=turn.step + 1,
                    phase="model",
                    usage=turn.usage,
                    step_usage=ZERO_USAGE,
                    calls=(),
                    outcomes=(),
                    gate=turn.gate,
                    mode=state.mode,  # a mode change takes effect at the next step
                ),
                queued=state.queued,
                turns=state.turns,
                usage=state.usage,
                last_reply=state.last_reply,
                context_tokens=state.context_tokens,
                context_mark=state.context_mark,
                mode=state.mode,
                model=state.model,
                measured_tokens=state.measured_tokens,
                context_window=state.context_window,
                foreign_session_id=state.foreign_session_id,
            )
        case TurnStarted(turn_id=turn_id, inputs=inputs):
            return LoopState(
                name=state.name,
                history=state.history.appended(*(user_message(i.text) for i in inputs)),
                turn=TurnState(turn_id=turn_id, step=1, phase="model", usage=ZERO_USAGE, mode=state.mode),
                queued=_without(state.queued, (i.command_id for i in inputs)) if state.queued else (),
                turns=state.turns + 1,
                usage=state.usage,
                last_reply=state.last_reply,
                context_tokens=state.context_tokens,
                context_mark=state.context_mark,
                mode=state.mode,
                model=state.model,
                measured_tokens=state.measured_tokens,
                context_window=state.context_window,
                foreign_session_id=state.foreign_session_id,
            )
        case TurnDone(text=text, step_usage=step_usage):
            history = state.history.appended(Message(role="assistant", content=text))
            return LoopState(
                name=state.name,
                history=history,
                turn=None,
                queued=state.queued,
                turns=state.turns,
                usage=state.usage + step_usage,
                last_reply=text,
                context_tokens=step_usage.input_tokens + step_usage.output_tokens,
                context_mark=len(history),
                mode=state.mode,
                model=state.model,
                measured_tokens=state.measured_tokens,
                context_window=state.context_window,
                foreign_session_id=state.foreign_session_id,
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
        case HistoryCompacted(summary=summary, replaced=replaced, usage=usage):
            # A background compaction may land between turns: then only the loop's usage counts it.
            open_turn = state.turn
            kept = state.history[replaced:]
            return replace(
                state,
                history=History((summary_message(summary), *kept)),
                turn=None if open_turn is None else replace(open_turn, usage=open_turn.usage + usage),
                usage=state.usage + usage,
                context_tokens=0,
                context_mark=0,
            )
        case UserInputRequested(request_id=request_id, question=question, choices=choices, deadline=deadline):
            turn = _turn_of(state, "UserInputRequested")
            ask = OpenAsk(request_id=request_id, question=question, choices=choices, deadline=deadline)
            return replace(state, turn=replace(turn, asks=(*turn.asks, ask)))
        case GateOpened(gate_id=gate_id, call_ids=call_ids, prompt=prompt, deadline=deadline):
            turn = _turn_of(state, "GateOpened")
            gate = OpenGate(gate_id=gate_id, call_ids=call_ids, prompt=prompt, deadline=deadline)
            return replace(state, turn=replace(turn, gate=gate))
        case GateResolved():
            turn = _turn_of(state, "GateResolved")
            return replace(state, turn=replace(turn, gate=None))
        case LoopModeChanged(mode=mode):
            return replace(state, mode=mode)
        case LoopInferenceChanged(model=model):
            return replace(state, model=model)
        case ContextMeasured(tokens=tokens, window=window):
            return replace(state, measured_tokens=tokens, context_window=window)
        case ForeignSessionBound(foreign_session_id=foreign_session_id):
            return replace(state, foreign_session_id=foreign_session_id)
        case ForeignToolUsed():
            return state  # a record only: the foreign CLI's own session holds what it did
        case TurnFailed(outcomes=outcomes) | TurnInterrupted(outcomes=outcomes):
            return replace(state, history=_close_calls(state.history, outcomes), turn=None)
    raise TypeError(f"not a loop event: {event!r}")  # pragma: no cover - the union is closed


def _loop_of(loops: Mapping[str, LoopState], name: str) -> LoopState:
    """The state of loop ``name``; a loop first seen in an event starts empty."""
    return loops.get(name) or LoopState(name=name)


def _session(state: SessionState, loops: Mapping[str, LoopState], last_seq: int) -> SessionState:
    return SessionState(
        session_id=state.session_id,
        rig=state.rig,
        status=state.status,
        loops=loops,
        last_seq=last_seq,
        agents=state.agents,
        active_loop=state.active_loop,
        fingerprint=state.fingerprint,
        workspace=state.workspace,
        hustles=state.hustles,
    )


def apply(state: SessionState, event: SessionEvent | LoopEvent, seq: int | None = None) -> SessionState:
    """Fold one stored event (optionally with its journal seq) into the session state."""
    last_seq = state.last_seq if seq is None else seq
    match event:
        case SessionStarted(session_id=session_id, rig=rig, loops=names, fingerprint=fingerprint):
            return SessionState(
                session_id=session_id,
                rig=rig,
                status="active",
                loops=MappingProxyType({n: LoopState(name=n) for n in names}),
                last_seq=0 if seq is None else seq,
                fingerprint=MappingProxyType(dict(fingerprint)),
            )
        case ActiveLoopChanged(active=active):
            return replace(state, active_loop=active, last_seq=last_seq)
        case ConfigurationAdopted(fingerprint=fingerprint):
            return replace(state, fingerprint=MappingProxyType(dict(fingerprint)), last_seq=last_seq)
        case SessionRestored():
            return replace(state, status="active", last_seq=last_seq)
        case SessionForked(session_id=session_id):
            # A fork's fold up to here is its parent's; from here on it is its own session (and active, even
            # when the parent had stopped by that seq). Its workspace is its rig's (a `WorkspaceForked` that
            # follows names its own directory): not the directory, nor an unfinished restore, of an ancestor.
            workspace = replace(state.workspace, directory="", pending_fork=None)
            return replace(state, session_id=session_id, status="active", workspace=workspace, last_seq=last_seq)
        case SessionStopped():
            return replace(state, status="stopped", last_seq=last_seq)
        case AgentStarted(agent=name):
            loops = dict(state.loops)
            loops.setdefault(name, LoopState(name=name))
            return replace(
                state, loops=MappingProxyType(loops), agents=apply_agents(state.agents, event), last_seq=last_seq
            )
        case WorkspaceCheckpointed() | WorkspaceRestored() | WorkspaceForked():
            return replace(state, workspace=apply_workspace(state.workspace, event), last_seq=last_seq)
        case AgentStopped():
            return replace(state, agents=apply_agents(state.agents, event), last_seq=last_seq)
        case HustleStarted() | HustleCompleted() | HustleFailed():
            return replace(state, hustles=apply_hustles(state.hustles, event), last_seq=last_seq)
        case HustleRefused():
            return replace(state, last_seq=last_seq)  # a refusal is a record: nothing was opened
    loops = dict(state.loops)
    loops[event.loop] = apply_loop(_loop_of(loops, event.loop), event)
    return _session(state, MappingProxyType(loops), last_seq)


def fold(events: Iterable[tuple[int, SessionEvent | LoopEvent]], state: SessionState | None = None) -> SessionState:
    """Rebuild a session state from (seq, event) pairs: restore is exactly this fold.

    The same as applying `apply` to each pair in turn, without building a `SessionState` per event: loop-scoped
    events go straight to their loop's `LoopState` through `apply_loop`; a session-scoped event goes through
    `apply` on the state built so far.
    """
    current = state if state is not None else SessionState(session_id="")
    loops = dict(current.loops)
    last_seq = current.last_seq
    for seq, event in events:
        if event.scope is Scope.LOOP:
            name = event.loop  # type: ignore[union-attr]  # every loop-scoped event names its loop
            loops[name] = apply_loop(_loop_of(loops, name), event)  # type: ignore[arg-type]
        else:
            current = apply(_session(current, MappingProxyType(loops), last_seq), event, seq)
            loops = dict(current.loops)
        last_seq = seq
    return _session(current, MappingProxyType(loops), last_seq)
