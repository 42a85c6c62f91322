"""Turns and steps through the Model and Tool seams."""

from __future__ import annotations

import asyncio

from loopd.harness import EchoTool, Journal, LoopDefinition, Reply, Rig, ScriptedModel
from loopd.harness.core.events import TurnDone, TurnFailed

from .helpers import assert_gap_free, collect_until, journal_state, same_loops


def rig_with(journal: Journal, model: ScriptedModel, **loop_options: object) -> Rig:
    return Rig(
        loops=[LoopDefinition(name="main", model=model, tools=(EchoTool(),), **loop_options)],  # type: ignore[arg-type]
        journal=journal,
    )


async def test_a_turn_with_a_tool_step_streams_and_is_journaled(journal: Journal) -> None:
    model = ScriptedModel([Reply(tool_calls=[("echo", {"text": "pong"})]), Reply(text="pong received", chunk_size=4)])
    session = await rig_with(journal, model).start_session()
    sub = session.subscribe()
    await session.submit("ping")
    events = await collect_until(sub, {"turn_done"})
    kinds = [e.event.kind for e in events]
    assert kinds[:4] == ["turn_started", "context_measured", "model_replied", "tool_call_started"]
    assert "token_delta" in kinds
    assert kinds[-1] == "turn_done"
    deltas = "".join(e.event.text for e in events if e.event.kind == "token_delta")  # type: ignore[union-attr]
    assert deltas == "pong received"
    # The second model call saw the tool result.
    second = model.requests[1]
    assert [m.role for m in second.messages] == ["user", "assistant", "tool"]
    assert second.messages[-1].content == "pong"
    await session.wait_idle(timeout=30)
    same_loops(session.state, await journal_state(journal, session.id))
    await session.shutdown()
    await assert_gap_free(journal, session.id)


async def test_usage_per_step_turn_and_session(journal: Journal) -> None:
    from loopd.harness import Usage

    u1 = Usage(input_tokens=10, output_tokens=5, calls=1)
    u2 = Usage(input_tokens=20, output_tokens=7, calls=1)
    model = ScriptedModel(
        [
            Reply(tool_calls=[("echo", {"text": "x"})], usage=u1),
            Reply(text="ok", usage=u2),
            Reply(text="two", usage=u1),
        ]
    )
    session = await rig_with(journal, model).start_session()
    first = await session.ask("one", timeout=30)
    assert isinstance(first, TurnDone)
    assert first.step_usage == u2
    assert first.usage == u1 + u2
    second = await session.ask("two", timeout=30)
    assert isinstance(second, TurnDone)
    assert session.usage == u1 + u2 + u1
    await session.shutdown()


async def test_max_steps_fails_the_turn_with_history_intact(journal: Journal) -> None:
    model = ScriptedModel([], default=Reply(tool_calls=[("echo", {"text": "again"})]))
    session = await rig_with(journal, model, max_steps=3).start_session()
    result = await session.ask("loop forever", timeout=30)
    assert isinstance(result, TurnFailed)
    assert result.error_type == "max_steps_exceeded"
    history = session.state.loops["main"].history
    # Every assistant tool call is answered by a tool message.
    calls = [c.id for m in history for c in m.tool_calls]
    answered = [m.tool_call_id for m in history if m.role == "tool"]
    assert calls == answered
    await session.shutdown()


async def test_model_error_fails_the_turn_not_the_session(journal: Journal) -> None:
    from loopd.harness import ModelPermanentError

    model = ScriptedModel([Reply(error=ModelPermanentError("bad request")), Reply(text="fine now")])
    session = await rig_with(journal, model).start_session()
    failed = await session.ask("a", timeout=30)
    assert isinstance(failed, TurnFailed)
    assert failed.error_type == "ModelPermanentError"
    ok = await session.ask("b", timeout=30)
    assert isinstance(ok, TurnDone)
    assert ok.text == "fine now"
    await session.shutdown()


async def test_bad_tool_arguments_and_unknown_tools_go_back_to_the_model(journal: Journal) -> None:
    model = ScriptedModel([Reply(tool_calls=[("echo", {"nope": 1}), ("missing", {})]), Reply(text="understood")])
    session = await rig_with(journal, model).start_session()
    done = await session.ask("go", timeout=30)
    assert isinstance(done, TurnDone)
    tool_msgs = [m for m in session.state.loops["main"].history if m.role == "tool"]
    assert "invalid arguments" in tool_msgs[0].content
    assert "unknown tool" in tool_msgs[1].content
    await session.shutdown()


async def test_ask_while_a_turn_runs_waits_for_the_turn_that_handles_its_input(journal: Journal) -> None:
    """An input that arrives mid-turn is queued (`input_queued`), not refused: `ask` returns the end of the turn that
    takes it (here the running one, which folds it in at its next model call)."""
    model = ScriptedModel(
        [Reply(tool_calls=[("echo", {"text": "a", "delay": 0.2})]), Reply(text="first answer"), Reply(text="second")]
    )
    session = await rig_with(journal, model).start_session()
    sub = session.subscribe()
    first = asyncio.ensure_future(session.ask("first", timeout=30))
    await collect_until(sub, {"tool_call_started"})  # the first turn is running its tool
    second = await session.ask("second", timeout=30)
    assert isinstance(second, TurnDone)
    done = await first
    assert isinstance(done, TurnDone) and done.turn_id == second.turn_id  # folded into the running turn
    kinds = [e.event.kind for e in await collect_until(sub, {"turn_done"})]
    assert "input_queued" in kinds and "inputs_folded" in kinds
    await session.shutdown()
