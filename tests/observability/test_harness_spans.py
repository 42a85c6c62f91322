"""The harness's spans: one ``invoke_agent`` per turn, a ``chat`` per model call and an ``execute_tool`` per tool
call under it, continuing the trace the input was submitted in; nothing at all while tracing is off."""

from __future__ import annotations

import asyncio

from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from loopd.harness import EchoTool, LoopDefinition, MemoryJournal, Reply, Rig, ScriptedModel, Usage
from loopd.harness.core.events import TurnDone
from tests.support.tracing import named, parent_of, recorded_spans


def _rig(model: ScriptedModel) -> Rig:
    return Rig(loops=[LoopDefinition(name="main", model=model, tools=(EchoTool(),))], journal=MemoryJournal())


async def test_a_turn_is_an_invoke_agent_span_with_chat_and_execute_tool_children(
    spans: InMemorySpanExporter,
) -> None:
    usage = Usage(input_tokens=11, output_tokens=3, calls=1)
    model = ScriptedModel(
        [Reply(tool_calls=[("echo", {"text": "pong"})], usage=usage), Reply(text="done", usage=usage)]
    )
    session = await _rig(model).start_session()
    with trace.get_tracer("test").start_as_current_span("question") as question:
        result = await session.ask("ping", timeout=30)
    assert isinstance(result, TurnDone)
    await session.shutdown()
    recorded = spans.get_finished_spans()
    [turn] = named(recorded, "invoke_agent main")
    assert parent_of(recorded, turn) is not None
    assert turn.context.trace_id == question.get_span_context().trace_id
    assert turn.attributes is not None
    assert turn.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert turn.attributes["gen_ai.conversation.id"] == session.id
    assert turn.attributes["gen_ai.usage.input_tokens"] == 22
    chats = named(recorded, f"chat {model.name}")
    assert len(chats) == 2
    assert all(parent_of(recorded, chat) is turn for chat in chats)
    assert chats[0].attributes is not None
    assert chats[0].attributes["gen_ai.usage.output_tokens"] == 3
    assert chats[0].attributes["gen_ai.response.finish_reasons"] == ("tool_calls",)
    [tool] = named(recorded, "execute_tool echo")
    assert parent_of(recorded, tool) is turn
    assert tool.attributes is not None
    assert tool.attributes["gen_ai.tool.name"] == "echo"
    assert tool.status.status_code is StatusCode.UNSET


async def test_a_failed_model_call_marks_its_span_and_the_turn() -> None:
    from loopd.harness import ModelPermanentError

    with recorded_spans() as spans:
        session = await _rig(ScriptedModel([Reply(error=ModelPermanentError("bad request"))])).start_session()
        await session.ask("ping", timeout=30)
        await session.shutdown()
    recorded = spans.get_finished_spans()
    [chat] = [s for s in recorded if s.name.startswith("chat ")]
    assert chat.status.status_code is StatusCode.ERROR
    assert chat.attributes is not None
    assert chat.attributes["error.type"] == "ModelPermanentError"
    [turn] = named(recorded, "invoke_agent main")
    assert turn.status.status_code is StatusCode.ERROR
    # Without a span around the input, the turn starts a trace of its own.
    assert turn.parent is None


async def test_an_interrupted_turn_ends_its_span_with_the_reason(spans: InMemorySpanExporter) -> None:
    # A slow tool keeps the turn open until the interrupt (however late the test gets to send it).
    model = ScriptedModel([Reply(tool_calls=[("echo", {"text": "slow", "delay": 30})]), Reply(text="x")])
    session = await _rig(model).start_session()
    sub = session.subscribe()
    await session.submit("work")
    async with asyncio.timeout(30):
        async for env in sub:
            if env.event.kind == "model_replied":
                break
    assert await session.interrupt(reason="user pressed stop") is True
    async with asyncio.timeout(30):
        async for env in sub:
            if env.event.kind == "turn_interrupted":
                break
    recorded = spans.get_finished_spans()
    [turn] = named(recorded, "invoke_agent main")
    assert turn.attributes is not None
    assert turn.attributes["loopd.turn.interrupted"] == "user pressed stop"
    assert "loopd.turn.unfinished" not in turn.attributes  # ended by the interrupt, not by the actor stopping
    await session.shutdown()


async def test_tracing_off_builds_no_tracing_at_all() -> None:
    session = await _rig(ScriptedModel([Reply(text="hi")])).start_session()
    await session.ask("ping", timeout=30)
    assert not trace.get_current_span().is_recording()
    assert all(actor._tracing is None for actor in session._actors.values())
    await session.shutdown()
