"""A harness call to a real ``loopd harness serve`` on loopback: the engine's remote adapter sends ``traceparent``
with its requests, so the remote harness's turn is a span of the caller's trace."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from loopd.harness import EchoTool, LoopDefinition, MemoryJournal, Reply, Rig, ScriptedModel
from loopd.harness.serve import create_app, open_harness_server
from loopd.server.engine import AdapterRequest, Finished, RemoteHarnessAdapter
from tests.support.tracing import named, parent_of

TOKEN = "remote-token"


async def test_the_remote_harness_turn_joins_the_callers_trace(spans: InMemorySpanExporter) -> None:
    model = ScriptedModel([Reply(tool_calls=[("echo", {"text": "pong"})]), Reply(text="done")])
    rig = Rig(loops=[LoopDefinition(name="main", model=model, tools=(EchoTool(),))], journal=MemoryJournal())
    async with open_harness_server(create_app(rig, token=TOKEN)) as server:
        adapter = RemoteHarnessAdapter(server.url, TOKEN, timeout=30)
        request = AdapterRequest(
            call_id="call-1",
            target="remote",
            text="ping",
            history=(),
            options={},
            deadline=datetime.now(UTC) + timedelta(seconds=60),
            timeout=60.0,
        )
        with trace.get_tracer("test").start_as_current_span("loopd.harness_call") as caller:
            run = await adapter.start(request)
            updates = [update async for update in run.updates()]
            await run.aclose()
        await adapter.aclose()
    assert isinstance(updates[-1], Finished)
    recorded = spans.get_finished_spans()
    [turn] = named(recorded, "invoke_agent main")
    assert turn.context is not None and turn.context.trace_id == caller.get_span_context().trace_id
    ancestors = [turn]
    while (up := parent_of(recorded, ancestors[-1])) is not None:
        ancestors.append(up)
    # The turn's input came in as `POST /v1/sessions/{session_id}/inputs`, whose server span continues the caller's.
    assert [span.name for span in ancestors][-1] == "loopd.harness_call", [span.name for span in ancestors]
    assert any(span.name == "POST /v1/sessions/{session_id}/inputs" for span in ancestors)
    [tool] = named(recorded, "execute_tool echo")
    assert parent_of(recorded, tool) is turn
