"""`StreamingAsgiTransport`: an httpx2 transport to an ASGI app in this process, with the response body streamed.

The demo model (`open_model` for ``demo``) is served by the scripted OpenAI-compatible app in the same process as
the adapter that calls it. Through this transport the adapter still builds its HTTP request and parses the streamed
answer (the whole provider path), but no socket, HTTP/1.1 parser or connection pool sits in between: on `loopd up`
under 100 concurrent chats those were about a tenth of the server's CPU.

httpx2's own ``ASGITransport`` hands a response over only once the app has finished it; this one hands it over at
the app's ``http.response.start`` and streams the body as the app sends it, through a bounded buffer (the app waits
while the client reads slowly): each read returns every chunk sent since the previous read, as a socket read returns
what has arrived, so a paced answer still arrives piece by piece and a burst in one read.

How it stays equivalent to a socket:
- **Isolation**: the app runs in a task of its own (its context variables stay there). The task belongs to the
  response: closing the response (read to the end, or given up) ends it, as a dropped connection would.
- **Timeouts**: each wait (for the response to start, for the next chunk) is bounded by the request's ``read``
  timeout; running out raises ``httpx2.ReadTimeout``.
- **Errors**: an app that fails before it starts the response answers 500 (as uvicorn would); one that fails after
  ends the body with ``httpx2.RemoteProtocolError`` (a broken connection), which the adapter's retries treat as such.

Must not do: serve any other process, or change what the app sees (method, path, query, headers and body as sent).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any, Final

import httpx2

from loopd._infra.tasks import cancel_and_wait

__all__ = ["StreamingAsgiTransport"]

Message = MutableMapping[str, Any]
App = Callable[[MutableMapping[str, Any], Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Any]

CLIENT: Final = ("127.0.0.1", 0)
"""The peer address the app sees: loopback, like a local client's."""
_SERVER: Final = ("127.0.0.1", 80)
_BUFFER: Final = 64
"""Body chunks the app may send ahead of the reader before its ``send`` waits."""
_END: Final = b""
_FINISH_GRACE: Final = 1.0
"""Seconds an app that sent its whole body may go on (e.g. counting the reply) before the closed response ends it."""


class _Failed:
    """The app raised after the response started: the body ends as a broken connection."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


class _Body(httpx2.AsyncByteStream):
    """The response body: the chunks the app sends, read with the request's read timeout; closing it ends the app."""

    def __init__(
        self,
        chunks: asyncio.Queue[bytes | _Failed],
        task: asyncio.Task[None],
        left: asyncio.Event,
        timeout: float | None,
        request: httpx2.Request,
    ) -> None:
        self._chunks = chunks
        self._task = task
        self._left = left
        self._timeout = timeout
        self._request = request
        self._ended = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        chunks = self._chunks
        held: bytes | _Failed | None = None  # what ended the last read: handled before waiting again
        while True:
            if held is not None:
                item, held = held, None
            elif chunks.empty():
                try:
                    async with asyncio.timeout(self._timeout):
                        item = await chunks.get()
                except TimeoutError as exc:
                    raise httpx2.ReadTimeout(f"no data within {self._timeout:g} s", request=self._request) from exc
            else:
                item = chunks.get_nowait()  # already here: no wait, so no timer to arm
            if isinstance(item, _Failed):
                raise httpx2.RemoteProtocolError(
                    f"the app failed while answering: {item.error!r}", request=self._request
                ) from item.error
            if item == _END:
                self._ended = True
                return
            # Everything the app has sent since the last read, as one read of a socket returns what has arrived.
            parts = [item]
            while not chunks.empty():
                following = chunks.get_nowait()
                if isinstance(following, _Failed) or following == _END:
                    held = following
                    break
                parts.append(following)
            yield item if len(parts) == 1 else b"".join(parts)

    async def aclose(self) -> None:
        if self._ended and not self._task.done():  # answered in full: let the app finish what follows, briefly
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_FINISH_GRACE):
                    await asyncio.shield(self._task)
        self._left.set()  # the app's `receive` answers http.disconnect from now on
        await cancel_and_wait(self._task)


class StreamingAsgiTransport(httpx2.AsyncBaseTransport):
    """Requests to ``app`` (an ASGI 3 callable) in this process; responses streamed (see the module docstring)."""

    def __init__(self, app: App, *, buffer: int = _BUFFER) -> None:
        if buffer < 1:
            raise ValueError("buffer must be at least 1")
        self._app = app
        self._buffer = buffer

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        timeouts: dict[str, float | None] = request.extensions.get("timeout") or {}
        timeout = timeouts.get("read")
        body = await request.aread()
        started: asyncio.Future[tuple[int, list[tuple[bytes, bytes]]]] = asyncio.get_running_loop().create_future()
        chunks: asyncio.Queue[bytes | _Failed] = asyncio.Queue(maxsize=self._buffer)
        left = asyncio.Event()
        request_sent = False

        async def receive() -> Message:
            nonlocal request_sent
            if not request_sent:
                request_sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await left.wait()
            return {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            if message["type"] == "http.response.start":
                if not started.done():
                    headers = [(bytes(k), bytes(v)) for k, v in message.get("headers", [])]
                    started.set_result((int(message["status"]), headers))
                return
            if message["type"] != "http.response.body" or left.is_set():
                return
            piece = bytes(message.get("body", b""))
            if piece and request.method != "HEAD":
                await chunks.put(piece)
            if not message.get("more_body", False):
                await chunks.put(_END)

        async def run() -> None:
            try:
                await self._app(_scope(request), receive, send)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not started.done():
                    started.set_exception(exc)
                else:
                    await chunks.put(_Failed(exc))  # after what it sent; closing the response ends this wait
                return
            if not started.done():
                started.set_exception(RuntimeError("the app returned without starting a response"))
            else:
                await chunks.put(_END)  # an app that returned without its last body message: the body ends

        task = asyncio.ensure_future(run())  # its own context (see the module docstring)
        try:
            async with asyncio.timeout(timeout):
                status, headers = await asyncio.shield(started)
        except TimeoutError as exc:
            await cancel_and_wait(task)
            raise httpx2.ReadTimeout(f"no answer within {timeout:g} s", request=request) from exc
        except asyncio.CancelledError:
            await cancel_and_wait(task)
            raise
        except Exception:
            await cancel_and_wait(task)
            return httpx2.Response(500, headers=[(b"content-type", b"text/plain")], content=b"Internal Server Error")
        return httpx2.Response(
            status,
            headers=headers,
            stream=_Body(chunks, task, left, timeout, request),
            extensions={"http_version": b"HTTP/1.1"},  # read at every stream's end (else httpx raises and catches)
        )


def _scope(request: httpx2.Request) -> dict[str, Any]:
    url = request.url
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": request.method,
        "headers": [(k.lower(), v) for k, v in request.headers.raw],
        "scheme": url.scheme,
        "path": url.path,
        "raw_path": url.raw_path.split(b"?")[0],
        "query_string": url.query,
        "server": (url.host, url.port) if url.port is not None else _SERVER,
        "client": CLIENT,
        "root_path": "",
    }
