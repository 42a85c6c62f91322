"""The OpenAI-compatible adapter's request body: built by loopd (not by ``chat.completions.create``'s transform),
byte for byte what the SDK sends for the same arguments, and each history message encoded only once per
conversation (issue 18: the transform re-walked the whole history on every step)."""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import AsyncIterator
from typing import Any

import anthropic
import httpx2
import openai
import pytest
from openai.resources.chat.completions import completions as sdk_completions

from loopd.harness._errors import ModelPermanentError
from loopd.harness.core import History
from loopd.harness.core._values import Message, ToolCall
from loopd.harness.models._anthropic import AnthropicModel, anthropic_messages
from loopd.harness.models._openai import (
    CLOSINGS_KEPT,
    MessageEncoder,
    OpenAICompatibleModel,
    openai_messages,
    request_body_with,
    request_closing,
)
from loopd.harness.models._protocol import Model, ModelRequest, ReplyInfo, TextDelta, ToolSpec, UsageReport
from tests.harness_models.helpers import LIST_DIR, READ_FILE

_REPLY = (
    b'data: {"id":"c","object":"chat.completion.chunk","created":0,"model":"m",'
    b'"choices":[{"index":0,"delta":{"content":"ok"},"finish_reason":"stop"}]}\n\n'
    b"data: [DONE]\n\n"
)

# A request recorded from ``chat.completions.create`` (openai SDK), kept literally: the adapter must send these bytes.
_RECORDED = (
    '{"model":"m","stream":true,"messages":[{"role":"system","content":"be brief"},'
    '{"role":"user","content":"héllo \\"x\\""},{"role":"assistant","content":null,"tool_calls":'
    '[{"id":"c1","type":"function","function":{"name":"list_dir","arguments":"{\\"path\\": \\".\\"}"}}]},'
    '{"role":"tool","tool_call_id":"c1","content":"a.txt"}],"max_completion_tokens":64,'
    '"stream_options":{"include_usage":true},"temperature":0.25,"tools":[{"type":"function","function":'
    '{"name":"list_dir","description":"List a directory.","parameters":{"type":"object","properties":'
    '{"path":{"type":"string"}},"required":["path"]}}}]}'
).encode()


class Endpoint:
    """An in-process OpenAI-compatible endpoint that keeps every request body."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.paths: list[str] = []
        self.auth: list[str | None] = []
        self.http = httpx2.AsyncClient(transport=httpx2.MockTransport(self._handle), timeout=10.0)

    def _handle(self, request: httpx2.Request) -> httpx2.Response:
        self.bodies.append(request.content)
        self.paths.append(request.url.path)
        self.auth.append(request.headers.get("authorization"))
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=_REPLY)

    def model(self, **settings: object) -> OpenAICompatibleModel:
        return OpenAICompatibleModel(
            "m",
            base_url="http://model.invalid/v1",
            api_key="sk-test",
            http_client=self.http,
            **settings,  # type: ignore[arg-type]
        )

    async def sdk_body(
        self, request: ModelRequest, *, include_usage: bool = True, field: str = "max_completion_tokens"
    ) -> bytes:
        """What ``chat.completions.create`` sends for ``request`` (the adapter's former path)."""
        client = openai.AsyncOpenAI(api_key="sk-test", base_url="http://model.invalid/v1", http_client=self.http)
        tools = [
            {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}
            for t in request.tools
        ]
        limit = request.max_output_tokens
        arguments: dict[str, Any] = {
            "model": request.model or "m",
            "messages": openai_messages(request),
            "stream": True,
            "stream_options": {"include_usage": True} if include_usage else openai.omit,
            "tools": tools or openai.omit,
            "temperature": openai.omit if request.temperature is None else request.temperature,
            "max_completion_tokens": limit if limit is not None and field == "max_completion_tokens" else openai.omit,
            "max_tokens": limit if limit is not None and field == "max_tokens" else openai.omit,
        }
        stream = await client.chat.completions.create(**arguments)
        assert isinstance(stream, openai.AsyncStream)
        async for _ in stream:
            pass
        return self.bodies.pop()


@pytest.fixture
async def endpoint() -> AsyncIterator[Endpoint]:
    found = Endpoint()
    yield found
    await found.http.aclose()


def _request(**fields: object) -> ModelRequest:
    return ModelRequest(**{"model": "", **fields})  # type: ignore[arg-type]


async def _send(model: Model, request: ModelRequest) -> None:
    async for _ in model.stream(request):
        pass


def _history(steps: int, *, start: int = 0) -> list[Message]:
    out: list[Message] = [Message(role="user", content="list the files — «tout»")]
    for i in range(start, start + steps):
        call = ToolCall(id=f"call_{i}", name="list_dir", arguments={"path": f"dir {i}", "deep": [1, 2.5, None]})
        out.append(Message(role="assistant", content="", tool_calls=(call,)))
        out.append(Message(role="tool", content=f"file_{i}.txt\n\u2028", tool_call_id=call.id, name="list_dir"))
    return out


async def test_the_body_is_the_recorded_sdk_body(endpoint: Endpoint) -> None:
    request = ModelRequest(
        model="",
        system="be brief",
        messages=(
            Message(role="user", content='héllo "x"'),
            Message(role="assistant", tool_calls=(ToolCall(id="c1", name="list_dir", arguments={"path": "."}),)),
            Message(role="tool", content="a.txt", tool_call_id="c1", name="list_dir"),
        ),
        tools=(LIST_DIR,),
        temperature=0.25,
        max_output_tokens=64,
    )
    model = endpoint.model()
    await _send(model, request)
    assert endpoint.bodies[-1] == _RECORDED
    assert await endpoint.sdk_body(request) == _RECORDED
    assert endpoint.paths == ["/v1/chat/completions", "/v1/chat/completions"]
    assert endpoint.auth == ["Bearer sk-test", "Bearer sk-test"]
    await model.aclose()


@pytest.mark.parametrize(
    ("settings", "extra"),
    [
        ({}, {}),
        ({"include_usage": False, "max_tokens_field": "max_tokens"}, {"max_output_tokens": 9}),
        ({}, {"tools": (LIST_DIR, READ_FILE), "system": "sys", "temperature": 0.0, "model": "other"}),
    ],
)
async def test_every_step_of_a_growing_history_matches_the_sdk(
    endpoint: Endpoint, settings: dict[str, object], extra: dict[str, object]
) -> None:
    model = endpoint.model(**settings)
    history = _history(6)
    for length in (1, 3, 5, 13):
        request = _request(messages=tuple(history[:length]), **extra)
        await _send(model, request)
        ours = endpoint.bodies.pop()
        theirs = await endpoint.sdk_body(
            request,
            include_usage=bool(settings.get("include_usage", True)),
            field=str(settings.get("max_tokens_field", "max_completion_tokens")),
        )
        assert ours == theirs
        assert len(json.loads(ours)["messages"]) == length + (1 if "system" in extra else 0)
    await model.aclose()


async def test_old_messages_are_not_encoded_again() -> None:
    encoder = MessageEncoder()
    history = _history(50)
    for length in range(1, len(history) + 1):
        encoder.encode(_request(messages=tuple(history[:length])))
    assert encoder.encoded == len(history)  # each message once, not 1 + 2 + … + n times
    again = encoder.encode(_request(messages=tuple(history)))
    assert encoder.encoded == len(history)
    assert [json.loads(p) for p in again.parts] == openai_messages(_request(messages=tuple(history)))


async def test_a_growing_history_is_recognised_without_reading_its_old_messages(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The harness hands the model its `History` itself (`decide`'s `CallModel`): one that extends the last one (the
    same buffer, grown) is known to at once, and only its new messages are read — no step copies or compares the
    O(n) messages before them. A history built apart with equal messages is still recognised (read and compared),
    and a replaced one is encoded afresh."""
    encoder = MessageEncoder()
    messages = _history(40)
    history = History(messages[:1])
    walked: list[int] = []
    original = History.__iter__

    def counting(self: History) -> Any:
        walked.append(len(self))
        return original(self)

    monkeypatch.setattr(History, "__iter__", counting)
    for message in messages[1:]:
        history = history.appended(message)
        request = ModelRequest.model_construct(model="", messages=history, tools=(), system=None)
        parts = encoder.encode(request).parts
        assert walked == []  # neither copied nor compared: not even iterated
        assert [json.loads(p) for p in parts] == openai_messages(request)
        walked.clear()  # (openai_messages, the expectation, iterates it)
    assert encoder.encoded == len(messages)
    apart = History([messages[0], *(m.model_copy() for m in messages[1:])])  # equal messages, another buffer
    request = ModelRequest.model_construct(model="", messages=apart.appended(messages[1]), tools=(), system=None)
    assert [json.loads(p) for p in encoder.encode(request).parts] == openai_messages(request)
    assert encoder.encoded == len(messages) + 1  # compared, then only the new message encoded
    replaced = History((messages[0], Message(role="assistant", content="summary")))
    request = ModelRequest.model_construct(model="", messages=replaced, tools=(), system=None)
    assert [json.loads(p) for p in encoder.encode(request).parts] == openai_messages(request)


async def test_a_replaced_history_is_encoded_afresh() -> None:
    encoder = MessageEncoder()
    history = _history(5)
    encoder.encode(_request(messages=tuple(history)))
    # a compaction keeps the first message but replaces the rest: nothing of the old tail may be reused
    compacted = (history[0], Message(role="assistant", content="summary"), Message(role="user", content="next"))
    parts = encoder.encode(_request(messages=compacted)).parts
    assert [json.loads(p) for p in parts] == openai_messages(_request(messages=compacted))
    # and a shorter history (an edit, a retry from an earlier point) is not padded with the kept tail
    short = encoder.encode(_request(messages=tuple(history[:2]))).parts
    assert [json.loads(p) for p in short] == openai_messages(_request(messages=tuple(history[:2])))


async def test_interleaved_conversations_do_not_mix_and_are_bounded() -> None:
    encoder = MessageEncoder(conversations=2)
    one, two, three = _history(3), _history(3, start=100), _history(3, start=200)
    for length in range(1, 8):
        for history in (one, two, three):
            request = _request(messages=tuple(history[:length]))
            assert [json.loads(p) for p in encoder.encode(request).parts] == openai_messages(request)
    with pytest.raises(ValueError, match="conversations"):
        MessageEncoder(conversations=0)


async def test_a_message_that_cannot_be_sent_leaves_the_kept_history_intact() -> None:
    encoder = MessageEncoder()
    history = _history(2)
    encoder.encode(_request(messages=tuple(history)))
    broken = (*history, Message(role="tool", content="orphan"))
    with pytest.raises(ModelPermanentError, match="tool_call_id"):
        encoder.encode(_request(messages=broken))
    fixed = (*history, Message(role="user", content="go on"))
    request = _request(messages=fixed)
    assert [json.loads(p) for p in encoder.encode(request).parts] == openai_messages(request)


async def test_the_sdk_request_transform_is_not_on_the_adapter_path(
    endpoint: Endpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def refuse(*_args: object, **_kwargs: object) -> object:
        raise AssertionError("the adapter must not run chat.completions.create's per-message transform")

    monkeypatch.setattr(sdk_completions, "async_maybe_transform", refuse)
    model = endpoint.model()
    await _send(model, _request(messages=tuple(_history(3)), tools=(LIST_DIR,)))
    assert len(endpoint.bodies) == 1
    await model.aclose()


@pytest.mark.parametrize(
    "chunk",
    [
        "[1, 2]",
        '{"id":"c","model":"m","choices":"no"}',
        '{"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"id":"x"}]}}]}',
        '{"id":"c","model":"m","choices":[{"index":0,"delta":"text"}]}',
    ],
)
async def test_a_malformed_chunk_is_a_permanent_error(chunk: str) -> None:
    """Chunks are read as parsed JSON (not the SDK's chunk model): a shape that is not a chunk is a typed error."""

    def handle(_request: httpx2.Request) -> httpx2.Response:
        body = f"data: {chunk}\n\ndata: [DONE]\n\n".encode()
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    async with httpx2.AsyncClient(transport=httpx2.MockTransport(handle), timeout=10.0) as http:
        model = OpenAICompatibleModel("m", base_url="http://model.invalid/v1", api_key="k", http_client=http)
        with pytest.raises(ModelPermanentError, match="unexpected response shape"):
            await _send(model, _request(messages=tuple(_history(1))))


async def test_usage_and_refusals_are_read_from_the_chunk_json() -> None:
    lines = [
        '{"id":"c","model":"served","choices":[{"index":0,"delta":{"refusal":"no."},"finish_reason":"stop"}]}',
        '{"id":"c","model":"served","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":3,'
        '"prompt_tokens_details":{"cached_tokens":5}}}',
    ]

    def handle(_request: httpx2.Request) -> httpx2.Response:
        body = "".join(f"data: {line}\n\n" for line in lines) + "data: [DONE]\n\n"
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=body.encode())

    async with httpx2.AsyncClient(transport=httpx2.MockTransport(handle), timeout=10.0) as http:
        model = OpenAICompatibleModel("m", base_url="http://model.invalid/v1", api_key="k", http_client=http)
        chunks = [c async for c in model.stream(_request(messages=tuple(_history(1))))]
    assert [c.text for c in chunks if isinstance(c, TextDelta)] == ["no."]
    info = next(c for c in chunks if isinstance(c, ReplyInfo))
    assert (info.model, info.finish_reason, info.request_id) == ("served", "stop", "c")
    usage = next(c for c in chunks if isinstance(c, UsageReport)).usage
    assert (usage.input_tokens, usage.output_tokens, usage.cached_tokens, usage.calls) == (12, 3, 5, 1)


_ANTHROPIC_REPLY = (
    b'event: message_start\ndata: {"type":"message_start","message":{"id":"m1","type":"message","role":"assistant",'
    b'"model":"c","content":[],"stop_reason":null,"usage":{"input_tokens":5,"output_tokens":1}}}\n\n'
    b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"},'
    b'"usage":{"output_tokens":2}}\n\n'
    b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
)


@pytest.mark.parametrize("cache", [True, False])
async def test_the_anthropic_body_is_the_sdk_body(cache: bool) -> None:
    """The Anthropic adapter encodes its body itself (the SDK deep-copies every message per request): same bytes."""
    bodies: list[bytes] = []

    def handle(request: httpx2.Request) -> httpx2.Response:
        bodies.append(request.content)
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=_ANTHROPIC_REPLY)

    async with httpx2.AsyncClient(transport=httpx2.MockTransport(handle), timeout=10.0) as http:
        model = AnthropicModel("c", api_key="k", base_url="http://model.invalid", http_client=http, prompt_cache=cache)
        for extra in ({}, {"system": "be brief", "tools": (LIST_DIR, READ_FILE), "temperature": 0.5}):
            request = _request(messages=tuple(_history(3)), **extra)
            await _send(model, request)
            system, messages = anthropic_messages(request, cache=cache)
            tools: list[dict[str, Any]] = [
                {"name": t.name, "description": t.description, "input_schema": t.parameters} for t in request.tools
            ]
            if tools and cache:
                tools[-1] = {**tools[-1], "cache_control": {"type": "ephemeral"}}
            client = anthropic.AsyncAnthropic(api_key="k", base_url="http://model.invalid", http_client=http)
            arguments: dict[str, Any] = {
                "model": "c",
                "max_tokens": 4096,
                "messages": messages,
                "stream": True,
                "system": system or anthropic.omit,
                "tools": tools or anthropic.omit,
                "extra_body": None if request.temperature is None else {"temperature": request.temperature},
            }
            stream = await client.messages.create(**arguments)
            async for _ in stream:
                pass
            assert bodies[-2] == bodies[-1]
            assert json.loads(bodies[-1])["messages"] == messages


async def test_a_growing_history_is_joined_into_one_buffer_once() -> None:
    encoder = MessageEncoder()
    history = _history(20)
    encoded = [encoder.encode(_request(messages=tuple(history[:n]), system="s")) for n in range(5, len(history) + 1)]
    # each request's array is its own messages, though the later requests appended to the same buffer
    for n, found in zip(range(5, len(history) + 1), encoded, strict=True):
        assert json.loads(found.array()) == openai_messages(_request(messages=tuple(history[:n]), system="s"))
    # one buffer, grown in place: no request joined the whole history again
    assert all(found._joined is encoded[0]._joined for found in encoded)
    # a replaced history starts a new buffer: the requests encoded before still read theirs
    compacted = (history[0], Message(role="assistant", content="summary"))
    fresh = encoder.encode(_request(messages=compacted))
    assert fresh._joined is not encoded[0]._joined
    assert json.loads(encoded[-1].array()) == openai_messages(_request(messages=tuple(history), system="s"))


def test_a_long_history_is_copied_once_into_the_body() -> None:
    """The history's bytes — nearly all of a long conversation's body — go straight into the body: building it
    allocates about one body, not the array first and then the body around it."""
    history = _history(3000)
    messages = MessageEncoder().encode(_request(messages=tuple(history), system="s"))
    closing = request_closing(
        tools=(LIST_DIR,), include_usage=True, temperature=None, max_tokens=None, max_tokens_field="max_tokens"
    )
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before, _ = tracemalloc.get_traced_memory()
        body = request_body_with("m", messages, closing)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(body) > 500_000
    assert peak - before < 1.2 * len(body)
    expected = openai_messages(_request(messages=tuple(history), system="s"))
    assert json.loads(body)["messages"] == expected and body.endswith(closing)


async def test_the_end_of_the_body_is_encoded_once_per_tool_set(endpoint: Endpoint) -> None:
    model = endpoint.model()
    tools = (LIST_DIR, READ_FILE)

    def asking(text: str, offered: tuple[ToolSpec, ...]) -> ModelRequest:
        # built like the harness builds its requests: the loop's own tuple of tool specs, not a validated copy
        return ModelRequest.model_construct(
            model="",
            messages=(Message(role="user", content=text),),
            tools=offered,
            system="",
            temperature=None,
            max_output_tokens=None,
        )

    await _send(model, asking("one", tools))
    assert len(model._closings) == 1
    (kept,) = model._closings.values()
    await _send(model, asking("two", tools))
    # another session's loop offers the same specs in a tuple of its own: the same entry answers
    again = (*tools,)
    assert again is not tools
    await _send(model, asking("again", again))
    (entry,) = model._closings.values()
    assert entry[1] is kept[1]  # the encoded end was reused, not encoded again
    await _send(model, asking("three", (LIST_DIR,)))
    assert len(model._closings) == 2
    for limit in range(CLOSINGS_KEPT):  # bounded: the least recently used end goes first
        model._closing(tools, None, limit)
    assert len(model._closings) == CLOSINGS_KEPT
    assert kept not in model._closings.values()
    assert [len(json.loads(b)["tools"]) for b in endpoint.bodies] == [2, 2, 2, 1]
    assert [json.loads(b)["messages"][-1]["content"] for b in endpoint.bodies] == ["one", "two", "again", "three"]
    await model.aclose()
