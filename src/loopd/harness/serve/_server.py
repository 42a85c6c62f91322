"""Running the API: uvicorn on a socket we bind, a graceful shutdown, and `serve` for the standard rig.

Shutdown order (Ctrl-C / SIGTERM, or leaving `open_harness_server`): stop accepting connections and end the event
streams → let in-flight requests finish (up to ``graceful_timeout``) → the app's lifespan shuts every live session
down (drained, ``session_stopped`` journaled) → `serve` closes the rig (journal, model).

Refusal rule: a server bound to a non-loopback host must have a token (`check_bind`); on loopback it is optional.

Must not do: parse command lines or print (the CLI does).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
from collections.abc import AsyncIterator, Callable, Generator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Final

import uvicorn
from fastapi import FastAPI

from loopd.harness.serve._app import IDEMPOTENCY_FILE, create_app, registry_of
from loopd.harness.serve._guard import is_loopback
from loopd.harness.standard import HarnessSettings, open_standard_rig

_START_TIMEOUT: Final = 10.0
_STOP_GRACE: Final = 15.0


class InsecureBindError(ValueError):
    """Refused: serving a non-loopback address without a bearer token (or with an empty one)."""


def check_bind(host: str, token: str | None) -> None:
    """Raise `InsecureBindError` unless ``host`` is loopback or a non-empty ``token`` is set."""
    if token is not None and not token.strip():
        raise InsecureBindError("the token is empty; pass a real token or none")
    if token is None and not is_loopback(host):
        raise InsecureBindError(
            f"refusing to serve {host!r} without a token: anyone who can reach it could run tools in your "
            "workspace. Set --token (or LOOPD_HARNESS_TOKEN), or bind 127.0.0.1"
        )


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


@dataclass(frozen=True)
class RunningServer:
    url: str
    host: str
    port: int
    _server: _Server
    _task: asyncio.Task[None]

    async def wait(self) -> None:
        """Until the server stops (a signal when it handles them, or `stop`)."""
        await asyncio.shield(self._task)

    def stop(self) -> None:
        self._server.should_exit = True


class _Server(uvicorn.Server):
    """uvicorn with our shutdown order and, optionally, our own SIGINT/SIGTERM handling (nothing re-raised)."""

    def __init__(self, config: uvicorn.Config, app: FastAPI, *, handle_signals: bool) -> None:
        super().__init__(config)
        self._app = app
        self._handle_signals = handle_signals

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        if not self._handle_signals:
            yield
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
            self.force_exit = True  # a second Ctrl-C stops waiting for open requests
        self.should_exit = True

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        registry_of(self._app).begin_shutdown()
        await super().shutdown(sockets)


@asynccontextmanager
async def open_harness_server(
    app: FastAPI,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    graceful_timeout: float = 10.0,
    handle_signals: bool = False,
    log_level: str = "warning",
) -> AsyncIterator[RunningServer]:
    """Serve ``app`` (from `create_app`) on ``host:port`` until the block exits; ``port=0`` picks a free port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto=IPPROTO_TCP matters: asyncio turns Nagle off (TCP_NODELAY) only for sockets that say they are TCP;
    # with proto 0 a response's body waits ~40 ms for the ACK of its headers on a kept-alive connection.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, port))
        sock.listen(128)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    bound = int(sock.getsockname()[1])
    config = uvicorn.Config(
        app,
        lifespan="on",
        log_level=log_level,
        access_log=False,
        timeout_graceful_shutdown=max(1, round(graceful_timeout)),
    )
    server = _Server(config, app, handle_signals=handle_signals)
    task = asyncio.create_task(server.serve(sockets=[sock]), name=f"loopd-harness-serve-{bound}")
    try:
        async with asyncio.timeout(_START_TIMEOUT):
            while not server.started:
                if task.done():
                    task.result()
                    raise RuntimeError("the harness server stopped during startup")
                await asyncio.sleep(0.01)
        yield RunningServer(url=_url(host, bound), host=host, port=bound, _server=server, _task=task)
    finally:
        server.should_exit = True
        done, _ = await asyncio.wait({task}, timeout=graceful_timeout + _STOP_GRACE)
        if not done:
            server.force_exit = True
            await asyncio.wait({task}, timeout=_STOP_GRACE)
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        elif not task.cancelled():
            task.exception()  # an error while stopping leaves nothing to clean up here
        sock.close()


async def serve(
    settings: HarnessSettings,
    host: str = "127.0.0.1",
    port: int = 8765,
    token: str | None = None,
    *,
    on_ready: Callable[[RunningServer], None] | None = None,
    handle_signals: bool = True,
    **app_options: Any,
) -> None:
    """Serve the standard rig for ``settings`` until SIGINT/SIGTERM, then shut down gracefully.

    Raises `InsecureBindError` before binding anything when ``host`` is not loopback and there is no token.
    Idempotency keys are kept in ``<data_dir>/serve-idempotency.db`` beside the journal.
    """
    check_bind(host, token)
    async with open_standard_rig(settings) as rig:
        app = create_app(rig, token=token, idempotency_path=settings.data_dir / IDEMPOTENCY_FILE, **app_options)
        async with open_harness_server(app, host=host, port=port, handle_signals=handle_signals) as running:
            if on_ready is not None:
                on_ready(running)
            await running.wait()
