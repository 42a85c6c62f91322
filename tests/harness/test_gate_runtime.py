"""The gate inside a running loop: one prompt per batch, three answers, timeout → deny, survives restore."""

from __future__ import annotations

import asyncio

from loopd._infra.clock import SystemClock, VirtualClock
from loopd.harness import (
    Journal,
    LoopDefinition,
    Reply,
    Rig,
    ScriptedModel,
    SqliteJournal,
)
from loopd.harness.core.events import GateOpened, TurnDone
from loopd.harness.gate import MemoryRuleStore, Rule, RuleEffect
from loopd.harness.tools._testing import TouchTool

from .helpers import collect_until, journal_state, same_loops


def gated_rig(journal: Journal, model: ScriptedModel, tool: TouchTool, **options: object) -> Rig:
    rules = options.pop("rules", MemoryRuleStore())
    clock = options.pop("clock", SystemClock())
    return Rig(
        loops=[LoopDefinition(name="main", model=model, tools=(tool,), **options)],  # type: ignore[arg-type]
        journal=journal,
        rules=rules,  # type: ignore[arg-type]
        clock=clock,  # type: ignore[arg-type]
    )


def two_touches() -> ScriptedModel:
    return ScriptedModel(
        [Reply(tool_calls=[("touch", {"path": "a.txt"}), ("touch", {"path": "b.txt"})])], default=Reply(text="done")
    )


async def open_gate(session: object) -> GateOpened:
    sub = session.subscribe(kinds={"gate_opened"})  # type: ignore[attr-defined]
    await session.submit("touch two files")  # type: ignore[attr-defined]
    (env,) = await collect_until(sub, {"gate_opened"})
    assert isinstance(env.event, GateOpened)
    return env.event


async def test_one_combined_prompt_then_approve_runs_the_calls(journal: Journal) -> None:
    tool = TouchTool()
    session = await gated_rig(journal, two_touches(), tool).start_session()
    gate = await open_gate(session)
    assert len(gate.call_ids) == 2  # one prompt for the whole batch
    assert [i["match"] for i in gate.prompt["items"]] == ["a.txt", "b.txt"]
    assert tool.ran == []  # nothing runs before the answer
    sub = session.subscribe(kinds={"turn_done"})
    await session.answer_gate(gate.gate_id, "approve")
    await collect_until(sub, {"turn_done"})
    assert sorted(tool.ran) == ["a.txt", "b.txt"]
    same_loops(session.state, await journal_state(journal, session.id))
    await session.shutdown()


async def test_deny_reports_denied_outcomes_to_the_model(journal: Journal) -> None:
    tool = TouchTool()
    model = two_touches()
    session = await gated_rig(journal, model, tool).start_session()
    gate = await open_gate(session)
    await session.answer_gate(gate.gate_id, "deny")
    await session.wait_idle(timeout=30)
    assert tool.ran == []
    tool_msgs = [m for m in model.requests[-1].messages if m.role == "tool"]
    assert all("permission denied" in m.content for m in tool_msgs)
    await session.shutdown()


async def test_approve_always_stores_grants_before_running(journal: Journal) -> None:
    tool = TouchTool()
    rules = MemoryRuleStore()
    model = ScriptedModel(
        [
            Reply(tool_calls=[("touch", {"path": "a.txt"})]),
            Reply(text="ok"),
            Reply(tool_calls=[("touch", {"path": "a.txt"})]),
        ],
        default=Reply(text="again ok"),
    )
    session = await gated_rig(journal, model, tool, rules=rules).start_session()
    gate = await open_gate(session)
    await session.answer_gate(gate.gate_id, "approve_always")
    await session.wait_idle(timeout=30)
    assert [r.pattern for r in await rules.load()] == ["a.txt"]
    # The second time the stored allow meets the requirement: no prompt.
    sub = session.subscribe(kinds={"gate_opened", "turn_done"})
    await session.submit("again")
    (env,) = await collect_until(sub, {"gate_opened", "turn_done"})
    assert env.event.kind == "turn_done"
    assert tool.ran == ["a.txt", "a.txt"]
    await session.shutdown()


async def test_a_persistence_failure_grants_nothing(journal: Journal) -> None:
    tool = TouchTool()
    rules = MemoryRuleStore(fail_adds=True)
    session = await gated_rig(journal, two_touches(), tool, rules=rules).start_session()
    gate = await open_gate(session)
    await session.answer_gate(gate.gate_id, "approve_always")
    await session.wait_idle(timeout=30)
    assert tool.ran == []
    resolved = [r for r in await journal.read(session.id) if r.kind == "gate_resolved"]
    assert b'"granted":false' in resolved[0].data
    await session.shutdown()


async def test_a_stored_deny_short_circuits_without_a_prompt(journal: Journal) -> None:
    tool = TouchTool()
    rules = MemoryRuleStore([Rule(kind="fs.write", pattern="a.txt", effect=RuleEffect.DENY)])
    model = ScriptedModel([Reply(tool_calls=[("touch", {"path": "a.txt"})])], default=Reply(text="done"))
    session = await gated_rig(journal, model, tool, rules=rules).start_session()
    done = await session.ask("touch a", timeout=30)
    assert isinstance(done, TurnDone)
    assert tool.ran == []
    assert not [r for r in await journal.read(session.id) if r.kind == "gate_opened"]
    await session.shutdown()


async def test_an_unanswered_gate_times_out_to_deny(journal: Journal) -> None:
    tool = TouchTool()
    clock = VirtualClock()
    session = await gated_rig(journal, two_touches(), tool, gate_timeout=30.0, clock=clock).start_session()
    await open_gate(session)
    await clock.advance(29.9)
    assert session.state.loops["main"].turn is not None and session.state.loops["main"].turn.gate is not None
    await clock.advance(0.1)
    await session.wait_idle(timeout=30)
    assert tool.ran == []
    resolved = [r for r in await journal.read(session.id) if r.kind == "gate_resolved"]
    assert b"timed out" in resolved[0].data
    await session.shutdown()


async def test_an_open_gate_survives_restore(sqlite_journal: SqliteJournal) -> None:
    tool = TouchTool()
    rig = gated_rig(sqlite_journal, two_touches(), tool)
    session = await rig.start_session()
    gate = await open_gate(session)
    session.abort()  # crash while a human has not answered yet
    restored = await rig.restore_session(session.id)
    turn = restored.state.loops["main"].turn
    assert turn is not None and turn.gate is not None and turn.gate.gate_id == gate.gate_id
    await restored.answer_gate(gate.gate_id, "approve")
    await restored.wait_idle(timeout=30)
    assert sorted(tool.ran) == ["a.txt", "b.txt"]
    assert restored.state.loops["main"].last_reply == "done"
    await restored.shutdown()


async def test_an_open_gate_survives_a_graceful_shutdown(sqlite_journal: SqliteJournal) -> None:
    tool = TouchTool()
    rig = gated_rig(sqlite_journal, two_touches(), tool)
    session = await rig.start_session()
    gate = await open_gate(session)
    await asyncio.wait_for(session.shutdown(drain_timeout=30), 30)  # a parked gate does not hold up the drain
    kinds = [r.kind for r in await sqlite_journal.read(session.id)]
    assert "turn_interrupted" not in kinds and kinds[-1] == "session_stopped"
    restored = await rig.restore_session(session.id)
    turn = restored.state.loops["main"].turn
    assert turn is not None and turn.gate is not None and turn.gate.gate_id == gate.gate_id
    await restored.answer_gate(gate.gate_id, "approve")
    await restored.wait_idle(timeout=30)
    assert sorted(tool.ran) == ["a.txt", "b.txt"]
    await restored.shutdown()


async def test_an_answer_binds_once(journal: Journal) -> None:
    tool = TouchTool()
    session = await gated_rig(journal, two_touches(), tool).start_session()
    gate = await open_gate(session)
    await session.answer_gate(gate.gate_id, "approve")
    await asyncio.sleep(0)
    await session.answer_gate(gate.gate_id, "deny")
    await session.wait_idle(timeout=30)
    assert sorted(tool.ran) == ["a.txt", "b.txt"]
    assert len([r for r in await journal.read(session.id) if r.kind == "gate_resolved"]) == 1
    await session.shutdown()
