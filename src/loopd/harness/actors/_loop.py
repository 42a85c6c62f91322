"""The loop actor: one asyncio task that owns a loop's state and runs its pipeline.

    mailbox → decide (pure) → persist (journal) → apply (pure) → publish (hub) → effects → back to the mailbox

Effects (model streams, tool calls) run as child tasks of the actor; their completions re-enter the mailbox.
An actor never swallows `asyncio.CancelledError`; cancelling it cancels its effects.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from loopd._infra.clock import Clock
from loopd._infra.tasks import TaskSet, wait_ended
from loopd._infra.telemetry import Span, tracing_enabled
from loopd.harness._errors import ModelError, SessionFaultError, ToolError
from loopd.harness.actors._hustle import HustleQueueFullError, HustleResult
from loopd.harness.actors._mailbox import Mailbox
from loopd.harness.actors._tracing import LoopTracing
from loopd.harness.core import ZERO_USAGE, Idempotency, ToolCall, ToolOutcome, Usage, user_message
from loopd.harness.core.commands import (
    AnswerGate,
    CancelQueuedInput,
    ChangeLoopInference,
    Interrupt,
    ProvideUserInput,
    SetLoopMode,
    UserInput,
)
from loopd.harness.core.compaction import SUMMARIZER_PROMPT, context_pressure, pressure_limit, render_transcript
from loopd.harness.core.config import LoopMode, compose_prompt, mode_named
from loopd.harness.core.decide import Decision, LoopConfig, LoopInput, decide
from loopd.harness.core.events import (
    ContextMeasured,
    ContextPressure,
    GateResolved,
    LoopEvent,
    ModelRetrying,
    TokenDelta,
    ToolCallStarted,
    ToolCompleted,
    ToolProgress,
    TurnDone,
    TurnFailed,
    TurnInterrupted,
    TurnStarted,
)
from loopd.harness.core.hustles import HustleInfo
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
from loopd.harness.core.state import LoopState
from loopd.harness.foreign import (
    ForeignEngine,
    ForeignEngineError,
    ForeignEvent,
    ForeignProtocolError,
    PermissionRequest,
    SessionBound,
    TextPiece,
    ToolUse,
    plain_session_id,
    run_foreign_turn,
)
from loopd.harness.foreign import ToolResult as ForeignToolResult
from loopd.harness.gate import (
    GATE_TIMEOUT_DEFAULT,
    AccessConfig,
    GateAnswer,
    GatePrompt,
    RuleStore,
    RuleStoreError,
    Verdict,
    evaluate,
    resolve_answer,
)
from loopd.harness.models import (
    AttemptFailed,
    Model,
    ModelRequest,
    TextDelta,
    ToolCallDelta,
    ToolSpec,
    UsageReport,
    tool_calls_from_deltas,
)
from loopd.harness.tools import AskUserTool, GrantCandidate, PreparedCall, Requirement, Tool, ToolContext

if TYPE_CHECKING:
    from pathlib import Path

    from loopd.harness.actors._session import Session


@dataclass(frozen=True, slots=True)
class LoopDefinition:
    """A loop of a rig: its model, prompt, tools and limits."""

    name: str
    model: Model
    tools: tuple[Tool, ...] = ()
    system_prompt: str | None = None
    model_name: str | None = None
    max_steps: int = 25
    max_queued: int = 16
    max_parallel_tools: int = 8
    mailbox_capacity: int = 64
    tool_timeout: float = 600.0
    model_timeout: float = 600.0
    temperature: float | None = None
    max_output_tokens: int | None = None
    access: AccessConfig = field(default_factory=AccessConfig)
    gate_timeout: float = GATE_TIMEOUT_DEFAULT
    compact_at_tokens: int | None = None
    compact_keep_recent: int = 8
    compact_block_at_tokens: int | None = None
    """Past ``compact_at_tokens`` compaction runs on a background lane while the turn goes on; from this size on
    the turn waits for it (default: 95 % of ``context_window``, or twice ``compact_at_tokens``)."""
    primers: tuple[str, ...] = ()
    """Names of the rig's primers whose texts follow ``system_prompt`` (`Rig.primers`)."""
    modes: tuple[LoopMode, ...] = ()
    """The loop's modes (e.g. ``(PLAN, BUILD)``); empty: no modes, every tool always."""
    mode: str | None = None
    """The mode a session starts in (default: the first of ``modes``)."""
    models: tuple[str, ...] = ()
    """The model names `ChangeLoopInference` may switch to (empty: any name the model client accepts)."""
    context_window: int | None = None
    """The model's context window in tokens: `ContextMeasured` reports it, compaction and pressure use it."""
    pressure_at: float = 0.8
    """`ContextPressure` is published once a measured context reaches this share of the window."""

    def limits(self) -> dict[str, object]:
        """The loop's limits, as the configuration fingerprint records them (``Rig.fingerprint``)."""
        return {
            "max_steps": self.max_steps,
            "max_queued": self.max_queued,
            "max_parallel_tools": self.max_parallel_tools,
            "tool_timeout": self.tool_timeout,
            "model_timeout": self.model_timeout,
            "gate_timeout": self.gate_timeout,
            "max_output_tokens": self.max_output_tokens,
            "temperature": self.temperature,
            "context_window": self.context_window,
            "compact_at_tokens": self.compact_at_tokens,
            "compact_keep_recent": self.compact_keep_recent,
            "compact_block_at_tokens": self.compact_block_at_tokens,
            "pressure_at": self.pressure_at,
        }

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name:
            raise ValueError(f"invalid loop name {self.name!r}")
        if self.max_steps < 1 or self.max_parallel_tools < 1 or self.max_queued < 0:
            raise ValueError("loop limits must be positive")
        if (self.compact_at_tokens is not None and self.compact_at_tokens < 1) or self.compact_keep_recent < 1:
            raise ValueError("compaction limits must be positive")
        names = [t.spec.name for t in self.tools]
        if len(set(names)) != len(names):
            raise ValueError(f"loop {self.name!r} has duplicate tool names")
        mode_names = [m.name for m in self.modes]
        if len(set(mode_names)) != len(mode_names):
            raise ValueError(f"loop {self.name!r} has duplicate mode names")
        if self.mode is not None and self.mode not in mode_names:
            raise ValueError(f"loop {self.name!r} starts in mode {self.mode!r}, which it does not declare")
        if (self.context_window is not None and self.context_window < 1) or not 0 < self.pressure_at <= 1:
            raise ValueError("context_window must be positive and pressure_at within (0, 1]")
        if isinstance(self.model, ForeignEngine) and (self.compact_at_tokens is not None or self.tools):
            raise ValueError(f"foreign loop {self.name!r} cannot compact or take tools: its CLI owns both")

    @property
    def config(self) -> LoopConfig:
        return LoopConfig(
            name=self.name,
            max_steps=self.max_steps,
            max_queued=self.max_queued,
            compact_at_tokens=self.compact_at_tokens,
            compact_keep_recent=self.compact_keep_recent,
            compact_block_at_tokens=self.compact_block_at_tokens,
            modes=tuple(m.name for m in self.modes),
            default_mode=self.mode if self.mode is not None else (self.modes[0].name if self.modes else None),
            model=self.model_name or self.model.name,
            models=self.models,
            context_window=self.context_window,
            pressure_at=self.pressure_at,
        )

    def is_idempotent(self, tool_name: str) -> bool:
        for tool in self.tools:
            if tool.spec.name == tool_name:
                return tool.idempotency.safe_to_repeat
        return False

    def is_inherently_repeatable(self, tool_name: str) -> bool:
        """Whether ``tool_name`` has no effect a second run could repeat (``Idempotency.INHERENT``: it reads, or
        computes). Not ``KEYED``: a call lost with its unsynced record comes back from a new model call with a new
        id, hence a new key."""
        for tool in self.tools:
            if tool.spec.name == tool_name:
                return tool.idempotency is Idempotency.INHERENT
        return False


@dataclass(slots=True)
class _Ask:
    """A command whose caller waits for the decision (interrupt → whether a turn was stopped)."""

    command: Interrupt
    done: asyncio.Future[bool]


@dataclass(slots=True)
class _Compaction:
    """The loop's one compaction on a lane (one at a time: each replaces a prefix of the history as it was)."""

    turn_id: str
    step: int
    replaced: int
    waiter: tuple[str, int] | None = None  # the (turn, step) that waits for it, if any
    hustle_id: str = ""


class _Stop:
    pass


MailItem = LoopInput | _Ask | _Stop


class LoopActor:
    def __init__(
        self,
        session: Session,
        definition: LoopDefinition,
        state: LoopState,
        *,
        clock: Clock,
        workspace: Path | None,
        rules: RuleStore,
        extra_tools: tuple[Tool, ...] = (),
    ) -> None:
        self.session = session
        self.definition = definition
        self.state = state
        self._folded: tuple[tuple[LoopEvent, ...], LoopState, LoopState | None] | None = None
        self.folds_skipped = 0
        """Commits whose state was taken from their decision's fold instead of folded again (what tests watch)."""
        self.inline_tool_runs = 0
        """Gated batches of one allowed call that ran it in their own task, not in a new one (what tests watch)."""
        self.mailbox: Mailbox[MailItem] = Mailbox(definition.mailbox_capacity)
        self._clock = clock
        self._workspace = workspace
        self._rules = rules
        self._gate_timers: dict[str, asyncio.Task[None]] = {}
        self._resolving: set[str] = set()
        self._ask_timers: dict[str, asyncio.Task[None]] = {}
        self._compaction: _Compaction | None = None
        self._turn_inputs: tuple[str, tuple[str, ...]] | None = None  # a foreign loop's (turn id, its inputs)
        self._foreign_gates: dict[str, asyncio.Future[tuple[bool, str]]] = {}  # gate id → the waiting CLI
        self._config = definition.config
        specs = {t.spec.name: (t, t.spec) for t in definition.tools}
        for extra in extra_tools:  # the definition's own tools win a name clash
            specs.setdefault(extra.spec.name, (extra, extra.spec))
        self._tools: Mapping[str, Tool] = {name: tool for name, (tool, _) in specs.items()}
        self._specs: tuple[ToolSpec, ...] = tuple(spec for _, spec in specs.values())
        self._effects: dict[str, set[asyncio.Task[None]]] = {}  # the running effects of each turn
        self._effect_tasks = TaskSet(f"loop {definition.name} effects")  # owns them: `stop` awaits every one
        self._tool_slots = asyncio.Semaphore(definition.max_parallel_tools)
        self._task: asyncio.Task[None] | None = None
        self.busy = False
        # Spans of turns, model and tool calls: None (and free) while tracing is off.
        self._tracing_model = definition.model_name or definition.model.name
        self._tracing: LoopTracing | None = None
        if tracing_enabled():
            self._tracing = LoopTracing(session_id=session.id, loop=definition.name, model=self._tracing_model)

    @property
    def name(self) -> str:
        return self.definition.name

    @property
    def config(self) -> LoopConfig:
        """What `decide` needs of this loop's definition."""
        return self._config

    def in_current_task(self) -> bool:
        """Whether the caller runs in this actor's own task (it must not abort itself)."""
        return self._task is not None and self._task is asyncio.current_task()

    @property
    def effects_running(self) -> int:
        return sum(len(s) for s in self._effects.values())

    @property
    def quiescent(self) -> bool:
        return self.state.idle and not self.busy and not len(self.mailbox) and not self.effects_running

    @property
    def parked(self) -> bool:
        """The turn only waits for a human (an open gate, open questions): nothing else runs or waits in the mailbox."""
        turn = self.state.turn
        if turn is None or (turn.gate is None and not turn.asks) or self.busy or len(self.mailbox) or self.state.queued:
            return False
        waiting = {a.request_id for a in turn.asks} | set(turn.gate.call_ids if turn.gate is not None else ())
        return {c.id for c in turn.open_calls} <= waiting

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"loopd-loop-{self.session.id}-{self.name}")

    async def stop(self) -> None:
        if self._task is None:
            return
        with contextlib.suppress(Exception):
            self.mailbox.put_priority(_Stop())
        try:
            async with asyncio.timeout(5.0):
                await asyncio.shield(self._task)
        except TimeoutError:
            self._task.cancel()
        await wait_ended(self._task)  # the caller's own cancellation is passed on
        await self._effect_tasks.aclose()  # effects cancelled by the actor's end have ended too

    def abort(self) -> None:
        """Cancel the actor and its effects at once (crash simulation, faults)."""
        if self._task is not None:
            self._task.cancel()
        self._cancel_all_effects()

    async def wait_stopped(self) -> None:
        if self._task is not None:
            await wait_ended(self._task)

    # --- the pipeline --------------------------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            while True:
                item = await self.mailbox.get()
                if isinstance(item, _Stop):
                    return
                self.busy = True
                try:
                    await self._process(item)
                except SessionFaultError:
                    return  # the session has stopped fail-closed; it already told every subscriber
                finally:
                    self.busy = False
                    self.session.notify_changed()
        finally:
            self._cancel_all_effects()
            if self._tracing is not None:
                self._tracing.close()

    async def _process(self, item: LoopInput | _Ask) -> None:
        command: LoopInput = item.command if isinstance(item, _Ask) else item
        if isinstance(command, CompactionDone | CompactionFailed):
            command = self._compaction_arrived(command)
        decision = decide(self.state, command, config=self._config, now=self._clock.time())
        try:
            await self.execute(decision, wait=isinstance(item, _Ask) or not self._repeatable(decision.effects))
        except BaseException:
            if isinstance(item, _Ask) and not item.done.done():
                item.done.cancel()
            raise
        if isinstance(item, _Ask) and not item.done.done():
            item.done.set_result(any(isinstance(e, TurnInterrupted) for e in decision.events))

    async def execute(self, decision: Decision, *, wait: bool = True) -> None:
        """Persist, apply and publish the decision's events, then start its effects. ``wait=False``: the effects may
        start before the events are on the disk (`_repeatable`; they are published once they are)."""
        if decision.events:
            before = self.state.measured_tokens  # the measurement a new one is compared with (once per crossing)
            self._folded = (decision.events, self.state, decision.state)
            try:
                await self.session.commit_loop(self, decision.events, wait=wait)
            finally:
                self._folded = None
            for event in decision.events:
                if isinstance(event, ContextMeasured):
                    self._pressure(event, before)
                    before = event.tokens
        for effect in decision.effects:
            self.start_effect(effect)

    def _repeatable(self, effects: Sequence[Effect]) -> bool:
        """Whether ``effects`` may all start before the records that lead to them reach the disk: after a power loss
        they would simply run again from the records that did — a model call (not a foreign engine's turn, which runs
        its own tools), or tool calls whose tools are all `LoopDefinition.is_inherently_repeatable` (the gate may
        still open a prompt for them: that is a commit of its own, synced). A decision without effects (a turn's end,
        one of several tool results) and anything else (timers, gates, compaction, other tools) waits for the
        sync."""
        if not effects:
            return False
        for effect in effects:
            if isinstance(effect, CallModel):
                if isinstance(self.definition.model, ForeignEngine):
                    return False
            elif isinstance(effect, RunTools):
                if not all(self.definition.is_inherently_repeatable(call.name) for call in effect.calls):
                    return False
            else:
                return False
        return True

    def apply_committed(self, events: tuple[LoopEvent, ...], seqs: list[int]) -> None:
        """Apply and publish events the session has just journaled as ``seqs`` (called under its commit lock)."""
        from loopd.harness.core.apply import apply_loop

        state = self.state
        folded = self._folded
        if folded is not None and folded[0] is events and folded[1] is state and folded[2] is not None:
            # `decide` folded these very events over this very state already: take its result instead of folding
            # them again (a second fold would also copy the history, whose shared buffer the first one extended).
            self.state = folded[2]
            self.folds_skipped += 1
            folded_state = True
        else:
            folded_state = False
        for event, seq in zip(events, seqs, strict=True):
            if not folded_state:
                state = apply_loop(state, event)
                self.state = state
            self.session.publish(seq, event)
            if self._tracing is not None:
                self._tracing.observe(event)
            if isinstance(event, TurnDone | TurnFailed):
                self.session.subagents.report(self.name, event)
            if isinstance(event, TurnStarted):
                self._turn_inputs = (event.turn_id, tuple(i.text for i in event.inputs))
            if isinstance(event, ToolCompleted) and event.outcome.call_id in self._ask_timers:
                ask_timer = self._ask_timers.pop(event.outcome.call_id)
                if ask_timer is not asyncio.current_task():
                    ask_timer.cancel()
            if isinstance(event, GateResolved):
                self._resolving.discard(event.gate_id)
                waiter = self._foreign_gates.pop(event.gate_id, None)
                if waiter is not None and not waiter.done():
                    waiter.set_result((event.granted, event.reason or event.answer))
                timer = self._gate_timers.pop(event.gate_id, None)
                if timer is not None and timer is not asyncio.current_task():
                    timer.cancel()

    # --- effects -------------------------------------------------------------------------------------------

    def _track(self, turn_id: str, coro: Any) -> asyncio.Task[None]:
        task: asyncio.Task[None] = self._effect_tasks.start(coro)
        bucket = self._effects.setdefault(turn_id, set())
        bucket.add(task)

        def _done(t: asyncio.Task[None]) -> None:
            bucket.discard(t)
            if not bucket and self._effects.get(turn_id) is bucket:
                del self._effects[turn_id]
            self.session.notify_changed()

        task.add_done_callback(_done)
        return task

    def start_effect(self, effect: Effect) -> None:
        """Run one effect of a committed decision (owned by this actor: `stop` awaits it)."""
        match effect:
            case CallModel() if isinstance(self.definition.model, ForeignEngine):
                foreign_turn = self._foreign_turn(effect, self.definition.model)
                if self._tracing is not None:  # the CLI's turn is the turn's one model call: a `chat` span
                    foreign_turn = self._tracing.model_call(effect.turn_id, self._tracing_model, foreign_turn)
                self._track(effect.turn_id, foreign_turn)
            case CallModel():
                model_call = self._call_model(effect)
                if self._tracing is not None:
                    model_call = self._tracing.model_call(effect.turn_id, self._tracing_model, model_call)
                self._track(effect.turn_id, model_call)
            case Compact():
                self._compact_on_lane(effect)
            case ArmAsk(turn_id=turn_id, request_id=request_id):
                self._ask_timers[request_id] = self._track(turn_id, self._ask_timer(effect))
            case RunTools(turn_id=turn_id, step=step, calls=calls, gated=True):
                withheld = self._withheld(turn_id, step, calls)
                calls = tuple(c for c in calls if c.id not in withheld)
                if calls:
                    self._track(turn_id, self._gate_batch(turn_id, step, calls))
            case RunTools(turn_id=turn_id, step=step, calls=calls):
                for call in calls:
                    self._track(turn_id, self._traced_tool(turn_id, step, call))
            case ArmGate(turn_id=turn_id, gate_id=gate_id):
                self._gate_timers[gate_id] = self._track(turn_id, self._gate_timer(effect))
            case ResolveGate(turn_id=turn_id, gate_id=gate_id):
                if gate_id not in self._resolving:  # an answer binds once
                    self._resolving.add(gate_id)
                    self._track(turn_id, self._resolve_gate(effect))
            case CancelTurn(turn_id=turn_id):
                for task in self._effects.pop(turn_id, set()):
                    task.cancel()

    def _cancel_all_effects(self) -> None:
        for bucket in self._effects.values():
            for task in bucket:
                task.cancel()
        self._effects.clear()

    def _publish(self, event: TokenDelta | ToolCallStarted | ToolProgress | ContextPressure | ModelRetrying) -> None:
        self.session.publish(None, event)

    def _pressure(self, measured: ContextMeasured, previous_tokens: int) -> None:
        """Publish `ContextPressure` when a measured context crosses the loop's pressure threshold (the measurement
        before it, ``previous_tokens``, was below it)."""
        c = self._config
        pressure = context_pressure(
            measured,
            limit=pressure_limit(c.compact_at_tokens, c.context_window),
            pressure_at=c.pressure_at,
            previous_tokens=previous_tokens,
        )
        if pressure is not None:
            self._publish(pressure)

    def step_mode(self) -> LoopMode | None:
        """The mode of the running step (the loop's mode when the step began), or of the next one when idle."""
        turn = self.state.turn
        name = turn.mode if turn is not None and turn.mode is not None else self._config.mode_of(self.state)
        return mode_named(self.definition.modes, name) or mode_named(self.definition.modes, self._config.default_mode)

    def _offered(self, mode: LoopMode | None) -> tuple[ToolSpec, ...]:
        if mode is None:
            return self._specs
        return tuple(s for s in self._specs if mode.allows(s.name, self._tools[s.name].effect))

    def _withheld(self, turn_id: str, step: int, calls: tuple[ToolCall, ...]) -> set[str]:
        """Deny (without running) the calls of a batch that the step's mode does not offer; their ids."""
        mode = self.step_mode()
        withheld: set[str] = set()
        for call in calls:
            tool = self._tools.get(call.name)
            if mode is not None and tool is not None and not mode.allows(call.name, tool.effect):
                withheld.add(call.id)
                reason = f"tool {call.name!r} is not available in mode {mode.name!r}"
                self._finish(turn_id, step, call.id, call.name, "denied", reason)
        return withheld

    async def _call_model(self, effect: CallModel) -> None:
        d = self.definition
        mode = self.step_mode()
        # Built without re-validating: every field is already a typed value from the loop's own state.
        request = ModelRequest.model_construct(
            model=self._config.model_of(self.state),
            messages=effect.messages,
            tools=self._offered(mode),
            system=compose_prompt(d.system_prompt, (), mode),
            temperature=d.temperature,
            max_output_tokens=d.max_output_tokens,
        )
        refused = self.session.budget_refusal()
        if refused is not None:
            self.mailbox.put_result(
                ModelFailed(turn_id=effect.turn_id, step=effect.step, error_type="BudgetExceeded", message=str(refused))
            )
            return
        text: list[str] = []
        offset = 0
        deltas: list[ToolCallDelta] = []
        usage: Usage = ZERO_USAGE
        result: ModelCompleted | ModelFailed
        try:
            async with asyncio.timeout(d.model_timeout):
                async for chunk in d.model.stream(request):
                    match chunk:
                        case TextDelta(text=piece):
                            text.append(piece)
                            self._publish(
                                TokenDelta(
                                    loop=self.name, turn_id=effect.turn_id, step=effect.step, text=piece, offset=offset
                                )
                            )
                            offset += len(piece)
                        case ToolCallDelta():
                            deltas.append(chunk)
                        case UsageReport(usage=reported):
                            usage = usage + reported
                        case AttemptFailed():  # the adapter retries or falls back: say so (nothing is journaled)
                            self._publish(
                                ModelRetrying(
                                    loop=self.name,
                                    turn_id=effect.turn_id,
                                    step=effect.step,
                                    attempt=chunk.attempt + 1,
                                    delay=chunk.retry_after or 0.0,
                                    error=chunk.message,
                                    model=chunk.model,
                                    provider=chunk.provider,
                                    status_code=chunk.status_code,
                                    next=chunk.next,
                                )
                            )
            calls = tool_calls_from_deltas(deltas)
            usage = self.session.price(request.model, usage)
            result = ModelCompleted(
                turn_id=effect.turn_id, step=effect.step, text="".join(text), tool_calls=calls, usage=usage
            )
        except ModelError as exc:
            result = ModelFailed(
                turn_id=effect.turn_id, step=effect.step, error_type=type(exc).__name__, message=str(exc)
            )
        except TimeoutError:
            result = ModelFailed(
                turn_id=effect.turn_id,
                step=effect.step,
                error_type="ModelTimeout",
                message=f"no reply within {d.model_timeout:g}s",
            )
        except Exception as exc:  # a model adapter bug must end the turn, not the session
            result = ModelFailed(turn_id=effect.turn_id, step=effect.step, error_type="ModelCrashed", message=repr(exc))
        if self._tracing is not None:
            self._tracing.model_result(result)
        self.mailbox.put_result(result)

    # --- foreign loops -------------------------------------------------------------------------------------

    async def _foreign_turn(self, effect: CallModel, engine: ForeignEngine) -> None:
        """Run the turn in the foreign CLI (`loopd.harness.foreign`): its session id is journaled as soon as it is
        named, its text streams as `TokenDelta`, its own tools as `ToolCallStarted` / `ToolProgress`, its permission
        requests go through the gate, and each of its tool results is journaled (`ForeignToolUsed`); its final answer
        (or failure) ends the turn like a model reply without tools."""
        d = self.definition
        turn_id, step = effect.turn_id, effect.step
        refused = self.session.budget_refusal()  # the session's budget counts the CLI's reported usage too
        if refused is not None:
            self.mailbox.put_result(
                ModelFailed(turn_id=turn_id, step=step, error_type="BudgetExceeded", message=str(refused))
            )
            return
        text: list[str] = []
        offset = 0
        uses: dict[str, tuple[str, dict[str, Any]]] = {}  # the CLI's tool uses waiting for their results
        tool_spans: dict[str, Span] = {}  # their `execute_tool` spans while tracing is on

        def on_event(event: ForeignEvent) -> None:
            nonlocal offset
            match event:
                case SessionBound(session_id=session_id) if plain_session_id(session_id):
                    # (an id that could not go on a command line is not kept: the next turn starts a new session)
                    self.mailbox.put_result(ForeignSessionSeen(engine=engine.kind, session_id=session_id))
                case TextPiece(text=piece) if piece:
                    text.append(piece)
                    self._publish(TokenDelta(loop=self.name, turn_id=turn_id, step=step, text=piece, offset=offset))
                    offset += len(piece)
                case ToolUse(call_id=call_id, name=tool, arguments=arguments):
                    uses[call_id] = (tool, arguments)
                    if self._tracing is not None and call_id not in tool_spans:
                        tool_spans[call_id] = self._tracing.foreign_tool(call_id, tool)
                    summary = str(arguments)[:200]
                    self._publish(
                        ToolCallStarted(loop=self.name, turn_id=turn_id, call_id=call_id, name=tool, summary=summary)
                    )
                case ForeignToolResult(call_id=call_id, output=output, is_error=is_error):
                    message = ("error: " if is_error else "") + output[:500]
                    self._publish(ToolProgress(loop=self.name, turn_id=turn_id, call_id=call_id, message=message))
                    tool, arguments = uses.pop(call_id, ("", {}))
                    if (span := tool_spans.pop(call_id, None)) is not None:
                        LoopTracing.foreign_tool_end(span, is_error=is_error)
                    self.mailbox.put_result(
                        ForeignToolFinished(turn_id, step, call_id, tool, dict(arguments), output, is_error)
                    )

        async def permit(request: PermissionRequest) -> tuple[bool, str]:
            allowed, reason = await self._foreign_permission(engine, request, turn_id, step)
            call_id = request.call_id or request.request_id
            verdict = "allowed" if allowed else f"permission denied: {reason}"
            self._publish(ToolProgress(loop=self.name, turn_id=turn_id, call_id=call_id, message=verdict))
            return allowed, reason

        result: ModelCompleted | ModelFailed
        try:
            async with asyncio.timeout(d.model_timeout):
                finished = await run_foreign_turn(
                    engine,
                    self._foreign_prompt(effect),
                    resume=self.state.foreign_session_id,
                    on_event=on_event,
                    permit=permit,
                )
            if finished.error is not None:
                result = ModelFailed(turn_id=turn_id, step=step, error_type="ForeignTurnFailed", message=finished.error)
            else:
                usage = Usage(
                    input_tokens=finished.input_tokens,
                    output_tokens=finished.output_tokens,
                    cached_tokens=finished.cached_tokens,
                    cost_usd=finished.cost_usd,
                    calls=1,
                )
                if usage.cost_usd == 0 and engine.model is not None:  # codex reports tokens only: the price table's
                    usage = self.session.price(engine.model, usage)
                reply = finished.text or "".join(text)
                result = ModelCompleted(turn_id=turn_id, step=step, text=reply, tool_calls=(), usage=usage)
        except (ForeignEngineError, ForeignProtocolError) as exc:
            result = ModelFailed(turn_id=turn_id, step=step, error_type=type(exc).__name__, message=str(exc))
        except TimeoutError:
            message = f"{engine.kind} did not finish within {d.model_timeout:g}s"
            result = ModelFailed(turn_id=turn_id, step=step, error_type="ForeignTimeout", message=message)
        except Exception as exc:  # e.g. a line past the reader's limit: the turn fails, the session goes on
            result = ModelFailed(turn_id=turn_id, step=step, error_type="ForeignCrashed", message=repr(exc)[:500])
        finally:
            for span in tool_spans.values():  # uses the CLI never reported a result for
                LoopTracing.foreign_tool_end(span, is_error=None)
        if self._tracing is not None:
            self._tracing.model_result(result)
        self.mailbox.put_result(result)

    def _foreign_prompt(self, effect: CallModel) -> str:
        """The turn's own inputs (the foreign CLI holds the conversation before them in its session); after a
        restore re-issues a turn, the user messages since the last reply."""
        if self._turn_inputs is not None and self._turn_inputs[0] == effect.turn_id:
            return "\n\n".join(self._turn_inputs[1])
        return _turn_prompt(effect.messages)

    async def _foreign_permission(
        self, engine: ForeignEngine, request: PermissionRequest, turn_id: str, step: int
    ) -> tuple[bool, str]:
        """The gate's verdict on a foreign CLI's tool, in the `evaluate` order: configured access, every stored deny,
        stored allows; what none of them settles opens a gate (`GateOpened`, answered like any other, denied at its
        deadline) while the CLI waits."""
        call_id = request.call_id or request.request_id
        match = f"{engine.kind}:{request.tool}"
        requirement = Requirement(
            kind="foreign",
            scope=engine.kind,
            match=match,
            description=f"{engine.kind} wants to use its tool {request.tool}",
            candidates=(
                GrantCandidate(kind="foreign", pattern=match, description=f"{engine.kind} may use {request.tool}"),
            ),
        )
        call = PreparedCall(
            call_id=call_id, tool=request.tool, arguments=request.arguments, requirements=(requirement,)
        )
        try:
            async with asyncio.timeout(10.0):
                stored = await self._rules.load()
        except (RuleStoreError, TimeoutError) as exc:
            return False, f"permission rules unreadable: {exc}"
        decision = evaluate([call], access=self.definition.access, stored=stored)
        verdict = decision.verdict(call_id)
        if verdict is Verdict.ALLOW:
            return True, ""
        if verdict is Verdict.DENY:
            reason = next((c.reason for c in decision.calls if c.call_id == call_id), "") or "denied"
            return False, f"denied by the gate: {reason}"
        if decision.prompt is None:  # pragma: no cover - a gated verdict always comes with its prompt
            return False, "denied by the gate"
        # The journal position makes the id unique in the session: a turn re-run after a crash at this gate asks
        # again with the same request id, and that new gate must not take the id of the one the restore denied.
        gate_id = f"{turn_id}/{step}/{request.request_id or call_id}@{self.session.last_seq}"
        waiter: asyncio.Future[tuple[bool, str]] = asyncio.get_running_loop().create_future()
        self._foreign_gates[gate_id] = waiter
        try:
            self.mailbox.put_result(
                GateNeeded(
                    turn_id=turn_id,
                    step=step,
                    gate_id=gate_id,
                    call_ids=decision.prompt.call_ids,
                    prompt=decision.prompt.model_dump(mode="json"),
                    deadline=self._clock.time() + self.definition.gate_timeout,
                )
            )
            granted, why = await waiter
        finally:
            self._foreign_gates.pop(gate_id, None)
        return (True, "") if granted else (False, f"permission denied: {why}")

    # --- compaction on a lane ------------------------------------------------------------------------------

    def _compact_on_lane(self, effect: Compact) -> None:
        """Start a compaction on the session's lanes — or, while one runs, let a waiting turn wait for that one."""
        running = self._compaction
        if running is not None:
            if effect.blocking:
                running.waiter = (effect.turn_id, effect.step)
            return
        job = _Compaction(
            turn_id=effect.turn_id,
            step=effect.step,
            replaced=len(effect.messages),
            waiter=(effect.turn_id, effect.step) if effect.blocking else None,
        )
        try:
            job.hustle_id = self.session.hustles.submit(
                "compaction",
                "blocking" if effect.blocking else "background",
                lambda: self._summarize(effect.messages),
                on_end=self._compaction_ended,
                loop=self.name,
                params={"replaced": job.replaced},
            )
        except HustleQueueFullError as exc:
            self.mailbox.put_result(
                CompactionFailed(effect.turn_id, effect.step, "HustleQueueFull", str(exc), blocking=effect.blocking)
            )
            return
        self._compaction = job

    def resume_compaction(self, info: HustleInfo) -> bool:
        """Re-run a compaction a restore found open (its prefix is still the history's); whether it could."""
        replaced = info.params.get("replaced")
        if self._compaction is not None or not isinstance(replaced, int) or not 0 < replaced <= len(self.state.history):
            return False
        messages = self.state.history[:replaced]
        turn = self.state.turn
        job = _Compaction(turn_id=turn.turn_id if turn else "", step=turn.step if turn else 0, replaced=replaced)
        job.hustle_id = self.session.hustles.submit(
            "compaction",
            info.lane,
            lambda: self._summarize(messages),
            on_end=self._compaction_ended,
            loop=self.name,
            params=dict(info.params),
            resume=info.hustle_id,
        )
        self._compaction = job
        return True

    def _compaction_ended(self, hustle_id: str, outcome: HustleResult | BaseException) -> None:
        job = self._compaction
        if job is None or job.hustle_id != hustle_id:
            return
        result: CompactionDone | CompactionFailed
        if isinstance(outcome, HustleResult):
            summary = str(outcome.value or "")
            result = CompactionDone(
                job.turn_id, job.step, summary=summary, replaced=job.replaced, usage=outcome.usage, blocking=False
            )
        else:
            result = CompactionFailed(job.turn_id, job.step, type(outcome).__name__, str(outcome), blocking=False)
        with contextlib.suppress(Exception):  # a stopped actor's mailbox: the restore resumes or fails the hustle
            self.mailbox.put_result(result)

    def _compaction_arrived(self, result: CompactionDone | CompactionFailed) -> CompactionDone | CompactionFailed:
        """The lane's result, addressed to the (turn, step) that waits for it now (decided here, in the actor's
        own task, so a turn that starts waiting while the result sits in the mailbox is never forgotten)."""
        job = self._compaction
        if job is None or result.blocking:
            return result
        self._compaction = None
        if job.waiter is None:
            return result
        turn_id, step = job.waiter
        if isinstance(result, CompactionDone):
            return CompactionDone(turn_id, step, result.summary, result.replaced, result.usage, blocking=True)
        return CompactionFailed(turn_id, step, result.error_type, result.message, blocking=True)

    async def _summarize(self, messages: tuple[Any, ...]) -> HustleResult:
        """Ask the loop's model to summarize a history prefix (a hustle: any error fails it, the turn goes on)."""
        d = self.definition
        request = ModelRequest(
            model=self._config.model_of(self.state),
            messages=(user_message(render_transcript(messages)),),
            tools=(),
            system=SUMMARIZER_PROMPT,
            temperature=0.0,
            max_output_tokens=d.max_output_tokens,
        )
        refused = self.session.budget_refusal()
        if refused is not None:
            raise refused
        text: list[str] = []
        usage: Usage = ZERO_USAGE
        async with asyncio.timeout(d.model_timeout):
            async for chunk in d.model.stream(request):
                match chunk:
                    case TextDelta(text=piece):
                        text.append(piece)
                    case UsageReport(usage=reported):
                        usage = usage + reported
        return HustleResult(value="".join(text).strip(), usage=self.session.price(request.model, usage))

    # --- asking the user -----------------------------------------------------------------------------------

    def _ask(self, turn_id: str, step: int, call: ToolCall, tool: AskUserTool) -> UserInputNeeded | ToolFinished:
        try:
            args = tool.parse(call)
        except ToolError as exc:
            outcome = ToolOutcome(call_id=call.id, name=call.name, status="error", output=str(exc))
            return ToolFinished(turn_id=turn_id, step=step, outcome=outcome)
        return UserInputNeeded(
            turn_id=turn_id,
            step=step,
            request_id=call.id,
            question=args.question,
            choices=tuple(args.choices),
            deadline=self._clock.time() + tool.timeout,
        )

    async def _ask_timer(self, effect: ArmAsk) -> None:
        await self._clock.sleep(effect.deadline - self._clock.time())
        expired = UserInputExpired(turn_id=effect.turn_id, step=effect.step, request_id=effect.request_id)
        self.mailbox.put_result(expired)

    async def _run_tool(self, turn_id: str, step: int, call: ToolCall, prepared: PreparedCall | None = None) -> None:
        tool = self._tools.get(call.name)
        if isinstance(tool, AskUserTool):  # not run: the turn parks on the question (see `tools._ask`)
            self.mailbox.put_result(self._ask(turn_id, step, call, tool))
            return
        outcome = await self._tool_outcome(turn_id, call, prepared)
        if self._tracing is not None:
            self._tracing.tool_result(outcome)
        self.mailbox.put_result(ToolFinished(turn_id=turn_id, step=step, outcome=outcome))

    def _traced_tool(
        self, turn_id: str, step: int, call: ToolCall, prepared: PreparedCall | None = None
    ) -> Coroutine[Any, Any, None]:
        """Run ``call`` (``prepared``: what the gate's batch already prepared of it, else it is prepared here)."""
        work = self._run_tool(turn_id, step, call, prepared)
        return work if self._tracing is None else self._tracing.tool_call(turn_id, call, work)

    async def _tool_outcome(self, turn_id: str, call: ToolCall, prepared: PreparedCall | None = None) -> ToolOutcome:
        def failed(message: str) -> ToolOutcome:
            return ToolOutcome(call_id=call.id, name=call.name, status="error", output=message)

        tool = self._tools.get(call.name)
        if tool is None:
            return failed(f"unknown tool {call.name!r}")
        if prepared is None:
            try:
                prepared = tool.prepare(call)
            except ToolError as exc:
                return failed(f"invalid arguments: {exc}")
            except Exception as exc:
                return failed(f"invalid arguments: {exc!r}")
        async with self._tool_slots:
            self._publish(
                ToolCallStarted(
                    loop=self.name, turn_id=turn_id, call_id=call.id, name=call.name, summary=prepared.summary
                )
            )

            def progress(message: str) -> None:
                self._publish(ToolProgress(loop=self.name, turn_id=turn_id, call_id=call.id, message=message))

            ctx = ToolContext(
                session_id=self.session.id,
                loop=self.name,
                call_id=call.id,
                workspace=self._workspace,
                progress=progress,
            )
            try:
                async with asyncio.timeout(self.definition.tool_timeout):
                    result = await tool.run(prepared, ctx)
            except TimeoutError:
                return failed(f"timed out after {self.definition.tool_timeout:g}s")
            except ToolError as exc:
                return failed(str(exc))
            except Exception as exc:
                return failed(f"tool failed: {exc!r}")
        return ToolOutcome(
            call_id=call.id, name=call.name, status="error" if result.is_error else "ok", output=result.output
        )

    # --- the gate -----------------------------------------------------------------------------------------

    async def _gate_batch(self, turn_id: str, step: int, calls: tuple[ToolCall, ...]) -> None:
        """Prepare every call, evaluate the gate for the batch, run what is allowed, open one prompt for the rest."""
        prepared = []
        for call in calls:
            tool = self._tools.get(call.name)
            try:
                if tool is None:
                    raise ToolError(f"unknown tool {call.name!r}")
                prepared.append(tool.prepare(call))
            except Exception as exc:
                # The run path reports the precise error to the model without running anything.
                self._track(turn_id, self._traced_tool(turn_id, step, call))
                del exc
        try:
            async with asyncio.timeout(10.0):  # (not wait_for: no task of its own for every batch)
                stored = await self._rules.load()
        except (RuleStoreError, TimeoutError) as exc:
            for p in prepared:
                self._finish(turn_id, step, p.call_id, p.tool, "denied", f"permission rules unreadable: {exc}")
            return
        decision = evaluate(prepared, access=self.definition.access, stored=stored)
        by_id = {c.id: c for c in calls}
        if (
            len(calls) == 1 == len(prepared)
            and decision.prompt is None
            and decision.verdict(calls[0].id) is Verdict.ALLOW
        ):
            # The batch is one allowed call: run it in this task (tracked for the turn like a task of its own).
            self.inline_tool_runs += 1
            await self._traced_tool(turn_id, step, calls[0], prepared[0])
            return
        ready = {p.call_id: p for p in prepared}
        for verdict in decision.calls:
            if verdict.verdict is Verdict.ALLOW:
                self._track(
                    turn_id, self._traced_tool(turn_id, step, by_id[verdict.call_id], ready.get(verdict.call_id))
                )
            elif verdict.verdict is Verdict.DENY:
                self._finish(
                    turn_id, step, verdict.call_id, verdict.tool, "denied", f"permission denied: {verdict.reason}"
                )
        if decision.prompt is not None:
            self.mailbox.put_result(
                GateNeeded(
                    turn_id=turn_id,
                    step=step,
                    gate_id=f"{turn_id}/{step}",
                    call_ids=decision.prompt.call_ids,
                    prompt=decision.prompt.model_dump(mode="json"),
                    deadline=self._clock.time() + self.definition.gate_timeout,
                )
            )

    def _finish(self, turn_id: str, step: int, call_id: str, name: str, status: str, output: str) -> None:
        outcome = ToolOutcome(call_id=call_id, name=name, status=status, output=output)  # type: ignore[arg-type]
        self.mailbox.put_result(ToolFinished(turn_id=turn_id, step=step, outcome=outcome))

    async def _gate_timer(self, effect: ArmGate) -> None:
        await self._clock.sleep(effect.deadline - self._clock.time())
        self.mailbox.put_result(
            GateAnswered(
                turn_id=effect.turn_id,
                step=effect.step,
                gate_id=effect.gate_id,
                answer="deny",
                granted=False,
                reason="no answer before the gate timed out",
            )
        )

    async def _resolve_gate(self, effect: ResolveGate) -> None:
        try:
            async with asyncio.timeout(30.0):
                resolution = await resolve_answer(
                    GatePrompt.model_validate(effect.prompt), GateAnswer(effect.answer), self._rules
                )
            granted, reason = resolution.granted, resolution.error or effect.answer
        except Exception as exc:  # nothing is granted unless the grant was stored
            granted, reason = False, f"the grant could not be stored: {exc}"
        self.mailbox.put_result(
            GateAnswered(
                turn_id=effect.turn_id,
                step=effect.step,
                gate_id=effect.gate_id,
                answer=effect.answer if granted else "deny",
                granted=granted,
                reason=reason,
            )
        )

    # --- commands from the session -------------------------------------------------------------------------

    async def submit(
        self, command: UserInput | CancelQueuedInput | SetLoopMode | ChangeLoopInference, timeout: float
    ) -> None:
        if self._tracing is not None and isinstance(command, UserInput):
            self._tracing.remember_input(command.command_id)
        await self.mailbox.put(command, timeout=timeout)

    def provide_user_input(self, command: ProvideUserInput) -> None:
        self.mailbox.put_priority(command)

    def answer_gate(self, command: AnswerGate) -> None:
        self.mailbox.put_priority(command)

    async def interrupt(self, command: Interrupt) -> bool:
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self.mailbox.put_priority(_Ask(command, done))
        return await done


def _turn_prompt(messages: Sequence[Any]) -> str:
    """The turn's new user text: the user messages after the last assistant message (the foreign CLI holds the
    rest of the conversation in its own session)."""
    texts: list[str] = []
    for message in reversed(messages):
        if message.role == "assistant":
            break
        if message.role == "user" and message.content:
            texts.append(str(message.content))
    return "\n\n".join(reversed(texts))
