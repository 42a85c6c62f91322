"""LongHorizon's resource calls with only the rights the chart grants its ServiceAccount, on the real kube-apiserver.

The chart installs the CRDs from crds/ and lets LongHorizon only read them: its start (``rt.ensure_crds``) must then
find them up to date without writing. Every call of its `RunStore` (Runs, Executions, Audits, their status, the
release from the Task, the delete) must be allowed; writing a CRD must not be.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from loopd.operators.longhorizon import (
    Audit,
    AuditSpec,
    AuditStatus,
    Execution,
    ExecutionSpec,
    ExecutionStatus,
    ObjectRef,
    Run,
    RunSpec,
    RunStatus,
    RunStore,
    crds,
)
from loopd.resources import ObjectMeta, ResourceError
from loopd.resources.client import TASKS, ResourceType, open_http_client
from loopd.runtime import Forbidden, Task, open_runtime
from loopd.server._composition import RunningServer, UpSettings, open_loop_server
from tests.k8s.chart import chart_component_kubeconfig
from tests.k8s.cluster import KubeCluster
from tests.support.waiting import eventually

CONVERSATION_LABEL = "longhorizon.loopd.dev/conversation"  # the label RunStore.list_runs selects on
RUNS, EXECUTIONS, AUDITS = (
    ResourceType("longhorizon.loopd.dev", "v1alpha1", kind, f"{kind.lower()}s")
    for kind in ("Run", "Execution", "Audit")
)


@pytest.fixture
async def loop_server(tmp_path: Path) -> AsyncIterator[RunningServer]:
    async with open_loop_server(UpSettings(data_dir=tmp_path / "data", port=0)) as running:
        yield running


async def test_longhorizon_works_its_resources_with_only_the_charts_rights(
    kube_cluster: KubeCluster, loopd_crds: list[str], loop_server: RunningServer
) -> None:
    namespace = f"lh-{secrets.token_hex(4)}"
    kubeconfig = chart_component_kubeconfig(kube_cluster, namespace, "longhorizon")
    async with (
        open_http_client(kube_cluster.kubeconfig_dict(namespace=namespace)) as admin,
        open_runtime(
            data_dir=loop_server.data_dir, kubeconfig=str(kubeconfig), namespace=namespace, request_timeout=15.0
        ) as rt,
    ):
        # Its start: the CRDs from crds/ are there and current, so reading them is enough.
        established = await rt.ensure_crds(crds())
        assert sorted(crd["metadata"]["name"] for crd in established) == sorted(
            ["runs.longhorizon.loopd.dev", "executions.longhorizon.loopd.dev", "audits.longhorizon.loopd.dev"]
        )
        changed = crds()[0]
        changed["spec"]["names"]["shortNames"] = ["lhrun", "another"]
        with pytest.raises(Forbidden):
            await rt.ensure_crds([changed])

        # A fresh API server serves a new CRD's objects and a new Role a moment after they exist (429 "storage is
        # (re)initializing", 403 until the RBAC cache has the binding): an operator's reconcile retries; here, wait.
        resources = await rt.resource_client()

        async def serving() -> bool | None:
            for kind in (RUNS, EXECUTIONS, AUDITS):
                try:
                    await resources.get(kind, "absent", namespace=namespace)
                except ResourceError as exc:
                    if exc.code != 404:
                        return None
            return True

        await eventually(serving, what="the API server to serve LongHorizon's kinds to its ServiceAccount")

        # The Task a question made (the server creates it), then the Run the operator makes for it.
        task = Task.from_object(
            await admin.create(
                TASKS,
                {
                    "apiVersion": TASKS.api_version,
                    "kind": TASKS.kind,
                    "metadata": {"name": "q1"},
                    "spec": {"target": {"kind": "operator", "key": "longhorizon"}, "revision": 1},
                },
                namespace=namespace,
            )
        )
        store = RunStore(rt)
        run = await store.create_run(
            Run(
                metadata=ObjectMeta(name=task.id, labels={CONVERSATION_LABEL: "c1"}),
                spec=RunSpec(conversation=ObjectRef(name="c1"), inputMessageID="m1", goal="write hello.txt"),
            ),
            owner=task,
        )
        assert [r.metadata.name for r in await store.list_runs(conversation="c1")] == [task.id]
        run = await store.write_run_status(run, RunStatus(phase="Planning", round=1, budget=25))

        execution = await store.ensure_execution(
            Execution(
                metadata=ObjectMeta(name=f"{task.id}-r1"),
                spec=ExecutionSpec(run=task.id, round=1, contract_version=1, plan="write it"),
            ),
            run,
        )
        execution = await store.write_execution_status(execution, ExecutionStatus(phase="Completed"))
        assert (await store.get_execution(f"{task.id}-r1")).status == execution.status
        audit = await store.ensure_audit(
            Audit(
                metadata=ObjectMeta(name=f"{task.id}-r1"),
                spec=AuditSpec(
                    run=task.id,
                    round=1,
                    contract_version=1,
                    execution=ObjectRef(name=f"{task.id}-r1", uid=str(execution.metadata.uid)),
                ),
            ),
            run,
        )
        await store.write_audit_status(audit, AuditStatus(phase="Completed"))

        await store.release_run(run)
        released = await store.get_run(task.id)
        assert not released.metadata.owner_references
        await store.delete_run(released)
        assert await store.find_run(task.id) is None
