"""The suite's task-leak check (tests/support/leaks.py and the no_leaked_tasks fixture) catches what it must."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.support.leaks import cancel_leaked, describe, leaked_tasks

CONFTEST = Path(__file__).parents[1] / "conftest.py"


async def test_a_task_left_pending_is_reported_with_its_name_and_coroutine() -> None:
    before = asyncio.all_tasks()

    async def lingering() -> None:
        await asyncio.sleep(30)  # would end on its own later (never within the check, however slow the machine)

    task = asyncio.get_running_loop().create_task(lingering(), name="the-leaked-task")
    pending = await leaked_tasks(before, ignore=[asyncio.current_task()])
    assert pending == {task}
    (line,) = describe(pending)
    assert line.startswith("the-leaked-task (") and "lingering" in line
    await cancel_leaked(pending)
    assert task.cancelled()


async def test_owned_tasks_and_tasks_cancelled_at_teardown_are_not_reported() -> None:
    before = asyncio.all_tasks()
    awaited = asyncio.get_running_loop().create_task(asyncio.sleep(0), name="awaited")
    await awaited
    cancelled = asyncio.get_running_loop().create_task(asyncio.Event().wait(), name="cancelled")
    await asyncio.sleep(0)
    cancelled.cancel()  # what a teardown does just before the check: it ends within a loop iteration
    assert await leaked_tasks(before, ignore=[asyncio.current_task()]) == set()
    assert cancelled.cancelled()


def test_the_suite_fails_a_test_that_leaks_a_task(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(
        test_leaky="""
import asyncio

async def test_leaks():
    asyncio.get_running_loop().create_task(asyncio.Event().wait(), name="the-leaked-task")

async def test_owns_its_task():
    async with asyncio.TaskGroup() as group:
        group.create_task(asyncio.sleep(0), name="an-owned-task")
"""
    )
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "-o", "asyncio_mode=auto", "-o", "asyncio_default_fixture_loop_scope=function"
    )
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(["*1 task(s) left running by this test:*", "*the-leaked-task (<coroutine object*"])
    assert "an-owned-task" not in result.stdout.str()
