"""The reconcile runtime through loopd's kubernetes_asyncio client against the real kube-apiserver, with an
operator-style ServiceAccount that has least-privilege RBAC: informers, controllers writing Task status, and
leader election on real ``coordination.k8s.io`` Leases (graceful hand-over and kill -9 take-over)."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from loopd.resources.client import LEASES, TASKS, ResourceClient, open_http_client
from loopd.resources.reconcile import LeaderElection, Manager, Request, Result
from loopd.resources.reconcile.example import TaskPhaseReconciler
from tests.k8s.cluster import KubeCluster
from tests.support.waiting import eventually

OPERATOR_ROLE = """\
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: loopd-operator, namespace: {ns}}}
rules:
  - apiGroups: [loopd.dev]
    resources: [tasks]
    verbs: [get, list, watch]
  - apiGroups: [loopd.dev]
    resources: [tasks/status]
    verbs: [get, patch, update]
  - apiGroups: [coordination.k8s.io]
    resources: [leases]
    verbs: [get, create, update]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: loopd-operator, namespace: {ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: loopd-operator}}
subjects:
  - {{kind: ServiceAccount, name: operator, namespace: {ns}}}
"""

# Graceful hand-over releases the Lease (a standby takes it within retry_period), so a long lease costs nothing there
# and keeps a loaded machine from making the leader miss a renewal; a killed leader's Lease must expire (KILL).
FAST = {"lease_duration": 10.0, "renew_deadline": 8.0, "retry_period": 0.5}
KILL = {"lease_duration": 6.0, "renew_deadline": 5.0, "retry_period": 0.5}


def operator_kubeconfig(cluster: KubeCluster, namespace: str) -> Path:
    """A kubeconfig of ServiceAccount ``operator`` bound to OPERATOR_ROLE only."""
    path = cluster.service_account_kubeconfig(namespace, "operator")
    cluster.apply(OPERATOR_ROLE.format(ns=namespace))
    return path


def task(name: str, namespace: str, *, key: str = "router", revision: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": TASKS.api_version,
        "kind": TASKS.kind,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"target": {"kind": "operator", "key": key}, "revision": revision},
    }


@asynccontextmanager
async def running(manager: Manager) -> AsyncIterator[asyncio.Task[None]]:
    runner = asyncio.ensure_future(manager.run())
    try:
        yield runner
    finally:
        manager.shutdown()
        await asyncio.wait_for(runner, 20)


async def lease_holder(client: ResourceClient, name: str, namespace: str) -> str | None:
    lease = await client.get(LEASES, name, namespace=namespace)
    holder: str | None = (lease.get("spec") or {}).get("holderIdentity")
    return holder


def test_the_operator_account_has_only_its_role(kube_cluster: KubeCluster, loopd_crds: list[str]) -> None:
    namespace = kube_cluster.create_namespace("rbac")
    kubeconfig = operator_kubeconfig(kube_cluster, namespace)

    def can(*args: str) -> bool:
        result = kube_cluster.kubectl("auth", "can-i", *args, "-n", namespace, kubeconfig=kubeconfig, check=False)
        return result.stdout.strip() == "yes"

    assert can("watch", "tasks.loopd.dev") and can("patch", "tasks.loopd.dev", "--subresource=status")
    assert can("update", "leases.coordination.k8s.io")
    assert not can("create", "tasks.loopd.dev")
    assert not can("delete", "tasks.loopd.dev")
    assert not can("list", "secrets")
    assert not can("watch", "tasks.loopd.dev", "--all-namespaces")


async def test_a_controller_drives_tasks_through_its_phases(kube_cluster: KubeCluster, loopd_crds: list[str]) -> None:
    namespace = kube_cluster.create_namespace("phases")
    kubeconfig = operator_kubeconfig(kube_cluster, namespace)
    async with (
        open_http_client(kube_cluster.kubeconfig_dict(namespace=namespace)) as admin,
        open_http_client(kubeconfig) as client,
    ):
        assert client.default_namespace == namespace
        seen: list[Request] = []
        manager = Manager(client, drain_timeout=5.0)
        manager.add_controller(
            TASKS, TaskPhaseReconciler(client, on_reconcile=seen.append), namespace=namespace, workers=2
        )
        async with running(manager):
            for index in range(3):
                await admin.create(TASKS, task(f"t{index}", namespace), namespace=namespace)

            async def phases() -> list[tuple[str | None, int | None]]:
                listing = await admin.list(TASKS, namespace=namespace)
                return [
                    ((t.get("status") or {}).get("phase"), (t.get("status") or {}).get("observedRevision"))
                    for t in listing.items
                ]

            await eventually(lambda: _all(phases(), ("Succeeded", 1)), timeout=30, what="every Task to reach Succeeded")
            await admin.patch(TASKS, "t1", {"spec": {"revision": 2}}, namespace=namespace)

            async def restarted() -> bool:
                status = (await admin.get(TASKS, "t1", namespace=namespace)).get("status") or {}
                return (status.get("phase"), status.get("observedRevision")) == ("Succeeded", 2)

            await eventually(restarted, timeout=30, what="the new revision to be reconciled")
        assert {r.name for r in seen} == {"t0", "t1", "t2"}
        stats = manager.statistics()
        assert stats.controllers[0].failed == 0
        assert stats.informers[0].errors == 0


async def _all(values: Any, wanted: tuple[str, int]) -> bool:
    got = await values
    return bool(got) and all(v == wanted for v in got)


async def test_two_managers_elect_one_leader_and_hand_over_on_shutdown(
    kube_cluster: KubeCluster, loopd_crds: list[str]
) -> None:
    namespace = kube_cluster.create_namespace("lead")
    kubeconfig = operator_kubeconfig(kube_cluster, namespace)
    reconciled: dict[str, list[str]] = {"a": [], "b": []}

    def reconciler(identity: str) -> Any:
        async def reconcile(request: Request) -> Result:
            reconciled[identity].append(request.name)
            return Result()

        return reconcile

    async with (
        open_http_client(kube_cluster.kubeconfig_dict(namespace=namespace)) as admin,
        open_http_client(kubeconfig) as client_a,
        open_http_client(kubeconfig) as client_b,
    ):
        managers = {
            identity: Manager(
                client,
                leader_election=LeaderElection("ops", namespace=namespace, identity=identity, **FAST),
                drain_timeout=5.0,
            )
            for identity, client in (("a", client_a), ("b", client_b))
        }
        for identity, manager in managers.items():
            manager.add_controller(TASKS, reconciler(identity), namespace=namespace)
        runners = {identity: asyncio.ensure_future(manager.run()) for identity, manager in managers.items()}
        try:
            leader = await eventually(
                lambda: next((i for i, m in managers.items() if m.leading), None), timeout=30, what="a leader"
            )
            standby = "b" if leader == "a" else "a"
            assert await lease_holder(admin, "ops", namespace) == leader
            await admin.create(TASKS, task("first", namespace), namespace=namespace)
            await eventually(lambda: "first" in reconciled[leader], timeout=30, what="the leader to reconcile")
            assert not managers[standby].leading
            assert reconciled[standby] == []

            managers[leader].shutdown()  # graceful: drains, releases the Lease
            await asyncio.wait_for(runners[leader], 20)
            await eventually(lambda: managers[standby].leading, timeout=30, what="the standby to take over")
            assert await lease_holder(admin, "ops", namespace) == standby
            await admin.create(TASKS, task("second", namespace), namespace=namespace)
            await eventually(lambda: "second" in reconciled[standby], timeout=30, what="the new leader to reconcile")
            assert "second" not in reconciled[leader]
            stats = managers[standby].statistics().leader
            assert stats is not None and stats.acquisitions == 1 and stats.losses == 0
        finally:
            for manager in managers.values():
                manager.shutdown()
            for runner in runners.values():
                await asyncio.wait_for(runner, 20)


_LEADER_PROCESS = textwrap.dedent(
    """
    import asyncio, sys
    from loopd.resources.client import TASKS, open_http_client
    from loopd.resources.reconcile import LeaderElection, Manager, Result

    async def reconcile(request):
        return Result()

    async def main(kubeconfig, namespace):
        async with open_http_client(kubeconfig) as client:
            election = LeaderElection(
                "ops", namespace=namespace, identity="killed", lease_duration=6.0, renew_deadline=5.0,
                retry_period=0.5,
            )
            manager = Manager(client, leader_election=election)
            manager.add_controller(TASKS, reconcile, namespace=namespace)
            await manager.run()

    asyncio.run(main(sys.argv[1], sys.argv[2]))
    """
)


@pytest.mark.slow
async def test_a_standby_takes_over_the_lease_of_a_killed_leader(
    kube_cluster: KubeCluster, loopd_crds: list[str], tmp_path: Path
) -> None:
    namespace = kube_cluster.create_namespace("kill")
    kubeconfig = operator_kubeconfig(kube_cluster, namespace)
    script = tmp_path / "leader.py"
    script.write_text(_LEADER_PROCESS)
    log = tmp_path / "leader.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, str(script), str(kubeconfig), namespace],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")},
        )
    try:
        async with (
            open_http_client(kube_cluster.kubeconfig_dict(namespace=namespace)) as admin,
            open_http_client(kubeconfig) as client,
        ):

            async def held_by_killed() -> bool:
                assert process.poll() is None, log.read_text()
                try:
                    return await lease_holder(admin, "ops", namespace) == "killed"
                except Exception:  # the Lease does not exist yet
                    return False

            await eventually(held_by_killed, timeout=45, what="the child process to lead")
            standby = Manager(
                client,
                leader_election=LeaderElection("ops", namespace=namespace, identity="standby", **KILL),
                drain_timeout=5.0,
            )
            reconciled: list[str] = []

            async def reconcile(request: Request) -> Result:
                reconciled.append(request.name)
                return Result()

            standby.add_controller(TASKS, reconcile, namespace=namespace)
            async with running(standby):

                def observed_leader() -> bool:
                    leader = standby.statistics().leader
                    return leader is not None and leader.holder == "killed"

                await eventually(observed_leader, timeout=30, what="the standby to observe the leader")
                assert not standby.leading
                os.kill(process.pid, signal.SIGKILL)  # no release: the Lease must expire
                process.wait(timeout=10)
                await eventually(lambda: standby.leading, timeout=30, what="the standby to take over")
                assert await lease_holder(admin, "ops", namespace) == "standby"
                await admin.create(TASKS, task("after", namespace), namespace=namespace)
                await eventually(lambda: "after" in reconciled, timeout=30, what="the new leader to reconcile")
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


@pytest.mark.slow
@pytest.mark.timeout(150)
async def test_a_controller_keeps_working_across_an_api_server_restart(tmp_path: Path) -> None:
    """kube-apiserver stops and starts again (same etcd, same port): the informer's watch ends, it resumes, and the
    leader keeps (or re-takes) its Lease — Tasks created after the restart are reconciled. A cluster of its own, so
    the session's cluster never goes away under other tests."""
    from tests.k8s.cluster import ClusterError, start_cluster
    from tests.k8s.conftest import loopd_crd_manifests

    try:
        cluster = start_cluster(tmp_path / "cluster")
    except ClusterError as exc:
        pytest.fail(f"the real Kubernetes API server did not start: {exc}")
    try:
        cluster.apply(loopd_crd_manifests())
        cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/tasks.loopd.dev", timeout=90)
        namespace = cluster.create_namespace("restart")
        kubeconfig = operator_kubeconfig(cluster, namespace)
        reconciled: list[str] = []

        async def reconcile(request: Request) -> Result:
            reconciled.append(request.name)
            return Result()

        async with (
            open_http_client(cluster.kubeconfig_dict(namespace=namespace)) as admin,
            open_http_client(kubeconfig) as client,
        ):
            manager = Manager(client, leader_election=LeaderElection("ops", namespace=namespace), drain_timeout=5.0)
            manager.add_controller(TASKS, reconcile, namespace=namespace)
            async with running(manager):
                await admin.create(TASKS, task("before", namespace), namespace=namespace)
                await eventually(lambda: "before" in reconciled, timeout=30, what="the first Task reconciled")
                await asyncio.to_thread(cluster.restart_apiserver)
                await admin.create(TASKS, task("after", namespace), namespace=namespace)
                await eventually(lambda: "after" in reconciled, timeout=60, what="a Task made after the restart")
                # A restart that outlasts the renew deadline (a slow machine) costs the lease, as it must; the
                # manager takes it again once the server answers.
                await eventually(lambda: manager.leading, timeout=60, what="the manager leading again")
                stats = manager.statistics()
                assert stats.informers[0].watches >= 2, stats.informers[0]  # the first watch ended with the server
    finally:
        cluster.stop()
        shutil.rmtree(tmp_path / "cluster", ignore_errors=True)  # etcd's WAL alone is 64 MB
