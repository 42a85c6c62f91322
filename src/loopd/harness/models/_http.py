"""`default_http_client`: the HTTP client a model adapter sends through when it is given none — its SDK's
aiohttp-backed client (`openai.DefaultAioHttpClient`, `anthropic.DefaultAioHttpClient`: ``httpx2``'s API over
aiohttp's connections and C parser), with two guards that keep it to the contract the adapters promise with
``httpx2``'s own transport.

Why: a streamed reply arrives as many small reads (a provider sends a piece of text every 10–50 ms), and each read
through ``httpx2``'s default transport goes through its pure-Python HTTP/1.1 parser and a timeout scope: the
OpenAI-compatible adapter spent ≈ 114 µs of CPU per piece of text that way against ≈ 46 µs through aiohttp (100
concurrent replies, `python -m benchmarks._model_reads`). For a server answering many chats at once that was the
largest cost of each piece of an answer. Requests, headers, auth, proxies from the environment
(``HTTPS_PROXY`` …, each through its own aiohttp transport) and TLS settings stay ``httpx2``'s: the client is an
``httpx2.AsyncClient``, so recording transports, cassettes and the ledger see the same requests.

The guards (`_Guarded`, wrapping every transport the client makes):

- **A stalled upload times out.** aiohttp has no write timeout: a server that accepts a connection and never reads
  the body would hold the call forever. Getting a response's head — connect, write the body, wait for the status
  line — is bounded by the sum of the request's connect, pool, write and read timeouts (``httpx2.WriteTimeout``
  when it runs out), what ``httpx2`` would allow one operation of each at most.
- **A dropped or refused connection is a connection error, not a timeout.** The aiohttp adapter reports every
  ``aiohttp.ClientConnectionError`` it does not know better as ``httpx2.ConnectTimeout``; a refused connection
  (``ConnectError``), a server that hung up (``RemoteProtocolError``) and a reset (``ReadError``) are told apart
  here, so a user reads "connection failed or dropped" when the model server is down, as with ``httpx2``.

Must not do: change what is sent, or swallow an error (each one leaves as an ``httpx2.RequestError`` subclass).
"""

from __future__ import annotations

import asyncio
import functools
import ssl
from collections.abc import AsyncIterator
from typing import Any, Final, Literal, cast

import aiohttp
import httpx2

__all__ = ["default_http_client"]

_TIMEOUT_KEYS: Final = ("connect", "pool", "write", "read")


def default_http_client(timeout: float, sdk: Literal["openai", "anthropic"] = "openai") -> httpx2.AsyncClient:
    """The client an adapter of ``sdk`` builds for itself — that SDK's aiohttp-backed client with its defaults
    (connection limits, redirects) — with ``timeout`` seconds for each of connect, pool, write and read. Only the
    chosen SDK is imported."""
    if sdk == "anthropic":
        import anthropic

        return _guarded(anthropic.DefaultAioHttpClient)(timeout=timeout)
    import openai

    return _guarded(openai.DefaultAioHttpClient)(timeout=timeout)


class _GuardedTransports(httpx2.AsyncClient):
    """Makes every transport of the client it is mixed into (the direct one and one per proxy) `_Guarded`."""

    def _init_transport(self, *args: Any, **kwargs: Any) -> httpx2.AsyncBaseTransport:
        return _Guarded(super()._init_transport(*args, **kwargs))

    def _init_proxy_transport(self, *args: Any, **kwargs: Any) -> httpx2.AsyncBaseTransport:
        return _Guarded(super()._init_proxy_transport(*args, **kwargs))


@functools.cache
def _guarded(base: type[httpx2.AsyncClient]) -> type[httpx2.AsyncClient]:
    """``base`` (an SDK's client class) with `_GuardedTransports` mixed in; one class per base."""
    made = type(f"Guarded{base.__name__}", (_GuardedTransports, base), {"__module__": __name__})
    return cast("type[httpx2.AsyncClient]", made)


class _Guarded(httpx2.AsyncBaseTransport):
    """A transport with the module docstring's two guards around ``inner``."""

    __slots__ = ("_inner",)

    def __init__(self, inner: httpx2.AsyncBaseTransport) -> None:
        self._inner = inner

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        bound = head_deadline(request.extensions.get("timeout"))
        try:
            async with asyncio.timeout(bound) as scope:
                response = await self._inner.handle_async_request(request)
        except TimeoutError as exc:
            if not scope.expired():
                raise
            raise httpx2.WriteTimeout(
                f"no response head within {bound:g} s (the body not taken, or no answer)", request=request
            ) from exc
        except httpx2.ConnectTimeout as exc:
            raise connection_error(exc, request) from exc.__cause__
        return httpx2.Response(
            status_code=response.status_code,
            headers=response.headers,
            stream=_Body(response.stream, request),
            request=request,
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        await self._inner.aclose()


class _Body(httpx2.AsyncByteStream):
    """A response body whose read errors are told apart as in `_Guarded`."""

    __slots__ = ("_inner", "_request")

    def __init__(self, inner: httpx2.SyncByteStream | httpx2.AsyncByteStream, request: httpx2.Request) -> None:
        if not isinstance(inner, httpx2.AsyncByteStream):
            raise TypeError("an async transport's response body must be an AsyncByteStream")
        self._inner = inner
        self._request = request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._inner:
                yield chunk
        except httpx2.ConnectTimeout as exc:
            raise connection_error(exc, self._request) from exc.__cause__

    async def aclose(self) -> None:
        await self._inner.aclose()


def head_deadline(timeouts: object) -> float | None:
    """The bound on getting a response's head: the sum of the request's connect, pool, write and read timeouts
    (None when any of them is unbounded, or the request carries none)."""
    if not isinstance(timeouts, dict):
        return None
    total = 0.0
    for key in _TIMEOUT_KEYS:
        value = timeouts.get(key)
        if not isinstance(value, int | float):
            return None
        total += float(value)
    return total


def connection_error(exc: httpx2.ConnectTimeout, request: httpx2.Request) -> httpx2.TransportError:
    """What a ``ConnectTimeout`` from the aiohttp adapter was: itself when aiohttp timed out, else the connection
    error ``httpx2``'s own transport raises for the same failure."""
    cause = exc.__cause__
    message = str(exc) or type(cause).__name__
    if isinstance(cause, aiohttp.ServerTimeoutError | TimeoutError) or cause is None:
        return exc
    if isinstance(cause, aiohttp.ClientConnectorError | ssl.SSLError):
        return httpx2.ConnectError(message, request=request)
    if isinstance(cause, aiohttp.ServerDisconnectedError):
        return httpx2.RemoteProtocolError(message, request=request)
    return httpx2.ReadError(message, request=request)
