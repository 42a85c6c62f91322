"""Server-sent events for loop-server's routes: JSON frames over the floor's SSE mechanism.

`EventStreamResponse` (a response that notices a client leaving) and the frame encoding are the floor's
(``loopd._infra.http``, ``loopd._infra.sse``); this module adds `sse_frame`, whose data is compact JSON, and the
`HEARTBEAT` comment.
A stream only observes: when the client goes away its frame generator is closed and nothing else happens.
"""

from __future__ import annotations

from typing import Any, Final

from loopd._infra.http import EventStreamResponse
from loopd._infra.jsontext import compact_lenient
from loopd._infra.sse import SSE_PING, sse_message

__all__ = ["HEARTBEAT", "EventStreamResponse", "sse_frame"]

HEARTBEAT: Final = SSE_PING


def sse_frame(data: Any, *, id: str | int | None = None, event: str | None = None) -> bytes:
    """One SSE message: optional ``id:`` and ``event:`` lines, then ``data:`` with compact JSON."""
    return sse_message(compact_lenient(data), id=id, event=event)
