"""The real `openai` client, through the adapter, against the scripted server: text, tool calls, usage."""

from __future__ import annotations

import pytest

from loopd.harness.core._values import Message, ToolCall, Usage
from loopd.harness.models._openai import OpenAICompatibleModel
from loopd.harness.models._pricing import PriceTable
from loopd.harness.models._protocol import Model, ModelRequest, TextDelta, ToolCallDelta
from loopd.harness.models._scripted_server import ServerReply, ServerToolCall

from .conftest import Serve
from .helpers import LIST_DIR, READ_FILE, ask, collect


def test_adapter_is_a_model() -> None:
    model = OpenAICompatibleModel("gpt-4o-mini", base_url="http://127.0.0.1:9/v1", api_key="k")
    assert isinstance(model, Model)
    assert model.name == "gpt-4o-mini"


async def test_text_streams_in_several_chunks(serve: Serve) -> None:
    served = await serve([ServerReply(text="Hello from the scripted server!", chunk_size=4)])

    got = await collect(served.model.stream(ask("hi")))

    assert got.error is None
    assert got.text == "Hello from the scripted server!"
    assert len([c for c in got.chunks if isinstance(c, TextDelta)]) == 8
    await served.server.wait_until(lambda s: s.completed == 1)


async def test_tool_calls_stream_as_fragments_and_reassemble(serve: Serve) -> None:
    calls = (
        ServerToolCall(name="read_file", arguments={"path": "docs/ARCHITECTURE.md"}, id="call_a"),
        ServerToolCall(name="list_dir", arguments={"path": ".", "depth": 2, "hidden": False}, id="call_b"),
    )
    served = await serve([ServerReply(text="Looking.", tool_calls=calls, chunk_size=3)])

    got = await collect(served.model.stream(ask("read it", tools=(READ_FILE, LIST_DIR))))

    fragments = [c for c in got.chunks if isinstance(c, ToolCallDelta)]
    assert len(fragments) > 10, "arguments must arrive split across chunks"
    assert {f.index for f in fragments} == {0, 1}
    assert [f.name for f in fragments if f.name] == ["read_file", "list_dir"]
    assert got.text == "Looking."
    assert got.tool_calls == (
        ToolCall(id="call_a", name="read_file", arguments={"path": "docs/ARCHITECTURE.md"}),
        ToolCall(id="call_b", name="list_dir", arguments={"path": ".", "depth": 2, "hidden": False}),
    )


async def test_usage_is_reported_once_at_the_end_of_a_stream(serve: Serve) -> None:
    usage = Usage(input_tokens=120, output_tokens=30, cached_tokens=100)
    served = await serve([ServerReply(text="ok", usage=usage)])

    got = await collect(served.model.stream(ask("hi")))

    assert got.usage == Usage(input_tokens=120, output_tokens=30, cached_tokens=100, calls=1)
    assert served.server.requests[0].include_usage


async def test_usage_is_priced_from_the_price_table(serve: Serve) -> None:
    usage = Usage(input_tokens=120, output_tokens=30, cached_tokens=100)
    served = await serve([ServerReply(text="ok", usage=usage)], prices=PriceTable.default())

    got = await collect(served.model.stream(ask("hi")))

    # gpt-4o-mini: 20 uncached × 0.15 + 100 cached × 0.075 + 30 out × 0.60, per million
    assert got.usage.cost_usd == pytest.approx(28.5e-6)


async def test_a_provider_without_usage_still_counts_the_call(serve: Serve) -> None:
    served = await serve([ServerReply(text="ok")], include_usage=False)

    got = await collect(served.model.stream(ask("hi")))

    assert got.usage == Usage(calls=1)
    assert not served.server.requests[0].include_usage


async def test_history_and_tools_are_sent_in_openai_shape(serve: Serve) -> None:
    served = await serve([ServerReply(text="done")])
    call = ToolCall(id="call_1", name="read_file", arguments={"path": "a.txt"})
    request = ModelRequest(
        model="gpt-4.1-mini",
        system="Be brief.",
        messages=(
            Message(role="user", content="read a.txt"),
            Message(role="assistant", tool_calls=(call,)),
            Message(role="tool", content="hello", tool_call_id="call_1", name="read_file"),
        ),
        tools=(READ_FILE,),
        max_output_tokens=50,
        temperature=0.2,
    )

    got = await collect(served.model.stream(request))

    assert got.text == "done"
    sent = served.server.requests[0]
    assert sent.model == "gpt-4.1-mini", "a request's model overrides the adapter default"
    assert list(sent.messages) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "read a.txt"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": '{"path": "a.txt"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "hello"},
    ]
    assert sent.tool_names == ("read_file",)
    extra = sent.model_extra or {}
    assert extra["max_completion_tokens"] == 50
    assert extra["temperature"] == 0.2
    assert sent.stream


async def test_the_adapter_default_model_is_used_when_the_request_names_none(serve: Serve) -> None:
    served = await serve([ServerReply(text="ok")])

    await collect(served.model.stream(ask("hi")))

    assert served.server.requests[0].model == "gpt-4o-mini"
