"""The conversation's SSE stream, served from durable state: gap-free, no duplicates, no time window.

Framing: every stored event of every message of the conversation is one SSE message with ``id:`` = the
conversation cursor (what a client sends back as ``Last-Event-ID``) and ``data:`` = ``{"message_id", "seq",
"event"}`` (``event`` is the AgentUE event; ``start`` and ``end`` also carry ``"message"``, the message's header
without content: who wrote it, its purpose, task and status). A chat request's stream starts with one ``event:
ack`` message (no id) naming the new messages, and ends after the response's ``end``. A comment line (``: ping``)
goes out after ``heartbeat`` seconds without an event. If the database fails under an open stream, one
``event: error`` message (the error envelope plus ``resume_after``) ends it; the client resumes from its cursor.

Reading: the stream subscribes to its conversation's feed (``_feeds``: one shared reader per conversation that
reads each new page once and encodes each frame once), catches up from its own cursor by reading the log itself,
then sends what the feed buffers for it, skipping by cursor what it already sent. A stream that falls behind is
detached by the feed and catches up from the log again, so a slow client loses nothing and slows no one.
Several frames that are ready together go out as one chunk; the one that ends a chat request's stream is a
`LastChunk`, written with the response's end. A live conversation stream (no ``until_message_id``)
given a `DirectChannel` lets the feed write frames to its connection itself while it is parked (see ``_feeds``):
its cursor is the subscription's, and a heartbeat goes out only after ``heartbeat`` seconds without either.
Must not do: change anything (a stream only observes; a disconnect closes this generator and nothing else).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Iterable
from typing import Any

from loopd._infra.http import DirectChannel, LastChunk
from loopd.server.chat._feeds import PAGE, Frame, frame_of, item_data
from loopd.server.chat._reader import ConversationReader
from loopd.server.chat._records import StreamPage
from loopd.server.http import HEARTBEAT, api_error_of, error_body, sse_frame
from loopd.server.storage import StorageError

__all__ = ["PAGE", "conversation_frames", "item_data"]


def _chunk(frames: Iterable[Frame], cursor: int, until_message_id: str | None) -> tuple[bytes, int, bool]:
    """The frames after ``cursor`` as one chunk, up to ``until_message_id``'s end: (chunk, new cursor, ended)."""
    parts: list[bytes] = []
    for frame in frames:
        if frame.cursor <= cursor:
            continue  # already sent (read from the log before the feed handed it out)
        parts.append(frame.data)
        cursor = frame.cursor
        if until_message_id is not None and frame.ends == until_message_id:
            return b"".join(parts), cursor, True
    return b"".join(parts), cursor, False


async def conversation_frames(
    conversations: ConversationReader,
    conversation_id: str,
    *,
    after: int,
    heartbeat: float,
    until_message_id: str | None = None,
    ack: dict[str, Any] | None = None,
    direct: DirectChannel | None = None,
    may_have_ended: bool = True,
    first: StreamPage | None = None,
) -> AsyncGenerator[bytes, None]:
    """SSE frames of the conversation after cursor ``after``; forever, or until ``until_message_id`` ends. With
    ``direct`` (the response's channel; ignored with ``until_message_id``) the feed may write frames itself.
    ``may_have_ended=False``: the message cannot have ended at or before ``after`` (a question asked just now,
    with ``after`` the cursor taken in its transaction), so that is not looked up. ``first``: the page of the log
    right after ``after``, known without reading it (the events a question's own transaction stored, its ``end``
    their last cursor); the first catch-up takes it instead of a read."""
    clock = conversations.feeds.clock  # heartbeats are measured on the server's clock
    # The ack goes out with the first chunk when that is known without reading (one write for both), else at once.
    pending = b"" if ack is None else sse_frame(ack, event="ack")
    if pending and (first is None or may_have_ended):
        yield pending
        pending = b""
    if until_message_id is not None and may_have_ended:
        ended_at = await conversations.end_cursor(until_message_id)
        if ended_at is not None and ended_at <= after:
            return
    quiet_since = clock.monotonic()
    channel = direct if until_message_id is None else None
    with conversations.feeds.subscribe(conversation_id, after=after, direct=channel) as stream:
        while not conversations.closing:
            if not stream.is_attached():
                # Catch up from the log by ourselves, then follow the feed (attached first: nothing falls between).
                while True:
                    if not stream.is_attached():  # first, or it fell behind again while catching up
                        stream.attach()
                        if not stream.is_attached():
                            if pending:
                                yield pending
                            return  # the feeds are closed: shutting down
                    cursor = stream.cursor
                    known, first = first, None
                    try:
                        if known is not None and known.items and known.items[0].event.cursor == cursor + 1:
                            page = known
                        else:
                            if pending:
                                yield pending
                                pending = b""
                            page = await conversations.read_stream_page(conversation_id, after=cursor, limit=PAGE)
                    except StorageError as exc:
                        # The database went away under an open stream: say so and end; the client resumes later.
                        error = api_error_of(exc)  # internal details stay in the server log
                        yield sse_frame(
                            {**error_body(error.type, error.message), "resume_after": cursor}, event="error"
                        )
                        return
                    chunk, cursor, ended = _chunk(map(frame_of, page.items), cursor, until_message_id)
                    stream.cursor = cursor
                    if pending:
                        chunk, pending = pending + chunk, b""
                    if ended:
                        if chunk:
                            yield LastChunk(chunk)
                        return
                    if chunk:
                        yield chunk
                        quiet_since = clock.monotonic()
                    if len(page.items) < PAGE and stream.covers(cursor, page.end):
                        break
                continue
            frames = stream.take()
            if frames:
                chunk, stream.cursor, ended = _chunk(frames, stream.cursor, until_message_id)
                if ended:
                    if chunk:
                        yield LastChunk(chunk)  # with the response's end, in one write
                    return
                if chunk:
                    yield chunk
                    quiet_since = clock.monotonic()
                continue
            if not stream.is_attached():
                continue  # fell behind: read the log from our own cursor
            if stream.written_at is not None and stream.written_at > quiet_since:
                quiet_since = stream.written_at  # the feed wrote for us meanwhile
            if clock.monotonic() - quiet_since >= heartbeat:
                yield HEARTBEAT
                quiet_since = clock.monotonic()
                continue
            await stream.wait(quiet_since + heartbeat)
    if pending:  # shutting down before the first chunk
        yield pending
