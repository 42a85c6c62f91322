"""HTTP request mechanism shared by loopd's servers: mechanism only, no policy.

* Requests: `request_headers`, `host_name`, `is_loopback`, `peer_is_loopback` (the connection's peer address, never
  a header) and `WRITE_METHODS`.
* Bodies: `buffer_json_body` reads a write's body under a byte cap and a timeout, insists on one JSON object nested
  at most `MAX_JSON_DEPTH` levels (measured on the bytes by `json_depth`, before anything parses them recursively),
  and hands the body on; it refuses with `ApiError` (the envelope of ``http_errors``).
* Event streams: `EventStreamResponse`, a ``text/event-stream`` response that notices a client leaving (the frames
  themselves are ``loopd._infra.sse``'s), and `DirectChannel`: once such a response has started, a fan-out may
  write pre-encoded body bytes straight to the connection (`DirectChannel.write`), without a task wake-up or the
  ASGI ``send`` chain per write, when the server published its raw ``send`` (`RAW_SEND`, set by
  ``loopd._infra.serving``) and it is uvicorn's httptools cycle; otherwise, or while the connection's writes are
  paused, `write` says no and the caller sends through the response as usual.

Must not do: decide who may call (tokens, cookies, Origin and Host rules belong to each app's middleware), know
any route, or import anything of loopd outside ``loopd._infra``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import itertools
import json
import re
from collections.abc import AsyncGenerator, Mapping
from typing import Any, Final

from starlette.responses import StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from loopd._infra.http_errors import ApiError
from loopd._infra.tasks import race

__all__ = [
    "MAX_JSON_DEPTH",
    "RAW_SEND",
    "RELAY_HEADERS",
    "WRITE_METHODS",
    "DirectChannel",
    "EventStreamResponse",
    "LastChunk",
    "buffer_json_body",
    "host_name",
    "is_loopback",
    "json_depth",
    "peer_is_loopback",
    "publish_raw_send",
    "request_headers",
    "withdraw_raw_send",
]

WRITE_METHODS: Final = frozenset({"POST", "PUT", "PATCH", "DELETE"})
MAX_JSON_DEPTH: Final = 64
"""How deeply a request body may nest objects and arrays (``{}`` is depth 1); deeper is 400 ``invalid_request``."""
RELAY_HEADERS: Final = frozenset({b"forwarded", b"x-forwarded-for", b"x-real-ip"})
RAW_SEND: Final = "loopd.raw_send"
"""The key, in a request scope's ``extensions``, of the server's own ``send`` (before any middleware wraps it)."""
"""Headers a reverse proxy adds: a loopback peer that sends one relays a client from elsewhere."""

_JSON_STRING: Final = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKETS: Final = bytes(b for b in range(256) if b not in b"[]{}")
_BRACKET_STEP: Final = tuple(1 if b in b"[{" else -1 for b in range(256))

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


def peer_is_loopback(scope: Scope) -> bool:
    """Whether the request comes from this machine: its connection's peer address (ASGI ``client``) is loopback —
    a header never makes it so — and it was not relayed by a reverse proxy on this machine (`RELAY_HEADERS`)."""
    client = scope.get("client")
    if not client or not isinstance(client[0], str):
        return False  # an unknown peer is not trusted
    address = client[0].strip().lower().removeprefix("::ffff:")  # IPv4-mapped IPv6 on dual-stack sockets
    if address == "localhost" or not is_loopback(address):
        return False
    return not any(name.lower() in RELAY_HEADERS for name, _ in scope.get("headers", ()))


# --- bodies ----------------------------------------------------------------------------------------------------


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


# --- event streams ---------------------------------------------------------------------------------------------


class _CycleWriter:
    """Body bytes straight onto uvicorn's httptools connection for a started chunked response (what its ``send``
    does for ``http.response.body`` with ``more_body``, minus the awaits). The bytes come framed as chunks
    (`DirectChannel.frame`); what cannot change while the response streams is checked once, when it opens."""

    __slots__ = ("_cycle", "_flow", "_transport")

    _NEEDS: Final = ("transport", "flow", "chunked_encoding", "response_started", "response_complete", "disconnected")

    def __init__(self, cycle: Any) -> None:
        self._cycle = cycle
        self._transport = cycle.transport
        self._flow = cycle.flow

    @classmethod
    def of(cls, send: object) -> _CycleWriter | None:
        """A writer for ``send`` when it is uvicorn's httptools ``RequestResponseCycle.send`` of a response that
        has started with chunked encoding, else None."""
        cycle: Any = getattr(send, "__self__", None)
        if cycle is None or not type(cycle).__module__.startswith("uvicorn.protocols.http.httptools"):
            return None
        if not all(hasattr(cycle, name) for name in cls._NEEDS):
            return None
        if not cycle.response_started or cycle.chunked_encoding is not True:
            return None
        return cls(cycle)

    def write(self, chunk: bytes) -> bool:
        cycle = self._cycle
        if self._flow.write_paused or cycle.disconnected or cycle.response_complete:
            return False
        transport = self._transport
        if transport.is_closing():
            return False
        transport.write(chunk)
        return True


class DirectChannel:
    """Lets a fan-out write body bytes of one started `EventStreamResponse` straight to its connection.

    The response opens it once its headers went out (`open`, from the server's raw ``send``) and closes it when
    it ends. `write` is synchronous: True when the bytes are on the connection, False when they must go through the
    response's own frame generator instead (no direct path on this server, the connection's write buffer is over
    its high-water mark, the client left, or the response is not streaming). Whoever writes must only do so while
    the frame generator has nothing of its own in flight, so the bytes keep their order. The bytes skip the app's
    middleware: use it only where no middleware transforms a response body (none of loopd's does; a compressing
    one would have to be kept off event streams). A fan-out that writes the same bytes to many channels frames
    them once (`frame`) and hands each channel the framed bytes (`write_framed`).
    """

    __slots__ = ("_writer", "writes")

    def __init__(self) -> None:
        self._writer: _CycleWriter | None = None
        self.writes = 0
        """Chunks written directly so far."""

    @staticmethod
    def frame(body: bytes) -> bytes:
        """``body`` (not empty) framed for `write_framed`: an HTTP/1.1 chunk, the only framing a channel opens on."""
        if not body:
            raise ValueError("an empty chunk would end the response")
        return b"%x\r\n%b\r\n" % (len(body), body)

    @property
    def is_open(self) -> bool:
        """Whether a direct write may succeed now (it can still say no)."""
        return self._writer is not None

    def open(self, scope: Scope) -> None:
        """Use the raw ``send`` the server published in ``scope`` (`RAW_SEND`), if it is one this can write to."""
        extensions = scope.get("extensions") or {}
        self._writer = _CycleWriter.of(extensions.get(RAW_SEND))

    def close(self) -> None:
        self._writer = None

    def write(self, body: bytes) -> bool:
        """Put ``body`` on the connection now (True), or refuse (False) without writing anything."""
        if not body:
            return True
        return self.write_framed(self.frame(body))

    def write_framed(self, framed: bytes) -> bool:
        """`write` for bytes `frame` made (once, for every channel they go to)."""
        writer = self._writer
        if writer is None or not writer.write(framed):
            return False
        self.writes += 1
        return True


def publish_raw_send(scope: Scope, send: Send) -> None:
    """Put the server's own ``send`` in ``scope`` (`RAW_SEND`) for `DirectChannel` (``loopd._infra.serving`` calls
    this before any middleware wraps ``send``)."""
    extensions = scope.get("extensions")
    if extensions is None:
        extensions = scope["extensions"] = {}
    extensions[RAW_SEND] = send


def withdraw_raw_send(scope: Scope) -> None:
    """Take `publish_raw_send`'s ``send`` out of ``scope`` again (its request is over)."""
    extensions = scope.get("extensions")
    if extensions is not None:
        extensions.pop(RAW_SEND, None)


class LastChunk(bytes):
    """A frame generator's last chunk for `EventStreamResponse`: it goes out with the response's end, in one write
    (otherwise the end is a write of its own after it — a packet and a wake-up of the client for 5 bytes)."""

    __slots__ = ()


class EventStreamResponse(StreamingResponse):
    """``text/event-stream`` that closes its frame generator as soon as the client leaves, not at its next write.

    Closing the generator is all that happens when the client goes away (a stream only observes). With
    ``wait_for_first_frame`` the headers go out only once the generator has yielded its first frame, so a client
    that sees the response start knows the stream is attached. A write that fails because the client is gone
    (``OSError``) ends the response quietly; any other error is raised. With ``direct``, the channel is open
    (`DirectChannel`) from the moment the headers went out until the response ends. A `LastChunk` ends the response:
    it goes out with the end in one write, and the generator is closed after it.
    """

    media_type = "text/event-stream"

    def __init__(
        self,
        frames: AsyncGenerator[bytes, None],
        *,
        status_code: int = 200,
        headers: Mapping[str, str] | None = None,
        wait_for_first_frame: bool = False,
        direct: DirectChannel | None = None,
    ) -> None:
        base = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        super().__init__(frames, status_code=status_code, headers={**base, **(headers or {})})
        self._frames = frames
        self._wait_for_first_frame = wait_for_first_frame
        self._direct = direct

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # The stream and the watcher for the client leaving: the first to end cancels the other (one TaskGroup).
        try:
            streamed, _left = await race(
                self._stream(scope, send), self._client_left(receive), names=("sse-stream", "sse-left")
            )
        finally:
            if self._direct is not None:
                self._direct.close()
        if streamed.error is not None and not isinstance(streamed.error, OSError):
            raise streamed.error

    async def _stream(self, scope: Scope, send: Send) -> None:
        async with contextlib.aclosing(self._frames) as frames:
            first = await anext(frames, b"") if self._wait_for_first_frame else b""
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            if self._direct is not None:
                self._direct.open(scope)
            last = b""
            if type(first) is LastChunk:
                last = bytes(first)
            else:
                if first:
                    await send({"type": "http.response.body", "body": first, "more_body": True})
                async for chunk in frames:
                    if type(chunk) is LastChunk:
                        last = bytes(chunk)
                        break  # the generator is closed by `aclosing`
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            if self._direct is not None:
                self._direct.close()  # nothing may be written after the last chunk
            await send({"type": "http.response.body", "body": last, "more_body": False})

    @staticmethod
    async def _client_left(receive: Receive) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
