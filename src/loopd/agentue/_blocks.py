"""Typed views of the block types loopd uses: text, tool, artifact, progress, result, ask, confirm, human_reply.

The protocol itself only requires `id` and `type` (the reducer enforces nothing more, so a snapshot folds the same
way in every AgentUE implementation). These pydantic models are for producers and renderers: building a block
with the right fields (`TextBlock(id="answer", content="Hi").to_block()`) and reading one back with its fields
checked (`typed_block(block)`). Every view accepts extra domain fields and keeps them.

Human blocks follow loopd's Human Ask / Confirm contract: a request is `pending` until exactly one outcome —
`success` (with a value), `dismissed`, `timeout` or `failure` (with a reason). Ask offers choices and/or free text;
Confirm answers `accepted` or `declined` under custom labels.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    model_validator,
)

from loopd.agentue._errors import AgentUEValidationError
from loopd.agentue._model import Block, InlineBlock, Model, RefBlock, parse_block

NonEmptyStr = Annotated[StrictStr, Field(min_length=1)]
HumanStatus = Literal["pending", "success", "dismissed", "timeout", "failure"]
HumanOutcome = Literal["success", "dismissed", "timeout", "failure"]
Role = Literal["user", "operator", "harness"]
"""The only public roles."""


class TypedBlock(BaseModel):
    """Fields every inline block has; subclasses fix `type`."""

    model_config = ConfigDict(frozen=True, extra="allow")
    block_type: ClassVar[str] = ""

    id: NonEmptyStr
    type: NonEmptyStr
    parent_id: NonEmptyStr | None = None
    group_id: NonEmptyStr | None = None

    @model_validator(mode="after")
    def _no_reference(self) -> Self:
        if self.model_extra and "ref" in self.model_extra:
            raise ValueError("ref is reserved for reference blocks")
        return self

    def to_json(self) -> dict[str, Any]:
        """The block's JSON: the fields that were given, plus `type`."""
        body = self.model_dump(mode="json", exclude_unset=True)
        return {"id": self.id, "type": self.type, **body}

    def to_block(self) -> InlineBlock:
        return InlineBlock(self.to_json())


class TextBlock(TypedBlock):
    """Visible text. `role` is one of the public roles when given."""

    block_type: ClassVar[str] = "text"
    type: Literal["text"] = "text"
    content: StrictStr = ""
    role: Role | None = None
    format: StrictStr | None = None


class ToolBlock(TypedBlock):
    """A tool call and its progress: `name`, `input`, `status` (running, completed, failed, …), `output`.

    Producers may also nest these under `tool` (`{"tool": {"status": ..., "result": ...}}`).
    """

    block_type: ClassVar[str] = "tool"
    type: Literal["tool"] = "tool"
    name: StrictStr | None = None
    input: JsonValue = None
    status: StrictStr | None = None
    output: JsonValue = None
    tool: dict[str, JsonValue] | None = None


class ArtifactBlock(TypedBlock):
    """A produced file or object: where it is and what it is."""

    block_type: ClassVar[str] = "artifact"
    type: Literal["artifact"] = "artifact"
    name: StrictStr | None = None
    uri: StrictStr | None = None
    content_type: StrictStr | None = None
    size: Annotated[StrictInt, Field(ge=0)] | None = None
    sha256: StrictStr | None = None
    content: JsonValue = None


class ProgressBlock(TypedBlock):
    """Progress of long work: a message, optional `current`/`total`, and `through_id` (the last input seen)."""

    block_type: ClassVar[str] = "progress"
    type: Literal["progress"] = "progress"
    content: StrictStr | None = None
    through_id: StrictStr | None = None
    current: Annotated[StrictInt, Field(ge=0)] | None = None
    total: Annotated[StrictInt, Field(ge=0)] | None = None

    @model_validator(mode="after")
    def _within_total(self) -> Self:
        if self.current is not None and self.total is not None and self.current > self.total:
            raise ValueError(f"current {self.current} exceeds total {self.total}")
        return self


class ResultBlock(TypedBlock):
    """The result of a harness call: `format` json or text; a text result's `content` is a string."""

    block_type: ClassVar[str] = "result"
    type: Literal["result"] = "result"
    format: Literal["json", "text"]
    content: JsonValue

    @model_validator(mode="after")
    def _text_is_string(self) -> Self:
        if self.format == "text" and not isinstance(self.content, str):
            raise ValueError("a text result's content must be a string")
        return self


class Choice(BaseModel):
    """One option of an Ask."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    value: NonEmptyStr
    label: NonEmptyStr
    description: StrictStr | None = None


class _HumanRequest(TypedBlock):
    title: StrictStr | None = None
    prompt: NonEmptyStr
    status: HumanStatus = "pending"
    value: StrictStr | None = None
    reason: StrictStr | None = None

    def _check_outcome(self, allowed: frozenset[str] | None, free_text: bool) -> None:
        if self.status == "success":
            if not self.value:
                raise ValueError("a successful answer carries a non-empty value")
            if allowed is not None and self.value not in allowed and not free_text:
                raise ValueError(f"value {self.value!r} is not one of {sorted(allowed)}")
        elif self.value is not None:
            raise ValueError(f"a {self.status} request carries no value")
        if self.status == "failure" and not self.reason:
            raise ValueError("a failed request carries a reason")


class AskBlock(_HumanRequest):
    """A question: `choices` and/or free text (`allow_other`); an explicit empty choice list is invalid."""

    block_type: ClassVar[str] = "ask"
    type: Literal["ask"] = "ask"
    choices: tuple[Choice, ...] | None = None
    allow_other: StrictBool = False

    @model_validator(mode="after")
    def _valid_choices(self) -> Self:
        if self.choices is not None:
            if not self.choices:
                raise ValueError("choices, when given, may not be empty")
            values = [choice.value for choice in self.choices]
            if len(set(values)) != len(values):
                raise ValueError("choice values must be unique")
        elif not self.allow_other:
            raise ValueError("an ask needs choices or allow_other")
        allowed = None if self.choices is None else frozenset(choice.value for choice in self.choices)
        self._check_outcome(allowed, self.allow_other)
        return self


class ConfirmBlock(_HumanRequest):
    """Accept or decline under custom labels; the value is always `accepted` or `declined`."""

    block_type: ClassVar[str] = "confirm"
    type: Literal["confirm"] = "confirm"
    confirm_label: NonEmptyStr | None = None
    decline_label: NonEmptyStr | None = None
    ANSWERS: ClassVar[frozenset[str]] = frozenset({"accepted", "declined"})

    @model_validator(mode="after")
    def _no_choices(self) -> Self:
        extra = self.model_extra or {}
        for name in ("choices", "allow_other"):
            if name in extra:
                raise ValueError(f"a confirm takes no {name}")
        self._check_outcome(self.ANSWERS, free_text=False)
        return self


class HumanReplyBlock(TypedBlock):
    """The final state of a Human request, bound to it only through `reply_to_message_id`."""

    block_type: ClassVar[str] = "human_reply"
    type: Literal["human_reply"] = "human_reply"
    reply_to_message_id: NonEmptyStr | None = None
    outcome: HumanOutcome
    value: StrictStr | None = None
    reason: StrictStr | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.outcome == "success" and not self.value:
            raise ValueError("a success reply carries a non-empty value")
        if self.outcome != "success" and self.value is not None:
            raise ValueError(f"a {self.outcome} reply carries no value")
        if self.outcome == "failure" and not self.reason:
            raise ValueError("a failure reply carries a reason")
        return self


BLOCK_TYPES: Mapping[str, type[TypedBlock]] = {
    cls.block_type: cls
    for cls in (
        TextBlock,
        ToolBlock,
        ArtifactBlock,
        ProgressBlock,
        ResultBlock,
        AskBlock,
        ConfirmBlock,
        HumanReplyBlock,
    )
}
"""The typed view for each block type loopd knows."""


def _first_error(exc: ValidationError) -> tuple[str, str]:
    error = exc.errors(include_url=False)[0]
    where = ".".join(str(part) for part in error["loc"])
    return where, error["msg"]


def typed_block(block: Block | Mapping[str, Any], *, path: str = "block") -> TypedBlock | InlineBlock | RefBlock:
    """The typed view of a block of a known type; other inline blocks and references are returned as they are.

    Raises `AgentUEValidationError` when a known type's fields are wrong.
    """
    if not isinstance(block, InlineBlock | RefBlock):
        block = parse_block(block, path)
    if isinstance(block, RefBlock):
        return block
    view = BLOCK_TYPES.get(block.type)
    if view is None:
        return block
    try:
        return view.model_validate(block.to_json())
    except ValidationError as exc:
        where, message = _first_error(exc)
        raise AgentUEValidationError(f"{path}.{where}" if where else path, f"{block.type} block: {message}") from exc


def validate_model(data: Any, *, typed_blocks: bool = False) -> Model:
    """Validate a JSON model (`Model.from_json`); with `typed_blocks`, also check every block of a known type."""
    model = Model.from_json(data)
    if typed_blocks:
        for index, block in enumerate(model.blocks):
            typed_block(block, path=f"model.blocks[{index}]")
    return model
