"""Projection (pure): updates become valid AgentUE events; re-applying an update changes nothing; hashes chain."""

from __future__ import annotations

from typing import Any

from loopd.agentue import StreamState, fold, reduce, typed_block
from loopd.server.engine import (
    Finished,
    GateOpened,
    GateResolved,
    ModelCalled,
    TextPreview,
    TextSet,
    ToolFinished,
    ToolStarted,
    Update,
)
from loopd.server.engine._projection import MAX_TOOL_OUTPUT, next_hash, project
from loopd.server.streams import empty_model


def _apply(state: StreamState, update: Update) -> tuple[StreamState, int]:
    events = project(update, state.model.to_json())  # type: ignore[union-attr]
    seq = state.seq or 1
    for event in events:
        seq += 1
        state = reduce(state, {**event, "seq": seq})
    return state, len(events)


UPDATES: list[Update] = [
    TextPreview("He"),
    TextPreview("llo"),
    ModelCalled("m", 1, 2, 0.5),
    TextSet("Hello"),
    ToolStarted("c1", "write", {"path": "a.txt", "content": "x" * (MAX_TOOL_OUTPUT + 10)}),
    GateOpened("t/1", "- write a.txt"),
    GateResolved("t/1", "deny", False, timed_out=True, reason="no answer before the gate timed out"),
    ToolFinished("c1", "write", "failed", "y" * (MAX_TOOL_OUTPUT + 10)),
    Finished({"ok": False}, format="json"),
]


def test_every_update_projects_to_valid_blocks_and_a_repeat_changes_nothing() -> None:
    state = fold([{"op": "start", "seq": 1, "model": empty_model()}])
    for update in UPDATES:
        state, _ = _apply(state, update)
        if not isinstance(update, TextPreview):
            again, _ = _apply(state, update)
            assert again.model.to_json() == state.model.to_json(), update  # type: ignore[union-attr]
    model: dict[str, Any] = state.model.to_json()  # type: ignore[union-attr]
    blocks = {block["id"]: block for block in model["blocks"]}
    assert blocks["answer"]["content"] == "Hello"
    assert blocks["gate/t/1"]["status"] == "timeout" and "value" not in blocks["gate/t/1"]
    assert isinstance(blocks["tool/c1"]["input"], str) and blocks["tool/c1"]["input"].endswith("…")
    assert len(blocks["tool/c1"]["output"]) == MAX_TOOL_OUTPUT + 1
    assert blocks["result"] == {"id": "result", "type": "result", "format": "json", "content": {"ok": False}}
    for block in model["blocks"]:
        typed_block(block)  # each block is a valid typed view (ask, tool, text, result)


def test_the_replay_hash_chains_over_the_updates() -> None:
    first = next_hash("", TextSet("a"))
    assert first == next_hash("", TextSet("a"))
    assert first != next_hash("", TextSet("b"))
    assert next_hash(first, Finished("a")) != next_hash(next_hash("", TextSet("b")), Finished("a"))
