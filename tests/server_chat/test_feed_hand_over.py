"""The live feed hands out what this process's writers stored as they commit it (`ConversationBus.committed`),
without reading it back from the log — and reads the log whenever a hand-over does not continue where it is."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

import pytest

from loopd._infra.sse import parse_sse, split_sse
from loopd.server.chat import ChatRequest, ConversationReader, conversation_frames, text_content
from loopd.server.http._identity import Identity
from loopd.server.storage import Conversation
from loopd.server.streams import emit
from tests.server_http.support import Rig, text_events
from tests.support.waiting import eventually

ALICE = Identity("user", "alice")
Entry = tuple[int, str, int, dict[str, Any]]


@pytest.fixture
async def reader(rig: Rig) -> AsyncIterator[ConversationReader]:
    """A reader over the rig's database and bus (its poll never comes: the rig's clock is virtual and stands)."""
    made = ConversationReader(rig.db, rig.ctx.bus, poll_interval=5.0)
    yield made
    await made.feeds.aclose()


async def _log(rig: Rig, conversation_id: str) -> list[Entry]:
    async with rig.db.transaction(read_only=True) as tx:
        events = await tx.message_events.read_conversation_events(conversation_id)
    return [(e.cursor, e.message_id, e.seq, e.event) for e in events]


def _parsed(chunks: list[bytes]) -> list[Entry]:
    found, rest = split_sse(b"".join(chunks).decode())
    assert rest == ""
    entries: list[Entry] = []
    for text in found:
        message = parse_sse(text)
        if message.id and message.data is not None:
            data = json.loads(message.data)
            entries.append((int(message.id), data["message_id"], data["seq"], data["event"]))
    return entries


def _append(piece: str) -> list[dict[str, Any]]:
    return [{"op": "append", "mask": "block.content", "block": {"id": "a", "content": piece}}]


async def _collect(frames: AsyncGenerator[bytes, None], into: list[bytes]) -> None:
    async for chunk in frames:
        into.append(chunk)


async def _asked(rig: Rig) -> tuple[Conversation, ChatRequest]:
    """A new conversation of Alice's with a question to the echo operator in it."""
    conversation = await rig.chat.create_conversation(ALICE)
    asked = await rig.chat.ask(
        ALICE, conversation.id, target_kind="operator", target_key="echo", content=text_content("x")
    )
    return conversation, asked


async def _until(predicate: Callable[[], bool]) -> None:
    await eventually(predicate, timeout=10.0)


async def test_events_emitted_here_reach_every_stream_without_the_feed_reading_them_back(
    rig: Rig, reader: ConversationReader
) -> None:
    conversation, asked = await _asked(rig)
    chunks: list[list[bytes]] = [[] for _ in range(5)]
    streams = [
        asyncio.ensure_future(
            _collect(
                conversation_frames(
                    reader, conversation.id, after=0, heartbeat=30.0, until_message_id=asked.response.id
                ),
                into,
            )
        )
        for into in chunks
    ]
    async with asyncio.timeout(20):
        await _until(lambda: all(into for into in chunks) and reader.feeds.statistics().feeds == 1)
        # The feed starts where the streams' catch-up ended, and the bus knows nothing committed after that: no
        # first read (`ConversationBus.head`).
        await _until(lambda: reader.feeds.statistics().skipped_reads == 1)
        reads = reader.feeds.statistics().reads
        assert reads == 0
        await rig.task_api.emit(asked.task_id, text_events("a"))
        for index in range(10):
            await rig.task_api.emit(asked.task_id, _append(str(index)))
        await _until(lambda: all(b'"content":"9"' in b"".join(into) for into in chunks))
        statistics = reader.feeds.statistics()
        assert statistics.reads == reads  # eleven commits handed over, none read back
        assert statistics.handed >= 1
        await rig.task_api.complete(asked.task_id)  # its end carries a header: read from the log
        await asyncio.gather(*streams)
    log = await _log(rig, conversation.id)
    for into in chunks:
        assert _parsed(into) == log


async def test_a_hand_over_that_skips_an_event_makes_the_feed_read_the_log(
    rig: Rig, reader: ConversationReader
) -> None:
    conversation, asked = await _asked(rig)
    chunks: list[bytes] = []
    stream = asyncio.ensure_future(
        _collect(
            conversation_frames(reader, conversation.id, after=0, heartbeat=30.0, until_message_id=asked.response.id),
            chunks,
        )
    )
    async with asyncio.timeout(20):
        await _until(lambda: bool(chunks) and reader.feeds.statistics().feeds == 1)
        await rig.task_api.emit(asked.task_id, text_events("a"))
        await _until(lambda: len(_parsed(chunks)) == 3)
        async with rig.db.transaction() as tx:  # as another replica would: no notice reaches this process
            await emit(tx, asked.response.id, _append("unheard"))
        await rig.task_api.emit(asked.task_id, _append("heard"))  # handed over, but one cursor further on
        await _until(lambda: b"heard" in b"".join(chunks))
        await rig.task_api.complete(asked.task_id)
        await stream
    log = await _log(rig, conversation.id)
    assert _parsed(chunks) == log  # "unheard" too, before "heard": read from the log, not lost


async def test_a_feed_skips_its_first_read_only_while_nothing_came_after_its_start_that_was_not_handed_here(
    rig: Rig, reader: ConversationReader
) -> None:
    conversation, asked = await _asked(rig)
    bus = rig.ctx.bus
    head = bus.head(conversation.id)
    assert head is not None  # the question's own commit told the bus

    async def started(cursor: int, between: Callable[[], object] = lambda: None) -> tuple[int, int]:
        """A feed begun at ``cursor`` (``between`` runs before its task does): its (reads, skipped reads)."""
        before = reader.feeds.statistics()
        feed = reader.feeds.live_feed(conversation.id)
        assert feed is not None
        feed.begin(cursor)
        between()
        done = before.reads + before.skipped_reads
        await _until(lambda: reader.feeds.statistics().reads + reader.feeds.statistics().skipped_reads > done)
        after = reader.feeds.statistics()
        feed.stop()
        return after.reads - before.reads, after.skipped_reads - before.skipped_reads

    async with asyncio.timeout(20):
        assert await started(head) == (0, 1)
        # A notice without events (another replica's commit, a writer that only notifies) lands after the feed
        # began but before its task follows the bus: what it announced may lie after the start, so it reads.
        assert await started(head, lambda: bus.notify(conversation.id)) == (1, 0)
        # Not known at all (forgotten by that notice): it reads.
        assert bus.head(conversation.id) is None
        assert await started(head) == (1, 0)
        # Known, but further on than where the feed starts: it reads.
        await rig.task_api.emit(asked.task_id, text_events("a"))
        assert bus.head(conversation.id) == head + 1
        assert await started(head) == (1, 0)
