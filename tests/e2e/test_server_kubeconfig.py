"""loop-server with its Tasks on a remote Kubernetes API, reached through a kubeconfig (`kube_api="kubeconfig"`).

The remote API is loopd's own Kubernetes-compatible API over a store that nothing else reconciles (the real
kube-apiserver variant is tests/k8s): a chat to the built-in assistant creates its Task there, in the configured
namespace, and is answered; the server serves no embedded API of its own; ``/readyz`` is 200 while that API answers
and 503 (naming it) once it is gone.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx

from loopd.harness.tools import resolve_sandbox
from loopd.resources import (
    StoreOptions,
    load_or_create_credentials,
    open_api_server,
    open_sqlite_store,
    render_kubeconfig,
)
from loopd.resources.client import TASKS, StoreClient
from loopd.server import UpSettings, open_loop_server
from tests.support.waiting import eventually


async def test_tasks_live_on_the_kubeconfigs_api(tmp_path: Path) -> None:
    remote_dir = tmp_path / "remote"
    remote_dir.mkdir(mode=0o700)
    credentials = load_or_create_credentials(remote_dir)
    async with open_sqlite_store(remote_dir / "resources.db", options=StoreOptions()) as store:
        client = StoreClient(store)
        serving = AsyncExitStack()
        api = await serving.enter_async_context(open_api_server(store, credentials=credentials))
        async with serving:
            kubeconfig = tmp_path / "kubeconfig"
            kubeconfig.write_text(render_kubeconfig(api.url, credentials.ca_pem, credentials.token, namespace="team"))
            settings = UpSettings(
                data_dir=tmp_path / "data",
                port=0,
                kube_api="kubeconfig",
                kubeconfig=kubeconfig,
                namespace="team",
                sandbox=resolve_sandbox("none"),
                holder="loopd server",
            )
            async with open_loop_server(settings) as server:
                assert server.api_url is None and not (server.data_dir / "resources.db").exists()
                token = server.token_file.read_text().strip()
                headers = {"Authorization": f"Bearer {token}"}
                async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=15) as http:
                    assert (await http.get("/readyz")).status_code == 200
                    conversation = (await http.post("/v1/conversations", json={"name": "remote"})).json()["id"]
                    asked = await http.post(
                        f"/v1/conversations/{conversation}/messages",
                        json={"target": {"kind": "harness", "key": "assistant"}, "text": "hello over kubeconfig"},
                    )
                    assert asked.status_code == 201, asked.text
                    task_id = asked.json()["task_id"]
                    created = await client.get(TASKS, task_id, namespace="team")  # on the remote API, in "team"
                    assert created["spec"]["target"] == {"kind": "harness", "key": "assistant"}

                    async def answered() -> dict[str, Any] | None:
                        page = (await http.get(f"/v1/conversations/{conversation}/messages")).json()["data"]
                        response = next(m for m in page if m["id"] == asked.json()["response"]["id"])
                        return response if response["status"] == "completed" else None

                    message = await eventually(answered, timeout=30, what="the answer")
                    assert "hello over kubeconfig" in str(message["content"])
                    await eventually(
                        lambda: _gone(client, task_id), timeout=15, what="the Task to be deleted on the remote API"
                    )

                    await serving.aclose()  # the Kubernetes API goes away
                    refused = await http.get("/readyz")
                    assert refused.status_code == 503, refused.text
                    assert "kubernetes" in refused.json()["error"]["message"].lower()


async def _gone(client: StoreClient, task_id: str) -> bool:
    from loopd.resources import NotFound

    try:
        await client.get(TASKS, task_id, namespace="team")
    except NotFound:
        return True
    return False
