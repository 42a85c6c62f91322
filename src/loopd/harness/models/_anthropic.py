"""The Anthropic Model adapter, on the official `anthropic` client (Messages API, streamed).

Provider differences stop here. A `ModelRequest` becomes a Messages request: the system prompt (and any system
message of the history) goes to ``system``; tool calls become ``tool_use`` blocks of the assistant's message and
tool results ``tool_result`` blocks of one user message (consecutive results are merged, as the API requires
alternating roles); tools are sent with their JSON schema as ``input_schema``; ``max_tokens`` (required by the API)
is the request's ``max_output_tokens`` or ``default_max_tokens``. Streamed events become `ModelChunk`s:
``text_delta`` → `TextDelta`, a ``tool_use`` block and its ``input_json_delta`` fragments → `ToolCallDelta`s with
the block's index; thinking blocks are not shown.

**Prompt caching.** With ``prompt_cache`` (the default) the system prompt, the last tool and the newest message are
marked ``cache_control: ephemeral``, so each step of a loop reads the previous step's prefix from the cache.
Usage maps to loopd's convention: ``input_tokens`` = uncached + ``cache_creation_input_tokens`` +
``cache_read_input_tokens`` (every prompt token), ``cached_tokens`` = the cache reads; the cost is priced with the
table's cache read price for reads and its cache write price for creations.

**Errors** become `ModelError`s: connection failures, timeouts, 408, 409, 429 (with Retry-After), 5xx (529
"overloaded" included), an error event inside the stream and a stream that ends without ``message_stop`` are
retryable; other 4xx are permanent; ``x-should-retry`` overrides the status rule. Retries, backoff, rate limits,
cancellation and timeouts work as in the OpenAI adapter (``_retrying``, ``_ratelimit``): the client's own retries
are off.

**Request body.** The body is JSON encoded here in one pass and sent through the client's ordinary ``post`` (auth,
headers, errors, the SSE parser): ``messages.create`` would deep-copy the whole body, every message of the history,
on each request first (about 10 ms per call at a history of 500 steps). The bytes equal what ``create`` sends.

**Stream events** are read as parsed JSON and translated here, not built into the SDK's typed event objects: the
first call through ``post`` with ``AsyncStream[object]`` (the SDK's SSE parser, ``ping`` skipping, in-band ``error``
events raised as status errors), and — when the adapter built the client itself — the later calls sent straight
through its HTTP client with the first call's request and read with a plain SSE parser that ends the same way
(`loopd.harness.models._direct`, as the OpenAI-compatible adapter does; `_DirectEvents`). An event of another shape
than the Messages API's (a delta that is not an object, an index or a token count that is not a whole number…) is a
permanent error; event types loopd does not know are skipped.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing
from typing import Any

import anthropic
import httpx2
from anthropic.types import Message as AnthropicMessage

from loopd._infra.backoff import Backoff
from loopd._infra.errors import LoopdError
from loopd._infra.jsontext import compact, loads
from loopd.harness._errors import ModelError, ModelPermanentError, ModelRetryableError
from loopd.harness.core import Message, Usage
from loopd.harness.models._direct import DirectReply, DirectSender, SendErrors, one_by_one, server_sent_event_batches
from loopd.harness.models._http import default_http_client
from loopd.harness.models._pricing import PriceTable
from loopd.harness.models._protocol import (
    ModelChunk,
    ModelRequest,
    ReplyInfo,
    TextDelta,
    ToolCallDelta,
    UsageReport,
)
from loopd.harness.models._ratelimit import RateLimiter, estimate_tokens
from loopd.harness.models._retrying import Sleep, retry_after_seconds, retrying
from loopd.harness.models._sdk import SdkAdapter, check_settings

DEFAULT_MAX_TOKENS = 4096
_EPHEMERAL: dict[str, str] = {"type": "ephemeral"}


class AnthropicModel(SdkAdapter[anthropic.AsyncAnthropic]):
    """A `Model` served by Anthropic's Messages API (or a server speaking it, e.g. the scripted one).

    ``model`` is the default model id; a non-empty ``ModelRequest.model`` overrides it per call. ``sleep`` and
    ``random`` are injectable so tests control backoff time; ``client`` shares an `anthropic.AsyncAnthropic`
    (``max_retries=0``, not closed by `aclose`), ``http_client`` sends through a given ``httpx2.AsyncClient`` (not
    closed either); ``limiter`` is the provider's shared `RateLimiter`.
    """

    def __init__(
        self,
        model: str,
        *,
        api_key: str,
        base_url: str | None = None,
        timeout: float = 60.0,
        max_retries: int = 3,
        backoff: Backoff | None = None,
        max_retry_after: float = 60.0,
        prices: PriceTable | None = None,
        default_max_tokens: int = DEFAULT_MAX_TOKENS,
        prompt_cache: bool = True,
        sleep: Sleep = asyncio.sleep,
        random: Callable[[], float] | None = None,
        client: anthropic.AsyncAnthropic | None = None,
        http_client: httpx2.AsyncClient | None = None,
        limiter: RateLimiter | None = None,
    ) -> None:
        check_settings(model, timeout=timeout, max_retries=max_retries, max_retry_after=max_retry_after)
        if default_max_tokens < 1:
            raise ValueError("default_max_tokens must be >= 1")
        if client is None and http_client is None:  # see loopd.harness.models._http: aiohttp's reads, guarded
            http_client = default_http_client(timeout, "anthropic")
        super().__init__(
            model,
            client=client
            or anthropic.AsyncAnthropic(
                api_key=api_key, base_url=base_url, timeout=timeout, max_retries=0, http_client=http_client
            ),
            owns_client=client is None,
            timeout=timeout,
            max_retries=max_retries,
            backoff=backoff,
            max_retry_after=max_retry_after,
            prices=prices,
            sleep=sleep,
            random=random,
            limiter=limiter,
        )
        self._default_max_tokens = default_max_tokens
        self._prompt_cache = prompt_cache
        self._http = http_client if client is None else None  # a client built here sends fixed headers
        self._sender: DirectSender | None = None
        self.direct_sends = 0
        """Calls sent straight through the HTTP client with the SDK's recorded request (what tests watch)."""

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        """Stream one reply; see the module docstring for the mapping, retry and usage contract."""
        model = request.model or self._model
        system, messages = anthropic_messages(request, cache=self._prompt_cache)
        async with aclosing(
            retrying(
                lambda: self._attempt(model, request, system, messages),
                provider="anthropic",
                model=model,
                max_retries=self._max_retries,
                backoff=self._backoff,
                max_retry_after=self._max_retry_after,
                sleep=self._sleep,
            )
        ) as chunks:
            async for chunk in chunks:
                yield chunk

    async def _attempt(
        self, model: str, request: ModelRequest, system: list[dict[str, Any]], messages: list[dict[str, Any]]
    ) -> AsyncGenerator[ModelChunk, None]:
        """One HTTP call; every failure leaves as a `ModelError`."""
        tools: list[dict[str, Any]] = [
            {"name": t.name, "description": t.description, "input_schema": t.parameters} for t in request.tools
        ]
        if tools and self._prompt_cache:
            tools[-1] = {**tools[-1], "cache_control": _EPHEMERAL}
        max_tokens = request.max_output_tokens or self._default_max_tokens
        estimate = 0
        if self._limiter is not None:
            characters = len(json.dumps(messages)) + sum(len(block.get("text", "")) for block in system)
            estimate = estimate_tokens(characters, max_tokens)
            await self._limiter.acquire(estimate)
        body = request_body(model, max_tokens, system, messages, tools=tools, temperature=request.temperature)
        stream: anthropic.AsyncStream[object] | _DirectEvents
        try:
            if self._sender is not None:
                self.direct_sends += 1
                stream = _DirectEvents(await self._sender.open(body, _SEND_ERRORS))
            else:
                stream = await self._client.post(
                    "/v1/messages",
                    cast_to=AnthropicMessage,
                    content=body,
                    options={"headers": {}},
                    stream=True,
                    stream_cls=anthropic.AsyncStream[object],  # events as parsed JSON (module docstring)
                )
                sent = stream.response.request
                if self._http is not None and sent.method == "POST" and not stream.response.history:
                    self._sender = DirectSender(self._http, sent)  # (a redirected call: every call goes through post)
        except anthropic.AnthropicError as exc:
            raise model_error(exc, model) from exc

        reply = _Reply(model)
        async with stream:
            try:
                async for batch in stream.batches() if isinstance(stream, _DirectEvents) else one_by_one(stream):
                    # The text of the events one read brought goes on as one delta (as the OpenAI-compatible
                    # adapter does: under load, a burst of pieces costs the layers above one piece).
                    text: list[str] = []
                    for event in batch:
                        taken = reply.take(event)
                        if isinstance(taken, str):
                            text.append(taken)
                        elif taken is not None:
                            if text:
                                yield TextDelta(text="".join(text))
                                text = []
                            yield taken
                    if text:
                        yield TextDelta(text="".join(text))
            except _Malformed as exc:
                raise ModelPermanentError(f"model {model}: unexpected response shape: {exc}") from exc
            except anthropic.AnthropicError as exc:
                raise model_error(exc, model) from exc
            except httpx2.TransportError as exc:  # the SDK does not wrap a connection lost mid-stream
                raise ModelRetryableError(f"model {model}: connection dropped mid-stream ({exc})") from exc
        if not reply.stopped:
            raise ModelRetryableError(f"model {model}: the stream ended before the model finished its reply")
        header_id = stream.response.headers.get("request-id")
        yield ReplyInfo(
            provider="anthropic",
            model=reply.served_model,
            finish_reason=reply.stop_reason,
            request_id=header_id or reply.message_id,
        )
        reported = reply.usage.total()
        if self._limiter is not None:
            self._limiter.settle(estimate, reported.input_tokens + reported.output_tokens)
        yield UsageReport(usage=self._priced(reply.served_model, model, reported, cache_write=reply.usage.cache_write))


class _Reply:
    """What a streamed reply told so far (its served model and id, stop reason, usage, whether it stopped), one
    event at a time: `take` returns the event's text, or its other chunk, or None."""

    __slots__ = ("message_id", "served_model", "stop_reason", "stopped", "usage")

    def __init__(self, model: str) -> None:
        self.served_model = model
        self.message_id: str | None = None
        self.stop_reason: str | None = None
        self.stopped = False
        self.usage = _StreamUsage()

    def take(self, event: object) -> str | ModelChunk | None:
        if not isinstance(event, dict):
            raise _Malformed(f"a stream event is a {type(event).__name__}, not an object")
        kind = event.get("type")
        if kind == "content_block_delta":  # most events: one piece of text each
            delta = _object(event.get("delta"), "delta")
            if delta.get("type") == "text_delta":
                text = delta.get("text")
                return _string(text, "text") if text else None
            if delta.get("type") == "input_json_delta":
                fragment = delta.get("partial_json")
                if fragment:
                    return ToolCallDelta(index=_index(event), arguments=_string(fragment, "partial_json"))
        elif kind == "message_start":
            message = _object(event.get("message"), "message")
            self.served_model = _optional_string(message.get("model"), "model") or self.served_model
            self.message_id = _optional_string(message.get("id"), "id") or None
            self.usage.update(message.get("usage"))
        elif kind == "content_block_start":
            block = _object(event.get("content_block"), "content_block")
            if block.get("type") == "tool_use":
                given = block.get("input")
                return ToolCallDelta(
                    index=_index(event),
                    id=_string(block.get("id"), "id"),
                    name=_string(block.get("name"), "name"),
                    arguments=json.dumps(given) if isinstance(given, dict) and given else "",
                )
            if block.get("type") == "text" and block.get("text"):
                return _string(block.get("text"), "text")
        elif kind == "message_delta":
            changed = _object(event.get("delta"), "delta")
            self.stop_reason = _optional_string(changed.get("stop_reason"), "stop_reason") or self.stop_reason
            self.usage.update(event.get("usage"))
        elif kind == "message_stop":
            self.stopped = True
        return None


def _reply_error(response: httpx2.Response) -> anthropic.APIStatusError:
    """What the SDK raises for a reply that is not a success: its class as far as `model_error` tells them apart,
    and its body, so the same `ModelError` for every error the API sends (a JSON body with ``error.type`` and
    ``error.message``). A body that is not JSON is shown as its text (the SDK composes a longer message with helpers
    of its own that loopd does not call)."""
    text = response.text.strip()
    return _status_error(response, text, text or f"Error code: {response.status_code}", prefix=True)


def _in_band_error(data: bytes, response: httpx2.Response) -> anthropic.APIStatusError:
    """An ``error`` event inside an accepted stream, as the SDK's stream raises it (see `_reply_error`)."""
    text = data.decode(errors="replace")
    return _status_error(response, text, text or f"Error code: {response.status_code}", prefix=False)


_SEND_ERRORS = SendErrors(anthropic.APITimeoutError, anthropic.APIConnectionError, _reply_error)
"""What the SDK's ``post`` raises, for a direct send (`DirectSender.open`); a connection error's detail is its
cause, which each is raised from."""


def _status_error(response: httpx2.Response, text: str, fallback: str, *, prefix: bool) -> anthropic.APIStatusError:
    """The SDK's status error for a reply (``prefix``: ``Error code: N - `` before a JSON body) or an in-band event:
    the JSON body when ``text`` is one (its text otherwise)."""
    body: object = text
    try:
        body = json.loads(text)
    except ValueError:
        message = fallback
    else:
        message = f"Error code: {response.status_code} - {body}" if prefix else f"{body}"
    return anthropic.APIStatusError(message, response=response, body=body)


class _DirectEvents(DirectReply):
    """A streamed Messages reply read off the HTTP response: the parsed JSON of each named event, as
    ``anthropic.AsyncStream[object]`` yields them (``ping`` and unnamed events skipped, an ``error`` event raised as
    the SDK raises it), in `batches` of what each read brought. Closing it closes the response."""

    __slots__ = ()

    async def batches(self) -> AsyncIterator[list[object]]:
        """The parsed events each read of the response brought, together (never an empty list)."""
        response = self.response
        async for events in server_sent_event_batches(self._body()):
            batch: list[object] = []
            for name, data in events:
                if name is None or name == "ping":
                    continue
                if name == "error":
                    if batch:
                        yield batch  # what came before the error, as the SDK's stream shows it
                    raise _in_band_error(data, response)
                if data:
                    batch.append(loads(data))
            if batch:
                yield batch

    async def _body(self) -> AsyncIterator[bytes]:
        """The response's bytes; a failure to read them raised as the SDK's stream raises it."""
        chunks = self.response.aiter_bytes()
        while True:
            try:
                chunk = await anext(chunks, None)
            except httpx2.TimeoutException as exc:
                raise _SEND_ERRORS.timeout(self.response.request) from exc
            except Exception as exc:
                raise _SEND_ERRORS.connection(self.response.request) from exc
            if chunk is None:
                return
            yield chunk


@dataclasses.dataclass
class _StreamUsage:
    """The usage fields of ``message_start`` and ``message_delta`` (later values win; all are cumulative)."""

    uncached: int = 0
    cache_write: int = 0
    cache_read: int = 0
    output: int = 0

    def update(self, usage: object) -> None:
        """Take the counters an event's ``usage`` object reports (a missing or null one keeps its value)."""
        if usage is None:
            return
        fields = _object(usage, "usage")
        self.uncached = _count(fields, "input_tokens", self.uncached)
        self.cache_write = _count(fields, "cache_creation_input_tokens", self.cache_write)
        self.cache_read = _count(fields, "cache_read_input_tokens", self.cache_read)
        self.output = _count(fields, "output_tokens", self.output)

    def total(self) -> Usage:
        return usage_from_anthropic(self.uncached, self.cache_write, self.cache_read, self.output)


class _Malformed(LoopdError, ValueError):
    """A stream event of another shape than the Messages API's (becomes a `ModelPermanentError`)."""


def _object(value: object, name: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _Malformed(f"{name} is a {type(value).__name__}, not an object")
    return value


def _string(value: object, name: str) -> str:
    if not isinstance(value, str):
        raise _Malformed(f"{name} is a {type(value).__name__}, not a string")
    return value


def _optional_string(value: object, name: str) -> str | None:
    return None if value is None else _string(value, name)


def _index(event: dict[str, Any]) -> int:
    index = event.get("index")
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        raise _Malformed(f"a content block's index is {index!r}, not a whole number")
    return index


def _count(fields: dict[str, Any], name: str, kept: int) -> int:
    value = fields.get(name)
    if value is None:
        return kept
    if not isinstance(value, int) or isinstance(value, bool):
        raise _Malformed(f"usage {name} is {value!r}, not a whole number")
    return value


def usage_from_anthropic(uncached: int, cache_write: int, cache_read: int, output: int) -> Usage:
    """One call's usage in loopd's convention: ``input_tokens`` counts every prompt token, ``cached_tokens`` the
    cache reads (cache writes are in ``input_tokens``, priced apart by the adapter)."""
    return Usage(
        input_tokens=uncached + cache_write + cache_read, output_tokens=output, cached_tokens=cache_read, calls=1
    )


def _json(value: object) -> bytes:
    """``value`` as the SDK encodes a request body: compact, UTF-8, no NaN."""
    return compact(value).encode()


def request_body(
    model: str,
    max_tokens: int,
    system: list[dict[str, Any]],
    messages: list[dict[str, Any]],
    *,
    tools: list[dict[str, Any]],
    temperature: float | None,
) -> bytes:
    """The JSON body ``messages.create`` would send for these arguments (the same bytes, keys in its order), encoded
    here in one pass: the SDK's own path deep-copies the whole body (every message of the history) on each request
    before encoding it."""
    head = _json({"max_tokens": max_tokens})
    tail: dict[str, Any] = {"model": model, "stream": True}
    if system:
        tail["system"] = system
    if tools:
        tail["tools"] = tools
    if temperature is not None:
        tail["temperature"] = temperature
    return b"".join((head[:-1], b',"messages":', _json(messages), b",", _json(tail)[1:]))


def anthropic_messages(
    request: ModelRequest, *, cache: bool = True
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The Messages API ``system`` blocks and ``messages`` for a request (see the module docstring)."""
    system_texts = [request.system] if request.system else []
    messages: list[dict[str, Any]] = []
    for message in request.messages:
        if message.role == "system":
            if message.content:
                system_texts.append(message.content)
            continue
        role, blocks = _blocks(message)
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].extend(blocks)
        else:
            messages.append({"role": role, "content": blocks})
    system: list[dict[str, Any]] = [{"type": "text", "text": text} for text in system_texts]
    if cache:
        if system:
            system[-1]["cache_control"] = _EPHEMERAL
        if messages and messages[-1]["content"]:
            last = messages[-1]["content"]
            last[-1] = {**last[-1], "cache_control": _EPHEMERAL}
    return system, messages


def _blocks(message: Message) -> tuple[str, list[dict[str, Any]]]:
    if message.role == "user":
        return "user", [{"type": "text", "text": message.content or " "}]
    if message.role == "tool":
        if not message.tool_call_id:
            raise ModelPermanentError("a tool message has no tool_call_id; the provider cannot match it")
        return "user", [{"type": "tool_result", "tool_use_id": message.tool_call_id, "content": message.content}]
    blocks: list[dict[str, Any]] = []
    if message.content:
        blocks.append({"type": "text", "text": message.content})
    for call in message.tool_calls:
        blocks.append({"type": "tool_use", "id": call.id, "name": call.name, "input": call.arguments})
    if not blocks:
        blocks.append({"type": "text", "text": " "})
    return "assistant", blocks


_RETRYABLE_STATUS = frozenset({408, 409, 429})
_PERMANENT_IN_BAND = frozenset({"invalid_request_error", "authentication_error", "permission_error", "not_found_error"})


def model_error(exc: anthropic.AnthropicError, model: str) -> ModelError:
    """Translate an `anthropic` exception into the harness's typed retryable / permanent error."""
    if isinstance(exc, anthropic.APITimeoutError):
        return ModelRetryableError(f"model {model}: the request timed out")
    if isinstance(exc, anthropic.APIConnectionError):
        cause = exc.__cause__ or exc.__context__
        detail = f"{type(cause).__name__}: {cause}" if cause is not None else str(exc)
        return ModelRetryableError(f"model {model}: connection failed or dropped ({detail})")
    if isinstance(exc, anthropic.APIStatusError):
        status = exc.status_code
        error = exc.body.get("error") if isinstance(exc.body, dict) else None
        error_type = error.get("type") if isinstance(error, dict) else None
        reason = error.get("message") if isinstance(error, dict) else None
        shown = reason if isinstance(reason, str) else exc.message
        if status < 400:  # an ``error`` event inside an accepted stream
            message = f"model {model}: the stream reported an error: {error_type or 'error'}: {shown}"
            if error_type in _PERMANENT_IN_BAND:
                return ModelPermanentError(message)
            return ModelRetryableError(message)
        message = f"model {model}: HTTP {status}: {shown}"
        headers = exc.response.headers
        should_retry = headers.get("x-should-retry")
        if should_retry == "true":
            retryable = True
        elif should_retry == "false":
            retryable = False
        else:
            retryable = status in _RETRYABLE_STATUS or status >= 500
        if retryable:
            return ModelRetryableError(message, status_code=status, retry_after=retry_after_seconds(headers))
        return ModelPermanentError(message, status_code=status)
    if isinstance(exc, anthropic.APIResponseValidationError):
        return ModelPermanentError(f"model {model}: unexpected response shape: {exc.message}")
    if isinstance(exc, anthropic.APIError):
        return ModelRetryableError(f"model {model}: the stream reported an error: {exc.message}")
    return ModelPermanentError(f"model {model}: {exc}")
