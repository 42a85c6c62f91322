"""Live fan-out of a conversation's durable event log: one reader per conversation, any number of SSE streams.

`ConversationFeeds` keeps one feed per conversation that has open streams. The feed is the only reader that
follows the log live: it follows the conversation on the `ConversationBus` (waiting at most ``poll_interval``, so a
write made on another replica is picked up even if its notice was lost; a poll that finds nothing doubles the next
wait, up to `POLL_BACKOFF` times ``poll_interval``, and any notice or find resets it), encodes each SSE frame once
and hands the same bytes to the bounded buffer of every attached stream. What this process's writers stored is
handed to it after their commit (`ConversationBus.committed`: an operator's emit), so it goes out without being
read back; the feed reads a page of the log instead after any other notice, when a hand-over does not continue its
cursor (a write it was not told of), and at its poll. It starts with the conversation's first stream and stops
when the last one leaves, so an idle conversation costs one bounded wait, not one per connection.

The log stays the truth; a stream (`Subscription`) never depends on the feed for completeness:

* joining: the stream attaches first, then catches up from its own cursor by reading the log, and follows its
  buffer only once what it has read covers the feed's cursor (`Subscription.covers`). Frames already read from
  the log are skipped by cursor, so nothing is missing and nothing repeats.
* falling behind: when a stream's buffer is full, the feed detaches it. The stream sends what is buffered, catches
  up from the log from its own cursor, and joins again.
* the feed failing (the database went away, or a bug): every stream is detached and reads the log itself, so
  each reports the failure on its own stream (or carries on once the database is back).

Writing: the feed joins each batch of frames into one chunk and frames it for the connection, once
(`DirectChannel.frame`). A stream with a `DirectChannel` (a live stream whose response is open on this server)
that is parked — caught up, its buffer empty, nothing of its own in flight — gets that chunk written straight to
its connection by the feed (`DirectChannel.write_framed`): no wake-up of its task, no ASGI ``send`` per stream.
The stream's cursor (`Subscription.cursor`) moves with it. When the channel says no (the client reads slowly and
the connection's write buffer is over its high-water mark, or there is no direct path), the frames go to the buffer
as above and the stream sends them itself, awaiting the connection; a stream whose buffer then overflows is
detached, so one slow client never holds up the feed or the emit.

Cursors are per conversation and commit in increasing order (see ``storage._message_events``), which is what the
join rule relies on. Must not do: change anything, or hold more per stream than its bounded buffer.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol, Self

from loopd._infra.clock import Clock, sleep_until, wait_event
from loopd._infra.http import DirectChannel
from loopd._infra.tasks import TaskSet, TaskSetClosed
from loopd.server.chat._records import StreamItem
from loopd.server.chat._wire import message_header
from loopd.server.http import sse_frame
from loopd.server.storage import MessageEvent, StorageError
from loopd.server.streams import ConversationBus, Headers

_log = logging.getLogger(__name__)

PAGE: Final = 500
DEFAULT_BUFFER: Final = 256
"""Frames a stream may have waiting before the feed detaches it (it then reads the log by itself)."""
POLL_BACKOFF: Final = 8
"""The longest wait of an idle feed, in ``poll_interval``s: its polls only catch a notice that was lost (a reconnecting
listener wakes every reader anyway), and a thousand open conversations waiting for their answers polled a thousand
times a second."""
HAND_OUT_SLICE: Final = 64
"""Streams woken per turn of the event loop: a large fan-out is spread over several turns, so database calls
and requests (the next emit's own transaction) are served in between instead of waiting for every stream."""


class FeedSource(Protocol):
    """What a feed reads from (``ConversationReader`` is one)."""

    poll_interval: float

    @property
    def bus(self) -> ConversationBus: ...

    @property
    def closing(self) -> bool: ...

    async def read_stream(self, conversation_id: str, *, after: int, limit: int = ...) -> list[StreamItem]: ...


@dataclass(frozen=True, slots=True)
class Frame:
    """One encoded SSE message of the conversation stream."""

    cursor: int
    data: bytes
    ends: str | None
    """The id of the message whose ``end`` event this is, else None."""


@dataclass(frozen=True, slots=True)
class FeedStatistics:
    feeds: int
    """Conversations with a live feed."""
    subscriptions: int
    """Open streams (attached to a feed or catching up from the log)."""
    reads: int
    """Pages the feeds read from the log."""
    frames: int
    """Frames the feeds encoded (each once, whatever the number of streams)."""
    detached: int
    """Times a stream fell behind (its buffer was full) and went back to the log."""
    written: int = 0
    """Chunks the feeds wrote straight to a parked stream's connection (`DirectChannel`)."""
    refused: int = 0
    """Direct writes the channel refused (e.g. the client reads slowly): those frames went to the buffer."""
    handed: int = 0
    """Batches the feeds handed out as this process's writers stored them (`ConversationBus.committed`), without
    reading them back from the log."""
    skipped_reads: int = 0
    """Feeds that started without a first read: the bus knew nothing committed after their start
    (`ConversationBus.head`)."""


def item_data(item: StreamItem) -> dict[str, Any]:
    """The ``data:`` of one stream event: ``{"message_id", "seq", "event"}``, plus ``message`` on start/end."""
    data: dict[str, Any] = {"message_id": item.event.message_id, "seq": item.event.seq, "event": item.event.event}
    if item.message is not None:
        data["message"] = message_header(item.message)
    return data


def frame_of(item: StreamItem) -> Frame:
    cursor = item.event.cursor
    ends = item.event.message_id if item.event.event.get("op") == "end" else None
    return Frame(cursor, sse_frame(item_data(item), id=cursor), ends)


class Subscription:
    """One stream's membership: its bounded buffer and whether the feed fills it (see the module docstring).

    Use it as a context manager; leaving it detaches the stream and stops the feed if it was the last one.
    """

    __slots__ = (
        "_direct",
        "_feed",
        "_feeds",
        "_frames",
        "_joined",
        "_open",
        "_parked",
        "_tally",
        "_timer",
        "_timer_at",
        "_waiter",
        "conversation_id",
        "cursor",
        "written_at",
    )

    def __init__(
        self,
        feeds: ConversationFeeds,
        conversation_id: str,
        tally: _Tally,
        *,
        after: int = 0,
        direct: DirectChannel | None = None,
    ) -> None:
        self._feeds = feeds
        self._tally = tally
        self.conversation_id = conversation_id
        self.cursor = after
        """Everything through this cursor was sent (by the stream, or written directly by the feed)."""
        self.written_at: float | None = None
        """When the feed last wrote to the stream's connection directly (the feeds' clock), else None."""
        self._direct = direct
        self._parked = False  # waiting in `wait` with nothing in flight: the feed may write for it
        self._feed: _Feed | None = None
        self._frames: deque[Frame] = deque()
        self._waiter: asyncio.Future[None] | None = None
        # One timer per stream, moved lazily: it may fire before the current deadline (the stream then waits
        # again), which is cheaper than re-arming a timer for every frame. It sleeps on the feeds' clock.
        self._timer: asyncio.Task[None] | None = None
        self._timer_at = 0.0
        self._open = True
        self._joined: int | None = None  # the feed's cursor when this stream attached (None: before it began)

    def is_attached(self) -> bool:
        """Whether the feed fills this stream's buffer now."""
        return self._feed is not None and self in self._feed.attached

    def attach(self) -> None:
        """Have the feed fill the (emptied) buffer from now on; the caller then catches up from the log and asks
        `covers`. A no-op when attached or closed, or once the feeds are closed."""
        if not self._open or self.is_attached():
            return
        feed = self._feeds.live_feed(self.conversation_id)
        if feed is None:
            return  # the feeds are closed
        if self._feed is not feed:
            if self._feed is not None:
                self._feed.leave(self)
            self._feed = feed
            feed.members.add(self)
        # What the buffer still holds is read from the log again (a catch-up always follows an attach).
        self._frames.clear()
        self._joined = feed.cursor
        feed.attached.add(self)

    def covers(self, cursor: int, end: int) -> bool:
        """Whether the stream may follow its buffer now: it sent everything through ``cursor``, after reading a
        short page of the log in a transaction that saw the conversation's last cursor at ``end``."""
        feed = self._feed
        if feed is None or self not in feed.attached:
            return False
        if feed.started is None:
            feed.begin(end)  # the first stream to catch up sets where the feed starts: a committed cursor
            return True
        # The buffer holds every event after the feed's cursor at our attach (or its start, if that came later).
        joined = self._joined if self._joined is not None else feed.started
        return max(cursor, end) >= joined

    def take(self) -> list[Frame]:
        """Every buffered frame, oldest first (the buffer is empty afterwards)."""
        if not self._frames:
            return []
        frames = list(self._frames)
        self._frames.clear()
        return frames

    async def wait(self, deadline: float) -> None:
        """Until a frame is buffered, the stream is detached, or (at the latest) the feeds' clock reaches
        ``deadline`` (its ``monotonic()``); it may return earlier with nothing new, so check the clock after it."""
        if self._frames or not self.is_attached():
            return
        clock = self._feeds.clock
        if deadline <= clock.monotonic():
            return
        if self._timer is None or self._timer.done() or self._timer_at > deadline:
            if self._timer is not None:
                self._timer.cancel()
            try:
                self._timer = self._feeds.tasks.start(self._ring_at(deadline), name="loopd-stream-timer")
            except TaskSetClosed:
                return  # shutting down: the stream sees the feeds closed
            self._timer_at = deadline
        waiter = self._waiter = asyncio.get_running_loop().create_future()
        self._parked = True
        try:
            await waiter
        finally:
            self._parked = False
            self._waiter = None

    def close(self) -> None:
        """Leave the conversation's feed (it stops if this was its last stream); idempotent."""
        if not self._open:
            return
        self._open = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._tally.subscriptions -= 1
        feed, self._feed = self._feed, None
        self._frames.clear()
        if feed is not None:
            feed.leave(self)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- called by the feed --------------------------------------------------------------------------------------

    def offer(self, frames: list[Frame], limit: int, framed: bytes = b"", now: float = 0.0) -> bool:
        """Hand ``frames`` to the stream (the feed calls this): written straight to its connection when it is parked
        and its channel takes them (``framed``: all their data joined and framed by `DirectChannel.frame`, made once
        for every stream), else buffered and the stream woken. False, buffering nothing, when the buffer would hold
        more than ``limit``: the feed then detaches the stream."""
        direct = self._direct
        if direct is not None and self._parked and not self._frames:
            cursor = self.cursor
            if cursor < frames[0].cursor and framed:
                written = direct.write_framed(framed)
            elif cursor >= frames[-1].cursor:
                return True  # already sent (read from the log)
            else:
                written = direct.write(b"".join(f.data for f in frames if f.cursor > cursor))
            if written:
                self.cursor = frames[-1].cursor
                self.written_at = now
                self._tally.written += 1
                return True
            if direct.is_open:
                self._tally.refused += 1
        if len(self._frames) + len(frames) > limit:
            return False
        self._frames.extend(frames)
        self._wake()
        return True

    def dropped(self, *, ended: bool) -> None:
        """The feed stopped filling this buffer (the feed calls this): the stream fell behind, or (``ended``) the
        feed is gone. Either way the stream reads the log by itself next."""
        if ended:
            self._feed = None
        self._wake()

    async def _ring_at(self, deadline: float) -> None:
        await sleep_until(self._feeds.clock, deadline)
        self._timer = None
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class _Feed:
    """The single live reader of one conversation (see the module docstring)."""

    def __init__(self, feeds: ConversationFeeds, conversation_id: str, tally: _Tally) -> None:
        self._feeds = feeds
        self._tally = tally
        self.conversation_id = conversation_id
        self.cursor: int | None = None
        """Every event through this cursor was read (and handed out); None until the first stream caught up."""
        self.started: int | None = None
        """The cursor the feed started from."""
        self.members: set[Subscription] = set()
        self.attached: set[Subscription] = set()
        self._task: asyncio.Task[None] | None = None
        # What the bus told us since we last looked: frames this process's writers stored (in commit order), or
        # that the log must be read (any other notice, a hand-over that does not chain, too many waiting).
        self._handed: list[Frame] = []
        self._stale = True  # the first turn reads: commits before we followed the bus were not handed to us
        self._woken = asyncio.Event()

    def begin(self, cursor: int) -> None:
        self.cursor = self.started = cursor
        self._task = self._feeds.tasks.start(self._run(), name=f"feed:{self.conversation_id}")

    def leave(self, subscription: Subscription) -> None:
        self.members.discard(subscription)
        self.attached.discard(subscription)
        if not self.members:
            self.stop()

    def stop(self) -> None:
        self._feeds.forget(self)
        # Let go of the task: its CancelledError holds this feed's `_run` frame, so keeping it makes a cycle.
        task, self._task = self._task, None
        if task is not None:
            task.cancel()  # it holds nothing but its wait or a read: nothing to clean up after it

    def committed(self, events: Sequence[MessageEvent] | None, headers: Headers) -> None:
        """The bus's follower (`ConversationBus.follow`): ``events`` a writer here stored, with the headers of the
        messages they start or end, or None (read the log)."""
        if events is None or self._stale:
            self._stale = True
        elif len(self._handed) + len(events) > PAGE:
            self._stale = True  # too much waiting: the log has them
            self._handed.clear()
        else:
            items: list[StreamItem] = []
            for event in events:
                if event.event.get("op") not in ("start", "end"):
                    items.append(StreamItem(event, None))
                elif (header := headers.get(event.message_id)) is not None:
                    items.append(StreamItem(event, header))
                else:  # a start or end without its message's header: the log has it
                    self._stale = True
                    self._handed.clear()
                    self._woken.set()
                    return
            self._handed.extend(frame_of(item) for item in items)
        self._woken.set()

    def _take_handed(self) -> list[Frame] | None:
        """The handed frames after the cursor, if they continue it without a gap; None (and the log is to be read)
        when they do not."""
        cursor = self.cursor
        assert cursor is not None
        frames = [frame for frame in self._handed if frame.cursor > cursor]
        self._handed.clear()
        for expected, frame in enumerate(frames, start=cursor + 1):
            if frame.cursor != expected:
                self._stale = True
                return None
        return frames

    async def _run(self) -> None:
        source = self._feeds.source
        bus, clock = source.bus, source.bus.clock
        unfollow = bus.follow(self.conversation_id, self.committed)
        if self.cursor is not None and bus.head(self.conversation_id) == self.cursor:
            # Nothing this process was told of committed after our start: every later commit is handed to us or
            # comes as a notice (read then), so the first read would find nothing.
            self._stale = False
            self._tally.skipped_reads += 1
        wait = source.poll_interval  # doubled by each poll that finds nothing, up to `POLL_BACKOFF` times
        try:
            while not source.closing:
                assert self.cursor is not None
                if self._stale:
                    # What was handed to us so far committed before this read begins: the read returns it.
                    self._stale = False
                    self._handed.clear()
                    items = await source.read_stream(self.conversation_id, after=self.cursor, limit=PAGE)
                    self._tally.reads += 1
                    if items:
                        wait = source.poll_interval
                        self._stale = self._stale or len(items) == PAGE  # a full page: read on
                        await self._hand_out([frame_of(item) for item in items])
                    continue
                frames = self._take_handed()
                if frames is None:
                    continue  # a write we were not told of came between: read the log
                if frames:
                    self._tally.handed += 1
                    await self._hand_out(frames)
                    continue
                self._woken.clear()
                if await wait_event(clock, self._woken, wait):
                    wait = source.poll_interval
                else:
                    self._stale = True  # a bounded wait: a notice may have been lost (another replica's write)
                    wait = min(wait * 2, source.poll_interval * POLL_BACKOFF)
        except StorageError as exc:
            _log.info("feed of conversation %s stopped; its streams read on their own: %s", self.conversation_id, exc)
        except Exception:  # a bug here must not leave streams waiting: they fall back to their own reads
            _log.exception("feed of conversation %s failed; its streams read on their own", self.conversation_id)
        finally:
            unfollow()
            self.retire()

    async def _hand_out(self, frames: list[Frame]) -> None:
        # The cursor moves first: a stream attaching from now on catches up through it from the log; one that
        # re-attaches during the hand-out may still be offered these frames, and skips them by cursor.
        self.cursor = frames[-1].cursor
        self._tally.frames += len(frames)
        limit = self._feeds.buffer
        framed = DirectChannel.frame(b"".join(frame.data for frame in frames))  # once, for every direct write
        clock = self._feeds.clock
        attached = self.attached
        receivers = tuple(attached)
        for start in range(0, len(receivers), HAND_OUT_SLICE):
            if start:
                await asyncio.sleep(0)
            now = clock.monotonic()
            for subscription in receivers[start : start + HAND_OUT_SLICE]:
                if subscription not in attached:
                    continue  # left or fell behind meanwhile
                if not subscription.offer(frames, limit, framed, now):
                    attached.discard(subscription)
                    self._tally.detached += 1
                    subscription.dropped(ended=False)

    def retire(self) -> None:
        """The feed ends while streams may remain: they read the log themselves (and join a new feed)."""
        self._feeds.forget(self)
        members, self.members, self.attached = self.members, set(), set()
        for subscription in members:
            subscription.dropped(ended=True)


@dataclass(slots=True)
class _Tally:
    """What `ConversationFeeds.statistics` counts, kept by the subscriptions and feeds as they go."""

    subscriptions: int = 0
    reads: int = 0
    frames: int = 0
    detached: int = 0
    written: int = 0
    refused: int = 0
    handed: int = 0
    skipped_reads: int = 0


class ConversationFeeds:
    """The feeds of one chat service: at most one per conversation, only while it has streams."""

    def __init__(self, source: FeedSource, *, buffer: int = DEFAULT_BUFFER) -> None:
        if buffer < 1:
            raise ValueError("a stream buffer holds at least one frame")
        self.source = source
        self.buffer = buffer
        self._feeds: dict[str, _Feed] = {}
        self._closed = False
        self._tasks = TaskSet("conversation feeds")  # every feed's task; cancelled ones end here
        self._tally = _Tally()

    @property
    def tasks(self) -> TaskSet:
        """Where the feeds and the streams' timers run (`aclose` waits for them)."""
        return self._tasks

    def subscribe(self, conversation_id: str, *, after: int = 0, direct: DirectChannel | None = None) -> Subscription:
        """A new, detached stream of ``conversation_id`` that sent everything through cursor ``after``: attach it,
        catch up from the log, then follow. With ``direct``, the feed may write to its connection itself."""
        self._tally.subscriptions += 1
        return Subscription(self, conversation_id, self._tally, after=after, direct=direct)

    def close(self) -> None:
        """Stop every feed and wake every stream (shutdown): nothing is followed any more."""
        self._closed = True
        for feed in list(self._feeds.values()):
            feed.stop()
            feed.retire()

    async def aclose(self) -> None:
        """`close`, then wait until every feed's task has ended."""
        self.close()
        await self._tasks.aclose()

    @property
    def clock(self) -> Clock:
        """The clock the streams' heartbeats are measured on: the bus's."""
        return self.source.bus.clock

    def statistics(self) -> FeedStatistics:
        return FeedStatistics(
            feeds=len(self._feeds),
            subscriptions=self._tally.subscriptions,
            reads=self._tally.reads,
            frames=self._tally.frames,
            detached=self._tally.detached,
            written=self._tally.written,
            refused=self._tally.refused,
            handed=self._tally.handed,
            skipped_reads=self._tally.skipped_reads,
        )

    # --- for the subscriptions and feeds -------------------------------------------------------------------------

    def live_feed(self, conversation_id: str) -> _Feed | None:
        """The conversation's feed, made if it has none (a stream is attaching); None once the feeds are closed."""
        if self._closed:
            return None
        feed = self._feeds.get(conversation_id)
        if feed is None:
            feed = self._feeds[conversation_id] = _Feed(self, conversation_id, self._tally)
        return feed

    def forget(self, feed: _Feed) -> None:
        """Drop ``feed`` from the live ones (it stopped); a later stream of its conversation starts a new one."""
        if self._feeds.get(feed.conversation_id) is feed:
            del self._feeds[feed.conversation_id]


__all__ = ["DEFAULT_BUFFER", "PAGE", "ConversationFeeds", "FeedSource", "FeedStatistics", "Frame", "Subscription"]
