"""``loopd.runtime``'s ``task.watch`` with its Tasks on the real kube-apiserver (``open_runtime(kubeconfig=...)``,
an operator ServiceAccount with least-privilege RBAC), answering questions of a real loop-server.

The loop-server here is the in-process ``loopd up`` (its own Task store); the test mirrors each question's Task into
the real API (what a server on a real cluster does itself), so the runtime's watch, claim (status write) and leader
election all go through the real API server with exactly the RBAC the Helm chart grants an operator (the Router's
ServiceAccount, rendered from deploy/helm/loopd)."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from loopd.resources.client import LEASES, TASKS, open_http_client
from loopd.runtime import Result, Runtime, Task, open_runtime
from loopd.runtime._tasks import CLAIM_DELAY
from loopd.server._composition import RunningServer, UpSettings, open_loop_server
from tests.k8s.chart import chart_component_kubeconfig
from tests.k8s.cluster import KubeCluster
from tests.support.waiting import eventually


@pytest.fixture
async def loop_server(tmp_path: Path) -> AsyncIterator[RunningServer]:
    async with open_loop_server(UpSettings(data_dir=tmp_path / "data", port=0)) as running:
        yield running


class Echo:
    """Answers with the question, idempotently — after working long enough that the runtime writes the Task's status
    first (a Task completed before its claim is due is never claimed: the server deletes it)."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.seen: list[Task] = []

    async def reconcile(self, task: Task) -> Result | None:
        self.seen.append(task)
        context = await self.rt.task.get(task.id)
        if context.response.status == "streaming":
            await self.rt.chat.answer(task.id, context.input.text)
        await asyncio.sleep(CLAIM_DELAY * 2)  # "work" past the claim's delay
        await self.rt.chat.complete(task.id)
        return None


async def _ask(http: httpx.AsyncClient, text: str) -> dict[str, Any]:
    conversation = (await http.post("/v1/conversations", json={"name": text[:40]})).json()["id"]
    body = {"target": {"kind": "operator", "key": "echo"}, "text": text}
    answer = await http.post(f"/v1/conversations/{conversation}/messages", json=body)
    assert answer.status_code == 201, answer.text
    return dict(answer.json())


async def test_task_watch_answers_tasks_served_by_the_real_api(
    kube_cluster: KubeCluster, loopd_crds: list[str], loop_server: RunningServer
) -> None:
    namespace = f"rt-{secrets.token_hex(4)}"
    kubeconfig = chart_component_kubeconfig(kube_cluster, namespace, "router")
    token = loop_server.token_file.read_text().strip()
    async with (
        httpx.AsyncClient(base_url=loop_server.url, headers={"Authorization": f"Bearer {token}"}, timeout=15) as http,
        open_http_client(kube_cluster.kubeconfig_dict(namespace=namespace)) as admin,
        open_runtime(
            data_dir=loop_server.data_dir, kubeconfig=str(kubeconfig), namespace=namespace, request_timeout=15.0
        ) as rt,
    ):
        await rt.register("echo")
        echo = Echo(rt)
        rt.task.watch("echo", echo, workers=2, leader_election="echo-operator")
        runner = asyncio.create_task(rt.run())
        try:
            await eventually(lambda: rt.managers and all(m.leading for m in rt.managers), what="the watch to lead")
            asked = [await _ask(http, f"question {i}") for i in range(3)]
            for question in asked:
                await admin.create(
                    TASKS,
                    {
                        "apiVersion": TASKS.api_version,
                        "kind": TASKS.kind,
                        "metadata": {"name": question["task_id"]},
                        "spec": {"target": {"kind": "operator", "key": "echo"}, "revision": 1},
                    },
                    namespace=namespace,
                )
            # A Task addressed to someone else is left alone.
            await admin.create(
                TASKS,
                {
                    "apiVersion": TASKS.api_version,
                    "kind": TASKS.kind,
                    "metadata": {"name": "theirs"},
                    "spec": {"target": {"kind": "operator", "key": "other"}, "revision": 1},
                },
                namespace=namespace,
            )
            for question in asked:

                async def completed(question: dict[str, Any] = question) -> bool:
                    page = await http.get(
                        f"/v1/conversations/{question['conversation_id']}/messages", params={"limit": 1000}
                    )
                    found = next(m for m in page.json()["data"] if m["id"] == question["response"]["id"])
                    return bool(found["status"] == "completed")

                await eventually(completed, timeout=30, what="the answer")

            async def claimed() -> bool:
                listing = await admin.list(TASKS, namespace=namespace)
                mine = [t for t in listing.items if t["metadata"]["name"] != "theirs"]
                return len(mine) == 3 and all(
                    (t.get("status") or {}).get("responder") == "operator:echo"
                    and (t.get("status") or {}).get("phase") == "Running"
                    and (t.get("status") or {}).get("observedRevision") == 1
                    for t in mine
                )

            await eventually(claimed, timeout=30, what="the Tasks' status to name the responder")
            theirs = await admin.get(TASKS, "theirs", namespace=namespace)
            assert "status" not in theirs or not theirs["status"]
            lease = await admin.get(LEASES, "echo-operator", namespace=namespace)
            assert lease["spec"]["holderIdentity"]
        finally:
            rt.shutdown()
            await asyncio.wait_for(runner, 30)
        assert {t.id for t in echo.seen} == {q["task_id"] for q in asked}
        assert all(t.namespace == namespace and t.uid for t in echo.seen)
        (manager,) = rt.managers
        assert manager.statistics().controllers[0].failed == 0
