"""`Sweeper`: a bounded unit of work run every ``interval`` seconds by ``run()``, in a task its owner holds.

Used for completions left ``closing`` and for Human deadlines. Each tick is bounded in time (``tick_timeout``) and
in work (the tick itself takes a batch limit); the interval is slept on the given ``Clock``. An error in a tick is
logged and the next tick runs as usual.
The sweeper starts no task of its own: its owner runs ``run()`` in a TaskGroup (the server app's lifespan runs
every sweeper in one) and ends it by cancelling that task. ``asyncio.CancelledError`` is never swallowed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from loopd._infra.clock import Clock, SystemClock

_log = logging.getLogger(__name__)


class Sweeper:
    """Runs ``tick`` (a bounded batch; its count is ignored) every ``interval`` seconds of ``clock`` while ``run()``
    runs."""

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
        self.ticks = 0
        """How many ticks ran (for tests and statistics)."""

    async def run(self) -> None:
        """Tick every ``interval`` until cancelled (a tick's error is logged; the next tick runs as usual)."""
        while True:
            try:
                async with asyncio.timeout(self._tick_timeout):
                    await self._tick()
            except Exception:
                _log.exception("sweeper %s: tick failed", self.name)
            self.ticks += 1
            await self._clock.sleep(self._interval)
