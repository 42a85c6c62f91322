"""`ChatRequests`: what a user changes in the chat: a new conversation, and the chat request (a question to an
operator or harness), or observing one already asked.

The chat request (DESIGN §5): in one database transaction the user's ``input`` message and the responder's empty
``response`` message are stored with one new task id, then the Task resource is created *before* the commit. If
the Task cannot be created the transaction rolls back (no orphan messages; 503). If the commit fails after the
Task was created, the Task is deleted again (compensation; no orphan Task in the normal case). A commit whose
outcome is unknown (it timed out) is never compensated blindly: the input message is read back by its id, and the
Task is deleted only if it is not stored; if that cannot be read either, both are left as they are (503).

Reads of conversations are `ConversationReader` (``_reader.py``); what a Task's responder calls (context, events,
outputs, completion) is `TaskApi` (``_tasks.py``). Must not do: HTTP (the routes do), reads for their own sake, or
write message content except through ``loopd.server.streams``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any, Final, Protocol

from loopd._infra.http_errors import ApiError
from loopd._infra.metrics import Metrics
from loopd._infra.telemetry import tracer, tracing_enabled
from loopd.agentue import AgentUEError, validate_model
from loopd.server.chat._answers import OpenAnswers
from loopd.server.chat._gateway import TaskGateway, TaskUnavailable
from loopd.server.chat._reader import readable_conversation
from loopd.server.chat._records import ChatRequest, StreamItem, TaskContext
from loopd.server.chat._window import QuestionWindow
from loopd.server.http import Identity
from loopd.server.storage import (
    CommitOutcomeUnknown,
    Conversation,
    Database,
    InvalidRecord,
    MessageEvent,
    NewMessage,
    NotFound,
    StorageError,
    StorageUnavailable,
    Transaction,
)
from loopd.server.streams import (
    HUMAN_BLOCK_TYPES,
    ConversationBus,
    empty_model,
    open_messages,
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


class ChatRequests:
    """Creates conversations and chat requests (messages and their Task, atomically); observes asked ones."""

    def __init__(
        self,
        db: Database,
        bus: ConversationBus,
        tasks: TaskGateway,
        *,
        targets: TargetDirectory | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self._db = db
        self._bus = bus
        self._tasks = tasks
        self._targets = targets
        self._metrics = metrics
        self.answers: OpenAnswers | None = None
        """Told each question stored here (its answer is open until it ends; see `OpenAnswers`)."""
        self.asked: Callable[[ChatRequest], None] | None = None
        """Told after each stored question (loop-server's conversation titles start there); must not block."""
        self.questions = QuestionWindow()
        """The questions being stored right now (see `QuestionWindow`): a responder in this process waits on it."""

    @property
    def db(self) -> Database:
        """The database the chat is stored in."""
        return self._db

    @property
    def bus(self) -> ConversationBus:
        """Where writes announce new events."""
        return self._bus

    @property
    def tasks(self) -> TaskGateway:
        """The Task resources behind chat requests."""
        return self._tasks

    # -- conversations -------------------------------------------------------------------------------------

    async def create_conversation(self, owner: Identity, *, name: str = "") -> Conversation:
        """A new conversation owned by ``owner`` (a user; anyone else is ``forbidden``)."""
        _require_user(owner)
        async with self._db.transaction() as tx:
            return await tx.conversations.create(actor_kind="user", actor_key=owner.key, name=name)

    async def rename_conversation(self, owner: Identity, conversation_id: str, *, name: str) -> Conversation:
        """Rename ``owner``'s conversation (``NotFound`` for anyone else's; a Task's work conversation keeps its
        name: ``InvalidRecord``)."""
        _require_user(owner)
        async with self._db.transaction() as tx:
            await _owned(tx, owner, conversation_id)
            return await tx.conversations.rename(conversation_id, name)

    async def set_mode(self, owner: Identity, conversation_id: str, *, mode: str | None) -> Conversation:
        """Set the mode ``owner``'s conversation's next built-in harness calls start in (None: each harness's own);
        a call already running keeps its mode. ``NotFound`` for anyone else's conversation, as for posting."""
        _require_user(owner)
        async with self._db.transaction() as tx:
            await _owned(tx, owner, conversation_id)
            return await tx.conversations.set_mode(conversation_id, mode or "")

    async def conversation_mode(self, conversation_id: str) -> str | None:
        """The mode ``conversation_id``'s built-in harness calls start in (None: each harness's own, or no such
        conversation). For the responder: no caller check."""
        async with self._db.transaction(read_only=True) as tx:
            try:
                return (await tx.conversations.get(conversation_id)).mode or None
            except NotFound:
                return None

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
        """Store the input and an empty streaming response under a new task id and create the Task, atomically.

        While tracing is on, this is the ``loopd.chat.request`` span: the root of the question's trace (or a child
        of the caller's ``traceparent``), whose context the Task carries to whoever answers it."""
        if not tracing_enabled():
            asked = await self._ask(
                asker, conversation_id, target_kind=target_kind, target_key=target_key, content=content
            )
        else:
            with tracer("loopd.server").start_as_current_span(
                "loopd.chat.request",
                attributes={"gen_ai.conversation.id": conversation_id, "loopd.target": f"{target_kind}:{target_key}"},
            ) as span:
                asked = await self._ask(
                    asker, conversation_id, target_kind=target_kind, target_key=target_key, content=content
                )
                span.set_attribute("loopd.task.id", asked.task_id)
        if self.answers is not None:
            self.answers.asked(asked.task_id)
        if self._metrics is not None:
            self._metrics.chat_requests.labels(target_kind).inc()
            self._metrics.chats_in_flight.inc()
        if self.asked is not None:
            self.asked(asked)
        return asked

    async def _ask(
        self,
        asker: Identity,
        conversation_id: str,
        *,
        target_kind: str,
        target_key: str,
        content: Mapping[str, Any],
    ) -> ChatRequest:
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
        asked: list[MessageEvent] = []  # the input's events, then the response's
        try:
            async with self._db.transaction() as tx:
                # Where it was forked from is read with it (one statement), for the context a first question hands
                # over; anyone else's conversation is refused as `_owned` refuses it.
                conversation, fork = await tx.conversations.get_with_fork(conversation_id)
                if conversation.actor_kind != "user" or conversation.actor_key != asker.key:
                    conversation, fork = await _owned(tx, asker, conversation_id), None
                task_id = tx.new_id()
                # The input, then the response (replying to it, so its id is made here): stored together, their
                # opening events in one append.
                input_id = tx.new_id()
                input_, response = await open_messages(
                    tx,
                    (
                        NewMessage(
                            conversation_id=conversation.id,
                            kind="user",
                            key=asker.key,
                            purpose="input",
                            content=model,
                            task_id=task_id,
                            status="completed",
                            id=input_id,
                        ),
                        NewMessage(
                            conversation_id=conversation.id,
                            kind=target_kind,  # type: ignore[arg-type]  # checked against TARGET_KINDS above
                            key=target_key,
                            purpose="response",
                            content=empty_model(model["biz"]),
                            task_id=task_id,
                            reply_to_message_id=input_id,
                            status="streaming",
                        ),
                    ),
                    bus=self._bus,
                    events=asked,
                )
                conversation = await tx.conversations.touch(conversation.id)
                # Last step before the commit: a Task that cannot be created rolls everything back.
                self.questions.open(task_id)
                await self._create_task(task_id, target_kind, target_key)
                task_created = True
                opened = task_id
                if target_kind == "harness" and asked[0].cursor == 1:
                    # The conversation's first question (nothing was stored in it before): this transaction knows
                    # its Task's whole context, handed to the responder once it surely committed.
                    handed = TaskContext(opened, conversation, input_, response, [input_], False, fork=fork)
                    tx.after_sure_commit(lambda: self.questions.hand_over(handed))
                tx.after_commit(lambda: self.questions.close(opened))  # also on an unknown outcome
        except CommitOutcomeUnknown as exc:
            if task_id is not None:
                self.questions.close(task_id)  # the commit callbacks closed it already when the Task was created
            if not task_created or task_id is None:
                raise
            # It may have committed: read back the input (written in the same transaction) to learn which.
            if not await self._input_stored(input_.id):
                await self._compensate(task_id)
                raise StorageUnavailable("the question was not stored (its commit failed); ask again") from exc
        except BaseException:
            if task_id is not None:
                self.questions.close(task_id)  # rolled back: a responder that set the Task aside looks again
            if task_created and task_id is not None:
                await self._compensate(task_id)
            raise
        headers = {input_.id: input_, response.id: response}
        own = tuple(StreamItem(event, headers[event.message_id]) for event in asked)  # every one a start or end
        # The stream position just before the question: its input's start is the first event it stored (numbered
        # under the conversation's cursor row, locked by that append until the commit), so no read of it first.
        cursor = asked[0].cursor - 1
        return ChatRequest(input_.task_id or task_id, conversation, input_, response, cursor, own)

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
            conversation = await readable_conversation(tx, reader, conversation_id)
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


async def _owned(tx: Transaction, owner: Identity, conversation_id: str) -> Conversation:
    conversation = await readable_conversation(tx, owner, conversation_id)
    if conversation.actor_kind != "user":
        raise InvalidRecord("a Task's work conversation takes no chat requests; post to the user conversation")
    return conversation
