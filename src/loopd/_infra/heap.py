"""Keep the cyclic garbage collector off what a long-running command built while starting.

A started server holds a few hundred thousand objects it keeps for its whole life: imported modules, pydantic and
JSON schemas, the ASGI app and its routes, configuration. CPython's collector walks every tracked object on each
full (generation 2) collection, and a busy server triggers one every few hundred requests — measured on
``loopd up`` under 100 concurrent chats: ≈ 150 ms per full collection, ≈ 1 ms of CPU per chat (5–6 % of it).

`settle_startup_heap` collects the garbage of starting once, then moves every object still alive into the
collector's permanent generation (`gc.freeze`): full collections then walk only what the server allocated since.
Frozen objects are still freed by reference counting as usual; only a reference cycle among them that becomes
garbage later would stay, which for objects built to live as long as the process is the accepted trade (it is
what `gc.freeze` was added for).

It also sets the collector's thresholds for serving (`SERVING_THRESHOLDS`): CPython's default (700, 10, 10) runs a
young collection every 700 net allocations of container objects, and a request allocates thousands that reference
counting frees anyway (≈ 80 young collections per round of 100 chats on ``loopd up``). Measured on ``loopd up``
under rounds of 100 concurrent chats, 10 rounds on two servers side by side (``/tmp`` hook, session 23): (50000, 20,
100) against the default gave 111.9 against 107.1 chats/s, TTFT p95 752 against 790 ms, 9.5 against 9.95 ms of CPU per
chat. What it costs: cyclic garbage waits for at most 50,000 more allocations before it is freed (a few MB at
worst), and a young collection walks up to that many objects (about a millisecond) where it walked 700.

`CollectorPacer` goes one step further for bursts: while the server has answers to give (the composition's
``OpenAnswers`` is not empty) the automatic collections wait, for at most `COLLECTION_DEFERRAL` seconds at a time.
A young collection in the middle of a burst walks every object the answers in flight hold — all alive — only to
find the few cycles they left: measured on ``loopd up`` under 100 concurrent chats, two collections of ≈ 11 ms per
round (2.5 % of it); once the answers have ended, reference counting has freed nearly all of those objects and the
collection that follows walks little. Turning the collector off for the whole run (an experiment, not a choice:
cycles would never be freed) gave ×1.03 chats/s and ×0.95 TTFT p95 (10 pairs, `benchmarks._chats_ab`). What it
costs: cyclic garbage made during a burst waits for its end (or the bound) before it is freed. A collector someone
else turned off stays off, and one turned on stays on while nothing holds it.

Who calls it: the CLI's serving commands (``loopd up``, ``loopd server``, ``loopd operator``,
``loopd harness serve``) once they are ready — a process-wide decision, so never a library function or a test
helper. Calling it again freezes what was started since (``loopd up``'s operators start after its server).
"""

from __future__ import annotations

import asyncio
import gc
from dataclasses import dataclass
from typing import Final

__all__ = ["COLLECTION_DEFERRAL", "SERVING_THRESHOLDS", "CollectorPacer", "HeapSettled", "settle_startup_heap"]

COLLECTION_DEFERRAL: Final = 2.0
"""Seconds `CollectorPacer` keeps the automatic collections waiting at most, however long the work goes on."""

SERVING_THRESHOLDS: Final = (50_000, 20, 100)
"""The collector's thresholds while a command serves (``gc.set_threshold``; see the module docstring)."""


@dataclass(frozen=True, slots=True)
class HeapSettled:
    collected: int
    """Unreachable objects the collection before freezing found."""
    frozen: int
    """Objects in the permanent generation afterwards (every call's so far)."""


def settle_startup_heap() -> HeapSettled:
    """Collect the garbage of starting, then freeze what is alive and set the serving thresholds (see the module
    docstring)."""
    collected = gc.collect()
    gc.freeze()
    gc.set_threshold(*SERVING_THRESHOLDS)
    return HeapSettled(collected=collected, frozen=gc.get_freeze_count())


class CollectorPacer:
    """Keeps the cyclic collector's automatic runs waiting while work is in flight, for at most ``bound`` seconds
    at a time (see the module docstring). `busy` is the listener to register: ``True`` when work starts, ``False``
    when none is left. Process-wide, like `settle_startup_heap`: for serving commands only."""

    def __init__(self, *, bound: float = COLLECTION_DEFERRAL) -> None:
        if bound <= 0:
            raise ValueError("bound must be positive")
        self._bound = bound
        self._timer: asyncio.TimerHandle | None = None
        self.deferrals = 0
        """How many times the collections were held."""
        self.expired = 0
        """How many holds ended at the bound rather than with the work."""

    @property
    def holding(self) -> bool:
        return self._timer is not None

    def busy(self, busy: bool) -> None:
        """Work started (hold) or none is left (release)."""
        if busy:
            self.hold()
        else:
            self.release()

    def hold(self) -> None:
        """Hold the automatic collections (until `release` or the bound); nothing when held already or when the
        collector is off anyway (not this pacer's to turn on). On the event loop's thread."""
        if self._timer is not None or not gc.isenabled():
            return
        self._timer = asyncio.get_running_loop().call_later(self._bound, self._expire)
        gc.disable()
        self.deferrals += 1

    def release(self) -> None:
        """Let the collections run again (the next allocation starts one when enough have waited)."""
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
            gc.enable()

    def _expire(self) -> None:
        self._timer = None
        self.expired += 1
        gc.enable()
