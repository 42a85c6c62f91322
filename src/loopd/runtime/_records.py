"""What the runtime reads from loop-server, as frozen records parsed from its JSON.

Owns: ``Message``, ``Conversation``, ``TaskContext``, ``TaskSummary``, ``Sent``, ``Registration``, ``CallState``,
``QuestionState`` and their parsers. Must not do: I/O. Unknown fields are ignored (a newer server may add some);
a missing required field is ``InvalidResponse`` (a ``ValueError``): the server is not the one this runtime speaks to.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Literal

from ._errors import RuntimeApiError

TERMINAL_PHASES: Final = frozenset({"succeeded", "failed", "cancelled", "timed_out", "unknown"})
"""Harness call phases that never change again."""


class InvalidResponse(RuntimeApiError, ValueError):
    """An answer of the server lacks a field this runtime needs (a server of another version)."""


def _field(body: Mapping[str, Any], name: str) -> Any:
    try:
        return body[name]
    except (KeyError, TypeError) as exc:
        raise InvalidResponse(f"the server's answer has no {name!r}") from exc


def _time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


def text_of(content: Mapping[str, Any] | None) -> str:
    """The text blocks of an AgentUE model, joined with blank lines (what a person reads as the message)."""
    if not isinstance(content, Mapping):
        return ""
    parts = [
        block["content"]
        for block in content.get("blocks") or ()
        if isinstance(block, Mapping) and block.get("type") == "text" and isinstance(block.get("content"), str)
    ]
    return "\n\n".join(part for part in parts if part)


@dataclass(frozen=True, slots=True)
class Message:
    """One visible message: its header, its AgentUE ``content``, and ``text`` (its text blocks joined)."""

    id: str
    conversation_id: str
    task_id: str | None
    kind: str
    """``user``, ``operator`` or ``harness``: who wrote it."""
    key: str
    purpose: str
    """``input``, ``response``, ``human_request``, ``human_reply`` or ``output``."""
    status: str
    """``streaming``, ``completed``, ``failed``, ``cancelled`` or ``expired``."""
    content: Mapping[str, Any]
    text: str
    reply_to_message_id: str | None = None
    revision: int = 0
    created_at: datetime | None = None

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> Message:
        content = body.get("content")
        content = content if isinstance(content, Mapping) else {}
        return cls(
            id=str(_field(body, "id")),
            conversation_id=str(_field(body, "conversation_id")),
            task_id=body.get("task_id"),
            kind=str(_field(body, "kind")),
            key=str(_field(body, "key")),
            purpose=str(_field(body, "purpose")),
            status=str(_field(body, "status")),
            content=content,
            text=text_of(content),
            reply_to_message_id=body.get("reply_to_message_id"),
            revision=int(body.get("revision") or 0),
            created_at=_time(body.get("created_at")),
        )


@dataclass(frozen=True, slots=True)
class Conversation:
    """A conversation: a user's (``actor_kind`` user), or a Task's work conversation (``task_id`` set)."""

    id: str
    name: str
    actor_kind: str
    actor_key: str
    task_id: str | None = None
    created_at: datetime | None = None

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> Conversation:
        return cls(
            id=str(_field(body, "id")),
            name=str(body.get("name") or ""),
            actor_kind=str(_field(body, "actor_kind")),
            actor_key=str(_field(body, "actor_key")),
            task_id=body.get("task_id"),
            created_at=_time(body.get("created_at")),
        )


@dataclass(frozen=True, slots=True)
class TaskContext:
    """What a responder needs to answer a Task: the question (``input``), the answer being written
    (``response``), the conversation, and its history through the input (``has_earlier``: older messages exist)."""

    task_id: str
    conversation: Conversation
    input: Message
    response: Message
    history: tuple[Message, ...]
    has_earlier: bool
    messages: tuple[Message, ...] | None = None
    """With ``task.get(id, messages=N)``: the first N of the Task's own messages (as ``task.messages`` pages them),
    read in the same snapshot as the rest; None when not asked for."""
    more_messages: bool = False
    """Whether the Task has more messages than ``messages`` holds (page on with ``task.messages``)."""

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> TaskContext:
        own = body.get("messages")
        return cls(
            task_id=str(_field(body, "task_id")),
            conversation=Conversation.from_json(_field(body, "conversation")),
            input=Message.from_json(_field(body, "input")),
            response=Message.from_json(_field(body, "response")),
            history=tuple(Message.from_json(m) for m in body.get("history") or ()),
            has_earlier=bool(body.get("has_earlier")),
            messages=None if own is None else tuple(Message.from_json(m) for m in own),
            more_messages=bool(body.get("more_messages")),
        )


@dataclass(frozen=True, slots=True)
class TaskSummary:
    """One open Task of a responder, as ``task.list`` returns it."""

    task_id: str
    conversation_id: str
    input_message_id: str
    response_message_id: str
    target_kind: str
    target_key: str
    delivery_state: str
    created_at: datetime | None = None

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> TaskSummary:
        target = body.get("target") or {}
        return cls(
            task_id=str(_field(body, "task_id")),
            conversation_id=str(_field(body, "conversation_id")),
            input_message_id=str(_field(body, "input_message_id")),
            response_message_id=str(_field(body, "response_message_id")),
            target_kind=str(_field(target, "kind")),
            target_key=str(_field(target, "key")),
            delivery_state=str(body.get("delivery_state") or ""),
            created_at=_time(body.get("created_at")),
        )


@dataclass(frozen=True, slots=True)
class Sent:
    """A question ``chat.send`` stored: its Task, its input, and the response its responder will write."""

    task_id: str
    conversation_id: str
    input: Message
    response: Message
    cursor: int

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> Sent:
        return cls(
            task_id=str(_field(body, "task_id")),
            conversation_id=str(_field(body, "conversation_id")),
            input=Message.from_json(_field(body, "input")),
            response=Message.from_json(_field(body, "response")),
            cursor=int(body.get("cursor") or 0),
        )


@dataclass(frozen=True, slots=True)
class Registration:
    """A responder's registration: listed in ``/v1/actors`` until ``expires_at`` unless renewed."""

    kind: str
    key: str
    display_name: str
    description: str
    expires_at: datetime | None
    lease_seconds: float

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> Registration:
        return cls(
            kind=str(_field(body, "kind")),
            key=str(_field(body, "key")),
            display_name=str(body.get("display_name") or ""),
            description=str(body.get("description") or ""),
            expires_at=_time(body.get("expires_at")),
            lease_seconds=float(_field(body, "lease_seconds")),
        )


ToolsProfile = Literal["none", "read", "write"]
"""A harness call's tools in its own workspace: none; read (read_file, list_dir, glob, grep); write (those plus
write_file, edit_file, bash)."""
TOOLS_PROFILES: Final[tuple[ToolsProfile, ...]] = ("none", "read", "write")


@dataclass(frozen=True, slots=True)
class CallState:
    """A harness call as the server has it now. ``result`` is ``{"format": "text"|"json", "content": ...}`` once
    it succeeded; ``text`` is that result as text (JSON content serialized); ``error`` is ``{"code", "message"}``
    when it failed, was cancelled or timed out."""

    id: str
    phase: str
    result: Any
    error: Mapping[str, Any] | None
    terminal: bool
    text: str
    owner_uid: str = ""
    effect_key: str = ""
    target: str = ""
    conversation_id: str | None = None
    message_id: str | None = None
    cancel_requested: bool = False
    workspace: str | None = None
    """Where the call works, relative to the server's workspaces root (``<kind>/<key>/<id>``); None: its target's."""
    tools: str | None = None
    """Its tools profile (``none`` | ``read`` | ``write``); None: its target's own tools."""

    @property
    def succeeded(self) -> bool:
        """Whether the call ended with a result."""
        return self.phase == "succeeded"

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> CallState:
        phase = str(_field(body, "phase"))
        result = body.get("result")
        error = body.get("error")
        return cls(
            id=str(_field(body, "id")),
            phase=phase,
            result=result,
            error=error if isinstance(error, Mapping) else None,
            terminal=phase in TERMINAL_PHASES,
            text=_result_text(result),
            owner_uid=str(body.get("owner_uid") or ""),
            effect_key=str(body.get("effect_key") or ""),
            target=str(body.get("target") or ""),
            conversation_id=body.get("conversation_id"),
            message_id=body.get("message_id"),
            cancel_requested=bool(body.get("cancel_requested")),
            workspace=body.get("workspace"),
            tools=body.get("tools"),
        )


def _result_text(result: Any) -> str:
    if result is None:
        return ""
    if isinstance(result, Mapping) and "content" in result:
        content = result["content"]
        if isinstance(content, str):
            return content
        return json.dumps(content, ensure_ascii=False)
    return result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)


@dataclass(frozen=True, slots=True)
class QuestionState:
    """An Ask or Confirm as the server has it now: ``status`` is ``pending`` until its one outcome (``success``
    with ``value``, ``dismissed``, ``timeout``, ``failure`` with ``reason``)."""

    message_id: str
    task_id: str
    conversation_id: str
    effect_key: str
    type: str
    title: str
    prompt: str
    status: str
    value: Any
    reason: str | None
    due_at: datetime | None
    created: bool

    @property
    def terminal(self) -> bool:
        """Whether the question has its one outcome."""
        return self.status != "pending"

    @property
    def accepted(self) -> bool:
        """A confirm that was accepted (``success`` with ``accepted``)."""
        return self.status == "success" and self.value == "accepted"

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> QuestionState:
        return cls(
            message_id=str(_field(body, "message_id")),
            task_id=str(_field(body, "task_id")),
            conversation_id=str(_field(body, "conversation_id")),
            effect_key=str(_field(body, "effect_key")),
            type=str(_field(body, "type")),
            title=str(body.get("title") or ""),
            prompt=str(body.get("prompt") or ""),
            status=str(_field(body, "status")),
            value=body.get("value"),
            reason=body.get("reason"),
            due_at=_time(body.get("due_at")),
            created=bool(body.get("created")),
        )
