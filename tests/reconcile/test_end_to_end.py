"""The runtime over every client, on the real clock: the sample reconciler drives a Task through its phases,
and two controller instances fail over through a Lease served by the embedded API."""

from __future__ import annotations

import asyncio
from pathlib import Path

from loopd.resources.client import LEASES, TASKS, ResourceClient, open_http_client
from loopd.resources.reconcile import Backoff, Informer, InformerEvent, LeaderElection, Manager, Request, Result
from loopd.resources.reconcile.example import TaskPhaseReconciler
from tests.support.waiting import eventually

from .conftest import HISTORY, Target, serve_api
from .helpers import FaultyClient, task


async def phase_of(client: ResourceClient, name: str) -> tuple[str | None, int | None]:
    status = (await client.get(TASKS, name, namespace="default")).get("status") or {}
    return status.get("phase"), status.get("observedRevision")


async def test_the_sample_reconciler_moves_a_task_through_its_phases(target: Target) -> None:
    client = target.client
    seen: list[Request] = []
    manager = Manager(client, drain_timeout=5.0)
    manager.add_controller(TASKS, TaskPhaseReconciler(client, on_reconcile=seen.append), workers=2)
    runner = asyncio.ensure_future(manager.run())
    try:
        listing = await client.list(TASKS, namespace="default")
        async with client.open_watch(TASKS, namespace="default", resource_version=listing.resource_version) as events:
            await client.create(TASKS, task("t1"))
            phases: list[str | None] = []
            async with asyncio.timeout(30):  # bounds a hang only
                async for event in events:
                    phase = (event.object.get("status") or {}).get("phase")
                    if event.type != "BOOKMARK" and (not phases or phases[-1] != phase):
                        phases.append(phase)
                    if phase == "Succeeded":
                        break
        assert phases == [None, "Pending", "Running", "Succeeded"]
        # A new revision (the server re-waking the responder) restarts the phases.
        await client.patch(TASKS, "t1", {"spec": {"revision": 2}}, namespace="default")
        outcome: list[tuple[str | None, int | None]] = []

        async def finished() -> bool:
            outcome[:] = [await phase_of(client, "t1")]
            return outcome[0] == ("Succeeded", 2)

        await eventually(finished, what="the new revision to finish")
        assert all(request == Request("t1", "default") for request in seen)
        await eventually(lambda: manager.statistics().controllers[0].in_flight == 0)
        stats = manager.statistics().controllers[0]
        assert stats.succeeded >= 6 and stats.failed == 0
    finally:
        manager.shutdown()
        await asyncio.wait_for(runner, 10)


async def test_an_informer_relists_after_its_resume_point_expired(target: Target) -> None:
    client = FaultyClient(target.client)
    seen: list[tuple[str, str]] = []

    def record(event: InformerEvent) -> None:
        seen.append((event.type, event.object["metadata"]["name"]))

    informer = Informer(
        client, TASKS, namespace="default", watch_timeout=1.0, retry_backoff=Backoff(base=0.05, max_delay=0.2)
    )
    informer.add_handler(record)
    runner = asyncio.ensure_future(informer.run())
    try:
        await target.client.create(TASKS, task("kept"))
        await target.client.create(TASKS, task("removed"))
        await eventually(lambda: len(seen) == 2)
        client.failing_watches = True  # the watch ends within a second and cannot be reopened
        await eventually(lambda: informer.statistics().errors > 0)
        await target.client.delete(TASKS, "removed", namespace="default")
        for index in range(HISTORY + 5):  # push the informer's resume point out of the retained history
            await target.client.patch(TASKS, "kept", {"metadata": {"labels": {"n": str(index)}}}, namespace="default")
        for _ in range(5):  # the store compacts its history in the background, on its pump's next turn
            await asyncio.sleep(0)
        client.failing_watches = False
        await eventually(lambda: informer.statistics().expired == 1 and informer.statistics().lists == 2)
        assert ("DELETED", "removed") in seen
        assert informer.cache_keys() == [("default", "kept")]
        cached = informer.get("kept", "default")
        assert cached is not None and cached["metadata"]["labels"] == {"n": str(HISTORY + 4)}
        await target.client.create(TASKS, task("after"))
        await eventually(lambda: ("ADDED", "after") in seen)
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)


async def test_controllers_fail_over_through_a_lease_on_the_embedded_api(tmp_path: Path) -> None:
    async with (
        serve_api(tmp_path) as kubeconfig,
        open_http_client(kubeconfig) as client_a,
        open_http_client(kubeconfig) as client_b,
    ):
        partitioned_a = FaultyClient(client_a)
        reconciled: dict[str, list[str]] = {"a": [], "b": []}
        managers: dict[str, Manager] = {}
        runners: list[asyncio.Task[None]] = []
        for identity, client in (("a", partitioned_a), ("b", client_b)):

            async def reconcile(request: Request, identity: str = identity) -> Result:
                reconciled[identity].append(request.name)
                return Result()

            manager = Manager(
                client,
                leader_election=LeaderElection(
                    "controllers", identity=identity, lease_duration=6.0, renew_deadline=4.0, retry_period=0.2
                ),
                drain_timeout=2.0,
            )
            manager.add_controller(TASKS, reconcile)
            managers[identity] = manager
            runners.append(asyncio.ensure_future(manager.run()))
            if identity == "a":
                await eventually(lambda: managers["a"].leading)
        try:
            await client_b.create(TASKS, task("first"))
            await eventually(lambda: "first" in reconciled["a"])
            assert not managers["b"].leading and reconciled["b"] == []

            partitioned_a.failing = True  # a loses the API: it must step down, then b takes over
            await eventually(lambda: not managers["a"].leading)
            await eventually(lambda: managers["b"].leading)
            lease = await client_b.get(LEASES, "controllers", namespace="default")
            assert lease["spec"]["holderIdentity"] == "b"
            assert lease["spec"]["leaseTransitions"] == 1

            await client_b.create(TASKS, task("second"))
            await eventually(lambda: "second" in reconciled["b"])
            assert "second" not in reconciled["a"]
        finally:
            for manager in managers.values():
                manager.shutdown()
            await asyncio.wait_for(asyncio.gather(*runners), 10)
