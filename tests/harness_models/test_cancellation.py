"""Cancelling the consumer, or closing the stream early, closes the HTTP stream: the server sees it go."""

from __future__ import annotations

import asyncio

import pytest

from loopd.harness.models._protocol import ModelChunk, TextDelta
from loopd.harness.models._scripted_server import FailWithStatus, ServerReply

from .conftest import Serve
from .helpers import ask

SLOW = ServerReply(text="x" * 200, chunk_size=1, chunk_delay=0.05)


async def test_cancelling_the_consuming_task_closes_the_server_stream(serve: Serve) -> None:
    served = await serve([SLOW, ServerReply(text="unused")])
    first = asyncio.Event()
    seen: list[ModelChunk] = []

    async def consume() -> None:
        async for chunk in served.model.stream(ask("hi")):
            seen.append(chunk)
            first.set()

    task = asyncio.create_task(consume())
    async with asyncio.timeout(30):
        await first.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    stats = await served.server.wait_until(lambda s: s.disconnected == 1)
    assert stats.requests == 1, "a cancelled call is not retried"
    assert stats.completed == 0
    assert all(isinstance(c, TextDelta) for c in seen)
    assert served.server.remaining == 1


async def test_closing_the_stream_early_closes_the_server_stream(serve: Serve) -> None:
    served = await serve([SLOW])
    stream = served.model.stream(ask("hi"))

    first = await anext(stream)
    await stream.aclose()  # type: ignore[attr-defined]

    assert isinstance(first, TextDelta)
    await served.server.wait_until(lambda s: s.disconnected == 1)


async def test_cancellation_during_backoff_propagates(serve: Serve) -> None:
    sleeping = asyncio.Event()

    async def never_wakes(seconds: float) -> None:
        sleeping.set()
        await asyncio.Event().wait()

    served = await serve([ServerReply(fault=FailWithStatus(status=503)), ServerReply(text="ok")], sleep=never_wakes)

    async def consume() -> None:
        async for _ in served.model.stream(ask("hi")):
            pass

    task = asyncio.create_task(consume())
    async with asyncio.timeout(5):
        await sleeping.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert served.server.statistics().requests == 1
