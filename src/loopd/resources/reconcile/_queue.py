"""The work queue between informers and reconcile workers (client-go's workqueue semantics).

Owns: which keys are waiting, being processed or delayed; coalescing; per-key failure counts and backoff.
Must not do: reconcile, or read time except through its ``Clock``.

Rules:

- A key is queued at most once: adding a key that is already waiting is a no-op (coalesced).
- A key handed out by ``get`` is *processing* until ``done``. Adding it meanwhile marks it dirty; it is queued
  again when ``done`` is called — so one key is never processed concurrently, and a change that arrives
  mid-reconcile is never lost.
- ``add_after`` keeps the earliest pending deadline per key; ``add_rate_limited`` delays by the key's
  exponential backoff (failures since the last ``forget``).
- Size is bounded by the number of distinct keys (each key is held once); keys come from an informer cache.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

from loopd._infra.backoff import Backoff
from loopd._infra.clock import Clock, wait_event
from loopd._infra.errors import LoopdError

K = TypeVar("K", bound=Hashable)


class QueueShutDown(LoopdError):
    """The queue was shut down: ``get`` hands out no more keys."""


@dataclass(frozen=True, slots=True)
class QueueStatistics:
    depth: int
    """Keys ready to be handed out."""
    processing: int
    """Keys handed out and not yet done."""
    delayed: int
    """Keys waiting for a delay to pass."""
    adds: int
    """Every add, including delayed keys becoming due."""
    coalesced: int
    """Adds that found the key already waiting (or dirty while processing)."""
    rate_limited: int
    """Adds delayed by backoff after a failure."""


class WorkQueue(Generic[K]):
    """A coalescing, delaying work queue of hashable keys."""

    def __init__(self, *, clock: Clock, backoff: Backoff | None = None) -> None:
        self._clock = clock
        self._backoff = backoff or Backoff()
        self._ready: deque[K] = deque()
        self._dirty: set[K] = set()
        self._processing: set[K] = set()
        self._deadlines: dict[K, float] = {}
        self._timers: list[tuple[float, int, K]] = []
        self._order = itertools.count()
        self._failures: dict[K, int] = {}
        self._getters: deque[asyncio.Future[None]] = deque()
        self._timer_changed = asyncio.Event()
        self._timer_task: asyncio.Task[None] | None = None
        self._shut_down = False
        self._adds = 0
        self._coalesced = 0
        self._rate_limited = 0

    # -- adding ----------------------------------------------------------------------------------------------

    def add(self, key: K) -> None:
        """Queue ``key`` now (coalesced with a waiting copy)."""
        if self._shut_down:
            return
        self._adds += 1
        if key in self._dirty:
            self._coalesced += 1
            return
        self._dirty.add(key)
        if key not in self._processing:
            self._ready.append(key)
            self._wake_getter()

    def add_after(self, key: K, delay: float) -> None:
        """Queue ``key`` once ``delay`` seconds have passed (the earliest pending deadline wins)."""
        if self._shut_down:
            return
        if delay <= 0:
            self.add(key)
            return
        deadline = self._clock.monotonic() + delay
        current = self._deadlines.get(key)
        if current is not None and current <= deadline:
            self._coalesced += 1
            return
        self._deadlines[key] = deadline
        heapq.heappush(self._timers, (deadline, next(self._order), key))
        if self._timers[0][2] == key:
            self._timer_changed.set()
        if self._timer_task is None or self._timer_task.done():
            self._timer_task = asyncio.get_running_loop().create_task(self._run_timers())

    def add_rate_limited(self, key: K) -> float:
        """Queue ``key`` after its backoff delay, counting one more failure; returns the delay."""
        failures = self._failures.get(key, 0) + 1
        self._failures[key] = failures
        delay = self._backoff.after_failures(failures)
        self._rate_limited += 1
        self.add_after(key, delay)
        return delay

    def forget(self, key: K) -> None:
        """Reset ``key``'s failure count (after a success)."""
        self._failures.pop(key, None)

    def failures(self, key: K) -> int:
        return self._failures.get(key, 0)

    # -- taking ----------------------------------------------------------------------------------------------

    async def get(self) -> K:
        """The next key; it is processing until ``done(key)``. Raises ``QueueShutDown`` once shut down."""
        while not self._ready:
            if self._shut_down:
                raise QueueShutDown()
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._getters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                # If this getter had already been woken, pass the wake-up on so no key is stranded.
                if waiter.done() and not waiter.cancelled():
                    self._wake_getter()
                else:
                    waiter.cancel()
                raise
        if self._shut_down:
            raise QueueShutDown()
        key = self._ready.popleft()
        self._dirty.discard(key)
        self._processing.add(key)
        return key

    def done(self, key: K) -> None:
        """Finish processing ``key``; if it was added meanwhile, queue it again."""
        self._processing.discard(key)
        if key in self._dirty and not self._shut_down:
            self._ready.append(key)
            self._wake_getter()

    # -- lifecycle -------------------------------------------------------------------------------------------

    @property
    def is_shut_down(self) -> bool:
        return self._shut_down

    def shut_down(self) -> None:
        """Stop handing out keys: waiting and future ``get`` calls raise ``QueueShutDown``."""
        self._shut_down = True
        while self._getters:
            getter = self._getters.popleft()
            if not getter.done():
                getter.set_result(None)
        self._timer_changed.set()

    async def aclose(self) -> None:
        """Shut down and stop the delay timer."""
        self.shut_down()
        task, self._timer_task = self._timer_task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def statistics(self) -> QueueStatistics:
        return QueueStatistics(
            depth=len(self._ready),
            processing=len(self._processing),
            delayed=len(self._deadlines),
            adds=self._adds,
            coalesced=self._coalesced,
            rate_limited=self._rate_limited,
        )

    # -- internals -------------------------------------------------------------------------------------------

    def _wake_getter(self) -> None:
        while self._getters:
            getter = self._getters.popleft()
            if not getter.done():
                getter.set_result(None)
                return

    async def _run_timers(self) -> None:
        while not self._shut_down:
            self._release_due()
            if not self._timers:
                return
            self._timer_changed.clear()
            await wait_event(self._clock, self._timer_changed, self._timers[0][0] - self._clock.monotonic())

    def _release_due(self) -> None:
        now = self._clock.monotonic()
        while self._timers and self._timers[0][0] <= now:
            deadline, _, key = heapq.heappop(self._timers)
            if self._deadlines.get(key) == deadline:
                del self._deadlines[key]
                self.add(key)
