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

**HTTP client.** Without a ``client`` or ``http_client`` the adapter sends through `default_http_client`
(``loopd.harness.models._http``): the SDK's aiohttp-backed ``httpx2`` client, a fraction of the CPU per streamed read,
with a bound on getting a response's head (aiohttp has no write timeout) and connection errors told apart from
timeouts.

**Request body.** The body is JSON encoded here, not by ``chat.completions.create`` (whose type-directed transform walks
every message of every request: hundreds of milliseconds at a history of 500 steps). Each history message is encoded
once and its bytes kept, per conversation (`MessageEncoder`), so a request costs the new messages plus a join (the
encoded elements are kept joined in one growing buffer, so a request copies the history's bytes once); the bytes equal
what ``create`` sends for the same arguments (same key order, compact separators, UTF-8). The first call goes through
the client's ordinary ``post`` (auth, headers, timeouts, error mapping, the SSE parser, an ``http_client``'s transport:
cassettes and the ledger see the same request). When the adapter built the client itself (an API key, a base URL, a
timeout: headers that never change), the later calls send that first request's method, URL, headers and timeouts with
their own body straight through the same ``httpx2`` client and read the reply with a plain SSE line parser
(`_direct.DirectSender`, `_DirectStream`): the SDK rebuilt all of it on every call, about as much work as the rest of a
harness step. They raise what ``post`` and the SDK's stream raise (connection, timeout, status errors with the SDK's
message and body, in-band ``error`` events); a ``client`` given by the caller always goes through ``post``. The streamed
chunks are read as parsed JSON rather than built into ``ChatCompletionChunk`` objects; a chunk of another shape is a
permanent error.
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import aclosing
from itertools import islice
from typing import Any, Literal

import httpx2
import openai
from openai.types.chat import (
    ChatCompletion,
    ChatCompletionAssistantMessageParam,
    ChatCompletionMessageParam,
    ChatCompletionMessageToolCallParam,
)

from loopd._infra.backoff import Backoff
from loopd._infra.errors import LoopdError
from loopd._infra.jsontext import compact, loads
from loopd.harness._errors import ModelError, ModelPermanentError, ModelRetryableError
from loopd.harness.core import History, Message, Usage
from loopd.harness.models._direct import (
    REQUEST_ERRORS,
    DirectReply,
    DirectSender,
    SendErrors,
    one_by_one,
    server_sent_event_batches,
)
from loopd.harness.models._http import default_http_client
from loopd.harness.models._pricing import PriceTable
from loopd.harness.models._protocol import (
    ModelChunk,
    ModelRequest,
    ReplyInfo,
    TextDelta,
    ToolCallDelta,
    ToolSpec,
    UsageReport,
)
from loopd.harness.models._ratelimit import RateLimiter, estimate_tokens
from loopd.harness.models._retrying import DEFAULT_BACKOFF, retry_after_seconds, retry_delay, retrying
from loopd.harness.models._sdk import SdkAdapter, check_settings

__all__ = [
    "DEFAULT_BACKOFF",
    "MessageEncoder",
    "OpenAICompatibleModel",
    "model_error",
    "openai_messages",
    "retry_after_seconds",
    "retry_delay",
]


Sleep = Callable[[float], Awaitable[None]]
MaxTokensField = Literal["max_completion_tokens", "max_tokens"]
_ClosingKey = tuple[tuple[int, ...], float | None, int | None]
CLOSINGS_KEPT = 16
"""Encoded request ends an adapter keeps (one per tool set, temperature and output limit in use)."""


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
        if client is None and http_client is None:  # the SDK's own default client, made here so it is known
            http_client = default_http_client(timeout)
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
        self._encoder = MessageEncoder()
        self._http = (
            http_client if client is None else None
        )  # a client built here sends fixed headers: see DirectSender
        self._sender: DirectSender | None = None
        self._closings: OrderedDict[_ClosingKey, tuple[Sequence[ToolSpec], bytes]] = OrderedDict()
        self.direct_sends = 0
        """Calls sent straight through the HTTP client with the SDK's recorded request (what tests watch)."""

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        """Stream one reply; see the module docstring for the retry, usage and cancellation contract."""
        model = request.model or self._model
        messages = self._encoder.encode(request)
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
        self, model: str, request: ModelRequest, messages: EncodedMessages
    ) -> AsyncGenerator[ModelChunk, None]:
        """One HTTP call; every failure leaves as a `ModelError`."""
        limit = request.max_output_tokens
        estimate = 0
        if self._limiter is not None:
            estimate = estimate_tokens(messages.characters, limit)
            await self._limiter.acquire(estimate)
        body = request_body_with(model, messages, self._closing(request.tools, request.temperature, limit))
        stream: openai.AsyncStream[object] | _DirectStream
        try:
            if self._sender is not None:
                self.direct_sends += 1
                stream = _DirectStream(await self._sender.open(body, _SEND_ERRORS))
            else:
                stream = await self._client.post(
                    "/chat/completions",
                    cast_to=ChatCompletion,
                    content=body,
                    options=_REQUEST_OPTIONS,
                    stream=True,
                    stream_cls=openai.AsyncStream[object],  # chunks as parsed JSON: see translate_chunk
                )
                sent = stream.response.request
                if self._http is not None and sent.method == "POST" and not stream.response.history:
                    self._sender = DirectSender(self._http, sent)  # (a redirected call: every call goes through post)
        except openai.OpenAIError as exc:
            raise model_error(exc, model) from exc

        finished: str | None = None
        usage: Mapping[str, Any] | None = None
        served_model = model
        completion_id: str | None = None
        async with stream:
            try:
                async for batch in stream.batches() if isinstance(stream, _DirectStream) else one_by_one(stream):
                    # The text of the chunks one read brought goes on as one delta (what already arrived together
                    # is handed on together: under load, a burst of pieces costs the layers above one piece).
                    text: list[str] = []
                    for chunk in batch:
                        if not isinstance(chunk, dict):
                            raise _Malformed(f"a stream chunk is a {type(chunk).__name__}, not an object")
                        served_model = _text(chunk.get("model")) or served_model
                        completion_id = completion_id or _text(chunk.get("id")) or None
                        reported_usage = chunk.get("usage")
                        if isinstance(reported_usage, dict):
                            usage = reported_usage
                        plain = plain_text(chunk)
                        if plain is not None:
                            text.append(plain)
                            continue
                        deltas, finish_reason = translate_chunk(chunk)
                        finished = finished or finish_reason
                        for delta in deltas:
                            if isinstance(delta, TextDelta):
                                text.append(delta.text)
                                continue
                            if text:
                                yield TextDelta(text="".join(text))
                                text = []
                            yield delta
                    if text:
                        yield TextDelta(text="".join(text))
            except openai.OpenAIError as exc:
                raise model_error(exc, model) from exc
            except _Malformed as exc:
                raise ModelPermanentError(f"model {model}: unexpected response shape: {exc}") from exc
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

    def _closing(self, tools: Sequence[ToolSpec], temperature: float | None, limit: int | None) -> bytes:
        """`request_closing` for this adapter, kept per set of tool specs (by identity: the built-in tools' specs
        are built once per class, so every session offering the same tools shares one entry, however its loop
        tuples them). The entry holds the specs, so an id in its key cannot be reused while it is kept; at most
        `CLOSINGS_KEPT` entries, least recently used dropped first."""
        key = (tuple(map(id, tools)), temperature, limit)
        closings = self._closings
        kept = closings.get(key)
        if kept is not None:
            closings.move_to_end(key)
            return kept[1]
        closing = request_closing(
            tools=tools,
            include_usage=self._include_usage,
            temperature=temperature,
            max_tokens=limit,
            max_tokens_field=self._max_tokens_field,
        )
        closings[key] = (tuple(tools), closing)
        if len(closings) > CLOSINGS_KEPT:
            closings.popitem(last=False)
        return closing


_REQUEST_OPTIONS: openai.RequestOptions = {"security": {"bearer_auth": True}}
"""What ``chat.completions.create`` passes to ``post`` besides the body: the bearer-token auth."""


def _status_error(response: httpx2.Response) -> openai.APIStatusError:
    """The error the SDK raises for a 4xx/5xx reply (same message and body; `model_error` reads no more)."""
    message = f"Error code: {response.status_code}"
    text = response.text.strip()
    body: object = text
    try:
        body = json.loads(text)
    except ValueError:
        pass
    else:
        error = body.get("error", body) if isinstance(body, dict) else None
        detail = error.get("message") if isinstance(error, dict) else None
        if isinstance(detail, str) and detail:
            message += f" - {detail}"
    data = body.get("error", body) if isinstance(body, dict) else body
    return openai.APIStatusError(message, response=response, body=data)


_SEND_ERRORS = SendErrors(openai.APITimeoutError, openai.APIConnectionError, _status_error)
"""What the SDK's ``post`` raises, for a direct send (`DirectSender.open`)."""


class _DirectStream(DirectReply):
    """A streamed Chat Completions reply read off the HTTP response: the parsed JSON of each server-sent event, as
    ``openai.AsyncStream[object]`` yields them (the same ``[DONE]`` end, in-band ``error`` check and errors), with
    a plain line parser instead of the SDK's per-event objects. Closing it closes the response."""

    __slots__ = ()

    def __aiter__(self) -> AsyncIterator[object]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[object]:
        async for batch in self.batches():
            for chunk in batch:
                yield chunk

    async def batches(self) -> AsyncIterator[list[object]]:
        """The chunks each read of the response brought, together (never an empty list)."""
        response = self.response
        done = False
        try:
            async for events in server_sent_event_batches(response.aiter_bytes()):
                batch: list[object] = []
                for event, data in events:
                    if done:
                        continue  # HTTP/1.1: read the rest so the connection can be reused (as the SDK does)
                    if data.startswith(b"[DONE]"):
                        if response.http_version != "HTTP/1.1":
                            if batch:
                                yield batch
                            return
                        done = True
                        continue
                    if event is not None and event.startswith("thread."):
                        continue  # the Assistants API's events: never part of a Chat Completions stream
                    parsed = loads(data)
                    if isinstance(parsed, dict) and parsed.get("error"):
                        error = parsed["error"]
                        message = error.get("message") if isinstance(error, dict) else None
                        if not message or not isinstance(message, str):
                            message = "An error occurred during streaming"
                        if batch:
                            yield batch  # what came before the error, as a stream of single chunks shows it
                        raise openai.APIError(message, response.request, body=error)
                    batch.append(parsed)
                if batch:
                    yield batch
        except httpx2.TimeoutException as exc:
            raise openai.APITimeoutError(request=response.request) from exc
        except REQUEST_ERRORS as exc:
            raise openai.APIConnectionError(request=response.request) from exc


def _json(value: object) -> bytes:
    """``value`` as the SDK encodes a request body: compact, UTF-8, no NaN."""
    return compact(value).encode()


class EncodedMessages:
    """A request's ``messages`` as JSON — the system prompt's element, then the history's elements already joined
    by commas (one growing buffer per conversation: a request copies the history's bytes once, into its body) —
    and the characters of their contents (for the rate limiter's estimate)."""

    __slots__ = ("_count", "_history", "_joined", "_length", "characters", "system")

    def __init__(self, system: bytes | None, history: list[bytes], joined: bytearray, characters: int) -> None:
        self.system = system
        self._history = history  # the conversation's list (it only grows): this request's are the first _count
        self._count = len(history)
        self._joined = joined
        self._length = len(joined)
        self.characters = characters

    @property
    def parts(self) -> list[bytes]:
        """Each message's encoded element, system prompt first."""
        return ([self.system] if self.system is not None else []) + self._history[: self._count]

    def array(self, head: bytes = b"", tail: bytes = b"") -> bytes:
        """The JSON array of the messages, between ``head`` and ``tail`` (a request body's other parts: the
        history's bytes, the bulk of a long conversation's body, are copied once, straight into it)."""
        # The conversation's buffer only grows (a replaced history gets a new one), so its first ``_length`` bytes
        # are this request's history even if later requests appended to it; the view is released at once.
        with memoryview(self._joined) as view, view[: self._length] as history:
            if self.system is None:
                return b"".join((head, b"[", history, b"]", tail))
            return b"".join((head, b"[", self.system, b"," if self._length else b"", history, b"]", tail))


class _Conversation:
    """One conversation's encoded history: the messages seen last time, their encoded elements, and the elements
    joined by commas."""

    __slots__ = ("characters", "joined", "messages", "parts")

    def __init__(self) -> None:
        self.messages: Sequence[Message] = ()
        self.parts: list[bytes] = []
        self.joined = bytearray()
        self.characters = 0


def _continues(history: Sequence[Message], previous: Sequence[Message]) -> bool:
    """Whether ``history`` starts with the messages of ``previous`` (the same objects, or equal ones)."""
    count = len(previous)
    if count == 0:
        return True
    if count > len(history):
        return False
    if isinstance(history, History) and isinstance(previous, History) and history.extends(previous):
        return True  # O(1): the same buffer, grown
    return tuple(islice(history, count)) == tuple(previous)


class MessageEncoder:
    """Encodes the ``messages`` of successive requests, each history message only once.

    A conversation is recognised by its first message (the same object from step to step: the harness's history
    only grows, or is replaced by a compaction). When a request's messages start with the messages of the last
    request of that conversation (the same objects, or equal ones), only the new ones are encoded; otherwise
    (compaction, an edited history) the whole list is, and replaces the kept one. The harness passes its `History`
    itself: one that extends the last (the same buffer, grown) is recognised in O(1) and only its new messages are
    read; any other sequence is compared message by message. At most ``conversations`` conversations are kept, the
    least recently used dropped first.
    """

    def __init__(self, conversations: int = 128) -> None:
        if conversations < 1:
            raise ValueError("conversations must be >= 1")
        self._limit = conversations
        self._kept: OrderedDict[int, _Conversation] = OrderedDict()
        self.encoded = 0
        """How many messages were encoded so far (the system prompt not counted): what tests watch."""

    def encode(self, request: ModelRequest) -> EncodedMessages:
        """The encoded ``messages`` of ``request`` (system prompt first); `ModelPermanentError` for a message
        the provider cannot take."""
        # The harness's `History` as it is (O(1) to tell whether it extends the last one: the same buffer, grown);
        # any other sequence as a tuple, compared with the last one message by message.
        history: Sequence[Message] = request.messages
        if not isinstance(history, History):
            history = tuple(history)
        system: bytes | None = None
        characters = 0
        if request.system:
            system = _json({"role": "system", "content": request.system})
            characters += len(request.system)
        if not history:
            return EncodedMessages(system, [], bytearray(), characters)
        conversation = self._conversation(history[0])
        kept = len(conversation.messages)
        if not _continues(history, conversation.messages):
            conversation.messages, conversation.parts, conversation.characters, kept = (), [], 0, 0
            conversation.joined = bytearray()  # a new buffer: requests encoded before keep reading the old one
        added: list[bytes] = []
        counted = 0
        fresh = history.tail(kept) if isinstance(history, History) else history[kept:]
        for message in fresh:  # a message that cannot be sent raises before anything is kept
            encoded = _openai_message(message)
            added.append(_json(encoded))
            counted += len(str(encoded.get("content") or ""))
        self.encoded += len(added)
        joined = conversation.joined
        for part in added:
            if joined:
                joined += b","
            joined += part
        conversation.parts.extend(added)
        conversation.characters += counted
        conversation.messages = history
        characters += conversation.characters
        return EncodedMessages(system, conversation.parts, joined, characters)

    def _conversation(self, first: Message) -> _Conversation:
        key = id(first)
        found = self._kept.get(key)
        if found is not None and found.messages and found.messages[0] is first:
            self._kept.move_to_end(key)
            return found
        created = _Conversation()
        self._kept[key] = created
        self._kept.move_to_end(key)
        while len(self._kept) > self._limit:
            self._kept.popitem(last=False)
        return created


def request_body(
    model: str,
    messages: EncodedMessages,
    *,
    tools: Sequence[ToolSpec],
    include_usage: bool,
    temperature: float | None,
    max_tokens: int | None,
    max_tokens_field: MaxTokensField,
) -> bytes:
    """The JSON body ``chat.completions.create`` would send for these arguments (the same bytes, keys in its
    order), built from already encoded messages."""
    closing = request_closing(
        tools=tools,
        include_usage=include_usage,
        temperature=temperature,
        max_tokens=max_tokens,
        max_tokens_field=max_tokens_field,
    )
    return request_body_with(model, messages, closing)


def request_body_with(model: str, messages: EncodedMessages, closing: bytes) -> bytes:
    """`request_body` with its end (`request_closing`) already encoded."""
    return messages.array(_json({"model": model, "stream": True})[:-1] + b',"messages":', closing)


def request_closing(
    *,
    tools: Sequence[ToolSpec],
    include_usage: bool,
    temperature: float | None,
    max_tokens: int | None,
    max_tokens_field: MaxTokensField,
) -> bytes:
    """What follows the messages in a request body: the other arguments, and the closing brace."""
    tail: dict[str, Any] = {}
    if max_tokens is not None:
        tail[max_tokens_field] = max_tokens
    if include_usage:
        tail["stream_options"] = {"include_usage": True}
    if temperature is not None:
        tail["temperature"] = temperature
    if tools:
        tail["tools"] = [
            {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}
            for t in tools
        ]
    return b"," + _json(tail)[1:] if tail else b"}"


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


class _Malformed(LoopdError, ValueError):
    """A streamed chunk that is not shaped like a Chat Completions chunk (becomes a `ModelPermanentError`)."""


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _object(value: object, what: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _Malformed(f"{what} is a {type(value).__name__}, not an object")
    return value


def plain_text(chunk: Mapping[str, Any]) -> str | None:
    """The text of a chunk that carries only text (most of a streamed reply): content in its first choice's delta,
    no refusal, tool calls or finish reason; None for any other chunk (`translate_chunk` reads those). Reads what
    `translate_chunk` would make a single `TextDelta` of, without making it."""
    choices = chunk.get("choices")
    if type(choices) is not list or not choices:
        return None
    choice = choices[0]
    if type(choice) is not dict or choice.get("finish_reason") is not None:
        return None
    delta = choice.get("delta")
    if type(delta) is not dict or delta.get("tool_calls") or delta.get("refusal"):
        return None
    content = delta.get("content")
    return content if type(content) is str and content else None


def translate_chunk(chunk: Mapping[str, Any]) -> tuple[tuple[ModelChunk, ...], str | None]:
    """The model chunks in one streamed Chat Completions chunk — the parsed JSON object, not the SDK's model: the
    adapter reads the few fields it needs instead of building ``ChatCompletionChunk`` objects — (first choice
    only), and its finish_reason. ``ValueError`` for a chunk not shaped like one."""
    choices = chunk.get("choices")
    if not choices:
        return (), None
    if not isinstance(choices, list):
        raise _Malformed(f"choices is a {type(choices).__name__}, not a list")
    choice = _object(choices[0], "a choice")
    delta = _object(choice.get("delta"), "a delta")
    out: list[ModelChunk] = []
    content = _text(delta.get("content"))
    if content:
        out.append(TextDelta(text=content))
    refusal = _text(delta.get("refusal"))
    if refusal:
        out.append(TextDelta(text=refusal))
    calls = delta.get("tool_calls") or ()
    if not isinstance(calls, list | tuple):
        raise _Malformed(f"tool_calls is a {type(calls).__name__}, not a list")
    for raw in calls:
        call = _object(raw, "a tool call")
        index = call.get("index")
        if not isinstance(index, int) or isinstance(index, bool):
            raise _Malformed("a tool call delta has no integer index")
        function = _object(call.get("function"), "a tool call's function")
        out.append(
            ToolCallDelta(
                index=index,
                id=_text(call.get("id")) or None,
                name=_text(function.get("name")) or None,
                arguments=_text(function.get("arguments")) or "",
            )
        )
    return tuple(out), _text(choice.get("finish_reason"))


def usage_from_openai(usage: Mapping[str, Any] | None) -> Usage:
    """One call's usage (the chunk's ``usage`` object); ``input_tokens`` includes the cached prompt tokens."""
    if usage is None:
        return Usage(calls=1)
    details = usage.get("prompt_tokens_details")
    cached = _count(details.get("cached_tokens")) if isinstance(details, dict) else 0
    return Usage(
        input_tokens=_count(usage.get("prompt_tokens")),
        output_tokens=_count(usage.get("completion_tokens")),
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
