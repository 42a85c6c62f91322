"""A session: the live, durable execution of a rig, restorable by id.

The session owns the journal writer (one writer per session), the hub, and one actor per loop. Every commit of
enduring events happens under the session's commit lock, so journal seq order == apply order == publish order.
A failed append stops the whole session (fail-closed) with `SessionFaultError`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING

from loopd._infra.clock import Clock
from loopd._infra.ids import new_id
from loopd.harness._errors import BudgetExceeded, HarnessError, SessionClosedError, SessionFaultError
from loopd.harness.core import Usage, codec
from loopd.harness.core.agents import (
    apply_agents,
    depth_of,
    next_agent_name,
    refuse_start,
    report_id,
    report_text,
)
from loopd.harness.core.commands import AnswerGate, CancelQueuedInput, Interrupt, Shutdown, UserInput
from loopd.harness.core.decide import decide
from loopd.harness.core.events import (
    AgentStarted,
    AgentStopped,
    InputsFolded,
    Lifecycle,
    LoopEvent,
    SessionEvent,
    SessionStopped,
    TerminalEvent,
    TurnDone,
    TurnFailed,
    TurnInterrupted,
    TurnStarted,
)
from loopd.harness.core.state import AgentInfo, LoopState, SessionState
from loopd.harness.journal import Journal, JournalWriter, NewRecord
from loopd.harness.runtime._budget import BudgetPolicy
from loopd.harness.runtime._hub import DEFAULT_QUEUE, Envelope, Hub, Subscription

if TYPE_CHECKING:
    from loopd.harness.runtime._loop import LoopActor
    from loopd.harness.runtime._rig import Rig

AnyCommand = UserInput | CancelQueuedInput | AnswerGate | Interrupt | Shutdown


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


@dataclass(frozen=True, slots=True)
class AgentStatus:
    name: str
    definition: str
    parent: str
    depth: int
    status: str
    turns: int
    last_reply: str | None


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
    ) -> None:
        self.id = session_id
        self.rig_name = rig_name
        self._journal = journal
        self._writer = writer
        self._clock = clock
        self._price_fn = price
        self._budget = budget
        self._submit_timeout = submit_timeout
        self._drain_timeout = drain_timeout
        self._hub = Hub(session_id, self._read_envelopes)
        self._actors: dict[str, LoopActor] = {}
        self._commit_lock = asyncio.Lock()
        self._change = asyncio.Event()  # replaced on every change: waiters hold the one that was current
        self._status = "active"
        self._last_seq = writer.last_seq
        self._closing = False
        self._stopped = asyncio.Event()
        self._fault: SessionFaultError | None = None
        self._rig = rig
        self._agents: Mapping[str, AgentInfo] = MappingProxyType({})
        self._agent_lock = asyncio.Lock()

    # --- wiring (used by the rig) --------------------------------------------------------------------------

    def _add_actor(self, actor: LoopActor) -> None:
        self._actors[actor.name] = actor

    def _start_actors(self) -> None:
        for actor in self._running_actors():
            actor.start()

    def _running_actors(self) -> tuple[LoopActor, ...]:
        """Every actor except those of stopped agents (whose loops stay in the state but never run again)."""
        return tuple(a for n, a in self._actors.items() if not (n in self._agents and self._agents[n].stopped))

    # --- public API ----------------------------------------------------------------------------------------

    @property
    def loops(self) -> tuple[str, ...]:
        return tuple(self._actors)

    @property
    def default_loop(self) -> str:
        return next(iter(self._actors))

    @property
    def status(self) -> str:
        return "faulted" if self._fault is not None else self._status

    @property
    def fault(self) -> SessionFaultError | None:
        return self._fault

    @property
    def last_seq(self) -> int:
        return self._last_seq

    @property
    def state(self) -> SessionState:
        """The live state; equal to the fold of the journal (a property test checks it)."""
        return SessionState(
            session_id=self.id,
            rig=self.rig_name,
            status="stopped" if self._status == "stopped" else "active",
            loops=MappingProxyType({name: a.state for name, a in self._actors.items()}),
            last_seq=self._last_seq,
            agents=self._agents,
        )

    @property
    def usage(self) -> Usage:
        return self.state.usage

    def statistics(self) -> SessionStatistics:
        return SessionStatistics(
            session_id=self.id,
            status=self.status,
            last_seq=self._last_seq,
            turns=sum(a.state.turns for a in self._actors.values()),
            usage=self.usage,
            events_published=self._hub.published,
            subscribers=self._hub.subscriber_count,
            ephemeral_dropped=self._hub.dropped,
            effects_running=sum(a.effects_running for a in self._actors.values()),
        )

    def _actor(self, loop: str | None) -> LoopActor:
        name = loop or self.default_loop
        actor = self._actors.get(name)
        if actor is None:
            raise HarnessError(f"session {self.id} has no loop {name!r}")
        info = self._agents.get(name)
        if info is not None and info.stopped:
            raise HarnessError(f"agent {name} is stopped")
        return actor

    def _check_accepting(self) -> None:
        if self._fault is not None:
            raise self._fault
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
                self._check_accepting()
                if command.loop is None:
                    results = [await a.interrupt(command) for a in self._running_actors()]
                    return any(results)
                return await self._actor(command.loop).interrupt(command)
            case AnswerGate():
                self._check_accepting()
                actor = self._actor(command.loop) if command.loop else self._gate_owner(command.gate_id)
                actor.answer_gate(command)
                return True
            case UserInput() | CancelQueuedInput():
                self._check_accepting()
                actor = self._actor(command.loop)
                await actor.submit(command, self._submit_timeout if timeout is None else timeout)
                return True

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
        return self._hub.subscribe(from_seq=from_seq, lifecycles=lifecycles, loops=loops, kinds=kinds, maxsize=maxsize)

    async def ask(self, text: str, *, loop: str | None = None, timeout: float | None = None) -> TerminalEvent:
        """Submit ``text`` and wait for the terminal event of the turn that handled it."""
        sub = self.subscribe(lifecycles=(Lifecycle.ENDURING, Lifecycle.TERMINAL), loops=None)
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
                    elif getattr(event, "command_id", None) == command_id:
                        raise HarnessError(f"input {command_id} was not run: {event.kind}")
                if self._fault is not None:
                    raise self._fault
                raise SessionClosedError(f"session {self.id} stopped before the turn ended")
        finally:
            await sub.aclose()

    async def wait_idle(self, timeout: float | None = None) -> None:
        """Return once every loop is idle: no turn, no queued input, no running effect."""
        async with asyncio.timeout(timeout):
            await self._wait_until(self._quiescent)

    async def _wait_until(self, predicate: Callable[[], bool]) -> None:
        while not predicate():
            await self._change.wait()

    def _drained(self) -> bool:
        if self._fault is not None:
            raise self._fault
        return all(a.quiescent or a.parked for a in self._running_actors())

    def _quiescent(self) -> bool:
        if self._fault is not None:
            raise self._fault
        return all(a.quiescent for a in self._actors.values())

    def _changed(self) -> None:
        """Wake every waiter so it re-checks its condition (synchronous: no task is started for it)."""
        self._change.set()
        self._change = asyncio.Event()

    async def shutdown(self, *, drain_timeout: float | None = None, reason: str = "shutdown") -> None:
        """Stop accepting input, let running work finish (up to ``drain_timeout``), interrupt the rest, stop."""
        if self._closing or self._status == "stopped":
            await self._stopped.wait()
            return
        self._closing = True
        try:
            if self._fault is None:
                drain = self._drain_timeout if drain_timeout is None else drain_timeout
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(drain):
                        await self._wait_until(self._drained)
                for actor in self._running_actors():
                    # A turn parked at an open gate stays open: the gate is journaled and survives the restart.
                    if not actor.state.idle and not actor.parked:
                        await actor.interrupt(Interrupt(command_id=new_id(), reason=reason))
                await self._commit_session(SessionStopped(reason=reason, at=self._clock.time()))
                self._status = "stopped"
        finally:
            for actor in tuple(self._actors.values()):
                await actor.stop()
            with contextlib.suppress(Exception):
                await self._writer.aclose()
            self._hub.close(self._fault)
            self._stopped.set()

    def abort(self) -> None:
        """Drop everything at once without a final record, as a crash would (tests and fault handling)."""
        self._closing = True
        for actor in self._actors.values():
            actor.abort()
        self._hub.close(self._fault)
        self._stopped.set()

    async def __aenter__(self) -> Session:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    # --- persistence ---------------------------------------------------------------------------------------

    def _price(self, model: str, usage: Usage) -> Usage:
        return self._price_fn(model, usage)

    def _budget_refusal(self) -> BudgetExceeded | None:
        return self._budget.check(self.usage)

    async def _append(self, events: tuple[SessionEvent | LoopEvent, ...]) -> list[int]:
        records = [NewRecord(*codec.encode(e), at=self._clock.time()) for e in events]
        try:
            return await self._writer.append(records)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._set_fault(exc)
            assert self._fault is not None
            raise self._fault from exc

    def _set_fault(self, exc: BaseException) -> None:
        if self._fault is None:
            self._fault = SessionFaultError(self.id, f"journal append failed: {exc}")
            for actor in self._actors.values():
                if actor._task is not asyncio.current_task():
                    actor.abort()
            self._hub.close(self._fault)
            self._stopped.set()
            self._changed()

    async def _commit(self, actor: LoopActor, events: tuple[LoopEvent, ...]) -> None:
        async with self._commit_lock:
            if self._fault is not None:
                raise self._fault
            seqs = await self._append(events)
            self._last_seq = seqs[-1]
            actor._apply_committed(events, seqs)

    async def _commit_session(self, event: SessionEvent) -> int:
        async with self._commit_lock:
            if self._fault is not None:
                raise self._fault
            (seq,) = await self._append((event,))
            self._last_seq = seq
            if isinstance(event, AgentStarted | AgentStopped):
                self._agents = apply_agents(self._agents, event)
            self._hub.publish(Envelope(self.id, seq, event))
            return seq

    # --- subagents -----------------------------------------------------------------------------------------

    @property
    def agents(self) -> Mapping[str, AgentInfo]:
        return self._agents

    async def start_agent(self, parent: str, definition: str, task: str) -> str:
        """Start a subagent of ``parent`` from the rig's agent ``definition`` working on ``task``; its id.

        The start and the agent's first turn are journaled in one append, so a crash never leaves an agent
        without its task. Raises `DelegationError` when a limit or the definition refuses it.
        """
        from loopd.harness.runtime._delegation import DelegationError

        rig = self._rig
        if rig is None or not rig.agents:
            raise DelegationError("this rig defines no agents")
        async with self._agent_lock:
            self._check_accepting()
            state = self.state
            why = refuse_start(
                state,
                parent=parent,
                definition=definition,
                known=frozenset(a.name for a in rig.agents),
                max_depth=rig.max_agent_depth,
                max_agents=rig.max_agents,
            )
            if why is not None:
                raise DelegationError(why)
            name = next_agent_name(state, definition)
            depth = depth_of(state, parent) + 1
            started = AgentStarted(agent=name, definition=definition, parent=parent, depth=depth, at=self._clock.time())
            actor = rig._agent_actor(self, name, definition, LoopState(name=name), depth)
            decision = decide(
                actor.state,
                UserInput(command_id=new_id(), loop=name, text=task),
                config=actor._config,
                now=self._clock.time(),
            )
            async with self._commit_lock:
                if self._fault is not None:
                    raise self._fault
                seqs = await self._append((started, *decision.events))
                self._last_seq = seqs[-1]
                self._agents = apply_agents(self._agents, started)
                self._hub.publish(Envelope(self.id, seqs[0], started))
                self._add_actor(actor)
                actor._apply_committed(decision.events, seqs[1:])
            for effect in decision.effects:
                actor._start_effect(effect)
            actor.start()
            return name

    def _own_agent(self, parent: str | None, agent: str) -> AgentInfo:
        from loopd.harness.runtime._delegation import DelegationError

        info = self._agents.get(agent)
        if info is None or (parent is not None and info.parent != parent):
            raise DelegationError(f"no agent {agent!r}" + (f" started by {parent}" if parent else ""))
        if info.stopped:
            raise DelegationError(f"agent {agent} is stopped")
        return info

    async def message_agent(self, parent: str | None, agent: str, text: str) -> str:
        """Send ``text`` to a running agent (``parent``: only that loop's own agents; None: any)."""
        self._own_agent(parent, agent)
        return await self.submit(text, loop=agent)

    def list_agents(self, parent: str | None = None) -> list[AgentStatus]:
        rows = []
        for info in self._agents.values():
            if parent is not None and info.parent != parent:
                continue
            loop = self._actors[info.name].state
            status = "stopped" if info.stopped else ("working" if not loop.idle else "idle")
            rows.append(
                AgentStatus(
                    name=info.name,
                    definition=info.definition,
                    parent=info.parent,
                    depth=info.depth,
                    status=status,
                    turns=loop.turns,
                    last_reply=loop.last_reply,
                )
            )
        return rows

    async def stop_agent(self, agent: str, *, by: str | None = None, reason: str = "stopped") -> None:
        """Stop an agent and, first, every agent it started; its running turn is interrupted."""
        self._own_agent(by, agent)
        for child in [a.name for a in self._agents.values() if a.parent == agent and not a.stopped]:
            await self.stop_agent(child, reason=f"parent {agent} stopped")
        actor = self._actors[agent]
        if not actor.state.idle:
            await actor.interrupt(Interrupt(command_id=new_id(), loop=agent, reason=reason))
        await self._commit_session(AgentStopped(agent=agent, reason=reason, at=self._clock.time()))
        await actor.stop()

    def _report(self, agent: str, event: TurnDone | TurnFailed) -> None:
        """An agent's turn ended: its parent receives the result as an input (if the parent still runs)."""
        info = self._agents.get(agent)
        if info is None:
            return
        parent = self._actors.get(info.parent)
        parent_info = self._agents.get(info.parent)
        if parent is None or (parent_info is not None and parent_info.stopped) or self._closing:
            return
        command = UserInput(
            command_id=report_id(agent, event.turn_id), loop=info.parent, text=report_text(agent, event)
        )
        parent.mailbox.put_result(command)

    async def _read_envelopes(self, from_seq: int, limit: int) -> list[Envelope]:
        records = await self._journal.read(self.id, from_seq, limit)
        return [Envelope(self.id, r.seq, codec.decode(r.kind, r.version, r.data)) for r in records]

    @property
    def actors(self) -> Mapping[str, LoopActor]:
        return MappingProxyType(self._actors)
