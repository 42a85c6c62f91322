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


# --- the answer block: live text at its place, only what is not shown yet --------------------------------------


def _answer_ops(updates: list[Update], content: dict[str, Any] | None = None) -> tuple[list[tuple[str, str]], str]:
    state = fold([{"op": "start", "seq": 1, "model": content or empty_model()}])
    ops: list[tuple[str, str]] = []
    for update in updates:
        for event in project(update, state.model.to_json()):  # type: ignore[union-attr]
            state = reduce(state, {**event, "seq": (state.seq or 1) + 1})
            ops.append((event["op"], event["block"]["content"]))
    blocks = {b["id"]: b for b in state.model.to_json()["blocks"]}  # type: ignore[union-attr]
    return ops, blocks["answer"]["content"] if "answer" in blocks else ""


def test_previews_append_only_what_is_not_shown_and_the_durable_text_only_its_missing_suffix() -> None:
    ops, text = _answer_ops(
        [
            TextPreview("Let ", offset=0),
            TextPreview("Let me", offset=0),  # partly shown already
            TextPreview("me", offset=4),  # shown already
            TextPreview("xyz", offset=20),  # after a gap: wait for the durable text
            TextSet("Let me look."),
        ]
    )
    assert ops == [("set", "Let "), ("append", "me"), ("append", " look.")]
    assert text == "Let me look."


def test_a_preview_that_disagrees_with_the_shown_text_rewrites_it_once() -> None:
    ops, text = _answer_ops(
        [TextPreview("Hello wor", offset=0), TextPreview("Hi", offset=0), TextPreview(" there", offset=2)]
    )
    assert ops == [("set", "Hello wor"), ("set", "Hi"), ("append", " there")]
    assert text == "Hi there"


def test_the_translator_drops_fragments_that_arrive_after_their_step_and_stops_a_step_after_a_gap() -> None:
    from loopd.harness.core._values import Usage as HarnessUsage
    from loopd.harness.core.events import ModelReplied, TokenDelta, TurnStarted
    from loopd.server.engine._translation import HarnessTranslator

    def delta(step: int, text: str, offset: int) -> TokenDelta:
        return TokenDelta(loop="main", turn_id="main/1", step=step, text=text, offset=offset)

    translator = HarnessTranslator(main_loop="main")
    fed = [
        TurnStarted(loop="main", turn_id="main/1", inputs=(), at=0.0),
        ModelReplied(loop="main", turn_id="main/1", step=1, text="One.", tool_calls=(), usage=HarnessUsage()),
        delta(1, "One.", 0),  # late: the journal's catch-up delivered the reply first
        delta(2, "Tw", 0),
        delta(2, "o", 3),  # a piece went missing
        delta(2, ".", 4),
    ]
    previews = [u for event in fed for u in translator.feed(event) if isinstance(u, TextPreview)]
    assert previews == [TextPreview("\n\nTw", offset=4)]  # step 2 starts after "One." and its separator
