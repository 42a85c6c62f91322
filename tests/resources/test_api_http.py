"""The Kubernetes-compatible API over real HTTPS: discovery, CRUD, Status bodies, watch streams, auth."""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from loopd.resources import TASK_KIND, ApiCredentials
from tests.resources.conftest import RunningApi, open_running_api
from tests.resources.helpers import task
from tests.support.waiting import eventually

TASKS = "/apis/loopd.dev/v1alpha1/namespaces/default/tasks"
AGGREGATED = (
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,"
    "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json"
)
TABLE = (
    "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
)


@pytest.fixture
async def client(api: RunningApi) -> AsyncIterator[httpx.AsyncClient]:
    context = ssl.create_default_context(cafile=str(api.credentials.ca_cert_file))
    async with httpx.AsyncClient(
        base_url=api.url,
        verify=context,
        headers={"Authorization": f"Bearer {api.credentials.token}"},
        timeout=10,
    ) as http:
        yield http


def assert_status(response: httpx.Response, code: int, reason: str) -> dict[str, Any]:
    assert response.status_code == code, response.text
    body = response.json()
    assert (body["kind"], body["apiVersion"], body["status"], body["code"], body["reason"]) == (
        "Status",
        "v1",
        "Failure",
        code,
        reason,
    )
    return dict(body)


async def test_version_is_public_and_selects_kubectl_132(api: RunningApi) -> None:
    context = ssl.create_default_context(cafile=str(api.credentials.ca_cert_file))
    async with httpx.AsyncClient(base_url=api.url, verify=context, timeout=10) as anonymous:
        version = (await anonymous.get("/version", params={"timeout": "5s"})).json()
        assert (version["major"], version["minor"]) == ("1", "32")
        assert_status(await anonymous.get(TASKS), 401, "Unauthorized")
        wrong = await anonymous.get(TASKS, headers={"Authorization": "Bearer nope"})
        assert_status(wrong, 401, "Unauthorized")


async def test_legacy_discovery(client: httpx.AsyncClient) -> None:
    assert (await client.get("/api")).json()["versions"] == ["v1"]
    core = (await client.get("/api/v1")).json()
    assert {r["name"] for r in core["resources"]} == {"namespaces", "namespaces/status"}
    groups = {g["name"] for g in (await client.get("/apis")).json()["groups"]}
    assert {"loopd.dev", "coordination.k8s.io", "apiextensions.k8s.io"} <= groups
    group = (await client.get("/apis/loopd.dev")).json()
    assert group["preferredVersion"]["groupVersion"] == "loopd.dev/v1alpha1"
    resources = (await client.get("/apis/loopd.dev/v1alpha1")).json()["resources"]
    tasks = next(r for r in resources if r["name"] == "tasks")
    assert tasks["kind"] == "Task" and tasks["namespaced"] and tasks["shortNames"] == ["tk"]
    assert any(r["name"] == "tasks/status" for r in resources)
    assert_status(await client.get("/apis/nope.dev/v1"), 404, "NotFound")


async def test_aggregated_discovery_has_the_exact_content_type(client: httpx.AsyncClient) -> None:
    response = await client.get("/apis", headers={"Accept": AGGREGATED})
    assert response.headers["content-type"] == "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
    body = response.json()
    assert body["kind"] == "APIGroupDiscoveryList" and body["apiVersion"] == "apidiscovery.k8s.io/v2"
    loopd = next(item for item in body["items"] if item["metadata"]["name"] == "loopd.dev")
    resource = loopd["versions"][0]["resources"][0]
    assert resource["responseKind"] == {"group": "loopd.dev", "version": "v1alpha1", "kind": "Task"}
    assert resource["subresources"][0]["subresource"] == "status"
    core = (await client.get("/api", headers={"Accept": AGGREGATED})).json()
    assert core["items"][0]["versions"][0]["resources"][0]["resource"] == "namespaces"
    plain = await client.get("/apis", headers={"Accept": "application/json"})
    assert plain.headers["content-type"] == "application/json" and plain.json()["kind"] == "APIGroupList"


async def test_openapi_v3_is_enough_for_kubectl_apply(client: httpx.AsyncClient) -> None:
    assert (await client.get("/openapi/v2")).status_code == 404
    index = (await client.get("/openapi/v3")).json()["paths"]
    url = index["apis/loopd.dev/v1alpha1"]["serverRelativeURL"]
    assert url.startswith("/openapi/v3/apis/loopd.dev/v1alpha1?hash=")
    document = (await client.get(url)).json()
    item = document["paths"]["/apis/loopd.dev/v1alpha1/namespaces/{namespace}/tasks/{name}"]
    assert item["patch"]["x-kubernetes-group-version-kind"] == {
        "group": "loopd.dev",
        "version": "v1alpha1",
        "kind": "Task",
    }
    assert "fieldValidation" in {p["name"] for p in item["patch"]["parameters"]}


async def test_crud_and_status_bodies(client: httpx.AsyncClient) -> None:
    created = await client.post(TASKS, json=task("t1"), params={"fieldManager": "test", "fieldValidation": "Strict"})
    assert created.status_code == 201
    body = created.json()
    assert body["metadata"]["uid"] and body["metadata"]["resourceVersion"]
    assert_status(await client.post(TASKS, json=task("t1")), 409, "AlreadyExists")
    got = (await client.get(f"{TASKS}/t1")).json()
    stale = dict(got, spec={**got["spec"], "revision": 2})
    assert (await client.put(f"{TASKS}/t1", json=stale)).status_code == 200
    conflict = assert_status(await client.put(f"{TASKS}/t1", json=stale), 409, "Conflict")
    assert conflict["details"] == {"name": "t1", "group": "loopd.dev", "kind": "tasks"}
    status = await client.patch(
        f"{TASKS}/t1/status",
        content=json.dumps({"status": {"phase": "Running"}}),
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert status.json()["status"] == {"phase": "Running"}
    assert (await client.get(f"{TASKS}/t1/status")).json()["status"] == {"phase": "Running"}
    json_patch = await client.patch(
        f"{TASKS}/t1",
        content=json.dumps([{"op": "replace", "path": "/spec/revision", "value": 3}]),
        headers={"Content-Type": "application/json-patch+json"},
    )
    assert json_patch.json()["spec"]["revision"] == 3
    deleted = await client.request("DELETE", f"{TASKS}/t1", json={"propagationPolicy": "Background"})
    assert deleted.status_code == 200
    missing = assert_status(await client.get(f"{TASKS}/t1"), 404, "NotFound")
    assert missing["message"] == 'tasks.loopd.dev "t1" not found'


async def test_invalid_object_is_422_with_causes(client: httpx.AsyncClient) -> None:
    bad = task("bad")
    del bad["spec"]["target"]["key"]
    body = assert_status(await client.post(TASKS, json=bad), 422, "Invalid")
    assert body["details"]["causes"] == [
        {"reason": "FieldValueRequired", "message": "Required value", "field": "spec.target.key"}
    ]
    assert body["details"]["kind"] == "Task"


async def test_bad_input_is_4xx_never_500(client: httpx.AsyncClient, api: RunningApi) -> None:
    assert_status(
        await client.post(TASKS, content=b"{not json", headers={"Content-Type": "application/json"}), 400, "BadRequest"
    )
    assert_status(await client.post(TASKS, json=["a list"]), 400, "BadRequest")
    assert_status(await client.get(TASKS, params={"labelSelector": "a in ("}), 400, "BadRequest")
    assert_status(await client.get(TASKS, params={"limit": "many"}), 400, "BadRequest")
    await api.store.create(TASK_KIND, task("t1"))
    unsupported = await client.patch(f"{TASKS}/t1", content=b"{}", headers={"Content-Type": "text/plain"})
    assert_status(unsupported, 415, "UnsupportedMediaType")
    huge = await client.post(TASKS, content=b" " * (3 * 1024 * 1024 + 1), headers={"Content-Type": "application/json"})
    assert_status(huge, 413, "RequestEntityTooLarge")
    assert_status(await client.get("/apis/loopd.dev/v1alpha1/tasks/t1"), 404, "NotFound")  # namespaced needs ns
    assert_status(await client.get(f"{TASKS}/t1/scale"), 404, "NotFound")
    assert_status(await client.delete(TASKS), 405, "MethodNotAllowed")
    assert_status(await client.get("/api/v1/namespaces/default/events"), 404, "NotFound")


async def test_tables_for_kubectl_get(client: httpx.AsyncClient, api: RunningApi) -> None:
    await api.store.create(TASK_KIND, task("t1", labels={"app": "x"}))
    table = (await client.get(TASKS, headers={"Accept": TABLE}, params={"includeObject": "Metadata"})).json()
    assert table["kind"] == "Table"
    assert [c["name"] for c in table["columnDefinitions"]] == [
        "Name",
        "Target-Kind",
        "Target",
        "Revision",
        "Phase",
        "Responder",
        "Age",
    ]
    row = table["rows"][0]
    assert row["cells"][:6] == ["t1", "operator", "router", 1, None, None]
    assert row["object"]["kind"] == "PartialObjectMetadata"
    assert row["object"]["metadata"]["labels"] == {"app": "x"}


async def read_events(response: httpx.Response, count: int) -> list[dict[str, Any]]:
    received: list[dict[str, Any]] = []
    async for line in response.aiter_lines():
        if line.strip():
            received.append(json.loads(line))
            if len(received) == count:
                break
    return received


async def test_watch_stream_from_a_resource_version(client: httpx.AsyncClient, api: RunningApi) -> None:
    listed = (await client.get(TASKS)).json()
    params = {"watch": "true", "resourceVersion": listed["metadata"]["resourceVersion"], "allowWatchBookmarks": "true"}
    async with client.stream("GET", TASKS, params=params) as response:
        assert response.status_code == 200
        await api.store.create(TASK_KIND, task("t1"))
        await api.store.patch(TASK_KIND, "t1", {"status": {"phase": "Done"}}, subresource="status")
        received = await read_events(response, 3)
    assert [e["type"] for e in received] == ["ADDED", "MODIFIED", "BOOKMARK"]
    assert received[1]["object"]["status"] == {"phase": "Done"}
    assert received[2]["object"]["metadata"]["resourceVersion"] == received[1]["object"]["metadata"]["resourceVersion"]


async def test_watch_timeout_ends_the_stream(client: httpx.AsyncClient) -> None:
    params = {"watch": "1", "resourceVersion": "0", "timeoutSeconds": "1"}
    async with client.stream("GET", TASKS, params=params) as response:
        lines = [line async for line in response.aiter_lines() if line.strip()]
    assert lines == []


async def test_watch_from_a_compacted_version_sends_410_expired(tmp_path: Path, credentials: ApiCredentials) -> None:
    async with open_running_api(tmp_path, credentials, event_window=3, poll_interval=0.05) as api:
        context = ssl.create_default_context(cafile=str(api.credentials.ca_cert_file))
        headers = {"Authorization": f"Bearer {api.credentials.token}"}
        async with httpx.AsyncClient(base_url=api.url, verify=context, headers=headers, timeout=10) as http:
            start = await api.store.current_resource_version()
            for index in range(20):
                await api.store.create(TASK_KIND, task(f"t{index}"))
            params = {"watch": "true", "resourceVersion": start, "timeoutSeconds": "1"}

            async def expired_watch() -> list[dict[str, Any]] | None:
                async with http.stream("GET", TASKS, params=params) as response:
                    assert response.status_code == 200
                    first = await read_events(response, 1)
                return first if first and first[0]["type"] == "ERROR" else None

            # Compaction runs in the background: wait until a watch from `start` expires, not for time.
            expired = await eventually(expired_watch, what="the watch from a compacted version to expire")
            status = expired[0]["object"]
            assert (status["kind"], status["code"], status["reason"]) == ("Status", 410, "Expired")
            relisted = (await http.get(TASKS)).json()
            assert len(relisted["items"]) == 20


async def test_watch_with_a_malformed_version_is_400(client: httpx.AsyncClient) -> None:
    response = await client.get(TASKS, params={"watch": "true", "resourceVersion": "abc"})
    assert_status(response, 400, "BadRequest")


async def test_watch_in_table_form_sends_columns_once(client: httpx.AsyncClient, api: RunningApi) -> None:
    params = {"watch": "true", "resourceVersion": await api.store.current_resource_version()}
    async with client.stream("GET", TASKS, params=params, headers={"Accept": TABLE}) as response:
        await api.store.create(TASK_KIND, task("t1"))
        await api.store.create(TASK_KIND, task("t2"))
        received = await read_events(response, 2)
    assert [e["object"]["kind"] for e in received] == ["Table", "Table"]
    assert received[0]["object"]["columnDefinitions"] and not received[1]["object"]["columnDefinitions"]
    assert received[1]["object"]["rows"][0]["cells"][0] == "t2"
