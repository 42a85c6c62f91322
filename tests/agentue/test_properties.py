"""Property tests for the pure core: determinism, idempotent redelivery, stream independence, codecs."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from loopd._infra.sse import split_sse
from loopd.agentue import (
    Event,
    Model,
    StreamState,
    decode_event,
    decode_sse_event,
    encode_event,
    encode_sse_event,
    event_from_json,
    fold,
    fold_streams,
    resume,
)

SETTINGS = settings(max_examples=150, deadline=None)
words = st.text(max_size=6)
scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), words)


@st.composite
def timelines(draw: st.DrawFn, stream_id: str | None = None) -> list[Event]:
    """A valid delivery of one stream: start, then changes that the reducer must accept, maybe an end."""
    seq = draw(st.integers(0, 3))
    version = draw(st.sampled_from(["1.0", "1.1"]))
    kinds: dict[str, str] = {}  # block id -> "text" | "list" | "ref"
    blocks: list[dict[str, Any]] = []
    for block_id in draw(st.lists(st.sampled_from(["t1", "t2", "l1"]), unique=True)):
        kinds[block_id] = "list" if block_id == "l1" else "text"
        initial: dict[str, Any] = (
            {"items": draw(st.lists(st.integers(), max_size=2))} if block_id == "l1" else {"content": draw(words)}
        )
        blocks.append({"id": block_id, "type": kinds[block_id], **initial})
    envelope: dict[str, Any] = {} if stream_id is None else {"stream_id": stream_id}
    model = {"version": version, "biz": "chat", "meta": {}, "blocks": blocks}
    raw: list[dict[str, Any]] = [{"op": "start", "seq": seq, "model": model}]
    ops = ["set_whole", "set_field", "set_meta", "append", "append", "append", "error", "ping"]
    if version == "1.1":
        ops.append("set_ref")
    for _ in range(draw(st.integers(0, 12))):
        op = draw(st.sampled_from(ops))
        if op == "ping":
            raw.append({"op": "ping", "seq": seq, "ts": draw(st.integers(0, 2**41))})
            continue
        seq += draw(st.integers(1, 3))
        inline = sorted(block_id for block_id, kind in kinds.items() if kind != "ref")
        if op == "set_whole":
            block_id = draw(st.sampled_from(["t1", "t2", "l1"]))
            kinds[block_id] = "list" if block_id == "l1" else "text"
            whole: dict[str, Any] = (
                {"items": draw(st.lists(scalars, max_size=2))} if block_id == "l1" else {"content": draw(words)}
            )
            raw.append({"op": "set", "seq": seq, "block": {"id": block_id, "type": kinds[block_id], **whole}})
        elif op == "set_ref":
            block_id = draw(st.sampled_from(["t2", "r1"]))
            kinds[block_id] = "ref"
            raw.append({"op": "set", "seq": seq, "block": {"id": block_id, "ref": f"store://{draw(words)}x"}})
        elif op == "set_field" and inline:
            block_id = draw(st.sampled_from(inline))
            path = draw(st.sampled_from(["status", "meta.step", "meta.detail.value"]))
            written = draw(scalars)
            flat = draw(st.booleans()) and path == "status"
            payload = {"status": written} if flat else _nested(path.split("."), written)
            raw.append({"op": "set", "seq": seq, "mask": f"block.{path}", "block": {"id": block_id, **payload}})
        elif op == "set_meta":
            path = draw(st.sampled_from(["status", "info.step"]))
            raw.append(
                {"op": "set", "seq": seq, "mask": f"meta.{path}", "meta": _nested(path.split("."), draw(scalars))}
            )
        elif op == "append":
            block_id = draw(st.sampled_from(["t1", "t2", "l1"]))
            if kinds.get(block_id) == "ref":
                continue
            field, value = (
                ("items", draw(st.lists(scalars, max_size=2))) if block_id == "l1" else ("content", draw(words))
            )
            kind = "list" if block_id == "l1" else "text"
            body: dict[str, Any] = {"id": block_id, field: value}
            if block_id not in kinds or draw(st.booleans()):
                body["type"] = kind
            kinds[block_id] = kind
            raw.append({"op": "append", "seq": seq, "mask": f"block.{field}", "block": body})
        elif op == "error":
            error = {"code": draw(words), "message": draw(words)}
            raw.append({"op": "error", "seq": seq, "mask": "meta.error", "meta": {"error": error}})
    if draw(st.booleans()):
        raw.append({"op": "end", "seq": seq + draw(st.integers(0, 2))})
    return [event_from_json({**event, **envelope}) for event in raw]


def _nested(path: list[str], value: Any) -> dict[str, Any]:
    out: dict[str, Any] = {path[-1]: value}
    for segment in reversed(path[:-1]):
        out = {segment: out}
    return out


@SETTINGS
@given(events=timelines())
def test_fold_is_deterministic_and_independent_of_the_wire_form(events: list[Event]) -> None:
    state = fold(events)
    assert state.started
    assert fold(events) == state
    assert fold([event.to_json() for event in events]) == state
    assert fold([decode_event(encode_event(event)) for event in events]) == state
    assert state.model is not None and fold(events).model == state.model


@SETTINGS
@given(events=timelines())
def test_a_folded_models_text_and_block_index_agree_with_its_json(events: list[Event]) -> None:
    # `json_text` (each block encoded once and kept) is `to_json` as text, and the id index the reducer carries
    # from model to model finds every block where it is, however the fold got there.
    model = fold(events).model
    assert model is not None
    assert json.loads(model.json_text()) == model.to_json()
    assert json.loads(model.json_text()) == model.to_json()  # a second time, from the kept block texts
    for position, block in enumerate(model.blocks):
        assert model.index_of(block.id) == position
        assert model.block(block.id) is block
    assert model.index_of("no-such-block") is None
    rebuilt = Model.from_json(model.to_json())
    assert [rebuilt.index_of(block.id) for block in rebuilt.blocks] == list(range(len(rebuilt.blocks)))
    stored = Model.from_stored(json.loads(model.json_text()))  # read back as the message store does
    assert (
        stored == model and stored.to_json() == model.to_json() and json.loads(stored.json_text()) == stored.to_json()
    )
    assert [stored.index_of(block.id) for block in stored.blocks] == list(range(len(stored.blocks)))


@SETTINGS
@given(events=timelines(), data=st.data())
def test_duplicate_delivery_changes_nothing(events: list[Event], data: st.DataObject) -> None:
    full = fold(events)
    k = data.draw(st.integers(1, len(events)), label="prefix")
    prefix = events[:k]
    assert fold(prefix + prefix) == fold(prefix)
    # A reconnect that re-sends from any earlier point j (with or without the start) converges on the same state.
    j = data.draw(st.integers(0, k), label="resend_from")
    assert fold(prefix + events[j:]) == full


@SETTINGS
@given(events=timelines(), data=st.data())
def test_a_resumed_delivery_gives_the_same_snapshot(events: list[Event], data: st.DataObject) -> None:
    full = fold(events)
    k = data.draw(st.integers(1, len(events)), label="applied")
    seen = fold(events[:k])
    cursor = seen.seq
    assert fold(resume(events, cursor)) == full
    assert fold(resume(events, cursor), seen) == full


@SETTINGS
@given(first=timelines(stream_id="a"), second=timelines(stream_id=""), data=st.data())
def test_streams_are_independent_under_any_interleaving(
    first: list[Event], second: list[Event], data: st.DataObject
) -> None:
    order = data.draw(st.permutations([True] * len(first) + [False] * len(second)), label="order")
    left, right = iter(first), iter(second)
    interleaved = [next(left) if pick else next(right) for pick in order]
    streams = fold_streams(interleaved)
    assert streams["a"] == fold(first)
    assert streams[""] == fold(second)
    assert fold_streams(first + second) == streams


cursors = st.none() | st.text(st.characters(exclude_characters="\r\n\x00"), max_size=24)


@SETTINGS
@given(events=timelines(stream_id="s"), cursor=cursors)
def test_sse_render_then_parse_round_trips(events: list[Event], cursor: str | None) -> None:
    for event in events:
        decoded = decode_sse_event(encode_sse_event(event, cursor=cursor))
        assert decoded.event == event
        assert decoded.cursor == cursor


@SETTINGS
@given(events=timelines(), crlf=st.booleans(), data=st.data())
def test_any_chunking_of_a_stream_yields_the_same_events(events: list[Event], crlf: bool, data: st.DataObject) -> None:
    body = "".join(encode_sse_event(event, cursor=str(n)) for n, event in enumerate(events))
    if crlf:
        body = body.replace("\n", "\r\n")
    cuts = sorted(data.draw(st.lists(st.integers(0, len(body)), max_size=8), label="cuts"))
    chunks = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
    received: list[str] = []
    rest = ""
    for chunk in chunks:
        frames, rest = split_sse(rest + chunk)
        received.extend(frames)
    assert rest == ""
    decoded = [decode_sse_event(frame) for frame in received]
    assert [d.event for d in decoded] == events
    assert [d.cursor for d in decoded] == [str(n) for n in range(len(events))]


def test_the_generator_covers_the_interesting_ops() -> None:
    # Not a property: a guard that the strategy above really produces every op (otherwise the properties are weak).
    seen: set[str] = set()

    @settings(max_examples=200, deadline=None)
    @given(events=timelines())
    def collect(events: list[Event]) -> None:
        seen.update(e.op.value for e in events)
        seen.update("ref" for e in events if "ref" in (e.to_json().get("block") or {}))
        if fold(events).ended:
            seen.add("ended")

    collect()
    assert seen >= {"start", "set", "append", "error", "ping", "end", "ref", "ended"}
    assert StreamState().model is None
