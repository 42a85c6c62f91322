"""Request and response bodies of the chat and Task routes (pydantic, so the OpenAPI document is the contract).

A message is ``{id, conversation_id, task_id, kind, key, reply_to_message_id, purpose, status, revision,
content, created_at, updated_at}``; its *header* is the same without ``content`` and ``revision``.
Must not do: I/O.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Final, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from loopd.server.storage import Conversation, ConversationFork, Message

MAX_TEXT: Final = 200_000
MAX_KEY: Final = 200
MAX_EVENTS: Final = 1000


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Response(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --- requests ----------------------------------------------------------------------------------------------


class CreateConversationRequest(_Request):
    name: str = Field(default="", max_length=MAX_KEY)


class RenameConversationRequest(_Request):
    name: str = Field(max_length=MAX_KEY, description="The new name (empty: no name).")


class ConversationModeRequest(_Request):
    mode: Literal["build", "plan"] | None = Field(
        description="The mode the conversation's next built-in harness calls start in (the standard harness's modes: "
        "build = every tool, plan = read-only tools); null: each harness's own (its configured mode)."
    )


class Target(_Request):
    kind: Literal["operator", "harness"]
    key: str = Field(min_length=1, max_length=MAX_KEY)


class ChatRequestBody(_Request):
    """A question to ``target`` (``content``, an AgentUE model, or ``text``), or with ``task_id`` only: observe an
    existing question of this conversation."""

    target: Target | None = None
    content: dict[str, Any] | None = None
    text: str | None = Field(default=None, min_length=1, max_length=MAX_TEXT)
    task_id: str | None = Field(default=None, min_length=1, max_length=MAX_KEY)

    @model_validator(mode="after")
    def _one_mode(self) -> Self:
        if self.task_id is not None:
            if self.content is not None or self.text is not None:
                raise ValueError("with task_id the request only observes: send no content or text")
            return self
        if self.target is None:
            raise ValueError("target is required (or task_id, to observe an existing question)")
        if (self.content is None) == (self.text is None):
            raise ValueError("send exactly one of content and text")
        return self


class EmitRequest(_Request):
    events: list[dict[str, Any]] = Field(min_length=1, max_length=MAX_EVENTS)


class CompletionError(_Request):
    code: str = Field(min_length=1, max_length=MAX_KEY)
    message: str = Field(default="", max_length=10_000)


class CompleteRequest(_Request):
    error: CompletionError | None = None
    events: list[dict[str, Any]] | None = Field(
        default=None,
        max_length=MAX_EVENTS,
        description="Last ``set`` / ``append`` events of the response (e.g. the answer), applied in the completion's "
        "own transaction: the answer and the end land together, or neither does.",
    )


# --- responses ---------------------------------------------------------------------------------------------


class ForkedFrom(_Response):
    """Where a forked conversation came from: the parent conversation, the message chosen in it, and the mode."""

    conversation_id: str
    message_id: str
    mode: Literal["retry", "edit"]


class ConversationBody(_Response):
    id: str
    name: str
    actor_kind: Literal["user", "operator", "harness"]
    actor_key: str
    task_id: str | None
    created_at: datetime
    updated_at: datetime
    title: str = ""
    """A short title a background run writes after the first question ("" until it has)."""
    summary: str = ""
    forked_from: ForkedFrom | None = None
    """For a fork ("retry from here", "edit and resend"): its parent conversation and message; else null."""
    mode: str | None = None
    """The mode its next built-in harness calls start in (``PUT …/mode``); null: each harness's own."""


class MessageHeader(_Response):
    id: str
    conversation_id: str
    task_id: str | None
    kind: Literal["user", "operator", "harness"]
    key: str
    reply_to_message_id: str | None
    purpose: Literal["input", "response", "human_request", "human_reply", "output"]
    status: Literal["streaming", "completed", "failed", "cancelled", "expired"]
    created_at: datetime


class MessageBody(MessageHeader):
    revision: int
    content: dict[str, Any]
    updated_at: datetime


class ConversationList(_Response):
    data: list[ConversationBody]
    next_after: str | None = Field(description="Pass as ?after= for the next page; null on the last page.")


class MessageList(_Response):
    data: list[MessageBody]
    next_after: str | None = Field(description="Pass as ?after= for the next page; null on the last page.")


class ChatAccepted(_Response):
    task_id: str
    conversation_id: str
    input: MessageBody
    response: MessageBody
    cursor: int = Field(description="Conversation cursor just before this question: stream with ?after= it.")


class SnapshotBody(_Response):
    conversation: ConversationBody
    messages: list[MessageBody]
    cursor: int = Field(description="The content is current through this cursor; resume the stream after it.")


class TaskContextBody(_Response):
    task_id: str
    conversation: ConversationBody
    input: MessageBody
    response: MessageBody
    history: list[MessageBody]
    history_from_message_id: str | None
    has_earlier: bool
    messages: list[MessageBody] | None = None
    """With ``?messages=N``: the first N of the Task's own messages (both conversations, id order)."""
    more_messages: bool = False


class EmitAccepted(_Response):
    message_id: str
    seq: int
    cursor: int
    revision: int


class CompletionBody(_Response):
    task_id: str
    delivery_state: Literal["", "closing", "closed"]
    response: MessageBody


# --- builders ----------------------------------------------------------------------------------------------


def conversation_body(conversation: Conversation, origin: ConversationFork | None = None) -> ConversationBody:
    """The wire shape of ``conversation``; ``origin``: its fork origin, when it is a fork."""
    forked_from = (
        ForkedFrom(conversation_id=origin.parent_conversation_id, message_id=origin.parent_message_id, mode=origin.mode)
        if origin is not None
        else None
    )
    return ConversationBody(
        forked_from=forked_from,
        id=conversation.id,
        name=conversation.name,
        actor_kind=conversation.actor_kind,
        actor_key=conversation.actor_key,
        task_id=conversation.task_id,
        created_at=conversation.created_at,
        updated_at=conversation.updated_at,
        title=conversation.title,
        summary=conversation.summary,
        mode=conversation.mode or None,
    )


def message_header(message: Message) -> dict[str, Any]:
    """The message without its content, as JSON (the ``message`` of a stream's start and end events)."""
    return MessageHeader(
        id=message.id,
        conversation_id=message.conversation_id,
        task_id=message.task_id,
        kind=message.kind,
        key=message.key,
        reply_to_message_id=message.reply_to_message_id,
        purpose=message.purpose,
        status=message.status,
        created_at=message.created_at,
    ).model_dump(mode="json")


def message_body(message: Message) -> MessageBody:
    return MessageBody(
        id=message.id,
        conversation_id=message.conversation_id,
        task_id=message.task_id,
        kind=message.kind,
        key=message.key,
        reply_to_message_id=message.reply_to_message_id,
        purpose=message.purpose,
        status=message.status,
        revision=message.revision,
        content=message.content,
        created_at=message.created_at,
        updated_at=message.updated_at,
    )


# --- the operator surface: Tasks per responder, keyed outputs ----------------------------------------------


class OutputRequest(_Request):
    """Speak (``stream`` false: a complete message) or Tell (``stream`` true: a streaming output to emit into)."""

    key: str = Field(min_length=1, max_length=MAX_KEY, description="Client-chosen, unique per Task (idempotency).")
    conversation: Literal["work", "main"] = Field(
        default="work", description="``main``: the Task's user conversation; ``work``: its work conversation."
    )
    stream: bool = False
    text: str | None = Field(default=None, max_length=MAX_TEXT)
    content: dict[str, Any] | None = Field(default=None, description="An AgentUE model (no Human blocks).")
    title: str | None = Field(default=None, max_length=MAX_KEY)

    @model_validator(mode="after")
    def _one_content(self) -> Self:
        if self.text is not None and self.content is not None:
            raise ValueError("send text or content, not both")
        if not self.stream and self.text is None and self.content is None:
            raise ValueError("a complete output (stream=false) needs text or content")
        return self


class OutputEndRequest(_Request):
    error: CompletionError | None = None


class TargetBody(_Response):
    kind: Literal["operator", "harness"]
    key: str


class TaskSummary(_Response):
    task_id: str
    conversation_id: str
    input_message_id: str
    response_message_id: str
    target: TargetBody
    delivery_state: Literal["", "closing", "closed"]
    created_at: datetime


class TaskList(_Response):
    data: list[TaskSummary]
    next_after: str | None = Field(description="Pass as ?after= for the next page; null on the last page.")


class OutputCreated(_Response):
    created: bool = Field(description="False when this repeated a stored output (same key, same parameters).")
    message: MessageBody


class OutputEnded(_Response):
    message: MessageBody


def task_summary(response: Message) -> TaskSummary:
    """A Task as its responder lists it, from the Task's response message."""
    assert response.task_id is not None and response.reply_to_message_id is not None
    return TaskSummary(
        task_id=response.task_id,
        conversation_id=response.conversation_id,
        input_message_id=response.reply_to_message_id,
        response_message_id=response.id,
        target=TargetBody(kind=response.kind, key=response.key),  # type: ignore[arg-type]  # responders only
        delivery_state=response.delivery_state,
        created_at=response.created_at,
    )
