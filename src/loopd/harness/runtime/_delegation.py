"""Delegation tools: a loop starts, messages, lists and stops subagents (loops of the rig's agent definitions).

The tools are bound to the session and the calling loop. Starting is non-blocking: the agent works on its task
while the caller goes on; when one of the agent's turns ends, the caller receives the result as an input (see
`loopd.harness.core.agents`). Depth and quota limits are the rig's (`Rig.max_agent_depth`, `Rig.max_agents`).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from pydantic import Field, ValidationError

from loopd.harness._errors import HarnessError, ToolArgumentsError, ToolError
from loopd.harness.core import EffectKind, Frozen, Idempotency, ToolCall
from loopd.harness.models import ToolSpec
from loopd.harness.tools import PreparedCall, Tool, ToolContext, ToolResult

if TYPE_CHECKING:
    from loopd.harness.runtime._session import Session


class DelegationError(HarnessError):
    """A delegation request was refused (unknown definition, depth or quota limit, not your agent, stopped)."""


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
        agent_id = await self._session.start_agent(self._loop, args.agent, args.task)
        return f"started agent {agent_id} ({args.agent}); its report will arrive as a message when it finishes"


class MessageAgentTool(_DelegationTool):
    name = "message_agent"
    description = "Send a follow-up message to one of your running agents (it joins or starts the agent's turn)."
    args = _MessageArgs
    effect_kind = EffectKind.UNKNOWN

    def _summary(self, args: _MessageArgs) -> str:
        return f"{args.agent_id}: {args.text[:60]}"

    async def _run(self, args: _MessageArgs) -> str:
        await self._session.message_agent(self._loop, args.agent_id, args.text)
        return f"sent to {args.agent_id}"


class ListAgentsTool(_DelegationTool):
    name = "list_agents"
    description = "List the agents you started, with their status and last reply."
    args = _ListArgs
    effect_kind = EffectKind.READ
    idempotency_kind = Idempotency.INHERENT

    async def _run(self, args: _ListArgs) -> str:
        rows = self._session.list_agents(self._loop)
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
        await self._session.stop_agent(args.agent_id, by=self._loop)
        return f"stopped {args.agent_id}"


@functools.cache
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
