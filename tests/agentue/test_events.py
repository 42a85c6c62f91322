"""Event envelope validation: what each op may and must carry."""

from __future__ import annotations

from typing import Any

import pytest

from loopd.agentue import (
    AgentUEValidationError,
    AppendEvent,
    EndEvent,
    ErrorEvent,
    Lifecycle,
    Op,
    PingEvent,
    SetEvent,
    StartEvent,
    decode_event,
    encode_event,
    event_from_json,
)

MODEL = {"version": "1.1", "biz": "chat", "meta": {}, "blocks": []}

VALID: list[dict[str, Any]] = [
    {"op": "start", "seq": 0, "model": MODEL},
    {"op": "start", "seq": 3, "stream_id": "a", "ts": 1770000000000, "event_type": "snapshot", "model": MODEL},
    {"op": "set", "seq": 1, "block": {"id": "b", "type": "text", "content": "x"}},
    {"op": "set", "seq": 1, "block": {"id": "b", "ref": "store://b"}},
    {"op": "set", "seq": 1, "mask": "block.tool.status", "block": {"id": "b", "tool": {"status": "done"}}},
    {"op": "set", "seq": 1, "mask": "block.tool.status", "block": {"id": "b", "status": "done"}},
    {"op": "set", "seq": 1, "mask": "meta.status", "meta": {"status": None}},
    {"op": "append", "seq": 1, "mask": "block.items", "block": {"id": "b", "items": []}},
    {"op": "error", "seq": 1, "mask": "meta.error", "meta": {"error": {"code": "c", "message": "m", "detail": [1]}}},
    {"op": "ping", "seq": 4, "ts": 1},
    {"op": "end", "seq": 5, "stream_id": ""},
]


@pytest.mark.parametrize("data", VALID, ids=lambda d: f"{d['op']}-{sorted(d)}")
def test_valid_events_round_trip_through_json(data: dict[str, Any]) -> None:
    event = event_from_json(data)
    assert event.op is Op(data["op"])
    assert event.to_json() == data
    assert decode_event(encode_event(event)) == event


INVALID: list[tuple[str, dict[str, Any], str]] = [
    ("not-an-op", {"op": "patch", "seq": 1}, "event.op"),
    ("missing-seq", {"op": "end"}, "event.seq"),
    ("negative-seq", {"op": "end", "seq": -1}, "event.seq"),
    ("bool-seq", {"op": "end", "seq": True}, "event.seq"),
    ("float-seq", {"op": "end", "seq": 1.0}, "event.seq"),
    ("string-ts", {"op": "ping", "seq": 1, "ts": "now"}, "event.ts"),
    ("numeric-stream", {"op": "ping", "seq": 1, "stream_id": 3}, "event.stream_id"),
    ("unknown-field", {"op": "end", "seq": 1, "reason": "done"}, "event"),
    ("start-without-model", {"op": "start", "seq": 1}, "event.model"),
    ("start-with-block", {"op": "start", "seq": 1, "model": MODEL, "block": {"id": "a", "type": "t"}}, "event"),
    ("start-with-mask", {"op": "start", "seq": 1, "model": MODEL, "mask": "meta.x"}, "event"),
    ("start-invalid-model", {"op": "start", "seq": 1, "model": {**MODEL, "version": "2.0"}}, "event.model.version"),
    ("set-with-model", {"op": "set", "seq": 1, "model": MODEL, "block": {"id": "a", "type": "t"}}, "event"),
    (
        "set-both-slots",
        {"op": "set", "seq": 1, "mask": "meta.a", "meta": {"a": 1}, "block": {"id": "a", "a": 1}},
        "event",
    ),
    ("set-no-slot", {"op": "set", "seq": 1, "mask": "meta.a"}, "event"),
    ("set-meta-unmasked", {"op": "set", "seq": 1, "meta": {"a": 1}}, "event.mask"),
    ("set-mask-wrong-slot", {"op": "set", "seq": 1, "mask": "meta.a", "block": {"id": "a", "a": 1}}, "event.mask"),
    ("set-mask-unknown-slot", {"op": "set", "seq": 1, "mask": "model.a", "meta": {"a": 1}}, "event.mask"),
    ("set-mask-slot-only", {"op": "set", "seq": 1, "mask": "block", "block": {"id": "a"}}, "event.mask"),
    ("set-mask-empty-segment", {"op": "set", "seq": 1, "mask": "block..a", "block": {"id": "a", "a": 1}}, "event.mask"),
    ("set-no-value", {"op": "set", "seq": 1, "mask": "block.a.b", "block": {"id": "x", "c": 1}}, "event.block"),
    ("set-patch-no-id", {"op": "set", "seq": 1, "mask": "block.a", "block": {"a": 1}}, "event.block.id"),
    ("append-meta", {"op": "append", "seq": 1, "mask": "block.a", "meta": {"a": "x"}}, "event"),
    ("append-no-mask", {"op": "append", "seq": 1, "block": {"id": "x", "a": "x"}}, "event.mask"),
    (
        "append-nested",
        {"op": "append", "seq": 1, "mask": "block.a.b", "block": {"id": "x", "a": {"b": "x"}}},
        "event.mask",
    ),
    ("append-meta-mask", {"op": "append", "seq": 1, "mask": "meta.a", "block": {"id": "x", "a": "x"}}, "event.mask"),
    ("append-missing-value", {"op": "append", "seq": 1, "mask": "block.a", "block": {"id": "x"}}, "event.block.a"),
    ("append-null", {"op": "append", "seq": 1, "mask": "block.a", "block": {"id": "x", "a": None}}, "event.block.a"),
    ("append-number", {"op": "append", "seq": 1, "mask": "block.a", "block": {"id": "x", "a": 1}}, "event.block.a"),
    ("error-without-mask", {"op": "error", "seq": 1, "meta": {"error": {"code": "c", "message": "m"}}}, "event.mask"),
    ("error-other-mask", {"op": "error", "seq": 1, "mask": "meta.status", "meta": {"status": "x"}}, "event.mask"),
    ("error-string", {"op": "error", "seq": 1, "mask": "meta.error", "meta": {"error": "boom"}}, "event.meta.error"),
    (
        "error-no-code",
        {"op": "error", "seq": 1, "mask": "meta.error", "meta": {"error": {"message": "m"}}},
        "event.meta.error.code",
    ),
    (
        "error-with-block",
        {
            "op": "error",
            "seq": 1,
            "mask": "meta.error",
            "meta": {"error": {"code": "c", "message": "m"}},
            "block": {"id": "a", "type": "t"},
        },
        "event",
    ),
    ("ping-with-mask", {"op": "ping", "seq": 1, "mask": "meta.a"}, "event"),
    ("end-with-meta", {"op": "end", "seq": 1, "meta": {}}, "event"),
    ("not-an-object", [], "event"),  # type: ignore[list-item]
    (
        "non-json-value",
        {"op": "set", "seq": 1, "block": {"id": "a", "type": "t", "when": object()}},
        "event.block.when",
    ),
    ("nan", {"op": "set", "seq": 1, "block": {"id": "a", "type": "t", "x": [float("nan")]}}, "event.block.x[0]"),
]


@pytest.mark.parametrize(("data", "path"), [pytest.param(d, p, id=name) for name, d, p in INVALID])
def test_invalid_events_name_the_offending_field(data: Any, path: str) -> None:
    with pytest.raises(AgentUEValidationError) as info:
        event_from_json(data)
    assert info.value.path == path, str(info.value)


def test_null_optional_fields_mean_absent() -> None:
    event = event_from_json({"op": "end", "seq": 1, "stream_id": None, "ts": None, "mask": None, "model": None})
    assert event == EndEvent(seq=1)


def test_builders_make_the_wire_shapes() -> None:
    assert SetEvent.block_field(2, "t", "tool.status", "done").to_json() == {
        "op": "set",
        "seq": 2,
        "mask": "block.tool.status",
        "block": {"id": "t", "tool": {"status": "done"}},
    }
    assert SetEvent.meta_field(3, "status", "ok", stream_id="s").to_json() == {
        "op": "set",
        "seq": 3,
        "stream_id": "s",
        "mask": "meta.status",
        "meta": {"status": "ok"},
    }
    assert AppendEvent.to(4, "a", "content", "x", type="text").to_json() == {
        "op": "append",
        "seq": 4,
        "mask": "block.content",
        "block": {"id": "a", "content": "x", "type": "text"},
    }
    error = ErrorEvent.of(5, "failed", "boom", ts=9)
    assert error.to_json() == {
        "op": "error",
        "seq": 5,
        "ts": 9,
        "mask": "meta.error",
        "meta": {"error": {"code": "failed", "message": "boom"}},
    }
    assert error.error.code == "failed"


def test_constructed_events_are_validated_too() -> None:
    with pytest.raises(AgentUEValidationError):
        SetEvent(seq=1)
    with pytest.raises(AgentUEValidationError):
        AppendEvent(seq=1, mask="block.id", block={"id": "a"})
    with pytest.raises(AgentUEValidationError):
        StartEvent(seq=1, model=MODEL)  # type: ignore[arg-type]
    with pytest.raises(AgentUEValidationError):
        PingEvent(seq=-5)


def test_events_do_not_alias_the_callers_payload() -> None:
    block: dict[str, Any] = {"id": "a", "type": "text", "content": "x"}
    event = SetEvent.whole(1, block)
    block["content"] = "changed"
    assert event.to_json()["block"]["content"] == "x"
    assert event.whole_block is not None and event.whole_block.to_json()["content"] == "x"


def test_each_op_declares_its_lifecycle() -> None:
    lifecycles = {event_from_json(data).op: event_from_json(data).lifecycle for data in VALID}
    assert lifecycles == {
        Op.START: Lifecycle.ENDURING,
        Op.SET: Lifecycle.ENDURING,
        Op.APPEND: Lifecycle.ENDURING,
        Op.ERROR: Lifecycle.ENDURING,
        Op.PING: Lifecycle.EPHEMERAL,
        Op.END: Lifecycle.TERMINAL,
    }
