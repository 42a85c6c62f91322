"""An httpx transport to an ASGI app in this process: a client in the same process as a server sends its requests
through the app itself — the same routes, authentication, validation and middleware — without a socket.

`loopd up` gives it to the operators it runs beside its server (the Router, LongHorizon): each request then costs
the app's own work only, not an HTTP/1.1 round trip through the kernel, uvicorn's parser and httpx's connection pool
(measured here: about a third of the CPU per request). A standalone operator (`loopd operator router`) uses the
socket, and so does every client of another process.

What differs from a socket, and how it is kept equivalent:
- **Event streams** (``Accept: text/event-stream``) go over ``fallback`` (the socket): the in-process transport
  hands over a response only once the app has finished it.
- **Timeouts**: httpx applies its timeouts to sockets only; here the request's read timeout bounds the whole
  exchange, and running out of it raises ``httpx.ReadTimeout`` like a socket would.
- **Isolation**: the app runs in a task of its own, so what it sets in context variables (a request's identity,
  its trace span) stays there, and a client that gives up (cancelled, timed out) ends the request as a dropped
  connection would.
- **Errors**: an exception the app lets escape becomes a 500 answer, as uvicorn would send, never the client's.

Must not do: decide who may call (the app does, from the request's credentials), or serve any other process.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

import httpx

from loopd._infra.tasks import cancel_and_wait

__all__ = ["InProcessTransport"]

CLIENT: Final = ("127.0.0.1", 0)
"""The peer address the app sees: loopback, like a local client's."""


class InProcessTransport(httpx.AsyncBaseTransport):
    """Requests to ``app`` (an ASGI callable) in this process; event streams over ``fallback``."""

    def __init__(self, app: Any, *, fallback: httpx.AsyncBaseTransport) -> None:
        self._asgi = httpx.ASGITransport(app=app, raise_app_exceptions=False, client=CLIENT)
        self._fallback = fallback

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if "text/event-stream" in request.headers.get("accept", ""):
            return await self._fallback.handle_async_request(request)
        timeouts: dict[str, float | None] = request.extensions.get("timeout") or {}
        bound = timeouts.get("read")
        exchange = asyncio.ensure_future(self._asgi.handle_async_request(request))  # its own context (see above)
        try:
            async with asyncio.timeout(bound):
                return await asyncio.shield(exchange)
        except TimeoutError as exc:
            raise httpx.ReadTimeout(f"no answer within {bound:g} s", request=request) from exc
        finally:
            await cancel_and_wait(exchange)  # a no-op once answered; else the request ends like a dropped connection

    async def aclose(self) -> None:
        await self._fallback.aclose()
