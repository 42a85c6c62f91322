"""The tracing benchmarks' span sink: the OpenTelemetry SDK's tracer provider with its in-memory exporter, installed
for the whole process (as `loopd._infra.telemetry.open_tracing` installs the OTLP one), and a count of the spans each
run ended. Imported only when tracing is on: the SDK stays out of the "off" processes."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


class MemorySpans:
    """Installs the provider (each ended span handed to the exporter at once) when built."""

    def __init__(self) -> None:
        self._exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(self._exporter))
        trace.set_tracer_provider(provider)

    def take(self) -> int:
        """How many spans ended since the last take; they are dropped (a real exporter would have sent them on)."""
        count = len(self._exporter.get_finished_spans())
        self._exporter.clear()
        return count
