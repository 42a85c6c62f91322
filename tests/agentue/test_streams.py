"""Named streams: each stream_id has its own model, seq and block ids; ending or resuming one affects no other."""

from __future__ import annotations

from typing import Any

import pytest

from loopd.agentue import AgentUERejectedError, InlineBlock, RejectCode, Streams, StreamState, fold, fold_streams


def _model() -> dict[str, Any]:
    return {"version": "1.1", "biz": "chat", "meta": {}, "blocks": [{"id": "answer", "type": "text", "content": ""}]}


def _append(seq: int, value: str, stream_id: str | None) -> dict[str, Any]:
    event: dict[str, Any] = {
        "op": "append",
        "seq": seq,
        "mask": "block.content",
        "block": {"id": "answer", "content": value},
    }
    if stream_id is not None:
        event["stream_id"] = stream_id
    return event


def _start(seq: int, stream_id: str | None, content: str = "") -> dict[str, Any]:
    model = _model()
    model["blocks"][0]["content"] = content
    event: dict[str, Any] = {"op": "start", "seq": seq, "model": model}
    if stream_id is not None:
        event["stream_id"] = stream_id
    return event


def _end(seq: int, stream_id: str | None) -> dict[str, Any]:
    return {"op": "end", "seq": seq} | ({"stream_id": stream_id} if stream_id is not None else {})


# Streams a, b and the unnamed one interleaved; a ends and then resumes with a new start; all reuse block "answer".
INTERLEAVED = [
    _start(1, "a"),
    _start(1, "b"),
    _start(1, None),
    _append(2, "A", "a"),
    _append(2, "B", "b"),
    _end(3, "a"),
    _append(2, "unnamed", ""),
    {"op": "ping", "seq": 2, "stream_id": "b", "ts": 1770000000000},
    _start(3, "a", content="A"),
    _append(3, "!", "b"),
    _end(4, "b"),
    _end(3, None),
    _end(4, "a"),
]


def _content(streams: Streams, stream_id: str) -> Any:
    model = streams.model(stream_id)
    assert model is not None
    block = model.block("answer")
    assert isinstance(block, InlineBlock)
    return block.get("content")


def test_interleaved_streams_reach_their_own_states() -> None:
    streams = fold_streams(INTERLEAVED)
    assert set(streams) == {"a", "b", ""}
    assert (_content(streams, "a"), _content(streams, "b"), _content(streams, "")) == ("A", "B!", "unnamed")
    assert all(streams[key].ended for key in streams)
    assert (streams["a"].seq, streams["b"].seq, streams[""].seq) == (4, 4, 3)


def test_each_stream_equals_the_fold_of_its_own_events() -> None:
    streams = fold_streams(INTERLEAVED)
    for key in ("a", "b", ""):
        own = [event for event in INTERLEAVED if (event.get("stream_id") or "") == key]
        assert streams[key] == fold(own)


def test_ending_one_stream_leaves_the_others_open() -> None:
    streams = fold_streams(INTERLEAVED[:6])  # through the end of "a"
    assert streams["a"].ended and not streams["b"].ended and not streams[""].ended
    with pytest.raises(AgentUERejectedError) as info:
        streams.apply(_append(4, "late", "a"))
    assert info.value.code is RejectCode.ENDED and info.value.stream_id == "a"
    assert _content(streams.apply(_append(3, "?", "b")), "b") == "B?"


def test_a_rejection_in_one_stream_leaves_the_container_unchanged() -> None:
    streams = fold_streams(INTERLEAVED[:5])
    with pytest.raises(AgentUERejectedError):
        streams.apply(
            {
                "op": "append",
                "seq": 9,
                "stream_id": "b",
                "mask": "block.content",
                "block": {"id": "answer", "content": [1]},
            }
        )
    assert streams == fold_streams(INTERLEAVED[:5])


def test_unknown_streams_are_not_started_and_pings_create_nothing() -> None:
    streams = Streams()
    assert streams.state("x") == StreamState(stream_id="x") and streams.model("x") is None
    assert streams.apply({"op": "ping", "seq": 0, "stream_id": "x"}) is streams
    with pytest.raises(AgentUERejectedError) as info:
        streams.apply(_append(1, "x", "x"))
    assert info.value.code is RejectCode.NOT_STARTED


def test_streams_is_an_immutable_mapping() -> None:
    streams = fold_streams(INTERLEAVED[:3])
    with pytest.raises(AttributeError):
        streams._states = {}
    with pytest.raises(ValueError, match="filed under"):
        Streams({"a": StreamState(stream_id="b")})
    assert dict(streams) == {key: streams[key] for key in ("a", "b", "")}
