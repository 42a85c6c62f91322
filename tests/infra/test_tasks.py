"""TaskSet: owned background tasks are forgotten when they end, reported when they fail, cancelled on aclose."""

from __future__ import annotations

import asyncio
import logging

import pytest

from loopd._infra.tasks import TaskSet, TaskSetClosed


async def test_a_finished_task_is_forgotten() -> None:
    tasks = TaskSet("test")
    task = tasks.start(asyncio.sleep(0, result="done"), name="quick")
    assert len(tasks) == 1
    assert await task == "done"
    await asyncio.sleep(0)
    assert len(tasks) == 0
    await tasks.aclose()


async def test_aclose_cancels_and_awaits_every_task() -> None:
    tasks = TaskSet("test")
    cleaned: list[str] = []

    async def forever(name: str) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            cleaned.append(name)

    started = [tasks.start(forever(name)) for name in ("a", "b")]
    await asyncio.sleep(0)
    await tasks.aclose()
    assert sorted(cleaned) == ["a", "b"]
    assert all(task.cancelled() for task in started)
    assert tasks.closed and len(tasks) == 0


async def test_a_closed_set_starts_nothing() -> None:
    tasks = TaskSet("test")
    await tasks.aclose()
    with pytest.raises(TaskSetClosed, match="test"):
        tasks.start(asyncio.sleep(0))


async def test_a_failure_is_logged_with_the_owner_and_forgotten(caplog: pytest.LogCaptureFixture) -> None:
    tasks = TaskSet("owner")

    async def boom() -> None:
        raise RuntimeError("boom")

    with caplog.at_level(logging.ERROR, logger="loopd._infra.tasks"):
        task = tasks.start(boom(), name="failing")
        await asyncio.wait([task])
        await asyncio.sleep(0)
    assert len(tasks) == 0
    assert "owner: task failing failed" in caplog.text
    await tasks.aclose()


async def test_as_a_block_it_cancels_what_is_still_running_at_the_end() -> None:
    ended: list[str] = []

    async def service() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            ended.append("service")

    async with TaskSet("block") as tasks:
        running = tasks.start(service())
        await asyncio.sleep(0)
        assert list(tasks) == [running]
    assert ended == ["service"] and running.cancelled()


async def test_a_cancelled_owner_still_waits_for_its_tasks_then_is_cancelled() -> None:
    released = asyncio.Event()
    ended: list[str] = []

    async def stubborn() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await released.wait()  # cleanup that takes a while
            ended.append("stubborn")
            raise

    async def owner() -> None:
        async with TaskSet("owner") as tasks:
            tasks.start(stubborn())
            await asyncio.Event().wait()

    running = asyncio.ensure_future(owner())
    await asyncio.sleep(0.0)
    await asyncio.sleep(0.0)
    running.cancel()
    await asyncio.sleep(0)
    assert not running.done()  # still waiting for the task's cleanup
    released.set()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert ended == ["stubborn"]
