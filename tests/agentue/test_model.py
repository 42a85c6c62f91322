"""Model and block validation beyond the conformance files; reference resolution; typed block views."""

from __future__ import annotations

from typing import Any

import pytest

from loopd.agentue import (
    AgentUEValidationError,
    AskBlock,
    Choice,
    ConfirmBlock,
    ErrorInfo,
    HumanReplyBlock,
    InlineBlock,
    Model,
    ProgressBlock,
    RefBlock,
    ResultBlock,
    TextBlock,
    ToolBlock,
    typed_block,
    validate_model,
)


def model(**overrides: Any) -> dict[str, Any]:
    return {"version": "1.1", "biz": "chat", "meta": {}, "blocks": []} | overrides


INVALID: list[tuple[str, Any, str]] = [
    ("not-an-object", [], "model"),
    ("missing-blocks", {"version": "1.1", "biz": "chat", "meta": {}}, "model"),
    ("unknown-top-level", model(extra=1), "model"),
    ("numeric-version", model(version=1.1), "model.version"),
    ("empty-biz", model(biz=""), "model.biz"),
    ("meta-array", model(meta=[]), "model.meta"),
    ("meta-error-string", model(meta={"error": "boom"}), "model.meta.error"),
    ("meta-error-no-message", model(meta={"error": {"code": "x"}}), "model.meta.error.message"),
    ("meta-task-id-number", model(meta={"task_id": 1}), "model.meta.task_id"),
    ("meta-stats-string", model(meta={"stats": "x"}), "model.meta.stats"),
    ("blocks-object", model(blocks={}), "model.blocks"),
    ("block-not-object", model(blocks=["x"]), "model.blocks[0]"),
    ("block-empty-type", model(blocks=[{"id": "a", "type": ""}]), "model.blocks[0].type"),
    ("block-numeric-id", model(blocks=[{"id": 1, "type": "t"}]), "model.blocks[0].id"),
    ("block-empty-parent", model(blocks=[{"id": "a", "type": "t", "parent_id": ""}]), "model.blocks[0].parent_id"),
    ("block-numeric-group", model(blocks=[{"id": "a", "type": "t", "group_id": 2}]), "model.blocks[0].group_id"),
    (
        "duplicate-ids",
        model(blocks=[{"id": "a", "type": "t"}, {"id": "b", "type": "t"}, {"id": "a", "ref": "x"}]),
        "model.blocks[2].id",
    ),
]


@pytest.mark.parametrize(("data", "path"), [pytest.param(d, p, id=name) for name, d, p in INVALID])
def test_invalid_models_name_the_offending_field(data: Any, path: str) -> None:
    with pytest.raises(AgentUEValidationError) as info:
        Model.from_json(data)
    assert info.value.path == path, str(info.value)


def test_extension_points_are_preserved_exactly() -> None:
    data = model(
        version="1.0",
        meta={"error": None, "task_id": "t1", "stats": {"tokens": 3}, "custom": {"x": [1, None]}},
        blocks=[
            {"id": "q", "type": "text", "content": "hi", "role": "user", "parent_id": None, "x-domain": {"a": 1}},
            {"id": "c", "type": "chart", "group_id": "g", "parent_id": "q"},
        ],
    )
    parsed = Model.from_json(data)
    assert parsed.to_json() == data
    assert parsed.error is None
    assert parsed.children("q") == (parsed.blocks[1],)
    assert parsed.group("g") == (parsed.blocks[1],)


def test_parent_ids_need_not_resolve_because_blocks_stream_in_any_order() -> None:
    parsed = Model.from_json(model(blocks=[{"id": "child", "type": "text", "parent_id": "later"}]))
    assert parsed.children("later") == (parsed.blocks[0],)


def test_constructor_and_builders_validate() -> None:
    built = Model(
        biz="chat", meta={"trace_id": "tr"}, blocks=[InlineBlock.of("a", "text", content="x"), RefBlock("b", "r")]
    )
    assert built.version == "1.1" and built.block_ids == ("a", "b")
    assert built.empty_like() == Model(biz="chat")
    with pytest.raises(AgentUEValidationError):
        Model(biz="chat", version="1.0", blocks=[RefBlock("b", "r")])
    with pytest.raises(AgentUEValidationError):
        InlineBlock({"id": "a", "type": "text", "ref": "x"})
    with pytest.raises(AgentUEValidationError):
        RefBlock("b", "")
    with pytest.raises(AgentUEValidationError):
        ErrorInfo(code="c", message=3)  # type: ignore[arg-type]


def test_meta_error_has_a_typed_view() -> None:
    parsed = Model.from_json(model(meta={"error": {"code": "c", "message": "m", "trace_id": "t", "extra": 1}}))
    assert parsed.error == ErrorInfo(code="c", message="m", trace_id="t")


# ---------------------------------------------------------------------------------------------------- references


def _with_refs() -> Model:
    return Model.from_json(
        model(
            blocks=[
                {"id": "a", "type": "text", "content": "1"},
                {"id": "b", "ref": "store://b"},
                {"id": "c", "ref": "store://c"},
            ]
        )
    )


def test_resolve_replaces_references_in_place() -> None:
    store = {"store://b": {"id": "b", "type": "text", "content": "2"}, "store://c": {"id": "c", "type": "tool"}}
    seen: list[str] = []

    def lookup(block: RefBlock) -> dict[str, Any]:
        seen.append(block.ref)
        return store[block.ref]

    original = _with_refs()
    resolved = original.resolve(lookup)
    assert seen == ["store://b", "store://c"]
    assert resolved.block_ids == ("a", "b", "c") and resolved.references() == ()
    assert original.references() == (RefBlock("b", "store://b"), RefBlock("c", "store://c"))
    assert resolved.resolve(lookup) is resolved


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (None, "not an empty body"),
        ({}, "not an empty body"),
        ({"id": "b", "ref": "again"}, "still carries ref"),
        ({"id": "other", "type": "text"}, "expected 'b'"),
        ({"id": "b"}, "type"),
    ],
)
def test_a_failed_resolution_is_an_error_not_an_empty_block(body: Any, message: str) -> None:
    with pytest.raises(AgentUEValidationError, match=message):
        _with_refs().resolve(lambda block: body if block.id == "b" else {"id": block.id, "type": "x"})


def test_resolver_errors_propagate() -> None:
    def broken(block: RefBlock) -> dict[str, Any]:
        raise LookupError(block.ref)

    with pytest.raises(LookupError, match="store://b"):
        _with_refs().resolve(broken)


# --------------------------------------------------------------------------------------------------- typed views


def test_typed_views_build_and_read_blocks() -> None:
    answer = TextBlock(id="answer", content="Hi", role="operator")
    assert answer.to_json() == {"id": "answer", "type": "text", "content": "Hi", "role": "operator"}
    assert typed_block(answer.to_block()) == answer
    tool = typed_block({"id": "t", "type": "tool", "tool": {"status": "running"}, "vendor": {"x": 1}})
    assert isinstance(tool, ToolBlock) and tool.tool == {"status": "running"}
    assert tool.to_json()["vendor"] == {"x": 1}  # extension fields survive
    assert typed_block({"id": "x", "type": "chart"}) == InlineBlock({"id": "x", "type": "chart"})
    assert typed_block({"id": "x", "ref": "r"}) == RefBlock("x", "r")


def test_human_blocks_follow_the_ask_confirm_contract() -> None:
    ask = AskBlock(id="q", prompt="Which?", choices=(Choice(value="a", label="A"),), allow_other=True)
    assert ask.status == "pending"
    answered = typed_block({**ask.to_json(), "status": "success", "value": "free text"})
    assert isinstance(answered, AskBlock) and answered.value == "free text"
    confirm = typed_block(
        {
            "id": "c",
            "type": "confirm",
            "prompt": "Go?",
            "confirm_label": "Ship it",
            "status": "success",
            "value": "declined",
        }
    )
    assert isinstance(confirm, ConfirmBlock)
    reply = HumanReplyBlock(id="r", reply_to_message_id="m1", outcome="dismissed")
    assert reply.to_json() == {"id": "r", "type": "human_reply", "reply_to_message_id": "m1", "outcome": "dismissed"}


INVALID_TYPED: list[tuple[str, dict[str, Any]]] = [
    ("text-content-number", {"id": "a", "type": "text", "content": 1}),
    ("text-private-role", {"id": "a", "type": "text", "role": "assistant"}),
    ("result-no-format", {"id": "result", "type": "result", "content": "x"}),
    ("result-text-not-string", {"id": "result", "type": "result", "format": "text", "content": {"a": 1}}),
    ("progress-over-total", {"id": "p", "type": "progress", "current": 3, "total": 2}),
    ("ask-no-choices", {"id": "q", "type": "ask", "prompt": "?"}),
    ("ask-empty-choices", {"id": "q", "type": "ask", "prompt": "?", "choices": [], "allow_other": True}),
    (
        "ask-duplicate-values",
        {
            "id": "q",
            "type": "ask",
            "prompt": "?",
            "choices": [{"value": "a", "label": "A"}, {"value": "a", "label": "B"}],
        },
    ),
    ("ask-empty-label", {"id": "q", "type": "ask", "prompt": "?", "choices": [{"value": "a", "label": ""}]}),
    (
        "ask-undeclared-value",
        {
            "id": "q",
            "type": "ask",
            "prompt": "?",
            "choices": [{"value": "a", "label": "A"}],
            "status": "success",
            "value": "b",
        },
    ),
    (
        "ask-timeout-with-value",
        {"id": "q", "type": "ask", "prompt": "?", "allow_other": True, "status": "timeout", "value": "x"},
    ),
    ("confirm-with-choices", {"id": "c", "type": "confirm", "prompt": "?", "choices": [{"value": "a", "label": "A"}]}),
    ("confirm-other-value", {"id": "c", "type": "confirm", "prompt": "?", "status": "success", "value": "yes"}),
    ("confirm-failure-no-reason", {"id": "c", "type": "confirm", "prompt": "?", "status": "failure"}),
    ("reply-success-no-value", {"id": "r", "type": "human_reply", "outcome": "success"}),
    ("reply-unknown-outcome", {"id": "r", "type": "human_reply", "outcome": "maybe"}),
    ("artifact-negative-size", {"id": "f", "type": "artifact", "size": -1}),
]


@pytest.mark.parametrize("data", [pytest.param(d, id=name) for name, d in INVALID_TYPED])
def test_typed_views_refuse_wrong_fields(data: dict[str, Any]) -> None:
    InlineBlock(data)  # valid for the protocol ...
    with pytest.raises(AgentUEValidationError) as info:
        typed_block(data)  # ... but not for its block type
    assert info.value.path.startswith("block")
    with pytest.raises(AgentUEValidationError) as in_model:
        validate_model(model(blocks=[data]), typed_blocks=True)
    assert in_model.value.path.startswith("model.blocks[0]")
    assert validate_model(model(blocks=[data])).blocks[0] == InlineBlock(data)


def test_a_valid_result_and_progress() -> None:
    assert ResultBlock(id="result", format="json", content={"ok": True}).to_json()["content"] == {"ok": True}
    assert ProgressBlock(id="p", content="2 of 3", current=2, total=3).to_block().type == "progress"
