"""The AgentUE SSE binding 1.0: one AgentUE event per SSE message. Pure string functions, no I/O.

The binding: `Content-Type: text/event-stream`, `Cache-Control: no-cache`, UTF-8. One AgentUE event per SSE
message, written as `data: <compact JSON>` and a blank line; no SSE `event:` name is used. The optional `id:` is a
transport cursor (for example a Redis stream id `1740000000000-2`), independent of the event's seq, and what a
client sends back as `Last-Event-ID`. Idle heartbeats may be SSE comments (`: ping`) or AgentUE `ping` events.

The generic framing (`SseMessage`, rendering, parsing, incremental splitting) is the floor's, ``loopd._infra.sse``;
this module adds only what is AgentUE's, and reports a frame it cannot write or read as `AgentUEValidationError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from loopd._infra.sse import SseFormatError, SseMessage, parse_sse, render_sse
from loopd.agentue._errors import AgentUEValidationError
from loopd.agentue._events import Event, as_event, decode_event, encode_event

SSE_CONTENT_TYPE = "text/event-stream"
SSE_HEADERS: Mapping[str, str] = MappingProxyType({"Content-Type": SSE_CONTENT_TYPE, "Cache-Control": "no-cache"})
"""Response headers the binding requires."""


@dataclass(frozen=True, slots=True)
class SseEvent:
    """An AgentUE event received over SSE with its transport cursor (the SSE `id`, if any)."""

    event: Event
    cursor: str | None = None


def encode_sse_event(event: Event | Mapping[str, Any], *, cursor: str | None = None) -> str:
    """One AgentUE event as an SSE message: `id: <cursor>` (when given) and `data: <compact JSON>`."""
    message = SseMessage(data=encode_event(as_event(event)), id=cursor)
    try:
        return render_sse(message)
    except SseFormatError as exc:
        raise AgentUEValidationError(exc.field, exc.problem) from exc


def decode_sse_event(frame: str | SseMessage) -> SseEvent:
    """The AgentUE event carried by one SSE message (an `event:` name, if present, is ignored)."""
    message = parse_sse(frame) if isinstance(frame, str) else frame
    if message.data is None:
        raise AgentUEValidationError("sse.data", "the message carries no data (a comment or heartbeat?)")
    return SseEvent(event=decode_event(message.data), cursor=message.id)
