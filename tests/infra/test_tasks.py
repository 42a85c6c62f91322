"""TaskSet: owned background tasks are forgotten when they end, reported when they fail, cancelled on aclose."""

from __future__ import annotations

import asyncio
import gc
import logging
import warnings

import pytest

from loopd._infra.tasks import TaskSet, TaskSetClosed, background, cancel_and_wait, companions, finish_shielded, race
from tests.support.cycles import Watch, collector_off


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


async def test_aclose_with_a_timeout_keeps_a_stubborn_task_owned_and_counts_it() -> None:
    tasks = TaskSet("stubborn")
    release = asyncio.Event()

    async def ignores_cancellation() -> None:
        while not release.is_set():
            try:
                await release.wait()
            except asyncio.CancelledError:
                continue  # swallowed on purpose: what a misbehaving library does

    task = tasks.start(ignores_cancellation(), name="stubborn")
    await asyncio.sleep(0)
    assert await tasks.aclose(timeout=0.05, recancel=0.01) == 1
    assert list(tasks) == [task] and not task.done()
    release.set()
    assert await tasks.aclose() == 0
    assert task.done() and len(tasks) == 0


async def test_race_the_first_to_end_cancels_the_other() -> None:
    cleaned: list[str] = []

    async def slow() -> str:
        try:
            await asyncio.Event().wait()
        finally:
            cleaned.append("slow")
        return "never"

    fast, slower = await race(asyncio.sleep(0, result="fast"), slow())
    assert fast.ok and fast.result() == "fast"
    assert slower.cancelled and not slower.ok and cleaned == ["slow"]
    with pytest.raises(asyncio.CancelledError):
        slower.result()


async def test_race_returns_an_error_in_its_outcome_and_cancels_the_other() -> None:
    async def boom() -> None:
        raise ValueError("boom")

    failed, other = await race(boom(), asyncio.Event().wait())
    assert isinstance(failed.error, ValueError) and not failed.ok and other.cancelled
    with pytest.raises(ValueError, match="boom"):
        failed.result()


class _Held:
    """Something a raced coroutine's frame holds while it waits."""


async def test_a_race_leaves_no_reference_cycle_behind() -> None:
    # The loser's CancelledError holds its frames; the race's own frame held both tasks and that error again.
    watch = Watch()

    async def loser() -> None:
        held = _Held()
        watch.add("what the cancelled coroutine held", held)
        await asyncio.Event().wait()

    async def winner() -> str:
        await asyncio.sleep(0)
        return "won"

    with collector_off():
        first, second = await race(winner(), loser())
        assert first.result() == "won" and second.cancelled
        del first, second
        assert watch.alive() == []


async def test_race_closes_a_coroutine_cancelled_before_it_started() -> None:
    async def instant() -> int:
        return 1  # ends in its first step, before the second task has run at all

    async def never_runs() -> None:
        raise AssertionError("cancelled before its first step")

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "coroutine ... was never awaited" would be an error
        first, second = await race(instant(), never_runs())
        gc.collect()
    assert first.result() == 1 and second.cancelled


async def test_a_cancelled_race_cancels_both_and_passes_the_cancellation_on() -> None:
    ended: list[str] = []

    async def forever(name: str) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            ended.append(name)

    racing = asyncio.ensure_future(race(forever("a"), forever("b")))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    racing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await racing
    assert sorted(ended) == ["a", "b"]


async def test_background_ends_with_the_block_and_its_error_is_not_wrapped() -> None:
    ended: list[str] = []

    async def helper() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            ended.append("helper")

    with pytest.raises(KeyError):
        async with background(helper(), name="helper") as task:
            await asyncio.sleep(0)
            assert task.get_name() == "helper" and not task.done()
            raise KeyError("from the block")
    assert ended == ["helper"] and task.cancelled()


async def test_companions_are_cancelled_and_awaited_when_the_block_ends() -> None:
    ended: list[str] = []

    async def companion(name: str) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            ended.append(name)

    async with companions([companion("a"), companion("b")], names=["a", "b"]) as tasks:
        await asyncio.sleep(0)
        assert [task.get_name() for task in tasks] == ["a", "b"]
    assert sorted(ended) == ["a", "b"] and all(task.cancelled() for task in tasks)


async def test_a_companion_that_fails_ends_the_block_with_its_error() -> None:
    async def boom() -> None:
        raise ValueError("companion failed")

    with pytest.raises(ExceptionGroup) as caught:
        async with companions([boom()]):
            await asyncio.Event().wait()  # cancelled by the companion's failure
    assert isinstance(caught.value.exceptions[0], ValueError)


async def test_cancel_and_wait_absorbs_the_tasks_cancellation_but_passes_the_callers_on() -> None:
    started = asyncio.Event()

    async def forever() -> None:
        started.set()
        await asyncio.Event().wait()

    owned = asyncio.get_running_loop().create_task(forever())
    await started.wait()
    await cancel_and_wait(owned)  # returns: the task's own cancellation is its end
    assert owned.cancelled()

    release = asyncio.Event()

    async def slow_to_stop() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await release.wait()
            raise

    async def closer(task: asyncio.Task[None]) -> None:
        await cancel_and_wait(task)

    stubborn = asyncio.get_running_loop().create_task(slow_to_stop())
    await asyncio.sleep(0)
    closing = asyncio.get_running_loop().create_task(closer(stubborn))
    await asyncio.sleep(0)
    closing.cancel()  # the closer itself is cancelled while it waits: that is passed on
    await asyncio.sleep(0)
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await closing
    assert stubborn.done()


async def test_wait_ended_in_a_cancelled_callers_finally_lets_the_cleanup_after_it_run() -> None:
    steps: list[str] = []
    started = asyncio.Event()

    async def helper() -> None:
        await asyncio.Event().wait()

    async def owner() -> None:
        task = asyncio.get_running_loop().create_task(helper())
        try:
            started.set()
            await asyncio.Event().wait()
        finally:
            await cancel_and_wait(task)
            steps.append("cleanup after the helper ended")

    running = asyncio.get_running_loop().create_task(owner())
    await started.wait()
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert steps == ["cleanup after the helper ended"]


async def test_finish_shielded_ends_its_work_before_passing_a_cancellation_on() -> None:
    release = asyncio.Event()
    steps: list[str] = []

    async def rollback() -> None:
        steps.append("started")
        await release.wait()
        steps.append("ended")

    async def caller() -> None:
        await finish_shielded(rollback())

    task = asyncio.create_task(caller())
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    task.cancel()
    await asyncio.sleep(0)
    assert not task.done() and steps == ["started"]  # cancelled, yet still waiting for its work to end
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert steps == ["started", "ended"]  # nothing left running unowned
