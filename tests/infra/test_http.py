"""The floor's HTTP mechanism (``loopd._infra.http``, ``http_errors``, ``serving``) on its own: a small app served
by `open_http_server` on 127.0.0.1, and the body rules by their contracts."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator, MutableMapping
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from starlette.types import Message

from loopd._infra.http import EventStreamResponse, LastChunk, buffer_json_body
from loopd._infra.http_errors import ApiError, install_error_handlers
from loopd._infra.serving import open_http_server
from loopd._infra.sse import iter_sse, sse_message


def _parse_sse(raw: bytes) -> list[dict[str, str]]:
    """The messages of an SSE body, as ``{field: value}`` (the floor's parser)."""
    messages = []
    for message in iter_sse(raw.decode()):
        fields = {"id": message.id, "event": message.event, "data": message.data}
        messages.append({k: v for k, v in fields.items() if v is not None})
    return messages


async def _buffer(headers: dict[str, str], *chunks: bytes, max_bytes: int = 16, timeout: float = 5.0) -> bytes:
    messages: list[Message] = [
        {"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1} for i, chunk in enumerate(chunks)
    ]

    async def receive() -> Message:
        return messages.pop(0)

    replay = await buffer_json_body(headers, receive, max_bytes=max_bytes, timeout=timeout)
    message = await replay()
    assert message["more_body"] is False
    return bytes(message["body"])


async def test_a_json_write_is_read_whole_and_handed_on() -> None:
    body = await _buffer({"content-type": "application/merge-patch+json"}, b'{"a":', b"1}")
    assert body == b'{"a":1}'


@pytest.mark.parametrize(
    ("headers", "chunks", "kind"),
    [
        ({"content-length": "\u00b2"}, [b"{}"], "invalid_request"),  # isdigit() but not a number int() takes
        ({"content-length": "17", "content-type": "application/json"}, [b"{}"], "payload_too_large"),
        ({"content-type": "application/json"}, [b'{"a":"', b'0123456789"}'], "payload_too_large"),
        ({"content-type": "text/plain"}, [b"{}"], "unsupported_media_type"),
        ({"content-type": "application/json"}, [b"[1]"], "invalid_request"),
        ({"content-type": "application/json"}, [b"\xff"], "invalid_request"),
    ],
)
async def test_a_bad_write_is_refused_with_its_type(headers: dict[str, str], chunks: list[bytes], kind: str) -> None:
    with pytest.raises(ApiError) as caught:
        await _buffer(headers, *chunks)
    assert caught.value.type == kind


async def test_a_body_that_does_not_arrive_in_time_is_refused() -> None:
    never = asyncio.Event()

    async def receive() -> Message:
        await never.wait()
        raise AssertionError("unreachable")

    with pytest.raises(ApiError, match=r"within 0\.05s") as caught:
        await buffer_json_body({}, receive, max_bytes=16, timeout=0.05)
    assert caught.value.status == 400


# --- a small app over real HTTP -------------------------------------------------------------------------------


class _Missing(Exception):
    pass


class _Opened:
    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.closed = asyncio.Event()
        self.shutdown_calls = 0

    def begin_shutdown(self) -> None:
        self.shutdown_calls += 1

    async def frames(self) -> AsyncGenerator[bytes, None]:
        try:
            await self.release.wait()
            yield sse_message("one", id=1)
            await asyncio.Event().wait()  # then nothing until the client leaves
        finally:
            self.closed.set()


def _app(state: _Opened) -> FastAPI:
    app = FastAPI()
    app.state.begin_shutdown = state.begin_shutdown
    install_error_handlers(
        app,
        translators={_Missing: lambda exc: ApiError("not_found", f"missing: {exc}")},
        route_messages={404: "no such route"},
        logger=logging.getLogger("tests.http_plumbing"),
    )

    @app.get("/missing")
    async def missing() -> None:
        raise _Missing("thing")

    @app.get("/bug")
    async def bug() -> None:
        raise ZeroDivisionError("secret detail")

    @app.get("/number")
    async def number(n: int) -> dict[str, int]:
        return {"n": n}

    @app.get("/stream")
    async def stream(wait: bool = False) -> EventStreamResponse:
        return EventStreamResponse(state.frames(), wait_for_first_frame=wait)

    return app


@asynccontextmanager
async def _serving(state: _Opened) -> AsyncIterator[httpx.AsyncClient]:
    async with (
        open_http_server(_app(state), graceful_timeout=1.0) as running,
        httpx.AsyncClient(base_url=running.url, timeout=5.0) as client,
    ):
        yield client


async def test_every_error_is_the_envelope(caplog: pytest.LogCaptureFixture) -> None:
    state = _Opened()
    async with _serving(state) as client:
        translated = await client.get("/missing")
        unknown = await client.get("/nowhere")
        invalid = await client.get("/number", params={"n": "x"})
        with caplog.at_level(logging.ERROR, logger="tests.http_plumbing"):
            bug = await client.get("/bug")
    assert (translated.status_code, translated.json()["error"]) == (
        404,
        {"type": "not_found", "message": "missing: thing"},
    )
    assert (unknown.status_code, unknown.json()["error"]["message"]) == (404, "no such route")
    assert (invalid.status_code, invalid.json()["error"]["type"]) == (400, "invalid_request")
    assert bug.status_code == 500
    assert bug.json()["error"]["type"] == "internal_error"
    assert "secret detail" not in bug.text
    assert any(record.exc_info and record.exc_info[0] is ZeroDivisionError for record in caplog.records)
    assert state.shutdown_calls == 1  # the app's shutdown step ran as the server stopped


async def test_an_event_stream_answers_at_once_and_closes_its_frames_when_the_client_leaves() -> None:
    state = _Opened()
    async with _serving(state) as client:
        async with asyncio.timeout(5), client.stream("GET", "/stream") as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            assert not state.release.is_set()  # the headers came before any frame
            state.release.set()
            chunks = response.aiter_bytes()
            assert _parse_sse(await anext(chunks)) == [{"id": "1", "data": "one"}]
        async with asyncio.timeout(5):
            await state.closed.wait()


async def test_an_event_stream_can_wait_for_its_first_frame_before_answering() -> None:
    state = _Opened()
    async with _serving(state) as client:
        opening = asyncio.create_task(client.send(client.build_request("GET", "/stream?wait=true"), stream=True))
        done, _ = await asyncio.wait({opening}, timeout=0.3)
        assert not done  # no headers while the generator has not yielded
        state.release.set()
        async with asyncio.timeout(5):
            response = await opening
        try:
            assert response.status_code == 200
            assert _parse_sse(await anext(response.aiter_bytes())) == [{"id": "1", "data": "one"}]
        finally:
            await response.aclose()


@pytest.mark.parametrize("wait", [False, True])
async def test_a_last_chunk_goes_out_with_the_end_of_the_response(wait: bool) -> None:
    closed = asyncio.Event()

    async def frames() -> AsyncGenerator[bytes, None]:
        try:
            if not wait:
                yield b"data: a\n\n"
            yield LastChunk(b"data: b\n\n")
            yield b"data: never\n\n"
        finally:
            closed.set()

    sent: list[MutableMapping[str, Any]] = []

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    async def receive() -> MutableMapping[str, Any]:
        await asyncio.Event().wait()  # the client stays
        raise AssertionError("unreachable")

    response = EventStreamResponse(frames(), wait_for_first_frame=wait)
    await asyncio.wait_for(response({"type": "http"}, receive, send), 5)
    bodies = [(m["body"], m["more_body"]) for m in sent if m["type"] == "http.response.body"]
    expected = [(b"data: b\n\n", False)] if wait else [(b"data: a\n\n", True), (b"data: b\n\n", False)]
    assert bodies == expected  # the end rides with the last chunk: no empty write after it
    assert closed.is_set()
