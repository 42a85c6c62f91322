"""The runtime against a real loop-server (`open_loop_server`: the whole `loopd up` on loopback, demo model) and a
small scripted HTTP server for answers a real server gives only under load (429, 503, dropped connections)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from loopd._infra.serving import open_http_server
from loopd.runtime import Runtime, open_runtime
from loopd.server._composition import RunningServer, UpSettings, open_loop_server


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[RunningServer]:
    async with open_loop_server(UpSettings(data_dir=tmp_path / "data", port=0)) as running:
        yield running


@pytest.fixture
async def rt(server: RunningServer) -> AsyncIterator[Runtime]:
    """A runtime on the data directory (admin token, acting as ``operator:echo`` once registered)."""
    async with open_runtime(data_dir=server.data_dir, request_timeout=15.0) as runtime:
        yield runtime


class User:
    """The data directory's user over plain HTTP: asks questions and answers Human requests."""

    def __init__(self, server: RunningServer) -> None:
        token = server.token_file.read_text().strip()
        self.http = httpx.AsyncClient(base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=15)

    async def ask(self, text: str, *, key: str = "echo") -> dict[str, Any]:
        conversation = (await self.http.post("/v1/conversations", json={"name": text[:40]})).json()["id"]
        body = {"target": {"kind": "operator", "key": key}, "text": text}
        answer = await self.http.post(f"/v1/conversations/{conversation}/messages", json=body)
        assert answer.status_code == 201, answer.text
        return dict(answer.json())

    async def message(self, conversation_id: str, message_id: str) -> dict[str, Any]:
        page = (await self.http.get(f"/v1/conversations/{conversation_id}/messages", params={"limit": 1000})).json()
        return next(m for m in page["data"] if m["id"] == message_id)

    async def aclose(self) -> None:
        await self.http.aclose()


@pytest.fixture
async def user(server: RunningServer) -> AsyncIterator[User]:
    asker = User(server)
    try:
        yield asker
    finally:
        await asker.aclose()


_DROP = Response(status_code=599)
"""What ``handle`` returns for a scripted ``None``: turned into a dropped connection by ``serve``."""


@dataclass
class Scripted:
    """A loopback HTTP server whose answers a test scripts: ``answers`` is consumed per request (``None`` drops the
    connection); every request is recorded as ``(method, path, headers)``."""

    url: str = ""
    answers: list[Response | None] = field(default_factory=list)
    fallback: Response = field(default_factory=lambda: JSONResponse({"ok": True}))
    seen: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)


class _Drop(Exception):
    """Raised after the response started: uvicorn then closes the connection mid-answer (no answer at all)."""


@pytest.fixture
async def scripted() -> AsyncIterator[Scripted]:
    state = Scripted()

    async def handle(request: Request) -> Response:
        state.seen.append((request.method, request.url.path, dict(request.headers)))
        answer = state.answers.pop(0) if state.answers else state.fallback
        return answer if answer is not None else _DROP

    app = Starlette(routes=[Route("/{path:path}", handle, methods=["GET", "POST", "PUT"])])

    async def serve(scope: Any, receive: Any, send: Any) -> None:
        async def sending(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start" and message["status"] == _DROP.status_code:
                await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"99")]})
                raise _Drop
            await send(message)

        with contextlib.suppress(_Drop):
            await app(scope, receive, sending)
            return
        raise _Drop  # uvicorn closes the connection: the client sees no complete answer

    async with open_http_server(serve, lifespan="off", log_level=None) as running:
        state.url = running.url
        yield state


def put_registration(key: str = "echo", lease: float = 30.0) -> JSONResponse:
    """The body of a successful ``PUT /v1/operators/{key}``."""
    return JSONResponse(
        {
            "kind": "operator",
            "key": key,
            "display_name": "",
            "description": "",
            "expires_at": "2030-01-01T00:00:30Z",
            "lease_seconds": lease,
        }
    )
