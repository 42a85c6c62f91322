"""A real OTLP/HTTP trace receiver on loopback for tests: a small Starlette app that decodes the protobuf export
requests (``POST /v1/traces``) the OpenTelemetry exporter sends, and keeps their spans."""

from __future__ import annotations

import gzip
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from loopd._infra.serving import open_http_server


@dataclass(frozen=True)
class ReceivedSpan:
    """One exported span, flattened: its resource's ``service.name`` and its own fields."""

    service: str
    resource: dict[str, Any]
    name: str
    trace_id: bytes
    span_id: bytes
    parent_span_id: bytes
    attributes: dict[str, Any]


@dataclass
class Receiver:
    url: str = ""
    requests: list[ExportTraceServiceRequest] = field(default_factory=list)
    content_types: list[str] = field(default_factory=list)

    def spans(self) -> list[ReceivedSpan]:
        """Every span received so far."""
        out = []
        for request in self.requests:
            for resource_spans in request.resource_spans:
                resource = {kv.key: _value(kv.value) for kv in resource_spans.resource.attributes}
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        out.append(
                            ReceivedSpan(
                                service=str(resource.get("service.name", "")),
                                resource=resource,
                                name=span.name,
                                trace_id=span.trace_id,
                                span_id=span.span_id,
                                parent_span_id=span.parent_span_id,
                                attributes={kv.key: _value(kv.value) for kv in span.attributes},
                            )
                        )
        return out


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return tuple(_value(item) for item in value.array_value.values)
    return getattr(value, kind) if kind else None


@asynccontextmanager
async def otlp_receiver() -> AsyncIterator[Receiver]:
    """Serve ``POST /v1/traces`` on a free loopback port for the block (``Receiver.url`` is its base URL)."""
    receiver = Receiver()

    async def traces(request: Request) -> Response:
        body = await request.body()
        if request.headers.get("content-encoding") == "gzip":
            body = gzip.decompress(body)
        message = ExportTraceServiceRequest()
        message.ParseFromString(body)
        receiver.requests.append(message)
        receiver.content_types.append(request.headers.get("content-type", ""))
        return Response(ExportTraceServiceResponse().SerializeToString(), media_type="application/x-protobuf")

    app = Starlette(routes=[Route("/v1/traces", traces, methods=["POST"])])
    async with open_http_server(app, lifespan="off", log_level=None) as running:
        receiver.url = running.url
        yield receiver
