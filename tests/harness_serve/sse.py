"""A small SSE reader for the tests (what a browser's EventSource does, minus reconnecting), over the floor's
parser (``loopd._infra.sse``): each message as a `Frame` with its id, event name and JSON data."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx

from loopd._infra.sse import read_sse


@dataclass(frozen=True)
class Frame:
    id: int | None
    event: str | None
    data: dict[str, Any] | None
    comment: str | None = None

    @property
    def payload(self) -> dict[str, Any]:
        """The decoded ``data:`` of an event frame (an `EventItem` or an error envelope)."""
        if self.data is None:
            raise AssertionError(f"frame {self} has no data")
        return self.data

    @property
    def is_ping(self) -> bool:
        return self.comment is not None


async def read_frames(response: httpx.Response) -> AsyncIterator[Frame]:
    """Every event and comment of an SSE response, in order (``retry:``-only frames are skipped)."""
    async for message in read_sse(response.aiter_text()):
        for comment in message.comments:
            yield Frame(id=None, event=None, data=None, comment=comment.strip())
        if message.data is not None or message.event is not None:
            yield Frame(
                id=int(message.id) if message.id is not None else None,
                event=message.event,
                data=json.loads(message.data) if message.data is not None else None,
            )
