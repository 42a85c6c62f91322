"""The Anthropic adapter's direct sends (`_direct.DirectSender`, `_anthropic._DirectEvents`): after its first call
through the SDK's ``post``, a client the adapter built sends the same request with each new body straight through its
HTTP client and reads the events with a plain SSE parser. What the caller sees must be what the SDK path gives: the
same request on the wire, the same chunks, the same typed errors with the same messages."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from typing import Any

import anthropic
import httpx2
import pytest

from loopd.harness._errors import ModelRetryableError
from loopd.harness.models._anthropic import AnthropicModel
from loopd.harness.models._anthropic_server import AnthropicScriptedServer, open_anthropic_server
from loopd.harness.models._scripted_server import DropAfter, FailWithStatus, ServerReply, ServerToolCall

from .helpers import LIST_DIR, Recorder, ask, assert_sent_like_the_first, collect, ended_on_both_paths, outcome

KEY = "sk-ant-test"


def _sse(*events: tuple[str, dict[str, Any] | str]) -> bytes:
    return "".join(
        f"event: {name}\ndata: {data if isinstance(data, str) else json.dumps(data)}\n\n" for name, data in events
    ).encode()


_START = ("message_start", {"type": "message_start", "message": {"id": "msg_1", "model": "claude-x", "usage": {}}})
_STOP = ("message_stop", {"type": "message_stop"})


def _reply(text: str) -> bytes:
    delta = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}
    end = {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 1}}
    return _sse(_START, ("ping", {"type": "ping"}), ("content_block_delta", delta), ("message_delta", end), _STOP)


async def test_the_calls_after_the_first_are_sent_directly_with_the_sdks_request() -> None:
    endpoint = Recorder([_reply("one"), _reply("two"), _reply("three")])
    model = AnthropicModel("claude-x", api_key=KEY, base_url="http://model.invalid", http_client=endpoint.http)
    texts = [(await collect(model.stream(ask(f"q{i}")))).text for i in range(3)]
    assert texts == ["one", "two", "three"]
    assert model.direct_sends == 2  # the first call went through the SDK's post, the next two did not
    assert_sent_like_the_first(endpoint.requests)
    first, *rest = endpoint.requests
    auth = (first.headers.get("x-api-key"), first.headers.get("authorization"))
    assert auth in ((KEY, None), (None, f"Bearer {KEY}")) and "anthropic-version" in first.headers
    assert json.loads(rest[-1].content)["messages"][-1]["content"][-1]["text"] == "q2"
    await model.aclose()
    await endpoint.http.aclose()


async def test_a_given_client_always_goes_through_the_sdk() -> None:
    endpoint = Recorder([_reply("one"), _reply("two")])
    client = anthropic.AsyncAnthropic(
        api_key=KEY, base_url="http://model.invalid", max_retries=0, http_client=endpoint.http
    )
    model = AnthropicModel("claude-x", api_key=KEY, client=client)
    for i in range(2):
        await collect(model.stream(ask(f"q{i}")))
    assert model.direct_sends == 0, "a client given by the caller may change its auth per request"
    await client.close()


FAILURES = {
    "bad request": ServerReply(fault=FailWithStatus(status=400, message="bad tools")),
    "unauthorized": ServerReply(fault=FailWithStatus(status=401, message="wrong key")),
    "rate limited": ServerReply(fault=FailWithStatus(status=429, message="slow down", retry_after=2)),
    "overloaded": ServerReply(fault=FailWithStatus(status=529, message="Overloaded")),
    "drop before output": ServerReply(text="lost", fault=DropAfter(chunks=1)),
    "drop after output": ServerReply(text="partial answer", chunk_size=4, fault=DropAfter(chunks=4)),
    "stall": ServerReply(text="abcdef", chunk_size=2, chunk_delay=5.0),
    "tool call": ServerReply(tool_calls=(ServerToolCall(name="list_dir", arguments={"path": "."}),)),
}


@pytest.fixture
async def stack() -> AsyncIterator[AsyncExitStack]:
    async with AsyncExitStack() as stack:
        yield stack


async def _served(stack: AsyncExitStack, script: list[ServerReply]) -> AnthropicModel:
    url = await stack.enter_async_context(open_anthropic_server(AnthropicScriptedServer(script, api_key=KEY)))
    model = AnthropicModel("claude-x", api_key=KEY, base_url=url, timeout=0.5, max_retries=0)
    stack.push_async_callback(model.aclose)
    return model


@pytest.mark.parametrize("name", list(FAILURES))
async def test_a_direct_send_ends_like_the_sdks_post(stack: AsyncExitStack, name: str) -> None:
    reply = FAILURES[name]
    cold = await _served(stack, [reply])
    got = await collect(cold.stream(ask("hi", tools=(LIST_DIR,))))
    assert cold.direct_sends == 0
    warm = await _served(stack, [ServerReply(text="warm up"), reply])
    assert (await collect(warm.stream(ask("hi", tools=(LIST_DIR,))))).text == "warm up"
    direct = await collect(warm.stream(ask("hi", tools=(LIST_DIR,))))
    assert warm.direct_sends == 1
    assert outcome(direct.error, direct.text) == outcome(got.error, got.text)
    assert [(c.name, c.arguments) for c in direct.tool_calls] == [(c.name, c.arguments) for c in got.tool_calls]


_DELTA = (
    "content_block_delta",
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "x"}},
)


@pytest.mark.parametrize(
    "body",
    [
        _sse(_START, ("error", {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})),
        _sse(_START, ("error", {"type": "error", "error": {"type": "invalid_request_error", "message": "too long"}})),
        _sse(_START, _DELTA),
        _sse(
            _START, _DELTA, ("content_block_delta", {"type": "content_block_delta", "index": "0", "delta": {}}), _STOP
        ),
        b"data: {}\n\n" + _reply("unnamed events are skipped"),
    ],
    ids=["in-band overloaded", "in-band invalid request", "no stop", "bad index", "unnamed"],
)
async def test_in_band_endings_are_the_sdks(body: bytes) -> None:
    def adapter(http: httpx2.AsyncClient) -> AnthropicModel:
        return AnthropicModel("claude-x", api_key=KEY, base_url="http://model.invalid", http_client=http, max_retries=0)

    through_sdk, direct = await ended_on_both_paths(adapter, _reply("warm"), body)
    assert direct == through_sdk


async def test_an_in_band_error_that_is_not_json_is_shown_as_its_text() -> None:
    endpoint = Recorder([_reply("warm"), _sse(_START, _DELTA, ("error", "the upstream fell over"))])
    model = AnthropicModel(
        "claude-x", api_key=KEY, base_url="http://model.invalid", http_client=endpoint.http, max_retries=0
    )
    await collect(model.stream(ask("hi")))
    got = await collect(model.stream(ask("hi")))
    assert model.direct_sends == 1
    assert isinstance(got.error, ModelRetryableError) and got.text == "x"
    assert "the stream reported an error" in str(got.error) and "the upstream fell over" in str(got.error)
    await model.aclose()
    await endpoint.http.aclose()


def _text(piece: str) -> tuple[str, dict[str, Any]]:
    return (
        "content_block_delta",
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": piece}},
    )


async def test_the_text_of_the_events_one_read_brings_goes_on_as_one_delta() -> None:
    tool = {
        "type": "content_block_start",
        "index": 1,
        "content_block": {"type": "tool_use", "id": "t1", "name": "f", "input": {}},
    }
    end = ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {}})
    together = _sse(
        _START, _text("Hel"), _text("lo"), ("content_block_start", tool), _text(" wor"), _text("ld"), end, _STOP
    )
    endpoint = Recorder([_reply("warm"), together])
    model = AnthropicModel("claude-x", api_key=KEY, base_url="http://model.invalid", http_client=endpoint.http)
    await collect(model.stream(ask("warm")))
    got = await collect(model.stream(ask("hi")))  # a direct send: the mock transport's body is one read
    kinds = [type(chunk).__name__ for chunk in got.chunks]
    assert kinds[:3] == ["TextDelta", "ToolCallDelta", "TextDelta"] and kinds.count("TextDelta") == 2
    assert got.text == "Hello world" and [c.name for c in got.tool_calls] == ["f"]
    await model.aclose()
    await endpoint.http.aclose()
