"""A scripted OpenAI-compatible model served from its own thread, for tests that drive real `loopd` processes."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from loopd.harness.models import ScriptedServer, open_scripted_server

START_TIMEOUT = 15.0


@contextlib.contextmanager
def scripted_model_thread(server: ScriptedServer, *, name: str) -> Iterator[str]:
    """Serve ``server`` on loopback from a daemon thread (its own event loop) for the block; yields its base URL.
    The server stops and the thread is joined (bounded) on exit."""
    ready = threading.Event()
    box: dict[str, Any] = {}

    async def serve() -> None:
        stop = asyncio.Event()
        box["stop"], box["loop"] = stop, asyncio.get_running_loop()
        async with open_scripted_server(server) as base_url:
            box["url"] = base_url
            ready.set()
            await stop.wait()

    thread = threading.Thread(target=asyncio.run, args=(serve(),), name=name, daemon=True)
    thread.start()
    try:
        if not ready.wait(START_TIMEOUT):
            raise AssertionError("the scripted model did not start")
        yield str(box["url"])
    finally:
        if "loop" in box:
            box["loop"].call_soon_threadsafe(box["stop"].set)
        thread.join(START_TIMEOUT)
