"""Suite-wide checks: no async test leaves a task of its own running behind it."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator

import pytest

from tests.support.leaks import cancel_leaked, describe, leaked_tasks

pytest_plugins = ("pytester",)  # tests/infra/test_leak_check.py runs the leak check on a test that leaks


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        function = getattr(item, "function", None)
        if function is not None and inspect.iscoroutinefunction(function):
            # First in the list: set up before, and torn down after, every fixture of the test.
            item.fixturenames.insert(0, "no_leaked_tasks")  # type: ignore[attr-defined]


@pytest.fixture
async def no_leaked_tasks() -> AsyncIterator[None]:
    """Fail the test if a task it (or its fixtures) started is still pending after its fixtures closed (see
    tests/support/leaks.py: strict, no real time is given to a task to end on its own)."""
    runner = asyncio.current_task()
    before = asyncio.all_tasks()
    yield
    pending = await leaked_tasks(before, ignore=(runner, asyncio.current_task()))
    if not pending:
        return
    names = describe(pending)
    await cancel_leaked(pending)
    pytest.fail(f"{len(names)} task(s) left running by this test:\n  " + "\n  ".join(names), pytrace=False)
