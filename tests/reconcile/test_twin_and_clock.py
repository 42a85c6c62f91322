"""The test seams themselves: the in-memory twin's controls (the virtual clock's tests are in tests/infra)."""

from __future__ import annotations

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
    twin = InMemoryClient(clock=clock)
    await clock.advance(90)
    created = await twin.create(TASKS, task("t"))
    assert created["metadata"]["creationTimestamp"] == "2030-01-01T00:01:30Z"
