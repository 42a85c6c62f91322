"""`ChatService`: conversations and their reads (messages, snapshot, the event log), and the chat request.

The chat request (DESIGN §5): in one database transaction the user's ``input`` message and the responder's empty
``response`` message are stored with one new task id, then the Task resource is created *before* the commit. If
the Task cannot be created the transaction rolls back (no orphan messages; 503). If the commit fails after the
Task was created, the Task is deleted again (compensation; no orphan Task in the normal case). A commit whose
outcome is unknown (it timed out) is never compensated blindly: the input message is read back by its id, and the
Task is deleted only if it is not stored; if that cannot be read either, both are left as they are (503).

What a Task's responder calls (context, events, outputs, completion) is `TaskApi` (``_tasks.py``), not this class.

Visibility: a user conversation is readable by its owner only; a Task's work conversation by the user who asked.
Anything else is "not found". Must not do: HTTP (the routes do), or write message content except through
``loopd.server.streams``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any, Final, Protocol

from loopd._infra.http_errors import ApiError
from loopd.agentue import AgentUEError, validate_model
from loopd.server.chat._feeds import DEFAULT_BUFFER, ConversationFeeds
from loopd.server.chat._gateway import TaskGateway, TaskUnavailable
from loopd.server.chat._records import ChatRequest, Snapshot, StreamItem, StreamPage
from loopd.server.http import Identity
from loopd.server.storage import (
    MAX_PAGE,
    CommitOutcomeUnknown,
    Conversation,
    Database,
    InvalidRecord,
    Message,
    NewMessage,
    NotFound,
    StorageError,
    StorageUnavailable,
    Transaction,
)
from loopd.server.streams import (
    HUMAN_BLOCK_TYPES,
    TERMINAL_STATUSES,
    ConversationBus,
    empty_model,
    open_message,
)

_log = logging.getLogger(__name__)

MAX_INPUT_BLOCKS: Final = 100
TARGET_KINDS: Final = frozenset({"operator", "harness"})


class TargetDirectory(Protocol):
    """Which responders exist (the registry, with its built-in targets)."""

    async def is_known(self, kind: str, key: str) -> bool: ...


def text_content(text: str, *, biz: str = "loopd.chat") -> dict[str, Any]:
    """The content model of a plain text input: one ``text`` block by the user."""
    return {
        "version": "1.1",
        "biz": biz,
        "meta": {},
        "blocks": [{"id": "text", "type": "text", "role": "user", "content": text}],
    }


def _checked_input(content: Mapping[str, Any]) -> dict[str, Any]:
    try:
        model = validate_model(dict(content), typed_blocks=True).to_json()
    except AgentUEError as exc:
        raise InvalidRecord(f"content is not a valid AgentUE model: {exc}") from exc
    blocks = model["blocks"]
    if not blocks:
        raise InvalidRecord("content needs at least one block")
    if len(blocks) > MAX_INPUT_BLOCKS:
        raise InvalidRecord(f"content may have at most {MAX_INPUT_BLOCKS} blocks")
    if any(block.get("type") in HUMAN_BLOCK_TYPES for block in blocks):
        raise InvalidRecord("ask / confirm / human_reply blocks are created through the Human API only")
    if "human" in model["meta"]:
        raise InvalidRecord("meta.human is reserved for the Human API")
    return model


class ChatService:
    def __init__(
        self,
        db: Database,
        bus: ConversationBus,
        tasks: TaskGateway,
        *,
        targets: TargetDirectory | None = None,
        poll_interval: float = 1.0,
        stream_buffer: int = DEFAULT_BUFFER,
    ) -> None:
        if not (poll_interval > 0):
            raise ValueError("poll_interval must be positive")
        self._db = db
        self._bus = bus
        self._tasks = tasks
        self._targets = targets
        self.poll_interval = poll_interval
        """Longest wait of a conversation's feed between two reads (a missed wake-up costs at most this)."""
        self._closing = asyncio.Event()
        self._feeds = ConversationFeeds(self, buffer=stream_buffer)

    @property
    def db(self) -> Database:
        return self._db

    @property
    def bus(self) -> ConversationBus:
        return self._bus

    @property
    def tasks(self) -> TaskGateway:
        return self._tasks

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
        return self._closing.is_set()

    # -- conversations -------------------------------------------------------------------------------------

    async def create_conversation(self, owner: Identity, *, name: str = "") -> Conversation:
        _require_user(owner)
        async with self._db.transaction() as tx:
            return await tx.conversations.create(actor_kind="user", actor_key=owner.key, name=name)

    async def list_conversations(
        self, owner: Identity, *, after: str | None = None, limit: int = 50
    ) -> list[Conversation]:
        """The owner's user conversations, newest first; ``after`` is the last id of the previous page."""
        if owner.kind != "user":
            return []
        async with self._db.transaction(read_only=True) as tx:
            return await tx.conversations.list_for_owner(owner.key, after=after, limit=limit)

    async def conversation(self, reader: Identity, conversation_id: str) -> Conversation:
        """A conversation the reader may see (``NotFound`` otherwise)."""
        async with self._db.transaction(read_only=True) as tx:
            return await _readable(tx, reader, conversation_id)

    async def work_conversation(self, reader: Identity, task_id: str) -> Conversation | None:
        """The work conversation of a Task the reader asked, if the Task has one."""
        async with self._db.transaction(read_only=True) as tx:
            found = await tx.conversations.find_work(task_id)
            if found is None:
                return None
            try:
                return await _readable(tx, reader, found.id)
            except NotFound:
                return None

    async def messages(
        self, reader: Identity, conversation_id: str, *, after: str | None = None, limit: int = 100
    ) -> list[Message]:
        async with self._db.transaction(read_only=True) as tx:
            await _readable(tx, reader, conversation_id)
            return await tx.messages.list_conversation(conversation_id, after=after, limit=limit)

    async def snapshot(self, reader: Identity, conversation_id: str) -> Snapshot:
        """Every message with its content and the cursor it is current through, read from one snapshot."""
        async with self._db.transaction(read_only=True) as tx:
            conversation = await _readable(tx, reader, conversation_id)
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
            await _readable(tx, reader, conversation_id)
            return await tx.message_events.last_cursor(conversation_id)

    async def read_stream(self, conversation_id: str, *, after: int, limit: int = 500) -> list[StreamItem]:
        """Stored events with cursor > ``after`` in cursor order; ``start``/``end`` carry their message header."""
        async with self._db.transaction(read_only=True) as tx:
            return await self._stream_items(tx, conversation_id, after=after, limit=limit)

    @staticmethod
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

    async def read_stream_page(self, conversation_id: str, *, after: int, limit: int = 500) -> StreamPage:
        """`read_stream`, plus the conversation's last cursor read first in the same transaction (`StreamPage`)."""
        async with self._db.transaction(read_only=True) as tx:
            end = await tx.message_events.last_cursor(conversation_id)
            items = await self._stream_items(tx, conversation_id, after=after, limit=limit)
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

    # -- the chat request ----------------------------------------------------------------------------------

    async def ask(
        self,
        asker: Identity,
        conversation_id: str,
        *,
        target_kind: str,
        target_key: str,
        content: Mapping[str, Any],
    ) -> ChatRequest:
        """Store the input and an empty streaming response under a new task id and create the Task, atomically."""
        _require_user(asker)
        if target_kind not in TARGET_KINDS:
            raise InvalidRecord(f"target kind must be operator or harness, not {target_kind!r}")
        if not isinstance(target_key, str) or not target_key:
            raise InvalidRecord("target key must be a non-empty string")
        model = _checked_input(content)
        if self._targets is not None and not await self._targets.is_known(target_kind, target_key):
            raise InvalidRecord(f"unknown target {target_kind}:{target_key} (see GET /v1/actors)")
        task_id: str | None = None
        task_created = False
        try:
            async with self._db.transaction() as tx:
                conversation = await _owned(tx, asker, conversation_id)
                cursor = await tx.message_events.last_cursor(conversation.id)
                task_id = tx.new_id()
                input_ = await open_message(
                    tx,
                    NewMessage(
                        conversation_id=conversation.id,
                        kind="user",
                        key=asker.key,
                        purpose="input",
                        content=model,
                        task_id=task_id,
                        status="completed",
                    ),
                    bus=self._bus,
                )
                response = await open_message(
                    tx,
                    NewMessage(
                        conversation_id=conversation.id,
                        kind=target_kind,  # type: ignore[arg-type]  # checked against TARGET_KINDS above
                        key=target_key,
                        purpose="response",
                        content=empty_model(model["biz"]),
                        task_id=task_id,
                        reply_to_message_id=input_.id,
                        status="streaming",
                    ),
                    bus=self._bus,
                )
                await tx.conversations.touch(conversation.id)
                conversation = await tx.conversations.get(conversation.id)
                # Last step before the commit: a Task that cannot be created rolls everything back.
                await self._create_task(task_id, target_kind, target_key)
                task_created = True
        except CommitOutcomeUnknown as exc:
            if not task_created or task_id is None:
                raise
            # It may have committed: read back the input (written in the same transaction) to learn which.
            if not await self._input_stored(input_.id):
                await self._compensate(task_id)
                raise StorageUnavailable("the question was not stored (its commit failed); ask again") from exc
        except BaseException:
            if task_created and task_id is not None:
                await self._compensate(task_id)
            raise
        return ChatRequest(input_.task_id or task_id, conversation, input_, response, cursor)

    async def _input_stored(self, input_id: str) -> bool:
        """Whether a question whose commit had an unknown outcome did commit, read back by its input's id. A write
        transaction, so on SQLite it starts only after the pending COMMIT has settled. Raises
        ``CommitOutcomeUnknown`` when even that cannot be read: then nothing is undone."""
        try:
            async with self._db.transaction() as tx:
                await tx.messages.get(input_id)
        except NotFound:
            return False
        except StorageError as exc:
            raise CommitOutcomeUnknown(
                "the question may or may not have been stored: load the conversation before asking again"
            ) from exc
        return True

    async def observe(self, reader: Identity, conversation_id: str, task_id: str) -> ChatRequest:
        """An existing question of the conversation, with the cursor just before its first event."""
        async with self._db.transaction(read_only=True) as tx:
            conversation = await _readable(tx, reader, conversation_id)
            input_, response = await tx.messages.task_pair(task_id)
            if input_.conversation_id != conversation.id:
                raise NotFound(f"task {task_id} is not a question of conversation {conversation_id}")
            first = await tx.message_events.read(input_.id, limit=1)
            cursor = first[0].cursor - 1 if first else 0
        return ChatRequest(task_id, conversation, input_, response, cursor)

    async def _create_task(self, task_id: str, target_kind: str, target_key: str) -> None:
        try:
            await self._tasks.create(task_id, target_kind, target_key)
        except TaskUnavailable:
            raise
        except Exception as exc:
            raise TaskUnavailable(f"cannot create Task {task_id}: {type(exc).__name__}: {exc}") from exc

    async def _compensate(self, task_id: str) -> None:
        """The messages did not commit: take the Task back (best effort; a failure is logged)."""
        try:
            await asyncio.shield(self._tasks.delete(task_id))
        except Exception:
            _log.exception("could not delete Task %s after its messages failed to commit", task_id)


def _require_user(identity: Identity) -> None:
    if identity.kind != "user":
        raise ApiError("forbidden", "conversations belong to users; operators answer through the Task API")


async def _readable(tx: Transaction, reader: Identity, conversation_id: str) -> Conversation:
    conversation = await tx.conversations.get(conversation_id)
    if reader.kind == "user":
        if conversation.actor_kind == "user" and conversation.actor_key == reader.key:
            return conversation
        if conversation.actor_kind != "user" and conversation.task_id is not None:
            inputs = await tx.messages.find_by_purpose(conversation.task_id, "input", limit=1)
            if inputs and inputs[0].kind == "user" and inputs[0].key == reader.key:
                return conversation
    raise NotFound(f"conversation {conversation_id} not found")


async def _owned(tx: Transaction, owner: Identity, conversation_id: str) -> Conversation:
    conversation = await _readable(tx, owner, conversation_id)
    if conversation.actor_kind != "user":
        raise InvalidRecord("a Task's work conversation takes no chat requests; post to the user conversation")
    return conversation
