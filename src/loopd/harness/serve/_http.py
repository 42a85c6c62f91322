"""HTTP plumbing shared by `loopd harness serve` and loop-server: mechanism only, no policy.

* Requests: `request_headers`, `host_name`, `is_loopback`, `WRITE_METHODS`, and `buffer_json_body`, which reads a
  write's body under a byte cap and a timeout, insists on one JSON object nested at most `MAX_JSON_DEPTH` levels
  (measured on the bytes, before anything parses them recursively), and hands the body on.
* Server-sent events: `sse_message` (one frame), `SSE_PING` (a heartbeat comment) and `EventStreamResponse`.
* Errors: `install_error_handlers` answers every exception a route raises with the error envelope of ``_errors``.
* Serving: `open_http_server` runs an app with uvicorn on a socket it binds, within start and stop timeouts; an
  app that must act before the server stops (end its event streams) puts that in ``app.state.begin_shutdown``.

Must not do: decide who may call (tokens, cookies, Origin and Host rules belong to each app's middleware), know any
route, or import anything of loopd beyond ``_errors``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import itertools
import json
import logging
import math
import re
import signal
import socket
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Generator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Final

import uvicorn
from fastapi.exceptions import RequestValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from loopd.harness.serve._errors import TYPE_OF_STATUS, ApiError, error_response

WRITE_METHODS: Final = frozenset({"POST", "PUT", "PATCH", "DELETE"})
SSE_PING: Final = b": ping\n\n"
_SSE_LINE_BREAK: Final = re.compile(r"\r\n|\r|\n")  # the only line ends SSE knows (str.splitlines knows more)
MAX_JSON_DEPTH: Final = 64
"""How deeply a request body may nest objects and arrays (``{}`` is depth 1); deeper is 400 ``invalid_request``."""
_JSON_STRING: Final = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKETS: Final = bytes(b for b in range(256) if b not in b"[]{}")
_BRACKET_STEP: Final = tuple(1 if b in b"[{" else -1 for b in range(256))
_START_TIMEOUT: Final = 10.0
_STOP_GRACE: Final = 15.0

# --- requests --------------------------------------------------------------------------------------------------


def request_headers(scope: Scope) -> dict[str, str]:
    """The request's headers by lower-case name (a repeated header keeps its last value)."""
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}


def host_name(value: str) -> str:
    """A ``Host`` header's name without the port (``[::1]:80`` → ``::1``)."""
    value = value.strip()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address, IPv6 with or without brackets) is this machine's loopback."""
    name = host.strip().strip("[]").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


async def buffer_json_body(headers: Mapping[str, str], receive: Receive, *, max_bytes: int, timeout: float) -> Receive:
    """Read a write's whole body and return a ``receive`` that hands it on (then defers to the original).

    Refuses, with `ApiError`: a ``Content-Length`` that is not a number (400) or above ``max_bytes`` (413); a body
    that grows past ``max_bytes`` as it arrives (413) or takes longer than ``timeout`` seconds (400); a client that
    leaves mid-body (400); a non-empty body without a JSON ``Content-Type`` (415) or that is not one JSON object (400).
    """
    length = headers.get("content-length")
    if length is not None:
        length = length.strip()
        if not (length.isascii() and length.isdigit()):
            raise ApiError("invalid_request", "Content-Length is not a number")
        if int(length) > max_bytes:
            raise ApiError("payload_too_large", f"the body is larger than {max_bytes} bytes")
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout):
            more = True
            while more:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise ApiError("invalid_request", "the client went away while sending the body")
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > max_bytes:
                    raise ApiError("payload_too_large", f"the body is larger than {max_bytes} bytes")
                chunks.append(chunk)
                more = bool(message.get("more_body", False))
    except TimeoutError as exc:
        raise ApiError("invalid_request", f"the body did not arrive within {timeout:g}s") from exc
    body = b"".join(chunks)
    if body.strip():
        if not _is_json(headers.get("content-type", "")):
            raise ApiError("unsupported_media_type", "writes take JSON: send 'Content-Type: application/json'")
        _check_json_object(body)
    replayed = False

    async def replay() -> Message:
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def json_depth(body: bytes) -> int:
    """How deeply JSON text nests objects and arrays, counted on the bytes without parsing or recursion (brackets
    inside strings do not count). Meant as a guard before parsing: text that is not JSON gets some number."""
    brackets = _JSON_STRING.sub(b"", body).translate(None, _NOT_BRACKETS)
    return max(itertools.accumulate(map(_BRACKET_STEP.__getitem__, brackets)), default=0)


def _check_json_object(body: bytes) -> None:
    opening = body.count(b"[") + body.count(b"{")
    if opening > MAX_JSON_DEPTH and json_depth(body) > MAX_JSON_DEPTH:
        raise ApiError("invalid_request", f"the body nests objects/arrays more than {MAX_JSON_DEPTH} levels deep")
    try:
        value = json.loads(body)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise ApiError("invalid_request", f"the body is not valid JSON: {str(exc)[:200]}") from exc
    if not isinstance(value, dict):
        raise ApiError("invalid_request", f"the body must be a JSON object, not {type(value).__name__}")


# --- server-sent events ----------------------------------------------------------------------------------------


def sse_message(text: str, *, event: str | None = None, id: str | int | None = None) -> bytes:
    """One SSE message: optional ``id:`` and ``event:`` lines, then ``text`` as ``data:`` lines."""
    lines: list[str] = []
    if id is not None:
        lines.append(f"id: {id}")
    if event is not None:
        lines.append(f"event: {event}")
    lines.extend(f"data: {line}" for line in _SSE_LINE_BREAK.split(text))
    return ("\n".join(lines) + "\n\n").encode()


class EventStreamResponse(StreamingResponse):
    """``text/event-stream`` that closes its frame generator as soon as the client leaves, not at its next write.

    Closing the generator is all that happens when the client goes away (a stream only observes). With
    ``wait_for_first_frame`` the headers go out only once the generator has yielded its first frame, so a client
    that sees the response start knows the stream is attached. A write that fails because the client is gone
    (``OSError``) ends the response quietly; any other error is raised.
    """

    media_type = "text/event-stream"

    def __init__(
        self,
        frames: AsyncGenerator[bytes, None],
        *,
        status_code: int = 200,
        headers: Mapping[str, str] | None = None,
        wait_for_first_frame: bool = False,
    ) -> None:
        base = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        super().__init__(frames, status_code=status_code, headers={**base, **(headers or {})})
        self._frames = frames
        self._wait_for_first_frame = wait_for_first_frame

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        streamer = asyncio.ensure_future(self._stream(send))
        watcher = asyncio.ensure_future(self._client_left(receive))
        try:
            await asyncio.wait({streamer, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (streamer, watcher):
                task.cancel()
            await asyncio.gather(streamer, watcher, return_exceptions=True)
        if not streamer.cancelled() and (error := streamer.exception()) is not None and not isinstance(error, OSError):
            raise error

    async def _stream(self, send: Send) -> None:
        async with contextlib.aclosing(self._frames) as frames:
            first = await anext(frames, b"") if self._wait_for_first_frame else b""
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            if first:
                await send({"type": "http.response.body", "body": first, "more_body": True})
            async for chunk in frames:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    @staticmethod
    async def _client_left(receive: Receive) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return


# --- errors ----------------------------------------------------------------------------------------------------


def install_error_handlers(
    app: Starlette,
    *,
    translators: Mapping[type[Exception], Callable[[Any], ApiError]] | None = None,
    route_messages: Mapping[int, str] | None = None,
    logger: logging.Logger | None = None,
) -> None:
    """Answer every exception a route raises with the error envelope; a bad request is never a 500.

    `ApiError` goes out as it is; an exception of a class in ``translators`` through its function (Starlette picks
    the most specific class along the exception's MRO); a validation error as 400 ``invalid_request`` (never 422);
    an ``HTTPException`` with the type of its status and its detail, or ``route_messages[status]`` when given (e.g.
    for 404 and 405); anything else as a bare 500 ``internal_error`` that names only the exception's class. With
    ``logger``, unhandled exceptions and translations to ``internal_error`` are logged with their traceback.
    """
    messages = dict(route_messages or {})

    def log(request: Request, exc: Exception, what: str) -> None:
        if logger is not None:
            logger.error("%s on %s %s", what, request.method, request.url.path, exc_info=exc)

    async def on_api_error(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return error_response(exc)

    def translating(translate: Callable[[Any], ApiError]) -> Callable[[Request, Exception], Awaitable[JSONResponse]]:
        async def on_error(request: Request, exc: Exception) -> JSONResponse:
            error = translate(exc)
            if error.type == "internal_error":
                log(request, exc, f"{type(exc).__name__} (answered as internal_error)")
            return error_response(error)

        return on_error

    async def on_validation_error(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return error_response(ApiError("invalid_request", _describe(exc)))

    async def on_http_error(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HTTPException)
        kind = TYPE_OF_STATUS.get(exc.status_code, "internal_error" if exc.status_code >= 500 else "invalid_request")
        status = 400 if exc.status_code == 422 else exc.status_code
        message = messages.get(exc.status_code, str(exc.detail))
        return error_response(ApiError(kind, message, status=status, headers=exc.headers))

    async def on_bug(request: Request, exc: Exception) -> JSONResponse:
        log(request, exc, "unhandled error")
        return error_response(ApiError("internal_error", f"internal error ({type(exc).__name__}); see the server log"))

    app.add_exception_handler(ApiError, on_api_error)
    for cls, translate in (translators or {}).items():
        app.add_exception_handler(cls, translating(translate))
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(HTTPException, on_http_error)
    app.add_exception_handler(Exception, on_bug)


def _describe(exc: RequestValidationError) -> str:
    problems = []
    for error in list(exc.errors())[:5]:
        where = ".".join(str(part) for part in error.get("loc", ()))
        problems.append(f"{where}: {error.get('msg', 'invalid')}" if where else str(error.get("msg", "invalid")))
    return "; ".join(problems) or "invalid request"


def drop_validation_responses(schema: dict[str, Any]) -> None:
    """Remove FastAPI's 422 responses and their schemas from an OpenAPI document (invalid requests are 400)."""
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            operation.get("responses", {}).pop("422", None)
    schemas = schema.get("components", {}).get("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)


# --- serving ---------------------------------------------------------------------------------------------------


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
        self._server.should_exit = True


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
        sock.listen(2048)  # many clients reconnecting at once (e.g. after a restart) must not be refused
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


@asynccontextmanager
async def open_http_server(
    app: Starlette,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    graceful_timeout: float = 10.0,
    handle_signals: bool = False,
    log_level: str = "warning",
) -> AsyncIterator[RunningServer]:
    """Serve ``app`` with uvicorn on ``host:port`` (``port=0``: a free one) until the block exits.

    Starting must finish within 10 s (an error while starting is raised). Leaving the block stops the server: the
    app's ``app.state.begin_shutdown()`` is called if it has one (it ends the app's event streams), uvicorn stops
    accepting and gives in-flight requests ``graceful_timeout`` seconds, then open connections are dropped and, as a
    last resort, the server task is cancelled; each step is bounded, and an error while stopping is not raised.
    With ``handle_signals`` (main thread only) SIGINT/SIGTERM stop the server gracefully; a second one stops waiting
    for open requests; nothing is re-raised.
    """
    on_shutdown = getattr(app.state, "begin_shutdown", None)
    sock = _bind(host, port)
    bound = int(sock.getsockname()[1])
    config = uvicorn.Config(
        app,
        lifespan="on",
        log_level=log_level,
        access_log=False,
        timeout_graceful_shutdown=max(1, math.ceil(graceful_timeout)),
    )
    server = _Server(config, on_shutdown if callable(on_shutdown) else None, handle_signals=handle_signals)
    task = asyncio.create_task(server.serve(sockets=[sock]), name=f"loopd-http-{bound}")
    try:
        async with asyncio.timeout(_START_TIMEOUT):
            while not server.started:
                if task.done():
                    task.result()  # raises why it could not start
                    raise RuntimeError("the HTTP server stopped while starting")
                await asyncio.sleep(0.01)
        url = f"http://[{host}]:{bound}" if ":" in host else f"http://{host}:{bound}"
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
            if task.done() and not task.cancelled():
                task.exception()  # an error while stopping leaves nothing to clean up here
        finally:
            sock.close()
