"""Background lanes: named inference runs ("hustles") outside a turn's critical path, with caps, journaled.

`HustleLanes` runs each hustle on one of two lanes (``blocking``: someone waits for the result; ``background``:
nobody does), each with a concurrency cap and a queue cap (`loopd.harness.core.hustles.admit`); past both caps a
new hustle is refused with `HustleQueueFullError`, and the refusal is recorded (`HustleRefused`). Its start is
recorded (`HustleStarted`) before it runs and its end (`HustleCompleted` / `HustleFailed`) before its owner hears
of it, through the ``record`` callback: a session journals them; another owner (loop-server's conversation titles)
records them where it keeps its own facts.

Closing the lanes (shutdown) cancels what runs and records nothing more: the journal keeps the hustle open, and
the restore resumes it (if its kind can be re-run from the journal) or fails it (`core.hustles.on_restore`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from loopd._infra.clock import Clock
from loopd._infra.ids import new_id
from loopd._infra.tasks import TaskSet
from loopd.harness._errors import HarnessError
from loopd.harness.core import ZERO_USAGE, Usage
from loopd.harness.core.events import HustleCompleted, HustleFailed, HustleRefused, HustleStarted
from loopd.harness.core.hustles import EMPTY_HUSTLES, LANES, HustleInfo, LaneLimits, LaneName, admit, apply_hustles

HustleEvent = HustleStarted | HustleCompleted | HustleFailed | HustleRefused
DEFAULT_LANES: Mapping[LaneName, LaneLimits] = MappingProxyType(
    {"blocking": LaneLimits(concurrency=4, queue=16), "background": LaneLimits(concurrency=2, queue=8)}
)


class HustleQueueFullError(HarnessError):
    """A lane's concurrency and queue are both full: the hustle was not started (its refusal is recorded as
    `HustleRefused`)."""


@dataclass(frozen=True, slots=True)
class HustleResult:
    """What a hustle produced: its model usage and its value (a summary, a title…)."""

    value: Any = None
    usage: Usage = ZERO_USAGE


HustleEnd = Callable[[str, HustleResult | BaseException], None]
"""Told once when a hustle ends (after its end is recorded): its id and its result, or the error it failed with."""


@dataclass(frozen=True, slots=True)
class LaneStatistics:
    lane: LaneName
    running: int
    waiting: int
    limits: LaneLimits


class HustleLanes:
    """The lanes of one owner (a session, or loop-server). Use `submit`; close with `aclose`."""

    def __init__(
        self,
        record: Callable[[HustleEvent], Awaitable[object]],
        *,
        clock: Clock,
        limits: Mapping[LaneName, LaneLimits] | None = None,
        name: str = "hustles",
    ) -> None:
        self._record = record
        self._clock = clock
        self._limits = dict(DEFAULT_LANES)
        self._limits.update(limits or {})
        self._slots = {lane: asyncio.Semaphore(self._limits[lane].concurrency) for lane in LANES}
        self._running = dict.fromkeys(LANES, 0)
        self._waiting = dict.fromkeys(LANES, 0)
        self._tasks = TaskSet(name)
        self._infos: Mapping[str, HustleInfo] = EMPTY_HUSTLES

    @property
    def infos(self) -> Mapping[str, HustleInfo]:
        """The open hustles, as folded from the recorded events (the session's ``state.hustles``)."""
        return self._infos

    def reset(self, infos: Mapping[str, HustleInfo]) -> None:
        """Start from the open hustles a restore folded from the journal."""
        self._infos = infos

    def apply(self, event: HustleEvent) -> None:
        """Fold a recorded hustle event (the owner calls it when the record is durable; a refusal opens nothing)."""
        if not isinstance(event, HustleRefused):
            self._infos = apply_hustles(self._infos, event)

    @property
    def busy(self) -> bool:
        """Whether any hustle is admitted and not ended."""
        return len(self._tasks) > 0

    def statistics(self) -> tuple[LaneStatistics, ...]:
        return tuple(
            LaneStatistics(
                lane=lane, running=self._running[lane], waiting=self._waiting[lane], limits=self._limits[lane]
            )
            for lane in LANES
        )

    def submit(
        self,
        name: str,
        lane: LaneName,
        run: Callable[[], Awaitable[HustleResult]],
        *,
        on_end: HustleEnd,
        loop: str | None = None,
        params: Mapping[str, Any] | None = None,
        resume: str | None = None,
    ) -> str:
        """Admit a hustle and start it; its id. ``resume``: the id of an open hustle to re-run (not recorded again).

        Raises `HustleQueueFullError` when the lane's caps are reached: nothing is started, and the refusal is
        recorded (`HustleRefused`, in the background: the caller hears of it at once).
        """
        limits = self._limits[lane]
        # Admitted hustles take the lane's slots first, then its queue (a task may not have taken its slot yet).
        admitted = self._running[lane] + self._waiting[lane]
        running = min(admitted, limits.concurrency)
        if admit(limits, running=running, waiting=admitted - running) == "refuse":
            reason = f"the {lane} lane is full ({limits.concurrency} running, {limits.queue} waiting)"
            refused = HustleRefused(name=name, lane=lane, for_loop=loop, reason=reason, at=self._clock.time())
            self._tasks.start(self._record_refusal(refused), name=f"loopd-hustle-refused-{name}")
            raise HustleQueueFullError(f"{reason}: {name} not started")
        hustle_id = resume or new_id()
        started = HustleStarted(
            hustle_id=hustle_id, name=name, lane=lane, for_loop=loop, params=dict(params or {}), at=self._clock.time()
        )
        self._waiting[lane] += 1
        self._tasks.start(self._run(started, run, on_end, record_start=resume is None), name=f"loopd-hustle-{name}")
        return hustle_id

    async def _run(
        self,
        started: HustleStarted,
        run: Callable[[], Awaitable[HustleResult]],
        on_end: HustleEnd,
        *,
        record_start: bool,
    ) -> None:
        lane = started.lane
        hid = started.hustle_id
        queued = True
        try:
            if record_start:
                await self._record(started)
            async with self._slots[lane]:
                queued = False
                self._waiting[lane] -= 1
                self._running[lane] += 1
                try:
                    result = await run()
                finally:
                    self._running[lane] -= 1
        except asyncio.CancelledError:
            raise  # shutdown: the hustle stays open in the record; the restore decides
        except Exception as exc:
            try:
                await self._record(
                    HustleFailed(hustle_id=hid, error_type=type(exc).__name__, message=str(exc), at=self._clock.time())
                )
            finally:
                on_end(hid, exc)
            return
        finally:
            if queued:
                self._waiting[lane] -= 1
        await self._record(HustleCompleted(hustle_id=hid, usage=result.usage, at=self._clock.time()))
        on_end(hid, result)

    async def _record_refusal(self, refused: HustleRefused) -> None:
        await self._record(refused)

    async def fail(self, info: HustleInfo, message: str) -> None:
        """Record that an open hustle ended without a result (a restore that cannot resume it)."""
        await self._record(
            HustleFailed(hustle_id=info.hustle_id, error_type="NotResumed", message=message, at=self._clock.time())
        )

    async def aclose(self) -> None:
        """Cancel every hustle and wait for them to end (their records stay open)."""
        await self._tasks.aclose()

    def abort(self) -> None:
        """Cancel every hustle now, without waiting (a crash, or a session fault)."""
        for task in self._tasks:
            task.cancel()
