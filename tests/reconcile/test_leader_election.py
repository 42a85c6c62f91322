"""Leader election on Leases: one leader at a time, failover on a crash or a partition, release on shutdown.
Two managers share one in-memory API; the virtual clock makes lease expiry exact."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest

from loopd.resources.client import LEASES, TASKS, InMemoryClient
from loopd.resources.reconcile import LeaderElection, LeaderElector, Manager, Request, Result, VirtualClock

from .helpers import FaultyClient, shut_down, task

RETRY_PERIOD = 2.0


def election(name: str, identity: str, namespace: str = "default") -> LeaderElection:
    """15 s leases, 10 s renew deadline, 2 s retry period (client-go's defaults)."""
    return LeaderElection(
        name,
        namespace=namespace,
        identity=identity,
        lease_duration=15.0,
        renew_deadline=10.0,
        retry_period=RETRY_PERIOD,
    )


class Instance:
    """One controller process: a manager with leader election, through its own (faultable) connection."""

    def __init__(self, identity: str, memory: InMemoryClient, clock: VirtualClock) -> None:
        self.identity = identity
        self.connection = FaultyClient(memory)
        self.reconciled: list[tuple[float, str]] = []
        self.clock = clock
        self.manager = Manager(
            self.connection,
            clock=clock,
            leader_election=election("controller", identity, namespace="loopd"),
            drain_timeout=5.0,
        )
        self.manager.add_controller(TASKS, self.reconcile)
        self.runner: asyncio.Task[None] | None = None

    async def reconcile(self, request: Request) -> Result:
        self.reconciled.append((self.clock.monotonic(), request.name))
        return Result()

    def start(self) -> None:
        self.runner = asyncio.ensure_future(self.manager.run())

    @property
    def leading(self) -> bool:
        return self.manager.leading


MakePair = Callable[[], tuple["Instance", "Instance"]]


@pytest.fixture
async def pair(memory: InMemoryClient, clock: VirtualClock) -> AsyncIterator[Callable[[], tuple[Instance, Instance]]]:
    made: list[Instance] = []

    def make() -> tuple[Instance, Instance]:
        a, b = Instance("a", memory, clock), Instance("b", memory, clock)
        made.extend((a, b))
        return a, b

    yield make
    for instance in made:
        if instance.runner is not None and not instance.runner.done():
            await shut_down(clock, instance.manager, instance.runner)


async def holder(memory: InMemoryClient) -> str:
    lease = await memory.get(LEASES, "controller", namespace="loopd")
    return str(lease["spec"]["holderIdentity"])


async def test_only_one_of_two_instances_leads_and_reconciles(
    pair: MakePair, memory: InMemoryClient, clock: VirtualClock
) -> None:
    a, b = pair()
    a.start()
    await clock.run_until(lambda: a.leading)
    b.start()
    await memory.create(TASKS, task("t1"))
    await clock.advance(60)
    assert a.leading and not b.leading
    assert [name for _, name in a.reconciled] == ["t1"]
    assert b.reconciled == []
    assert await holder(memory) == "a"
    lease = await memory.get(LEASES, "controller", namespace="loopd")
    assert lease["spec"]["leaseDurationSeconds"] == 15
    assert lease["spec"]["leaseTransitions"] == 0
    leader = a.manager.statistics().leader
    assert leader is not None and leader.renewals == 30


async def test_a_partitioned_leader_steps_down_and_the_standby_takes_over_after_the_lease_expires(
    pair: MakePair, memory: InMemoryClient, clock: VirtualClock
) -> None:
    a, b = pair()
    a.start()
    await clock.run_until(lambda: a.leading)
    b.start()
    await clock.advance(1.0)  # b has seen the lease (at t=0); a renews every 2 s
    renewed_at = 0.0
    a.connection.failing = True  # from t=1 a can no longer reach the API: its last renewal was at t=0
    failed_at = clock.monotonic()
    await clock.run_until(lambda: not a.leading)
    assert clock.monotonic() == pytest.approx(renewed_at + 10.0), "a steps down at its renew deadline"
    assert await holder(memory) == "a"  # the lease still names a: b must wait for it to expire
    await clock.run_until(lambda: b.leading)
    # b last saw the record change at t=0 (a's last renewal); it may take over 15 s later, at its next try.
    assert 15.0 <= clock.monotonic() <= 15.0 + RETRY_PERIOD
    assert clock.monotonic() > failed_at + 10.0, "never two leaders: a had stopped before b started"
    assert await holder(memory) == "b"
    lease = await memory.get(LEASES, "controller", namespace="loopd")
    assert lease["spec"]["leaseTransitions"] == 1
    await memory.create(TASKS, task("after-failover"))
    await clock.run_until(lambda: any(name == "after-failover" for _, name in b.reconciled))
    assert all(name != "after-failover" for _, name in a.reconciled)


async def test_losing_leadership_cancels_in_flight_reconciles(memory: InMemoryClient, clock: VirtualClock) -> None:
    connection = FaultyClient(memory)
    cancelled = asyncio.Event()

    async def long_running(request: Request) -> Result:
        try:
            await clock.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return Result()

    manager = Manager(connection, clock=clock, leader_election=election("solo", "a"))
    manager.add_controller(TASKS, long_running)
    await memory.create(TASKS, task("t"))
    runner = asyncio.ensure_future(manager.run())
    try:
        await clock.run_until(lambda: manager.statistics().controllers[0].in_flight == 1)
        connection.fail_resources = {LEASES}
        connection.failing = True
        await clock.run_until(cancelled.is_set)
        assert clock.monotonic() == 10.0
        assert not manager.leading
        leader = manager.statistics().leader
        assert leader is not None and leader.losses == 1
        # Once the API is reachable again and the lease expired, it campaigns and leads again.
        connection.failing = False
        await clock.run_until(lambda: manager.leading)
        assert await holder_of(memory, "solo") == "a"
    finally:
        await shut_down(clock, manager, runner)


async def holder_of(memory: InMemoryClient, name: str) -> str:
    lease = await memory.get(LEASES, name, namespace="default")
    return str(lease["spec"]["holderIdentity"])


async def test_graceful_shutdown_releases_the_lease_for_a_quick_failover(
    pair: MakePair, memory: InMemoryClient, clock: VirtualClock
) -> None:
    a, b = pair()
    a.start()
    await clock.run_until(lambda: a.leading)
    b.start()
    await clock.advance(3.0)
    a.manager.shutdown()
    assert a.runner is not None
    await clock.run_until(a.runner.done)
    assert await holder(memory) == ""
    stopped_at = clock.monotonic()
    await clock.run_until(lambda: b.leading)
    assert clock.monotonic() - stopped_at <= RETRY_PERIOD, "no need to wait for the lease to expire"
    lease = await memory.get(LEASES, "controller", namespace="loopd")
    assert lease["spec"]["holderIdentity"] == "b"
    assert lease["spec"]["leaseTransitions"] == 1


async def test_two_candidates_racing_for_a_free_lease_elect_exactly_one(
    memory: InMemoryClient, clock: VirtualClock
) -> None:
    first = LeaderElector(memory, election("race", "x"), clock=clock)
    second = LeaderElector(memory, election("race", "y"), clock=clock)
    results = await asyncio.gather(first.try_acquire_or_renew(), second.try_acquire_or_renew())
    assert sorted(results) == [False, True]
    # Renewing keeps the winner; the loser keeps losing until the lease expires.
    winner, loser = (first, second) if results[0] else (second, first)
    await clock.advance(14.0)
    assert await winner.try_acquire_or_renew()
    assert not await loser.try_acquire_or_renew()


def test_timings_must_leave_a_safety_margin() -> None:
    with pytest.raises(ValueError, match="renew_deadline"):
        LeaderElection("x", lease_duration=10.0, renew_deadline=10.0, retry_period=2.0)
