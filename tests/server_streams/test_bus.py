"""The conversation bus's listeners: a reader that reads and waits in turn sleeps through no notice."""

from __future__ import annotations

import asyncio

from loopd._infra.clock import VirtualClock
from loopd.server.streams import ConversationBus

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
