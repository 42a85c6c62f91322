"""A session: the live, durable execution of a rig, restorable by id.

The session owns its `SessionLog` (``_session_log.py``: the one journal writer, the hub, the commit lock under which
journal seq order == apply order == publish order) and one actor per loop; it takes commands and runs the
lifecycle. A failed append stops the whole session (fail-closed) with `SessionFaultError`.

Sub-agents (start, message, list, stop, reports to their parents) are `Subagents` (``_delegation.py``), reached as
``session.subagents``. The loop actors and the rig use the session's underscore-free methods marked "runtime"
below (package-internal: not part of ``loopd.harness``'s face); nothing outside the class touches ``Session._x``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Final

from loopd._infra.clock import Clock
from loopd._infra.ids import new_id
from loopd.harness._errors import (
    BudgetExceeded,
    HarnessError,
    NoSuchQuestionError,
    SessionClosedError,
    SessionFaultError,
    UnknownSettingError,
)
from loopd.harness.actors._budget import BudgetPolicy
from loopd.harness.actors._delegation import Subagents
from loopd.harness.actors._hub import DEFAULT_QUEUE, Subscription
from loopd.harness.actors._hustle import HustleLanes
from loopd.harness.actors._session_log import SessionLog
from loopd.harness.actors._workspace import SessionWorkspace
from loopd.harness.core import ZERO_USAGE, Usage
from loopd.harness.core.commands import (
    AnswerGate,
    CancelQueuedInput,
    ChangeLoopInference,
    Interrupt,
    ProvideUserInput,
    SetActiveLoop,
    SetLoopMode,
    Shutdown,
    UserInput,
)
from loopd.harness.core.config import decide_active_loop
from loopd.harness.core.events import (
    ActiveLoopChanged,
    AgentStarted,
    AgentStopped,
    ConfigurationAdopted,
    EphemeralEvent,
    HustleCompleted,
    HustleFailed,
    HustleStarted,
    InputCancelled,
    InputRejected,
    InputsFolded,
    Lifecycle,
    LoopEvent,
    SessionEvent,
    SessionStarted,
    SessionStopped,
    TerminalEvent,
    TurnDone,
    TurnFailed,
    TurnInterrupted,
    TurnStarted,
    WorkspaceCheckpointed,
    WorkspaceForked,
    WorkspaceRestored,
)
from loopd.harness.core.hustles import LaneLimits, LaneName
from loopd.harness.core.state import AgentInfo, OpenAsk, SessionState
from loopd.harness.core.workspace import EMPTY_WORKSPACE_HISTORY, SnapshotTrigger, WorkspaceHistory
from loopd.harness.journal import Journal, JournalWriter

if TYPE_CHECKING:
    from loopd.harness.actors._loop import LoopActor
    from loopd.harness.actors._rig import Rig
    from loopd.harness.snapshots import SnapshotStore

AnyCommand = (
    UserInput
    | CancelQueuedInput
    | AnswerGate
    | ProvideUserInput
    | Interrupt
    | Shutdown
    | SetActiveLoop
    | SetLoopMode
    | ChangeLoopInference
)
_ASK_KINDS: Final = frozenset(
    str(event.model_fields["kind"].default)
    for event in (TurnStarted, InputsFolded, TurnDone, TurnFailed, TurnInterrupted, InputCancelled, InputRejected)
)
"""What `Session.ask` reads: where its input went and how that turn ended."""


@dataclass(frozen=True, slots=True)
class SessionStatistics:
    session_id: str
    status: str
    last_seq: int
    turns: int
    usage: Usage
    events_published: int
    subscribers: int
    ephemeral_dropped: int
    effects_running: int


class Session:
    """Handle on a live session. Create with `Rig.start_session` / `Rig.restore_session`."""

    def __init__(
        self,
        *,
        session_id: str,
        rig_name: str,
        journal: Journal,
        writer: JournalWriter,
        clock: Clock,
        price: Callable[[str, Usage], Usage],
        budget: BudgetPolicy,
        submit_timeout: float,
        drain_timeout: float,
        rig: Rig | None = None,
        agents: Mapping[str, AgentInfo] | None = None,
        workspace_store: SnapshotStore | None = None,
        snapshot_on: SnapshotTrigger = "off",
        workspace_history: WorkspaceHistory = EMPTY_WORKSPACE_HISTORY,
        lanes: Mapping[LaneName, LaneLimits] | None = None,
    ) -> None:
        self.id = session_id
        self.rig_name = rig_name
        self._clock = clock
        self._price_fn = price
        self._budget = budget
        self._submit_timeout = submit_timeout
        self._drain_timeout = drain_timeout
        self.log = SessionLog(
            session_id,
            journal,
            writer,
            clock=clock,
            on_fault=self._faulted,
            on_commit=None if rig is None else rig.on_journal_commit,
        )
        """The session's journal writer, hub and commit lock (runtime: commits go through the methods below)."""
        self._actors: dict[str, LoopActor] = {}
        self._change = asyncio.Event()  # replaced on every change: waiters hold the one that was current
        self._status = "active"
        self._closing = False
        self._stopped = asyncio.Event()
        self.subagents = Subagents(self, rig, clock, agents or MappingProxyType({}))
        self._active_loop: str | None = None  # ActiveLoopChanged (None: the first loop)
        self._fingerprint: Mapping[str, str] = MappingProxyType({})  # SessionStarted / ConfigurationAdopted
        """The session's sub-agents: start, message, list and stop them (the delegation tools use these)."""
        self.workspace = SessionWorkspace(self, workspace_store, snapshot_on, workspace_history)
        self.hustles = HustleLanes(self.commit_session, clock=clock, limits=lanes, name=f"session {session_id} hustles")
        """Background inference runs (compaction) on the session's lanes, journaled as Hustle* events."""
        """The workspace's snapshots: checkpoint, restore, undo, diff (``checkpoint_workspace`` and friends)."""

    # --- runtime: wiring (used by the rig and the sub-agents) ------------------------------------------------

    def add_actor(self, actor: LoopActor) -> None:
        self._actors[actor.name] = actor

    def start_actors(self) -> None:
        for actor in self.running_actors():
            actor.start()

    def running_actors(self) -> tuple[LoopActor, ...]:
        """Every actor except those of stopped agents (whose loops stay in the state but never run again)."""
        return tuple(a for n, a in self._actors.items() if not self.subagents.is_stopped(n))

    # --- public API ----------------------------------------------------------------------------------------

    @property
    def loops(self) -> tuple[str, ...]:
        return tuple(self._actors)

    @property
    def default_loop(self) -> str:
        """Where input that names no loop goes: the active loop (`set_active_loop`), at first the rig's first loop."""
        return self._active_loop or next(iter(self._actors))

    @property
    def active_loop(self) -> str:
        """The session's active loop (the same as `default_loop`)."""
        return self.default_loop

    def restore_settings(self, state: SessionState) -> None:
        """Runtime: take the active loop and the recorded configuration from a restored state."""
        self._active_loop = state.active_loop
        self._fingerprint = state.fingerprint

    @property
    def status(self) -> str:
        return "faulted" if self.log.fault is not None else self._status

    @property
    def fault(self) -> SessionFaultError | None:
        return self.log.fault

    @property
    def last_seq(self) -> int:
        return self.log.last_seq

    @property
    def state(self) -> SessionState:
        """The live state; equal to the fold of the journal (a property test checks it)."""
        return SessionState(
            session_id=self.id,
            rig=self.rig_name,
            status="stopped" if self._status == "stopped" else "active",
            loops=MappingProxyType({name: a.state for name, a in self._actors.items()}),
            last_seq=self.log.last_seq,
            agents=self.subagents.infos,
            active_loop=self._active_loop,
            fingerprint=self._fingerprint,
            workspace=self.workspace.history,
            hustles=self.hustles.infos,
        )

    @property
    def usage(self) -> Usage:
        """`SessionState.usage` of the live state (every loop's), summed without building that state: the budget
        asks for it before every model call."""
        total: Usage | None = None
        for actor in self._actors.values():
            usage = actor.state.usage
            total = usage if total is None else total + usage
        return ZERO_USAGE if total is None else total

    def statistics(self) -> SessionStatistics:
        return SessionStatistics(
            session_id=self.id,
            status=self.status,
            last_seq=self.log.last_seq,
            turns=sum(a.state.turns for a in self._actors.values()),
            usage=self.usage,
            events_published=self.log.hub.published,
            subscribers=self.log.hub.subscriber_count,
            ephemeral_dropped=self.log.hub.dropped,
            effects_running=sum(a.effects_running for a in self._actors.values()),
        )

    def _actor(self, loop: str | None) -> LoopActor:
        name = loop or self.default_loop
        actor = self._actors.get(name)
        if actor is None:
            raise HarnessError(f"session {self.id} has no loop {name!r}")
        if self.subagents.is_stopped(name):
            raise HarnessError(f"agent {name} is stopped")
        return actor

    def check_accepting(self) -> None:
        """Runtime: raise unless the session takes input (the fault, or `SessionClosedError`)."""
        if self.log.fault is not None:
            raise self.log.fault
        if self._closing or self._status == "stopped":
            raise SessionClosedError(f"session {self.id} is closed")

    async def submit(self, text: str, *, loop: str | None = None, timeout: float | None = None) -> str:
        """Queue a user input; returns its command id. The outcome arrives as events."""
        command = UserInput(command_id=new_id(), loop=loop, text=text)
        await self.send(command, timeout=timeout)
        return command.command_id

    async def send(self, command: AnyCommand, *, timeout: float | None = None) -> bool:
        """Deliver any command. Returns True, except for `Interrupt` (whether a turn was stopped)."""
        match command:
            case Shutdown(drain_timeout=drain):
                await self.shutdown(drain_timeout=drain)
                return True
            case Interrupt():
                self.check_accepting()
                if command.loop is None:
                    results = [await a.interrupt(command) for a in self.running_actors()]
                    return any(results)
                return await self._actor(command.loop).interrupt(command)
            case ProvideUserInput(request_id=request_id):
                self.check_accepting()
                actor = self._actor(command.loop) if command.loop else self._asking(request_id)[0]
                actor.provide_user_input(command)
                return True
            case AnswerGate():
                self.check_accepting()
                actor = self._actor(command.loop) if command.loop else self._gate_owner(command.gate_id)
                actor.answer_gate(command)
                return True
            case UserInput() | CancelQueuedInput():
                self.check_accepting()
                actor = self._actor(command.loop)
                await actor.submit(command, self._submit_timeout if timeout is None else timeout)
                return True
            case SetActiveLoop(loop=target):
                self.check_accepting()
                self._setting_target(target)
                changed = decide_active_loop(self.default_loop, target, now=self._clock.time())
                if changed is not None:
                    await self.commit_session(changed)
                return True
            case SetLoopMode(mode=mode):
                self.check_accepting()
                actor = self._setting_target(command.loop)
                if mode not in actor.config.modes:
                    declared = ", ".join(actor.config.modes) or "none"
                    raise UnknownSettingError(f"loop {actor.name!r} has no mode {mode!r} (its modes: {declared})")
                await actor.submit(command, self._submit_timeout if timeout is None else timeout)
                return True
            case ChangeLoopInference(model=model):
                self.check_accepting()
                actor = self._setting_target(command.loop)
                if actor.config.models and model not in actor.config.models:
                    allowed = ", ".join(actor.config.models)
                    raise UnknownSettingError(f"loop {actor.name!r} cannot use model {model!r} (allowed: {allowed})")
                await actor.submit(command, self._submit_timeout if timeout is None else timeout)
                return True
        raise TypeError(f"not a session command: {command!r}")  # pragma: no cover - the union is closed

    def _setting_target(self, loop: str | None) -> LoopActor:
        name = loop or self.default_loop
        if name not in self._actors:
            raise UnknownSettingError(f"session {self.id} has no loop {name!r} (its loops: {', '.join(self._actors)})")
        return self._actor(name)

    async def set_active_loop(self, loop: str) -> None:
        """Make ``loop`` the active loop: `submit` without a loop goes there (journaled as `ActiveLoopChanged`)."""
        await self.send(SetActiveLoop(command_id=new_id(), loop=loop))

    async def set_loop_mode(self, mode: str, *, loop: str | None = None) -> None:
        """Switch a loop (default: the active one) to ``mode``; the running step finishes in its old mode."""
        await self.send(SetLoopMode(command_id=new_id(), loop=loop, mode=mode))

    async def change_loop_inference(self, model: str, *, loop: str | None = None) -> None:
        """Switch a loop's model (default: the active loop's) from its next model call on."""
        await self.send(ChangeLoopInference(command_id=new_id(), loop=loop, model=model))

    async def interrupt(self, *, loop: str | None = None, reason: str = "interrupted") -> bool:
        """Stop the running turn (of ``loop``, or of every loop) and cancel queued inputs."""
        return await self.send(Interrupt(command_id=new_id(), loop=loop, reason=reason))

    async def answer_gate(self, gate_id: str, answer: str, *, loop: str | None = None) -> None:
        """Answer an open gate: "approve", "approve_always" or "deny" (an answer binds once)."""
        await self.send(AnswerGate(command_id=new_id(), loop=loop, gate_id=gate_id, answer=answer))  # type: ignore[arg-type]

    def _gate_owner(self, gate_id: str) -> LoopActor:
        for actor in self._actors.values():
            turn = actor.state.turn
            if turn is not None and turn.gate is not None and turn.gate.gate_id == gate_id:
                return actor
        raise HarnessError(f"no open gate {gate_id!r} in session {self.id}")

    def open_questions(self) -> tuple[tuple[str, OpenAsk], ...]:
        """The ask_user questions waiting for an answer, as (loop, question), oldest first per loop."""
        return tuple((a.name, ask) for a in self.running_actors() if a.state.turn for ask in a.state.turn.asks)

    def _asking(self, request_id: str) -> tuple[LoopActor, OpenAsk]:
        for actor in self.running_actors():
            turn = actor.state.turn
            for ask in turn.asks if turn is not None else ():
                if ask.request_id == request_id:
                    return actor, ask
        raise NoSuchQuestionError(f"no open question {request_id!r} in session {self.id}")

    async def provide_user_input(self, request_id: str, text: str, *, loop: str | None = None) -> None:
        """Answer the open ask_user question ``request_id`` (the first answer binds; `NoSuchQuestionError` if none
        is open). The answer is the question's tool result and the parked turn goes on."""
        if loop is None:
            self._asking(request_id)
        await self.send(ProvideUserInput(command_id=new_id(), loop=loop, request_id=request_id, text=text))

    async def cancel_queued(self, command_id: str, *, loop: str | None = None) -> None:
        await self.send(CancelQueuedInput(command_id=new_id(), loop=loop, target_command_id=command_id))

    def subscribe(
        self,
        *,
        from_seq: int | None = None,
        lifecycles: Collection[Lifecycle] | None = None,
        loops: Collection[str] | None = None,
        kinds: Collection[str] | None = None,
        maxsize: int = DEFAULT_QUEUE,
    ) -> Subscription:
        """Subscribe to live events, or from a journal seq (gap-free catch-up, then live)."""
        return self.log.subscribe(from_seq=from_seq, lifecycles=lifecycles, loops=loops, kinds=kinds, maxsize=maxsize)

    async def ask(self, text: str, *, loop: str | None = None, timeout: float | None = None) -> TerminalEvent:
        """Submit ``text`` and wait for the terminal event of the turn that handled it. An input that arrives while
        a turn runs is queued and handled by a later turn (or folded into the running one): that turn's end counts.
        `HarnessError` when the input is cancelled or rejected instead."""
        sub = self.subscribe(kinds=_ASK_KINDS)  # (not every step's events: nothing else is looked at)
        try:
            async with asyncio.timeout(timeout):
                command_id = await self.submit(text, loop=loop)
                turn_id: str | None = None
                async for env in sub:
                    event = env.event
                    if isinstance(event, TurnStarted | InputsFolded) and any(
                        i.command_id == command_id for i in event.inputs
                    ):
                        turn_id = event.turn_id
                    elif isinstance(event, TurnDone | TurnFailed | TurnInterrupted) and event.turn_id == turn_id:
                        return event
                    elif isinstance(event, InputCancelled | InputRejected) and event.command_id == command_id:
                        raise HarnessError(f"input {command_id} was not run: {event.kind}")
                if self.log.fault is not None:
                    raise self.log.fault
                raise SessionClosedError(f"session {self.id} stopped before the turn ended")
        finally:
            await sub.aclose()

    async def wait_idle(self, timeout: float | None = None) -> None:
        """Return once every loop is idle: no turn, no queued input, no running effect."""
        async with asyncio.timeout(timeout):
            await self._wait_until(self._quiescent)

    async def wait_until(self, predicate: Callable[[], bool], *, timeout: float | None = None) -> None:
        """Runtime: return once ``predicate`` holds (re-checked whenever the session changes); `TimeoutError`."""
        async with asyncio.timeout(timeout):
            await self._wait_until(predicate)

    async def _wait_until(self, predicate: Callable[[], bool]) -> None:
        while not predicate():
            await self._change.wait()

    def _drained(self) -> bool:
        if self.log.fault is not None:
            raise self.log.fault
        return all(a.quiescent or a.parked for a in self.running_actors())

    def _quiescent(self) -> bool:
        if self.log.fault is not None:
            raise self.log.fault
        return all(a.quiescent for a in self._actors.values()) and not self.hustles.busy

    @property
    def closing(self) -> bool:
        """Shutting down (or stopped): no new input, no new reports."""
        return self._closing or self._status == "stopped"

    def notify_changed(self) -> None:
        """Runtime: wake every waiter so it re-checks its condition (synchronous: no task is started for it)."""
        self._change.set()
        self._change = asyncio.Event()

    async def shutdown(self, *, drain_timeout: float | None = None, reason: str = "shutdown") -> None:
        """Stop accepting input, let running work finish (up to ``drain_timeout``), interrupt the rest, stop."""
        if self._closing or self._status == "stopped":
            await self._stopped.wait()
            return
        self._closing = True
        try:
            if self.log.fault is None:
                drain = self._drain_timeout if drain_timeout is None else drain_timeout
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(drain):
                        await self._wait_until(self._drained)
                for actor in self.running_actors():
                    # A turn parked at an open gate stays open: the gate is journaled and survives the restart.
                    if not actor.state.idle and not actor.parked:
                        await actor.interrupt(Interrupt(command_id=new_id(), reason=reason))
                # Background runs are cancelled: they stay open in the journal, and the restore resumes them.
                await self.hustles.aclose()
                await self.commit_session(SessionStopped(reason=reason, at=self._clock.time()))
                self._status = "stopped"
        finally:
            await self.hustles.aclose()
            for actor in tuple(self._actors.values()):
                await actor.stop()
            await self.log.aclose()
            self._stopped.set()

    def abort(self) -> None:
        """Drop everything at once without a final record, as a crash would (tests and fault handling)."""
        self._closing = True
        for actor in self._actors.values():
            actor.abort()
        self.hustles.abort()
        self.log.close()
        self._stopped.set()

    async def __aenter__(self) -> Session:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    @property
    def clock(self) -> Clock:
        """Runtime: where the session reads time."""
        return self._clock

    async def checkpoint_workspace(self) -> str:
        """Snapshot the workspace now (recorded as `WorkspaceCheckpointed`); the snapshot's ref."""
        return await self.workspace.checkpoint()

    async def restore_workspace(self, ref: str) -> None:
        """Put the workspace back to snapshot ``ref`` (recorded as `WorkspaceRestored`); refused while a turn runs."""
        await self.workspace.restore(ref)

    # --- runtime: persistence (used by the loop actors, the rig and the sub-agents) ----------------------------

    def price(self, model: str, usage: Usage) -> Usage:
        """The usage of one model call with its cost (the rig's pricing)."""
        return self._price_fn(model, usage)

    def budget_refusal(self) -> BudgetExceeded | None:
        """Why the session's budget refuses another model call, or None."""
        return self._budget.check(self.usage)

    def publish(self, seq: int | None, event: SessionEvent | LoopEvent | EphemeralEvent) -> None:
        """Hand a committed (``seq``) or ephemeral (None) event to the subscribers."""
        self.log.publish(seq, event)

    def _faulted(self, fault: SessionFaultError) -> None:
        """The log's first failed append: stop every actor (but the one failing, which ends by itself)."""
        for actor in self._actors.values():
            if not actor.in_current_task():
                actor.abort()
        self.hustles.abort()
        self._stopped.set()
        self.notify_changed()

    async def commit_loop(self, actor: LoopActor, events: tuple[LoopEvent, ...], *, wait: bool = True) -> None:
        """Journal a loop's events, then apply and publish them (under the commit lock). ``wait=False``: the effects
        that follow are safe to run before the records reach the disk (`SessionLog.commit`)."""
        await self.log.commit(events, lambda seqs: actor.apply_committed(events, seqs), wait=wait)
        await self.workspace.after_commit(actor, events)

    async def commit_agent_start(self, started: AgentStarted, actor: LoopActor, events: tuple[LoopEvent, ...]) -> None:
        """Journal an agent's start and its first turn's events in one append, then add and apply its actor."""

        def apply(seqs: list[int]) -> None:
            self.subagents.apply(started)
            self.log.publish(seqs[0], started)
            self.add_actor(actor)
            actor.apply_committed(events, seqs[1:])

        await self.log.commit((started, *events), apply)

    async def commit_session(self, event: SessionEvent) -> int:
        """Journal and publish a session event; its seq."""
        (seq,) = await self.log.commit((event,), self._session_apply(event))
        return seq

    def hold_session_event(self, event: SessionEvent) -> None:
        """Journal and publish a session event (its opening) with the session's next commit, in the same append
        (`SessionLog.hold`); until then it is neither stored nor applied."""
        self.log.hold((event,), self._session_apply(event))

    def _session_apply(self, event: SessionEvent) -> Callable[[list[int]], None]:
        def apply(seqs: list[int]) -> None:
            if isinstance(event, AgentStarted | AgentStopped):
                self.subagents.apply(event)
            elif isinstance(event, ActiveLoopChanged):
                self._active_loop = event.active
            elif isinstance(event, SessionStarted | ConfigurationAdopted):
                self._fingerprint = MappingProxyType(dict(event.fingerprint))
            if isinstance(event, WorkspaceCheckpointed | WorkspaceRestored | WorkspaceForked):
                self.workspace.apply(event)
            if isinstance(event, HustleStarted | HustleCompleted | HustleFailed):
                self.hustles.apply(event)
            self.log.publish(seqs[0], event)

        return apply

    # --- sub-agents ----------------------------------------------------------------------------------------

    @property
    def agents(self) -> Mapping[str, AgentInfo]:
        return self.subagents.infos

    @property
    def actors(self) -> Mapping[str, LoopActor]:
        return MappingProxyType(self._actors)
