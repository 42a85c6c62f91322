"""`StreamingAsgiTransport`: an httpx2 client talks to an ASGI app in this process with the body streamed as the app
sends it, bounded by the read timeout, with app failures seen as a server's — and the demo model uses it."""

from __future__ import annotations

import asyncio
from collections.abc import MutableMapping
from typing import Any

import httpx2
import pytest

from loopd.harness.models import ModelConfig, open_model
from loopd.harness.models import _scripted_server as scripted
from loopd.harness.models._inprocess import StreamingAsgiTransport

from .helpers import ask, collect

Scope = MutableMapping[str, Any]


class PacedApp:
    """Answers 200 with ``first``, then waits for ``go`` before ``second``; records what it was asked."""

    def __init__(self) -> None:
        self.go = asyncio.Event()
        self.finished = asyncio.Event()
        self.cancelled = asyncio.Event()
        self.seen: list[tuple[str, str, bytes, bytes, dict[bytes, bytes]]] = []

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        message = await receive()
        self.seen.append(
            (scope["method"], scope["path"], scope["query_string"], message["body"], dict(scope["headers"]))
        )
        await send({"type": "http.response.start", "status": 201, "headers": [(b"x-app", b"paced")]})
        await send({"type": "http.response.body", "body": b"first ", "more_body": True})
        try:
            await self.go.wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        await send({"type": "http.response.body", "body": b"second", "more_body": False})
        self.finished.set()


async def test_the_body_streams_as_the_app_sends_it() -> None:
    app = PacedApp()
    client = httpx2.AsyncClient(transport=StreamingAsgiTransport(app), timeout=5.0)
    url = "http://app.invalid/v1/x?a=1"
    async with client, client.stream("POST", url, content=b"hello", headers={"X-Y": "z"}) as r:
        assert r.status_code == 201 and r.headers["x-app"] == "paced"
        assert r.extensions["http_version"] == b"HTTP/1.1"  # as a server's response says (the adapter reads it)
        pieces = r.aiter_raw()
        assert await anext(pieces) == b"first "  # before the app goes on
        assert not app.finished.is_set()
        app.go.set()
        assert [piece async for piece in pieces] == [b"second"]
    method, path, query, body, headers = app.seen[0]
    assert (method, path, query, body) == ("POST", "/v1/x", b"a=1", b"hello")
    assert headers[b"x-y"] == b"z"


async def test_closing_the_response_early_ends_the_app_like_a_dropped_connection() -> None:
    app = PacedApp()
    async with httpx2.AsyncClient(transport=StreamingAsgiTransport(app), timeout=5.0) as client:
        async with client.stream("GET", "http://app.invalid/") as response:
            assert await anext(response.aiter_raw()) == b"first "
        async with asyncio.timeout(5):
            await app.cancelled.wait()


async def test_a_silent_app_runs_into_the_read_timeout() -> None:
    app = PacedApp()
    client = httpx2.AsyncClient(transport=StreamingAsgiTransport(app), timeout=0.2)
    async with client, client.stream("GET", "http://app.invalid/") as response:
        with pytest.raises(httpx2.ReadTimeout):
            async for _ in response.aiter_raw():
                pass

    async def never_starts(scope: Scope, receive: Any, send: Any) -> None:
        await asyncio.Event().wait()

    async with httpx2.AsyncClient(transport=StreamingAsgiTransport(never_starts), timeout=0.2) as client:
        with pytest.raises(httpx2.ReadTimeout):
            await client.get("http://app.invalid/")


async def test_app_failures_look_like_a_servers() -> None:
    async def fails_at_once(scope: Scope, receive: Any, send: Any) -> None:
        raise RuntimeError("bug")

    async def fails_midway(scope: Scope, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"half", "more_body": True})
        raise RuntimeError("bug")

    async with httpx2.AsyncClient(transport=StreamingAsgiTransport(fails_at_once), timeout=5.0) as client:
        assert (await client.get("http://app.invalid/")).status_code == 500
    client = httpx2.AsyncClient(transport=StreamingAsgiTransport(fails_midway), timeout=5.0)
    async with client, client.stream("GET", "http://app.invalid/") as response:
        pieces = response.aiter_raw()
        assert await anext(pieces) == b"half"
        with pytest.raises(httpx2.RemoteProtocolError):
            await anext(pieces)


async def test_the_demo_model_answers_in_process_through_the_adapter(monkeypatch: pytest.MonkeyPatch) -> None:
    """No server is started for the demo: its answer comes through the OpenAI-compatible adapter, streamed."""

    def no_server(*args: object, **kwargs: object) -> None:
        raise AssertionError("the demo must not start a server")

    monkeypatch.setattr(scripted, "open_scripted_server", no_server)
    async with open_model(ModelConfig(model="demo")) as model:
        got = await collect(model.stream(ask("hello there")))
    assert got.error is None
    assert got.text.startswith("You said: “hello there”")


async def test_a_read_returns_everything_the_app_sent_since_the_last_one() -> None:
    """Like a socket read: chunks sent in a burst arrive together, a failure after them still ends the body."""

    async def burst(scope: Scope, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for piece in (b"a", b"b", b"c"):
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        raise RuntimeError("gone")

    async with (
        httpx2.AsyncClient(transport=StreamingAsgiTransport(burst), timeout=5.0) as client,
        client.stream("GET", "http://app.invalid/") as response,
    ):
        pieces = response.aiter_raw()
        assert await anext(pieces) == b"abc"
        with pytest.raises(httpx2.RemoteProtocolError):
            await anext(pieces)
