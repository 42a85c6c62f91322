"""The HTTP watch stream: newline-delimited ``{"type", "object"}`` events over a chunked 200 response.

Owns: ``WatchResponse`` — opens the store watch, writes events (as objects or one-row Tables), ends on
``timeoutSeconds``, turns ``Gone`` into an ``ERROR`` event with a 410 ``Expired`` Status, and stops watching as
soon as the client disconnects. Must not do: object semantics. A connection never owns anything but its watch.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from starlette.types import Receive, Scope, Send

from loopd._infra.clock import Clock
from loopd._infra.tasks import race

from ._api_tables import IncludeObject, table
from ._errors import ResourceError
from ._kinds import KindSpec
from ._store import WatchEvent, WatchStream


def _line(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n"


class WatchResponse:
    def __init__(
        self,
        stream: WatchStream,
        *,
        spec: KindSpec,
        as_table: bool,
        include: IncludeObject,
        timeout: float | None,
        clock: Clock,
    ) -> None:
        self._stream = stream
        self._clock = clock
        self._spec = spec
        self._as_table = as_table
        self._include = include
        self._timeout = timeout
        self._columns_sent = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"cache-control", b"no-cache, private"),
                ],
            }
        )
        # The writer and the watcher for the client leaving: the first to end cancels the other (one TaskGroup).
        written, left = await race(
            self._write_events(send),
            _wait_for_disconnect(receive),
            names=("loopd-resources-watch-writer", "loopd-resources-watch-disconnect"),
        )
        for outcome in (written, left):
            if outcome.error is not None and not isinstance(outcome.error, OSError):
                raise outcome.error  # a gone client (OSError) is the normal end of a watch
        if written.ok:
            with contextlib.suppress(OSError):
                await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _write_events(self, send: Send) -> None:
        loop = asyncio.get_running_loop()
        deadline = None if self._timeout is None else loop.time() + self._timeout
        try:
            async with self._stream as events:
                iterator = events.__aiter__()
                while True:
                    try:
                        if deadline is None:
                            event = await anext(iterator)
                        else:
                            async with asyncio.timeout_at(deadline):
                                event = await anext(iterator)
                    except (StopAsyncIteration, TimeoutError):
                        return
                    await send({"type": "http.response.body", "body": _line(self._encode(event)), "more_body": True})
        except ResourceError as exc:  # Gone (410 Expired) tells the client to relist
            payload = {"type": "ERROR", "object": exc.to_status()}
            await send({"type": "http.response.body", "body": _line(payload), "more_body": True})

    def _encode(self, event: WatchEvent) -> dict[str, Any]:
        if not self._as_table or event.type == "BOOKMARK":
            return {"type": event.type, "object": event.object}
        rv = str(event.object.get("metadata", {}).get("resourceVersion", ""))
        rendered = table(
            self._spec,
            [event.object],
            resource_version=rv,
            include=self._include,
            with_columns=not self._columns_sent,
            now=self._clock.now(),
        )
        self._columns_sent = True
        return {"type": event.type, "object": rendered}


async def _wait_for_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
