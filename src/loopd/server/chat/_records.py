"""What the chat service returns: plain frozen records (the HTTP layer turns them into JSON)."""

from __future__ import annotations

from dataclasses import dataclass

from loopd.server.storage import Conversation, ConversationFork, Message, MessageEvent


@dataclass(frozen=True, slots=True)
class TaskContext:
    """What a responder needs to answer a Task: its input, its (empty) response, bounded history through the input."""

    task_id: str
    conversation: Conversation
    input: Message
    response: Message
    history: list[Message]
    """The main conversation's messages up to and including the input (the newest ``history_limit``)."""
    has_earlier: bool
    """Whether older messages exist before ``history[0]``."""
    messages: list[Message] | None = None
    """The first messages of the Task itself (both conversations, id order) when asked for, else None."""
    more_messages: bool = False
    """Whether the Task has more messages than ``messages`` holds."""
    fork: ConversationFork | None = None
    """Where the conversation was forked from (None: it is no fork), read in the same snapshot."""

    @property
    def conversation_mode(self) -> str | None:
        """The mode the conversation's built-in harness calls start in (None: each harness's own)."""
        return self.conversation.mode or None


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """A question: the input and response messages sharing one task id."""

    task_id: str
    conversation: Conversation
    input: Message
    response: Message
    cursor: int
    """The conversation cursor just before the question's first event: stream from here to see all of it."""
    opened: tuple[StreamItem, ...] = ()
    """The question's own events as its transaction stored them (its input's start and end, its response's start,
    each with its message's header as that commit left it): the events right after ``cursor``, so a stream from
    there starts with them without reading them back. Empty when not known (`ChatRequests.observe`)."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Every message of a conversation with its content, and the cursor that content is current through."""

    conversation: Conversation
    messages: list[Message]
    cursor: int


@dataclass(frozen=True, slots=True)
class StreamItem:
    """One stored event of a conversation, with its message's header on ``start`` and ``end`` events."""

    event: MessageEvent
    message: Message | None


@dataclass(frozen=True, slots=True)
class StreamPage:
    """One page of a conversation's events, and the conversation's last cursor read *before* the page."""

    items: list[StreamItem]
    end: int
    """Every event through this cursor had committed when the page was read: a short page covers them all."""


@dataclass(frozen=True, slots=True)
class Emitted:
    """Events stored into a response: the message after them and the stored events (seq and cursor each)."""

    message: Message
    events: list[MessageEvent]
