"""Subagent bookkeeping, the pure part: names, depth, quota, and the report a parent receives.

A loop may start subagents (new loops built from the rig's agent definitions). Every start and stop is a
session-scoped event, so the live-agent count (the quota) and each agent's depth are folded from the journal and
recounted exactly on restore. When an agent's turn ends, its parent receives the result as an ordinary input (a
command), which follows the queued-input rule: it starts the parent's next turn or joins the running one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from types import MappingProxyType

from loopd.harness.core.events import AgentStarted, AgentStopped, TurnDone, TurnFailed
from loopd.harness.core.state import AgentInfo, SessionState

REPORT_PREFIX = "agent-report:"


def apply_agents(agents: Mapping[str, AgentInfo], event: AgentStarted | AgentStopped) -> Mapping[str, AgentInfo]:
    out = dict(agents)
    match event:
        case AgentStarted(agent=name, definition=definition, parent=parent, depth=depth):
            out[name] = AgentInfo(name=name, definition=definition, parent=parent, depth=depth)
        case AgentStopped(agent=name):
            if name in out:
                out[name] = replace(out[name], stopped=True)
    return MappingProxyType(out)


def depth_of(state: SessionState, loop: str) -> int:
    info = state.agents.get(loop)
    return 0 if info is None else info.depth


def live_agents(state: SessionState) -> tuple[AgentInfo, ...]:
    return tuple(a for a in state.agents.values() if not a.stopped)


def children(state: SessionState, parent: str) -> tuple[AgentInfo, ...]:
    return tuple(a for a in state.agents.values() if a.parent == parent)


def next_agent_name(state: SessionState, definition: str) -> str:
    taken = set(state.loops) | set(state.agents)
    n = sum(1 for a in state.agents.values() if a.definition == definition) + 1
    while f"{definition}-{n}" in taken:
        n += 1
    return f"{definition}-{n}"


def refuse_start(
    state: SessionState, *, parent: str, definition: str, known: frozenset[str], max_depth: int, max_agents: int
) -> str | None:
    """Why ``parent`` may not start an agent from ``definition`` now, or None."""
    if definition not in known:
        choices = ", ".join(sorted(known)) or "none"
        return f"unknown agent definition {definition!r} (available: {choices})"
    info = state.agents.get(parent)
    if info is not None and info.stopped:
        return f"{parent} is stopped"
    depth = depth_of(state, parent) + 1
    if depth > max_depth:
        return f"agent depth limit reached ({max_depth}): {parent} may not start agents"
    live = len(live_agents(state))
    if live >= max_agents:
        return f"agent quota reached: {live} of {max_agents} agents are running; stop one first"
    return None


def report_id(agent: str, turn_id: str) -> str:
    return f"{REPORT_PREFIX}{agent}:{turn_id}"


def report_text(agent: str, event: TurnDone | TurnFailed) -> str:
    if isinstance(event, TurnDone):
        return f"[report from agent {agent}: done]\n{event.text}"
    return f"[report from agent {agent}: failed ({event.error_type})]\n{event.message}"
