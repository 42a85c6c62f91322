"""The reducer's rules beyond the conformance files: seq discipline, ops against the current model, immutability."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from loopd.agentue import (
    AgentUERejectedError,
    AppendEvent,
    EndEvent,
    ErrorEvent,
    InlineBlock,
    Model,
    PingEvent,
    RefBlock,
    RejectCode,
    SetEvent,
    StartEvent,
    StreamState,
    fold,
    reduce,
    resume,
)

from .helpers import chat_model, text


def started(*blocks: dict[str, Any], seq: int = 1, version: str = "1.1") -> StreamState:
    return reduce(StreamState(), StartEvent(seq=seq, model=chat_model(*blocks, version=version)))


def rejected(state: StreamState, event: Any) -> AgentUERejectedError:
    before = copy.deepcopy(state.model.to_json()) if state.model else None
    with pytest.raises(AgentUERejectedError) as info:
        reduce(state, event)
    after = state.model.to_json() if state.model else None
    assert after == before
    return info.value


# ------------------------------------------------------------------------------------------------------ seq rules


def test_an_already_applied_seq_is_an_idempotent_no_op() -> None:
    state = reduce(started(text("a", "x")), AppendEvent.to(2, "a", "content", "y"))
    again = reduce(state, AppendEvent.to(2, "a", "content", "y"))
    assert again is state
    older = reduce(state, SetEvent.block_field(1, "a", "content", "something else"))
    assert older is state
    assert state.model is not None and state.model.block("a") == InlineBlock(text("a", "xy"))


def test_seq_gaps_are_allowed_because_seq_only_has_to_increase() -> None:
    state = reduce(started(text("a")), AppendEvent.to(7, "a", "content", "x"))
    state = reduce(state, AppendEvent.to(40, "a", "content", "y"))
    assert state.seq == 40
    assert state.model is not None and state.model.block("a") == InlineBlock(text("a", "xy"))


def test_ping_never_changes_state_and_is_never_refused() -> None:
    empty = StreamState()
    assert reduce(empty, PingEvent(seq=0)) is empty
    state = started(text("a"), seq=3)
    assert reduce(state, PingEvent(seq=3, ts=1770000000000)) is state
    assert reduce(state, PingEvent(seq=99)) is state  # a ping never advances the covered seq
    ended = reduce(state, EndEvent(seq=4))
    assert reduce(ended, PingEvent(seq=4)) is ended


def test_changes_before_the_first_start_are_refused() -> None:
    for event in (SetEvent.whole(1, text("a")), AppendEvent.to(1, "a", "content", "x", type="text"), EndEvent(seq=1)):
        assert rejected(StreamState(), event).code is RejectCode.NOT_STARTED


def test_a_state_made_from_a_stored_model_accepts_any_first_seq() -> None:
    state = StreamState.of(chat_model(text("a")))
    assert state.seq is None and state.started
    state = reduce(state, AppendEvent.to(0, "a", "content", "x"))
    assert state.seq == 0


def test_new_changes_after_end_are_refused_until_a_new_start() -> None:
    state = reduce(started(text("a")), EndEvent(seq=2))
    assert state.ended and state.seq == 2
    error = rejected(state, AppendEvent.to(3, "a", "content", "late"))
    assert error.code is RejectCode.ENDED and "seq 3" in str(error)
    # A duplicate of something already applied is still a no-op after the end.
    assert reduce(state, EndEvent(seq=2)) is state
    assert reduce(state, AppendEvent.to(2, "a", "content", "dup")) is state
    # A resumed delivery reopens the stream with a whole snapshot.
    resumed = reduce(state, StartEvent(seq=5, model=chat_model(text("a", "resumed"))))
    assert not resumed.ended and resumed.seq == 5
    resumed = reduce(resumed, AppendEvent.to(6, "a", "content", "!"))
    assert resumed.model is not None and resumed.model.block("a") == InlineBlock(text("a", "resumed!"))


def test_end_at_the_seq_of_the_last_change_closes_the_stream() -> None:
    state = reduce(started(text("a")), AppendEvent.to(2, "a", "content", "x"))
    closed = reduce(state, EndEvent(seq=2))
    assert closed.ended and closed.seq == 2 and closed.model == state.model
    assert reduce(state, EndEvent(seq=1)) is state  # below the applied seq: a stale duplicate


def test_start_always_replaces_even_with_a_lower_seq() -> None:
    state = reduce(started(text("a", "old"), seq=10), AppendEvent.to(11, "a", "content", "!"))
    restarted = reduce(state, StartEvent(seq=1, model=chat_model(text("b", "new"))))
    assert restarted.seq == 1 and restarted.model is not None and restarted.model.block_ids == ("b",)


def test_events_of_another_stream_are_refused() -> None:
    state = started(text("a"))
    error = rejected(state, AppendEvent.to(2, "a", "content", "x", stream_id="other"))
    assert error.code is RejectCode.WRONG_STREAM
    # "" and an omitted stream_id are the same, unnamed stream.
    assert reduce(state, AppendEvent.to(2, "a", "content", "x", stream_id="")).seq == 2


def test_a_malformed_event_is_rejected_with_its_validation_error_as_cause() -> None:
    state = started(text("a"))
    error = rejected(state, {"op": "append", "seq": 2, "mask": "block.content", "block": {"id": "a", "content": 5}})
    assert error.code is RejectCode.INVALID_EVENT
    assert error.op == "append" and error.seq == 2
    assert "event.block.content" in str(error)
    assert isinstance(error.__cause__, ValueError)


# ---------------------------------------------------------------------------------------------------------- set


def test_whole_set_upserts_in_place_or_at_the_end() -> None:
    state = started(text("a", "1"), text("b", "2"))
    state = reduce(state, SetEvent.whole(2, {"id": "a", "type": "text", "content": "new", "role": "operator"}))
    state = reduce(state, SetEvent.whole(3, text("c", "3")))
    assert state.model is not None
    assert state.model.block_ids == ("a", "b", "c")
    assert state.model.block("a") == InlineBlock({"id": "a", "type": "text", "content": "new", "role": "operator"})


def test_whole_set_switches_between_inline_and_reference_keeping_the_position() -> None:
    state = started(text("a"), text("b", "body"), text("c"))
    state = reduce(state, SetEvent.whole(2, RefBlock("b", "store://b")))
    assert state.model is not None and state.model.blocks[1] == RefBlock("b", "store://b")
    state = reduce(state, SetEvent.whole(3, text("b", "back")))
    assert state.model is not None and state.model.block_ids == ("a", "b", "c")
    assert state.model.blocks[1] == InlineBlock(text("b", "back"))


def test_masked_set_reads_the_path_then_the_flat_key() -> None:
    state = started({"id": "t", "type": "tool", "tool": {"status": "running"}})
    state = reduce(state, {"op": "set", "seq": 2, "mask": "block.tool.status", "block": {"id": "t", "status": "done"}})
    assert state.model is not None and state.model.blocks[0].to_json()["tool"] == {"status": "done"}
    # Intermediate objects are created as needed, in meta and in blocks.
    state = reduce(state, SetEvent.block_field(3, "t", "usage.tokens.input", 12))
    state = reduce(state, SetEvent.meta_field(4, "stats.cost.usd", 0.5))
    assert state.model is not None
    assert state.model.blocks[0].to_json()["usage"] == {"tokens": {"input": 12}}
    assert state.model.meta == {"stats": {"cost": {"usd": 0.5}}}


def test_masked_set_of_a_missing_block_is_refused() -> None:
    error = rejected(started(text("a")), SetEvent.block_field(2, "nope", "content", "x"))
    assert error.code is RejectCode.MISSING_BLOCK and "'nope'" in str(error)


def test_a_path_through_a_non_object_is_refused() -> None:
    state = started({"id": "t", "type": "tool", "tool": {"result": None}, "name": "bash"})
    assert rejected(state, SetEvent.block_field(2, "t", "tool.result.value", 1)).code is RejectCode.PATH_CONFLICT
    assert rejected(state, SetEvent.block_field(2, "t", "name.first", "x")).code is RejectCode.PATH_CONFLICT


def test_an_update_that_would_make_the_model_invalid_is_refused() -> None:
    state = started(text("a"))
    assert rejected(state, SetEvent.block_field(2, "a", "type", "")).code is RejectCode.INVALID_RESULT
    assert rejected(state, SetEvent.block_field(2, "a", "parent_id", 3)).code is RejectCode.INVALID_RESULT
    assert rejected(state, SetEvent.meta_field(2, "error", "boom")).code is RejectCode.INVALID_RESULT
    assert rejected(state, SetEvent.meta_field(2, "task_id", 7)).code is RejectCode.INVALID_RESULT
    # Clearing the error is fine: meta.error may be null.
    assert reduce(state, SetEvent.meta_field(2, "error", None)).model == chat_model(text("a"), error=None)


def test_a_reference_block_cannot_enter_a_legacy_model_but_an_inline_one_can() -> None:
    state = started(text("a"), version="1.0")
    assert rejected(state, SetEvent.whole(2, RefBlock("b", "x"))).code is RejectCode.LEGACY_REFERENCE
    assert reduce(state, SetEvent.whole(2, text("b"))).seq == 2


# ------------------------------------------------------------------------------------------------------- append


def test_append_sets_a_missing_or_null_field_and_concatenates_otherwise() -> None:
    state = started({"id": "a", "type": "text", "content": None}, {"id": "l", "type": "list"})
    state = reduce(state, AppendEvent.to(2, "a", "content", "he"))
    state = reduce(state, AppendEvent.to(3, "a", "content", "llo"))
    state = reduce(state, AppendEvent.to(4, "l", "items", [1]))
    state = reduce(state, AppendEvent.to(5, "l", "items", [2, {"x": 3}]))
    assert state.model is not None
    assert state.model.block("a") == InlineBlock({"id": "a", "type": "text", "content": "hello"})
    assert state.model.block("l") == InlineBlock({"id": "l", "type": "list", "items": [1, 2, {"x": 3}]})


def test_append_of_another_type_is_refused() -> None:
    state = started(text("a", "x"), {"id": "n", "type": "count", "value": 1})
    assert rejected(state, AppendEvent.to(2, "a", "content", ["x"])).code is RejectCode.TYPE_MISMATCH
    assert rejected(state, AppendEvent.to(2, "n", "value", "1")).code is RejectCode.TYPE_MISMATCH


def test_append_creates_a_missing_block_only_from_a_complete_payload() -> None:
    state = started(text("a"))
    error = rejected(state, AppendEvent.to(2, "b", "content", "x"))
    assert error.code is RejectCode.MISSING_BLOCK and "type" in str(error)
    created = reduce(state, AppendEvent.to(2, "b", "content", "x", type="text"))
    assert created.model is not None and created.model.block_ids == ("a", "b")
    assert created.model.block("b") == InlineBlock(text("b", "x"))


# -------------------------------------------------------------------------------------------------------- error


def test_error_sets_meta_error_and_the_stream_stays_open_until_end() -> None:
    state = reduce(started(text("a")), ErrorEvent.of(2, "failed", "boom", detail={"step": 3}))
    assert state.model is not None and state.model.error is not None
    assert (state.model.error.code, state.model.error.message, state.model.error.detail) == (
        "failed",
        "boom",
        {"step": 3},
    )
    assert not state.ended
    assert reduce(state, EndEvent(seq=3)).ended


# ---------------------------------------------------------------------------------------------------- immutability


def test_reduce_never_mutates_its_inputs_and_the_result_shares_nothing_mutable_with_the_event() -> None:
    payload: dict[str, Any] = {"id": "l", "type": "list", "items": [{"n": 1}]}
    state = started(text("a"))
    snapshot = state.model.to_json() if state.model else None
    event = {"op": "set", "seq": 2, "block": payload}
    after = reduce(state, event)
    payload["items"][0]["n"] = 999  # the caller keeps mutating its own dict
    assert state.model is not None and state.model.to_json() == snapshot
    assert after.model is not None and after.model.block("l") == InlineBlock(
        {"id": "l", "type": "list", "items": [{"n": 1}]}
    )
    # What the model hands out is a copy, too.
    block = after.model.block("l")
    assert isinstance(block, InlineBlock)
    block.get("items")[0]["n"] = 5
    after.model.meta["x"] = 1
    assert after.model.block("l") == InlineBlock({"id": "l", "type": "list", "items": [{"n": 1}]})
    assert after.model.meta == {}
    with pytest.raises(AttributeError):
        after.model._blocks = ()


def test_fold_starts_from_the_first_events_stream() -> None:
    state = fold([StartEvent(seq=1, model=chat_model(), stream_id="s"), EndEvent(seq=2, stream_id="s")])
    assert state.stream_id == "s" and state.ended
    assert fold([]) == StreamState()


# ------------------------------------------------------------------------------------------------------- resume


def _timeline() -> list[Any]:
    return [
        StartEvent(seq=1, model=chat_model()),
        SetEvent.whole(2, text("a", "He")),
        PingEvent(seq=2),
        AppendEvent.to(3, "a", "content", "llo"),
        SetEvent.meta_field(5, "status", "done"),
        EndEvent(seq=6),
    ]


def test_resume_folds_the_covered_part_into_one_start() -> None:
    events = _timeline()
    full = fold(events)
    delivery = resume(events, after_seq=3)
    assert [e.op.value for e in delivery] == ["start", "set", "end"]
    assert isinstance(delivery[0], StartEvent) and delivery[0].seq == 3
    assert fold(delivery) == full
    # Appending the resumed delivery to a consumer that is already at the cursor changes nothing either.
    assert fold(delivery, fold(events[:4])) == full


def test_resume_of_an_ended_stream_is_start_and_end() -> None:
    delivery = resume(_timeline(), after_seq=6)
    assert [(e.op.value, e.seq) for e in delivery] == [("start", 6), ("end", 6)]
    assert fold(delivery) == fold(_timeline())


def test_resume_without_a_cursor_or_before_the_start_replays_the_timeline_without_pings() -> None:
    events = _timeline()
    assert resume(events, after_seq=None) == [e for e in events if not isinstance(e, PingEvent)]
    assert resume(events, after_seq=0) == [e for e in events if not isinstance(e, PingEvent)]


def test_models_compare_by_content() -> None:
    assert chat_model(text("a")) == Model(biz="chat", blocks=[text("a")])
    assert chat_model(text("a")) != chat_model(text("b"))
