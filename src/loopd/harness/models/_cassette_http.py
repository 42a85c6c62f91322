"""The cassette's ``httpx2`` transport: answers from a `Cassette`, or forwards to the provider and records.

Recording passes the provider's bytes to the client as they arrive (a stream stays a stream) and writes the entry
when the response is closed or read to its end. The request goes out with ``accept-encoding: identity`` so what is
recorded is the text itself.
"""

from __future__ import annotations

import codecs
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import httpx2

from loopd._infra.redaction import Redactor
from loopd.harness.models._cassette import (
    KEPT_RESPONSE_HEADERS,
    KEPT_RESPONSE_PREFIXES,
    SECRET_HEADERS,
    Cassette,
    Entry,
    RecordedResponse,
    SseEvent,
    redact_events,
)


class CassetteTransport(httpx2.AsyncBaseTransport):
    """Answers requests from ``cassette``; in ``record``/``auto`` mode sends the others through ``inner``."""

    def __init__(self, cassette: Cassette, inner: httpx2.AsyncBaseTransport | None = None) -> None:
        self.cassette = cassette
        self._inner = inner
        if inner is None and cassette.records:
            self._inner = httpx2.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        """Replay the recorded answer to ``request``, or record a live one (see `Cassette` for the modes)."""
        body = await request.aread()
        cassette = self.cassette
        exchange = cassette.canonical(
            request.method, request.url.path, request.url.query, body, _credentials(request.headers)
        )
        if cassette.mode != "record" and (entry := cassette.take(exchange.request)) is not None:
            return await _replay(entry, request, cassette)
        if self._inner is None:
            raise cassette.mismatch(exchange.request)
        request.headers["accept-encoding"] = "identity"
        started = cassette.clock.monotonic()
        response = await self._inner.handle_async_request(request)
        headers_at = cassette.clock.monotonic() - started
        kept = _kept_headers(response.headers, exchange.redactor)
        is_sse = "text/event-stream" in response.headers.get("content-type", "")

        def finish(text: str, events: tuple[SseEvent, ...] | None, truncated: bool) -> None:
            redactor = exchange.redactor
            recorded = RecordedResponse(
                status=response.status_code,
                headers=kept,
                at=headers_at,
                events=None if events is None else redact_events(events, redactor),
                body="" if events is not None else redactor.text(text),
                truncated=truncated,
            )
            cassette.record(Entry(request=exchange.request, response=recorded))

        stream = _RecordingStream(response.stream, is_sse=is_sse, clock=cassette.clock.monotonic, started=started)
        stream.on_finish = finish
        return httpx2.Response(
            response.status_code,
            headers=[(k, v) for k, v in response.headers.multi_items() if k.lower() != "content-encoding"],
            stream=stream,
            extensions=response.extensions,
            request=request,
        )

    async def aclose(self) -> None:
        """Close the provider transport (if any). Idempotent: a chain's adapters share one transport."""
        inner, self._inner = self._inner, None
        if inner is not None:
            await inner.aclose()


def _credentials(headers: httpx2.Headers) -> list[str]:
    """The secret values a request carried in its headers (whole, and without an auth scheme word)."""
    found: list[str] = []
    for name, value in headers.multi_items():
        if name.lower() not in SECRET_HEADERS:
            continue
        found.append(value)
        scheme, _, rest = value.partition(" ")
        if rest and scheme.lower() in ("bearer", "basic", "token"):
            found.append(rest.strip())
    return found


def _kept_headers(headers: httpx2.Headers, redactor: Redactor) -> dict[str, str]:
    kept: dict[str, str] = {}
    for name, value in headers.multi_items():
        lower = name.lower()
        if lower in KEPT_RESPONSE_HEADERS or lower.startswith(KEPT_RESPONSE_PREFIXES):
            kept[lower] = redactor.text(value)
    return kept


async def _replay(entry: Entry, request: httpx2.Request, cassette: Cassette) -> httpx2.Response:
    recorded = entry.response
    paced = cassette.settings.timing == "recorded"
    if paced and recorded.at:
        await cassette.clock.sleep(recorded.at)
    headers = dict(recorded.headers)
    if recorded.events is None:
        return httpx2.Response(recorded.status, headers=headers, content=recorded.body.encode(), request=request)
    headers.setdefault("content-type", "text/event-stream; charset=utf-8")
    stream = _ReplayStream(recorded.events, clock=cassette.clock.sleep if paced else None, start=recorded.at or 0.0)
    return httpx2.Response(recorded.status, headers=headers, stream=stream, request=request)


class _ReplayStream(httpx2.AsyncByteStream):
    """Recorded SSE events as bytes, optionally paced by the recorded gaps."""

    def __init__(self, events: Iterable[SseEvent], *, clock: Callable[[float], Any] | None, start: float) -> None:
        self._events = tuple(events)
        self._sleep = clock
        self._start = start

    async def __aiter__(self) -> AsyncIterator[bytes]:
        last = self._start
        for event in self._events:
            if self._sleep is not None and event.at is not None:
                await self._sleep(max(event.at - last, 0.0))
                last = event.at
            yield (event.text + "\n\n").encode()

    async def aclose(self) -> None:
        return None


class _RecordingStream(httpx2.AsyncByteStream):
    """The provider's body, passed through unchanged while its text (and SSE events with their times) is kept."""

    def __init__(self, inner: Any, *, is_sse: bool, clock: Callable[[], float], started: float) -> None:
        self._inner = inner
        self._is_sse = is_sse
        self._clock = clock
        self._started = started
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._text: list[str] = []
        self._pending = ""
        self._events: list[SseEvent] = []
        self._complete = False
        self._finished = False
        self.on_finish: Callable[[str, tuple[SseEvent, ...] | None, bool], None] | None = None

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            self._feed(self._decoder.decode(chunk))
            yield chunk
        self._feed(self._decoder.decode(b"", final=True))
        self._complete = True
        self._finish()

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            self._finish()

    def _feed(self, text: str) -> None:
        if not text:
            return
        if not self._is_sse:
            self._text.append(text)
            return
        self._pending += text.replace("\r\n", "\n").replace("\r", "\n")
        at = self._clock() - self._started
        while "\n\n" in self._pending:
            block, self._pending = self._pending.split("\n\n", 1)
            if block.strip():
                self._events.append(SseEvent(block, at))

    def _finish(self) -> None:
        if self._finished:
            return
        self._finished = True
        events: tuple[SseEvent, ...] | None = None
        if self._is_sse:
            if self._pending.strip():
                self._events.append(SseEvent(self._pending.strip("\n"), self._clock() - self._started))
            events = tuple(self._events)
        if self.on_finish is not None:
            self.on_finish("".join(self._text), events, not self._complete)
