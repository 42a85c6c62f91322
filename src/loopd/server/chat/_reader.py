"""`ConversationReader`: what may be read of conversations (lists, messages, snapshot, a Task's work conversation,
the conversation's event log and cursors) and the live feeds behind the conversation streams.

Visibility: a user conversation is readable by its owner only; a Task's work conversation by the user who asked.
Anything else is "not found" (`readable_conversation`, which ``_requests`` applies too).
Must not do: write anything (chat requests are `ChatRequests`, a responder's writes `TaskApi`), or HTTP.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from loopd.server.chat._feeds import DEFAULT_BUFFER, ConversationFeeds
from loopd.server.chat._records import Snapshot, StreamItem, StreamPage
from loopd.server.http import Identity
from loopd.server.storage import (
    MAX_PAGE,
    Conversation,
    ConversationFork,
    Database,
    Message,
    NotFound,
    Transaction,
)
from loopd.server.streams import TERMINAL_STATUSES, ConversationBus


async def readable_conversation(tx: Transaction, reader: Identity, conversation_id: str) -> Conversation:
    """The conversation, if ``reader`` may see it (see the module docstring); ``NotFound`` otherwise."""
    conversation = await tx.conversations.get(conversation_id)
    if reader.kind == "user":
        if conversation.actor_kind == "user" and conversation.actor_key == reader.key:
            return conversation
        if conversation.actor_kind != "user" and conversation.task_id is not None:
            inputs = await tx.messages.find_by_purpose(conversation.task_id, "input", limit=1)
            if inputs and inputs[0].kind == "user" and inputs[0].key == reader.key:
                return conversation
    raise NotFound(f"conversation {conversation_id} not found")


class ConversationReader:
    """Conversations, their messages and event log as a reader may see them; owns the streams' shared feeds."""

    def __init__(
        self,
        db: Database,
        bus: ConversationBus,
        *,
        poll_interval: float = 1.0,
        stream_buffer: int = DEFAULT_BUFFER,
    ) -> None:
        if not (poll_interval > 0):
            raise ValueError("poll_interval must be positive")
        self._db = db
        self._bus = bus
        self.poll_interval = poll_interval
        """Longest wait of a conversation's feed between two reads (a missed wake-up costs at most this)."""
        self._closing = asyncio.Event()
        self._feeds = ConversationFeeds(self, buffer=stream_buffer)

    @property
    def bus(self) -> ConversationBus:
        """The wake-ups the feeds wait on."""
        return self._bus

    @property
    def feeds(self) -> ConversationFeeds:
        """The live readers shared by the conversation streams (one per conversation with open streams)."""
        return self._feeds

    # -- lifecycle -----------------------------------------------------------------------------------------

    def begin_shutdown(self) -> None:
        """End every open stream (each notices at once, or after the read it is in); nothing else changes."""
        self._closing.set()
        self._feeds.close()

    @property
    def closing(self) -> bool:
        """Whether `begin_shutdown` was called (streams end, new ones end at once)."""
        return self._closing.is_set()

    # -- conversations -------------------------------------------------------------------------------------

    async def list_conversations(
        self, owner: Identity, *, after: str | None = None, limit: int = 50
    ) -> list[Conversation]:
        """The owner's user conversations, newest first; ``after`` is the last id of the previous page."""
        if owner.kind != "user":
            return []
        async with self._db.transaction(read_only=True) as tx:
            return await tx.conversations.list_for_owner(owner.key, after=after, limit=limit)

    async def fork_origins(self, conversations: Sequence[Conversation]) -> dict[str, ConversationFork]:
        """The fork origins of those of ``conversations`` (already read by their reader) that are forks."""
        if not conversations:
            return {}
        async with self._db.transaction(read_only=True) as tx:
            return await tx.conversation_forks.find_many([c.id for c in conversations])

    async def conversation(self, reader: Identity, conversation_id: str) -> Conversation:
        """A conversation the reader may see (``NotFound`` otherwise)."""
        async with self._db.transaction(read_only=True) as tx:
            return await readable_conversation(tx, reader, conversation_id)

    async def work_conversation(self, reader: Identity, task_id: str) -> Conversation | None:
        """The work conversation of a Task the reader asked, if the Task has one."""
        async with self._db.transaction(read_only=True) as tx:
            found = await tx.conversations.find_work(task_id)
            if found is None:
                return None
            try:
                return await readable_conversation(tx, reader, found.id)
            except NotFound:
                return None

    async def messages(
        self, reader: Identity, conversation_id: str, *, after: str | None = None, limit: int = 100
    ) -> list[Message]:
        """A page of the conversation's messages in id order; ``after`` is the last id of the previous page."""
        async with self._db.transaction(read_only=True) as tx:
            await readable_conversation(tx, reader, conversation_id)
            return await tx.messages.list_conversation(conversation_id, after=after, limit=limit)

    async def snapshot(self, reader: Identity, conversation_id: str) -> Snapshot:
        """Every message with its content and the cursor it is current through, read from one snapshot."""
        async with self._db.transaction(read_only=True) as tx:
            conversation = await readable_conversation(tx, reader, conversation_id)
            cursor = await tx.message_events.last_cursor(conversation_id)
            messages: list[Message] = []
            after: str | None = None
            while True:
                page = await tx.messages.list_conversation(conversation_id, after=after, limit=MAX_PAGE)
                messages += page
                if len(page) < MAX_PAGE:
                    break
                after = page[-1].id
        return Snapshot(conversation, messages, cursor)

    # -- the conversation's event log ----------------------------------------------------------------------

    async def check_readable(self, reader: Identity, conversation_id: str) -> int:
        """Raise ``NotFound`` unless the reader may follow the conversation; returns its current cursor."""
        async with self._db.transaction(read_only=True) as tx:
            await readable_conversation(tx, reader, conversation_id)
            return await tx.message_events.last_cursor(conversation_id)

    async def read_stream(self, conversation_id: str, *, after: int, limit: int = 500) -> list[StreamItem]:
        """Stored events with cursor > ``after`` in cursor order; ``start``/``end`` carry their message header."""
        async with self._db.transaction(read_only=True) as tx:
            return await _stream_items(tx, conversation_id, after=after, limit=limit)

    async def read_stream_page(self, conversation_id: str, *, after: int, limit: int = 500) -> StreamPage:
        """`read_stream`, plus the conversation's last cursor read first in the same transaction (`StreamPage`)."""
        async with self._db.transaction(read_only=True) as tx:
            end = await tx.message_events.last_cursor(conversation_id)
            items = await _stream_items(tx, conversation_id, after=after, limit=limit)
        return StreamPage(items, end)

    async def end_cursor(self, message_id: str) -> int | None:
        """The cursor of a message's ``end`` event, or None while it is still open."""
        async with self._db.transaction(read_only=True) as tx:
            message = await tx.messages.get(message_id)
            if message.status not in TERMINAL_STATUSES:
                return None
            last = await tx.message_events.last_seq(message_id)
            events = await tx.message_events.read(message_id, after_seq=last - 1, limit=1)
            return events[0].cursor if events else None


async def _stream_items(tx: Transaction, conversation_id: str, *, after: int, limit: int) -> list[StreamItem]:
    events = await tx.message_events.read_conversation_events(conversation_id, after_cursor=after, limit=limit)
    headers: dict[str, Message] = {}
    for event in events:
        if event.event.get("op") in ("start", "end") and event.message_id not in headers:
            headers[event.message_id] = await tx.messages.get(event.message_id)
    return [
        StreamItem(event, headers.get(event.message_id) if event.event.get("op") in ("start", "end") else None)
        for event in events
    ]
