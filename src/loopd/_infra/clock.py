"""Time: the one ``Clock`` seam, the system clock, and a virtual clock for tests.

Owns: reading time (monotonic seconds for decisions and timers, wall time as an aware UTC datetime or as epoch
seconds for what is written down), sleeping, and waiting with a deadline measured on a clock.
Must not do: anything else. Every time-dependent part of loopd (gate timers, leases, deadlines, heartbeats,
polls, backoff, work-queue delays, drain timeouts) takes a ``Clock``, so tests run on ``VirtualClock`` exactly
and instantly.

Wall time (``now``/``time``) and monotonic time start from different origins and must not be mixed: compute a
timer from one of them only. On ``VirtualClock`` both move together, so a test that advances it moves both.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time as _time
from collections.abc import Awaitable, Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol, TypeVar

from loopd._infra.tasks import background, race

T = TypeVar("T")


class Clock(Protocol):
    """Where loopd reads time and sleeps."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards; only differences mean anything."""
        ...

    def now(self) -> datetime:
        """Aware UTC wall time, for timestamps written down (never for measuring intervals)."""
        ...

    def time(self) -> float:
        """Wall time as seconds since the epoch (``now()`` as a float)."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Sleep ``seconds`` (at once when not positive, still yielding to the event loop)."""
        ...


class SystemClock:
    """The real clock: ``time.monotonic``, ``datetime.now(UTC)``, ``time.time`` and ``asyncio.sleep``."""

    def monotonic(self) -> float:
        return _time.monotonic()

    def now(self) -> datetime:
        return datetime.now(UTC)

    def time(self) -> float:
        return _time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


class VirtualClock:
    """A clock that moves only when a test says so; sleeping tasks wake exactly at their deadline.

    ``await clock.advance(5)`` runs every sleeper due within the next five virtual seconds, in deadline
    order, letting the event loop settle after each wake-up. ``await clock.run_until(predicate)`` jumps from
    deadline to deadline until the predicate holds (Trio's ``autojump_clock``, on demand). Code under test must
    not wait for real time: real I/O that completes on its own (a SQLite thread, a local socket) is fine between
    virtual steps, but a real ``asyncio.sleep`` is not.
    """

    def __init__(self, start: float = 0.0, *, wall_start: datetime | None = None) -> None:
        self._now = start
        self._wall_start = wall_start or datetime(2030, 1, 1, tzinfo=UTC)
        if self._wall_start.tzinfo is None:
            raise ValueError("wall_start must be an aware datetime")
        self._start = start
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    def monotonic(self) -> float:
        return self._now

    def now(self) -> datetime:
        return self._wall_start + timedelta(seconds=self._now - self._start)

    def time(self) -> float:
        return self.now().timestamp()

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._now + seconds, next(self._order), future))
        await future

    @property
    def sleepers(self) -> int:
        """How many tasks are sleeping on this clock now."""
        self._drop_cancelled()
        return sum(1 for _, _, future in self._sleepers if not future.done())

    @property
    def next_deadline(self) -> float | None:
        """When the earliest pending sleeper wakes, if any."""
        self._drop_cancelled()
        return self._sleepers[0][0] if self._sleepers else None

    async def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds``, waking every sleeper due on the way."""
        if seconds < 0:
            raise ValueError("time does not go backwards")
        await settle()
        target = self._now + seconds
        while (deadline := self.next_deadline) is not None and deadline <= target:
            self._wake_until(deadline)
            await settle()
        self._now = target
        await settle()

    async def run_until(self, predicate: Callable[[], bool], *, limit: float = 3600.0) -> float:
        """Jump from deadline to deadline until ``predicate()`` holds; returns the virtual time spent.

        Raises ``TimeoutError`` when the predicate still fails after ``limit`` virtual seconds or when nothing
        is left to wake (a deadlock in virtual time).
        """
        begin = self._now
        await settle()
        while not predicate():
            deadline = self.next_deadline
            if deadline is None:
                raise TimeoutError("nothing is sleeping and the condition does not hold")
            if deadline - begin > limit:
                self._now = begin + limit
                raise TimeoutError(f"the condition did not hold within {limit} virtual seconds")
            self._wake_until(deadline)
            await settle()
        return self._now - begin

    def _wake_until(self, deadline: float) -> None:
        self._now = max(self._now, deadline)
        while self._sleepers and self._sleepers[0][0] <= deadline:
            _, _, future = heapq.heappop(self._sleepers)
            if not future.done():
                future.set_result(None)

    def _drop_cancelled(self) -> None:
        while self._sleepers and self._sleepers[0][2].done():
            heapq.heappop(self._sleepers)


async def settle(max_rounds: int = 10_000) -> None:
    """Let every task that can run without time passing run, until the event loop is idle."""
    loop = asyncio.get_running_loop()
    idle_rounds = 0
    for _ in range(max_rounds):
        await asyncio.sleep(0)
        ready = getattr(loop, "_ready", None)
        if ready is None:
            idle_rounds += 1
            if idle_rounds >= 50:
                return
        elif not ready:
            idle_rounds += 1
            if idle_rounds >= 3:
                return
        else:
            idle_rounds = 0


async def sleep_until(clock: Clock, deadline: float) -> None:
    """Sleep until ``clock.monotonic()`` reaches ``deadline``."""
    await clock.sleep(deadline - clock.monotonic())


async def wait_event(clock: Clock, event: asyncio.Event, timeout: float | None) -> bool:
    """Wait for ``event`` at most ``timeout`` seconds of ``clock`` time; whether it is set."""
    if event.is_set():
        return True
    if timeout is None:
        await event.wait()
        return True
    if timeout <= 0:
        return False
    if type(clock) is SystemClock:  # the common case needs no helper tasks
        try:
            async with asyncio.timeout(timeout):
                await event.wait()
        except TimeoutError:
            return event.is_set()
        return True
    async with background(event.wait(), name="wait-event") as waiter:  # cancelled and awaited at the end
        await wait_first(clock, [waiter], timeout)
    return event.is_set()


async def wait_first(clock: Clock, tasks: Iterable[asyncio.Future[Any]], timeout: float) -> set[asyncio.Future[Any]]:
    """Wait until one of ``tasks`` finishes or ``timeout`` passes on ``clock``; the finished ones.

    Tasks created only for this wait (like ``event.wait()``) are the caller's to cancel; this function cancels
    nothing but its own timer.
    """
    pending: set[asyncio.Future[Any]] = set(tasks)
    async with background(clock.sleep(timeout), name="wait-timer") as timer:  # cancelled and awaited at the end
        done, _ = await asyncio.wait({*pending, timer}, return_when=asyncio.FIRST_COMPLETED)
    return {task for task in done if task is not timer}


async def wait_all(clock: Clock, tasks: Iterable[asyncio.Future[Any]], timeout: float) -> bool:
    """Wait until all ``tasks`` finish or ``timeout`` passes on ``clock``; whether all finished."""
    pending: set[asyncio.Future[Any]] = {task for task in tasks if not task.done()}
    if not pending:
        return True
    async with background(clock.sleep(timeout), name="wait-timer") as timer:  # cancelled and awaited at the end
        while pending and not timer.done():
            done, _ = await asyncio.wait({*pending, timer}, return_when=asyncio.FIRST_COMPLETED)
            pending -= done
    return not pending


async def with_timeout(clock: Clock, awaitable: Awaitable[T], timeout: float) -> T:
    """Await ``awaitable`` for at most ``timeout`` seconds of ``clock`` time; ``TimeoutError`` after that (it is
    cancelled and awaited first). Its error is raised as it is; a cancellation of the caller is passed on."""
    ended, _timer = await race(_awaited(awaitable), clock.sleep(timeout), names=("with-timeout", "with-timeout-timer"))
    if ended.cancelled:  # the timer ended first
        raise TimeoutError(f"timed out after {timeout} s")
    return ended.result()


async def _awaited(awaitable: Awaitable[T]) -> T:
    return await awaitable
