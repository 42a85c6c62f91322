"""The OpenAI-compatible adapter's direct sends (`_direct.DirectSender`): after its first call through the SDK's
``post``, a client the adapter built sends the same request (URL, headers, timeouts) with each new body straight through
its HTTP client, and reads the reply with a plain SSE parser. Everything the caller sees must be what the SDK path
gives: the same request on the wire, the same chunks, the same typed errors with the same messages."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import pytest
from openai._streaming import SSEDecoder

from loopd.harness.models._direct import server_sent_events
from loopd.harness.models._openai import OpenAICompatibleModel
from loopd.harness.models._scripted_server import DropAfter, FailWithStatus, ServerReply, ServerToolCall

from .conftest import Serve
from .helpers import Recorder, ask, assert_sent_like_the_first, collect, ended_on_both_paths, outcome


def _sse(*events: dict[str, Any] | str) -> bytes:
    return "".join(f"data: {e if isinstance(e, str) else json.dumps(e)}\n\n" for e in events).encode()


def _reply(text: str) -> bytes:
    delta = {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": "stop"}], "model": "m", "id": "c"}
    return _sse(delta, "[DONE]")


async def test_the_calls_after_the_first_are_sent_directly_with_the_sdks_request() -> None:
    endpoint = Recorder([_reply("one"), _reply("two"), _reply("three")])
    model = OpenAICompatibleModel("m", base_url="http://model.invalid/v1", api_key="sk-test", http_client=endpoint.http)
    texts = [(await collect(model.stream(ask(f"q{i}")))).text for i in range(3)]
    assert texts == ["one", "two", "three"]
    assert model.direct_sends == 2  # the first call went through the SDK's post, the next two did not
    assert_sent_like_the_first(endpoint.requests)
    first, *rest = endpoint.requests
    assert first.headers["authorization"] == "Bearer sk-test"
    assert json.loads(rest[-1].content)["messages"][-1]["content"] == "q2"
    await model.aclose()
    await endpoint.http.aclose()


async def test_a_given_client_always_goes_through_the_sdk() -> None:
    import openai

    endpoint = Recorder([_reply("one"), _reply("two")])
    client = openai.AsyncOpenAI(
        api_key="k", base_url="http://model.invalid/v1", max_retries=0, http_client=endpoint.http
    )
    model = OpenAICompatibleModel("m", api_key="k", client=client)
    for i in range(2):
        await collect(model.stream(ask(f"q{i}")))
    assert model.direct_sends == 0, "a client given by the caller may change its auth per request"
    await client.close()


async def test_a_redirected_first_call_keeps_every_call_on_the_sdks_path() -> None:
    seen: list[str] = []

    def handle(request: httpx2.Request) -> httpx2.Response:
        seen.append(request.url.host)
        if request.url.host == "model.invalid":  # the configured host sends the call elsewhere
            return httpx2.Response(307, headers={"location": "http://elsewhere.invalid/v1/chat/completions"})
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=_reply("moved"))

    http = httpx2.AsyncClient(transport=httpx2.MockTransport(handle), follow_redirects=True, timeout=10.0)
    model = OpenAICompatibleModel("m", base_url="http://model.invalid/v1", api_key="k", http_client=http)
    for _ in range(2):
        assert (await collect(model.stream(ask("hi")))).text == "moved"
    assert model.direct_sends == 0  # the redirect target is never pinned: each call asks the configured host first
    assert seen == ["model.invalid", "elsewhere.invalid"] * 2
    await http.aclose()


FAILURES = {
    "bad request": ServerReply(fault=FailWithStatus(status=400, message="bad tools")),
    "unauthorized": ServerReply(fault=FailWithStatus(status=401, message="wrong key")),
    "rate limited": ServerReply(fault=FailWithStatus(status=429, message="slow down", retry_after=2)),
    "overloaded": ServerReply(fault=FailWithStatus(status=503)),
    "drop before output": ServerReply(text="lost", fault=DropAfter(chunks=1)),
    "drop after output": ServerReply(text="partial answer", chunk_size=4, fault=DropAfter(chunks=3)),
    "stall": ServerReply(text="abcdef", chunk_size=2, chunk_delay=5.0),
    "tool call": ServerReply(tool_calls=(ServerToolCall(name="list_dir", arguments={"path": "."}),)),
}


@pytest.mark.parametrize("name", list(FAILURES))
async def test_a_direct_send_ends_like_the_sdks_post(serve: Serve, name: str) -> None:
    reply = FAILURES[name]
    cold = await serve([reply], timeout=0.5, max_retries=0)
    got = await collect(cold.model.stream(ask("hi")))
    assert cold.model.direct_sends == 0
    warm = await serve([ServerReply(text="warm up"), reply], timeout=0.5, max_retries=0)
    assert (await collect(warm.model.stream(ask("hi")))).text == "warm up"
    direct = await collect(warm.model.stream(ask("hi")))
    assert warm.model.direct_sends == 1
    assert outcome(direct.error, direct.text) == outcome(got.error, got.text)
    assert [(c.name, c.arguments) for c in direct.tool_calls] == [(c.name, c.arguments) for c in got.tool_calls]


@pytest.mark.parametrize(
    "body",
    [
        _sse({"error": {"message": "overloaded"}}),
        _sse({"error": "plain"}),
        _sse({"choices": [{"index": 0, "delta": {"content": "half"}, "finish_reason": None}]}, "[DONE]"),
    ],
    ids=["in-band error", "in-band error without a message", "no finish reason"],
)
async def test_in_band_failures_end_like_the_sdks_stream(body: bytes) -> None:
    def adapter(http: httpx2.AsyncClient) -> OpenAICompatibleModel:
        return OpenAICompatibleModel(
            "m", base_url="http://model.invalid/v1", api_key="k", http_client=http, max_retries=0
        )

    through_sdk, direct = await ended_on_both_paths(adapter, _reply("warm"), body)
    assert direct == through_sdk


STREAMS = [
    b"data: one\n\ndata: two\n\n",
    b"data: a\r\ndata: b\r\n\r\nevent: x\r\ndata: c\r\n\r\n",
    b"data: cr\r\rdata:nospace\r\r",
    b': comment\nid: 7\nretry: 10\ndata: {"k": 1}\n\ndata: tail-without-blank-line',
    b"data: \xc3\xa9t\xc3\xa9\n\n\n\ndata: [DONE]\n\n",
]


async def _chunks(data: bytes, size: int) -> AsyncIterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


@pytest.mark.parametrize("stream", STREAMS)
async def test_the_sse_parser_reads_what_the_sdks_decoder_reads(stream: bytes) -> None:
    expected = [
        (event.event, event.data.encode()) async for event in SSEDecoder().aiter_bytes(_chunks(stream, len(stream)))
    ]
    for size in range(1, len(stream) + 1):  # every split of the stream into chunks, CRLF halves included
        got = [pair async for pair in server_sent_events(_chunks(stream, size))]
        assert got == expected, size


async def test_direct_sends_decode_their_chunks_with_the_shared_fast_decoder(monkeypatch: pytest.MonkeyPatch) -> None:
    # The streamed chunks of every direct send are decoded by `jsontext.loads` (msgspec; the standard library for
    # what only it reads), not by `json.loads` per chunk.
    from loopd._infra import jsontext
    from loopd.harness.models import _openai

    decoded: list[bytes] = []

    def counted(text: str | bytes | bytearray) -> Any:
        decoded.append(bytes(text) if not isinstance(text, str) else text.encode())
        return jsontext.loads(text)

    monkeypatch.setattr(_openai, "loads", counted)
    endpoint = Recorder([_reply("one"), _reply("two")])
    model = OpenAICompatibleModel("m", base_url="http://model.invalid/v1", api_key="sk-test", http_client=endpoint.http)
    texts = [(await collect(model.stream(ask(f"q{i}")))).text for i in range(2)]
    assert texts == ["one", "two"] and model.direct_sends == 1
    assert len(decoded) == 1 and json.loads(decoded[0])["choices"][0]["delta"]["content"] == "two"
    await model.aclose()
    await endpoint.http.aclose()


def _pieces(*texts: str) -> list[dict[str, Any]]:
    last = len(texts) - 1
    return [
        {"choices": [{"index": 0, "delta": {"content": t}, "finish_reason": "stop" if i == last else None}]}
        for i, t in enumerate(texts)
    ]


async def test_the_text_of_the_chunks_one_read_brings_goes_on_as_one_delta() -> None:
    """Pieces that arrived together (one read of the reply) reach the caller as one text delta, a tool call delta
    between them keeps its place; pieces of separate reads stay separate. The text is the same either way."""
    call = {"index": 0, "id": "t1", "function": {"name": "f", "arguments": "{}"}}
    together = _sse(
        *_pieces("Hel", "lo"),
        {"choices": [{"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": None}]},
        *_pieces(" wor", "ld"),
        "[DONE]",
    )
    endpoint = Recorder([_reply("warm"), together])
    model = OpenAICompatibleModel("m", base_url="http://model.invalid/v1", api_key="k", http_client=endpoint.http)
    await collect(model.stream(ask("warm")))
    got = await collect(model.stream(ask("hi")))  # a direct send: the mock transport's body is one read
    kinds = [type(chunk).__name__ for chunk in got.chunks]
    assert kinds[:3] == ["TextDelta", "ToolCallDelta", "TextDelta"] and kinds.count("TextDelta") == 2
    assert got.text == "Hello world" and [c.name for c in got.tool_calls] == ["f"]
    await endpoint.http.aclose()

    async def apart(request: httpx2.Request) -> httpx2.Response:
        async def reads() -> AsyncIterator[bytes]:
            for piece in [*_pieces("a", "b", "c"), "[DONE]"]:
                yield _sse(piece)

        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=reads())

    http = httpx2.AsyncClient(transport=httpx2.MockTransport(apart), timeout=10.0)
    model = OpenAICompatibleModel("m", base_url="http://model.invalid/v1", api_key="k", http_client=http)
    await collect(model.stream(ask("warm")))
    got = await collect(model.stream(ask("hi")))
    assert [c.text for c in got.chunks if type(c).__name__ == "TextDelta"] == ["a", "b", "c"]
    await http.aclose()
