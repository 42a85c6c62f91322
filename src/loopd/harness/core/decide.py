"""`decide(state, input) -> Decision(events, effects)`: the pure heart of a loop.

No I/O, no clock (``now`` is an argument), no randomness (turn ids derive from the state).

Queued-input rule (documented behaviour):
  * An input that arrives while the loop is idle starts a turn.
  * An input that arrives while a turn runs is queued (``InputQueued``, enduring). At the next step boundary —
    after the tool batch, before the next model call — every queued input is folded into the running turn
    (``InputsFolded``), so the model sees it in the same turn. If the turn ends first, all queued inputs start
    the next turn together.
  * At most ``max_queued`` inputs wait; more are rejected (``InputRejected``).
  * Interrupt ends the running turn and cancels every queued input (``InputCancelled``): an interrupt means
    "stop what you are doing", including what was waiting to be done.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from loopd.harness.core._values import ToolOutcome
from loopd.harness.core.apply import apply_loop
from loopd.harness.core.commands import (
    AnswerGate,
    CancelQueuedInput,
    ChangeLoopInference,
    Interrupt,
    ProvideUserInput,
    SetLoopMode,
    UserInput,
)
from loopd.harness.core.compaction import compact_threshold, measure_context, must_wait, should_compact
from loopd.harness.core.events import (
    FOREIGN_OUTPUT_LIMIT,
    ContextMeasured,
    ForeignSessionBound,
    ForeignToolUsed,
    GateOpened,
    GateResolved,
    HistoryCompacted,
    InputCancelled,
    InputQueued,
    InputRejected,
    InputsFolded,
    LoopEvent,
    LoopInferenceChanged,
    LoopModeChanged,
    ModelReplied,
    QueuedInput,
    StepDone,
    ToolCompleted,
    TurnDone,
    TurnFailed,
    TurnInterrupted,
    TurnStarted,
    UserInputRequested,
)
from loopd.harness.core.inputs import (
    ArmAsk,
    ArmGate,
    CallModel,
    CancelTurn,
    Compact,
    CompactionDone,
    CompactionFailed,
    Effect,
    ForeignSessionSeen,
    ForeignToolFinished,
    GateAnswered,
    GateNeeded,
    ModelCompleted,
    ModelFailed,
    ResolveGate,
    RunTools,
    ToolFinished,
    UserInputExpired,
    UserInputNeeded,
)
from loopd.harness.core.state import LoopState, TurnState

LoopInput = (
    CompactionDone
    | CompactionFailed
    | UserInput
    | CancelQueuedInput
    | AnswerGate
    | Interrupt
    | ModelCompleted
    | ModelFailed
    | ToolFinished
    | GateNeeded
    | GateAnswered
    | SetLoopMode
    | ChangeLoopInference
    | ProvideUserInput
    | UserInputNeeded
    | UserInputExpired
    | ForeignSessionSeen
    | ForeignToolFinished
)


@dataclass(frozen=True, slots=True)
class LoopConfig:
    """The parts of a loop definition that `decide` needs."""

    name: str
    max_steps: int = 25
    max_queued: int = 16
    compact_at_tokens: int | None = None
    compact_keep_recent: int = 8
    compact_block_at_tokens: int | None = None  # the turn waits for its compaction from here (`must_wait`)
    # Modes and models (`SetLoopMode`, `ChangeLoopInference`); context measurement (`ContextMeasured`).
    modes: tuple[str, ...] = ()
    default_mode: str | None = None
    model: str = ""
    models: tuple[str, ...] = ()  # the models a loop may switch to (empty: any)
    context_window: int | None = None
    pressure_at: float = 0.8

    def mode_of(self, state: LoopState) -> str | None:
        """The loop's current mode (its definition's default until a `LoopModeChanged`)."""
        return state.mode if state.mode is not None else self.default_mode

    def model_of(self, state: LoopState) -> str:
        """The model the loop's next call uses (its definition's until a `LoopInferenceChanged`)."""
        return state.model if state.model is not None else self.model


@dataclass(frozen=True, slots=True)
class Decision:
    events: tuple[LoopEvent, ...] = ()
    effects: tuple[Effect, ...] = ()
    state: LoopState | None = field(default=None, compare=False, repr=False)
    """The input state with ``events`` folded in (`decide` folds each event as it emits it), so the actor that
    commits them takes this state instead of folding them a second time; None when there are no events."""


@dataclass(slots=True)
class _Builder:
    """Accumulates events, folding each one so later decisions see the post-state."""

    state: LoopState
    config: LoopConfig
    events: list[LoopEvent] = field(default_factory=list)
    effects: list[Effect] = field(default_factory=list)

    def emit(self, event: LoopEvent) -> None:
        self.events.append(event)
        self.state = apply_loop(self.state, event)

    def call_model(self, *, compact: bool = True) -> None:
        """The next model call — or first a compaction of the history, when the context is past the threshold."""
        turn = self.state.turn
        assert turn is not None
        if compact:
            threshold = compact_threshold(self.config.compact_at_tokens, self.config.context_window)
            cut = should_compact(self.state, threshold=threshold, keep_recent=self.config.compact_keep_recent)
            if cut:
                wait = must_wait(
                    self.state,
                    threshold=threshold,
                    block_at=self.config.compact_block_at_tokens,
                    context_window=self.config.context_window,
                )
                prefix = self.state.history[:cut]
                self.effects.append(Compact(turn_id=turn.turn_id, step=turn.step, messages=prefix, blocking=wait))
                if wait:
                    return
        # The history itself, not a copy: a `History` is immutable, and each step's copy of a long one was O(n).
        self.effects.append(CallModel(turn_id=turn.turn_id, step=turn.step, messages=self.state.history))

    def start_queued_turn(self, now: float) -> None:
        if self.state.turn is None and self.state.queued:
            self.emit(
                TurnStarted(
                    loop=self.state.name,
                    turn_id=f"{self.state.name}/{self.state.turns + 1}",
                    inputs=self.state.queued,
                    at=now,
                )
            )
            self.call_model()

    def done(self) -> Decision:
        return Decision(
            events=tuple(self.events), effects=tuple(self.effects), state=self.state if self.events else None
        )


def _closing_outcomes(state: LoopState, status: str, message: str) -> tuple[ToolOutcome, ...]:
    turn = state.turn
    if turn is None or turn.phase != "tools":
        return ()
    return tuple(
        ToolOutcome(call_id=c.id, name=c.name, status=status, output=message)  # type: ignore[arg-type]
        for c in turn.open_calls
    )


def _open_gate(
    b: _Builder,
    loop: str,
    turn_id: str,
    step: int,
    gate_id: str,
    call_ids: tuple[str, ...],
    prompt: dict[str, Any],
    deadline: float,
    now: float,
) -> None:
    """Emit ``GateOpened`` for ``call_ids`` and arm its deadline."""
    b.emit(
        GateOpened(
            loop=loop,
            turn_id=turn_id,
            step=step,
            gate_id=gate_id,
            call_ids=call_ids,
            prompt=prompt,
            deadline=deadline,
            at=now,
        )
    )
    b.effects.append(ArmGate(turn_id=turn_id, step=step, gate_id=gate_id, deadline=deadline))


def _is_current(state: LoopState, turn_id: str, step: int, phase: str) -> bool:
    turn = state.turn
    return turn is not None and turn.turn_id == turn_id and turn.step == step and turn.phase == phase


def decide(state: LoopState, event_input: LoopInput, *, config: LoopConfig, now: float) -> Decision:
    """Decide what one input means for a loop. Stale completions (of an ended turn) decide nothing."""
    b = _Builder(state, config)
    name = state.name
    match event_input:
        case UserInput(command_id=command_id, text=text):
            if state.turn is None and not state.queued:
                b.emit(
                    TurnStarted(
                        loop=name,
                        turn_id=f"{name}/{state.turns + 1}",
                        inputs=(QueuedInput(command_id=command_id, text=text),),
                        at=now,
                    )
                )
                b.call_model()
            elif len(state.queued) >= config.max_queued:
                b.emit(InputRejected(loop=name, command_id=command_id, reason="input queue is full"))
            else:
                b.emit(InputQueued(loop=name, command_id=command_id, text=text))
        case CancelQueuedInput(target_command_id=target):
            if any(q.command_id == target for q in state.queued):
                b.emit(InputCancelled(loop=name, command_id=target, reason="cancelled"))
        case Interrupt(reason=reason):
            _interrupt(b, reason, now, status="interrupted", message="interrupted before it completed")
        case CompactionDone(
            turn_id=turn_id, step=step, summary=summary, replaced=replaced, usage=usage, blocking=blocking
        ):
            # The summary replaces a prefix of the history, which only grows between compactions (one at a time
            # per loop, see the runtime's lanes): it lands whenever it is ready, in a turn or between turns.
            if 0 < replaced <= len(state.history) and summary.strip():
                b.emit(
                    HistoryCompacted(
                        loop=name, turn_id=turn_id, step=step, summary=summary, replaced=replaced, usage=usage, at=now
                    )
                )
            if blocking and _is_current(state, turn_id, step, "model"):
                b.call_model(compact=False)
        case CompactionFailed(turn_id=turn_id, step=step, blocking=blocking):
            # Compaction is an optimization: without a summary the call goes out with the full history.
            if blocking and _is_current(state, turn_id, step, "model"):
                b.call_model(compact=False)
        case UserInputNeeded(turn_id=turn_id, step=step, request_id=request_id):
            turn = state.turn
            if not _is_current(state, turn_id, step, "tools") or turn is None:
                return Decision()
            if request_id not in {c.id for c in turn.open_calls} or any(a.request_id == request_id for a in turn.asks):
                return Decision()
            b.emit(
                UserInputRequested(
                    loop=name,
                    turn_id=turn_id,
                    step=step,
                    request_id=request_id,
                    question=event_input.question,
                    choices=event_input.choices,
                    deadline=event_input.deadline,
                    at=now,
                )
            )
            b.effects.append(ArmAsk(turn_id=turn_id, step=step, request_id=request_id, deadline=event_input.deadline))
        case ProvideUserInput(request_id=request_id, text=text):
            _close_ask(b, config, now, request_id, status="ok", output=ANSWER_PREFIX + text)
        case UserInputExpired(turn_id=turn_id, step=step, request_id=request_id):
            if _is_current(state, turn_id, step, "tools"):
                _close_ask(b, config, now, request_id, status="error", output=NO_ANSWER)
        case ModelCompleted(turn_id=turn_id, step=step, text=text, tool_calls=calls, usage=usage):
            if not _is_current(state, turn_id, step, "model"):
                return Decision()
            turn = state.turn
            assert turn is not None
            tokens = measure_context(state, text, calls, usage)
            b.emit(
                ContextMeasured(
                    loop=name, turn_id=turn_id, step=step, tokens=tokens, window=config.context_window, at=now
                )
            )
            if calls:
                b.emit(ModelReplied(loop=name, turn_id=turn_id, step=step, text=text, tool_calls=calls, usage=usage))
                b.effects.append(RunTools(turn_id=turn_id, step=step, calls=calls))
            else:
                b.emit(
                    TurnDone(
                        loop=name,
                        turn_id=turn_id,
                        step=step,
                        text=text,
                        step_usage=usage,
                        usage=turn.usage + usage,
                        at=now,
                    )
                )
                b.start_queued_turn(now)
        case ModelFailed(turn_id=turn_id, step=step, error_type=error_type, message=message):
            if not _is_current(state, turn_id, step, "model"):
                return Decision()
            turn = state.turn
            assert turn is not None
            b.emit(
                TurnFailed(
                    loop=name,
                    turn_id=turn_id,
                    error_type=error_type,
                    message=message,
                    usage=turn.usage,
                    at=now,
                )
            )
            b.start_queued_turn(now)
        case ToolFinished(turn_id=turn_id, step=step, outcome=outcome):
            if not _is_current(state, turn_id, step, "tools"):
                return Decision()
            turn = state.turn
            assert turn is not None
            if outcome.call_id not in {c.id for c in turn.open_calls}:
                return Decision()
            b.emit(ToolCompleted(loop=name, turn_id=turn_id, step=step, outcome=outcome))
            _finish_step_if_complete(b, config, now)
        case GateNeeded(turn_id=turn_id, step=step, gate_id=gate_id, call_ids=call_ids, prompt=prompt) if _is_current(
            state, turn_id, step, "model"
        ):
            # A foreign loop's CLI asks mid-turn (its own tool, no batch of the loop's): one gate at a time.
            if state.turn is not None and state.turn.gate is None and call_ids:
                _open_gate(b, name, turn_id, step, gate_id, call_ids, prompt, event_input.deadline, now)
        case GateNeeded(turn_id=turn_id, step=step, gate_id=gate_id, call_ids=call_ids, prompt=prompt):
            turn = state.turn
            if not _is_current(state, turn_id, step, "tools") or turn is None or turn.gate is not None:
                return Decision()
            open_ids = {c.id for c in turn.open_calls}
            waiting = tuple(c for c in call_ids if c in open_ids)
            if not waiting:
                return Decision()
            _open_gate(b, name, turn_id, step, gate_id, waiting, prompt, event_input.deadline, now)
        case AnswerGate(gate_id=gate_id, answer=answer):
            turn = state.turn
            if turn is None or turn.gate is None or turn.gate.gate_id != gate_id:
                return Decision()
            # Every answer goes through the runtime, which binds the first one only.
            b.effects.append(
                ResolveGate(
                    turn_id=turn.turn_id,
                    step=turn.step,
                    gate_id=gate_id,
                    answer=answer,
                    prompt=dict(turn.gate.prompt),
                )
            )
        case ForeignSessionSeen(engine=engine, session_id=session_id):
            # Journaled once per id: later turns resume it (also after a restore, and after an interrupt, since
            # the foreign CLI's session exists as soon as it names it).
            if session_id and session_id != state.foreign_session_id:
                b.emit(ForeignSessionBound(loop=name, engine=engine, foreign_session_id=session_id, at=now))
        case ForeignToolFinished(turn_id=turn_id, step=step, call_id=call_id, name=tool_name) if _is_current(
            state, turn_id, step, "model"
        ):
            b.emit(
                ForeignToolUsed(
                    loop=name,
                    turn_id=turn_id,
                    call_id=call_id,
                    name=tool_name,
                    arguments=event_input.arguments,
                    output=event_input.output[:FOREIGN_OUTPUT_LIMIT],
                    is_error=event_input.is_error,
                    at=now,
                )
            )
        case SetLoopMode(mode=mode):
            # The session refuses unknown modes before they get here; a stale one decides nothing.
            current = config.mode_of(state)
            if mode in config.modes and mode != current:
                b.emit(LoopModeChanged(loop=name, mode=mode, previous=current, at=now))
        case ChangeLoopInference(model=model):
            current_model = config.model_of(state)
            if (not config.models or model in config.models) and model != current_model:
                b.emit(LoopInferenceChanged(loop=name, model=model, previous=current_model or None, at=now))
        case GateAnswered(turn_id=turn_id, step=step, gate_id=gate_id) if _is_current(state, turn_id, step, "model"):
            # A foreign CLI's gate: the answer is journaled; the runtime hands it to the waiting CLI.
            gate = state.turn.gate if state.turn is not None else None
            if gate is not None and gate.gate_id == gate_id:
                b.emit(
                    GateResolved(
                        loop=name,
                        turn_id=turn_id,
                        step=step,
                        gate_id=gate_id,
                        answer=event_input.answer,  # type: ignore[arg-type]
                        granted=event_input.granted,
                        reason=event_input.reason,
                        at=now,
                    )
                )
        case GateAnswered(turn_id=turn_id, step=step, gate_id=gate_id, answer=answer, granted=granted, reason=reason):
            turn = state.turn
            if not _is_current(state, turn_id, step, "tools") or turn is None or turn.gate is None:
                return Decision()
            if turn.gate.gate_id != gate_id:
                return Decision()
            _resolve_gate(b, config, now, answer=answer, granted=granted, reason=reason)
    return b.done()


ANSWER_PREFIX = "The user answered: "
"""How an ask_user answer reads as the tool result (the answer follows)."""
NO_ANSWER = "no answer: the user did not answer before the question's deadline; go on without it"


def _close_ask(b: _Builder, config: LoopConfig, now: float, request_id: str, *, status: str, output: str) -> None:
    """Close the open question ``request_id`` with its tool result (the first answer binds; others decide nothing)."""
    turn = b.state.turn
    if turn is None or turn.phase != "tools":
        return
    ask = next((a for a in turn.asks if a.request_id == request_id), None)
    call = next((c for c in turn.open_calls if c.id == request_id), None)
    if ask is None or call is None:
        return
    outcome = ToolOutcome(call_id=call.id, name=call.name, status=status, output=output)  # type: ignore[arg-type]
    b.emit(ToolCompleted(loop=b.state.name, turn_id=turn.turn_id, step=turn.step, outcome=outcome))
    _finish_step_if_complete(b, config, now)


def _resolve_gate(b: _Builder, config: LoopConfig, now: float, *, answer: str, granted: bool, reason: str) -> None:
    turn = b.state.turn
    assert turn is not None and turn.gate is not None
    gate = turn.gate
    b.emit(
        GateResolved(
            loop=b.state.name,
            turn_id=turn.turn_id,
            step=turn.step,
            gate_id=gate.gate_id,
            answer=answer,  # type: ignore[arg-type]
            granted=granted,
            reason=reason,
            at=now,
        )
    )
    gated = tuple(c for c in turn.open_calls if c.id in gate.call_ids)
    if granted:
        b.effects.append(RunTools(turn_id=turn.turn_id, step=turn.step, calls=gated, gated=False))
        return
    why = reason or answer
    for call in gated:
        outcome = ToolOutcome(call_id=call.id, name=call.name, status="denied", output=f"permission denied: {why}")
        b.emit(ToolCompleted(loop=b.state.name, turn_id=turn.turn_id, step=turn.step, outcome=outcome))
    _finish_step_if_complete(b, config, now)


def _finish_step_if_complete(b: _Builder, config: LoopConfig, now: float) -> None:
    turn = b.state.turn
    assert turn is not None
    if turn.open_calls:
        return
    b.emit(StepDone(loop=b.state.name, turn_id=turn.turn_id, step=turn.step, usage=turn.step_usage))
    if turn.step >= config.max_steps:
        b.emit(
            TurnFailed(
                loop=b.state.name,
                turn_id=turn.turn_id,
                error_type="max_steps_exceeded",
                message=f"the turn used its {config.max_steps} steps without a final answer",
                usage=turn.usage,
                at=now,
            )
        )
        b.start_queued_turn(now)
        return
    if b.state.queued:
        b.emit(InputsFolded(loop=b.state.name, turn_id=turn.turn_id, inputs=b.state.queued))
    b.call_model()


def _interrupt(b: _Builder, reason: str, now: float, *, status: str, message: str) -> None:
    state = b.state
    turn = state.turn
    queued = state.queued
    if turn is not None:
        b.emit(
            TurnInterrupted(
                loop=state.name,
                turn_id=turn.turn_id,
                reason=reason,
                usage=turn.usage,
                outcomes=_closing_outcomes(state, status, message),
                at=now,
            )
        )
        b.effects.append(CancelTurn(turn_id=turn.turn_id))
    for q in queued:
        b.emit(InputCancelled(loop=state.name, command_id=q.command_id, reason=reason))


UNKNOWN_OUTCOME = "outcome unknown: the session stopped while this tool ran; it was not repeated"


def recover(
    state: LoopState,
    *,
    config: LoopConfig,
    mode: str,
    idempotent: Callable[[str], bool],
    now: float,
) -> Decision:
    """What to do with a loop rebuilt from the journal (DESIGN §3 recovery rule).

    ``mode="interrupt"``: an open turn gets a synthesized ``TurnInterrupted``; tool calls left open are recorded
    with status ``unknown`` (their effect may or may not have happened); queued inputs are cancelled.

    A turn parked at an open gate or open ask_user questions (no call running besides the gated or asking ones)
    keeps them in both modes: their deadline timers are re-armed and they can be answered as before.

    ``mode="resume"``: a model call in flight is re-issued (a read effect); an open tool call is re-run only if
    its tool declares itself idempotent, otherwise its outcome is recorded as ``unknown`` and surfaced to the
    model, never silently repeated; queued inputs start or join the turn as usual.
    """
    b = _Builder(state, config)
    turn = state.turn
    if turn is not None and turn.gate is not None and turn.phase == "model":
        # A foreign loop's CLI waited at the gate: the CLI ended with the old process, and its question with it.
        _deny_open_gate(b, turn, "the session restarted while the foreign CLI waited", now)
        turn = b.state.turn
    if turn is not None and (turn.gate is not None or turn.asks):
        waiting = {a.request_id for a in turn.asks} | set(turn.gate.call_ids if turn.gate is not None else ())
        if {c.id for c in turn.open_calls} <= waiting:
            # Nothing was running: the turn only waits for a human. The gate and the questions survive the restore.
            gate = turn.gate
            if gate is not None:
                b.effects.append(
                    ArmGate(turn_id=turn.turn_id, step=turn.step, gate_id=gate.gate_id, deadline=gate.deadline)
                )
            _rearm_asks(b)
            return b.done()
    if mode == "interrupt":
        _interrupt(b, "restored", now, status="unknown", message=UNKNOWN_OUTCOME)
        # Effects of a turn that no longer runs have nothing to cancel after a restore.
        b.effects.clear()
        return b.done()
    if mode != "resume":
        raise ValueError(f"unknown recovery mode {mode!r}")
    if turn is None:
        b.start_queued_turn(now)
        return b.done()
    if turn.phase == "model":
        b.call_model()
        return b.done()
    gated_ids = set(turn.gate.call_ids) if turn.gate is not None else set()
    if turn.gate is not None:
        # Calls still waiting at the gate were never approved: deny them; settle the rest as usual.
        _deny_open_gate(b, turn, "the session restarted while other calls were running", now)
    asking = {a.request_id for a in turn.asks}  # open questions stay open: their answer has not come yet
    rerun = tuple(c for c in turn.open_calls if c.id not in gated_ids | asking and idempotent(c.name))
    for call in turn.open_calls:
        if call in rerun or call.id in asking:
            continue
        if call.id in gated_ids:
            outcome = ToolOutcome(
                call_id=call.id, name=call.name, status="denied", output="permission denied: session restarted"
            )
        else:
            outcome = ToolOutcome(call_id=call.id, name=call.name, status="unknown", output=UNKNOWN_OUTCOME)
        b.emit(ToolCompleted(loop=state.name, turn_id=turn.turn_id, step=turn.step, outcome=outcome))
    _rearm_asks(b)
    if rerun:
        b.effects.append(RunTools(turn_id=turn.turn_id, step=turn.step, calls=rerun))
    else:
        _finish_step_if_complete(b, config, now)
    return b.done()


def _rearm_asks(b: _Builder) -> None:
    turn = b.state.turn
    if turn is None:
        return
    for ask in turn.asks:
        b.effects.append(ArmAsk(turn_id=turn.turn_id, step=turn.step, request_id=ask.request_id, deadline=ask.deadline))


def _deny_open_gate(b: _Builder, turn: TurnState, reason: str, now: float) -> None:
    """Restore: deny the turn's open gate (its asker can no longer be answered in the process that asked)."""
    assert turn.gate is not None
    b.emit(
        GateResolved(
            loop=b.state.name,
            turn_id=turn.turn_id,
            step=turn.step,
            gate_id=turn.gate.gate_id,
            answer="deny",
            granted=False,
            reason=reason,
            at=now,
        )
    )
