"""Property tests for the pure codecs: server chunk encoder → openai chunk model → adapter translation."""

from __future__ import annotations

import json
import string
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types.chat import ChatCompletionChunk

from loopd._infra.backoff import Backoff
from loopd.harness.core._values import ToolCall, Usage
from loopd.harness.models._openai import _Malformed, plain_text, retry_delay, translate_chunk, usage_from_openai
from loopd.harness.models._protocol import TextDelta, ToolCallDelta, tool_calls_from_deltas
from loopd.harness.models._scripted_server import ServerReply, ServerToolCall, encode_sse, stream_chunks

json_scalars = st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.text(max_size=20)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
tool_names = st.text(string.ascii_letters + "_", min_size=1, max_size=16)
tool_calls = st.builds(
    ServerToolCall,
    name=tool_names,
    arguments=st.dictionaries(st.text(max_size=8), json_values, max_size=4),
)
replies = st.builds(
    ServerReply,
    text=st.text(max_size=200),
    tool_calls=st.lists(tool_calls, max_size=3).map(tuple),
    chunk_size=st.integers(1, 20),
    usage=st.builds(Usage, input_tokens=st.integers(0, 10**6), output_tokens=st.integers(0, 10**6)),
)


@settings(max_examples=150, deadline=None)
@given(reply=replies)
def test_a_streamed_reply_round_trips_through_the_openai_chunk_model(reply: ServerReply) -> None:
    assert reply.usage is not None
    wire = stream_chunks(reply, completion_id="chatcmpl-scripted-7", model="m", created=0, usage=reply.usage)

    text: list[str] = []
    deltas: list[ToolCallDelta] = []
    finishes: list[str] = []
    usage = None
    for raw in wire:
        ChatCompletionChunk.model_validate(raw)  # the wire is a valid chunk for the SDK's model …
        usage = raw.get("usage") or usage
        translated, finish = translate_chunk(raw)  # … and the adapter reads the parsed JSON itself
        finishes.extend([finish] if finish else [])
        for item in translated:
            if isinstance(item, TextDelta):
                text.append(item.text)
            else:
                assert isinstance(item, ToolCallDelta)
                deltas.append(item)

    assert "".join(text) == reply.text
    expected = tuple(
        ToolCall(id=f"call_7_{i}", name=c.name, arguments=json.loads(c.arguments_json()))
        for i, c in enumerate(reply.tool_calls)
    )
    assert tool_calls_from_deltas(deltas) == expected
    assert finishes == ["tool_calls" if reply.tool_calls else "stop"]
    assert usage_from_openai(usage) == reply.usage.model_copy(update={"calls": 1})


chunk_fields = st.none() | st.text(max_size=6) | st.integers(0, 3) | st.lists(st.none(), max_size=1) | json_values
deltas_of_chunks = st.dictionaries(st.sampled_from(["content", "refusal", "tool_calls", "role"]), chunk_fields)
choices_of_chunks = st.dictionaries(
    st.sampled_from(["delta", "finish_reason", "index"]), deltas_of_chunks | chunk_fields | st.sampled_from(["stop"])
)
chunks_of_any_shape = st.dictionaries(
    st.sampled_from(["choices", "model", "id"]), st.lists(choices_of_chunks, max_size=2) | chunk_fields
)


@settings(max_examples=300, deadline=None)
@given(chunk=chunks_of_any_shape | replies.map(lambda r: stream_chunks(r, completion_id="c", model="m", created=0)[1]))
def test_the_plain_text_shortcut_reads_what_translate_chunk_reads(chunk: dict[str, Any]) -> None:
    plain = plain_text(chunk)
    if plain is None:
        return  # translate_chunk reads it (and refuses what is malformed)
    try:
        translated = translate_chunk(chunk)
    except _Malformed:
        raise AssertionError(f"the shortcut read a chunk translate_chunk refuses: {chunk!r}") from None
    assert translated == ((TextDelta(text=plain),), None)


def test_the_plain_text_shortcut_leaves_every_other_chunk_to_translate_chunk() -> None:
    text = {"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": None}]}
    assert plain_text(text) == "hi"
    others: tuple[dict[str, Any], ...] = (
        {"choices": [{"delta": {"content": "hi"}, "finish_reason": "stop"}]},
        {"choices": [{"delta": {"content": "hi", "refusal": "no"}}]},
        {"choices": [{"delta": {"content": "hi", "tool_calls": [{"index": 0}]}}]},
        {"choices": [{"delta": {"content": ""}}]},
        {"choices": []},
        {"choices": "x"},
        {},
    )
    for other in others:
        assert plain_text(other) is None, other


@settings(max_examples=100, deadline=None)
@given(reply=replies)
def test_every_chunk_is_one_sse_event(reply: ServerReply) -> None:
    for raw in stream_chunks(reply, completion_id="c-1", model="m", created=0):
        event = encode_sse(raw)
        assert event.startswith(b"data: ")
        assert event.endswith(b"\n\n")
        assert event.count(b"\n") == 2, "JSON escapes newlines, so an event is one data line"
        decoded: Any = json.loads(event[len(b"data: ") : -2])
        assert decoded == raw


@given(
    retry=st.integers(0, 30),
    fraction=st.floats(0, 1, exclude_max=True),
    retry_after=st.none() | st.floats(0, 120),
)
def test_backoff_stays_within_its_bounds(retry: int, fraction: float, retry_after: float | None) -> None:
    backoff = Backoff(base=0.5, factor=2, max_delay=8, random=lambda: fraction)

    delay = retry_delay(backoff, retry, retry_after, max_retry_after=60)

    if retry_after is None:
        assert delay is not None
        assert 0 <= delay <= 8
    elif retry_after > 60:
        assert delay is None
    else:
        assert delay is not None
        assert retry_after <= delay <= max(retry_after, 8)
