"""The feed writes each batch of frames straight to a parked live stream's connection (`DirectChannel`), encoded
and joined once: every stream still gets every event exactly once, in order; a client that stops reading makes
the channel refuse, its frames go to its bounded buffer and then the log, and it loses nothing while the other
streams carry on; on a server without the direct path (h11) the streams work as before."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from loopd._infra.http import DirectChannel
from loopd._infra.serving import open_http_server
from loopd._infra.sse import parse_sse, split_sse
from tests.server_http.support import TOKEN, Frame, Rig, ask, frames_of, new_conversation, real_client, text_events
from tests.support.waiting import eventually

Entry = tuple[int, str, int, dict[str, Any]]


async def _log(rig: Rig, conversation_id: str) -> list[Entry]:
    async with rig.db.transaction(read_only=True) as tx:
        events = await tx.message_events.read_conversation_events(conversation_id)
    return [(e.cursor, e.message_id, e.seq, e.event) for e in events]


def _entries(frames: list[Frame]) -> list[Entry]:
    return [
        (f.id, f.data["message_id"], f.data["seq"], f.data["event"])
        for f in frames
        if f.id is not None and f.data is not None
    ]


def _is_end_of(frame: Frame, message_id: str) -> bool:
    return frame.data is not None and frame.data["message_id"] == message_id and frame.data["event"]["op"] == "end"


def _append(piece: str) -> list[dict[str, Any]]:
    return [{"op": "append", "mask": "block.content", "block": {"id": "a", "content": piece}}]


@asynccontextmanager
async def _served(rig: Rig, http: str) -> AsyncIterator[str]:
    async with open_http_server(rig.app, graceful_timeout=2.0, http=http) as running:  # type: ignore[arg-type]
        yield running.url


async def _follow(url: str, rig: Rig, cid: str, response_id: str) -> list[Frame]:
    got: list[Frame] = []
    user = real_client(rig, url)
    async with (
        httpx.AsyncClient(base_url=url, headers=dict(user.headers), timeout=10) as own,
        own.stream("GET", f"/v1/conversations/{cid}/stream?after=0") as response,
    ):
        async for frame in frames_of(response):
            got.append(frame)
            if _is_end_of(frame, response_id):
                break
    return got


@dataclass
class _Question:
    """A question being answered on a served rig, with ``streams`` readers parked on its conversation's stream."""

    operator: httpx.AsyncClient
    conversation_id: str
    task_id: str
    readers: list[asyncio.Task[list[Frame]]]


@asynccontextmanager
async def _followed_question(rig: Rig, http: str, streams: int) -> AsyncIterator[_Question]:
    """Serve ``rig``, ask a question to operator:echo and park ``streams`` readers on it (bounded by 30 s)."""
    async with _served(rig, http) as url:
        user = real_client(rig, url)
        operator = real_client(rig, url, actor="operator:echo")
        cid = await new_conversation(user)
        accepted = await ask(user, cid)
        task_id, response_id = accepted["task_id"], accepted["response"]["id"]
        async with asyncio.timeout(30):
            readers = [asyncio.ensure_future(_follow(url, rig, cid, response_id)) for _ in range(streams)]
            await eventually(lambda: rig.conversations.feeds.statistics().subscriptions == streams)
            yield _Question(operator, cid, task_id, readers)


@pytest.mark.parametrize("backend", ["sqlite"])  # the feed is the same over PostgreSQL (test_feeds covers both)
@pytest.mark.parametrize(("http", "direct"), [("auto", True), ("h11", False)])
async def test_parked_streams_get_each_batch_written_directly_and_every_event_once_in_order(
    rig: Rig, http: str, direct: bool
) -> None:
    streams = 8
    feeds = rig.conversations.feeds
    async with _followed_question(rig, http, streams) as question:
        operator, task_id = question.operator, question.task_id
        posted = await operator.post(f"/v1/tasks/{task_id}/events", json={"events": text_events("a")})
        assert posted.status_code == 200
        for index in range(10):
            posted = await operator.post(f"/v1/tasks/{task_id}/events", json={"events": _append(str(index))})
            assert posted.status_code == 200
        assert (await operator.post(f"/v1/tasks/{task_id}/complete", json={})).status_code == 200
        results = await asyncio.gather(*question.readers)
    log = await _log(rig, question.conversation_id)
    for got in results:
        assert _entries(got) == log
    statistics = feeds.statistics()
    assert statistics.frames <= len(log)  # each event encoded once, whatever the number of streams
    if direct:
        assert statistics.written > 0  # batches went straight to the parked streams' connections
    else:
        assert statistics.written == 0  # no direct path on h11: the streams send for themselves
    assert statistics.detached == 0


class _RawStream:
    """A GET of the conversation stream on a socket with a tiny receive buffer, read only when asked."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.body = b""

    @classmethod
    async def open(cls, url: str, path: str) -> _RawStream:
        parts = urlsplit(url)
        host, port = parts.hostname or "127.0.0.1", parts.port or 80
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the server's writes back up quickly
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, (host, port))
        reader, writer = await asyncio.open_connection(sock=sock, limit=1 << 16)
        request = f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {TOKEN}\r\n\r\n"
        writer.write(request.encode())
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head
        assert b"transfer-encoding: chunked" in head.lower()
        return cls(reader, writer)

    async def read_until(self, done: Callable[[list[Entry]], bool], hint: bytes) -> list[Entry]:
        """Read (de-chunked) until ``done`` holds for the events so far (checked after a chunk with ``hint``)."""
        while True:
            size_line = await self.reader.readuntil(b"\r\n")
            size = int(size_line.strip(), 16)
            chunk = await self.reader.readexactly(size + 2)
            self.body += chunk[:-2]
            if hint in chunk:
                entries = _parsed(self.body)
                if done(entries):
                    return entries

    async def aclose(self) -> None:
        self.writer.close()
        await self.writer.wait_closed()


def _parsed(body: bytes) -> list[Entry]:
    found, _rest = split_sse(body.decode())
    entries: list[Entry] = []
    for text in found:
        message = parse_sse(text)
        if message.id and message.data is not None:
            data = json.loads(message.data)
            entries.append((int(message.id), data["message_id"], data["seq"], data["event"]))
    return entries


@pytest.mark.parametrize("backend", ["sqlite"])
async def test_a_client_that_stops_reading_is_refused_direct_writes_detached_and_still_gets_every_event_once(
    rig: Rig,
) -> None:
    feeds = rig.conversations.feeds
    feeds.buffer = 4  # a few frames waiting, then the stream goes back to the log
    big = "x" * 400_000
    async with _served(rig, "auto") as url:
        user = real_client(rig, url)
        operator = real_client(rig, url, actor="operator:echo")
        cid = await new_conversation(user)
        accepted = await ask(user, cid)
        task_id, response_id = accepted["task_id"], accepted["response"]["id"]
        async with asyncio.timeout(45):
            slow = await _RawStream.open(url, f"/v1/conversations/{cid}/stream?after=0")
            try:
                fast = asyncio.ensure_future(_follow(url, rig, cid, response_id))
                await eventually(lambda: feeds.statistics().subscriptions == 2)
                for index in range(24):  # ~9.6 MB: more than the slow connection's kernel and write buffers
                    events = [{"op": "set", "block": {"id": "a", "type": "text", "content": f"{index}:{big}"}}]
                    posted = await operator.post(f"/v1/tasks/{task_id}/events", json={"events": events})
                    assert posted.status_code == 200
                await eventually(lambda: feeds.statistics().detached >= 1)
                assert (await operator.post(f"/v1/tasks/{task_id}/complete", json={})).status_code == 200
                fast_frames = await fast  # the other stream finished while the slow one still is not reading
                statistics = feeds.statistics()
                assert statistics.refused >= 1  # the slow connection's writes backed up: no direct write
                assert statistics.detached == 1  # only the slow stream fell behind
                slow_entries = await slow.read_until(
                    lambda got: any(e[1] == response_id and e[3]["op"] == "end" for e in got), b'"op":"end"'
                )
            finally:
                await slow.aclose()
    log = await _log(rig, cid)
    assert _entries(fast_frames) == log
    assert slow_entries == log  # from its buffer and then the log: nothing missing, nothing twice


def test_a_channel_without_a_direct_path_refuses_and_writes_nothing() -> None:
    channel = DirectChannel()
    assert not channel.write(b"data: x\n\n")  # not opened: the generator sends instead
    channel.open({"type": "http", "extensions": {}})  # no raw send published (another server)
    assert not channel.is_open
    assert not channel.write(b"data: x\n\n")
    channel.open({"type": "http", "extensions": {"loopd.raw_send": print}})  # not uvicorn's cycle
    assert not channel.is_open
    assert channel.writes == 0


@pytest.mark.parametrize("backend", ["sqlite"])
async def test_each_batch_is_framed_once_for_every_parked_stream(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    framed: list[bytes] = []
    frame = DirectChannel.frame

    def counted(body: bytes) -> bytes:
        framed.append(body)
        return frame(body)

    monkeypatch.setattr(DirectChannel, "frame", staticmethod(counted))
    streams, emits = 6, 8
    feeds = rig.conversations.feeds
    async with _followed_question(rig, "auto", streams) as question:
        operator, task_id = question.operator, question.task_id
        await operator.post(f"/v1/tasks/{task_id}/events", json={"events": text_events("a")})
        for index in range(emits):
            await operator.post(f"/v1/tasks/{task_id}/events", json={"events": _append(str(index))})
            await eventually(lambda: feeds.statistics().written >= streams)  # direct writes are happening
        assert (await operator.post(f"/v1/tasks/{task_id}/complete", json={})).status_code == 200
        results = await asyncio.gather(*question.readers)
    log = await _log(rig, question.conversation_id)
    for got in results:
        assert _entries(got) == log
    statistics = feeds.statistics()
    assert statistics.written >= streams * emits // 2  # most batches went straight to the connections
    # One framing per batch handed out (a stream that had sent part of a batch itself frames its rest alone).
    assert len(framed) <= statistics.frames + statistics.detached + statistics.refused
    assert len(framed) < statistics.written
