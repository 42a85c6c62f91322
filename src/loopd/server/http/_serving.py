"""`open_http_server`: serve an app with uvicorn on a socket we bind, and stop it in order.

Shutdown order: the app's streams are told to end (``app.state.begin_shutdown``) → uvicorn stops accepting and
lets in-flight requests finish (up to ``graceful_timeout``) → the app's lifespan stops the sweepers.
Must not do: parse command lines or print.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import socket
from collections.abc import AsyncIterator, Callable, Generator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Final

import uvicorn
from fastapi import FastAPI

_START_TIMEOUT: Final = 10.0


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, on_shutdown: Callable[[], None] | None, *, handle_signals: bool) -> None:
        super().__init__(config)
        self._on_shutdown = on_shutdown
        self._handle_signals = handle_signals

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        if self._handle_signals:
            with super().capture_signals():
                yield
        else:
            yield  # the caller owns the signals

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self._on_shutdown is not None:
            self._on_shutdown()
        await super().shutdown(sockets)


@dataclass(frozen=True)
class RunningHttpServer:
    url: str
    host: str
    port: int
    _server: _Server
    _task: asyncio.Task[None]

    def stop(self) -> None:
        self._server.should_exit = True

    async def wait(self) -> None:
        await asyncio.shield(self._task)


@asynccontextmanager
async def open_http_server(
    app: FastAPI,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    graceful_timeout: float = 10.0,
    log_level: str = "warning",
    handle_signals: bool = False,
) -> AsyncIterator[RunningHttpServer]:
    """Serve ``app`` on ``host:port`` for the duration of the block (``port=0``: a free port). With
    ``handle_signals`` (main thread only), Ctrl-C / SIGTERM stop the server like uvicorn does."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    bound_port = int(sock.getsockname()[1])
    config = uvicorn.Config(
        app,
        log_level=log_level,
        timeout_graceful_shutdown=max(1, math.ceil(graceful_timeout)),
        lifespan="on",
        access_log=False,
    )
    on_shutdown = getattr(app.state, "begin_shutdown", None)
    server = _Server(config, on_shutdown if callable(on_shutdown) else None, handle_signals=handle_signals)
    task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]), name="loopd-http-server")
    try:
        async with asyncio.timeout(_START_TIMEOUT):
            while not server.started:
                if task.done():
                    await task  # re-raise why it could not start
                    raise RuntimeError("the HTTP server stopped while starting")
                await asyncio.sleep(0.01)
        yield RunningHttpServer(_url(host, bound_port), host, bound_port, server, task)
    finally:
        server.should_exit = True
        try:
            async with asyncio.timeout(graceful_timeout + 5):
                await asyncio.shield(task)
        except TimeoutError:
            task.cancel()
        finally:
            sock.close()
