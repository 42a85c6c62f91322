"""The scripted server speaks OpenAI's wire format, plays scripts and rules, and records what happened."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loopd.harness.core._values import Usage
from loopd.harness.models._scripted_server import (
    DropAfter,
    IncomingRequest,
    ScriptedServer,
    ServerReply,
    ServerToolCall,
    encode_sse,
    open_scripted_server,
    stream_chunks,
    stream_frames,
)

CHAT = {"model": "demo", "messages": [{"role": "user", "content": "hi"}]}


async def test_models_are_listed() -> None:
    server = ScriptedServer([], models=("demo", "scripted"))
    async with (
        open_scripted_server(server) as base_url,
        openai.AsyncOpenAI(base_url=base_url, api_key="k", max_retries=0, timeout=5) as client,
    ):
        page = await client.models.list()
    assert [m.id for m in page.data] == ["demo", "scripted"]


async def test_base_url_is_loopback_with_a_real_port() -> None:
    async with open_scripted_server([]) as base_url:
        url = httpx.URL(base_url)
    assert url.host == "127.0.0.1"
    assert url.port is not None
    assert url.port > 0
    assert url.path == "/v1"


async def test_a_non_streamed_completion_carries_text_tool_calls_and_usage() -> None:
    reply = ServerReply(
        text="Reading.",
        tool_calls=(ServerToolCall(name="read_file", arguments={"path": "a.txt"}),),
        usage=Usage(input_tokens=10, output_tokens=4, cached_tokens=2),
    )
    async with (
        open_scripted_server([reply]) as base_url,
        openai.AsyncOpenAI(base_url=base_url, api_key="k", max_retries=0, timeout=5) as client,
    ):
        completion = await client.chat.completions.create(
            model="demo", messages=[{"role": "user", "content": "read a.txt"}]
        )
    choice = completion.choices[0]
    assert choice.message.content == "Reading."
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls is not None
    call = choice.message.tool_calls[0]
    assert call.type == "function"
    assert (call.function.name, json.loads(call.function.arguments)) == ("read_file", {"path": "a.txt"})
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (10, 4)


async def test_the_sse_stream_has_openais_exact_shape() -> None:
    reply = ServerReply(
        text="Hi!",
        tool_calls=(ServerToolCall(name="list_dir", arguments={"path": "."}, id="call_x"),),
        chunk_size=5,
        usage=Usage(input_tokens=3, output_tokens=2),
    )
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    async with open_scripted_server([reply]) as base_url, httpx.AsyncClient(timeout=5) as http:
        response = await http.post(f"{base_url}/chat/completions", json=body)
    assert response.headers["content-type"].startswith("text/event-stream")
    events = [line for line in response.text.split("\n\n") if line]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    chunks: list[dict[str, Any]] = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[1]["choices"][0]["delta"] == {"content": "Hi!"}
    head = chunks[2]["choices"][0]["delta"]["tool_calls"][0]
    assert head == {"index": 0, "id": "call_x", "type": "function", "function": {"name": "list_dir", "arguments": ""}}
    pieces = [c["choices"][0]["delta"]["tool_calls"][0] for c in chunks[3:-2]]
    assert all(set(p) == {"index", "function"} for p in pieces)
    assert "".join(p["function"]["arguments"] for p in pieces) == '{"path": "."}'
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["total_tokens"] == 5


async def test_without_include_usage_no_usage_chunk_is_sent() -> None:
    async with open_scripted_server([ServerReply(text="ok")]) as base_url, httpx.AsyncClient(timeout=5) as http:
        response = await http.post(f"{base_url}/chat/completions", json={**CHAT, "stream": True})
    chunks = [json.loads(e.removeprefix("data: ")) for e in response.text.split("\n\n") if e and "[DONE]" not in e]
    assert all("usage" not in c for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


async def test_a_rule_answers_from_the_last_user_message() -> None:
    def rule(request: IncomingRequest) -> ServerReply:
        return ServerReply(text=request.last_user_text.upper())

    server = ScriptedServer(rule)
    async with (
        open_scripted_server(server) as base_url,
        openai.AsyncOpenAI(base_url=base_url, api_key="k", max_retries=0, timeout=5) as client,
    ):
        first = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "one"}])
        second = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "two"}])
    assert [first.choices[0].message.content, second.choices[0].message.content] == ["ONE", "TWO"]
    assert [r.last_user_text for r in server.requests] == ["one", "two"]


async def test_an_invalid_request_is_rejected_with_an_openai_error_body() -> None:
    server = ScriptedServer([ServerReply(text="unused")])
    async with open_scripted_server(server) as base_url, httpx.AsyncClient(timeout=5) as http:
        response = await http.post(f"{base_url}/chat/completions", json={"model": "m"})
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert server.statistics().rejected == 1
    assert server.remaining == 1


async def test_a_dropped_non_streamed_reply_is_a_connection_error() -> None:
    server = ScriptedServer([ServerReply(text="x" * 100, fault=DropAfter())])
    async with (
        open_scripted_server(server) as base_url,
        openai.AsyncOpenAI(base_url=base_url, api_key="k", max_retries=0, timeout=5) as client,
    ):
        with pytest.raises(openai.APIConnectionError):
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        await server.wait_until(lambda s: s.dropped == 1)


async def test_the_history_is_bounded() -> None:
    server = ScriptedServer(lambda _: ServerReply(text="ok"), history=2)
    async with open_scripted_server(server) as base_url, httpx.AsyncClient(timeout=5) as http:
        for text in ("a", "b", "c"):
            await http.post(
                f"{base_url}/chat/completions", json={**CHAT, "messages": [{"role": "user", "content": text}]}
            )
    assert [r.last_user_text for r in server.requests] == ["b", "c"]
    assert server.statistics().requests == 3


@settings(max_examples=60, deadline=None)
@given(
    text=st.text(max_size=80),
    arguments=st.lists(st.text(max_size=30), max_size=2),
    chunk_size=st.integers(min_value=1, max_value=9),
    usage=st.booleans(),
)
def test_frames_are_the_encoded_chunks_byte_for_byte(
    text: str, arguments: list[str], chunk_size: int, usage: bool
) -> None:
    """`stream_frames` splices each piece into a template encoded once per reply: the same bytes as encoding every
    chunk whole (quotes, escapes, non-ASCII and control characters included)."""
    calls = tuple(ServerToolCall(name=f"tool{i}", arguments={"a": a}) for i, a in enumerate(arguments))
    reply = ServerReply(text=text, tool_calls=calls, chunk_size=chunk_size)
    spent = Usage(input_tokens=3, output_tokens=5) if usage else None
    shape = {"completion_id": "chatcmpl-1", "model": "demo", "created": 7, "usage": spent}
    expected = [encode_sse(chunk) for chunk in stream_chunks(reply, **shape)]  # type: ignore[arg-type]
    assert stream_frames(reply, **shape) == expected  # type: ignore[arg-type]


async def test_an_instant_reply_is_sent_without_watching_for_a_disconnect(monkeypatch: pytest.MonkeyPatch) -> None:
    """A zero-latency reply without a fault goes in one write with nothing to wait for: no watcher task races it
    (a delayed one still has one, so a client that leaves mid-reply is noticed)."""
    from loopd._infra.tasks import race as original
    from loopd.harness.models import _scripted_server

    raced: list[str] = []

    async def counting(*args: Any, **kwargs: Any) -> Any:
        raced.append("race")
        return await original(*args, **kwargs)

    monkeypatch.setattr(_scripted_server, "race", counting)
    server = ScriptedServer([ServerReply(text="now"), ServerReply(text="later", delay=0.01)])
    async with (
        open_scripted_server(server) as base_url,
        openai.AsyncOpenAI(base_url=base_url, api_key="k", max_retries=0, timeout=5) as client,
    ):
        for expected, races in (("now", 0), ("later", 1)):
            reply = await client.chat.completions.create(
                model="demo", messages=[{"role": "user", "content": "hi"}], stream=True
            )
            assert "".join([chunk.choices[0].delta.content or "" async for chunk in reply if chunk.choices]) == expected
            assert len(raced) == races
    assert server.statistics().completed == 2
