"""The conversation bus's listeners: a reader that reads and waits in turn sleeps through no notice; and what it
knows of a conversation's last cursor without reading (`ConversationBus.head`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime
from typing import cast

from loopd._infra.clock import VirtualClock
from loopd._infra.notify import Notifier
from loopd.server.storage import MessageEvent
from loopd.server.streams import ConversationBus
from loopd.server.streams._bus import BUS_CHANNEL, HEADS_LIMIT

LONG = 3600.0  # a poll that never comes: the virtual clock does not move unless told


async def _pending(task: asyncio.Task[bool]) -> bool:
    for _ in range(5):
        await asyncio.sleep(0)
    return not task.done()


async def test_a_notice_that_comes_while_the_reader_reads_wakes_its_next_wait() -> None:
    bus = ConversationBus(clock=VirtualClock())
    with bus.listen("c") as notices:
        bus.notify("c")  # lands between listening and waiting: while the reader reads the log
        assert await asyncio.wait_for(notices.wait(LONG), 1.0) is True
        waiting = asyncio.create_task(notices.wait(LONG))
        assert await _pending(waiting)  # that notice woke one wait, not every later one
        bus.notify("other")
        assert await _pending(waiting)
        bus.notify("c")
        assert await asyncio.wait_for(waiting, 1.0) is True
        assert bus.watched == 1
    assert bus.watched == 0


async def test_a_listeners_wait_ends_at_its_timeout_or_at_stop() -> None:
    clock = VirtualClock()
    bus = ConversationBus(clock=clock)
    stop = asyncio.Event()
    with bus.listen("c") as notices:
        waiting = asyncio.create_task(notices.wait(10.0))
        assert await _pending(waiting)
        await clock.advance(10.0)
        assert await asyncio.wait_for(waiting, 1.0) is False
        stopped = asyncio.create_task(notices.wait(LONG, stop=stop))
        assert await _pending(stopped)
        stop.set()
        assert await asyncio.wait_for(stopped, 1.0) is False
        bus.notify("c")
        assert await asyncio.wait_for(notices.wait(LONG, stop=stop), 1.0) is True  # a notice already in wins


async def test_a_plain_wait_is_for_the_next_notice_only() -> None:
    bus = ConversationBus(clock=VirtualClock())
    bus.notify("c")  # before anyone waits: nobody to wake
    waiting = asyncio.create_task(bus.wait("c", LONG))
    assert await _pending(waiting)
    bus.notify("c")
    assert await asyncio.wait_for(waiting, 1.0) is True
    assert bus.watched == 0


def _events(conversation_id: str, *cursors: int) -> list[MessageEvent]:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    return [MessageEvent("m", cursor, conversation_id, cursor, {"op": "end"}, at) for cursor in cursors]


class _Relay:
    """A notifier whose subscribers a test can hand any notice, as a reconnecting listener would (``None``)."""

    def __init__(self) -> None:
        self.handlers: list[Callable[[str | None], None]] = []

    def publish(self, channel: str, payload: str) -> None:
        for handler in tuple(self.handlers):
            handler(payload)

    def subscribe(self, channel: str, handler: Callable[[str | None], None]) -> Callable[[], None]:
        self.handlers.append(handler)
        return lambda: self.handlers.remove(handler)


def test_the_head_is_what_this_processs_hand_overs_told_and_forgotten_at_any_other_notice() -> None:
    relay = _Relay()
    bus = ConversationBus(clock=VirtualClock(), notifier=cast(Notifier, relay))
    assert bus.head("c") is None  # nothing told yet: not known here
    bus.committed("c", _events("c", 1, 2, 3))
    assert bus.head("c") == 3
    bus.committed("c", _events("c", 2))  # an earlier commit's hand-over running after a later one's
    assert bus.head("c") == 3
    bus.committed("c", _events("c", 4))
    assert (bus.head("c"), bus.head("d")) == (4, None)
    bus.notify("c")  # a commit whose events were not handed here (another replica's, or a writer that only notifies)
    assert bus.head("c") is None
    bus.committed("c", _events("c", 7))
    bus.committed("d", _events("d", 1))
    relay.publish(BUS_CHANNEL, cast(str, None))  # notices may have been lost: nothing is known any more
    assert (bus.head("c"), bus.head("d")) == (None, None)


def test_the_heads_remembered_are_bounded_oldest_first() -> None:
    bus = ConversationBus(clock=VirtualClock())
    for index in range(HEADS_LIMIT + 1):
        bus.committed(f"c{index}", _events(f"c{index}", 1))
    assert bus.head("c0") is None
    assert bus.head("c1") == 1
    assert bus.head(f"c{HEADS_LIMIT}") == 1
