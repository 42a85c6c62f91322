"""Sub-agents: `Subagents` (a session's agents — start, message, list, stop, reports to their parents, redelivery
of reports after a restore) and the delegation tools through which a loop uses them.

A sub-agent is a loop of one of the rig's agent definitions. The tools are bound to the session and the calling
loop. Starting is non-blocking: the agent works on its task while the caller goes on; when one of the agent's turns
ends, the caller receives the result as an input (see `loopd.harness.core.agents`). Depth and quota limits are the
rig's (`Rig.max_agent_depth`, `Rig.max_agents`).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import Field, ValidationError

from loopd._infra.clock import Clock
from loopd._infra.ids import new_id
from loopd.harness._errors import HarnessError, ToolArgumentsError, ToolError
from loopd.harness.core import EffectKind, Frozen, Idempotency, ToolCall, codec
from loopd.harness.core.agents import (
    REPORT_PREFIX,
    apply_agents,
    depth_of,
    next_agent_name,
    refuse_start,
    report_id,
    report_text,
)
from loopd.harness.core.commands import Interrupt, UserInput
from loopd.harness.core.decide import decide
from loopd.harness.core.events import (
    AgentStarted,
    AgentStopped,
    InputCancelled,
    InputQueued,
    InputRejected,
    TurnDone,
    TurnFailed,
    TurnStarted,
)
from loopd.harness.core.state import AgentInfo, LoopState
from loopd.harness.journal import Record
from loopd.harness.models import ToolSpec
from loopd.harness.tools import PreparedCall, Tool, ToolContext, ToolResult

if TYPE_CHECKING:
    from loopd.harness.actors._rig import Rig
    from loopd.harness.actors._session import Session


class DelegationError(HarnessError):
    """A delegation request was refused (unknown definition, depth or quota limit, not your agent, stopped)."""


@dataclass(frozen=True, slots=True)
class AgentStatus:
    name: str
    definition: str
    parent: str
    depth: int
    status: str
    turns: int
    last_reply: str | None


class Subagents:
    """The sub-agents of one session (``session.subagents``).

    Holds their records (`AgentInfo`, folded from ``agent_started`` / ``agent_stopped``); their loop actors live
    in the session like any loop's. Talks to the session only through its public and runtime methods.
    """

    def __init__(self, session: Session, rig: Rig | None, clock: Clock, agents: Mapping[str, AgentInfo]) -> None:
        self._session = session
        self._rig = rig
        self._clock = clock
        self._infos = agents
        self._lock = asyncio.Lock()

    @property
    def infos(self) -> Mapping[str, AgentInfo]:
        return self._infos

    def is_stopped(self, name: str) -> bool:
        info = self._infos.get(name)
        return info is not None and info.stopped

    def apply(self, event: AgentStarted | AgentStopped) -> None:
        """Fold a committed agent event into the records (the session calls it under its commit lock)."""
        self._infos = apply_agents(self._infos, event)

    async def start(self, parent: str, definition: str, task: str) -> str:
        """Start a subagent of ``parent`` from the rig's agent ``definition`` working on ``task``; its id.

        The start and the agent's first turn are journaled in one append, so a crash never leaves an agent
        without its task. Raises `DelegationError` when a limit or the definition refuses it.
        """
        rig = self._rig
        if rig is None or not rig.agents:
            raise DelegationError("this rig defines no agents")
        session = self._session
        async with self._lock:
            session.check_accepting()
            state = session.state
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
            actor = rig.agent_actor(session, name, definition, LoopState(name=name), depth)
            decision = decide(
                actor.state,
                UserInput(command_id=new_id(), loop=name, text=task),
                config=actor.config,
                now=self._clock.time(),
            )
            await session.commit_agent_start(started, actor, decision.events)
            for effect in decision.effects:
                actor.start_effect(effect)
            actor.start()
            return name

    def _own(self, parent: str | None, agent: str) -> AgentInfo:
        info = self._infos.get(agent)
        if info is None or (parent is not None and info.parent != parent):
            raise DelegationError(f"no agent {agent!r}" + (f" started by {parent}" if parent else ""))
        if info.stopped:
            raise DelegationError(f"agent {agent} is stopped")
        return info

    async def message(self, parent: str | None, agent: str, text: str) -> str:
        """Send ``text`` to a running agent (``parent``: only that loop's own agents; None: any); the command id."""
        self._own(parent, agent)
        return await self._session.submit(text, loop=agent)

    def statuses(self, parent: str | None = None) -> list[AgentStatus]:
        """Every agent (of ``parent`` only, when given) with its status, turns and last reply."""
        actors = self._session.actors
        rows = []
        for info in self._infos.values():
            if parent is not None and info.parent != parent:
                continue
            loop = actors[info.name].state
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

    async def stop(self, agent: str, *, by: str | None = None, reason: str = "stopped") -> None:
        """Stop an agent and, first, every agent it started; its running turn is interrupted."""
        self._own(by, agent)
        for child in [a.name for a in self._infos.values() if a.parent == agent and not a.stopped]:
            await self.stop(child, reason=f"parent {agent} stopped")
        actor = self._session.actors[agent]
        if not actor.state.idle:
            await actor.interrupt(Interrupt(command_id=new_id(), loop=agent, reason=reason))
        await self._session.commit_session(AgentStopped(agent=agent, reason=reason, at=self._clock.time()))
        await actor.stop()

    def report(self, agent: str, event: TurnDone | TurnFailed) -> None:
        """An agent's turn ended: its parent receives the result as an input (if the parent still runs)."""
        info = self._infos.get(agent)
        if info is None:
            return
        parent = self._session.actors.get(info.parent)
        if parent is None or self.is_stopped(info.parent) or self._session.closing:
            return
        command = UserInput(
            command_id=report_id(agent, event.turn_id), loop=info.parent, text=report_text(agent, event)
        )
        parent.mailbox.put_result(command)

    def redeliver(self, records: Sequence[Record]) -> None:
        """After a restore: reports of agent turns that ended before a crash but never reached their parent are
        sent again (``records``: the session's journal)."""
        if not self._infos:
            return
        seen: set[str] = set()
        last_end: dict[str, TurnDone | TurnFailed] = {}
        for record in records:
            if not (record.kind.startswith("turn_") or record.kind.startswith("input_")):
                continue
            event = codec.decode(record.kind, record.version, record.data)
            match event:
                case TurnStarted(inputs=inputs):
                    seen.update(i.command_id for i in inputs if i.command_id.startswith(REPORT_PREFIX))
                case InputQueued(command_id=cid) | InputRejected(command_id=cid) | InputCancelled(command_id=cid):
                    if cid.startswith(REPORT_PREFIX):
                        seen.add(cid)
                case TurnDone() | TurnFailed():
                    if event.loop in self._infos:
                        last_end[event.loop] = event
        for agent, end in last_end.items():
            if report_id(agent, end.turn_id) not in seen:
                self.report(agent, end)


class _StartArgs(Frozen):
    agent: str = Field(min_length=1, max_length=100, description="Which agent definition to start.")
    task: str = Field(min_length=1, max_length=100_000, description="The task, as the agent's first message.")


class _MessageArgs(Frozen):
    agent_id: str = Field(min_length=1, max_length=200, description="The id start_agent returned.")
    text: str = Field(min_length=1, max_length=100_000)


class _ListArgs(Frozen):
    pass


class _StopArgs(Frozen):
    agent_id: str = Field(min_length=1, max_length=200)


class _DelegationTool:
    name: str
    description: str
    args: type[Frozen]
    effect_kind: EffectKind
    idempotency_kind: Idempotency = Idempotency.NONE

    def __init__(self, session: Session, loop: str, definitions: tuple[str, ...]) -> None:
        self._session = session
        self._loop = loop
        self._definitions = definitions
        self._spec = _spec_of(self.name, self.description, self.args, definitions)

    @property
    def spec(self) -> ToolSpec:
        return self._spec

    @property
    def effect(self) -> EffectKind:
        return self.effect_kind

    @property
    def idempotency(self) -> Idempotency:
        return self.idempotency_kind

    def _parse(self, arguments: dict[str, Any]) -> Frozen:
        try:
            return self.args.model_validate(arguments)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in exc.errors())
            raise ToolArgumentsError(f"{self.name}: {problems}") from exc

    def prepare(self, call: ToolCall) -> PreparedCall:
        args = self._parse(call.arguments)
        # Delegation needs no permission of its own: every tool an agent calls goes through the gate.
        return PreparedCall(call_id=call.id, tool=self.name, arguments=args.model_dump(), summary=self._summary(args))

    def _summary(self, args: Any) -> str:
        return ""

    async def run(self, call: PreparedCall, ctx: ToolContext) -> ToolResult:
        try:
            return ToolResult(output=await self._run(self._parse(call.arguments)))
        except DelegationError as exc:
            raise ToolError(str(exc)) from exc

    async def _run(self, args: Any) -> str:
        raise NotImplementedError


class StartAgentTool(_DelegationTool):
    name = "start_agent"
    description = (
        "Start a subagent on a task. It works in the background; its result arrives later as a message from the "
        "agent. Returns the agent id for message_agent / stop_agent."
    )
    args = _StartArgs
    effect_kind = EffectKind.UNKNOWN

    def _summary(self, args: _StartArgs) -> str:
        return f"{args.agent}: {args.task[:60]}"

    async def _run(self, args: _StartArgs) -> str:
        agent_id = await self._session.subagents.start(self._loop, args.agent, args.task)
        return f"started agent {agent_id} ({args.agent}); its report will arrive as a message when it finishes"


class MessageAgentTool(_DelegationTool):
    name = "message_agent"
    description = "Send a follow-up message to one of your running agents (it joins or starts the agent's turn)."
    args = _MessageArgs
    effect_kind = EffectKind.UNKNOWN

    def _summary(self, args: _MessageArgs) -> str:
        return f"{args.agent_id}: {args.text[:60]}"

    async def _run(self, args: _MessageArgs) -> str:
        await self._session.subagents.message(self._loop, args.agent_id, args.text)
        return f"sent to {args.agent_id}"


class ListAgentsTool(_DelegationTool):
    name = "list_agents"
    description = "List the agents you started, with their status and last reply."
    args = _ListArgs
    effect_kind = EffectKind.READ
    idempotency_kind = Idempotency.INHERENT

    async def _run(self, args: _ListArgs) -> str:
        rows = self._session.subagents.statuses(self._loop)
        if not rows:
            return "no agents"
        return "\n".join(
            f"{r.name} ({r.definition}) {r.status}, {r.turns} turns"
            + (f", last reply: {r.last_reply[:200]}" if r.last_reply else "")
            for r in rows
        )


class StopAgentTool(_DelegationTool):
    name = "stop_agent"
    description = "Stop one of your agents (its running turn is interrupted; its own agents are stopped too)."
    args = _StopArgs
    effect_kind = EffectKind.WRITE

    def _summary(self, args: _StopArgs) -> str:
        return args.agent_id

    async def _run(self, args: _StopArgs) -> str:
        await self._session.subagents.stop(args.agent_id, by=self._loop)
        return f"stopped {args.agent_id}"


@functools.cache
@functools.lru_cache(maxsize=256)
def _spec_of(name: str, description: str, args: type[Frozen], definitions: tuple[str, ...]) -> ToolSpec:
    """Built once per tool and set of agent definitions (a spec is immutable), not per loop."""
    schema = args.model_json_schema()
    schema.pop("title", None)
    schema["additionalProperties"] = False
    if name == "start_agent":
        schema["properties"]["agent"]["enum"] = list(definitions)
    return ToolSpec(name=name, description=description, parameters=schema)


DELEGATION_TOOL_NAMES = ("start_agent", "message_agent", "list_agents", "stop_agent")


def delegation_tools(session: Session, loop: str, definitions: tuple[str, ...]) -> tuple[Tool, ...]:
    return tuple(
        cls(session, loop, definitions) for cls in (StartAgentTool, MessageAgentTool, ListAgentsTool, StopAgentTool)
    )
