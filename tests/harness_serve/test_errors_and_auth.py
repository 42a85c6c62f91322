"""Error envelopes (400/404/405/409/413/415), malformed bodies on every POST route, auth, binds, the OpenAPI doc."""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import loopd.harness.serve as serve_module
from loopd._infra.http import is_loopback
from loopd.harness import SqliteJournal
from loopd.harness.serve import InsecureBindError, check_bind, serve
from loopd.harness.standard import HarnessSettings

from .conftest import Served, client_for, scripted_rig, serving


def assert_envelope(response: httpx.Response, status: int, error_type: str) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"type", "message"}
    assert body["error"]["type"] == error_type
    assert body["error"]["message"]


@pytest.fixture
async def served(journal: SqliteJournal) -> AsyncIterator[Served]:
    async with serving(scripted_rig(journal, []), max_body_bytes=4096) as s:
        yield s


async def test_error_envelopes(served: Served) -> None:
    client = served.client
    session_id = (await client.post("/v1/sessions", json={})).json()["id"]
    base = f"/v1/sessions/{session_id}"

    assert_envelope(await client.get("/v1/sessions/nope"), 404, "not_found")
    assert_envelope(await client.post("/v1/sessions/nope/inputs", json={"text": "x"}), 404, "not_found")
    assert_envelope(await client.get("/v1/sessions/nope/journal"), 404, "not_found")
    assert_envelope(await client.get("/v1/sessions/nope/events"), 404, "not_found")
    assert_envelope(await client.post("/v1/sessions/nope/restore"), 404, "not_found")
    assert_envelope(await client.get("/no/such/route"), 404, "not_found")
    assert_envelope(await client.put("/v1/sessions", json={}), 405, "invalid_request")

    assert_envelope(await client.post(f"{base}/inputs", json={"text": ""}), 400, "invalid_request")
    assert_envelope(await client.post(f"{base}/inputs", json={"text": "x", "extra": 1}), 400, "invalid_request")
    assert_envelope(await client.post(f"{base}/inputs", json={"text": "x", "loop": "nope"}), 400, "invalid_request")
    assert_envelope(await client.get(f"{base}/journal?limit=0"), 400, "invalid_request")
    assert_envelope(await client.get(f"{base}/journal?from_seq=abc"), 400, "invalid_request")
    assert_envelope(await client.get(f"{base}/events?from_seq=0"), 400, "invalid_request")
    assert_envelope(await client.get(f"{base}/events", headers={"Last-Event-ID": "x1"}), 400, "invalid_request")
    huge = "9" * 30
    assert_envelope(await client.get(f"{base}/events", headers={"Last-Event-ID": huge}), 400, "invalid_request")
    assert_envelope(await client.get(f"{base}/events?from_seq={huge}"), 400, "invalid_request")
    assert_envelope(await client.get(f"{base}/journal?from_seq={huge}"), 400, "invalid_request")
    assert_envelope(await client.get("/v1/sessions?limit=100000"), 400, "invalid_request")

    headers = {"Idempotency-Key": "k"}
    assert (await client.post("/v1/sessions", json={}, headers=headers)).status_code == 201
    assert_envelope(await client.post("/v1/sessions", json={"input": "x"}, headers=headers), 409, "conflict")

    big = {"text": "x" * 5000}
    assert_envelope(await client.post(f"{base}/inputs", json=big), 413, "payload_too_large")

    async def chunked() -> AsyncIterator[bytes]:  # no Content-Length: the cap counts the bytes that arrive
        for _ in range(10):
            yield b" " * 1000

    response = await client.post(f"{base}/inputs", content=chunked(), headers={"Content-Type": "application/json"})
    assert "content-length" not in response.request.headers
    assert_envelope(response, 413, "payload_too_large")

    form = await client.post(f"{base}/inputs", content=b"text=hi", headers={"Content-Type": "text/plain"})
    assert_envelope(form, 415, "unsupported_media_type")
    form = await client.post(f"{base}/inputs", data={"text": "hi"})
    assert_envelope(form, 415, "unsupported_media_type")
    # nothing of that reached the session
    view = (await client.get(base)).json()
    assert view["last_seq"] == 1


MALFORMED: list[bytes] = [
    b"{",
    b"}",
    b"[]",
    b"null",
    b"123",
    b'"text"',
    b"true",
    b'{"text": "unterminated',
    b"\xff\xfe\x00garbage",
    b"[" * 50_000,  # deeper than the JSON parser's recursion limit
    b'{"a":' * 3000 + b"1" + b"}" * 3000,
]

WRONG_TYPES: list[dict[str, Any]] = [
    {"text": 5},
    {"text": None},
    {"text": ["a"]},
    {"text": {"nested": True}},
    {"text": ""},
    {"loop": 7, "text": "x"},
    {"input": 3},
    {"input": ""},
    {"answer": "maybe"},
    {"answer": None},
    {"reason": ""},
    {"reason": 1},
    {"unexpected": "field"},
]


async def test_malformed_bodies_on_every_post_route_get_a_4xx_envelope(journal: SqliteJournal) -> None:
    async with serving(scripted_rig(journal, [])) as served:  # the default 1 MiB cap: deep nesting gets parsed
        await _fuzz_post_routes(served)


async def _fuzz_post_routes(served: Served) -> None:
    session_id = (await served.client.post("/v1/sessions", json={})).json()["id"]
    routes = [
        "/v1/sessions",
        f"/v1/sessions/{session_id}/restore",
        f"/v1/sessions/{session_id}/inputs",
        f"/v1/sessions/{session_id}/interrupt",
        f"/v1/sessions/{session_id}/gates/main/1/1",
    ]
    rng = random.Random(1234)
    bodies = MALFORMED + [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200))) for _ in range(15)]
    sent = 0
    for route in routes:
        for body in bodies:
            response = await served.client.post(route, content=body, headers={"Content-Type": "application/json"})
            assert 400 <= response.status_code < 500, (route, body[:40], response.status_code, response.text)
            assert set(response.json()["error"]) == {"type", "message"}
            sent += 1
        for wrong in WRONG_TYPES:
            if route.endswith("/restore"):
                continue  # restore takes no body; objects are accepted and ignored
            if route == "/v1/sessions" and set(wrong) <= {"loop"}:
                continue
            response = await served.client.post(
                route, content=json.dumps(wrong).encode(), headers={"Content-Type": "application/json"}
            )
            assert 400 <= response.status_code < 500, (route, wrong, response.status_code, response.text)
            assert set(response.json()["error"]) == {"type", "message"}
            sent += 1
    assert sent > 100
    sessions = (await served.client.get("/v1/sessions")).json()["items"]
    assert len(sessions) == 1  # no malformed create slipped through


async def test_a_token_is_enforced_when_set(journal: SqliteJournal) -> None:
    async with serving(scripted_rig(journal, []), token="s3cret-token") as served:
        async with client_for(served.url) as anonymous:
            missing = await anonymous.get("/v1/sessions")
            assert_envelope(missing, 401, "unauthorized")
            assert missing.headers["www-authenticate"].startswith("Bearer")
            wrong = await anonymous.get("/v1/sessions", headers={"Authorization": "Bearer s3cret-tokeN"})
            assert_envelope(wrong, 401, "unauthorized")
            basic = await anonymous.get("/v1/sessions", headers={"Authorization": "Basic s3cret-token"})
            assert_envelope(basic, 401, "unauthorized")
            refused = await anonymous.post("/v1/sessions", json={})
            assert_envelope(refused, 401, "unauthorized")
            assert (await anonymous.get("/healthz")).status_code == 200
            document = (await anonymous.get("/openapi.json")).json()
            assert document["security"] == [{"bearer": []}]
        assert (await served.client.get("/v1/sessions")).status_code == 200  # the fixture sends the token
        assert await journal.sessions() == []


async def test_without_a_token_only_loopback_hosts_are_answered(served: Served) -> None:
    assert (await served.client.get("/healthz", headers={"Host": "localhost:1"})).status_code == 200
    rebinding = await served.client.get("/v1/sessions", headers={"Host": "attacker.example:8765"})
    assert_envelope(rebinding, 403, "forbidden")


@pytest.mark.parametrize(
    ("host", "token", "allowed"),
    [
        ("127.0.0.1", None, True),
        ("127.8.9.10", None, True),
        ("localhost", None, True),
        ("::1", None, True),
        ("[::1]", None, True),
        ("0.0.0.0", None, False),
        ("::", None, False),
        ("192.168.1.20", None, False),
        ("harness.example.com", None, False),
        ("0.0.0.0", "a-long-token", True),
        ("127.0.0.1", "", False),
        ("0.0.0.0", "   ", False),
    ],
)
def test_bind_rule(host: str, token: str | None, allowed: bool) -> None:
    if allowed:
        check_bind(host, token)
    else:
        with pytest.raises(InsecureBindError):
            check_bind(host, token)
    assert is_loopback("127.0.0.1") and not is_loopback("10.0.0.1")


async def test_serve_refuses_a_public_bind_without_a_token_before_binding(tmp_path: Path) -> None:
    settings = HarnessSettings(workspace=tmp_path / "ws", data_dir=tmp_path / "data")
    with pytest.raises(InsecureBindError, match="token"):
        await serve(settings, host="0.0.0.0", port=0, token=None)
    assert not (tmp_path / "data").exists()  # nothing was opened, let alone bound


async def test_openapi_lists_the_paths(served: Served) -> None:
    document = (await served.client.get("/openapi.json")).json()
    assert set(document["paths"]) == {
        "/healthz",
        "/v1/sessions",
        "/v1/sessions/{session_id}",
        "/v1/sessions/{session_id}/restore",
        "/v1/sessions/{session_id}/fork",
        "/v1/sessions/{session_id}/inputs",
        "/v1/sessions/{session_id}/inputs/{command_id}",
        "/v1/sessions/{session_id}/interrupt",
        "/v1/sessions/{session_id}/gates/{gate_id}",
        "/v1/sessions/{session_id}/questions/{request_id}",
        "/v1/sessions/{session_id}/active-loop",
        "/v1/sessions/{session_id}/loops/{loop}/mode",
        "/v1/sessions/{session_id}/loops/{loop}/inference",
        "/v1/sessions/{session_id}/journal",
        "/v1/sessions/{session_id}/model-calls",
        "/v1/sessions/{session_id}/events",
    }
    schemas = document["components"]["schemas"]
    assert {"ErrorEnvelope", "SessionBody", "InputRequest", "JournalPage", "EventItem"} <= set(schemas)
    create = document["paths"]["/v1/sessions"]["post"]
    assert "201" in create["responses"] and "409" in create["responses"]
    assert not [path for path, ops in document["paths"].items() for op in ops.values() if "422" in op["responses"]]
    assert "HTTPValidationError" not in schemas and "security" not in document
    assert any(p["name"] == "idempotency-key" for p in create["parameters"])
    assert (
        "text/event-stream"
        in document["paths"]["/v1/sessions/{session_id}/events"]["get"]["responses"]["200"]["content"]
    )


def test_public_face() -> None:
    """The transport's own names only: the HTTP plumbing is the floor's (``loopd._infra``)."""
    assert set(serve_module.__all__) == {
        "IDEMPOTENCY_FILE",
        "PUBLIC_PATHS",
        "IdempotencyStore",
        "IdempotencyStoreError",
        "InsecureBindError",
        "KeyRecord",
        "MemoryIdempotencyStore",
        "ServedSessions",
        "SessionWorkspaces",
        "SqliteIdempotencyStore",
        "check_bind",
        "create_app",
        "open_harness_server",
        "sessions_of",
        "serve",
    }
