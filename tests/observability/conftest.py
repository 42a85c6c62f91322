from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.support.tracing import recorded_spans


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Spans recorded by the SDK's in-memory exporter for this test (tracing is off again afterwards)."""
    with recorded_spans() as exporter:
        yield exporter
