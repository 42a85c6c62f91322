"""The one Clock: the contract both clocks keep, and the virtual clock's own controls."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from datetime import UTC, datetime

import pytest

from loopd._infra.clock import (
    Clock,
    SystemClock,
    VirtualClock,
    settle,
    sleep_until,
    wait_all,
    wait_event,
    wait_first,
    with_timeout,
)


@pytest.fixture(params=["system", "virtual"])
def any_clock(request: pytest.FixtureRequest) -> Clock:
    return SystemClock() if request.param == "system" else VirtualClock()


async def test_wall_time_is_aware_utc_and_agrees_with_the_float(any_clock: Clock) -> None:
    now = any_clock.now()
    assert now.tzinfo is not None and now.utcoffset() == UTC.utcoffset(None)
    assert abs(any_clock.time() - now.timestamp()) < 1.0


async def test_monotonic_time_never_goes_backwards(any_clock: Clock) -> None:
    before = any_clock.monotonic()
    await any_clock.sleep(0)
    await any_clock.sleep(-1)  # a past deadline returns at once
    assert any_clock.monotonic() >= before


async def test_with_timeout_returns_the_result_of_what_finishes_in_time(any_clock: Clock) -> None:
    async def quick() -> str:
        await asyncio.sleep(0)
        return "done"

    assert await with_timeout(any_clock, quick(), 5.0) == "done"


async def test_wait_event_sees_an_event_already_set(any_clock: Clock) -> None:
    event = asyncio.Event()
    event.set()
    assert await wait_event(any_clock, event, 0)
    assert not await wait_event(any_clock, asyncio.Event(), 0)


async def test_the_virtual_clock_wakes_sleepers_in_deadline_order() -> None:
    clock = VirtualClock()
    woke: list[tuple[str, float]] = []

    async def sleeper(name: str, seconds: float) -> None:
        await clock.sleep(seconds)
        woke.append((name, clock.monotonic()))

    tasks = [asyncio.ensure_future(sleeper(name, seconds)) for name, seconds in (("late", 3), ("early", 1), ("mid", 2))]
    await clock.advance(2.5)
    assert woke == [("early", 1.0), ("mid", 2.0)]
    assert clock.monotonic() == 2.5
    spent = await clock.run_until(lambda: len(woke) == 3)
    assert woke[-1] == ("late", 3.0) and spent == 0.5
    await asyncio.gather(*tasks)


async def test_run_until_reports_a_virtual_deadlock() -> None:
    clock = VirtualClock()
    with pytest.raises(TimeoutError, match="nothing is sleeping"):
        await clock.run_until(lambda: False)
    sleeper = asyncio.ensure_future(clock.sleep(7200))
    with pytest.raises(TimeoutError, match="within 60"):
        await clock.run_until(lambda: False, limit=60)
    sleeper.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await sleeper


async def test_virtual_wall_time_moves_with_monotonic_time() -> None:
    clock = VirtualClock(wall_start=datetime(2031, 5, 6, 7, 8, 9, tzinfo=UTC))
    await clock.advance(61.5)
    assert clock.now() == datetime(2031, 5, 6, 7, 9, 10, 500000, tzinfo=UTC)
    assert clock.time() == clock.now().timestamp()
    assert clock.monotonic() == 61.5
    with pytest.raises(ValueError, match="backwards"):
        await clock.advance(-1)
    with pytest.raises(ValueError, match="aware"):
        VirtualClock(wall_start=datetime(2031, 1, 1))


async def test_sleep_until_wakes_at_a_monotonic_deadline() -> None:
    clock = VirtualClock(start=100.0)
    sleeper = asyncio.ensure_future(sleep_until(clock, 130.0))
    await clock.advance(29.9)
    assert not sleeper.done()
    await clock.advance(0.1)
    assert sleeper.done()
    assert clock.sleepers == 0


async def test_timeouts_are_measured_on_the_clock() -> None:
    clock = VirtualClock()
    never = asyncio.Event()
    waiting = asyncio.ensure_future(wait_event(clock, never, 10.0))
    await clock.advance(9.0)
    assert not waiting.done()
    await clock.advance(1.0)
    assert waiting.done() and waiting.result() is False

    forever = asyncio.ensure_future(asyncio.Event().wait())
    timed = asyncio.ensure_future(with_timeout(clock, forever, 5.0))
    await clock.advance(5.0)
    with pytest.raises(TimeoutError, match=r"5\.0 s"):
        await timed
    assert forever.cancelled()


async def test_wait_first_and_wait_all_report_what_finished() -> None:
    clock = VirtualClock()
    first = asyncio.ensure_future(clock.sleep(1))
    second = asyncio.ensure_future(clock.sleep(3))
    racing = asyncio.ensure_future(wait_first(clock, [first, second], 10))
    await clock.advance(1)
    assert racing.result() == {first}
    gathering = asyncio.ensure_future(wait_all(clock, [first, second], 1.5))
    await clock.advance(1.5)
    assert gathering.result() is False  # the second wakes at 3, after the 1.5 s limit (which ended at 2.5)
    await clock.advance(0.5)
    assert await wait_all(clock, [first, second], 1) is True


async def test_settle_runs_everything_that_needs_no_time() -> None:
    steps: list[int] = []

    async def chain(depth: int) -> None:
        for index in range(depth):
            steps.append(index)
            await asyncio.sleep(0)

    task = asyncio.ensure_future(chain(20))
    await settle()
    assert task.done() and len(steps) == 20


def test_both_clocks_satisfy_the_protocol() -> None:
    def accepts(clock: Clock) -> Callable[[], float]:
        return clock.monotonic

    assert accepts(SystemClock())() > 0
    assert accepts(VirtualClock())() == 0.0
