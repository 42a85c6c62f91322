"""One shared reader per conversation behind its streams: every stream still gets every event exactly once, in
order — many streams at once, a stream that falls behind, a resume while the feed is live, another replica's
write — and the feed exists only while the conversation has streams."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from loopd._infra.sse import parse_sse, split_sse
from loopd.server.chat import ConversationReader, conversation_frames, text_content
from loopd.server.chat._feeds import POLL_BACKOFF
from loopd.server.http._identity import Identity
from loopd.server.streams import ConversationBus, emit
from tests.server_http.support import (
    Frame,
    Rig,
    ask,
    frames_of,
    new_conversation,
    real_client,
    served,
    text_events,
)
from tests.support.cycles import Watch, collector_off
from tests.support.waiting import eventually

ALICE = Identity("user", "alice")
Entry = tuple[int, str, int, dict[str, Any]]


@pytest.fixture
async def reader_of(rig: Rig) -> AsyncIterator[Callable[..., ConversationReader]]:
    """Readers over the rig's database and bus; their feeds' tasks are closed (awaited) after the test."""
    made: list[ConversationReader] = []

    def make(**options: Any) -> ConversationReader:
        made.append(ConversationReader(rig.db, rig.ctx.bus, **options))
        return made[-1]

    yield make
    for reader in made:
        await reader.feeds.aclose()


async def _log(rig: Rig, conversation_id: str) -> list[Entry]:
    async with rig.db.transaction(read_only=True) as tx:
        events = await tx.message_events.read_conversation_events(conversation_id)
    return [(e.cursor, e.message_id, e.seq, e.event) for e in events]


def _entries(frames: list[Frame]) -> list[Entry]:
    return [
        (f.id, f.data["message_id"], f.data["seq"], f.data["event"])
        for f in frames
        if f.id is not None and f.data is not None
    ]


def _parsed(chunks: list[bytes]) -> list[Entry]:
    """The events in raw stream bytes (chunks may hold several frames)."""
    found, rest = split_sse(b"".join(chunks).decode())
    assert rest == ""
    entries: list[Entry] = []
    for text in found:
        message = parse_sse(text)
        if message.id:
            assert message.data is not None
            data = json.loads(message.data)
            entries.append((int(message.id), data["message_id"], data["seq"], data["event"]))
    return entries


def _append(piece: str) -> list[dict[str, Any]]:
    return [{"op": "append", "mask": "block.content", "block": {"id": "a", "content": piece}}]


async def _until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    await eventually(predicate, timeout=timeout)


async def _collect(frames: AsyncGenerator[bytes, None], into: list[bytes]) -> list[bytes]:
    async for chunk in frames:
        into.append(chunk)
    return into


def _is_end_of(frame: Frame, message_id: str) -> bool:
    return frame.data is not None and frame.data["message_id"] == message_id and frame.data["event"]["op"] == "end"


async def test_many_streams_share_one_feed_and_each_gets_every_event_once_in_order(rig: Rig) -> None:
    streams = 30
    async with served(rig) as url:
        user = real_client(rig, url)
        operator = real_client(rig, url, actor="operator:echo")
        cid = await new_conversation(user)
        accepted = await ask(user, cid)
        task_id, response_id = accepted["task_id"], accepted["response"]["id"]

        async def reader() -> list[Frame]:
            got: list[Frame] = []
            async with (
                httpx.AsyncClient(base_url=url, headers=dict(user.headers), timeout=10) as own,
                own.stream("GET", f"/v1/conversations/{cid}/stream?after=0") as response,
            ):
                async for frame in frames_of(response):
                    got.append(frame)
                    if _is_end_of(frame, response_id):
                        break
            return got

        async with asyncio.timeout(30):
            readers = [asyncio.ensure_future(reader()) for _ in range(streams)]
            await _until(lambda: rig.conversations.feeds.statistics().subscriptions == streams)
            assert rig.conversations.feeds.statistics().feeds == 1
            posted = await operator.post(f"/v1/tasks/{task_id}/events", json={"events": text_events("a")})
            assert posted.status_code == 200
            for index in range(20):
                posted = await operator.post(f"/v1/tasks/{task_id}/events", json={"events": _append(str(index))})
                assert posted.status_code == 200
            assert (await operator.post(f"/v1/tasks/{task_id}/complete", json={})).status_code == 200
            results = await asyncio.gather(*readers)
        log = await _log(rig, cid)
        for got in results:
            assert _entries(got) == log
        statistics = rig.conversations.feeds.statistics()
        assert statistics.frames <= len(log)  # each event was encoded once, not once per stream
        assert statistics.detached == 0
        await _until(lambda: rig.conversations.feeds.statistics().feeds == 0)  # everyone left: the feed stopped


async def test_a_stream_that_falls_behind_is_detached_and_still_gets_every_event_once(
    rig: Rig, reader_of: Callable[..., ConversationReader]
) -> None:
    reader = reader_of(poll_interval=5.0, stream_buffer=4)
    conversation = await rig.chat.create_conversation(ALICE)
    asked = await rig.chat.ask(
        ALICE, conversation.id, target_kind="operator", target_key="echo", content=text_content("count")
    )

    def frames() -> AsyncGenerator[bytes, None]:
        return conversation_frames(reader, conversation.id, after=0, heartbeat=30.0, until_message_id=asked.response.id)

    fast_chunks: list[bytes] = []
    fast = asyncio.ensure_future(_collect(frames(), fast_chunks))
    slow = frames()
    async with asyncio.timeout(20):
        slow_chunks = [await anext(slow)]  # the slow client takes one chunk, then stops reading for a while
        await _until(lambda: len(fast_chunks) >= 1)  # the fast stream caught up: the feed is live
        await rig.task_api.emit(asked.task_id, text_events("a"))
        for index in range(12):
            # A writer that lets others run between its writes (each of an operator's emits is a request of its
            # own); a task writing back to back keeps the loop for up to `YIELD_AFTER`, and a reader's buffer of
            # 4 frames would overflow then too.
            await asyncio.sleep(0)
            await rig.task_api.emit(asked.task_id, _append(str(index)))
        await _until(lambda: reader.feeds.statistics().detached >= 1)  # the slow stream's buffer overflowed
        await rig.task_api.emit(asked.task_id, _append("after"))
        await rig.task_api.complete(asked.task_id)
        await fast
        slow_chunks += [chunk async for chunk in slow]  # it reads on, from the log, to the end
    log = await _log(rig, conversation.id)
    assert _parsed(fast_chunks) == log
    assert _parsed(slow_chunks) == log
    assert reader.feeds.statistics().detached == 1  # only the slow one
    await _until(lambda: reader.feeds.statistics().feeds == 0)


async def test_resuming_with_last_event_id_while_the_feed_is_live_has_no_gap_and_no_duplicate(rig: Rig) -> None:
    async with served(rig) as url:
        user = real_client(rig, url)
        operator = real_client(rig, url, actor="operator:echo")
        cid = await new_conversation(user)
        accepted = await ask(user, cid)
        task_id, response_id = accepted["task_id"], accepted["response"]["id"]
        first: list[Frame] = []

        async def live() -> None:
            async with user.stream("GET", f"/v1/conversations/{cid}/stream?after=0") as response:
                async for frame in frames_of(response):
                    first.append(frame)
                    if _is_end_of(frame, response_id):
                        return

        resumed = asyncio.Event()

        async def publish() -> None:
            await operator.post(f"/v1/tasks/{task_id}/events", json={"events": text_events("a")})
            for index in range(40):
                await operator.post(f"/v1/tasks/{task_id}/events", json={"events": _append(str(index))})
                if index == 19:
                    await resumed.wait()  # the second half arrives while the resumed stream follows the feed
            await operator.post(f"/v1/tasks/{task_id}/complete", json={})

        async with asyncio.timeout(30):
            watching = asyncio.ensure_future(live())
            publishing = asyncio.ensure_future(publish())
            await _until(lambda: len(_entries(first)) >= 10)  # mid-answer, with the feed handing events out
            resume_at = _entries(first)[7][0]
            second: list[Frame] = []
            headers = {"Last-Event-ID": str(resume_at)}
            async with user.stream("GET", f"/v1/conversations/{cid}/stream", headers=headers) as response:
                async for frame in frames_of(response):
                    second.append(frame)
                    resumed.set()
                    if _is_end_of(frame, response_id):
                        break
            await publishing
            await watching
        log = await _log(rig, cid)
        assert _entries(first) == log
        assert _entries(second) == [entry for entry in log if entry[0] > resume_at]


async def test_the_feed_stops_when_the_last_stream_leaves(rig: Rig) -> None:
    async with served(rig) as url:
        user = real_client(rig, url)
        cid = await new_conversation(user)
        await ask(user, cid)
        leave = [asyncio.Event() for _ in range(3)]

        async def reader(index: int) -> None:
            async with (
                httpx.AsyncClient(base_url=url, headers=dict(user.headers), timeout=10) as own,
                own.stream("GET", f"/v1/conversations/{cid}/stream?after=0") as response,
            ):
                async for _frame in frames_of(response):
                    await leave[index].wait()
                    return

        with collector_off():  # only reference counting frees anything meanwhile
            async with asyncio.timeout(15):
                readers = [asyncio.ensure_future(reader(index)) for index in range(3)]
                await _until(lambda: rig.conversations.feeds.statistics().subscriptions == 3)
                await _until(lambda: rig.ctx.bus.watched == 1)  # one reader waits on the bus for all three
                watch = Watch()
                watch.add("the feed", rig.conversations.feeds._feeds[cid])
                for index in (0, 1):
                    leave[index].set()
                    await readers[index]
                await _until(lambda: rig.conversations.feeds.statistics().subscriptions == 1)
                assert rig.conversations.feeds.statistics().feeds == 1
                leave[2].set()
                await readers[2]
                await _until(lambda: rig.conversations.feeds.statistics().subscriptions == 0)
                await _until(lambda: rig.conversations.feeds.statistics().feeds == 0 and rig.ctx.bus.watched == 0)
                # Freed by reference counting, not left for the cyclic collector: its cancelled task's error holds the
                # feed's frame, so the feed lets go of the task as it stops.
                await _until(lambda: watch.alive() == [])


async def test_a_write_that_wakes_no_one_here_is_still_picked_up_by_the_feeds_poll(
    rig: Rig, reader_of: Callable[..., ConversationReader]
) -> None:
    reader = reader_of(poll_interval=0.05)
    conversation = await rig.chat.create_conversation(ALICE)
    asked = await rig.chat.ask(
        ALICE, conversation.id, target_kind="operator", target_key="echo", content=text_content("x")
    )
    chunks: list[bytes] = []
    reading = asyncio.ensure_future(
        _collect(
            conversation_frames(reader, conversation.id, after=0, heartbeat=30.0, until_message_id=asked.response.id),
            chunks,
        )
    )
    async with asyncio.timeout(10):
        await _until(lambda: len(chunks) >= 1)
        async with rig.db.transaction() as tx:  # as another replica would: this process's bus hears nothing
            await emit(tx, asked.response.id, text_events("a", "from elsewhere"))
        await _until(lambda: any(b"from elsewhere" in chunk for chunk in chunks))
        await rig.task_api.complete(asked.task_id)
        await reading
    assert _parsed(chunks) == await _log(rig, conversation.id)


async def test_an_idle_feed_polls_less_and_less_yet_finds_a_write_nobody_announced(rig: Rig) -> None:
    # The reader follows a bus of its own on virtual time, so the rig's writes reach it only through its polls.
    # Idle, each poll that finds nothing doubles the next wait (1, 2, 4, then 8 s): forty idle seconds cost a
    # handful of reads, not forty. A write nobody announces is still found within the longest wait, and a find
    # brings the poll back to its interval.
    clock = rig.clock
    reader = ConversationReader(rig.db, ConversationBus(clock=clock), poll_interval=1.0)
    try:
        conversation = await rig.chat.create_conversation(ALICE)
        asked = await rig.chat.ask(
            ALICE, conversation.id, target_kind="operator", target_key="echo", content=text_content("x")
        )
        chunks: list[bytes] = []
        frames = conversation_frames(
            reader, conversation.id, after=0, heartbeat=1e6, until_message_id=asked.response.id
        )
        reading = asyncio.ensure_future(_collect(frames, chunks))

        def reads() -> int:
            return reader.feeds.statistics().reads

        async def idle(seconds: int) -> None:
            for _ in range(seconds):
                await clock.advance(1.0)
                await asyncio.sleep(0.01)  # the poll's read (real I/O) ends and the next wait is armed

        async def found(text: bytes, within: int) -> int:
            for second in range(1, within + 1):
                await clock.advance(1.0)
                with contextlib.suppress(AssertionError):  # not yet: the next second
                    await eventually(lambda: any(text in chunk for chunk in chunks), timeout=0.2)
                    return second
            raise AssertionError(f"{text!r} was not found within {within} s")

        async with asyncio.timeout(30):
            await _until(lambda: reader.feeds.statistics().feeds == 1 and len(chunks) >= 1)
            before = reads()
            await idle(40)
            assert reads() - before <= 8  # polls at 1, 3, 7, 15, 23, 31 and 39 s (was: one a second)
            async with rig.db.transaction() as tx:  # as another replica would: no notice reaches this reader
                await emit(tx, asked.response.id, text_events("a", "unannounced"))
            assert await found(b"unannounced", within=POLL_BACKOFF) <= POLL_BACKOFF
            async with rig.db.transaction() as tx:
                await emit(tx, asked.response.id, _append(" again"))
            assert await found(b" again", within=2) == 1  # the find brought the poll back to one second
            await rig.task_api.complete(asked.task_id)
            await idle(POLL_BACKOFF)
            await reading
        assert _parsed(chunks) == await _log(rig, conversation.id)
    finally:
        await reader.feeds.aclose()


async def test_shutting_down_ends_idle_streams_at_once(rig: Rig, reader_of: Callable[..., ConversationReader]) -> None:
    reader = reader_of(poll_interval=30.0)
    conversation = await rig.chat.create_conversation(ALICE)
    await rig.chat.ask(ALICE, conversation.id, target_kind="operator", target_key="echo", content=text_content("x"))
    chunks: list[bytes] = []
    readers = [
        asyncio.ensure_future(_collect(conversation_frames(reader, conversation.id, after=0, heartbeat=30.0), chunks))
        for _ in range(3)
    ]
    async with asyncio.timeout(10):
        await _until(lambda: len(chunks) == 3)  # each caught up; now all wait (no poll or heartbeat for 30 s)
        reader.begin_shutdown()
        await asyncio.gather(*readers)
    assert reader.feeds.statistics().feeds == 0 and reader.feeds.statistics().subscriptions == 0


async def test_a_stream_follows_the_feed_only_once_its_own_reads_cover_where_the_feed_started(
    rig: Rig, reader_of: Callable[..., ConversationReader]
) -> None:
    reader = reader_of(poll_interval=5.0)
    conversation = await rig.chat.create_conversation(ALICE)
    asked = await rig.chat.ask(
        ALICE, conversation.id, target_kind="operator", target_key="echo", content=text_content("x")
    )
    with reader.feeds.subscribe(conversation.id) as early, reader.feeds.subscribe(conversation.id) as late:
        early.attach()
        early_page = await reader.read_stream_page(conversation.id, after=0)
        early_cursor = early_page.items[-1].event.cursor
        await rig.task_api.emit(asked.task_id, text_events("a"))  # commits between the two streams' reads
        late.attach()
        late_page = await reader.read_stream_page(conversation.id, after=0)
        assert late_page.end == early_page.end + 1
        assert late.covers(late_page.items[-1].event.cursor, late_page.end)  # the first to ask starts the feed
        # The feed hands out only what comes after the late stream's read: the early one must read on first.
        assert not early.covers(early_cursor, early_page.end)
        again = await reader.read_stream_page(conversation.id, after=early_cursor)
        assert [item.event.cursor for item in again.items] == [late_page.end]
        assert early.covers(again.items[-1].event.cursor, again.end)
        assert reader.feeds.statistics().feeds == 1
    assert reader.feeds.statistics().feeds == 0


async def test_a_stream_that_falls_behind_while_catching_up_over_many_pages_reads_on_to_the_end(
    rig: Rig, reader_of: Callable[..., ConversationReader]
) -> None:
    reader = reader_of(poll_interval=5.0, stream_buffer=4)
    conversation = await rig.chat.create_conversation(ALICE)
    asked = await rig.chat.ask(
        ALICE, conversation.id, target_kind="operator", target_key="echo", content=text_content("x")
    )
    await rig.task_api.emit(asked.task_id, text_events("a", *(str(n) for n in range(700))))  # more than a page

    def frames() -> AsyncGenerator[bytes, None]:
        return conversation_frames(reader, conversation.id, after=0, heartbeat=30.0, until_message_id=asked.response.id)

    live_chunks: list[bytes] = []
    live = asyncio.ensure_future(_collect(frames(), live_chunks))
    late = frames()
    async with asyncio.timeout(20):
        await _until(lambda: reader.feeds.statistics().feeds == 1 and len(live_chunks) >= 2)  # caught up: feed live
        late_chunks = [await anext(late)]  # its first page; it pauses there while more events arrive
        for index in range(6):
            await rig.task_api.emit(asked.task_id, _append(f"late {index}"))
        await _until(lambda: reader.feeds.statistics().detached >= 1)
        await rig.task_api.complete(asked.task_id)
        late_chunks += [chunk async for chunk in late]
        await live
    log = await _log(rig, conversation.id)
    assert len(log) > 500  # the late stream needed two pages
    assert _parsed(late_chunks) == log
    assert _parsed(live_chunks) == log
