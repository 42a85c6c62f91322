"""Waking keys from outside the watched resources: `Controller.enqueue`, and `bind_controller` on reconcilers —
on the in-memory twin and a virtual clock."""

from __future__ import annotations

import asyncio

from loopd.resources.client import TASKS, InMemoryClient
from loopd.resources.reconcile import Controller, Manager, Request, Result, VirtualClock

from .helpers import shut_down, task


class Bound:
    """A reconciler that keeps its controller (to wake keys later) and records what it reconciles."""

    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock
        self.controllers: list[Controller] = []
        self.log: list[tuple[float, str]] = []
        self.gate: asyncio.Event | None = None

    def bind_controller(self, controller: Controller) -> None:
        self.controllers.append(controller)

    async def reconcile(self, request: Request) -> Result:
        self.log.append((self.clock.monotonic(), request.name))
        if self.gate is not None and request.name == "slow":
            await self.gate.wait()
        return Result(requeue_after=3600.0)  # only an event or an enqueue brings the key back before that

    def names(self) -> list[str]:
        return [name for _, name in self.log]


async def test_the_controller_binds_itself_once_and_enqueue_wakes_a_key_at_once(
    memory: InMemoryClient, clock: VirtualClock
) -> None:
    reconciler = Bound(clock)
    manager = Manager(memory, clock=clock)
    controller = manager.add_controller(TASKS, reconciler, workers=2)
    assert reconciler.controllers == [controller]
    assert controller.enqueue(Request("early", "default")) is False  # no term yet: nothing to queue into
    runner = asyncio.ensure_future(manager.run())
    try:
        await clock.run_until(lambda: manager.leading)
        await memory.create(TASKS, task("t1"))
        await clock.run_until(lambda: reconciler.names() == ["t1"])
        # Its next reconcile is an hour away; an enqueue brings it now (no virtual time passes).
        assert controller.enqueue(Request("t1", "default")) is True
        await clock.run_until(lambda: reconciler.names() == ["t1", "t1"])
        assert [at for at, _ in reconciler.log] == [0.0, 0.0]
        # A key need not be in the cache: the reconciler decides what it means.
        assert controller.enqueue(Request("not-cached", "default")) is True
        await clock.run_until(lambda: "not-cached" in reconciler.names())
    finally:
        await shut_down(clock, manager, runner)
    assert controller.enqueue(Request("t1", "default")) is False  # the term ended


async def test_an_enqueue_during_the_keys_reconcile_runs_it_once_more_afterwards(
    memory: InMemoryClient, clock: VirtualClock
) -> None:
    reconciler = Bound(clock)
    reconciler.gate = asyncio.Event()
    manager = Manager(memory, clock=clock)
    controller = manager.add_controller(TASKS, reconciler, workers=4)
    runner = asyncio.ensure_future(manager.run())
    try:
        await clock.run_until(lambda: manager.leading)
        await memory.create(TASKS, task("slow"))
        await clock.run_until(lambda: reconciler.names() == ["slow"])
        for _ in range(3):  # coalesced into one, and never run concurrently with the one in flight
            assert controller.enqueue(Request("slow", "default"))
        for _ in range(5):
            await asyncio.sleep(0)
        assert reconciler.names() == ["slow"]
        reconciler.gate.set()
        await clock.run_until(lambda: reconciler.names() == ["slow", "slow"])
        for _ in range(5):
            await asyncio.sleep(0)
        assert reconciler.names() == ["slow", "slow"]
        statistics = controller.statistics()
        assert statistics.queue is not None and statistics.queue.coalesced >= 2
    finally:
        await shut_down(clock, manager, runner)


async def test_a_plain_reconcile_function_needs_no_binding(memory: InMemoryClient, clock: VirtualClock) -> None:
    seen: list[str] = []

    async def reconcile(request: Request) -> None:
        seen.append(request.name)

    manager = Manager(memory, clock=clock)
    controller = manager.add_controller(TASKS, reconcile)
    runner = asyncio.ensure_future(manager.run())
    try:
        await clock.run_until(lambda: manager.leading)
        assert controller.enqueue(Request("x", "default"))
        await clock.run_until(lambda: seen == ["x"])
    finally:
        await shut_down(clock, manager, runner)
