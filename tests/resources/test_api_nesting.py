"""Deeply nested request bodies get a Kubernetes 400 ``BadRequest`` Status from the resource API, never a 500."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator

import httpx
import pytest

from loopd.resources._api import MAX_BODY_DEPTH
from tests.resources.conftest import RunningApi

TASKS = "/apis/loopd.dev/v1alpha1/namespaces/default/tasks"
TASK = '{"apiVersion":"loopd.dev/v1alpha1","kind":"Task","metadata":{"name":"t1"},"spec":{"target":{"kind":"operator","key":"r"},"x":DEEP}}'  # noqa: E501


@pytest.fixture
async def client(api: RunningApi) -> AsyncIterator[httpx.AsyncClient]:
    context = ssl.create_default_context(cafile=str(api.credentials.ca_cert_file))
    headers = {"Authorization": f"Bearer {api.credentials.token}"}
    async with httpx.AsyncClient(base_url=api.url, verify=context, headers=headers, timeout=10) as http:
        yield http


def _deep(levels: int) -> str:
    return '{"a":' * levels + "1" + "}" * levels


def _assert_bad_request(response: httpx.Response) -> None:
    assert response.status_code == 400, response.text
    body = response.json()
    assert (body["kind"], body["reason"], body["code"]) == ("Status", "BadRequest", 400)
    assert "levels deep" in body["message"]


@pytest.mark.parametrize("levels", [MAX_BODY_DEPTH + 1, 500, 900, 5000])
async def test_deep_bodies_are_bad_requests(client: httpx.AsyncClient, levels: int) -> None:
    json_body = {"Content-Type": "application/json"}
    _assert_bad_request(await client.post(TASKS, content=TASK.replace("DEEP", _deep(levels)), headers=json_body))
    created = await client.post(TASKS, content=TASK.replace("DEEP", "1"), headers=json_body)
    assert created.status_code == 201, created.text
    for media in ("application/merge-patch+json", "application/apply-patch+yaml"):
        patched = await client.patch(
            f"{TASKS}/t1?fieldManager=test",
            content='{"metadata":{"labels":' + _deep(levels) + "}}",
            headers={"Content-Type": media},
        )
        _assert_bad_request(patched)
    deep_yaml = "metadata:\n  labels:\n    a: " + "[" * levels + "1" + "]" * levels + "\n"
    _assert_bad_request(
        await client.patch(
            f"{TASKS}/t1?fieldManager=test", content=deep_yaml, headers={"Content-Type": "application/apply-patch+yaml"}
        )
    )
