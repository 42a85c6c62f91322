"""The in-process transport: requests reach the ASGI app as over a socket (headers, body, status), event streams
take the fallback, timeouts and cancellation end the app's request, and the app's context stays its own."""

from __future__ import annotations

import asyncio
import contextvars
import json
from typing import Any

import httpx
import pytest

from loopd._infra.inprocess import InProcessTransport

_seen: contextvars.ContextVar[str] = contextvars.ContextVar("_seen", default="unset")


class App:
    """A small ASGI app: ``/echo`` answers what it got, ``/slow`` waits, ``/boom`` raises, ``/mark`` sets a
    context variable."""

    def __init__(self) -> None:
        self.ended: list[str] = []
        self.started = asyncio.Event()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        path = scope["path"]
        try:
            body = b""
            while True:
                message = await receive()
                body += message.get("body", b"")
                if not message.get("more_body"):
                    break
            if path == "/slow":
                self.started.set()
                await asyncio.sleep(30)
            if path == "/boom":
                raise RuntimeError("the app broke")
            if path == "/mark":
                _seen.set("the app")
            answer = {
                "method": scope["method"],
                "body": body.decode(),
                "authorization": dict(scope["headers"]).get(b"authorization", b"").decode(),
                "client": list(scope["client"]),
                "context": _seen.get(),
            }
            payload = json.dumps(answer).encode()
            await send(
                {"type": "http.response.start", "status": 201, "headers": [(b"content-type", b"application/json")]}
            )
            await send({"type": "http.response.body", "body": payload})
        finally:
            self.ended.append(path)


def streams_only(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, text=f"fallback {request.url.path}")


def client(app: App, timeout: float = 5.0) -> httpx.AsyncClient:
    transport = InProcessTransport(app, fallback=httpx.MockTransport(streams_only))
    return httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:1", timeout=timeout)


async def test_a_request_reaches_the_app_with_its_headers_and_body() -> None:
    app = App()
    async with client(app) as http:
        response = await http.post("/echo", content=b"hello", headers={"Authorization": "Bearer t"})
    assert response.status_code == 201
    assert response.json() == {
        "method": "POST",
        "body": "hello",
        "authorization": "Bearer t",
        "client": ["127.0.0.1", 0],
        "context": "unset",
    }
    assert app.ended == ["/echo"]


async def test_event_streams_take_the_fallback() -> None:
    app = App()
    async with client(app) as http:
        response = await http.get("/stream", headers={"Accept": "text/event-stream"})
    assert response.text == "fallback /stream"
    assert app.ended == [], "the app itself was not called"


async def test_the_read_timeout_bounds_the_exchange_and_ends_the_apps_request() -> None:
    app = App()
    async with client(app, timeout=0.2) as http:
        with pytest.raises(httpx.ReadTimeout):
            await http.get("/slow")
    assert app.ended == ["/slow"], "the app's request was ended, not left running"


async def test_a_cancelled_client_ends_the_apps_request() -> None:
    app = App()
    async with client(app) as http:
        request = asyncio.create_task(http.get("/slow"))
        await asyncio.wait_for(app.started.wait(), 5)
        request.cancel()
        with pytest.raises(asyncio.CancelledError):
            await request
    assert app.ended == ["/slow"]


async def test_an_exception_of_the_app_is_a_500_answer() -> None:
    app = App()
    async with client(app) as http:
        response = await http.get("/boom")
    assert response.status_code == 500


async def test_the_apps_context_variables_stay_in_the_app() -> None:
    app = App()
    async with client(app) as http:
        response = await http.get("/mark")
    assert response.json()["context"] == "the app"
    assert _seen.get() == "unset", "what the app set did not leak into the caller"
