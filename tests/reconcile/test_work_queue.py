"""The work queue: coalescing, never-concurrent keys, delays and per-key backoff, on a virtual clock."""

from __future__ import annotations

import asyncio

import pytest

from loopd.resources.reconcile import Backoff, QueueShutDown, VirtualClock, WorkQueue


async def test_repeated_adds_of_a_waiting_key_coalesce(clock: VirtualClock) -> None:
    queue: WorkQueue[str] = WorkQueue(clock=clock)
    for _ in range(5):
        queue.add("a")
    queue.add("b")
    assert await queue.get() == "a"
    assert await queue.get() == "b"
    stats = queue.statistics()
    assert (stats.depth, stats.processing, stats.coalesced) == (0, 2, 4)


async def test_a_key_added_while_processing_is_handed_out_again_only_after_done(clock: VirtualClock) -> None:
    queue: WorkQueue[str] = WorkQueue(clock=clock)
    queue.add("a")
    key = await queue.get()
    queue.add("a")
    queue.add("a")
    getter = asyncio.ensure_future(queue.get())
    await asyncio.sleep(0)
    assert not getter.done(), "the key is processing: a second worker must not get it"
    queue.done(key)
    assert await asyncio.wait_for(getter, 1) == "a"
    queue.done("a")
    assert queue.statistics().depth == 0


async def test_done_without_a_re_add_does_not_queue_again(clock: VirtualClock) -> None:
    queue: WorkQueue[str] = WorkQueue(clock=clock)
    queue.add("a")
    queue.done(await queue.get())
    assert queue.statistics().depth == 0


async def test_add_after_releases_the_key_exactly_at_its_deadline(clock: VirtualClock) -> None:
    queue: WorkQueue[str] = WorkQueue(clock=clock)
    queue.add_after("a", 5.0)
    getter = asyncio.ensure_future(queue.get())
    await clock.advance(4.999)
    assert not getter.done()
    await clock.advance(0.001)
    assert getter.done() and getter.result() == "a"
    assert clock.monotonic() == 5.0
    await queue.aclose()


async def test_the_earliest_deadline_per_key_wins(clock: VirtualClock) -> None:
    queue: WorkQueue[str] = WorkQueue(clock=clock)
    queue.add_after("a", 10.0)
    queue.add_after("a", 3.0)
    queue.add_after("a", 7.0)
    assert queue.statistics().delayed == 1
    await clock.advance(3.0)
    assert await asyncio.wait_for(queue.get(), 1) == "a"
    queue.done("a")
    await clock.advance(10.0)
    assert queue.statistics().depth == 0, "superseded deadlines do not fire"
    await queue.aclose()


async def test_rate_limited_adds_back_off_exponentially_per_key_until_forgotten(clock: VirtualClock) -> None:
    queue: WorkQueue[str] = WorkQueue(clock=clock, backoff=Backoff(base=1.0, factor=2.0, max_delay=5.0, jitter=0))
    delays = []
    for _ in range(5):
        delays.append(queue.add_rate_limited("a"))
        await clock.run_until(lambda: queue.statistics().depth == 1)
        queue.done(await queue.get())
    assert delays == [1.0, 2.0, 4.0, 5.0, 5.0]
    assert clock.monotonic() == 17.0
    assert queue.add_rate_limited("b") == 1.0, "backoff is per key"
    queue.forget("a")
    assert queue.failures("a") == 0
    assert queue.add_rate_limited("a") == 1.0
    await queue.aclose()


async def test_an_immediate_add_does_not_wait_for_a_pending_delay(clock: VirtualClock) -> None:
    queue: WorkQueue[str] = WorkQueue(clock=clock)
    queue.add_after("a", 60.0)
    queue.add("a")
    assert await asyncio.wait_for(queue.get(), 1) == "a"
    await queue.aclose()


async def test_shut_down_wakes_waiting_getters_and_refuses_more(clock: VirtualClock) -> None:
    queue: WorkQueue[str] = WorkQueue(clock=clock)
    getter = asyncio.ensure_future(queue.get())
    await asyncio.sleep(0)
    queue.shut_down()
    with pytest.raises(QueueShutDown):
        await getter
    queue.add("a")
    with pytest.raises(QueueShutDown):
        await queue.get()


async def test_a_cancelled_getter_passes_its_wake_up_on(clock: VirtualClock) -> None:
    queue: WorkQueue[str] = WorkQueue(clock=clock)
    first = asyncio.ensure_future(queue.get())
    second = asyncio.ensure_future(queue.get())
    await asyncio.sleep(0)
    queue.add("a")  # wakes `first`...
    first.cancel()  # ...which is cancelled before it runs
    assert await asyncio.wait_for(second, 1) == "a"
    assert first.cancelled()
