"""`ConversationForks`: "retry from here" and "edit and resend" — a new conversation forked from a message.

``fork(caller, conversation_id, message_id, mode=...)``, for whoever may post to the conversation (its owner; anyone
else gets ``NotFound``, as for posting):

- ``retry`` on an answer (a ``response``): the fork holds the visible history before that answer's question, then
  the same question again, asked of the same responder;
- ``edit`` on a question (a user ``input``): the fork holds the history before it, then ``text`` as the new
  question, asked of the responder that answered the original.

The chosen answer (for ``edit``: the edited question's answer) must have ended (``Conflict`` while it streams).
One transaction creates the fork conversation, copies the earlier messages (``input`` / ``response`` / ``output``,
with their current content and status, ``task_id`` NULL: they belong to no Task of the fork) and records the fork
origin (``conversation_forks``: parent conversation, chosen message, and the *source* answer whose harness
session the new answer starts from); then the question is asked like any chat request (``ChatRequests.ask``). If
asking fails, the fork stays with its copied history and no question (ask again there).

The responder (``loopd.server.responder``) answers the fork's first question of a built-in harness as a fork of
the source answer's harness session, just before the turn that took its input (`ForkOrigins`). The parent
conversation is never written to. Must not do: HTTP (``fork_router``), harness sessions (the responder/engine).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Final, Literal

from fastapi import APIRouter, Depends
from fastapi import Path as PathParam
from pydantic import Field

from loopd.server.chat._reader import readable_conversation
from loopd.server.chat._records import ChatRequest
from loopd.server.chat._requests import ChatRequests, _owned, _require_user, text_content
from loopd.server.chat._wire import (
    MAX_KEY,
    ChatAccepted,
    ConversationBody,
    _Request,
    _Response,
    conversation_body,
    message_body,
)
from loopd.server.http import ERROR_RESPONSES, Identity, current_identity
from loopd.server.storage import (
    Conflict,
    ConversationFork,
    ForkMode,
    InvalidRecord,
    Message,
    NewMessage,
    NotFound,
    Transaction,
)
from loopd.server.streams import open_message

COPIED_PURPOSES: Final = frozenset({"input", "response", "output"})
"""What a fork copies of the parent's history (Human requests and replies belong to the parent's Tasks)."""
MAX_COPIED: Final = 5000
"""At most this many earlier messages are copied (the newest ones); a longer history is cut at its start."""
_PAGE: Final = 500
_Key = Annotated[str, PathParam(min_length=1, max_length=MAX_KEY)]


@dataclass(frozen=True, slots=True)
class Forked:
    """A fork and the question asked in it."""

    origin: ConversationFork
    asked: ChatRequest


class ConversationForks:
    """Forks conversations (see the module docstring); `origin` is what the responder reads."""

    def __init__(self, chat: ChatRequests) -> None:
        self._chat = chat

    async def origin(self, conversation_id: str) -> ConversationFork | None:
        """Where ``conversation_id`` was forked from; None when it was not."""
        async with self._chat.db.transaction(read_only=True) as tx:
            return await tx.conversation_forks.find(conversation_id)

    async def origin_for(self, reader: Identity, conversation_id: str) -> ConversationFork:
        """Where ``conversation_id`` was forked from, for someone who may read it (``NotFound`` otherwise, and for a
        conversation that is not a fork)."""
        async with self._chat.db.transaction(read_only=True) as tx:
            await readable_conversation(tx, reader, conversation_id)
            return await tx.conversation_forks.get(conversation_id)

    async def fork(
        self, caller: Identity, conversation_id: str, message_id: str, *, mode: ForkMode, text: str | None = None
    ) -> Forked:
        """Fork ``conversation_id`` at ``message_id`` and ask again there (see the module docstring)."""
        _require_user(caller)
        if mode == "edit" and (text is None or not text.strip()):
            raise InvalidRecord("edit and resend needs the new text")
        if mode == "retry" and text is not None:
            raise InvalidRecord("retry asks the same question again: leave text out (use mode 'edit' to change it)")
        async with self._chat.db.transaction() as tx:
            parent = await _owned(tx, caller, conversation_id)
            chosen = await tx.messages.get(message_id)
            if chosen.conversation_id != parent.id:
                raise NotFound(f"message {message_id} is not in conversation {conversation_id}")
            question, source = await _question_and_source(tx, chosen, mode)
            if source.status == "streaming":
                raise Conflict(f"the answer {source.id} is still streaming: wait for it to end (or cancel it)")
            fork = await tx.conversations.create(actor_kind="user", actor_key=caller.key, name=parent.name)
            await self._copy_before(tx, parent.id, question.id, fork.id)
            origin = await tx.conversation_forks.insert(
                fork.id,
                parent_conversation_id=parent.id,
                parent_message_id=chosen.id,
                source_message_id=source.id,
                mode=mode,
            )
        content = question.content if mode == "retry" else text_content(text or "")
        asked = await self._chat.ask(
            caller, fork.id, target_kind=source.kind, target_key=source.key, content=_question_content(content)
        )
        return Forked(origin, asked)

    async def _copy_before(self, tx: Transaction, parent_id: str, before_id: str, fork_id: str) -> None:
        """Copy the parent's visible messages with ids below ``before_id`` into the fork, in order."""
        earlier: list[Message] = []
        after: str | None = None
        while True:
            page = await tx.messages.list_conversation(parent_id, after=after, limit=_PAGE)
            earlier += [m for m in page if m.id < before_id and m.purpose in COPIED_PURPOSES]
            if len(page) < _PAGE or page[-1].id >= before_id:
                break
            after = page[-1].id
        copied: dict[str, str] = {}
        for message in earlier[-MAX_COPIED:]:
            reply_to = None if message.reply_to_message_id is None else copied.get(message.reply_to_message_id)
            new = await open_message(
                tx,
                NewMessage(
                    conversation_id=fork_id,
                    kind=message.kind,
                    key=message.key,
                    purpose=message.purpose,
                    content=message.content,
                    reply_to_message_id=reply_to,
                    status="completed" if message.status == "streaming" else message.status,
                ),
                bus=self._chat.bus,
            )
            copied[message.id] = new.id


async def _question_and_source(tx: Transaction, chosen: Message, mode: ForkMode) -> tuple[Message, Message]:
    """The question the fork asks again (or replaces) and the answer whose harness state it starts from."""
    if mode == "retry":
        if chosen.purpose != "response" or chosen.reply_to_message_id is None:
            raise InvalidRecord("retry from here takes an answer (a response message); to change a question use edit")
        return await tx.messages.get(chosen.reply_to_message_id), chosen
    if chosen.purpose != "input" or chosen.kind != "user":
        raise InvalidRecord("edit and resend takes a question you asked (a user input message)")
    if chosen.task_id is not None:
        _, response = await tx.messages.task_pair(chosen.task_id)
        return chosen, response
    # A question copied into a fork belongs to no Task: its answer is the response that replies to it.
    for message in await tx.messages.list_conversation(chosen.conversation_id, after=chosen.id, limit=_PAGE):
        if message.purpose == "response" and message.reply_to_message_id == chosen.id:
            return chosen, message
    raise InvalidRecord("this question has no answer to edit and resend from")


def _question_content(content: dict[str, Any]) -> dict[str, Any]:
    """A question's content as a new chat request takes it (no Human metadata carried over)."""
    meta = {name: value for name, value in (content.get("meta") or {}).items() if name != "human"}
    return {**content, "meta": meta}


# -- HTTP -------------------------------------------------------------------------------------------------------


class ForkRequest(_Request):
    """``retry`` (``message_id`` is an answer) or ``edit`` (``message_id`` is your question; ``text`` replaces it)."""

    mode: Literal["retry", "edit"]
    text: str | None = Field(default=None, min_length=1, max_length=100_000)


class ForkOriginBody(_Response):
    """The parent conversation, the message chosen in it, and how the fork asked again."""

    conversation_id: str
    message_id: str
    mode: Literal["retry", "edit"]


def _origin_body(origin: ConversationFork) -> ForkOriginBody:
    return ForkOriginBody(
        conversation_id=origin.parent_conversation_id, message_id=origin.parent_message_id, mode=origin.mode
    )


class ForkAccepted(ChatAccepted):
    """The fork (``conversation``), the question asked in it (as for a chat request) and where it came from."""

    conversation: ConversationBody
    forked_from: ForkOriginBody


def fork_router(forks: ConversationForks) -> APIRouter:
    """``POST /v1/conversations/{id}/messages/{message_id}/fork`` and ``GET /v1/conversations/{id}/fork``."""
    router = APIRouter(responses=ERROR_RESPONSES)

    @router.post(
        "/v1/conversations/{conversation_id}/messages/{message_id}/fork", status_code=201, tags=["conversations"]
    )
    async def fork_conversation(
        caller: Annotated[Identity, Depends(current_identity)],
        conversation_id: _Key,
        message_id: _Key,
        body: ForkRequest,
    ) -> ForkAccepted:
        """Retry from an answer, or edit and resend a question: a new conversation (the fork) with the history
        before it and the question asked again. The original conversation is unchanged. 404 for a conversation
        or message the caller cannot post to; 409 while the chosen answer still streams; 400 for the wrong kind
        of message."""
        forked = await forks.fork(caller, conversation_id, message_id, mode=body.mode, text=body.text)
        asked = forked.asked
        return ForkAccepted(
            task_id=asked.task_id,
            conversation_id=asked.conversation.id,
            input=message_body(asked.input),
            response=message_body(asked.response),
            cursor=asked.cursor,
            conversation=conversation_body(asked.conversation, forked.origin),
            forked_from=_origin_body(forked.origin),
        )

    @router.get("/v1/conversations/{conversation_id}/fork", tags=["conversations"])
    async def fork_origin(
        caller: Annotated[Identity, Depends(current_identity)], conversation_id: _Key
    ) -> ForkOriginBody:
        """Where a forked conversation came from; 404 for a conversation that is no fork (or not the caller's)."""
        return _origin_body(await forks.origin_for(caller, conversation_id))

    return router
