"""The engine's HTTP routes on a real loopback server: start, read, stream (SSE), gates (asker only), errors."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from loopd._infra.sse import read_sse
from loopd.server.engine import BuiltinHarnessAdapter, HarnessEngine, TextSet, engine_router
from loopd.server.http import Identity, ServerSecurity, open_http_server
from loopd.server.http._errors import install_error_handlers
from loopd.server.http._security import SecurityMiddleware
from loopd.server.storage import Database

from .conftest import ScriptedAdapter, make_engine, new_conversation, scripted, until_phase
from .rigs import FINAL_TEXT, open_rig

TOKEN = "engine-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
OTHER = {**AUTH, "X-Loopd-Actor": "operator:someone-else"}


@dataclass
class Served:
    client: httpx.AsyncClient
    engine: HarnessEngine
    db: Database
    url: str


async def _asker_of(task_id: str) -> Identity:
    if task_id != "task-9":
        from loopd.server.storage import NotFound

        raise NotFound(f"task {task_id} not found")
    return Identity("user", "local")


@pytest.fixture
async def served(sqlite_db: Database, tmp_path: Path) -> AsyncIterator[Served]:
    async with open_rig(tmp_path / "harness") as harness:
        adapters = {
            "builtin": BuiltinHarnessAdapter(harness.rig),
            "scripted": ScriptedAdapter(),
            "blocking": ScriptedAdapter(script=scripted(TextSet("working"), None)),
        }
        async with make_engine(sqlite_db, adapters, capacity=2) as engine:  # type: ignore[arg-type]
            app = FastAPI()
            install_error_handlers(app)
            app.include_router(engine_router(engine, asker_of=_asker_of, heartbeat=0.5))
            app.add_middleware(SecurityMiddleware, security=ServerSecurity(tokens=(TOKEN,)))
            async with (
                open_http_server(app) as server,
                httpx.AsyncClient(base_url=server.url, timeout=10.0) as client,
            ):
                yield Served(client, engine, sqlite_db, server.url)


def _body(conversation: str, **overrides: Any) -> dict[str, Any]:
    return {
        "owner_uid": "uid-9",
        "effect_key": "work/0",
        "target": "builtin",
        "text": "please write a.txt",
        "conversation_id": conversation,
        "task_id": "task-9",
        "timeout": 120,
        **overrides,
    }


async def test_a_call_started_over_http_asks_and_only_the_asker_answers(served: Served) -> None:
    conversation = await new_conversation(served.db, owner="local")
    started = await served.client.post("/v1/harness/calls", json=_body(conversation), headers=AUTH)
    assert started.status_code == 202, started.text
    call = started.json()
    again = await served.client.post("/v1/harness/calls", json=_body(conversation), headers=AUTH)
    assert again.status_code == 202 and again.json()["id"] == call["id"]

    await until_phase(served.engine, call["id"], "waiting_input")
    content = (await served.engine.read_events(call["id"]))[-1].event["block"]
    gate_id = content["id"].removeprefix("gate/")
    url = f"/v1/harness/calls/{call['id']}/gates/{gate_id}"

    refused = await served.client.post(url, json={"answer": "approve"}, headers=OTHER)
    assert refused.status_code == 403 and refused.json()["error"]["type"] == "forbidden"
    bad = await served.client.post(url, json={"answer": "maybe"}, headers=AUTH)
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request"
    answered = await served.client.post(url, json={"answer": "approve"}, headers=AUTH)
    assert answered.status_code == 200, answered.text
    assert answered.json() == {"call_id": call["id"], "gate_id": gate_id, "answer": "approve"}

    done = await served.engine.wait(call["id"], 20)
    assert done.phase == "succeeded"
    state = await served.client.get(f"/v1/harness/calls/{call['id']}", headers=AUTH)
    assert state.json()["phase"] == "succeeded"
    assert state.json()["result"] == {"format": "text", "content": FINAL_TEXT}
    late = await served.client.post(url, json={"answer": "deny"}, headers=AUTH)
    assert late.status_code == 409


async def _sse(client: httpx.AsyncClient, path: str, headers: dict[str, str]) -> list[tuple[str | None, Any]]:
    frames: list[tuple[str | None, Any]] = []
    async with client.stream("GET", path, headers=headers) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        async for message in read_sse(response.aiter_text()):
            if message.data is not None:
                frames.append((message.id, json.loads(message.data)))
    return frames


async def test_the_stream_is_agentue_over_sse_and_resumes_from_a_cursor(served: Served) -> None:
    conversation = await new_conversation(served.db, owner="local")
    body = _body(conversation, target="scripted", task_id=None)
    call = (await served.client.post("/v1/harness/calls", json=body, headers=AUTH)).json()
    frames = await _sse(served.client, f"/v1/harness/calls/{call['id']}/stream", AUTH)
    ops = [data["op"] for _, data in frames]
    assert ops[0] == "start" and ops[-1] == "end"
    assert "result" in {data.get("block", {}).get("id") for _, data in frames}
    assert [frame_id for frame_id, _ in frames[:-1]] == [str(n) for n in range(1, len(frames))]

    resumed = await _sse(served.client, f"/v1/harness/calls/{call['id']}/stream", {**AUTH, "Last-Event-ID": "2"})
    assert resumed[0][1]["op"] == "start" and resumed[0][1]["seq"] == 2 and resumed[0][0] is None
    assert [frame_id for frame_id, _ in resumed[1:-1]] == [str(n) for n in range(3, len(frames))]


async def test_a_cursor_past_the_calls_last_event_is_cursor_ahead(served: Served) -> None:
    conversation = await new_conversation(served.db, owner="local")
    body = _body(conversation, target="scripted", task_id=None)
    call = (await served.client.post("/v1/harness/calls", json=body, headers=AUTH)).json()
    frames = await _sse(served.client, f"/v1/harness/calls/{call['id']}/stream", AUTH)
    head = int([frame_id for frame_id, _ in frames if frame_id is not None][-1])
    path = f"/v1/harness/calls/{call['id']}/stream"
    at_head = await _sse(served.client, path, {**AUTH, "Last-Event-ID": str(head)})
    assert at_head[0][1]["op"] == "start"
    for headers, query in (({**AUTH, "Last-Event-ID": str(head + 3)}, ""), (AUTH, f"?after={head + 1}")):
        response = await served.client.get(path + query, headers=headers)
        assert response.status_code == 400, response.text
        assert response.json()["error"]["type"] == "cursor_ahead"


async def test_errors_are_the_envelope(served: Served) -> None:
    conversation = await new_conversation(served.db, owner="local")
    client = served.client
    cases = [
        (_body(conversation, timeout=-1), 400, "invalid_request"),
        (_body(conversation, extra=True), 400, "invalid_request"),
        (_body(conversation, target="nowhere"), 400, "invalid_request"),
        (_body(conversation, task_id="task-unknown"), 404, "not_found"),
        (_body(conversation, conversation_id="no-such-conversation"), 404, "not_found"),
    ]
    for body, status, kind in cases:
        response = await client.post("/v1/harness/calls", json=body, headers=AUTH)
        assert (response.status_code, response.json()["error"]["type"]) == (status, kind), body
    first = await client.post("/v1/harness/calls", json=_body(conversation, target="scripted"), headers=AUTH)
    assert first.status_code == 202
    changed = await client.post(
        "/v1/harness/calls", json=_body(conversation, target="scripted", text="other"), headers=AUTH
    )
    assert changed.status_code == 409 and changed.json()["error"]["type"] == "conflict"
    assert (await served.engine.wait(first.json()["id"], 10)).phase == "succeeded"  # its slot is free again
    for key in ("work/1", "work/2"):  # the engine's capacity is 2
        held = await client.post(
            "/v1/harness/calls", json=_body(conversation, target="blocking", effect_key=key), headers=AUTH
        )
        assert held.status_code == 202
    full = await client.post(
        "/v1/harness/calls", json=_body(conversation, target="blocking", effect_key="work/3"), headers=AUTH
    )
    assert full.status_code == 429 and full.json()["error"]["type"] == "too_many_requests"
    assert full.headers.get("retry-after") == "1"

    missing = await client.get("/v1/harness/calls/nope", headers=AUTH)
    assert missing.status_code == 404
    anonymous = await client.get(f"/v1/harness/calls/{first.json()['id']}")
    assert anonymous.status_code == 401
    cookie = {"Cookie": f"loopd-human={'ab' * 32}"}
    browser = await client.get(f"/v1/harness/calls/{first.json()['id']}", headers=cookie)
    assert browser.status_code == 404  # a browser user who did not ask cannot see the call
    start_as_browser = await client.post(
        "/v1/harness/calls",
        json=_body(conversation, effect_key="w/9"),
        headers={**cookie, "Origin": served.url},
    )
    assert start_as_browser.status_code == 403
