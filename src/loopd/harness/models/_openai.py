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
the caller decides: a silent restart would duplicate text. Each retry is announced by an `AttemptFailed` chunk
(``loopd.harness.models._retrying``, shared with the Anthropic adapter).

**Rate limits:** with a ``limiter`` (``LOOPD_RATE_LIMITS``), every attempt first waits for its admission.

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
import json
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import Literal

import httpx2
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
from loopd.harness.models._protocol import (
    ModelChunk,
    ModelRequest,
    ReplyInfo,
    TextDelta,
    ToolCallDelta,
    UsageReport,
)
from loopd.harness.models._ratelimit import RateLimiter, estimate_tokens
from loopd.harness.models._retrying import DEFAULT_BACKOFF, retry_after_seconds, retry_delay, retrying
from loopd.harness.models._sdk import SdkAdapter, check_settings

__all__ = [
    "DEFAULT_BACKOFF",
    "OpenAICompatibleModel",
    "model_error",
    "openai_messages",
    "retry_after_seconds",
    "retry_delay",
]


Sleep = Callable[[float], Awaitable[None]]
MaxTokensField = Literal["max_completion_tokens", "max_tokens"]


class OpenAICompatibleModel(SdkAdapter[openai.AsyncOpenAI]):
    """A `Model` served by any OpenAI-compatible Chat Completions endpoint.

    ``model`` is the default model id; a non-empty ``ModelRequest.model`` overrides it per call. ``sleep`` and
    ``random`` (the backoff's random source) are injectable so tests control backoff time. Pass ``client`` to
    share an `openai.AsyncOpenAI` (it must have ``max_retries=0``; it is not closed by `aclose`), or ``http_client``
    to send through a given ``httpx2.AsyncClient`` (a recording transport, a proxy; not closed by `aclose` either).
    ``limiter`` is the provider's shared `RateLimiter`.
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
        http_client: httpx2.AsyncClient | None = None,
        limiter: RateLimiter | None = None,
    ) -> None:
        check_settings(model, timeout=timeout, max_retries=max_retries, max_retry_after=max_retry_after)
        super().__init__(
            model,
            client=client
            or openai.AsyncOpenAI(
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
        self._include_usage = include_usage
        self._max_tokens_field: MaxTokensField = max_tokens_field

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        """Stream one reply; see the module docstring for the retry, usage and cancellation contract."""
        model = request.model or self._model
        messages = openai_messages(request)
        async with aclosing(
            retrying(
                lambda: self._attempt(model, request, messages),
                provider="openai",
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
        estimate = 0
        if self._limiter is not None:
            estimate = estimate_tokens(sum(len(str(m.get("content") or "")) for m in messages), limit)
            await self._limiter.acquire(estimate)
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

        finished: str | None = None
        usage: CompletionUsage | None = None
        served_model = model
        completion_id: str | None = None
        async with stream:
            try:
                async for chunk in stream:
                    served_model = chunk.model or served_model
                    completion_id = completion_id or chunk.id or None
                    if chunk.usage is not None:
                        usage = chunk.usage
                    deltas, finish_reason = translate_chunk(chunk)
                    finished = finished or finish_reason
                    for delta in deltas:
                        yield delta
            except openai.OpenAIError as exc:
                raise model_error(exc, model) from exc
        if not finished:
            raise ModelRetryableError(f"model {model}: the stream ended before the model finished its reply")
        response = getattr(stream, "response", None)
        header_id = response.headers.get("x-request-id") if response is not None else None
        yield ReplyInfo(
            provider="openai", model=served_model, finish_reason=finished, request_id=header_id or completion_id
        )
        reported = usage_from_openai(usage)
        if self._limiter is not None:
            self._limiter.settle(estimate, reported.input_tokens + reported.output_tokens)
        yield UsageReport(usage=self._priced(served_model, model, reported))


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
