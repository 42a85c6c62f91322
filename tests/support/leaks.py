"""The suite's task-leak check: which tasks a test left running after its fixtures closed.

Strict: a task counts as leaked when it is still pending once the event loop has had a few iterations to finish
what teardown cancelled; it is not given time to end on its own (a task that nobody awaits is unowned even if it
would have ended a moment later). Only real time that a cancelled leaked task takes to end is waited for, so
its cleanup does not spill into the next test. Used by the ``no_leaked_tasks`` fixture in tests/conftest.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any, Final

SETTLE_ROUNDS: Final = 20
"""Event-loop iterations given to tasks that teardown just cancelled (a cancelled task ends within one or two;
a ``TaskGroup`` exit or a cancelled ``wait`` within a few more). No real time passes."""

LEAK_GRACE: Final = 10.0
"""Seconds a leaked task, once cancelled by the check, may take to end (a thread, a socket close) before the
check gives up waiting for it. Above the tests' 5 s database operation timeout."""


async def leaked_tasks(
    before: Iterable[asyncio.Task[Any]], *, ignore: Iterable[asyncio.Task[Any] | None] = ()
) -> set[asyncio.Task[Any]]:
    """The tasks started since ``before`` (apart from ``ignore``) that are still pending after `SETTLE_ROUNDS`
    iterations of the event loop."""
    skip = set(before) | {task for task in ignore if task is not None}
    pending = {task for task in asyncio.all_tasks() - skip if not task.done()}
    for _ in range(SETTLE_ROUNDS):
        if not pending:
            break
        await asyncio.sleep(0)
        pending = {task for task in pending if not task.done()}
    return pending


def describe(tasks: Iterable[asyncio.Task[Any]]) -> list[str]:
    """One line per task: its name and its coroutine (where it was created shows in the coroutine's name)."""
    return sorted(f"{task.get_name()} ({task.get_coro()!r})" for task in tasks)


async def cancel_leaked(tasks: set[asyncio.Task[Any]], *, grace: float = LEAK_GRACE) -> None:
    """Cancel ``tasks`` and wait at most ``grace`` seconds for them to end (their errors are retrieved)."""
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=grace)
    for task in tasks:
        if task.done() and not task.cancelled():
            task.exception()  # retrieved: the failure report names the task
