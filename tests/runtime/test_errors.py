"""Answers mapped to the runtime's errors, and the retry rule, against a scripted loopback HTTP server (the
answers a real loop-server gives only under load or failure: 429, 503, 500, a dropped connection)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from starlette.responses import JSONResponse, PlainTextResponse, Response

from loopd._infra.backoff import Backoff
from loopd._infra.clock import SystemClock
from loopd._infra.errors import LoopdError, UnavailableError
from loopd.runtime import (
    CapacityFull,
    Conflict,
    Endpoint,
    Forbidden,
    InvalidRequest,
    NotFound,
    RuntimeApiError,
    ServerClient,
    ServerFailure,
    Unauthorized,
    Unavailable,
    find_endpoint,
    open_runtime,
)

from .conftest import Scripted


def _envelope(status: int, kind: str, message: str = "no", headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"type": kind, "message": message}}, status_code=status, headers=headers)


def _client(url: str, *, retries: int = 3, admin: bool = True, actor: str | None = "operator:echo") -> ServerClient:
    return ServerClient(
        Endpoint(url, "t0ken", admin=admin),
        clock=SystemClock(),
        request_timeout=5.0,
        retries=retries,
        backoff=Backoff(base=0.01, max_delay=0.02),
        actor=actor,
    )


@pytest.mark.parametrize(
    ("status", "kind", "error"),
    [
        (400, "invalid_request", InvalidRequest),
        (400, "cursor_ahead", InvalidRequest),
        (401, "unauthorized", Unauthorized),
        (403, "forbidden", Forbidden),
        (404, "not_found", NotFound),
        (409, "conflict", Conflict),
        (413, "payload_too_large", InvalidRequest),
        (429, "too_many_requests", CapacityFull),
        (503, "service_unavailable", Unavailable),
        (500, "internal_error", ServerFailure),
        (502, "", ServerFailure),
    ],
)
async def test_the_envelope_maps_to_the_typed_error(
    scripted: Scripted, status: int, kind: str, error: type[RuntimeApiError]
) -> None:
    scripted.answers = [_envelope(status, kind, "what happened")]
    client = _client(scripted.url)
    try:
        with pytest.raises(error) as caught:
            await client.request("GET", "/v1/tasks/x", what="task x")
    finally:
        await client.aclose()
    assert type(caught.value) is error and isinstance(caught.value, LoopdError)
    assert caught.value.status == status and caught.value.type == kind
    assert str(caught.value) == "task x: what happened"
    assert len(scripted.seen) == 1  # an answer is never retried
    assert caught.value.retryable == (error in (CapacityFull, Unavailable))


async def test_too_many_requests_carries_retry_after_and_a_body_without_envelope_still_maps(scripted: Scripted) -> None:
    scripted.answers = [
        _envelope(429, "too_many_requests", "full", headers={"Retry-After": "7"}),
        PlainTextResponse("bad gateway", status_code=503),
    ]
    client = _client(scripted.url)
    try:
        with pytest.raises(CapacityFull) as full:
            await client.request("POST", "/v1/harness/calls", json={}, idempotent=True)
        with pytest.raises(Unavailable) as down:
            await client.request("GET", "/v1/actors")
    finally:
        await client.aclose()
    assert full.value.retry_after == 7.0
    assert down.value.message == "bad gateway" and isinstance(down.value, UnavailableError)


async def test_an_idempotent_request_without_an_answer_is_retried_within_its_bound(scripted: Scripted) -> None:
    scripted.answers = [None, None, JSONResponse({"n": 1})]
    client = _client(scripted.url)
    try:
        assert await client.request("GET", "/v1/tasks/x") == {"n": 1}
        assert len(scripted.seen) == 3
        scripted.answers = [None, None, None, None]
        with pytest.raises(Unavailable, match="no answer"):
            await client.request("PUT", "/v1/operators/echo", json={})
        assert len(scripted.seen) == 3 + 4  # the first try and three retries
    finally:
        await client.aclose()


async def test_a_request_that_may_not_repeat_is_sent_once(scripted: Scripted) -> None:
    scripted.answers = [None, JSONResponse({"n": 1})]
    client = _client(scripted.url)
    try:
        with pytest.raises(Unavailable):
            await client.request("POST", "/v1/tasks/x/events", json={"events": []}, idempotent=False)
    finally:
        await client.aclose()
    assert [path for _, path, _ in scripted.seen] == ["/v1/tasks/x/events"]


async def test_a_refused_connection_is_retried_even_for_a_post_and_then_unavailable() -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = _client(f"http://127.0.0.1:{port}", retries=2)
    try:
        with pytest.raises(Unavailable, match="ConnectError") as caught:
            await client.request("POST", "/v1/tasks/x/events", json={}, idempotent=False)
    finally:
        await client.aclose()
    assert caught.value.status == 503 and caught.value.retryable


async def test_the_admin_token_acts_as_the_operator_except_in_user_verbs(scripted: Scripted) -> None:
    async with open_runtime(scripted.url, token="t0ken", actor="operator:echo") as rt:
        scripted.fallback = JSONResponse({"data": [], "next_after": None})
        await rt.task.list("echo")
        await rt.chat.history("c1")
    (_, _, listed), (_, _, history) = scripted.seen
    assert listed["authorization"] == "Bearer t0ken"
    assert "x-loopd-actor" not in listed  # a token given explicitly is not known to be the admin's: sent as is
    admin = _client(scripted.url)
    try:
        await admin.request("GET", "/v1/tasks")
        await admin.request("GET", "/v1/conversations/c1", as_user=True)
    finally:
        await admin.aclose()
    assert scripted.seen[2][2]["x-loopd-actor"] == "operator:echo"
    assert "x-loopd-actor" not in scripted.seen[3][2]
    del history


def test_find_endpoint_reads_a_data_directory_and_refuses_what_is_missing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "resources-api").mkdir(parents=True)
    (data / "resources-api" / "token").write_text("admin-token\n")
    (data / "resources-api" / "ca.crt").write_text("CA")
    (data / "server.json").write_text(
        '{"url": "http://127.0.0.1:9/", "api_url": "https://127.0.0.1:10", "token_file": "%s"}'
        % (data / "resources-api" / "token")
    )
    endpoint = find_endpoint(None, token=None, data_dir=data)
    assert (endpoint.url, endpoint.token, endpoint.admin) == ("http://127.0.0.1:9", "admin-token", True)
    kubeconfig = endpoint.kubeconfig("tenant")
    assert kubeconfig["clusters"][0]["cluster"]["server"] == "https://127.0.0.1:10"
    assert kubeconfig["contexts"][0]["context"]["namespace"] == "tenant"
    given = find_endpoint("http://other:1", token="op-token", data_dir=data)
    assert (given.url, given.token, given.admin) == ("http://other:1", "op-token", False)
    with pytest.raises(InvalidRequest, match="no server URL"):
        find_endpoint(None, token="x", data_dir=None)
    with pytest.raises(InvalidRequest, match="no token"):
        find_endpoint("http://127.0.0.1:9", token=None, data_dir=tmp_path / "empty")
    with pytest.raises(InvalidRequest, match="no embedded Kubernetes API"):
        find_endpoint("http://127.0.0.1:9", token="x", data_dir=None).kubeconfig()


def test_the_tree_carries_the_floors_markers_and_one_root() -> None:
    from loopd._infra.errors import ConflictError, NotFoundError
    from loopd.runtime import InvalidResponse, TaskNotReady

    for error in (InvalidRequest, Unauthorized, Forbidden, NotFound, Conflict, CapacityFull, Unavailable):
        assert issubclass(error, RuntimeApiError) and issubclass(error, LoopdError)
    assert issubclass(TaskNotReady, NotFound) and issubclass(NotFound, NotFoundError)
    assert issubclass(Conflict, ConflictError) and issubclass(Unavailable, UnavailableError)
    assert issubclass(InvalidResponse, RuntimeApiError) and issubclass(InvalidResponse, ValueError)
    assert [e for e in (CapacityFull, Unavailable, Conflict, NotFound, ServerFailure) if e.retryable] == [
        CapacityFull,
        Unavailable,
    ]


def test_the_public_face_is_the_documented_one() -> None:
    import loopd.runtime as runtime

    assert set(runtime.__all__) <= set(vars(runtime))
    aliases = {"TaskReconcileFunction", "ToolsProfile"}  # type aliases: documented where they are defined
    assert all(getattr(runtime, name).__doc__ for name in runtime.__all__ if not name.isupper() and name not in aliases)
    for verb in ("open_runtime", "Runtime", "Task", "TaskContext", "Result", "Call", "CallState", "Question", "Output"):
        assert verb in runtime.__all__


def _sse(*events: str) -> Response:
    return Response("".join(events), media_type="text/event-stream")


async def test_a_call_stream_resumes_after_the_last_seq_when_the_connection_ends(scripted: Scripted) -> None:
    call = {
        "id": "c1", "owner_uid": "u", "effect_key": "k", "target": "assistant", "conversation_id": "cv",
        "message_id": "m", "phase": "running", "result": None, "error": None,
    }  # fmt: skip
    scripted.answers = [
        JSONResponse(call),
        _sse('id: 1\ndata: {"op":"start","seq":1,"model":{"blocks":[]}}\n\n', ": ping\n\n",
             'id: 2\ndata: {"op":"append","seq":2}\n\n'),  # the server goes away without an end
        _sse('data: {"op":"start","seq":2,"model":{"blocks":[]}}\n\n', 'id: 3\ndata: {"op":"set","seq":3}\n\n',
             'id: 3\ndata: {"op":"end","seq":3}\n\n'),
    ]  # fmt: skip
    async with open_runtime(scripted.url, token="t") as rt:
        handle = await rt.harness.get("c1")
        events = await asyncio.wait_for(_collect(handle.stream()), 30)  # one reconnect: a 0.2 s backoff
    assert [(e["op"], e["seq"]) for e in events] == [("start", 1), ("append", 2), ("set", 3), ("end", 3)]
    streams = [headers for method, path, headers in scripted.seen if path.endswith("/stream")]
    assert "last-event-id" not in streams[0] and streams[1]["last-event-id"] == "2"


async def _collect(events: AsyncIterator[dict[str, Any]]) -> list[dict[str, Any]]:
    return [event async for event in events]
