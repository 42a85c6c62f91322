"""Suite-wide checks: no async test leaves a task of its own running behind it."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator

import pytest

LEAK_GRACE = 10.0
"""Seconds a task cancelled or finishing at teardown may take to end (a thread, a socket close) before it counts.
Above the tests' 5 s database operation timeout: a PostgreSQL read cancelled mid-query ends only after its shielded
ROLLBACK gives up (see tests/server_chat/test_feeds.py's [postgres] cases)."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        function = getattr(item, "function", None)
        if function is not None and inspect.iscoroutinefunction(function):
            # First in the list: set up before, and torn down after, every fixture of the test.
            item.fixturenames.insert(0, "no_leaked_tasks")  # type: ignore[attr-defined]


@pytest.fixture
async def no_leaked_tasks() -> AsyncIterator[None]:
    """Fail the test if a task it (or its fixtures) started is still pending after its fixtures closed."""
    runner = asyncio.current_task()
    before = asyncio.all_tasks()
    yield
    current = asyncio.current_task()
    pending = {task for task in asyncio.all_tasks() - before if task is not current and task is not runner}
    if pending:
        _, pending = await asyncio.wait(pending, timeout=LEAK_GRACE)
    if not pending:
        return
    names = sorted(f"{task.get_name()} ({task.get_coro()!r})" for task in pending)
    for task in pending:
        task.cancel()
    await asyncio.wait(pending, timeout=LEAK_GRACE)
    pytest.fail(f"{len(names)} task(s) left running by this test:\n  " + "\n  ".join(names), pytrace=False)
