"""Delegation: loops start, message, list and stop subagents; results come back as inputs; limits hold."""

from __future__ import annotations

import asyncio

import pytest

from loopd._infra.clock import settle
from loopd.harness import (
    HarnessError,
    LoopDefinition,
    MemoryJournal,
    ModelRequest,
    Reply,
    Rig,
    ScriptedModel,
    SessionFaultError,
)
from loopd.harness.core import codec
from loopd.harness.core.events import AgentStarted, AgentStopped, ToolCompleted, TurnDone, TurnStarted

from .helpers import assert_gap_free, journal_state, same_loops


def _tool_results(request: ModelRequest) -> list[str]:
    return [m.content for m in request.messages if m.role == "tool"]


def _boss(*starts: tuple[str, str]) -> ScriptedModel:
    """Starts the given agents in one step, then ends its turn; on a report, answers with what it heard."""

    def script(request: ModelRequest) -> Reply:
        last = request.messages[-1]
        if last.role == "user" and last.content.startswith("[report from agent"):
            return Reply(text="heard: " + last.content.splitlines()[-1])
        if last.role == "user":
            return Reply(tool_calls=[("start_agent", {"agent": a, "task": t}) for a, t in starts])
        return Reply(text="started: " + " | ".join(_tool_results(request)))

    return ScriptedModel(script)


def _worker() -> ScriptedModel:
    def script(request: ModelRequest) -> Reply:
        return Reply(text=f"result of {request.messages[-1].content}", delay=0.01)

    return ScriptedModel(script)


def _rig(boss: ScriptedModel, *, journal: MemoryJournal | None = None, max_agents: int = 8, depth: int = 1) -> Rig:
    return Rig(
        loops=[LoopDefinition(name="main", model=boss)],
        agents=[LoopDefinition(name="worker", model=_worker())],
        journal=journal or MemoryJournal(),
        max_agents=max_agents,
        max_agent_depth=depth,
    )


async def _events(rig: Rig, session_id: str) -> list[object]:
    return [codec.decode(r.kind, r.version, r.data) for r in await rig.journal.read(session_id)]


async def _wait_for(predicate: object, timeout: float = 30.0) -> None:
    """Run the event loop until ``predicate()`` holds: the agents' work needs no timer (in-memory journal)."""
    async with asyncio.timeout(timeout):
        while not predicate():  # type: ignore[operator]
            await settle()


async def test_an_agent_works_in_the_background_and_its_report_starts_the_parents_next_turn() -> None:
    boss = _boss(("worker", "add 2 and 2"))
    rig = _rig(boss)
    session = await rig.start_session()
    first = await session.ask("delegate it", timeout=30)
    assert isinstance(first, TurnDone)
    assert first.text.startswith("started: started agent worker-1 (worker)")
    await _wait_for(lambda: session.state.loops["main"].turns == 2 and session.state.loops["main"].turn is None)
    assert session.state.loops["main"].last_reply == "heard: result of add 2 and 2"

    events = await _events(rig, session.id)
    started = [e for e in events if isinstance(e, AgentStarted)]
    assert [(s.agent, s.definition, s.parent, s.depth) for s in started] == [("worker-1", "worker", "main", 1)]
    report_turn = [e for e in events if isinstance(e, TurnStarted) and e.loop == "main"][-1]
    assert report_turn.inputs[0].command_id.startswith("agent-report:worker-1:")

    rows = session.subagents.statuses("main")
    assert [(r.name, r.status, r.turns) for r in rows] == [("worker-1", "idle", 1)]
    # The live state is the fold of the journal, agents included; the session's usage counts every loop.
    live = session.state
    assert len(live.loops) == 2 and session.usage == live.usage
    await session.shutdown()
    rebuilt = await journal_state(rig.journal, session.id)
    same_loops(live, rebuilt)
    assert dict(rebuilt.agents) == dict(live.agents)
    await assert_gap_free(rig.journal, session.id)


async def test_quota_and_depth_are_enforced_and_reported_to_the_model() -> None:
    boss = _boss(("worker", "one"), ("worker", "two"), ("nobody", "x"))
    rig = _rig(boss, max_agents=1)
    async with rig.open_session() as session:
        done = await session.ask("delegate", timeout=30)
        assert isinstance(done, TurnDone)
        outcomes = [e.outcome for e in await _events(rig, session.id) if isinstance(e, ToolCompleted)]
        by_status = sorted((o.status, o.output.split(":")[0]) for o in outcomes)
        assert by_status[0][0] == "error" and by_status[1][0] == "error" and by_status[2][0] == "ok"
        texts = " ".join(o.output for o in outcomes)
        assert "agent quota reached: 1 of 1" in texts
        assert "unknown agent definition 'nobody' (available: worker)" in texts
        # depth 1: the worker itself gets no delegation tools.
        worker_tools = {spec.name for spec in session.actors["worker-1"]._specs}
        assert "start_agent" not in worker_tools
        assert {"start_agent", "message_agent", "list_agents", "stop_agent"} <= {
            s.name for s in session.actors["main"]._specs
        }


async def test_quota_is_recounted_on_restore_and_stopping_frees_it() -> None:
    rig = _rig(_boss(("worker", "one")), max_agents=1)
    session = await rig.start_session()
    await session.ask("delegate", timeout=30)
    await _wait_for(lambda: session.state.loops["main"].turns == 2 and session.state.loops["main"].turn is None)
    await session.shutdown()

    restored = await rig.restore_session(session.id)
    assert [a.name for a in restored.subagents.statuses()] == ["worker-1"]
    with pytest.raises(HarnessError, match="agent quota reached: 1 of 1"):
        await restored.subagents.start("main", "worker", "again")
    # A restored agent is a live loop: it can be messaged and answers again.
    await restored.subagents.message("main", "worker-1", "and 3")
    await _wait_for(
        lambda: restored.state.loops["worker-1"].turns == 2 and restored.state.loops["worker-1"].turn is None
    )
    await restored.subagents.stop("worker-1", by="main")
    assert restored.subagents.statuses()[0].status == "stopped"
    with pytest.raises(HarnessError, match="stopped"):
        await restored.subagents.message("main", "worker-1", "hello?")
    name = await restored.subagents.start("main", "worker", "again")
    assert name == "worker-2"
    await restored.shutdown()

    events = await _events(rig, session.id)
    assert [e.agent for e in events if isinstance(e, AgentStopped)] == ["worker-1"]
    again = await rig.restore_session(session.id)
    assert {a.name: a.status for a in again.subagents.statuses()} == {"worker-1": "stopped", "worker-2": "idle"}
    same_loops(again.state, await journal_state(rig.journal, session.id))
    await again.shutdown()


async def test_only_the_parent_may_message_or_stop_its_agent() -> None:
    rig = Rig(
        loops=[LoopDefinition(name="main", model=_boss()), LoopDefinition(name="other", model=_boss())],
        agents=[LoopDefinition(name="worker", model=_worker())],
        journal=MemoryJournal(),
    )
    async with rig.open_session() as session:
        name = await session.subagents.start("main", "worker", "task")
        with pytest.raises(HarnessError, match="no agent 'worker-1' started by other"):
            await session.subagents.message("other", name, "hi")
        with pytest.raises(HarnessError, match="no agent"):
            await session.subagents.stop(name, by="other")
        with pytest.raises(HarnessError, match="unknown agent definition 'ghost'"):
            await session.subagents.start("main", "ghost", "task")


async def test_a_report_lost_in_a_crash_is_delivered_after_restore() -> None:
    state = {"fail": False}

    def fail_parent_inputs(_sid: str, records: object) -> None:
        kinds_loops = [(r.kind, getattr(codec.decode(r.kind, r.version, r.data), "loop", None)) for r in records]  # type: ignore[attr-defined]
        if state["fail"] and any(k in {"turn_started", "input_queued"} and lp == "main" for k, lp in kinds_loops):
            raise OSError("disk full")

    journal = MemoryJournal(fail_append=fail_parent_inputs)
    rig = _rig(_boss(("worker", "slow job")), journal=journal)
    session = await rig.start_session()
    first = await session.ask("delegate", timeout=30)
    assert isinstance(first, TurnDone)
    state["fail"] = True  # the worker's report cannot reach main: the session stops fail-closed
    await _wait_for(lambda: session.fault is not None)
    assert isinstance(session.fault, SessionFaultError)
    session.abort()
    state["fail"] = False

    restored = await rig.restore_session(session.id)
    await _wait_for(lambda: restored.state.loops["main"].turns == 2 and restored.state.loops["main"].turn is None)
    assert restored.state.loops["main"].last_reply == "heard: result of slow job"
    await restored.shutdown()
