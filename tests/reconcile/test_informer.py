"""The informer: list + watch + cache; resume from a resourceVersion; relist on 410; bookmarks."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from loopd.resources.client import TASKS, InMemoryClient
from loopd.resources.reconcile import Backoff, Informer, InformerEvent, VirtualClock

from .helpers import FaultyClient, stop_task, task


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def __call__(self, event: InformerEvent) -> None:
        self.events.append((event.type, event.object["metadata"]["name"]))


@pytest.fixture
async def running(memory: InMemoryClient, clock: VirtualClock) -> AsyncIterator[tuple[Informer, Recorder]]:
    informer = Informer(memory, TASKS, namespace="default", clock=clock)
    recorder = Recorder()
    informer.add_handler(recorder)
    runner = asyncio.ensure_future(informer.run())
    await clock.run_until(lambda: informer.has_synced)
    yield informer, recorder
    await stop_task(runner)


async def test_initial_list_fills_the_cache_and_announces_every_object(
    memory: InMemoryClient, clock: VirtualClock
) -> None:
    await memory.create(TASKS, task("a"))
    await memory.create(TASKS, task("b"))
    await memory.create(TASKS, task("other", namespace="elsewhere"))
    informer = Informer(memory, TASKS, namespace="default", clock=clock)
    recorder = Recorder()
    informer.add_handler(recorder)
    runner = asyncio.ensure_future(informer.run())
    try:
        await clock.run_until(lambda: informer.has_synced)
        assert recorder.events == [("ADDED", "a"), ("ADDED", "b")]
        assert informer.cache_keys() == [("default", "a"), ("default", "b")]
        assert informer.resource_version == memory.resource_version
    finally:
        await stop_task(runner)


async def test_watch_keeps_the_cache_current(
    running: tuple[Informer, Recorder], memory: InMemoryClient, clock: VirtualClock
) -> None:
    informer, recorder = running
    created = await memory.create(TASKS, task("a"))
    created["spec"]["revision"] = 2
    await memory.update(TASKS, created)
    await memory.delete(TASKS, "a", namespace="default")
    await clock.run_until(lambda: len(recorder.events) == 3)
    assert recorder.events == [("ADDED", "a"), ("MODIFIED", "a"), ("DELETED", "a")]
    assert informer.get("a", "default") is None
    assert informer.resource_version == memory.resource_version


async def test_an_ended_watch_resumes_from_the_last_resource_version_without_relisting(
    running: tuple[Informer, Recorder], memory: InMemoryClient, clock: VirtualClock
) -> None:
    informer, recorder = running
    await memory.create(TASKS, task("a"))
    await clock.run_until(lambda: len(recorder.events) == 1)
    memory.end_watches()
    await memory.create(TASKS, task("b"))  # happens while no watch is open
    await clock.run_until(lambda: len(recorder.events) == 2)
    assert recorder.events == [("ADDED", "a"), ("ADDED", "b")]
    stats = informer.statistics()
    assert (stats.lists, stats.watches, stats.expired) == (1, 2, 0)


async def test_gone_relists_and_reports_what_changed_meanwhile(
    running: tuple[Informer, Recorder], memory: InMemoryClient, clock: VirtualClock
) -> None:
    informer, recorder = running
    await memory.create(TASKS, task("kept"))
    await memory.create(TASKS, task("removed"))
    await clock.run_until(lambda: len(recorder.events) == 2)
    memory.end_watches()
    await memory.delete(TASKS, "removed", namespace="default")
    await memory.create(TASKS, task("new"))
    memory.compact()  # the history the informer would resume from is gone → 410
    await clock.run_until(lambda: informer.statistics().lists == 2)
    assert recorder.events[2:] == [("ADDED", "new"), ("DELETED", "removed")]
    assert informer.cache_keys() == [("default", "kept"), ("default", "new")]
    stats = informer.statistics()
    assert stats.expired == 1
    assert informer.resource_version == memory.resource_version
    await memory.create(TASKS, task("after"))
    await clock.run_until(lambda: ("ADDED", "after") in recorder.events)


async def test_a_bookmark_moves_the_resume_point_past_unrelated_changes(
    memory: InMemoryClient, clock: VirtualClock
) -> None:
    informer = Informer(memory, TASKS, namespace="default", label_selector="team=a", clock=clock)
    recorder = Recorder()
    informer.add_handler(recorder)
    runner = asyncio.ensure_future(informer.run())
    try:
        await clock.run_until(lambda: informer.has_synced)
        start = informer.resource_version
        for index in range(5):
            await memory.create(TASKS, task(f"b{index}", labels={"team": "b"}))
        memory.send_bookmarks()
        await clock.run_until(lambda: informer.statistics().bookmarks == 1)
        assert int(informer.resource_version) == int(start) + 5
        memory.end_watches()
        memory.compact()  # without the bookmark, resuming from `start` would now be Gone
        await memory.create(TASKS, task("a1", labels={"team": "a"}))
        await clock.run_until(lambda: ("ADDED", "a1") in recorder.events)
        stats = informer.statistics()
        assert (stats.lists, stats.expired) == (1, 0)
        assert recorder.events == [("ADDED", "a1")]
    finally:
        await stop_task(runner)


async def test_an_object_leaving_the_selector_is_deleted_from_the_cache(
    memory: InMemoryClient, clock: VirtualClock
) -> None:
    informer = Informer(memory, TASKS, label_selector="team=a", clock=clock)
    recorder = Recorder()
    informer.add_handler(recorder)
    runner = asyncio.ensure_future(informer.run())
    try:
        await clock.run_until(lambda: informer.has_synced)
        await memory.create(TASKS, task("x", labels={"team": "a"}))
        await memory.patch(TASKS, "x", {"metadata": {"labels": {"team": "b"}}}, namespace="default")
        await clock.run_until(lambda: len(recorder.events) == 2)
        assert recorder.events == [("ADDED", "x"), ("DELETED", "x")]
        assert informer.cache_keys() == []
    finally:
        await stop_task(runner)


async def test_errors_back_off_exponentially_then_recover(memory: InMemoryClient, clock: VirtualClock) -> None:
    faulty = FaultyClient(memory)
    faulty.failing = True
    informer = Informer(faulty, TASKS, clock=clock, retry_backoff=Backoff(base=0.5, max_delay=30.0, jitter=0))
    runner = asyncio.ensure_future(informer.run())
    try:
        await clock.advance(0)
        assert informer.statistics().errors == 1
        await clock.advance(0.5)  # first retry after 0.5 s
        assert informer.statistics().errors == 2
        await clock.advance(0.999)  # second retry after 1 s more
        assert informer.statistics().errors == 2
        await clock.advance(0.001)
        assert informer.statistics().errors == 3
        faulty.failing = False
        await clock.run_until(lambda: informer.has_synced)
        assert clock.monotonic() == 3.5
    finally:
        await stop_task(runner)
