"""SSE framing for the AgentUE SSE binding 1.0: pure string functions, no I/O.

The binding: `Content-Type: text/event-stream`, `Cache-Control: no-cache`, UTF-8. One AgentUE event per SSE
message, written as `data: <compact JSON>` and a blank line; no SSE `event:` name is used. The optional `id:` is a
transport cursor (for example a Redis stream id `1740000000000-2`), independent of the event's seq, and what a
client sends back as `Last-Event-ID`. Idle heartbeats may be SSE comments (`: ping`) or AgentUE `ping` events.

The generic half (`SseMessage`, `render_sse`, `parse_sse`, `split_sse`) follows the HTML event-stream rules:
lines end in LF, CR or CRLF; `field: value` loses exactly one space after the colon; multi-line data is joined with
LF; an `id` containing NUL is ignored; a message without `data` dispatches nothing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from loopd.agentue._errors import AgentUEValidationError
from loopd.agentue._events import Event, as_event, decode_event, encode_event

SSE_CONTENT_TYPE = "text/event-stream"
SSE_HEADERS: Mapping[str, str] = MappingProxyType({"Content-Type": SSE_CONTENT_TYPE, "Cache-Control": "no-cache"})
"""Response headers the binding requires."""

_LINE_BREAK = re.compile(r"\r\n|\r|\n")


@dataclass(frozen=True, slots=True)
class SseMessage:
    """One SSE message (frame). `data` None means the frame carried no `data:` line (a comment or a bare id)."""

    data: str | None = None
    id: str | None = None
    event: str | None = None
    retry: int | None = None
    comments: tuple[str, ...] = ()


def _one_line(value: str, what: str) -> str:
    if _LINE_BREAK.search(value):
        raise AgentUEValidationError(f"sse.{what}", "may not contain a line break")
    return value


def render_sse(message: SseMessage) -> str:
    """The text of one SSE message, ending in the blank line that dispatches it.

    Data with line breaks becomes several `data:` lines (a lone CR comes back as LF, as for any SSE client).
    """
    lines = [f": {_one_line(comment, 'comment')}" if comment else ":" for comment in message.comments]
    if message.event is not None:
        lines.append(f"event: {_one_line(message.event, 'event')}")
    if message.id is not None:
        if "\0" in message.id:
            raise AgentUEValidationError("sse.id", "may not contain NUL")
        lines.append(f"id: {_one_line(message.id, 'id')}")
    if message.retry is not None:
        if isinstance(message.retry, bool) or not isinstance(message.retry, int) or message.retry < 0:
            raise AgentUEValidationError("sse.retry", f"must be milliseconds (an integer >= 0), not {message.retry!r}")
        lines.append(f"retry: {message.retry}")
    if message.data is not None:
        lines.extend(f"data: {line}" for line in _LINE_BREAK.split(message.data))
    if not lines:
        raise AgentUEValidationError("sse", "an empty message has nothing to send")
    return "\n".join(lines) + "\n\n"


def _after_colon(value: str) -> str:
    return value[1:] if value.startswith(" ") else value


def parse_sse(frame: str) -> SseMessage:
    """Parse the lines of one SSE message (as returned by `split_sse`, or a whole rendered message).

    Unknown fields are ignored, as are an `id` containing NUL and a `retry` that is not all ASCII digits.
    """
    data: list[str] = []
    comments: list[str] = []
    event_id: str | None = None
    event_name: str | None = None
    retry: int | None = None
    for line in _LINE_BREAK.split(frame):
        if not line:
            continue
        if line.startswith(":"):
            comments.append(_after_colon(line[1:]))
            continue
        name, colon, raw = line.partition(":")
        value = _after_colon(raw) if colon else ""
        if name == "data":
            data.append(value)
        elif name == "id":
            if "\0" not in value:
                event_id = value
        elif name == "event":
            event_name = value
        elif name == "retry" and value.isascii() and value.isdigit():
            retry = int(value)
    return SseMessage(
        data="\n".join(data) if data else None,
        id=event_id,
        event=event_name,
        retry=retry,
        comments=tuple(comments),
    )


def split_sse(buffer: str) -> tuple[list[str], str]:
    """Split received text into complete frames and the unfinished rest.

    Feed `rest + next_chunk` back in on the next call. Line endings are normalised to LF; a trailing CR is held
    back in case the next chunk starts with LF. Frames are returned without their terminating blank line; empty
    frames (extra blank lines) are skipped. Text after the last blank line is never a frame: an SSE message cut
    off by the end of the stream is discarded.
    """
    held = ""
    if buffer.endswith("\r"):
        buffer, held = buffer[:-1], "\r"
    *complete, partial = _LINE_BREAK.split(buffer)
    frames: list[str] = []
    current: list[str] = []
    for line in complete:
        if line:
            current.append(line)
        elif current:
            frames.append("\n".join(current))
            current = []
    rest = "".join(line + "\n" for line in current) + partial + held
    return frames, rest


def iter_sse(body: str) -> list[SseMessage]:
    """Every complete message of a whole event-stream body (a leading byte-order mark is dropped)."""
    frames, _ = split_sse(body.removeprefix("\ufeff"))
    return [parse_sse(frame) for frame in frames]


def sse_comment(text: str = "") -> str:
    """A comment frame, e.g. a transport heartbeat `: ping`."""
    return render_sse(SseMessage(comments=(text,)))


@dataclass(frozen=True, slots=True)
class SseEvent:
    """An AgentUE event received over SSE with its transport cursor (the SSE `id`, if any)."""

    event: Event
    cursor: str | None = None


def encode_sse_event(event: Event | Mapping[str, Any], *, cursor: str | None = None) -> str:
    """One AgentUE event as an SSE message: `id: <cursor>` (when given) and `data: <compact JSON>`."""
    return render_sse(SseMessage(data=encode_event(as_event(event)), id=cursor))


def decode_sse_event(frame: str | SseMessage) -> SseEvent:
    """The AgentUE event carried by one SSE message (an `event:` name, if present, is ignored)."""
    message = parse_sse(frame) if isinstance(frame, str) else frame
    if message.data is None:
        raise AgentUEValidationError("sse.data", "the message carries no data (a comment or heartbeat?)")
    return SseEvent(event=decode_event(message.data), cursor=message.id)
