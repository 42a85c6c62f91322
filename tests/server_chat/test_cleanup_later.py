"""A completion that may clean up later (``TaskApi.complete(..., later=True)``, the built-in responder's): the answer
ends at once (its end stored, the row ``closing``); while the server is busy the Task's delete and the ``closed``
mark wait for it to be idle a moment (`CLEANUP_QUIET`), or `CLEANUP_DELAY` at most, several in one go; an idle
server, or no cleanup running, cleans up at once as before; a delete that fails leaves the row ``closing`` for the
sweeper."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from loopd._infra.clock import VirtualClock
from loopd.server.chat import OpenAnswers, TaskUnavailable
from loopd.server.chat._tasks import CLEANUP_DELAY, CLEANUP_QUIET
from tests.server_http.support import Rig, ask, new_conversation, task_object


async def _until(predicate: Callable[[], Any], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not await predicate():
            await asyncio.sleep(0.01)


@asynccontextmanager
async def _cleaning(rig: Rig) -> AsyncIterator[None]:
    """`run_cleanup` running (as `loopd up` runs it) for the block."""
    async with asyncio.TaskGroup() as group:
        running = group.create_task(rig.task_api.run_cleanup())
        await asyncio.sleep(0)  # it has started
        try:
            yield
        finally:
            running.cancel()


async def _question(rig: Rig) -> str:
    user = rig.client()
    return str((await ask(user, await new_conversation(user)))["task_id"])


async def _closed(rig: Rig, task_id: str) -> bool:
    response = await rig.task_api.response_of(task_id)
    return response.delivery_state == "closed" and await task_object(rig, task_id) is None


async def test_while_the_server_is_busy_the_cleanup_waits_for_it_to_be_idle(rig: Rig) -> None:
    busy = True
    rig.task_api.busy = lambda: busy
    first, second = await _question(rig), await _question(rig)
    async with _cleaning(rig):
        for task_id in (first, second):
            response = await rig.task_api.complete(task_id, later=True)
            assert (response.status, response.delivery_state) == ("completed", "closing")  # the answer ended
            assert await task_object(rig, task_id) is not None  # its Task waits
        assert await rig.task_api.sweep_closing() == 0  # queued here: the sweeper leaves them
        rig.task_api.idle()  # a call ended, but others still run: nothing yet
        await asyncio.sleep(0.05)
        assert await task_object(rig, first) is not None

        busy = False
        rig.task_api.idle()  # the last call ended: both are cleaned up once it stayed idle a moment
        await asyncio.sleep(0.05)
        assert await task_object(rig, first) is not None
        await rig.clock.advance(CLEANUP_QUIET)
        await _until(lambda: _closed(rig, first))
        await _until(lambda: _closed(rig, second))
    assert sorted(rig.gateway.deleted) == sorted([first, second])


async def test_a_server_that_stays_busy_cleans_up_after_the_delay(rig: Rig) -> None:
    rig.task_api.busy = lambda: True
    task_id = await _question(rig)
    async with _cleaning(rig):
        await rig.task_api.complete(task_id, later=True)
        await rig.clock.advance(CLEANUP_DELAY / 2)
        assert await task_object(rig, task_id) is not None
        await rig.clock.advance(CLEANUP_DELAY / 2)
        await _until(lambda: _closed(rig, task_id))


async def test_an_idle_server_or_no_cleanup_running_cleans_up_at_once(rig: Rig) -> None:
    idle, alone = await _question(rig), await _question(rig)
    async with _cleaning(rig):
        done = await rig.task_api.complete(idle, later=True)  # nothing else runs: at once
    assert done.delivery_state == "closed" and await task_object(rig, idle) is None
    rig.task_api.busy = lambda: True
    done = await rig.task_api.complete(alone, later=True)  # busy, but no `run_cleanup` to do it later
    assert done.delivery_state == "closed" and await task_object(rig, alone) is None


async def test_a_deferred_delete_that_fails_is_left_to_the_sweeper(rig: Rig) -> None:
    busy = True
    rig.task_api.busy = lambda: busy
    task_id = await _question(rig)
    async with _cleaning(rig):
        await rig.task_api.complete(task_id, later=True)
        rig.gateway.fail_delete = TaskUnavailable("the resource API is down")
        busy = False
        rig.task_api.idle()
        await rig.clock.advance(CLEANUP_QUIET)
        await _until(lambda: _sweepable(rig))
        assert (await rig.task_api.response_of(task_id)).delivery_state == "closing"
        rig.gateway.fail_delete = None
        assert await rig.task_api.sweep_closing() == 1  # no longer queued: the sweeper finishes it
    assert await _closed(rig, task_id)


async def _sweepable(rig: Rig) -> bool:
    return not rig.task_api._later  # the cleanup gave it up


async def test_the_last_open_answer_to_end_lets_the_waiting_cleanups_go(rig: Rig) -> None:
    """As `loopd up` wires it: busy while questions asked here wait for their answers (`OpenAnswers`)."""
    answers = rig.chat.answers = rig.task_api.answers = OpenAnswers(rig.clock)
    rig.task_api.busy = answers.waiting
    first, second = await _question(rig), await _question(rig)
    assert len(answers) == 2 and answers.waiting()
    async with _cleaning(rig):
        await rig.task_api.complete(first, later=True)  # the second still waits for its answer: deferred
        assert len(answers) == 1 and await task_object(rig, first) is not None
        done = await rig.task_api.complete(second, later=True)  # the last: cleaned up at once, and the first after
        assert done.delivery_state == "closed" and not answers.waiting()
        await rig.clock.advance(CLEANUP_QUIET)
        await _until(lambda: _closed(rig, first))


async def test_open_answers_are_bounded_and_forgotten_past_their_horizon() -> None:
    clock = VirtualClock()
    answers = OpenAnswers(clock, kept=2, horizon=60.0)
    for task_id in ("t-1", "t-2", "t-3"):
        answers.asked(task_id)
    assert len(answers) == 2  # the oldest was dropped
    answers.answered("t-3")
    answers.answered("never-asked")
    assert len(answers) == 1 and answers.waiting()
    await clock.advance(61.0)
    assert not answers.waiting()  # t-2 was completed elsewhere, or never: forgotten


async def test_open_answers_tell_their_listeners_when_the_first_opens_and_the_last_is_gone() -> None:
    clock = VirtualClock()
    answers = OpenAnswers(clock, horizon=60.0)
    heard: list[bool] = []
    remove = answers.add_listener(heard.append)
    answers.asked("t-1")
    answers.asked("t-2")  # not the first: nothing to tell
    answers.answered("t-1")
    answers.answered("unknown")
    assert heard == [True]
    answers.answered("t-2")
    assert heard == [True, False]
    answers.asked("t-3")
    await clock.advance(61.0)
    assert not answers.waiting()  # forgotten past its horizon: the last one is gone too
    assert heard == [True, False, True, False]
    remove()
    answers.asked("t-4")
    assert heard == [True, False, True, False]
