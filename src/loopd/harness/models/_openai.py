"""The OpenAI-compatible Model adapter, on the official `openai` client (Chat Completions, streamed).

Provider differences stop here: requests are built from `ModelRequest`, streamed chunks become
`ModelChunk`s and `openai` exceptions become `ModelError`s (``raise ... from exc``):

    retryable   APIConnectionError (also a connection dropped mid-stream), APITimeoutError, 408, 409,
                429 (with Retry-After / retry-after-ms), 5xx, an in-band stream error, a stream that ends
                without a finish_reason; an ``x-should-retry`` response header overrides the status rule
    permanent   other 4xx (400, 401, 403, 404, 422, …), a response the client cannot validate, a request
                that cannot be expressed (a tool message without a tool_call_id)

**Retries** are ours (the client's own retries are disabled). A retryable failure that happens *before
the first chunk is yielded* is retried up to ``max_retries`` times, sleeping the ``backoff``'s delay
(``loopd._infra.backoff``: exponential with full jitter, never less than the provider's Retry-After; a
Retry-After longer than ``max_retry_after`` is not waited for, the error is raised instead). Once a chunk has been
yielded the caller has seen partial output, so a later failure is raised as `ModelRetryableError` and
the caller decides: a silent restart would duplicate text.

**Usage** is requested with ``stream_options.include_usage``; exactly one `UsageReport` ends every
successful stream (``calls=1``, zero tokens if the provider sent none), priced by the optional
`PriceTable`.

**Cancellation** of the consuming task, or ``aclose()`` of the stream, closes the HTTP response (the
client's stream is used as an async context manager): the connection is released and the server sees the
disconnect.

**Timeouts:** ``timeout`` bounds every I/O operation of the client: connect, write, and each read, which
for a stream is the longest silence allowed between two chunks.
"""

from __future__ import annotations

import asyncio
import dataclasses
import email.utils
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from contextlib import aclosing
from datetime import UTC, datetime
from types import TracebackType
from typing import Literal, Self

import openai
from openai.types.chat import (
    ChatCompletionAssistantMessageParam,
    ChatCompletionChunk,
    ChatCompletionMessageParam,
    ChatCompletionMessageToolCallParam,
    ChatCompletionStreamOptionsParam,
    ChatCompletionToolParam,
)
from openai.types.completion_usage import CompletionUsage

from loopd._infra.backoff import Backoff
from loopd.harness._errors import ModelError, ModelPermanentError, ModelRetryableError
from loopd.harness.core import Message, Usage
from loopd.harness.models._pricing import PriceTable
from loopd.harness.models._protocol import ModelChunk, ModelRequest, TextDelta, ToolCallDelta, UsageReport

logger = logging.getLogger(__name__)

Sleep = Callable[[float], Awaitable[None]]
MaxTokensField = Literal["max_completion_tokens", "max_tokens"]


def retry_delay(backoff: Backoff, retry: int, retry_after: float | None, max_retry_after: float) -> float | None:
    """Seconds to sleep before retry number ``retry`` (0-based); None means "do not retry".

    A provider's ``retry_after`` is a floor under the jittered backoff; one longer than ``max_retry_after``
    returns None so the error reaches the caller instead of a long silent sleep.
    """
    if retry_after is not None and retry_after > max_retry_after:
        return None
    jittered = backoff.delay(retry)
    return jittered if retry_after is None else max(retry_after, jittered)


DEFAULT_BACKOFF = Backoff(base=0.5, factor=2.0, max_delay=8.0)
"""Retry *n* (0-based) sleeps ``U(0, min(8, 0.5·2ⁿ))`` (full jitter)."""


class OpenAICompatibleModel:
    """A `Model` served by any OpenAI-compatible Chat Completions endpoint.

    ``model`` is the default model id; a non-empty ``ModelRequest.model`` overrides it per call. ``sleep`` and
    ``random`` (the backoff's random source) are injectable so tests control backoff time. Pass ``client`` to
    share an `openai.AsyncOpenAI` (it must have ``max_retries=0``; it is not closed by `aclose`).
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str,
        timeout: float = 60.0,
        max_retries: int = 3,
        backoff: Backoff | None = None,
        max_retry_after: float = 60.0,
        prices: PriceTable | None = None,
        include_usage: bool = True,
        max_tokens_field: MaxTokensField = "max_completion_tokens",
        sleep: Sleep = asyncio.sleep,
        random: Callable[[], float] | None = None,
        client: openai.AsyncOpenAI | None = None,
    ) -> None:
        if not model:
            raise ValueError("model must be a non-empty model id")
        if timeout <= 0:
            raise ValueError("timeout must be > 0 seconds")
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        self._model = model
        self._max_retries = max_retries
        if max_retry_after < 0:
            raise ValueError("max_retry_after must be >= 0 seconds")
        chosen = backoff or DEFAULT_BACKOFF
        self._backoff = dataclasses.replace(chosen, random=random) if random is not None else chosen
        self._max_retry_after = max_retry_after
        self._prices = prices
        self._include_usage = include_usage
        self._max_tokens_field: MaxTokensField = max_tokens_field
        self._sleep = sleep
        self._owns_client = client is None
        self._client = client or openai.AsyncOpenAI(api_key=api_key, base_url=base_url, timeout=timeout, max_retries=0)
        self._flagged_unpriced: set[str] = set()

    @property
    def name(self) -> str:
        return self._model

    async def aclose(self) -> None:
        """Close the HTTP client (only if this adapter created it)."""
        if self._owns_client:
            await self._client.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        """Stream one reply; see the module docstring for the retry, usage and cancellation contract."""
        model = request.model or self._model
        messages = openai_messages(request)
        retry = 0
        while True:
            yielded = False
            try:
                async with aclosing(self._attempt(model, request, messages)) as chunks:
                    async for chunk in chunks:
                        yielded = True
                        yield chunk
                return
            except ModelRetryableError as err:
                if yielded or retry >= self._max_retries:
                    raise
                delay = retry_delay(self._backoff, retry, err.retry_after, self._max_retry_after)
                if delay is None:
                    raise
                retry += 1
                logger.info("model %s: %s; retry %d/%d in %.2fs", model, err, retry, self._max_retries, delay)
                await self._sleep(delay)

    async def _attempt(
        self, model: str, request: ModelRequest, messages: list[ChatCompletionMessageParam]
    ) -> AsyncGenerator[ModelChunk, None]:
        """One HTTP call; every failure leaves as a `ModelError`."""
        tools: list[ChatCompletionToolParam] = [
            {
                "type": "function",
                "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
            }
            for t in request.tools
        ]
        stream_options: ChatCompletionStreamOptionsParam | openai.Omit = (
            {"include_usage": True} if self._include_usage else openai.omit
        )
        limit = request.max_output_tokens
        try:
            stream = await self._client.chat.completions.create(
                model=model,
                messages=messages,
                stream=True,
                stream_options=stream_options,
                tools=tools or openai.omit,
                temperature=openai.omit if request.temperature is None else request.temperature,
                max_completion_tokens=(
                    limit if limit is not None and self._max_tokens_field == "max_completion_tokens" else openai.omit
                ),
                max_tokens=limit if limit is not None and self._max_tokens_field == "max_tokens" else openai.omit,
            )
        except openai.OpenAIError as exc:
            raise model_error(exc, model) from exc

        finished = False
        usage: CompletionUsage | None = None
        served_model = model
        async with stream:
            try:
                async for chunk in stream:
                    served_model = chunk.model or served_model
                    if chunk.usage is not None:
                        usage = chunk.usage
                    deltas, finish_reason = translate_chunk(chunk)
                    finished = finished or finish_reason is not None
                    for delta in deltas:
                        yield delta
            except openai.OpenAIError as exc:
                raise model_error(exc, model) from exc
        if not finished:
            raise ModelRetryableError(f"model {model}: the stream ended before the model finished its reply")
        yield UsageReport(usage=self._priced(served_model, model, usage_from_openai(usage)))

    def _priced(self, served_model: str, requested_model: str, usage: Usage) -> Usage:
        if self._prices is None:
            return usage
        quote = self._prices.quote(served_model, usage)
        if not quote.priced and served_model != requested_model:
            quote = self._prices.quote(requested_model, usage)
        if not quote.priced and requested_model not in self._flagged_unpriced:
            self._flagged_unpriced.add(requested_model)
            logger.warning("model %s is not in the price table; its calls are counted at $0", requested_model)
        return quote.usage


def openai_messages(request: ModelRequest) -> list[ChatCompletionMessageParam]:
    """The Chat Completions ``messages`` for a request (system prompt first)."""
    out: list[ChatCompletionMessageParam] = []
    if request.system:
        out.append({"role": "system", "content": request.system})
    out.extend(_openai_message(m) for m in request.messages)
    return out


def _openai_message(message: Message) -> ChatCompletionMessageParam:
    if message.role == "system":
        return {"role": "system", "content": message.content}
    if message.role == "user":
        return {"role": "user", "content": message.content}
    if message.role == "tool":
        if not message.tool_call_id:
            raise ModelPermanentError("a tool message has no tool_call_id; the provider cannot match it")
        return {"role": "tool", "tool_call_id": message.tool_call_id, "content": message.content}
    assistant: ChatCompletionAssistantMessageParam = {
        "role": "assistant",
        "content": message.content if message.content or not message.tool_calls else None,
    }
    if message.tool_calls:
        calls: list[ChatCompletionMessageToolCallParam] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
            }
            for call in message.tool_calls
        ]
        assistant["tool_calls"] = calls
    return assistant


def translate_chunk(chunk: ChatCompletionChunk) -> tuple[tuple[ModelChunk, ...], str | None]:
    """The model chunks in one streamed Chat Completions chunk (first choice only), and its finish_reason."""
    if not chunk.choices:
        return (), None
    choice = chunk.choices[0]
    delta = choice.delta
    out: list[ModelChunk] = []
    if delta.content:
        out.append(TextDelta(text=delta.content))
    if delta.refusal:
        out.append(TextDelta(text=delta.refusal))
    for call in delta.tool_calls or ():
        function = call.function
        out.append(
            ToolCallDelta(
                index=call.index,
                id=call.id or None,
                name=(function.name or None) if function else None,
                arguments=(function.arguments or "") if function else "",
            )
        )
    return tuple(out), choice.finish_reason


def usage_from_openai(usage: CompletionUsage | None) -> Usage:
    """One call's usage; ``input_tokens`` includes the cached prompt tokens."""
    if usage is None:
        return Usage(calls=1)
    details = usage.prompt_tokens_details
    cached = (details.cached_tokens or 0) if details is not None else 0
    return Usage(
        input_tokens=usage.prompt_tokens,
        output_tokens=usage.completion_tokens,
        cached_tokens=cached,
        calls=1,
    )


_RETRYABLE_STATUS = frozenset({408, 409, 429})


def model_error(exc: openai.OpenAIError, model: str) -> ModelError:
    """Translate an `openai` exception into the harness's typed retryable / permanent error."""
    if isinstance(exc, openai.APITimeoutError):
        return ModelRetryableError(f"model {model}: the request timed out")
    if isinstance(exc, openai.APIConnectionError):
        return ModelRetryableError(f"model {model}: connection failed or dropped ({_cause(exc)})")
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        headers = exc.response.headers
        body = exc.body
        detail = body.get("message") if isinstance(body, dict) else None
        message = f"model {model}: HTTP {status}: {detail if isinstance(detail, str) else exc.message}"
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
    if isinstance(exc, openai.APIResponseValidationError):
        return ModelPermanentError(f"model {model}: unexpected response shape: {exc.message}")
    if isinstance(exc, openai.APIError):
        # An error event inside an accepted stream: the provider failed while generating.
        return ModelRetryableError(f"model {model}: the stream reported an error: {exc.message}")
    return ModelPermanentError(f"model {model}: {exc}")


def _cause(exc: BaseException) -> str:
    cause = exc.__cause__ or exc.__context__
    return f"{type(cause).__name__}: {cause}" if cause is not None else str(exc)


def retry_after_seconds(headers: Mapping[str, str], *, now: datetime | None = None) -> float | None:
    """Seconds from ``retry-after-ms`` or ``retry-after`` (seconds or HTTP date); None if absent/invalid."""
    raw_ms = headers.get("retry-after-ms")
    if raw_ms:
        try:
            return max(float(raw_ms) / 1000.0, 0.0)
        except ValueError:
            pass
    raw = headers.get("retry-after")
    if not raw:
        return None
    try:
        return max(float(raw), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max((when - (now or datetime.now(UTC))).total_seconds(), 0.0)
