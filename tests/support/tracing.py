"""Recording spans in a test: the SDK's in-memory exporter behind a tracer provider installed for one test.

OpenTelemetry keeps its tracer provider in a process-wide global that may be set once; `recorded_spans` installs
one for the length of a test and puts the "unset" state back afterwards (through the API's private globals, the
way OpenTelemetry's own test utilities do), so tests that do not ask for tracing keep running with it off.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once


def reset_tracing() -> None:
    """Put OpenTelemetry's global tracer provider back to "never set" (the API's proxy)."""
    trace._TRACER_PROVIDER_SET_ONCE = Once()  # type: ignore[attr-defined]  # see the module docstring
    trace._TRACER_PROVIDER = None  # type: ignore[attr-defined]


@contextmanager
def recorded_spans() -> Iterator[InMemorySpanExporter]:
    """Install an SDK tracer provider exporting into memory (synchronously) for the block."""
    reset_tracing()
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    try:
        yield exporter
    finally:
        provider.shutdown()
        reset_tracing()


def named(spans: Sequence[ReadableSpan], name: str) -> list[ReadableSpan]:
    """The spans called ``name``."""
    return [span for span in spans if span.name == name]


def parent_of(spans: Sequence[ReadableSpan], span: ReadableSpan) -> ReadableSpan | None:
    """The recorded parent of ``span`` (None for a root or a parent not recorded here)."""
    if span.parent is None:
        return None
    return next((s for s in spans if s.context is not None and s.context.span_id == span.parent.span_id), None)
