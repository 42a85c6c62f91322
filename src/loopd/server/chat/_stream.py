"""The conversation's SSE stream, served from durable state: gap-free, no duplicates, no time window.

Framing: every stored event of every message of the conversation is one SSE message with ``id:`` = the
conversation cursor (what a client sends back as ``Last-Event-ID``) and ``data:`` = ``{"message_id", "seq",
"event"}`` (``event`` is the AgentUE event; ``start`` and ``end`` also carry ``"message"``, the message's header
without content: who wrote it, its purpose, task and status). A chat request's stream starts with one ``event:
ack`` message (no id) naming the new messages, and ends after the response's ``end``. A comment line (``: ping``)
goes out after ``heartbeat`` seconds without an event. If the database fails under an open stream, one
``event: error`` message (the error envelope plus ``resume_after``) ends it; the client resumes from its cursor.

Reading: read a page after the cursor, send it, and when nothing is new wait for the `ConversationBus` — with a
bounded wait, then read again. The waiter is registered *before* the read, so a commit either lands in the read or
wakes the wait; a wake-up lost anyway (another replica wrote) costs at most ``poll_interval``.
Must not do: change anything (a stream only observes; a disconnect closes this generator and nothing else).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any, Final

from loopd.server.chat._records import StreamItem
from loopd.server.chat._service import ChatService
from loopd.server.chat._wire import message_header
from loopd.server.http._errors import api_error_of, error_body
from loopd.server.http._sse import HEARTBEAT, sse_frame
from loopd.server.storage import StorageError

PAGE: Final = 500


def item_data(item: StreamItem) -> dict[str, Any]:
    data: dict[str, Any] = {"message_id": item.event.message_id, "seq": item.event.seq, "event": item.event.event}
    if item.message is not None:
        data["message"] = message_header(item.message)
    return data


async def conversation_frames(
    chat: ChatService,
    conversation_id: str,
    *,
    after: int,
    heartbeat: float,
    until_message_id: str | None = None,
    ack: dict[str, Any] | None = None,
) -> AsyncGenerator[bytes, None]:
    """SSE frames of the conversation after cursor ``after``; forever, or until ``until_message_id`` ends."""
    loop = asyncio.get_running_loop()
    if ack is not None:
        yield sse_frame(ack, event="ack")
    if until_message_id is not None:
        ended_at = await chat.end_cursor(until_message_id)
        if ended_at is not None and ended_at <= after:
            return
    cursor = after
    quiet_since = loop.time()
    while not chat.closing:
        wait_for = max(0.0, min(chat.poll_interval, heartbeat - (loop.time() - quiet_since)))
        waiter = asyncio.ensure_future(chat.bus.wait(conversation_id, wait_for))
        try:
            await asyncio.sleep(0)  # the waiter registers with the bus before we read
            try:
                items = await chat.read_stream(conversation_id, after=cursor, limit=PAGE)
            except StorageError as exc:
                # The database went away under an open stream: say so and end; the client resumes later.
                error = api_error_of(exc)  # internal details stay in the server log
                yield sse_frame({**error_body(error.type, error.message), "resume_after": cursor}, event="error")
                return
            for item in items:
                cursor = item.event.cursor
                yield sse_frame(item_data(item), id=cursor)
                if item.event.message_id == until_message_id and item.event.event.get("op") == "end":
                    return
            if items:
                quiet_since = loop.time()
                continue
            await waiter
        finally:
            waiter.cancel()  # not awaited: its own cleanup runs on the next turn of the loop
        if loop.time() - quiet_since >= heartbeat:
            yield HEARTBEAT
            quiet_since = loop.time()
