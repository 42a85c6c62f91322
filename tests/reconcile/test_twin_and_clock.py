"""The test seams themselves: the in-memory twin's controls and the virtual clock."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from loopd.resources import Gone
from loopd.resources.client import TASKS, InMemoryClient, TransportError
from loopd.resources.reconcile import VirtualClock

from .helpers import task


async def test_a_watch_consumer_that_falls_too_far_behind_gets_gone() -> None:
    twin = InMemoryClient(watch_queue_size=3)
    async with twin.open_watch(TASKS, namespace="default", resource_version=twin.resource_version) as events:
        for index in range(4):
            await twin.create(TASKS, task(f"t{index}"))
        with pytest.raises(Gone):
            async for _ in events:
                pass


async def test_a_closed_twin_refuses_calls_and_ends_watches() -> None:
    twin = InMemoryClient()
    async with twin.open_watch(TASKS) as events:
        await twin.aclose()
        assert [event async for event in events] == []
    with pytest.raises(TransportError):
        await twin.list(TASKS)


async def test_the_twin_stamps_objects_with_the_given_clock() -> None:
    clock = VirtualClock()
    twin = InMemoryClient(now=clock.utcnow)
    await clock.advance(90)
    created = await twin.create(TASKS, task("t"))
    assert created["metadata"]["creationTimestamp"] == "2030-01-01T00:01:30Z"


async def test_the_virtual_clock_wakes_sleepers_in_deadline_order() -> None:
    clock = VirtualClock()
    woke: list[tuple[str, float]] = []

    async def sleeper(name: str, seconds: float) -> None:
        await clock.sleep(seconds)
        woke.append((name, clock.monotonic()))

    tasks = [asyncio.ensure_future(sleeper(name, seconds)) for name, seconds in (("late", 3), ("early", 1), ("mid", 2))]
    await clock.advance(2.5)
    assert woke == [("early", 1.0), ("mid", 2.0)]
    assert clock.monotonic() == 2.5
    spent = await clock.run_until(lambda: len(woke) == 3)
    assert woke[-1] == ("late", 3.0) and spent == 0.5
    await asyncio.gather(*tasks)


async def test_run_until_reports_a_virtual_deadlock() -> None:
    clock = VirtualClock()
    with pytest.raises(TimeoutError, match="nothing is sleeping"):
        await clock.run_until(lambda: False)
    sleeper = asyncio.ensure_future(clock.sleep(7200))
    with pytest.raises(TimeoutError, match="within 60"):
        await clock.run_until(lambda: False, limit=60)
    sleeper.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await sleeper
