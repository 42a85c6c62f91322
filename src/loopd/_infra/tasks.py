"""Owned tasks: every task loopd starts has an owner that awaits it (a ``TaskGroup``, a `TaskSet`, or the one object
that holds it and ends it in its ``aclose()``).

Owns: the shapes of concurrency loopd uses, so that no task is ever started without an owner that awaits it.
Must not do: schedule, retry or decide what runs.

Which to use:

- Tasks that share a lifetime (started together, ended together: a server's background loops, a manager's
  informers, a request's producer and consumer) → an ``asyncio.TaskGroup`` held by the owner's ``async with``.
- Two tasks where the first to end decides (a stream and the watcher for its client leaving, a consumer and the
  watcher that stops it) → `race`: a TaskGroup of two, the first to end cancels the other, and how each ended comes
  back as an `Outcome` (so the caller, not the group, decides what an error means).
- Helper tasks that live exactly as long as a block of code (a pump feeding the block, a waiter armed before a
  read, a manager's informers, a leader's lease renewer) → `background` (one) or `companions` (several): a
  TaskGroup beside the block, cancelled and awaited when the block ends; the block's own exception propagates
  unwrapped.
- Dynamic children of a long-lived object, started and reaped over time (one per call, feed, effect or worker) →
  a `TaskSet` (see its docstring for why it is not a TaskGroup).
- The one background task of a long-lived object, started lazily from synchronous code (a journal's flusher, a
  store's listener, a watch pump) → held by the object and ended by its ``aclose()`` with `cancel_and_wait`,
  which, unlike ``suppress(CancelledError)``, passes the closer's own cancellation on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from loopd._infra.errors import LoopdError

T = TypeVar("T")
A = TypeVar("A")
B = TypeVar("B")

_log = logging.getLogger(__name__)


class TaskSetClosed(LoopdError, RuntimeError):
    """The task set was closed: it starts no more tasks."""


@dataclass(frozen=True, slots=True)
class Outcome(Generic[T]):
    """How one task of a `race` ended: a value, an error, or cancelled (the other one ended first)."""

    value: T | None = None
    error: Exception | None = None
    cancelled: bool = False

    @property
    def ok(self) -> bool:
        """It returned a value."""
        return not self.cancelled and self.error is None

    def result(self) -> T:
        """The value; the error raised again; ``CancelledError`` if it was cancelled."""
        if self.cancelled:
            raise asyncio.CancelledError
        if self.error is not None:
            raise self.error
        return self.value  # type: ignore[return-value]  # None only when T admits None


_CANCELLED: Outcome[Any] = Outcome(cancelled=True)


def _cancel_others(tasks: Sequence[asyncio.Task[Any]]) -> None:
    current = asyncio.current_task()
    for task in tasks:
        if task is not current:
            task.cancel()


async def race(
    first: Coroutine[Any, Any, A],
    second: Coroutine[Any, Any, B],
    *,
    names: tuple[str | None, str | None] = (None, None),
) -> tuple[Outcome[A], Outcome[B]]:
    """Run ``first`` and ``second`` as one TaskGroup; the first to end (value, error or cancellation) cancels the
    other; return how each ended once both have.

    An error of either does not propagate: it comes back in its `Outcome` for the caller to judge (raise it with
    ``outcome.result()``). A cancellation of the caller cancels both, waits for them, and is passed on (never
    swallowed). A coroutine cancelled before it started is closed, never left un-awaited.
    """
    coros: tuple[Coroutine[Any, Any, Any], ...] = (first, second)
    outcomes: list[Outcome[Any]] = [_CANCELLED, _CANCELLED]
    tasks: list[asyncio.Task[None]] = []

    async def run(index: int) -> None:
        try:
            outcomes[index] = Outcome(value=await coros[index])
        except Exception as exc:  # the caller judges it (see the docstring)
            outcomes[index] = Outcome(error=exc)
        finally:
            # In a function of its own: a loop variable here would keep the other task in this frame, which the
            # loser's CancelledError holds (a reference cycle left to the cyclic collector).
            _cancel_others(tasks)

    try:
        async with asyncio.TaskGroup() as group:
            tasks.extend(group.create_task(run(index), name=names[index]) for index in range(2))
    finally:
        for coro in coros:
            coro.close()  # a no-op for a coroutine that ran; silences one cancelled before its first step
        # The loser's CancelledError holds `run`'s frame, whose `tasks` and `outcomes` hold the tasks and that
        # error again: emptied, they are freed now by reference counting, not later by the cyclic collector.
        tasks.clear()
    ended = outcomes[0], outcomes[1]
    outcomes.clear()
    return ended


@contextlib.asynccontextmanager
async def background(coro: Coroutine[Any, Any, T], *, name: str | None = None) -> AsyncIterator[asyncio.Task[T]]:
    """Run ``coro`` as a task for the duration of the ``async with`` block (a TaskGroup of one beside the block).

    At the block's end the task is cancelled (if still running) and awaited; see `companions` for errors.
    """
    async with companions([coro], names=[name]) as tasks:
        yield tasks[0]


@contextlib.asynccontextmanager
async def companions(
    coros: Sequence[Coroutine[Any, Any, Any]], *, names: Sequence[str | None] | None = None
) -> AsyncIterator[list[asyncio.Task[Any]]]:
    """Run ``coros`` as one TaskGroup beside the ``async with`` block, for exactly the block's duration.

    At the block's end every task still running is cancelled, and all are awaited. The block's exception
    propagates as it was raised (not wrapped in an ``ExceptionGroup``). An error of a task cancels the block and
    the others and is raised as the TaskGroup raises it (an ``ExceptionGroup``): tasks run here report their
    expected failures through their results or their owner's state, not by raising. A cancellation of the block
    cancels the tasks and is passed on once they have ended.
    """
    labels = list(names) if names is not None else [None] * len(coros)
    if len(labels) != len(coros):
        raise ValueError("one name per coroutine")
    error: Exception | None = None
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(coro, name=label) for coro, label in zip(coros, labels, strict=True)]
            try:
                yield tasks
            except Exception as exc:  # raised again below, after the tasks have ended, unwrapped
                error = exc
            finally:
                for task in tasks:
                    task.cancel()
    finally:
        for coro in coros:
            coro.close()  # a no-op for one that ran; silences one cancelled before its first step
    if error is not None:
        raise error


async def wait_ended(task: asyncio.Future[Any]) -> None:
    """Wait until ``task`` has ended. Its own cancellation is absorbed (it was stopped: that is an end); a
    cancellation of the caller that arrives during the wait is passed on, never swallowed; an error of the task
    is raised. Safe in a ``finally`` that runs because the caller is being cancelled: the cleanup after it runs."""
    current = asyncio.current_task()
    requested = current.cancelling() if current is not None else 0
    try:
        await task
    except asyncio.CancelledError:
        if not task.cancelled() or (current is not None and current.cancelling() > requested):
            raise


async def finish_shielded(work: Coroutine[Any, Any, None]) -> None:
    """Run ``work`` to its end though the caller may be cancelled meanwhile (a rollback, a cleanup): then wait for
    it to end before passing the cancellation on, so it never runs on unowned. ``work`` must bound its own
    duration (a rollback with its own timeout); must not be used for work that may wait without a bound."""
    task = asyncio.ensure_future(work)
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        await asyncio.wait({task})
        raise


async def cancel_and_wait(task: asyncio.Future[Any] | None) -> None:
    """Cancel the single background task an object owns (a listener, a pump, a flusher) and wait until it has
    ended (see `wait_ended`): the way an owner's ``aclose()`` ends it."""
    if task is None:
        return
    task.cancel()
    await wait_ended(task)


class TaskSet:
    """Dynamic tasks of one long-lived owner; ``aclose()`` cancels and awaits them all.

    A task that fails (an exception other than cancellation) is logged with ``name`` and forgotten: the owner
    decides in the task itself what a failure means. A task that finishes is forgotten at once, so a long-lived
    owner does not accumulate finished tasks. Use it as ``async with TaskSet(...)`` (its exit cancels and awaits
    what still runs) or as an object's member closed by the owner's ``aclose()``/``stop()``.

    Why not an ``asyncio.TaskGroup``: (1) a TaskGroup ends its children when one fails, and cancels the task that
    entered it; here one feed, drive, effect or worker failing must not end its siblings or its owner (that is the
    owner's behaviour the rest of loopd relies on), so failures are isolated and logged; (2) a TaskGroup is bound
    to the task that entered it and only starts children between ``__aenter__`` and ``__aexit__``, while these
    owners start children from synchronous code (``start()`` methods, done callbacks, mailbox handlers) and are
    closed by whichever task shuts them down; (3) a TaskGroup's exit waits for its children to end on their own,
    while an owner's close cancels them. What it keeps from a TaskGroup: no child outlives ``aclose()``, a closed
    set starts nothing, and a cancellation of the closer is passed on only after the children have ended.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False

    def start(self, coro: Coroutine[Any, Any, T], *, name: str | None = None) -> asyncio.Task[T]:
        """Start ``coro`` as a task owned by this set (`TaskSetClosed` once it is closed; ``coro`` is closed)."""
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
        """Whether ``aclose()`` began: the set starts nothing more."""
        return self._closed

    def __iter__(self) -> Iterator[asyncio.Task[Any]]:
        return iter(tuple(self._tasks))

    async def aclose(self, *, timeout: float | None = None, recancel: float | None = None) -> int:
        """Refuse new tasks, cancel the running ones and wait until every one has ended; how many did not.

        With ``timeout`` the wait lasts at most that many seconds: tasks still running then stay in the set
        (owned, and cancelled again by the next ``aclose()``) and their count is returned. With ``recancel``,
        tasks still running are cancelled again every ``recancel`` seconds (a library may swallow one
        cancellation: Python 3.11's ``wait_for`` can). A cancellation of the caller while it waits is passed on
        after the tasks have ended (or the timeout passed).
        """
        self._closed = True
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        cancelled = False
        while self._tasks:
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                break
            tasks = tuple(self._tasks)
            for task in tasks:
                task.cancel()
            wait = remaining if recancel is None else recancel if remaining is None else min(recancel, remaining)
            try:
                await asyncio.shield(asyncio.wait(tasks, timeout=wait))
            except asyncio.CancelledError:
                cancelled = True
            self._tasks.difference_update(task for task in tasks if task.done())
        left = len(self._tasks)
        if cancelled:
            raise asyncio.CancelledError
        return left

    def _finished(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            _log.error("%s: task %s failed", self.name, task.get_name(), exc_info=error)
