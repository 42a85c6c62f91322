"""Arbitrary requests at the ASGI boundary: every answer is a success or a 4xx ``Status``, never a 500."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loopd.resources import TASK_KIND, create_api_app, open_sqlite_store
from tests.resources.helpers import task

json_scalars = st.none() | st.booleans() | st.integers(-(2**31), 2**31) | st.text(max_size=6)
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=10,
)
spec_like = st.fixed_dictionaries(
    {"target": st.fixed_dictionaries({}, optional={"kind": json_values, "key": json_values})},
    optional={"revision": json_values},
)
bodies = st.one_of(
    json_values,
    st.fixed_dictionaries(
        {
            "metadata": st.fixed_dictionaries(
                {"name": st.sampled_from(["t1", "t2", "BAD", ""])}, optional={"labels": json_values}
            )
        },
        optional={
            "spec": spec_like | json_values,
            "status": json_values,
            "apiVersion": json_values,
            "kind": json_values,
        },
    ),
)
paths = st.sampled_from(
    [
        "/apis/loopd.dev/v1alpha1/namespaces/default/tasks",
        "/apis/loopd.dev/v1alpha1/namespaces/default/tasks/t1",
        "/apis/loopd.dev/v1alpha1/namespaces/default/tasks/t1/status",
        "/apis/loopd.dev/v1alpha1/namespaces/Bad_NS/tasks/t1",
        "/apis/loopd.dev/v1alpha1/tasks",
        "/api/v1/namespaces/default",
        "/apis/coordination.k8s.io/v1/namespaces/default/leases/l1",
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
    ]
)
methods = st.sampled_from(["GET", "POST", "PUT", "PATCH", "DELETE"])
content_types = st.sampled_from(
    [
        "application/json",
        "application/merge-patch+json",
        "application/json-patch+json",
        "application/strategic-merge-patch+json",
        "application/apply-patch+yaml",
        "text/plain",
    ]
)
queries = st.dictionaries(
    st.sampled_from(
        ["labelSelector", "fieldSelector", "limit", "dryRun", "fieldValidation", "continue", "resourceVersion"]
    ),
    st.text(max_size=8),
    max_size=2,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(methods, paths, content_types, bodies, queries), min_size=1, max_size=4))
async def test_no_request_gets_a_server_error(requests: list[tuple[str, str, str, Any, dict[str, str]]]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        async with open_sqlite_store(Path(folder) / "fuzz.db") as store:
            await store.create(TASK_KIND, task("t1"))
            transport = httpx.ASGITransport(app=create_api_app(store, token=None))
            async with httpx.AsyncClient(transport=transport, base_url="http://fuzz") as client:
                for method, path, content_type, body, query in requests:
                    response = await client.request(
                        method,
                        path,
                        params=query,
                        content=json.dumps(body).encode(),
                        headers={"Content-Type": content_type},
                    )
                    assert response.status_code < 500, (method, path, body, response.text)
                    if response.status_code >= 400:
                        assert response.json()["kind"] == "Status"
