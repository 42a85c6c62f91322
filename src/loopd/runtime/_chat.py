"""``rt.chat``: conversations and the messages an operator publishes for a Task.

Owns: reading conversations and asking questions (user verbs: with a data directory's admin token they act as its
user), publishing complete messages (``speak``) and streaming outputs (``tell`` → ``Output``) in a Task's main or
work conversation, writing into the Task's response (``emit``, ``answer``) and completing it.
Must not do: keep state between calls (every verb is one request; outputs are idempotent by their key), or import
loopd.server / loopd.harness.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Literal

from ._client import ServerClient
from ._records import Conversation, Message, Sent

if TYPE_CHECKING:
    from ._tasks import AnsweredTasks

ANSWER_BLOCK: Final = "answer"
"""The id of the response's text block ``chat.answer`` writes (what `loopd chat` prints as the answer)."""
TEXT_BLOCK: Final = "text"
"""The id of an output's text block (``speak(text=...)``, ``Output.append_text``)."""

ConversationName = Literal["main", "work"]
CompletionErrorLike = tuple[str, str] | Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Emitted:
    """Events stored into a message: the last ``seq`` assigned, the conversation ``cursor``, the new revision."""

    message_id: str
    seq: int
    cursor: int
    revision: int

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> Emitted:
        return cls(
            message_id=str(body["message_id"]),
            seq=int(body.get("seq") or 0),
            cursor=int(body.get("cursor") or 0),
            revision=int(body.get("revision") or 0),
        )


class Output:
    """A streaming message the operator writes into (``chat.tell``): ``emit`` / ``append_text``, then ``end``
    exactly once. ``async with`` ends it on exit — with an ``operator_error`` when the block raised."""

    def __init__(self, client: ServerClient, task_id: str, message: Message, *, created: bool) -> None:
        self._client = client
        self.task_id = task_id
        self.message = message
        self.created = created
        """False when this key had been opened before (a retry or a restarted operator re-attached)."""

    @property
    def id(self) -> str:
        """The output message's id."""
        return self.message.id

    async def emit(self, events: Sequence[Mapping[str, Any]]) -> Emitted:
        """Append AgentUE ``set`` / ``append`` / ``error`` events (no ``seq``: the server assigns it). ``Conflict``
        once the output has ended."""
        body = await self._client.request(
            "POST",
            f"/v1/tasks/{self.task_id}/outputs/{self.id}/events",
            json={"events": [dict(e) for e in events]},
            idempotent=False,
            what=f"output {self.id}",
        )
        return Emitted.from_json(body)

    async def append_text(self, text: str) -> Emitted:
        """Append ``text`` to the output's text block (created by the first append)."""
        event = {"op": "append", "mask": "block.content", "block": {"id": TEXT_BLOCK, "type": "text", "content": text}}
        return await self.emit([event])

    async def end(self, error: CompletionErrorLike | None = None) -> Message:
        """End the output (``completed``, or ``failed`` with ``error`` = ``(code, message)``). Ending again the
        same way is a no-op; ending it differently is ``Conflict``."""
        body = await self._client.request(
            "POST",
            f"/v1/tasks/{self.task_id}/outputs/{self.id}/end",
            json={"error": _error_body(error)},
            idempotent=True,
            what=f"output {self.id}",
        )
        self.message = Message.from_json(body["message"])
        return self.message

    async def __aenter__(self) -> Output:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is None:
            await self.end()
        elif isinstance(exc, Exception):
            await self.end(("operator_error", str(exc) or type(exc).__name__))
        # Cancelled: the output stays open; completing the Task ends it (a restarted operator may go on with it).


def _error_body(error: CompletionErrorLike | None) -> dict[str, str] | None:
    if error is None:
        return None
    if isinstance(error, Mapping):
        return {"code": str(error["code"]), "message": str(error.get("message") or "")}
    code, message = error
    return {"code": str(code), "message": str(message)}


class ChatVerbs:
    """``rt.chat``."""

    def __init__(self, client: ServerClient, answered: AnsweredTasks | None = None) -> None:
        self._client = client
        self._answered = answered

    # -- user verbs ----------------------------------------------------------------------------------------

    async def conversation(self, conversation_id: str) -> Conversation:
        """A conversation the caller may read. Conversations belong to users: with an operator token this is
        ``NotFound``; with a data directory's admin token the runtime reads as that directory's user."""
        body = await self._client.request(
            "GET", f"/v1/conversations/{conversation_id}", as_user=True, what=f"conversation {conversation_id}"
        )
        return Conversation.from_json(body)

    async def history(self, conversation_id: str, *, after: str | None = None, limit: int = 100) -> list[Message]:
        """One page of the conversation's messages in id order (``after=page[-1].id`` for the next). Same access
        as ``conversation``; an operator reads a Task's history with ``task.get`` / ``task.messages``."""
        body = await self._client.request(
            "GET",
            f"/v1/conversations/{conversation_id}/messages",
            params={"after": after, "limit": limit},
            as_user=True,
            what=f"conversation {conversation_id}",
        )
        return [Message.from_json(m) for m in body.get("data") or ()]

    async def create_conversation(self, name: str = "") -> Conversation:
        """A new conversation owned by the caller (a user verb, like ``send``)."""
        body = await self._client.request(
            "POST", "/v1/conversations", json={"name": name[:200]}, idempotent=False, as_user=True
        )
        return Conversation.from_json(body)

    async def send(self, conversation_id: str, text: str, *, target: tuple[str, str] = ("operator", "router")) -> Sent:
        """Ask ``target`` (``(kind, key)``) a question in a user's conversation: the input, the Task, and the
        response its responder will write. A user verb (``Forbidden`` with an operator token). Not retried once
        sent: a retry would ask twice."""
        kind, key = target
        body = await self._client.request(
            "POST",
            f"/v1/conversations/{conversation_id}/messages",
            json={"target": {"kind": kind, "key": key}, "text": text},
            idempotent=False,
            as_user=True,
            what=f"ask {kind}:{key}",
        )
        return Sent.from_json(body)

    # -- the responder's verbs ------------------------------------------------------------------------------

    async def speak(
        self,
        task_id: str,
        key: str,
        *,
        text: str | None = None,
        content: Mapping[str, Any] | None = None,
        conversation: ConversationName = "main",
        title: str | None = None,
    ) -> Message:
        """Publish one complete message for the Task (exactly one of ``text`` / ``content``, an AgentUE model) in
        its ``main`` conversation (a reply to the input) or its ``work`` conversation. ``key`` makes it idempotent:
        the same key and parameters return the same message; the same key with others is ``Conflict``."""
        if (text is None) == (content is None):
            raise ValueError("speak takes exactly one of text and content")
        message, _ = await self._open(task_id, key, conversation, False, text, content, title)
        return message

    async def tell(
        self,
        task_id: str,
        key: str,
        *,
        conversation: ConversationName = "work",
        title: str | None = None,
        text: str | None = None,
        content: Mapping[str, Any] | None = None,
    ) -> Output:
        """Open a streaming message for the Task (in its ``work`` conversation by default), optionally with an
        opening ``text`` or ``content``; write with the returned ``Output``. Idempotent by ``key`` like ``speak``:
        a restarted operator re-attaches to the same output (``created`` False)."""
        message, created = await self._open(task_id, key, conversation, True, text, content, title)
        return Output(self._client, task_id, message, created=created)

    async def _open(
        self,
        task_id: str,
        key: str,
        conversation: str,
        stream: bool,
        text: str | None,
        content: Mapping[str, Any] | None,
        title: str | None,
    ) -> tuple[Message, bool]:
        body = await self._client.request(
            "POST",
            f"/v1/tasks/{task_id}/outputs",
            json={
                "key": key,
                "conversation": conversation,
                "stream": stream,
                "text": text,
                "content": dict(content) if content is not None else None,
                "title": title,
            },
            idempotent=True,  # by key
            what=f"output {key!r} of task {task_id}",
        )
        return Message.from_json(body["message"]), bool(body.get("created", True))

    async def emit(self, task_id: str, events: Sequence[Mapping[str, Any]]) -> Emitted:
        """Append AgentUE ``set`` / ``append`` / ``error`` events to the Task's response (the answer the user
        sees). Not retried once sent (appends would repeat). ``Conflict`` once completion has begun."""
        body = await self._client.request(
            "POST",
            f"/v1/tasks/{task_id}/events",
            json={"events": [dict(e) for e in events]},
            idempotent=False,
            what=f"events of task {task_id}",
        )
        return Emitted.from_json(body)

    async def answer(self, task_id: str, text: str) -> Emitted:
        """Set the response's ``answer`` text block to ``text`` (a whole-block set: repeating it is harmless)."""
        event = {"op": "set", "block": {"id": ANSWER_BLOCK, "type": "text", "content": text}}
        body = await self._client.request(
            "POST",
            f"/v1/tasks/{task_id}/events",
            json={"events": [event]},
            idempotent=True,
            what=f"answer of task {task_id}",
        )
        return Emitted.from_json(body)

    async def complete(
        self, task_id: str, error: CompletionErrorLike | None = None, *, answer: str | None = None
    ) -> Message:
        """Finish the answer (``failed`` with ``error`` = ``(code, message)`` or ``{"code", "message"}``) and delete
        the Task; outputs still open end with it. ``answer`` sets the response's answer text in the same server
        transaction (like `answer` then `complete`, in one request, and never one without the other). Idempotent.
        ``Conflict`` while questions are pending (unless ``error`` is given); ``Unavailable`` when the Task could not
        be deleted yet (it completes by itself)."""
        payload: dict[str, Any] = {"error": _error_body(error)}
        if answer is not None:
            payload["events"] = [{"op": "set", "block": {"id": ANSWER_BLOCK, "type": "text", "content": answer}}]
        body = await self._client.request(
            "POST",
            f"/v1/tasks/{task_id}/complete",
            json=payload,
            idempotent=True,
            what=f"complete task {task_id}",
        )
        if self._answered is not None:
            self._answered.add(task_id)
        return Message.from_json(body["response"])
