"""Controllers under a manager (no leader election): wake-ups, coalescing, retry policies, concurrency,
graceful shutdown — on the in-memory twin and a virtual clock, so every timing is exact."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from loopd.resources.client import TASKS, InMemoryClient, ResourceType
from loopd.resources.reconcile import (
    Backoff,
    Manager,
    PermanentError,
    Request,
    Result,
    TemporaryError,
    VirtualClock,
    Watch,
    ignore_status_updates,
    owner_requests,
)

from .helpers import shut_down, task

ReconcileFn = Callable[[Request], Awaitable[Result | None]]
StartManager = Callable[..., Awaitable[Manager]]


class Calls:
    """Records reconcile calls (virtual time, request) and delegates to a behaviour."""

    def __init__(self, clock: VirtualClock, behaviour: ReconcileFn | None = None) -> None:
        self.clock = clock
        self.behaviour = behaviour
        self.log: list[tuple[float, str]] = []

    async def reconcile(self, request: Request) -> Result:
        self.log.append((self.clock.monotonic(), request.name))
        if self.behaviour is None:
            return Result()
        return await self.behaviour(request) or Result()

    def times(self, name: str) -> list[float]:
        return [at for at, called in self.log if called == name]


@pytest.fixture
async def start(memory: InMemoryClient, clock: VirtualClock) -> AsyncIterator[StartManager]:
    runners: list[tuple[Manager, asyncio.Task[None]]] = []

    async def start_manager(
        reconciler: object,
        *,
        workers: int = 1,
        backoff: Backoff | None = None,
        drain_timeout: float = 30.0,
        watches: tuple[Watch, ...] = (),
        event_filter: Callable[..., bool] | None = None,
    ) -> Manager:
        manager = Manager(memory, clock=clock, drain_timeout=drain_timeout)
        manager.add_controller(
            TASKS,
            reconciler,  # type: ignore[arg-type]
            workers=workers,
            backoff=backoff,
            watches=watches,
            event_filter=event_filter,
        )
        runners.append((manager, asyncio.ensure_future(manager.run())))
        await clock.run_until(lambda: manager.leading)
        return manager

    yield start_manager
    for manager, runner in runners:
        await shut_down(clock, manager, runner)


async def test_creating_an_object_calls_reconcile_with_its_key(
    start: StartManager, memory: InMemoryClient, clock: VirtualClock
) -> None:
    calls = Calls(clock)
    await start(calls)
    await memory.create(TASKS, task("t1"))
    await clock.run_until(lambda: len(calls.log) == 1)
    assert calls.log == [(0.0, "t1")]


async def test_objects_existing_at_start_are_reconciled(
    start: StartManager, memory: InMemoryClient, clock: VirtualClock
) -> None:
    await memory.create(TASKS, task("old1"))
    await memory.create(TASKS, task("old2"))
    calls = Calls(clock)
    await start(calls)
    await clock.run_until(lambda: len(calls.log) == 2)
    assert sorted(name for _, name in calls.log) == ["old1", "old2"]


async def test_a_burst_of_changes_during_a_reconcile_coalesces_into_one_more_reconcile(
    start: StartManager, memory: InMemoryClient, clock: VirtualClock
) -> None:
    release = asyncio.Event()
    in_flight = 0
    overlapped = False

    async def slow(request: Request) -> Result:
        nonlocal in_flight, overlapped
        in_flight += 1
        overlapped = overlapped or in_flight > 1
        await release.wait()
        in_flight -= 1
        return Result()

    calls = Calls(clock, slow)
    manager = await start(calls, workers=4)
    created = await memory.create(TASKS, task("t1"))
    await clock.run_until(lambda: len(calls.log) == 1)
    for revision in range(2, 12):  # ten updates while the first reconcile runs
        created["spec"]["revision"] = revision
        created = await memory.update(TASKS, created)
    await clock.advance(0)
    assert len(calls.log) == 1, "never concurrently for one key"
    release.set()
    await clock.run_until(lambda: len(calls.log) == 2)
    await clock.advance(60)
    assert len(calls.log) == 2, "ten wake-ups, one more reconcile"
    assert not overlapped
    queue = manager.statistics().controllers[0].queue
    assert queue is not None and queue.coalesced == 9


async def test_failures_back_off_exponentially_per_key_and_reset_after_success(
    start: StartManager, memory: InMemoryClient, clock: VirtualClock
) -> None:
    failures_left = {"bad": 4}

    async def flaky(request: Request) -> Result:
        if failures_left.get(request.name, 0) > 0:
            failures_left[request.name] -= 1
            raise RuntimeError("boom")
        return Result()

    calls = Calls(clock, flaky)
    manager = await start(calls, backoff=Backoff(base=1.0, factor=2.0, max_delay=60.0, jitter=0))
    await memory.create(TASKS, task("bad"))
    await memory.create(TASKS, task("good"))
    await clock.run_until(lambda: len(calls.times("bad")) == 5)
    assert calls.times("bad") == [0.0, 1.0, 3.0, 7.0, 15.0]
    assert calls.times("good") == [0.0]
    stats = manager.statistics().controllers[0]
    assert (stats.reconciles, stats.succeeded, stats.failed) == (6, 2, 4)
    # The success forgot the failures: the next failure starts over at the base delay.
    failures_left["bad"] = 1
    await memory.patch(TASKS, "bad", {"metadata": {"labels": {"x": "y"}}}, namespace="default")
    await clock.run_until(lambda: len(calls.times("bad")) == 7)
    assert calls.times("bad")[-2:] == [15.0, 16.0]


async def test_temporary_error_retries_after_its_own_delay(
    start: StartManager, memory: InMemoryClient, clock: VirtualClock
) -> None:
    attempts = 0

    async def not_yet(request: Request) -> Result:
        nonlocal attempts
        attempts += 1
        if attempts < 3:
            raise TemporaryError("context not committed yet", delay=7.5)
        return Result()

    calls = Calls(clock, not_yet)
    manager = await start(calls)
    await memory.create(TASKS, task("t"))
    await clock.run_until(lambda: len(calls.log) == 3)
    assert calls.times("t") == [0.0, 7.5, 15.0]
    assert manager.statistics().controllers[0].temporary_errors == 2


async def test_permanent_error_waits_for_the_next_change(
    start: StartManager, memory: InMemoryClient, clock: VirtualClock
) -> None:
    async def refuse(request: Request) -> Result:
        raise PermanentError("spec cannot work")

    calls = Calls(clock, refuse)
    manager = await start(calls)
    await memory.create(TASKS, task("t"))
    await clock.run_until(lambda: len(calls.log) == 1)
    await clock.advance(3600)
    assert len(calls.log) == 1
    await memory.patch(TASKS, "t", {"spec": {"revision": 2}}, namespace="default")
    await clock.run_until(lambda: len(calls.log) == 2)
    assert manager.statistics().controllers[0].permanent_errors == 2


async def test_requeue_after_reconciles_again_on_time(
    start: StartManager, memory: InMemoryClient, clock: VirtualClock
) -> None:
    async def poll(request: Request) -> Result:
        return Result(requeue_after=30.0)

    calls = Calls(clock, poll)
    await start(calls)
    await memory.create(TASKS, task("t"))
    await clock.run_until(lambda: len(calls.log) == 4)
    assert calls.times("t") == [0.0, 30.0, 60.0, 90.0]


async def test_concurrency_is_bounded_by_the_worker_count(
    start: StartManager, memory: InMemoryClient, clock: VirtualClock
) -> None:
    active = 0
    peak = 0

    async def work(request: Request) -> Result:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await clock.sleep(1.0)
        active -= 1
        return Result()

    calls = Calls(clock, work)
    manager = await start(calls, workers=3)
    for index in range(10):
        await memory.create(TASKS, task(f"t{index}"))
    await clock.run_until(lambda: len(calls.log) == 10 and active == 0)
    assert peak == 3
    assert clock.monotonic() == 4.0  # ceil(10 / 3) rounds of one second
    assert manager.statistics().controllers[0].succeeded == 10


async def test_shutdown_drains_in_flight_reconciles(memory: InMemoryClient, clock: VirtualClock) -> None:
    finished: list[str] = []

    async def work(request: Request) -> Result:
        await clock.sleep(5.0)
        finished.append(request.name)
        return Result()

    manager = Manager(memory, clock=clock, drain_timeout=10.0)
    manager.add_controller(TASKS, work, workers=2)
    await memory.create(TASKS, task("a"))
    await memory.create(TASKS, task("b"))
    await memory.create(TASKS, task("c"))
    runner = asyncio.ensure_future(manager.run())
    await clock.run_until(lambda: manager.statistics().controllers[0].in_flight == 2)
    manager.shutdown()
    await clock.run_until(runner.done)
    await runner
    assert finished == ["a", "b"], "in-flight reconciles finish; queued ones are left for the next run"
    assert clock.monotonic() == 5.0
    assert not manager.statistics().running


def _stuck(clock: VirtualClock, cancelled: list[str]) -> Callable[[Request], Awaitable[Result]]:
    """A reconcile that never ends by itself; the names of the requests it was cancelled in go to ``cancelled``."""

    async def stuck(request: Request) -> Result:
        try:
            await clock.sleep(3600)
        except asyncio.CancelledError:
            cancelled.append(request.name)
            raise
        return Result()

    return stuck


async def test_the_drain_timeout_cancels_reconciles_that_take_too_long(
    memory: InMemoryClient, clock: VirtualClock
) -> None:
    cancelled: list[str] = []
    stuck = _stuck(clock, cancelled)
    manager = Manager(memory, clock=clock, drain_timeout=2.0)
    manager.add_controller(TASKS, stuck)
    await memory.create(TASKS, task("a"))
    runner = asyncio.ensure_future(manager.run())
    await clock.run_until(lambda: manager.statistics().controllers[0].in_flight == 1)
    manager.shutdown()
    await clock.run_until(runner.done)
    await runner
    assert cancelled == ["a"]
    assert clock.monotonic() == 2.0
    assert manager.statistics().controllers[0].cancelled == 1


async def test_cancelling_run_is_a_kill_without_a_drain(memory: InMemoryClient, clock: VirtualClock) -> None:
    cancelled: list[str] = []
    stuck = _stuck(clock, cancelled)
    manager = Manager(memory, clock=clock, drain_timeout=30.0)
    manager.add_controller(TASKS, stuck)
    await memory.create(TASKS, task("a"))
    runner = asyncio.ensure_future(manager.run())
    await clock.run_until(lambda: manager.statistics().controllers[0].in_flight == 1)
    started = clock.monotonic()
    runner.cancel()  # a kill: what runs is cancelled at once, nothing drains
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(runner, 10)  # virtual time stands still: only an undrained stop ends it
    assert cancelled == ["a"]
    assert clock.monotonic() == started
    assert not manager.statistics().running


async def test_owned_objects_wake_their_owner(start: StartManager, memory: InMemoryClient, clock: VirtualClock) -> None:
    children = ResourceType("loopd.dev", "v1alpha1", "Execution", "executions")
    calls = Calls(clock)
    await start(calls, watches=(Watch(children, owner_requests(TASKS)),))
    owner = await memory.create(TASKS, task("run1"))
    await clock.run_until(lambda: len(calls.log) == 1)
    await memory.create(
        children,
        {
            "metadata": {
                "name": "run1-exec",
                "namespace": "default",
                "ownerReferences": [
                    {
                        "apiVersion": TASKS.api_version,
                        "kind": "Task",
                        "name": "run1",
                        "uid": owner["metadata"]["uid"],
                        "controller": True,
                    }
                ],
            },
            "spec": {},
        },
    )
    await clock.run_until(lambda: len(calls.log) == 2)
    assert calls.log[-1][1] == "run1"


async def test_a_plain_function_is_a_reconciler(
    start: StartManager, memory: InMemoryClient, clock: VirtualClock
) -> None:
    seen: list[Request] = []

    async def reconcile(request: Request) -> None:
        seen.append(request)

    await start(reconcile)
    await memory.create(TASKS, task("t", namespace="ns1"))
    await clock.run_until(lambda: len(seen) == 1)
    assert seen == [Request("t", "ns1")]


async def test_ignore_status_updates_drops_status_writes_and_keeps_spec_metadata_and_deletion(
    start: StartManager, memory: InMemoryClient, clock: VirtualClock
) -> None:
    """A reconciler's own status writes do not wake it (the Task's generation stays); a spec change, a label, a
    finalizer and the start of a deletion (which bumps the generation) do."""
    calls = Calls(clock)
    manager = await start(calls, event_filter=ignore_status_updates)
    created = await memory.create(
        TASKS, {**task("t1"), "metadata": {"name": "t1", "namespace": "default", "finalizers": ["loopd.dev/test"]}}
    )
    await clock.run_until(lambda: len(calls.log) == 1)

    async def quiet() -> None:
        await clock.advance(1.0)

    current = await memory.update_status(TASKS, {**created, "status": {"phase": "Running"}})
    current = await memory.update_status(TASKS, {**current, "status": {"phase": "Succeeded"}})
    await quiet()
    assert len(calls.log) == 1  # two status writes: no reconcile
    assert manager.statistics().controllers[0].filtered == 2

    current = await memory.update(TASKS, {**current, "spec": {**current["spec"], "revision": 2}})
    await clock.run_until(lambda: len(calls.log) == 2)
    labelled = {**current, "metadata": {**current["metadata"], "labels": {"a": "b"}}}
    current = await memory.update(TASKS, labelled)
    await clock.run_until(lambda: len(calls.log) == 3)
    await memory.delete(TASKS, "t1", namespace="default")  # a finalizer holds it: deletionTimestamp is set
    await clock.run_until(lambda: len(calls.log) == 4)
