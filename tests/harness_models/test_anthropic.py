"""The Anthropic adapter on the real `anthropic` SDK against the scripted Messages API server on loopback."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from typing import Any

import httpx2
import pytest

from loopd.harness._errors import ModelPermanentError, ModelRetryableError
from loopd.harness.core import Message, ToolCall, Usage
from loopd.harness.models import AttemptFailed, ModelRequest, PriceTable, ReplyInfo
from loopd.harness.models._anthropic import AnthropicModel, anthropic_messages
from loopd.harness.models._anthropic_server import AnthropicReply, AnthropicScriptedServer, open_anthropic_server
from loopd.harness.models._scripted_server import DropAfter, FailWithStatus, ServerReply, ServerToolCall

from .helpers import LIST_DIR, RecordedSleep, ask, collect

KEY = "sk-ant-test"


@pytest.fixture
async def stack() -> AsyncIterator[AsyncExitStack]:
    async with AsyncExitStack() as stack:
        yield stack


async def serve(
    stack: AsyncExitStack, script: Any, *, max_retries: int = 2, prices: PriceTable | None = None
) -> tuple[AnthropicScriptedServer, AnthropicModel, RecordedSleep]:
    server = AnthropicScriptedServer(script, api_key=KEY)
    url = await stack.enter_async_context(open_anthropic_server(server))
    sleep = RecordedSleep()
    model = AnthropicModel(
        "claude-haiku-4-5",
        api_key=KEY,
        base_url=url,
        timeout=5.0,
        max_retries=max_retries,
        prices=prices,
        sleep=sleep,
        random=lambda: 0.5,
    )
    stack.push_async_callback(model.aclose)
    return server, model, sleep


async def test_text_streams_in_pieces_with_usage(stack: AsyncExitStack) -> None:
    reply = ServerReply(text="Hello from the Messages API", chunk_size=5, usage=Usage(input_tokens=12, output_tokens=6))
    server, model, _ = await serve(stack, [reply])
    got = await collect(model.stream(ask("hi")))
    assert got.error is None
    assert got.text == "Hello from the Messages API"
    assert sum(1 for c in got.chunks if c.kind == "text") == 6  # really streamed, not one block
    assert got.usage == Usage(input_tokens=12, output_tokens=6, calls=1)
    info = [c for c in got.chunks if isinstance(c, ReplyInfo)]
    assert [(i.provider, i.finish_reason) for i in info] == [("anthropic", "end_turn")]
    assert info[0].request_id and info[0].request_id.startswith("req_msg_scripted_")
    sent = server.requests[0]
    assert sent.model == "claude-haiku-4-5" and sent.stream and sent.max_tokens == 4096
    headers = server.request_headers[0]
    assert KEY in (headers.get("x-api-key"), headers.get("authorization", "").removeprefix("Bearer "))


async def test_tool_use_streams_and_the_result_goes_back_as_a_tool_result_block(stack: AsyncExitStack) -> None:
    call = ServerToolCall(name="list_dir", arguments={"path": "src"}, id="toolu_1")
    server, model, _ = await serve(
        stack, [ServerReply(text="Let me look.", tool_calls=(call,), chunk_size=4), ServerReply(text="Two files.")]
    )
    first = await collect(model.stream(ask("list src", tools=(LIST_DIR,))))
    assert first.text == "Let me look."
    assert first.tool_calls == (ToolCall(id="toolu_1", name="list_dir", arguments={"path": "src"}),)
    assert server.requests[0].tools[0]["name"] == "list_dir"
    assert server.requests[0].tools[0]["input_schema"] == LIST_DIR.parameters

    history = (
        Message(role="user", content="list src"),
        Message(role="assistant", content="Let me look.", tool_calls=first.tool_calls),
        Message(role="tool", content="a.py\nb.py", tool_call_id="toolu_1"),
    )
    second = await collect(
        model.stream(ModelRequest(model="", messages=history, tools=(LIST_DIR,), system="Be brief."))
    )
    assert second.text == "Two files."
    sent = server.requests[1]
    assert [m["role"] for m in sent.messages] == ["user", "assistant", "user"]
    assert sent.messages[1]["content"][1] == {
        "type": "tool_use",
        "id": "toolu_1",
        "name": "list_dir",
        "input": {"path": "src"},
    }
    result = sent.tool_results[0]
    assert result["tool_use_id"] == "toolu_1" and result["content"] == "a.py\nb.py"
    # prompt caching: the system prompt and the newest block are cache breakpoints
    assert isinstance(sent.system, list) and sent.system[0]["cache_control"] == {"type": "ephemeral"}
    assert sent.messages[-1]["content"][-1]["cache_control"] == {"type": "ephemeral"}


def test_consecutive_tool_results_become_one_user_message_and_system_messages_move_to_system() -> None:
    calls = (ToolCall(id="a", name="t", arguments={}), ToolCall(id="b", name="t", arguments={}))
    request = ModelRequest(
        model="m",
        system="S",
        messages=(
            Message(role="system", content="extra rule"),
            Message(role="user", content="go"),
            Message(role="assistant", content="", tool_calls=calls),
            Message(role="tool", content="1", tool_call_id="a"),
            Message(role="tool", content="2", tool_call_id="b"),
        ),
    )
    system, messages = anthropic_messages(request, cache=False)
    assert [b["text"] for b in system] == ["S", "extra rule"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert [b["tool_use_id"] for b in messages[2]["content"]] == ["a", "b"]
    with pytest.raises(ModelPermanentError):
        anthropic_messages(ModelRequest(model="m", messages=(Message(role="tool", content="x"),)))


async def test_prompt_cache_reads_and_writes_are_in_usage_and_priced(stack: AsyncExitStack) -> None:
    prices = PriceTable.from_mapping(
        {"models": {"claude-haiku-4-5": {"input": 1.0, "cached_input": 0.1, "cache_write_input": 1.25, "output": 5.0}}}
    )
    usage = Usage(input_tokens=10_000, cached_tokens=6_000, output_tokens=1_000)
    _, model, _ = await serve(stack, [AnthropicReply(text="ok", usage=usage, cache_write_tokens=3_000)], prices=prices)
    got = await collect(model.stream(ask("hi")))
    # 1,000 uncached + 3,000 written + 6,000 read = every prompt token; reads are the cached ones
    assert (got.usage.input_tokens, got.usage.cached_tokens, got.usage.output_tokens) == (10_000, 6_000, 1_000)
    expected = (1_000 * 1.0 + 3_000 * 1.25 + 6_000 * 0.1 + 1_000 * 5.0) / 1_000_000
    assert got.usage.cost_usd == pytest.approx(expected)


async def test_a_rate_limit_is_retried_after_its_retry_after_and_reported_as_an_attempt(stack: AsyncExitStack) -> None:
    script = [ServerReply(fault=FailWithStatus(status=429, retry_after=3)), ServerReply(text="after the wait")]
    _, model, sleep = await serve(stack, script)
    got = await collect(model.stream(ask("hi")))
    assert got.text == "after the wait"
    assert sleep.delays and sleep.delays[0] >= 3
    failed = [c for c in got.chunks if isinstance(c, AttemptFailed)]
    assert len(failed) == 1
    assert (failed[0].provider, failed[0].status_code, failed[0].retry_after, failed[0].next) == (
        "anthropic",
        429,
        3,
        "retry",
    )
    assert got.chunks.index(failed[0]) == 0  # before any output


@pytest.mark.parametrize(
    ("status", "retryable"), [(400, False), (401, False), (404, False), (429, True), (500, True), (529, True)]
)
async def test_status_codes_map_to_typed_errors(stack: AsyncExitStack, status: int, retryable: bool) -> None:
    _, model, _ = await serve(
        stack, [ServerReply(fault=FailWithStatus(status=status, message="scripted"))], max_retries=0
    )
    got = await collect(model.stream(ask("hi")))
    assert isinstance(got.error, ModelRetryableError if retryable else ModelPermanentError)
    assert got.error.status_code == status and "scripted" in str(got.error)


async def test_a_wrong_key_is_permanent(stack: AsyncExitStack) -> None:
    server = AnthropicScriptedServer([ServerReply(text="never")], api_key="the-right-one")
    url = await stack.enter_async_context(open_anthropic_server(server))
    model = AnthropicModel("claude-haiku-4-5", api_key="a-wrong-one", base_url=url, timeout=5.0)
    stack.push_async_callback(model.aclose)
    got = await collect(model.stream(ask("hi")))
    assert isinstance(got.error, ModelPermanentError) and got.error.status_code == 401


async def test_a_drop_after_output_is_raised_not_retried(stack: AsyncExitStack) -> None:
    script = [ServerReply(text="partial answer here", chunk_size=4, fault=DropAfter(chunks=5)), ServerReply(text="x")]
    server, model, _ = await serve(stack, script)
    got = await collect(model.stream(ask("hi")))
    assert got.text and isinstance(got.error, ModelRetryableError)
    assert server.statistics().requests == 1  # no silent restart after output


async def test_a_drop_before_output_is_retried(stack: AsyncExitStack) -> None:
    script = [ServerReply(text="lost", fault=DropAfter(chunks=1)), ServerReply(text="second try")]
    server, model, _ = await serve(stack, script)
    got = await collect(model.stream(ask("hi")))
    assert got.text == "second try" and got.error is None
    assert server.statistics().requests == 2


def _sse_reply(*events: Any) -> httpx2.MockTransport:
    """A transport answering every request with ``events`` as the Messages API streams them."""
    names = [event["type"] if isinstance(event, dict) else "content_block_delta" for event in events]
    body = b"".join(
        f"event: {name}\ndata: {json.dumps(event)}\n\n".encode() for name, event in zip(names, events, strict=True)
    )

    def handle(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    return httpx2.MockTransport(handle)


_START = {"type": "message_start", "message": {"id": "msg_1", "model": "claude-x", "usage": {"input_tokens": 3}}}
_STOP = {"type": "message_stop"}


@pytest.mark.parametrize(
    "event",
    [
        {"type": "content_block_delta", "index": 0, "delta": "not an object"},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": 7}},
        {"type": "content_block_delta", "index": "0", "delta": {"type": "input_json_delta", "partial_json": "{"}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use", "id": 1, "name": "x"}},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": "many"}},
        ["an event that is a list"],
    ],
    ids=["delta-not-object", "text-not-string", "index-not-int", "tool-id-not-string", "usage-not-int", "not-object"],
)
async def test_a_stream_event_of_another_shape_is_a_permanent_error(event: Any) -> None:
    model = AnthropicModel(
        "claude-x",
        api_key=KEY,
        max_retries=0,
        http_client=httpx2.AsyncClient(transport=_sse_reply(_START, event, _STOP)),
    )
    try:
        got = await collect(model.stream(ask("hi")))
    finally:
        await model.aclose()

    assert isinstance(got.error, ModelPermanentError)
    assert "unexpected response shape" in str(got.error)


async def test_events_read_as_json_give_text_tool_calls_and_usage() -> None:
    events = (
        _START
        | {"message": {"id": "msg_1", "model": "claude-x", "usage": {"input_tokens": 3, "cache_read_input_tokens": 2}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "ping"},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hel"}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "lo"}},
        {
            "type": "content_block_start",
            "index": 1,
            "content_block": {"type": "tool_use", "id": "tu_1", "name": "list_dir", "input": {}},
        },
        {
            "type": "content_block_delta",
            "index": 1,
            "delta": {"type": "input_json_delta", "partial_json": '{"path": "."}'},
        },
        {"type": "a_future_event", "whatever": True},
        {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 9}},
        _STOP,
    )
    model = AnthropicModel(
        "claude-x", api_key=KEY, max_retries=0, http_client=httpx2.AsyncClient(transport=_sse_reply(*events))
    )
    try:
        got = await collect(model.stream(ask("hi")))
    finally:
        await model.aclose()

    assert got.error is None
    assert got.text == "Hello"
    assert [(c.id, c.name, c.arguments) for c in got.tool_calls] == [("tu_1", "list_dir", {"path": "."})]
    assert got.usage == Usage(input_tokens=5, output_tokens=9, cached_tokens=2, calls=1)
    info = next(chunk for chunk in got.chunks if isinstance(chunk, ReplyInfo))
    assert (info.model, info.finish_reason, info.request_id) == ("claude-x", "tool_use", "msg_1")
