"""A scripted Anthropic-compatible Messages API server: the Anthropic adapter's test provider.

``POST /v1/messages`` answers a JSON ``message``, or with ``"stream": true`` Server-Sent Events in the Messages API's
event format: ``message_start`` (with the prompt usage: ``input_tokens``, ``cache_creation_input_tokens``,
``cache_read_input_tokens``), a ``ping``, per content block ``content_block_start`` / ``content_block_delta``
(``text_delta`` pieces, or a ``tool_use`` block whose input arrives as ``input_json_delta`` fragments) /
``content_block_stop``, then ``message_delta`` (``stop_reason`` and the output tokens) and ``message_stop``.

The script vocabulary is the OpenAI scripted server's (`ServerReply`, `ServerToolCall`, `FailWithStatus` with its
Retry-After, `DropAfter`, delays), so one test can script both providers alike; an `AnthropicReply` adds
``cache_write_tokens`` (how many of the prompt tokens the reply reports as written to the cache). A reply's
``usage`` is loopd's convention (``input_tokens`` = every prompt token, ``cached_tokens`` = cache reads); the server
splits it into the API's three prompt counters. Errors use the API's envelope ``{"type": "error", "error": {...}}``;
an ``api_key`` makes it required, as ``x-api-key`` or a bearer token (401 otherwise). Requests and outcomes are
recorded (`ServerStatistics`).

``async with open_anthropic_server(script) as base_url`` serves on loopback (port 0); ``base_url`` (no ``/v1``) goes
straight to ``anthropic.AsyncAnthropic(base_url=...)`` or ``ANTHROPIC_BASE_URL``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from loopd._infra.serving import open_http_server
from loopd._infra.sse import sse_message
from loopd._infra.tasks import race
from loopd.harness._errors import HarnessError
from loopd.harness.core import Usage
from loopd.harness.models._scripted_server import (
    DropAfter,
    FailWithStatus,
    Outcome,
    ServerReply,
    ServerStatistics,
    _json,
    _pieces,
    _RawEndpoint,
    _start,
    _wait_for_disconnect,
)

__all__ = [
    "AnthropicReply",
    "AnthropicRequest",
    "AnthropicScriptedServer",
    "open_anthropic_server",
]


class AnthropicReply(ServerReply):
    """A `ServerReply` that also reports ``cache_write_tokens`` prompt tokens as written to the cache."""

    cache_write_tokens: int = Field(default=0, ge=0)


class AnthropicRequest(BaseModel):
    """A Messages API request as the server received it (unknown fields are kept)."""

    model_config = ConfigDict(frozen=True, extra="allow")

    model: str
    max_tokens: int = Field(ge=1)
    messages: tuple[dict[str, Any], ...]
    system: str | list[dict[str, Any]] | None = None
    tools: tuple[dict[str, Any], ...] = ()
    stream: bool = False

    @property
    def last_user_text(self) -> str:
        """The text blocks of the last user message (tool results not included)."""
        for message in reversed(self.messages):
            if message.get("role") != "user":
                continue
            content = message.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):
                return "".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")
        return ""

    @property
    def tool_results(self) -> tuple[dict[str, Any], ...]:
        """The ``tool_result`` blocks of the last message."""
        if not self.messages:
            return ()
        content = self.messages[-1].get("content")
        if not isinstance(content, list):
            return ()
        return tuple(b for b in content if isinstance(b, dict) and b.get("type") == "tool_result")


AnthropicRule = Callable[[AnthropicRequest], ServerReply]
AnthropicScript = Sequence[ServerReply] | AnthropicRule | None


def _echo(request: AnthropicRequest) -> ServerReply:
    return ServerReply(text=f"You said: {request.last_user_text}")


_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


def error_body(message: str, error_type: str) -> dict[str, Any]:
    """The Messages API error envelope."""
    return {"type": "error", "error": {"type": error_type, "message": message}}


def split_usage(usage: Usage, cache_write: int) -> dict[str, int]:
    """loopd's usage → the API's prompt counters (uncached ``input_tokens``, cache creation, cache read)."""
    read = min(usage.cached_tokens, usage.input_tokens)
    write = min(cache_write, usage.input_tokens - read)
    return {
        "input_tokens": usage.input_tokens - read - write,
        "cache_creation_input_tokens": write,
        "cache_read_input_tokens": read,
    }


def estimate_usage(request: AnthropicRequest, reply: ServerReply) -> Usage:
    """About four characters per token (deterministic)."""
    prompt = len(json.dumps(request.messages)) + len(json.dumps(request.system or ""))
    output = len(reply.text) + sum(len(c.name) + len(c.arguments_json()) for c in reply.tool_calls)
    return Usage(input_tokens=max(1, math.ceil(prompt / 4)), output_tokens=max(1, math.ceil(output / 4)))


def _stop_reason(reply: ServerReply) -> str:
    return reply.finish_reason or ("tool_use" if reply.tool_calls else "end_turn")


def _tool_id(reply_id: str, index: int, given: str | None) -> str:
    return given or f"toolu_{reply_id.rsplit('_', 1)[-1]}_{index}"


def stream_events(reply: ServerReply, *, message_id: str, model: str, usage: Usage) -> list[tuple[str, dict[str, Any]]]:
    """The ``(event, data)`` pairs of a streamed reply."""
    cache_write = reply.cache_write_tokens if isinstance(reply, AnthropicReply) else 0
    prompt = split_usage(usage, cache_write)
    start = {
        "type": "message_start",
        "message": {
            "id": message_id,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {**prompt, "output_tokens": 1},
        },
    }
    events: list[tuple[str, dict[str, Any]]] = [("message_start", start), ("ping", {"type": "ping"})]
    index = 0
    if reply.text:
        events.append(
            (
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}},
            )
        )
        for piece in _pieces(reply.text, reply.chunk_size):
            delta = {"type": "text_delta", "text": piece}
            events.append(("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}))
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
        index += 1
    for number, call in enumerate(reply.tool_calls):
        block = {"type": "tool_use", "id": _tool_id(message_id, number, call.id), "name": call.name, "input": {}}
        events.append(("content_block_start", {"type": "content_block_start", "index": index, "content_block": block}))
        for piece in _pieces(call.arguments_json(), reply.chunk_size):
            delta = {"type": "input_json_delta", "partial_json": piece}
            events.append(("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}))
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
        index += 1
    events.append(
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": _stop_reason(reply), "stop_sequence": None},
                "usage": {"output_tokens": usage.output_tokens},
            },
        )
    )
    events.append(("message_stop", {"type": "message_stop"}))
    return events


def message_body(reply: ServerReply, *, message_id: str, model: str, usage: Usage) -> dict[str, Any]:
    """The ``message`` object of a non-streamed reply."""
    cache_write = reply.cache_write_tokens if isinstance(reply, AnthropicReply) else 0
    content: list[dict[str, Any]] = []
    if reply.text:
        content.append({"type": "text", "text": reply.text})
    for number, call in enumerate(reply.tool_calls):
        arguments = json.loads(call.arguments_json())
        content.append(
            {"type": "tool_use", "id": _tool_id(message_id, number, call.id), "name": call.name, "input": arguments}
        )
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": _stop_reason(reply),
        "stop_sequence": None,
        "usage": {**split_usage(usage, cache_write), "output_tokens": usage.output_tokens},
    }


class _ScriptExhausted(HarnessError):
    """The script has no reply left for a request."""


class AnthropicScriptedServer:
    """The ASGI app and its state: the script, the request history and the outcome counters.

    ``script``: replies played in order (then 400 when exhausted), a rule ``(AnthropicRequest) -> ServerReply``, or
    None (an echo of the last user text).
    """

    def __init__(
        self,
        script: AnthropicScript = None,
        *,
        api_key: str | None = None,
        history: int = 256,
        body_timeout: float = 30.0,
    ) -> None:
        self._queue: deque[ServerReply] | None = None
        self._rule: AnthropicRule
        if script is None:
            self._rule = _echo
        elif callable(script):
            self._rule = script
        else:
            queue = self._queue = deque(script)
            self._rule = lambda _: _next(queue)
        self._api_key = api_key
        self._requests: deque[AnthropicRequest] = deque(maxlen=history)
        self._headers: deque[dict[str, str]] = deque(maxlen=history)
        self._counts: Counter[str] = Counter()
        self._changed = asyncio.Event()
        self._ids = itertools.count(1)
        self._body_timeout = body_timeout
        self.app = Starlette(routes=[Route("/v1/messages", _RawEndpoint(self._messages), methods=["POST"])])

    @property
    def requests(self) -> tuple[AnthropicRequest, ...]:
        """The most recent valid requests, oldest first."""
        return tuple(self._requests)

    @property
    def request_headers(self) -> tuple[dict[str, str], ...]:
        """The headers of those requests (lower-case names)."""
        return tuple(self._headers)

    def statistics(self) -> ServerStatistics:
        """Requests and how they ended."""
        c = self._counts
        return ServerStatistics(
            requests=c["requests"],
            completed=c["completed"],
            failed=c["failed"],
            dropped=c["dropped"],
            disconnected=c["disconnected"],
            rejected=c["rejected"],
        )

    async def wait_until(
        self, predicate: Callable[[ServerStatistics], bool], *, timeout: float = 5.0
    ) -> ServerStatistics:
        """Wait until ``predicate(statistics())`` holds; `TimeoutError` after ``timeout`` seconds."""
        async with asyncio.timeout(timeout):
            while not predicate(stats := self.statistics()):
                await self._changed.wait()
        return stats

    def _count(self, key: str) -> None:
        self._counts[key] += 1
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def _messages(self, scope: Scope, receive: Receive, send: Send) -> None:
        http = Request(scope, receive)
        try:
            async with asyncio.timeout(self._body_timeout):
                raw = await http.json()
            request = AnthropicRequest.model_validate(raw)
        except (ValueError, ValidationError) as exc:
            self._count("rejected")
            await _json(send, 400, error_body(f"invalid request: {exc}", "invalid_request_error"))
            return
        given = http.headers.get("x-api-key") or http.headers.get("authorization", "").removeprefix("Bearer ")
        if self._api_key is not None and given != self._api_key:
            self._count("rejected")
            await _json(send, 401, error_body("invalid x-api-key", "authentication_error"))
            return
        self._requests.append(request)
        self._headers.append({k.lower(): v for k, v in http.headers.items()})
        self._count("requests")
        try:
            reply = self._rule(request)
        except _ScriptExhausted:
            self._count("rejected")
            message = f"scripted server: no reply left for request {self._counts['requests']}"
            await _json(send, 400, error_body(message, "invalid_request_error"))
            return
        message_id = f"msg_scripted_{next(self._ids)}"
        produced, _ = await race(
            _produce(reply, request, message_id, send),
            _wait_for_disconnect(receive),
            names=("anthropic-produce", "anthropic-disconnect"),
        )
        self._count("disconnected" if produced.cancelled else produced.result())


def _next(queue: deque[ServerReply]) -> ServerReply:
    if not queue:
        raise _ScriptExhausted
    return queue.popleft()


async def _produce(reply: ServerReply, request: AnthropicRequest, message_id: str, send: Send) -> Outcome:
    if reply.delay:
        await asyncio.sleep(reply.delay)
    fault = reply.fault
    if isinstance(fault, FailWithStatus):
        headers: list[tuple[bytes, bytes]] = [(b"request-id", f"req_{message_id}".encode())]
        if fault.retry_after is not None:
            headers.append((b"retry-after", str(math.ceil(fault.retry_after)).encode()))
        error_type = fault.error_type or _ERROR_TYPES.get(fault.status, "api_error")
        await _json(send, fault.status, error_body(fault.message, error_type), headers)
        return "failed"
    drop_after = fault.chunks if isinstance(fault, DropAfter) else None
    usage = reply.usage or estimate_usage(request, reply)
    if not request.stream:
        body = json.dumps(message_body(reply, message_id=message_id, model=request.model, usage=usage)).encode()
        await _start(send, 200, b"application/json", [(b"content-length", str(len(body)).encode())])
        if drop_after is not None:
            await send({"type": "http.response.body", "body": body[: len(body) // 2], "more_body": True})
            return "dropped"
        await send({"type": "http.response.body", "body": body, "more_body": False})
        return "completed"
    events = stream_events(reply, message_id=message_id, model=request.model, usage=usage)
    await _start(
        send,
        200,
        b"text/event-stream; charset=utf-8",
        [(b"cache-control", b"no-cache"), (b"request-id", f"req_{message_id}".encode())],
    )
    if drop_after is None and not reply.chunk_delay:  # zero latency: one write (see the OpenAI-compatible one)
        body = b"".join(sse_message(json.dumps(data, separators=(",", ":")), event=event) for event, data in events)
        await send({"type": "http.response.body", "body": body, "more_body": False})
        return "completed"
    for index, (event, data) in enumerate(events):
        if drop_after is not None and index >= drop_after:
            return "dropped"
        if index and reply.chunk_delay:
            await asyncio.sleep(reply.chunk_delay)
        frame = sse_message(json.dumps(data, separators=(",", ":")), event=event)
        await send({"type": "http.response.body", "body": frame, "more_body": True})
    if drop_after is not None:
        return "dropped"
    await send({"type": "http.response.body", "body": b"", "more_body": False})
    return "completed"


@contextlib.asynccontextmanager
async def open_anthropic_server(
    script: AnthropicScript | AnthropicScriptedServer = None,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    startup_timeout: float = 10.0,
    shutdown_timeout: float = 5.0,
) -> AsyncIterator[str]:
    """Serve ``script`` (or a prepared `AnthropicScriptedServer`) on ``host:port`` in this loop; yield the base URL."""
    server = script if isinstance(script, AnthropicScriptedServer) else AnthropicScriptedServer(script)
    async with open_http_server(
        server.app,
        host=host,
        port=port,
        start_timeout=startup_timeout,
        graceful_timeout=max(shutdown_timeout - 1, 1),
        lifespan="off",
        log_level=None,
        http="h11",
    ) as running:
        yield str(running.url)
