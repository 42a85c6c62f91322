"""`Sweeper`: one background asyncio task that runs a bounded unit of work every ``interval`` seconds.

Used for completions left ``closing`` and for Human deadlines. Each tick is bounded in time (``tick_timeout``) and
in work (the tick itself takes a batch limit); the interval is slept on the given ``Clock``. An error in a tick is
logged and the next tick runs as usual.
``asyncio.CancelledError`` is never swallowed: `stop` cancels the task and waits for it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from loopd._infra.clock import Clock, SystemClock

_log = logging.getLogger(__name__)


class Sweeper:
    def __init__(
        self,
        name: str,
        tick: Callable[[], Awaitable[int]],
        *,
        interval: float = 1.0,
        tick_timeout: float = 30.0,
        clock: Clock | None = None,
    ) -> None:
        if not (interval > 0) or not (tick_timeout > 0):
            raise ValueError("interval and tick_timeout must be positive")
        self.name = name
        self._tick = tick
        self._interval = interval
        self._tick_timeout = tick_timeout
        self._clock = clock or SystemClock()
        self._task: asyncio.Task[None] | None = None
        self.ticks = 0
        """How many ticks ran (for tests and statistics)."""

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        if self.running:
            return
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"loopd-sweeper-{self.name}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # we are being cancelled ourselves, not just our sweeper

    async def _run(self) -> None:
        while True:
            try:
                async with asyncio.timeout(self._tick_timeout):
                    await self._tick()
            except Exception:
                _log.exception("sweeper %s: tick failed", self.name)
            self.ticks += 1
            await self._clock.sleep(self._interval)
