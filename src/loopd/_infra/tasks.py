"""Owned background tasks: a ``TaskSet`` for tasks whose lifetime is an object's, not a block's.

Owns: starting tasks on behalf of an owner, forgetting them when they end, reporting their failures, and
cancelling and awaiting every one of them on ``aclose()``.
Must not do: schedule, retry or decide what runs.

Which to use: tasks whose results a block waits for → ``asyncio.TaskGroup``. Background tasks that run until their
owner stops (informers, feeds, drivers, a server's manager) → a ``TaskSet``: as ``async with TaskSet(...)`` its
exit cancels and awaits what is still running (a nursery whose scope is cancelled at the end), or as an object's
member closed by the owner's ``aclose()``. Either way no task is left unowned.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

from loopd._infra.errors import LoopdError

T = TypeVar("T")

_log = logging.getLogger(__name__)


class TaskSetClosed(LoopdError, RuntimeError):
    """The task set was closed: it starts no more tasks."""


class TaskSet:
    """Tasks started by one owner; ``aclose()`` cancels and awaits them all.

    A task that fails (an exception other than cancellation) is logged with ``name`` and forgotten: the owner
    decides in the task itself what a failure means. A task that finishes is forgotten at once, so a
    long-lived owner does not accumulate finished tasks.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False

    def start(self, coro: Coroutine[Any, Any, T], *, name: str | None = None) -> asyncio.Task[T]:
        """Start ``coro`` as a task owned by this set."""
        if self._closed:
            coro.close()
            raise TaskSetClosed(f"task set {self.name!r} is closed")
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._finished)
        return task

    async def __aenter__(self) -> TaskSet:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()

    def __len__(self) -> int:
        return len(self._tasks)

    @property
    def closed(self) -> bool:
        return self._closed

    def __iter__(self) -> Iterator[asyncio.Task[Any]]:
        return iter(tuple(self._tasks))

    async def aclose(self) -> None:
        """Refuse new tasks, cancel the running ones and wait until every one has ended.

        A cancellation of the caller while it waits is passed on after the tasks have ended.
        """
        self._closed = True
        cancelled = False
        while self._tasks:
            tasks = tuple(self._tasks)
            for task in tasks:
                task.cancel()
            try:
                await asyncio.shield(asyncio.wait(tasks))
            except asyncio.CancelledError:
                cancelled = True
            self._tasks.difference_update(task for task in tasks if task.done())
        if cancelled:
            raise asyncio.CancelledError

    def _finished(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            _log.error("%s: task %s failed", self.name, task.get_name(), exc_info=error)
