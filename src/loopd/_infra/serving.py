"""The one uvicorn runner of loopd: `open_http_server` serves an ASGI app on a socket it binds, inside the caller's
event loop, until the block exits. loop-server, ``loopd harness serve``, the Kubernetes-compatible resource API
(over TLS) and the scripted OpenAI-compatible model server all run through it.

What every server gets: a TCP socket with ``TCP_NODELAY`` and a listen backlog of 2048 (many clients reconnecting
at once, e.g. after a restart, must not be refused); uvicorn's fastest HTTP/1.1 parser that is installed (httptools,
else h11; ``http="h11"`` pins the pure-Python one); no websockets; start and stop within bounded times; and the
server's own ``send`` in every HTTP request's scope (``loopd._infra.http.RAW_SEND``), so an event stream's fan-out
can write pre-encoded frames without the middleware chain (``DirectChannel``).

Must not do: decide who may call, which host is safe to bind (each caller's policy), or configure logging beyond
uvicorn's own loggers (and not even those with ``log_level=None``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import signal
import socket
from collections.abc import AsyncIterator, Callable, Generator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

import uvicorn

from loopd._infra.http import publish_raw_send, withdraw_raw_send
from loopd._infra.logs import is_configured

__all__ = ["BACKLOG", "RunningServer", "open_http_server"]

BACKLOG: Final = 2048
_STOP_GRACE: Final = 15.0
_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunningServer:
    """A server started by `open_http_server`: where it listens, and how to stop it or wait for it."""

    url: str
    host: str
    port: int
    _server: _Server
    _task: asyncio.Task[None]

    async def wait(self) -> None:
        """Until the server stops (a signal when it handles them, or `stop`)."""
        await asyncio.shield(self._task)

    def stop(self) -> None:
        """Ask the server to stop (gracefully); leaving `open_http_server`'s block waits for it."""
        self._server.should_exit = True


class _PublishRawSend:
    """The ASGI app, with the server's own ``send`` published in each HTTP request's scope first."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        publish_raw_send(scope, send)
        try:
            await self.app(scope, receive, send)
        finally:
            # uvicorn's request cycle holds the scope, and ``send`` is the cycle's own method: a reference cycle
            # per request until the cyclic collector finds it. Taken out once the request is over.
            withdraw_raw_send(scope)


class _Server(uvicorn.Server):
    """uvicorn that calls ``on_shutdown`` before it stops accepting, and optionally handles SIGINT/SIGTERM itself:
    the first asks for a graceful stop, a second stops waiting for open requests; nothing is re-raised after."""

    def __init__(self, config: uvicorn.Config, on_shutdown: Callable[[], None] | None, *, handle_signals: bool) -> None:
        super().__init__(config)
        self._on_shutdown = on_shutdown
        self._handle_signals = handle_signals

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        if not self._handle_signals:
            yield  # the caller owns the signals
            return
        loop = asyncio.get_running_loop()
        installed: list[signal.Signals] = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, self._on_signal)
                installed.append(sig)
        try:
            yield
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)

    def _on_signal(self) -> None:
        if self.should_exit:
            self.force_exit = True
        self.should_exit = True

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self._on_shutdown is not None:
            self._on_shutdown()
        await super().shutdown(sockets)


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto=IPPROTO_TCP matters: asyncio turns Nagle off (TCP_NODELAY) only for sockets that say they are TCP;
    # with proto 0 a response's body waits ~40 ms for the ACK of its headers on a kept-alive connection.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


@asynccontextmanager
async def open_http_server(
    app: Any,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    graceful_timeout: float = 10.0,
    start_timeout: float = 10.0,
    handle_signals: bool = False,
    lifespan: Literal["on", "off"] = "on",
    log_level: str | None = "warning",
    http: Literal["auto", "h11"] = "auto",
    tls_cert: Path | None = None,
    tls_key: Path | None = None,
) -> AsyncIterator[RunningServer]:
    """Serve ``app`` with uvicorn on ``host:port`` (``port=0``: a free one) until the block exits.

    Starting must finish within ``start_timeout`` seconds (an error while starting is raised). Leaving the block
    stops the server: the app's ``app.state.begin_shutdown()`` is called if it has one (it ends the app's event
    streams), uvicorn stops accepting and gives in-flight requests ``graceful_timeout`` seconds, then open
    connections are dropped and, as a last resort, the server task is cancelled; each step is bounded, and an error
    while stopping is logged, not raised. With ``handle_signals`` (main thread only) SIGINT/SIGTERM stop the server
    gracefully; a second one stops waiting for open requests; nothing is re-raised.

    Options: ``lifespan="off"`` for an app without startup/shutdown events; ``log_level=None`` leaves every logger
    as the process configured it (otherwise uvicorn's own loggers are set to that level), and so does a process
    whose logging `loopd._infra.logs.configure_logging` set up (the CLI's ``--log-level``); ``http="h11"`` pins the
    pure-Python HTTP/1.1 parser (the scripted model server keeps the h11 its fault injection — a connection
    dropped mid-reply, a client leaving — was written and tested with; TLS works with either parser: the resource
    API has always served TLS with httptools); ``tls_cert`` and ``tls_key`` (PEM files, both or neither) serve
    HTTPS, as the resource API does, and the URL's scheme says so.
    """
    if (tls_cert is None) != (tls_key is None):
        raise ValueError("TLS needs both a certificate and its key")
    state = getattr(app, "state", None)
    on_shutdown = getattr(state, "begin_shutdown", None) if state is not None else None
    follow_process = log_level is None or is_configured()  # the CLI configured logging: uvicorn follows it
    logging_options: dict[str, Any] = (
        {"log_config": None, "log_level": None} if follow_process else {"log_level": log_level}
    )
    tls_options: dict[str, Any] = (
        {"ssl_certfile": str(tls_cert), "ssl_keyfile": str(tls_key)} if tls_cert is not None else {}
    )
    sock = _bind(host, port)
    bound = int(sock.getsockname()[1])
    try:
        config = uvicorn.Config(
            _PublishRawSend(app),
            lifespan=lifespan,
            http=http,
            ws="none",  # no loopd app speaks websockets
            access_log=False,
            timeout_graceful_shutdown=max(1, math.ceil(graceful_timeout)),
            **logging_options,
            **tls_options,
        )
        server = _Server(config, on_shutdown if callable(on_shutdown) else None, handle_signals=handle_signals)
    except BaseException:
        sock.close()
        raise
    task = asyncio.create_task(server.serve(sockets=[sock]), name=f"loopd-http-{bound}")
    try:
        async with asyncio.timeout(start_timeout):
            while not server.started:
                if task.done():
                    task.result()  # raises why it could not start
                    raise RuntimeError("the HTTP server stopped while starting")
                await asyncio.sleep(0.01)
        scheme = "https" if tls_cert is not None else "http"
        url = f"{scheme}://[{host}]:{bound}" if ":" in host else f"{scheme}://{host}:{bound}"
        yield RunningServer(url=url, host=host, port=bound, _server=server, _task=task)
    finally:
        try:
            server.should_exit = True
            done, _ = await asyncio.wait({task}, timeout=graceful_timeout + _STOP_GRACE)
            if not done:
                server.force_exit = True
                done, _ = await asyncio.wait({task}, timeout=_STOP_GRACE)
            if not done:
                task.cancel()
                await asyncio.wait({task}, timeout=_STOP_GRACE)
            error = task.exception() if task.done() and not task.cancelled() else None
            if error is not None and server.started:  # an error while starting was raised above
                _log.error("the HTTP server on %s:%d stopped with an error", host, bound, exc_info=error)
        finally:
            sock.close()
