"""Server-sent events over HTTP: a streaming response that notices a client leaving, and frame helpers.

A stream only observes. When the client goes away the frame generator is closed (``aclose``) and nothing else
happens: no work is cancelled, no state changes (a connection never owns execution).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, Mapping
from typing import Any, Final

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

HEARTBEAT: Final = b": ping\n\n"


def sse_frame(data: Any, *, id: str | int | None = None, event: str | None = None) -> bytes:
    """One SSE message: optional ``id:`` and ``event:`` lines, then ``data:`` with compact JSON."""
    lines: list[str] = []
    if id is not None:
        lines.append(f"id: {id}")
    if event is not None:
        lines.append(f"event: {event}")
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    lines.append(f"data: {text}")  # compact JSON never contains a line break
    return ("\n".join(lines) + "\n\n").encode()


class EventStreamResponse(StreamingResponse):
    """``text/event-stream`` that stops producing frames as soon as the client disconnects."""

    media_type = "text/event-stream"

    def __init__(
        self,
        frames: AsyncGenerator[bytes, None],
        *,
        status_code: int = 200,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        base = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        super().__init__(frames, status_code=status_code, headers={**base, **(headers or {})})
        self._frames = frames

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        streamer = asyncio.ensure_future(self._stream(send))
        watcher = asyncio.ensure_future(self._client_left(receive))
        try:
            await asyncio.wait({streamer, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (streamer, watcher):
                task.cancel()
            await asyncio.gather(streamer, watcher, return_exceptions=True)
        if not streamer.cancelled() and (error := streamer.exception()) is not None and not isinstance(error, OSError):
            raise error

    async def _stream(self, send: Send) -> None:
        async with contextlib.aclosing(self._frames) as frames:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            async for chunk in frames:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    @staticmethod
    async def _client_left(receive: Receive) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
