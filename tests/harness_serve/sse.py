"""A small SSE reader for the tests (what a browser's EventSource does, minus reconnecting)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx


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
    fields: dict[str, str] = {}
    data: list[str] = []
    async for line in response.aiter_lines():
        if line == "":
            if data or "event" in fields:
                raw_id = fields.get("id")
                yield Frame(
                    id=int(raw_id) if raw_id is not None else None,
                    event=fields.get("event"),
                    data=json.loads("\n".join(data)) if data else None,
                )
            fields, data = {}, []
            continue
        if line.startswith(":"):
            yield Frame(id=None, event=None, data=None, comment=line[1:].strip())
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            data.append(value)
        else:
            fields[name] = value
