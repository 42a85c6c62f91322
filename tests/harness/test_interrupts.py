"""Interrupt mid-stream and mid-tool, the queued-input rule, and shutdown drain."""

from __future__ import annotations

import asyncio

import pytest

from loopd.harness import EchoTool, Journal, LoopDefinition, Reply, Rig, ScriptedModel, SessionClosedError
from loopd.harness.core.events import InputCancelled, TurnDone, TurnInterrupted

from .helpers import assert_gap_free, collect_until, journal_state, same_loops


def make_rig(journal: Journal, model: ScriptedModel, tool: EchoTool | None = None) -> Rig:
    return Rig(loops=[LoopDefinition(name="main", model=model, tools=(tool or EchoTool(),))], journal=journal)


async def test_interrupt_during_model_streaming(journal: Journal) -> None:
    # 10 s of streaming: only the interrupt ends it, however late the test gets to send it on a loaded machine.
    model = ScriptedModel([Reply(text="a" * 1000, chunk_size=1, chunk_delay=0.01), Reply(text="after")])
    session = await make_rig(journal, model).start_session()
    sub = session.subscribe()
    await session.submit("talk a lot")
    async with asyncio.timeout(30):
        async for env in sub:
            if env.event.kind == "token_delta":
                break
    assert await session.interrupt() is True
    events = await collect_until(sub, {"turn_interrupted"})
    terminal = events[-1].event
    assert isinstance(terminal, TurnInterrupted)
    await session.wait_idle(timeout=30)
    # The cancelled stream produced nothing durable; the next turn works.
    done = await session.ask("again", timeout=30)
    assert isinstance(done, TurnDone)
    assert done.text == "after"
    same_loops(session.state, await journal_state(journal, session.id))
    await session.shutdown()
    await assert_gap_free(journal, session.id)


async def test_interrupt_during_a_tool_batch_closes_open_calls(journal: Journal) -> None:
    tool = EchoTool()
    model = ScriptedModel(
        [
            Reply(tool_calls=[("echo", {"text": "slow", "delay": 30}), ("echo", {"text": "fast"})]),
            Reply(text="x"),
        ]
    )
    session = await make_rig(journal, model, tool).start_session()
    sub = session.subscribe()
    await session.submit("work")
    await collect_until(sub, {"tool_completed"})  # the fast one finished; the slow one is running
    assert await session.interrupt(reason="user pressed stop") is True
    events = await collect_until(sub, {"turn_interrupted"})
    terminal = events[-1].event
    assert isinstance(terminal, TurnInterrupted)
    assert terminal.reason == "user pressed stop"
    assert [o.status for o in terminal.outcomes] == ["interrupted"]
    await session.wait_idle(timeout=30)
    history = session.state.loops["main"].history
    answered = sorted(m.tool_call_id or "" for m in history if m.role == "tool")
    assert answered == sorted(c.id for c in history[1].tool_calls)
    assert session.statistics().effects_running == 0
    same_loops(session.state, await journal_state(journal, session.id))
    await session.shutdown()


async def test_interrupt_when_idle_is_a_no_op(journal: Journal) -> None:
    session = await make_rig(journal, ScriptedModel([])).start_session()
    assert await session.interrupt() is False
    await session.shutdown()


async def test_inputs_queued_during_a_turn_fold_into_it_at_the_next_step(journal: Journal) -> None:
    model = ScriptedModel([Reply(tool_calls=[("echo", {"text": "t", "delay": 0.2})]), Reply(text="saw both")])
    session = await make_rig(journal, model).start_session()
    sub = session.subscribe()
    await session.submit("first")
    await collect_until(sub, {"model_replied"})
    await session.submit("also this")
    events = await collect_until(sub, {"turn_done"})
    kinds = [e.event.kind for e in events]
    assert "input_queued" in kinds and "inputs_folded" in kinds
    last_request = model.requests[-1]
    assert [m.content for m in last_request.messages if m.role == "user"] == ["first", "also this"]
    await session.shutdown()


async def test_inputs_queued_after_the_last_step_start_the_next_turn(journal: Journal) -> None:
    model = ScriptedModel([Reply(text="one", delay=0.2), Reply(text="two")])
    session = await make_rig(journal, model).start_session()
    sub = session.subscribe(kinds={"turn_started", "turn_done"})
    await session.submit("a")
    await session.submit("b")
    events = await collect_until(sub, {"turn_done"})
    events += await collect_until(sub, {"turn_done"})
    assert [e.event.kind for e in events] == ["turn_started", "turn_done", "turn_started", "turn_done"]
    await session.shutdown()


async def test_interrupt_cancels_queued_inputs(journal: Journal) -> None:
    model = ScriptedModel([Reply(text="slow", delay=10)])
    session = await make_rig(journal, model).start_session()
    sub = session.subscribe()
    await session.submit("a")
    queued_id = await session.submit("b")
    await collect_until(sub, {"input_queued"})
    await session.interrupt()
    events = await collect_until(sub, {"input_cancelled"})
    cancelled = events[-1].event
    assert isinstance(cancelled, InputCancelled)
    assert cancelled.command_id == queued_id
    assert session.state.loops["main"].queued == ()
    await session.shutdown()


async def test_shutdown_drains_running_work(journal: Journal) -> None:
    model = ScriptedModel([Reply(text="finished in time", delay=0.2)])
    session = await make_rig(journal, model).start_session()
    sub = session.subscribe()
    await session.submit("go")
    await session.shutdown(drain_timeout=5)
    kinds = [e.event.kind async for e in sub]
    assert "turn_done" in kinds and kinds[-1] == "session_stopped"
    with pytest.raises(SessionClosedError):
        await session.submit("too late")


async def test_shutdown_interrupts_work_that_outlives_the_drain(journal: Journal) -> None:
    model = ScriptedModel([Reply(text="never", delay=30)])
    session = await make_rig(journal, model).start_session()
    sub = session.subscribe()
    await session.submit("go")
    await session.shutdown(drain_timeout=0.1)
    kinds = [e.event.kind async for e in sub]
    assert kinds[-2:] == ["turn_interrupted", "session_stopped"]
    state = await journal_state(journal, session.id)
    assert state.status == "stopped"
    assert state.loops["main"].turn is None
