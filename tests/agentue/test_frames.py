"""Frames: splitting a block's JSON into pieces for storage and joining them back."""

from __future__ import annotations

from typing import Any

import pytest

from loopd.agentue import AgentUEValidationError, Frame, InlineBlock, RefBlock, join_frames, split_block

BLOCK = {"id": "result", "type": "result", "format": "text", "content": "ünïcode " * 20}


def test_split_and_join_round_trip_in_any_order() -> None:
    frames = split_block(BLOCK, max_chars=16)
    assert len(frames) > 5
    assert {f.total for f in frames} == {len(frames)} and [f.seq for f in frames] == list(range(len(frames)))
    assert frames[0].id == "result#0"
    assert join_frames(reversed(frames)) == InlineBlock(BLOCK)
    assert join_frames([f.to_json() for f in frames]) == InlineBlock(BLOCK)
    assert join_frames(split_block(RefBlock("r", "x"), max_chars=4)) == RefBlock("r", "x")
    one = split_block(BLOCK, max_chars=10_000, frame_id=lambda block_id, seq: f"f-{block_id}-{seq}")
    assert [(f.id, f.total) for f in one] == [("f-result-0", 1)]


def _frames() -> list[dict[str, Any]]:
    return [f.to_json() for f in split_block(BLOCK, max_chars=40)]


def _mutated(change: str) -> list[dict[str, Any]]:
    frames = _frames()
    if change == "missing":
        del frames[1]
    elif change == "duplicate-seq":
        frames[1] = {**frames[1], "id": "other"} | {"seq": 0}
    elif change == "duplicate-id":
        frames[1] = {**frames[1], "id": frames[0]["id"]}
    elif change == "other-block":
        frames[1] = {**frames[1], "block_id": "other"}
    elif change == "other-total":
        frames[1] = {**frames[1], "total": frames[1]["total"] + 1}
    elif change == "garbled":
        frames[1] = {**frames[1], "data": "}"}
    return frames


@pytest.mark.parametrize(
    "change", ["missing", "duplicate-seq", "duplicate-id", "other-block", "other-total", "garbled"]
)
def test_join_checks_identity_total_ids_and_coverage(change: str) -> None:
    with pytest.raises(AgentUEValidationError):
        join_frames(_mutated(change))


def test_frames_are_validated_and_do_not_nest() -> None:
    with pytest.raises(AgentUEValidationError):
        join_frames([])
    with pytest.raises(AgentUEValidationError):
        Frame(id="f", block_id="b", seq=2, total=2, data="")
    with pytest.raises(AgentUEValidationError):
        Frame.from_json({"id": "f", "block_id": "b", "seq": 0, "total": 1, "data": "", "extra": 1})
    with pytest.raises(AgentUEValidationError):
        split_block({"id": "f", "type": "frame", "data": "x"}, max_chars=10)
    with pytest.raises(AgentUEValidationError):
        split_block(BLOCK, max_chars=0)
    nested = split_block({"id": "f", "type": "text"}, max_chars=100)[0]
    frame_block = Frame(id=nested.id, block_id="f", seq=0, total=1, data='{"id":"f","type":"frame"}')
    with pytest.raises(AgentUEValidationError, match="do not nest"):
        join_frames([frame_block])
    wrong_id = Frame(id="x", block_id="g", seq=0, total=1, data='{"id":"f","type":"text"}')
    with pytest.raises(AgentUEValidationError, match="not 'g'"):
        join_frames([wrong_id])
