"""The HTTP client's own concerns: kubeconfig loading, authentication, transport failures, error mapping."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from loopd.resources import BadRequest, Conflict, Gone, Invalid, NotFound, ResourceError, StoreUnavailable, Unauthorized
from loopd.resources.client import (
    TASKS,
    ServerError,
    TooManyRequests,
    TransportError,
    error_from_response,
    open_http_client,
)

from .conftest import serve_api
from .helpers import task


async def test_a_kubeconfig_file_sets_server_credentials_and_default_namespace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with serve_api(tmp_path) as kubeconfig:
        kubeconfig["contexts"][0]["context"]["namespace"] = "team-a"
        path = tmp_path / "kubeconfig"
        path.write_text(yaml.safe_dump(kubeconfig))
        async with open_http_client(path) as client:
            assert client.default_namespace == "team-a"
            created = await client.create(TASKS, task("t1", namespace="team-a"))
            assert (await client.get(TASKS, "t1"))["metadata"]["uid"] == created["metadata"]["uid"]
        monkeypatch.setenv("KUBECONFIG", str(path))
        async with open_http_client() as client:
            assert (await client.get(TASKS, "t1"))["metadata"]["namespace"] == "team-a"


async def test_a_wrong_token_is_unauthorized(tmp_path: Path) -> None:
    async with serve_api(tmp_path) as kubeconfig:
        kubeconfig["users"][0]["user"]["token"] = "not-the-token"
        async with open_http_client(kubeconfig) as client:
            with pytest.raises(Unauthorized):
                await client.list(TASKS, namespace="default")


async def test_no_answer_is_a_retryable_transport_error(tmp_path: Path) -> None:
    async with serve_api(tmp_path) as kubeconfig:
        pass  # the server is gone; its kubeconfig remains
    with socket.socket() as probe:  # make sure nothing listens on the port any more
        server_port = int(kubeconfig["clusters"][0]["cluster"]["server"].rsplit(":", 1)[1])
        assert probe.connect_ex(("127.0.0.1", server_port)) != 0
    async with open_http_client(kubeconfig, request_timeout=2.0) as client:
        with pytest.raises(TransportError) as caught:
            await client.get(TASKS, "t1", namespace="default")
        assert caught.value.retryable
        assert isinstance(caught.value, StoreUnavailable)
        with pytest.raises(TransportError):
            async with client.open_watch(TASKS, namespace="default"):
                pass


async def test_an_invalid_object_names_the_offending_field(tmp_path: Path) -> None:
    async with serve_api(tmp_path) as kubeconfig, open_http_client(kubeconfig) as client:
        body = task("t1")
        body["spec"]["target"]["kind"] = "robot"
        with pytest.raises(Invalid) as caught:
            await client.create(TASKS, body)
        assert any("spec.target.kind" in cause.field for cause in caught.value.causes)


@pytest.mark.parametrize(
    ("code", "body", "expected"),
    [
        (404, {"kind": "Status", "reason": "NotFound", "message": "x", "code": 404}, NotFound),
        (409, {"kind": "Status", "reason": "Conflict", "message": "x", "code": 409}, Conflict),
        (410, {"kind": "Status", "reason": "Expired", "message": "x", "code": 410}, Gone),
        (400, "plain text", BadRequest),
        (500, {"kind": "Status", "reason": "InternalError", "message": "x", "code": 500}, ServerError),
        (504, {"kind": "Status", "reason": "Timeout", "message": "x", "code": 504}, ServerError),
        (503, None, StoreUnavailable),
        (418, {"whatever": 1}, ResourceError),
    ],
)
def test_http_answers_map_onto_the_error_tree(code: int, body: object, expected: type[ResourceError]) -> None:
    error = error_from_response(code, body)
    assert type(error) is expected


def test_too_many_requests_carries_the_retry_after() -> None:
    error = error_from_response(
        429, {"kind": "Status", "reason": "TooManyRequests", "message": "slow down"}, retry_after=3.0
    )
    assert isinstance(error, TooManyRequests)
    assert error.retryable and error.retry_after == 3.0


def test_importing_the_client_does_not_import_the_optional_kubernetes_library() -> None:
    code = (
        "import sys, loopd.resources.client, loopd.resources.reconcile; sys.exit('kubernetes_asyncio' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False, timeout=60).returncode == 0
