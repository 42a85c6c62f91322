"""The `server_streams` subscriber protocol: ticks counted once each, from LF (loopd) or CRLF (sse-starlette, the
LangGraph peer) framed SSE, across TCP reads that split a message; the response head is checked first."""

from __future__ import annotations

import asyncio
from array import array

from benchmarks.server_streams import _Subscriber

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def _subscriber(events: int) -> tuple[_Subscriber, array[float], asyncio.Future[str]]:
    connected: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    delays: array[float] = array("d")
    return _Subscriber(b"GET / HTTP/1.1\r\n\r\n", events, delays, connected), delays, connected


async def test_ticks_are_counted_once_from_lf_and_crlf_frames_split_across_reads() -> None:
    subscriber, delays, connected = _subscriber(3)
    lf = b'1a\r\nid: 1\ndata: {"t":"bench:0:1.5;"}\n\n\r\n'
    crlf = b'event: custom\r\ndata: {"tick":"bench:1:2.5;"}\r\n\r\n'
    repeat = b'data: {"t":"bench:0:1.5;"}\n\n'  # the same index again: not counted twice
    stream = HEAD + lf + crlf + repeat + b'data: "bench:2:3.5;"\n\ndata: "bench-done"\n\n'
    for start in range(0, len(stream), 7):  # TCP may cut anywhere
        subscriber.data_received(stream[start : start + 7])
    assert connected.result() == ""
    assert subscriber.received == 3 and bytes(subscriber.seen) == b"\x01\x01\x01"
    assert len(delays) == 3
    assert subscriber.finished.done()


async def test_a_response_that_is_not_an_event_stream_is_a_failure() -> None:
    subscriber, _delays, connected = _subscriber(1)
    subscriber.data_received(b"HTTP/1.1 401 Unauthorized\r\ncontent-type: application/json\r\n\r\n{}")
    assert connected.result().startswith("refused")
    assert subscriber.failed and subscriber.finished.done()
