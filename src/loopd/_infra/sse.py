"""Server-sent events framing: the one encoder and the one parser of loopd. Pure string functions, no I/O.

The HTML event-stream rules, both ways: lines end in LF, CR or CRLF (only those: ``str.splitlines`` knows more);
``field: value`` loses exactly one space after the colon; multi-line data is sent as several ``data:`` lines and
joined with LF; an ``id`` containing NUL is ignored; a ``retry`` that is not all ASCII digits is ignored; a message
without ``data`` dispatches no event (it may still carry comments, such as the heartbeat ``: ping``).

* Encoding: `render_sse` (one `SseMessage` as text, refusing what cannot be framed with `SseFormatError`),
  `sse_message` (the bytes of one message with text data, as the servers' streams send it), `sse_comment`, and
  `SSE_PING` (the heartbeat comment).
* Parsing: `parse_sse` (one message), `split_sse` (incremental: complete frames and the unfinished rest),
  `iter_sse` (a whole body), and `read_sse` (an async iterator of messages over an HTTP response's text, as the
  engine's remote adapter, ``loopd chat`` and the tests read a stream).

Must not do: I/O, JSON, or know any stream's payload (AgentUE's event binding is ``loopd.agentue``'s).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass
from typing import Final

from loopd._infra.errors import LoopdError

__all__ = [
    "SSE_PING",
    "SseFormatError",
    "SseMessage",
    "iter_sse",
    "parse_sse",
    "read_sse",
    "render_sse",
    "split_sse",
    "sse_comment",
    "sse_message",
]

SSE_PING: Final = b": ping\n\n"
"""The heartbeat comment the servers send on an idle stream."""

_LINE_BREAK: Final = re.compile(r"\r\n|\r|\n")


class SseFormatError(LoopdError, ValueError):
    """A message that cannot be framed: a line break in an id, event name or comment, NUL in an id, a negative or
    non-integer retry, or nothing to send at all."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


@dataclass(frozen=True, slots=True)
class SseMessage:
    """One SSE message (frame). ``data`` None means the frame carried no ``data:`` line (a comment or a bare id)."""

    data: str | None = None
    id: str | None = None
    event: str | None = None
    retry: int | None = None
    comments: tuple[str, ...] = ()


# --- encoding --------------------------------------------------------------------------------------------------


def _one_line(value: str, field: str) -> str:
    if _LINE_BREAK.search(value):
        raise SseFormatError(f"sse.{field}", "may not contain a line break")
    return value


def render_sse(message: SseMessage) -> str:
    """The text of one SSE message, ending in the blank line that dispatches it: comments, ``id:``, ``event:``,
    ``retry:``, then the data as ``data:`` lines (a lone CR in the data comes back as LF, as for any SSE client).

    Raises `SseFormatError` for what cannot be framed (see the class).
    """
    lines = [f": {_one_line(comment, 'comment')}" if comment else ":" for comment in message.comments]
    if message.id is not None:
        if "\0" in message.id:
            raise SseFormatError("sse.id", "may not contain NUL")
        lines.append(f"id: {_one_line(message.id, 'id')}")
    if message.event is not None:
        lines.append(f"event: {_one_line(message.event, 'event')}")
    if message.retry is not None:
        if isinstance(message.retry, bool) or not isinstance(message.retry, int) or message.retry < 0:
            raise SseFormatError("sse.retry", f"must be milliseconds (an integer >= 0), not {message.retry!r}")
        lines.append(f"retry: {message.retry}")
    if message.data is not None:
        lines.extend(f"data: {line}" for line in _LINE_BREAK.split(message.data))
    if not lines:
        raise SseFormatError("sse", "an empty message has nothing to send")
    return "\n".join(lines) + "\n\n"


def sse_message(text: str, *, event: str | None = None, id: str | int | None = None) -> bytes:
    """One SSE message as UTF-8: optional ``id:`` and ``event:`` lines, then ``text`` as ``data:`` lines."""
    return render_sse(SseMessage(data=text, id=None if id is None else str(id), event=event)).encode()


def sse_comment(text: str = "") -> str:
    """A comment frame, e.g. a transport heartbeat ``: ping``."""
    return render_sse(SseMessage(comments=(text,)))


# --- parsing ---------------------------------------------------------------------------------------------------


def _after_colon(value: str) -> str:
    return value[1:] if value.startswith(" ") else value


def parse_sse(frame: str) -> SseMessage:
    """Parse the lines of one SSE message (as returned by `split_sse`, or a whole rendered message).

    Unknown fields are ignored, as are an ``id`` containing NUL and a ``retry`` that is not all ASCII digits.
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

    Feed ``rest + next_chunk`` back in on the next call. Line endings are normalised to LF; a trailing CR is held
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


async def read_sse(chunks: AsyncIterable[str]) -> AsyncIterator[SseMessage]:
    """Every complete message of a stream of text, in order, as it arrives (comments included: a heartbeat is a
    message with ``data`` None). ``chunks`` may be cut anywhere, e.g. ``response.aiter_text()`` of httpx; a leading
    byte-order mark is dropped, and a message cut off by the end of the stream is not yielded."""
    rest = ""
    first = True
    async for chunk in chunks:
        if first and chunk:
            chunk, first = chunk.removeprefix("\ufeff"), False
        frames, rest = split_sse(rest + chunk)
        for frame in frames:
            yield parse_sse(frame)
