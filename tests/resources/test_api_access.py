"""Responder tokens on the Kubernetes-compatible API: read everything, write leases and the status of own Tasks."""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from loopd.resources import TASK_KIND, create_api_app, open_sqlite_store
from tests.resources.helpers import task

ADMIN = "admin-token"
TOKENS = {"router-token": "operator:router", "echo-token": "operator:echo"}
TASKS = "/apis/loopd.dev/v1alpha1/namespaces/default/tasks"
LEASES = "/apis/coordination.k8s.io/v1/namespaces/default/leases"
MERGE = {"Content-Type": "application/merge-patch+json"}


async def _resolve(token: str) -> str | None:
    return TOKENS.get(token)


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    with tempfile.TemporaryDirectory() as folder:
        async with open_sqlite_store(Path(folder) / "store.db") as store:
            await store.create(TASK_KIND, task("mine", key="router"))
            await store.create(TASK_KIND, task("theirs", key="echo"))
            app = create_api_app(store, token=ADMIN, resolve_token=_resolve)
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as client:
                yield client


def _as(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _forbidden(response: httpx.Response) -> None:
    assert response.status_code == 403, response.text
    body: dict[str, Any] = response.json()
    assert (body["kind"], body["reason"]) == ("Status", "Forbidden")


async def test_a_responder_reads_tasks_and_writes_only_the_status_of_its_own(http: httpx.AsyncClient) -> None:
    router = _as("router-token")
    listed = await http.get(TASKS, headers=router)
    assert listed.status_code == 200
    assert {item["metadata"]["name"] for item in listed.json()["items"]} == {"mine", "theirs"}
    watched = await http.get(TASKS + "?watch=true&timeoutSeconds=1", headers=router)
    assert watched.status_code == 200

    status = {"status": {"phase": "Running", "responder": "operator:router"}}
    own = await http.patch(f"{TASKS}/mine/status", json=status, headers={**router, **MERGE})
    assert own.status_code == 200, own.text
    assert own.json()["status"]["phase"] == "Running"
    _forbidden(await http.patch(f"{TASKS}/theirs/status", json=status, headers={**router, **MERGE}))

    # Not the Task itself (spec, metadata), not creating or deleting Tasks: that is the server's.
    _forbidden(await http.patch(f"{TASKS}/mine", json={"spec": {"revision": 9}}, headers={**router, **MERGE}))
    _forbidden(await http.delete(f"{TASKS}/mine", headers=router))
    _forbidden(await http.post(TASKS, json=task("new", key="router"), headers=router))
    current = (await http.get(f"{TASKS}/mine", headers=router)).json()
    _forbidden(await http.put(f"{TASKS}/mine", json=current, headers=router))
    assert (await http.get(f"{TASKS}/mine", headers=router)).json()["spec"] == current["spec"]


async def test_a_responder_may_use_leases_for_leader_election(http: httpx.AsyncClient) -> None:
    lease = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "router-leader"},
        "spec": {"holderIdentity": "replica-a", "leaseDurationSeconds": 15},
    }
    created = await http.post(LEASES, json=lease, headers=_as("router-token"))
    assert created.status_code == 201, created.text
    renewed = await http.patch(
        f"{LEASES}/router-leader",
        json={"spec": {"holderIdentity": "replica-b"}},
        headers={**_as("router-token"), **MERGE},
    )
    assert renewed.status_code == 200, renewed.text


async def test_a_responder_writes_nothing_else(http: httpx.AsyncClient) -> None:
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "other"}}
    _forbidden(await http.post("/api/v1/namespaces", json=namespace, headers=_as("echo-token")))
    assert (await http.get("/api/v1/namespaces", headers=_as("echo-token"))).status_code == 200


async def test_the_admin_keeps_every_verb_and_unknown_tokens_are_refused(http: httpx.AsyncClient) -> None:
    admin = _as(ADMIN)
    patched = await http.patch(f"{TASKS}/theirs", json={"metadata": {"labels": {"a": "b"}}}, headers={**admin, **MERGE})
    assert patched.status_code == 200, patched.text
    assert (await http.delete(f"{TASKS}/theirs", headers=admin)).status_code == 200
    for headers in (_as("nobody"), {"Authorization": "Basic eDp5"}, {}):
        refused = await http.get(TASKS, headers=headers)
        assert refused.status_code == 401, headers
        assert refused.json()["reason"] == "Unauthorized"


def _crd(group: str, plural: str = "notes") -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "names": {"kind": "Note", "plural": plural},
            "scope": "Namespaced",
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                }
            ],
        },
    }


CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


async def test_an_operator_owns_the_kinds_and_crds_of_its_domain_group(http: httpx.AsyncClient) -> None:
    router, echo = _as("router-token"), _as("echo-token")
    created = await http.post(CRDS, json=_crd("router.loopd.dev"), headers=router)
    assert created.status_code == 201, created.text
    # Another group (another operator's, or any other), by body or by URL: refused.
    _forbidden(await http.post(CRDS, json=_crd("echo.loopd.dev"), headers=router))
    _forbidden(await http.post(CRDS, json=_crd("example.com"), headers=router))
    spoofed = _crd("router.loopd.dev")
    spoofed["spec"]["group"] = "example.com"
    _forbidden(await http.post(CRDS, json=spoofed, headers=router))
    _forbidden(await http.delete(f"{CRDS}/notes.router.loopd.dev", headers=router))
    crd = (await http.get(f"{CRDS}/notes.router.loopd.dev", headers=router)).json()
    updated = await http.put(f"{CRDS}/notes.router.loopd.dev", json=crd, headers=router)
    assert updated.status_code == 200, updated.text
    _forbidden(await http.put(f"{CRDS}/notes.router.loopd.dev", json=crd, headers=echo))

    notes = "/apis/router.loopd.dev/v1/namespaces/default/notes"
    note = {"apiVersion": "router.loopd.dev/v1", "kind": "Note", "metadata": {"name": "n1"}, "spec": {"a": 1}}
    assert (await http.post(notes, json=note, headers=router)).status_code == 201
    patched = await http.patch(f"{notes}/n1", json={"spec": {"a": 2}}, headers={**router, **MERGE})
    assert patched.status_code == 200, patched.text
    _forbidden(await http.patch(f"{notes}/n1", json={"spec": {"a": 3}}, headers={**echo, **MERGE}))
    assert (await http.get(f"{notes}/n1", headers=echo)).status_code == 200  # reading stays open to all
    _forbidden(await http.delete(f"{notes}/n1", headers=echo))
    assert (await http.delete(f"{notes}/n1", headers=router)).status_code == 200
