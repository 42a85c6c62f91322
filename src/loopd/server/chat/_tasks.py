"""`TaskApi`: what a Task's responder calls — Task context, messages and follow-ups, events into the Task's response,
outputs in its work conversation, access checks, and completion.

Completion is idempotent and resumable: ``closing`` (the intent is stored on the response row, which closes the
question and reply entry points) → finalize the Task's outputs, then the response, through ``streams.finish`` →
delete the Task → ``closed``. A crash anywhere in between leaves the row ``closing``; `sweep_closing` (run by a
`Sweeper`) resumes it with the stored intent. A normal completion with pending Human questions is refused; a
failure completion ends them with ``failure(task_ended)``.

Must not do: HTTP (the routes do), a user's reads or chat requests (``ConversationReader`` and ``ChatRequests`` do),
or write message content except through ``loopd.server.streams``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, Final

from loopd._infra.http_errors import ApiError
from loopd.server.chat._gateway import TaskGateway, TaskUnavailable
from loopd.server.chat._questions import resolve_question
from loopd.server.chat._records import Emitted, TaskContext
from loopd.server.http import Identity
from loopd.server.storage import (
    MAX_PAGE,
    Conflict,
    Database,
    InvalidRecord,
    Message,
    NewMessage,
    StorageError,
)
from loopd.server.streams import TERMINAL_STATUSES, ConversationBus, emit, empty_model, finish, open_message

_log = logging.getLogger(__name__)

DEFAULT_HISTORY_LIMIT: Final = 100
AUTHOR_KINDS: Final = frozenset({"operator", "harness"})


def check_responder(identity: Identity, response: Message) -> None:
    """Raise 403 unless ``identity`` may act for the Task answered by ``response``.

    Only the Task's responder — the operator or harness it is addressed to (``spec.target``), authenticated by a
    token — may read its context, write its answer, ask its humans or complete it. No user may, not even the
    admin: the admin acts for a Task only by naming its responder in ``X-Loopd-Actor``.
    """
    if not identity.trusted:
        raise ApiError("forbidden", "the Task API is for operators and harnesses: it needs a bearer token")
    if (identity.kind, identity.key) != (response.kind, response.key):
        raise ApiError("forbidden", f"{identity.text} is not the responder of this Task")


def _intent(error: Mapping[str, str] | None) -> dict[str, Any]:
    if error is None:
        return {"error": None}
    code, message = error.get("code"), error.get("message", "")
    if not isinstance(code, str) or not code or not isinstance(message, str):
        raise InvalidRecord("a completion error needs a non-empty code and a message")
    return {"error": {"code": code, "message": message}}


class TaskApi:
    """The responder's side of a Task (operators and harnesses, through the Task routes or in-process)."""

    def __init__(
        self, db: Database, bus: ConversationBus, tasks: TaskGateway, *, history_limit: int = DEFAULT_HISTORY_LIMIT
    ) -> None:
        if not 1 <= history_limit < MAX_PAGE:
            raise ValueError(f"history_limit must be from 1 to {MAX_PAGE - 1}")
        self._db = db
        self._bus = bus
        self._tasks = tasks
        self._history_limit = history_limit

    async def task_context(self, task_id: str) -> TaskContext:
        """Input, response, conversation and bounded history; ``NotFound`` in the commit window (requeue)."""
        async with self._db.transaction(read_only=True) as tx:
            input_, response = await tx.messages.task_pair(task_id)
            conversation = await tx.conversations.get(input_.conversation_id)
            rows = await tx.messages.list_through(conversation.id, input_.id, limit=self._history_limit + 1)
        has_earlier = len(rows) > self._history_limit
        return TaskContext(task_id, conversation, input_, response, rows[-self._history_limit :], has_earlier)

    async def task_messages(self, task_id: str, *, after: str | None = None, limit: int = 100) -> list[Message]:
        """Every message of the Task in both of its conversations, in id order."""
        async with self._db.transaction(read_only=True) as tx:
            await tx.messages.task_pair(task_id)
            return await tx.messages.list_task(task_id, after=after, limit=limit)

    async def followups(self, task_id: str, *, after: str | None = None, limit: int = 100) -> list[Message]:
        """User inputs added to the Task's conversation after its own input (context given while work goes on)."""
        async with self._db.transaction(read_only=True) as tx:
            input_, _ = await tx.messages.task_pair(task_id)
            start = after if after is not None and after > input_.id else input_.id
            found: list[Message] = []
            while len(found) < limit:
                page = await tx.messages.list_conversation(input_.conversation_id, after=start, limit=MAX_PAGE)
                found += [m for m in page if m.purpose == "input" and m.kind == "user"]
                if len(page) < MAX_PAGE:
                    break
                start = page[-1].id
        return found[:limit]

    async def response_of(self, task_id: str) -> Message:
        async with self._db.transaction(read_only=True) as tx:
            _, response = await tx.messages.task_pair(task_id)
            return response

    async def asker_of(self, task_id: str) -> Identity:
        """The user who asked the Task (its input message's author)."""
        async with self._db.transaction(read_only=True) as tx:
            input_, _ = await tx.messages.task_pair(task_id)
        return Identity(input_.kind, input_.key)

    async def check_task_access(
        self, actor: Identity, task_id: str, *, conversation_id: str | None = None, message_id: str | None = None
    ) -> None:
        """403 unless ``actor`` is the Task's responder (`check_responder`) and the named conversation / message
        belong to that Task (its user conversation, its work conversation, its messages). For the Harness Engine's
        and the ledger's routes: a responder reaches only what its own Tasks touch."""
        async with self._db.transaction(read_only=True) as tx:
            _, response = await tx.messages.task_pair(task_id)
            check_responder(actor, response)
            if message_id is not None and (await tx.messages.get(message_id)).task_id != task_id:
                raise ApiError("forbidden", f"message {message_id} is not part of task {task_id}")
            if (
                conversation_id is not None
                and conversation_id != response.conversation_id
                and (await tx.conversations.get(conversation_id)).task_id != task_id
            ):
                raise ApiError("forbidden", f"conversation {conversation_id} is not part of task {task_id}")

    async def task_of_message(self, message_id: str) -> str | None:
        """The Task a message belongs to (None for a message outside any Task)."""
        async with self._db.transaction(read_only=True) as tx:
            return (await tx.messages.get(message_id)).task_id

    async def emit(
        self, task_id: str, events: Sequence[Mapping[str, Any]], *, actor: Identity | None = None
    ) -> Emitted:
        """Append ``set`` / ``append`` / ``error`` events to the Task's response (no Human blocks).

        ``Conflict`` once delivery is closing (or the response has ended); ``actor``, when given, must be allowed
        to act for the Task (`check_responder`).
        """
        async with self._db.transaction() as tx:
            _, response = await tx.messages.task_pair(task_id)
            response = await tx.messages.lock(response.id)
            if actor is not None:
                check_responder(actor, response)
            if response.delivery_state:
                raise Conflict(f"task {task_id} is completing; its response takes no more events")
            message, stored = await emit(tx, response.id, events, bus=self._bus)
        return Emitted(message, stored)

    async def open_output(self, task_id: str, *, actor_kind: str, actor_key: str, title: str = "") -> Message:
        """A streaming ``output`` message in the Task's work conversation (created on first use)."""
        if actor_kind not in AUTHOR_KINDS:
            raise InvalidRecord(f"an output's author is an operator or a harness, not {actor_kind!r}")
        content = empty_model()
        if title:
            content["meta"] = {"title": title}
        async with self._db.transaction() as tx:
            _, response = await tx.messages.task_pair(task_id)
            response = await tx.messages.lock(response.id)
            if response.delivery_state:
                raise Conflict(f"task {task_id} is completing; it takes no new outputs")
            work = await tx.conversations.find_work(task_id)
            if work is None:
                work = await tx.conversations.create(
                    actor_kind=response.kind, actor_key=response.key, task_id=task_id, name=title
                )
            return await open_message(
                tx,
                NewMessage(
                    conversation_id=work.id,
                    kind=actor_kind,  # type: ignore[arg-type]  # checked against AUTHOR_KINDS above
                    key=actor_key,
                    purpose="output",
                    content=content,
                    task_id=task_id,
                    status="streaming",
                ),
                bus=self._bus,
            )

    # -- completion ----------------------------------------------------------------------------------------

    async def complete(
        self, task_id: str, *, error: Mapping[str, str] | None = None, actor: Identity | None = None
    ) -> Message:
        """Finish the Task's answer (idempotent, resumable); returns the final response message.

        ``Conflict`` when questions are pending and ``error`` is None, or when a different completion was stored.
        ``TaskUnavailable`` (retryable) when the Task cannot be deleted: the completion stays ``closing`` and is
        finished by a retry or by `sweep_closing`.
        """
        intent = _intent(error)
        response = await self._begin_completion(task_id, intent, actor)
        if response.delivery_state == "closed":
            return response
        return await self._finish_delivery(task_id, intent)

    async def _begin_completion(self, task_id: str, intent: dict[str, Any], actor: Identity | None) -> Message:
        async with self._db.transaction() as tx:
            _, response = await tx.messages.task_pair(task_id)
            response = await tx.messages.lock(response.id)
            if actor is not None:
                check_responder(actor, response)
            if response.delivery_state:
                if (response.completion or {"error": None}) != intent:
                    raise Conflict(f"task {task_id} is already completing with another outcome")
                return response
            if intent["error"] is None:
                pending = await tx.human_requests.count_pending(task_id)
                if pending:
                    raise Conflict(
                        f"task {task_id} has {pending} pending Human question(s): wait for their outcome, "
                        "or complete with an error"
                    )
            else:
                for request in await tx.human_requests.list_pending(task_id=task_id, limit=MAX_PAGE):
                    await resolve_question(tx, request, "failure", reason="task_ended", bus=self._bus)
            return await tx.messages.update(
                response.id, expected_revision=response.revision, delivery_state="closing", completion=intent
            )

    async def _finish_delivery(self, task_id: str, intent: Mapping[str, Any]) -> Message:
        error = intent.get("error")
        status = "failed" if error else "completed"
        async with self._db.transaction() as tx:
            _, response = await tx.messages.task_pair(task_id)
            await tx.messages.lock(response.id)
            for output in await tx.messages.find_by_purpose(task_id, "output", limit=MAX_PAGE):
                if output.status not in TERMINAL_STATUSES:
                    await finish(tx, output.id, status, error=error, bus=self._bus)  # type: ignore[arg-type]
            await finish(tx, response.id, status, error=error, bus=self._bus)  # type: ignore[arg-type]
        await self._delete_task(task_id)
        async with self._db.transaction() as tx:
            response = await tx.messages.lock(response.id)
            if response.delivery_state == "closing":
                response = await tx.messages.update(
                    response.id, expected_revision=response.revision, delivery_state="closed"
                )
        return response

    async def _delete_task(self, task_id: str) -> None:
        try:
            await self._tasks.delete(task_id)
        except TaskUnavailable:
            raise
        except Exception as exc:
            raise TaskUnavailable(f"cannot delete Task {task_id}: {type(exc).__name__}: {exc}") from exc

    async def sweep_closing(self, *, limit: int = 20) -> int:
        """Resume up to ``limit`` completions left ``closing`` (after a crash or a failed delete); how many closed."""
        async with self._db.transaction(read_only=True) as tx:
            closing = await tx.messages.list_closing(limit=limit)
        done = 0
        for response in closing:
            if response.task_id is None:
                continue
            try:
                await self._finish_delivery(response.task_id, response.completion or {"error": None})
                done += 1
            except StorageError as exc:
                _log.warning("completion of task %s not finished yet: %s", response.task_id, exc)
        return done
