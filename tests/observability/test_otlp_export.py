"""`open_tracing`: off unless the standard environment asks for OTLP; when it does, a real OTLP/HTTP receiver on
loopback gets the harness's spans (protobuf, the resource naming the service)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator

import pytest
from opentelemetry import trace

from loopd._infra.telemetry import TracingUnavailable, open_tracing, tracing_enabled, tracing_requested
from loopd.harness import EchoTool, LoopDefinition, MemoryJournal, Reply, Rig, ScriptedModel
from tests.support.otlp import otlp_receiver
from tests.support.tracing import reset_tracing

_OTEL_VARIABLES = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_SDK_DISABLED",
    "OTEL_TRACES_EXPORTER",
    "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in _OTEL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    reset_tracing()
    yield
    reset_tracing()


def test_tracing_is_off_without_an_endpoint_and_when_disabled(monkeypatch: pytest.MonkeyPatch) -> None:
    with open_tracing("loopd") as on:
        assert not on and not tracing_enabled()
    assert tracing_requested({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    assert tracing_requested({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"})
    assert not tracing_requested({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_SDK_DISABLED": "true"})
    assert not tracing_requested({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_TRACES_EXPORTER": "none"})
    assert not tracing_requested({"OTEL_EXPORTER_OTLP_ENDPOINT": "  "})
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    with open_tracing("loopd") as on:
        assert not on and not tracing_enabled()


def test_an_endpoint_without_the_sdk_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)  # as if `pyloopd[otel]` were not installed
    with pytest.raises(TracingUnavailable, match=r"pip install 'pyloopd\[otel\]'"), open_tracing("loopd"):
        pass
    assert not tracing_enabled()


async def test_spans_reach_a_real_otlp_http_receiver(monkeypatch: pytest.MonkeyPatch) -> None:
    async with otlp_receiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
        monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test")
        with open_tracing("loopd-test", **{"loopd.command": "pytest"}) as on:
            assert on and tracing_enabled()
            model = ScriptedModel([Reply(tool_calls=[("echo", {"text": "pong"})]), Reply(text="done")])
            rig = Rig(loops=[LoopDefinition(name="main", model=model, tools=(EchoTool(),))], journal=MemoryJournal())
            session = await rig.start_session()
            await session.ask("ping", timeout=30)
            await session.shutdown()
            # The exporter's thread posts to the receiver, which answers on this event loop: flush off the loop.
            provider = trace.get_tracer_provider()
            assert await asyncio.to_thread(provider.force_flush)  # type: ignore[attr-defined]
    spans = receiver.spans()
    assert receiver.content_types and all(kind == "application/x-protobuf" for kind in receiver.content_types)
    names = sorted(span.name for span in spans)
    assert names == sorted(["invoke_agent main", f"chat {model.name}", f"chat {model.name}", "execute_tool echo"])
    turn = next(span for span in spans if span.name == "invoke_agent main")
    assert turn.service == "loopd-test"
    assert turn.resource["deployment.environment"] == "test" and turn.resource["loopd.command"] == "pytest"
    assert turn.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert turn.attributes["gen_ai.conversation.id"] == session.id
    assert {span.trace_id for span in spans} == {turn.trace_id}
    assert all(span.parent_span_id == turn.span_id for span in spans if span is not turn)
    tool = next(span for span in spans if span.name == "execute_tool echo")
    assert tool.attributes["gen_ai.tool.name"] == "echo"
