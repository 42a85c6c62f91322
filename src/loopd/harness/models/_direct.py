"""Direct sends: what the model adapters share to skip their SDK's per-call machinery after a first call — the
request the SDK sent, kept and sent again with each new body (`DirectSender`), and a plain parser of the
Server-Sent Events a streamed reply is made of (`server_sent_events`, `server_sent_event_batches`).

An SDK's ``post`` rebuilds the same request around every body (options, URL, headers, auth) and wraps the reply in
its stream machinery: about as much work per call as the rest of a harness step. For a client the adapter built
itself (an API key, a base URL, a timeout: nothing that changes per request) the first call goes through ``post``,
and the request it sent is kept: the next calls send the same method, URL, headers and timeouts with their own body,
through the same ``httpx2.AsyncClient`` (its transport, hooks and cookies: a cassette or the ledger sees the same
request). Failures become what ``post`` raises, through the adapter's `SendErrors` (connection, timeout, status —
with the SDK's message and body). This module imports no SDK.

Must not do: send anything the SDK's request did not have but the body and its length.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Self

import anyio
import httpx2

__all__ = [
    "REQUEST_ERRORS",
    "DirectReply",
    "DirectSender",
    "SendErrors",
    "one_by_one",
    "server_sent_event_batches",
    "server_sent_events",
]

REQUEST_ERRORS = (httpx2.RequestError, ssl.SSLError, anyio.EndOfStream)
"""What the SDKs report as a connection error (``APIConnectionError``) when raised by an ``httpx2`` client."""


@dataclass(frozen=True, slots=True)
class SendErrors:
    """The exceptions an adapter's SDK raises from ``post``, made for a direct send's failures: its timeout and
    connection error classes (built with the request; raised from the cause), and what it raises for a reply that is
    not a success (its body read)."""

    timeout_error: Callable[..., Exception]
    connection_error: Callable[..., Exception]
    status_error: Callable[[httpx2.Response], Exception]

    def timeout(self, request: httpx2.Request) -> Exception:
        return self.timeout_error(request=request)

    def connection(self, request: httpx2.Request) -> Exception:
        return self.connection_error(request=request)


class DirectReply:
    """A streamed reply read off its HTTP response (an adapter's subclass says how); closing it closes the response."""

    __slots__ = ("response",)

    def __init__(self, response: httpx2.Response) -> None:
        self.response = response

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.response.aclose()


class DirectSender:
    """Sends the next calls of a client built by an adapter straight through its HTTP client (module docstring)."""

    __slots__ = ("_extensions", "_headers", "_http", "_url")

    def __init__(self, http: httpx2.AsyncClient, sent: httpx2.Request) -> None:
        self._http = http
        self._url = sent.url
        self._headers = httpx2.Headers([(k, v) for k, v in sent.headers.raw if k.lower() != b"content-length"])
        self._extensions = dict(sent.extensions)

    def request(self, body: bytes) -> httpx2.Request:
        """The kept request with ``body``: what ``content=body`` builds."""
        http = self._http
        if http.cookies:  # the client's cookie jar may have changed since: let it merge them again
            return http.build_request(
                "POST", self._url, headers=self._headers, content=body, extensions=dict(self._extensions)
            )
        # The request ``content=body`` builds, without rebuilding it: the kept headers plus the body's
        # Content-Length (where `Request` puts it), the body as its stream and already read.
        headers = httpx2.Headers(self._headers)
        headers["Content-Length"] = str(len(body))
        request = httpx2.Request(
            "POST", self._url, headers=headers, stream=httpx2.ByteStream(body), extensions=dict(self._extensions)
        )
        request.read()
        return request

    async def open(self, body: bytes, errors: SendErrors) -> httpx2.Response:
        """Send one body; the streamed reply (a success), or the exception ``post`` would raise."""
        request = self.request(body)
        try:
            response = await self._http.send(request, stream=True)
        except httpx2.TimeoutException as exc:
            raise errors.timeout(request) from exc
        except REQUEST_ERRORS as exc:
            raise errors.connection(request) from exc
        if not response.is_success:
            try:
                await response.aread()
            except REQUEST_ERRORS as exc:
                await response.aclose()
                raise errors.connection(request) from exc
            raise errors.status_error(response)
        return response


async def one_by_one(stream: AsyncIterator[object]) -> AsyncIterator[list[object]]:
    """An SDK's stream as batches of one item (it does not say which items arrived together)."""
    async for item in stream:
        yield [item]


async def server_sent_events(chunks: AsyncIterator[bytes]) -> AsyncIterator[tuple[str | None, bytes]]:
    """``(event name, data)`` of each server-sent event in a byte stream (lines end in LF, CRLF or CR; ``data``
    lines joined by LF; comments and other fields skipped); an event still open when the stream ends is dropped,
    like the SDK's decoder does."""
    async for events in server_sent_event_batches(chunks):
        for found in events:
            yield found


async def server_sent_event_batches(chunks: AsyncIterator[bytes]) -> AsyncIterator[list[tuple[str | None, bytes]]]:
    """`server_sent_events`, as the events each chunk of bytes completed (lists, never empty)."""
    parser = _SseLines()
    async for chunk in chunks:
        found = parser.feed(chunk)
        if found:
            yield found
    found = parser.end()
    if found:
        yield found


class _SseLines:
    """The line and field state of `server_sent_events`."""

    __slots__ = ("data", "event", "pending")

    def __init__(self) -> None:
        self.pending = b""
        self.event: str | None = None
        self.data: list[bytes] = []

    def feed(self, chunk: bytes) -> list[tuple[str | None, bytes]]:
        pending = self.pending + chunk
        if b"\r" in pending:
            held = pending.endswith(b"\r")  # maybe half of a CRLF: decided with the next chunk
            text = pending[:-1] if held else pending
            pending = text.replace(b"\r\n", b"\n").replace(b"\r", b"\n") + (b"\r" if held else b"")
        lines = pending.split(b"\n")
        self.pending = lines.pop()
        return self._lines(lines)

    def end(self) -> list[tuple[str | None, bytes]]:
        """The events a held CR completes at the end of the stream."""
        pending, self.pending = self.pending, b""
        return self._lines([pending[:-1]]) if pending.endswith(b"\r") else []

    def _lines(self, lines: list[bytes]) -> list[tuple[str | None, bytes]]:
        found: list[tuple[str | None, bytes]] = []
        for line in lines:
            if not line:
                if self.data or self.event is not None:
                    found.append((self.event, b"\n".join(self.data)))
                self.event, self.data = None, []
                continue
            name, _, value = line.partition(b":")
            if value[:1] == b" ":
                value = value[1:]
            if name == b"data":
                self.data.append(value)
            elif name == b"event":
                self.event = value.decode()
        return found
