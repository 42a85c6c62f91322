"""`HumanService`: Human Ask / Confirm — questions from responders, replies from the asking user, deadlines.

Rules (DESIGN §5, compforge-facts §9A):

* A question is identified by (task, effect key). The same key with the same parameters returns the same
  question — its original deadline and its state, final or not; different parameters are a conflict (409).
* The timeout is mandatory, finite, positive and at most ``max_timeout_seconds``; the deadline is fixed when the
  question is first stored and enforced here (`sweep_deadlines`, and on every read or reply past it).
* A reply binds only through ``reply_to_message_id`` and only inside its conversation and Task (else 404), only
  from the user who asked the Task (else 403), and only once: the first outcome stays; a repeated identical reply
  is answered with the same result, a contradictory or late one is a conflict.
* Outcomes are ``success(value)``, ``dismissed``, ``timeout``, ``failure(reason)``. A reply adds a ``human_reply``
  message by the user; a timeout adds no message. Either way the question's block shows the outcome and the
  Task's revision is bumped *inside* the transaction, so a failed wake-up rolls the outcome back (503, retry)
  instead of leaving a responder asleep; a Task already deleted is not recreated.
Must not do: write message content except through ``loopd.server.streams`` (via ``loopd.server.chat``).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final, Literal

from loopd._infra.http_errors import ApiError
from loopd.agentue import AgentUEError, typed_block
from loopd.server.chat import ChatRequests, TaskUnavailable, check_responder, question_block, resolve_question
from loopd.server.http import Identity
from loopd.server.storage import (
    MAX_PAGE,
    Conflict,
    HumanRequest,
    HumanRequestType,
    InvalidRecord,
    Message,
    NewHumanRequest,
    NewMessage,
    NotFound,
    StorageError,
    Transaction,
)
from loopd.server.streams import open_message

_log = logging.getLogger(__name__)

DEFAULT_MAX_TIMEOUT: Final = 7 * 24 * 3600.0
WAIT_POLL: Final = 1.0
MAX_ANSWER: Final = 10_000
REPLY_BLOCK_ID: Final = "reply"
HUMAN_BIZ: Final = "loopd.human"
CONFIRM_VALUES: Final = frozenset({"accepted", "declined"})
ReplyOutcome = Literal["success", "dismissed"]


@dataclass(frozen=True, slots=True)
class Question:
    request: HumanRequest
    message: Message
    """The ``human_request`` message (its block shows the state)."""
    created: bool


@dataclass(frozen=True, slots=True)
class ReplyResult:
    request: HumanRequest
    message: Message
    reply: Message | None
    """The ``human_reply`` message (None only if the stored one could not be found)."""
    accepted: bool
    """False when this was a repeat of the reply already stored (nothing changed)."""


def _check_block(block: Mapping[str, Any], what: str) -> None:
    try:
        typed_block(block)
    except AgentUEError as exc:
        raise InvalidRecord(f"{what}: {exc}") from exc


class HumanService:
    def __init__(self, chat: ChatRequests, *, max_timeout_seconds: float = DEFAULT_MAX_TIMEOUT) -> None:
        if not (0 < max_timeout_seconds < math.inf):
            raise ValueError("max_timeout_seconds must be positive and finite")
        self._chat = chat
        self._db = chat.db
        self._bus = chat.bus
        self.max_timeout_seconds = max_timeout_seconds

    # -- asking --------------------------------------------------------------------------------------------

    async def ask(
        self,
        task_id: str,
        *,
        effect_key: str,
        type: HumanRequestType,
        title: str,
        prompt: str,
        timeout_seconds: float,
        choices: Sequence[Mapping[str, Any]] | None = None,
        allow_other: bool = False,
        confirm_label: str | None = None,
        decline_label: str | None = None,
        actor: Identity | None = None,
    ) -> Question:
        """Store a question in the Task's conversation, or return the one stored under the same effect key."""
        self._check_timeout(timeout_seconds)
        if not isinstance(prompt, str) or not prompt.strip():
            raise InvalidRecord("a question needs a non-empty prompt")
        if choices is not None and len(choices) == 0:
            raise InvalidRecord("choices, when given, may not be empty (use allow_other for free text only)")
        normalized = tuple(
            {k: v for k, v in dict(choice).items() if not (k == "description" and v is None)}
            for choice in choices or ()
        )
        async with self._db.transaction() as tx:
            input_, response = await tx.messages.task_pair(task_id)
            response = await tx.messages.lock(response.id)
            if actor is not None:
                check_responder(actor, response)
            existing = await tx.human_requests.find(task_id, effect_key)
            if existing is None and response.delivery_state:
                raise Conflict(f"task {task_id} is completing; it asks no new questions")
            new = NewHumanRequest(
                message_id=existing.message_id if existing is not None else tx.new_id(),
                task_id=task_id,
                conversation_id=input_.conversation_id,
                effect_key=effect_key,
                type=type,
                title=title,
                prompt=prompt,
                timeout_seconds=float(timeout_seconds),
                asker_kind=response.kind,
                asker_key=response.key,
                choices=normalized,
                allow_other=allow_other,
                confirm_label=confirm_label,
                decline_label=decline_label,
            )
            request, created = await tx.human_requests.create(new)
            if created:
                block = question_block(request)
                _check_block(block, "invalid question")
                message = await open_message(
                    tx,
                    NewMessage(
                        id=request.message_id,
                        conversation_id=request.conversation_id,
                        kind=response.kind,
                        key=response.key,
                        purpose="human_request",
                        content={"version": "1.1", "biz": HUMAN_BIZ, "meta": {}, "blocks": [block]},
                        task_id=task_id,
                        status="streaming",
                        human_due_at=request.due_at,
                    ),
                    bus=self._bus,
                )
                return Question(request, message, True)
        # The same question again: its original deadline and current (possibly final) state.
        return await self.get(request.message_id)

    def _check_timeout(self, timeout_seconds: float) -> None:
        if (
            isinstance(timeout_seconds, bool)
            or not isinstance(timeout_seconds, int | float)
            or not math.isfinite(timeout_seconds)
            or timeout_seconds <= 0
        ):
            raise InvalidRecord(f"timeout_seconds must be a positive, finite number, not {timeout_seconds!r}")
        if timeout_seconds > self.max_timeout_seconds:
            raise InvalidRecord(f"timeout_seconds must be at most {self.max_timeout_seconds:g}")

    # -- reading -------------------------------------------------------------------------------------------

    async def get(self, message_id: str, *, reader: Identity | None = None) -> Question:
        """A question and its state (a question past its deadline is timed out first). ``reader``, when given,
        must be the user who asked the Task or a token caller allowed to act for it (else 404)."""
        async with self._db.transaction(read_only=True) as tx:
            request = await tx.human_requests.get(message_id)
            if reader is not None:
                await _check_reader(tx, reader, request)
            overdue = request.outcome == "pending" and tx.now() >= request.due_at
        if overdue:
            await self._expire(message_id)
        async with self._db.transaction(read_only=True) as tx:
            request = await tx.human_requests.get(message_id)
            return Question(request, await tx.messages.get(message_id), False)

    async def wait(
        self,
        message_id: str,
        timeout: float,
        *,
        reader: Identity | None = None,
        stop: asyncio.Event | None = None,
        poll_interval: float = WAIT_POLL,
    ) -> Question:
        """The question as soon as its outcome is not ``pending``, or as it is when ``timeout`` seconds pass (or
        ``stop`` is set: a server's shutdown). Wakes on every change of its conversation, and at its deadline
        (where `get` times it out); polls every ``poll_interval`` for changes another replica made."""
        deadline = self._db.now() + timedelta(seconds=max(timeout, 0.0))  # the database's clock judges time here
        conversation_id = (await self.get(message_id, reader=reader)).request.conversation_id
        with self._bus.listen(conversation_id) as notices:  # from before the read: a change during it wakes the wait
            while True:
                question = await self.get(message_id, reader=reader)
                now = self._db.now()
                remaining = (deadline - now).total_seconds()
                if question.request.outcome != "pending" or remaining <= 0 or (stop is not None and stop.is_set()):
                    return question
                until_due = (question.request.due_at - now).total_seconds()
                step = min(remaining, poll_interval, max(until_due, 0.0) + 0.001)
                await notices.wait(step, stop=stop)

    # -- replying ------------------------------------------------------------------------------------------

    async def reply(
        self,
        replier: Identity,
        conversation_id: str,
        task_id: str,
        *,
        reply_to_message_id: str,
        outcome: ReplyOutcome,
        value: str | None = None,
    ) -> ReplyResult:
        """Answer a question as ``replier`` (see the module rules)."""
        if outcome not in ("success", "dismissed"):
            raise InvalidRecord("a reply's outcome is success or dismissed")
        if outcome == "dismissed" and value is not None:
            raise InvalidRecord("a dismissal carries no value")
        if outcome == "success" and (not isinstance(value, str) or not value.strip() or len(value) > MAX_ANSWER):
            raise InvalidRecord(f"a success reply carries a non-empty value of at most {MAX_ANSWER} characters")
        async with self._db.transaction() as tx:
            request = await _request_in(tx, reply_to_message_id, conversation_id, task_id)
            asker = await _asker(tx, task_id)
            if replier.kind != "user" or replier.key != asker.key:
                raise ApiError("forbidden", "only the user who asked this task may answer its questions")
            message = await tx.messages.lock(request.message_id)
            if request.is_terminal:
                if request.outcome == outcome and request.value == value and request.resolved_by == replier.text:
                    stored = request.reply_message_id
                    return ReplyResult(
                        request, message, None if stored is None else await tx.messages.get(stored), False
                    )
                raise Conflict(f"this question already has its outcome: {request.outcome}")
            late = tx.now() >= request.due_at
            if late:
                await self._time_out(tx, request)
            else:
                if outcome == "success":
                    _check_value(request, value or "")
                reply = await self._store_reply(tx, replier, request, outcome, value)
                resolved, changed = await resolve_question(
                    tx,
                    request,
                    outcome,
                    value=value,
                    resolved_by=replier.text,
                    reply_message_id=reply.id,
                    bus=self._bus,
                )
                if not changed:
                    raise Conflict(f"this question already has its outcome: {resolved.outcome}")
                await self._wake(task_id)
                result = ReplyResult(resolved, await tx.messages.get(request.message_id), reply, True)
        if late:  # the timeout is stored (and the Task woken); the reply is refused
            raise Conflict("this question timed out before the reply arrived")
        return result

    async def _store_reply(
        self, tx: Transaction, replier: Identity, request: HumanRequest, outcome: ReplyOutcome, value: str | None
    ) -> Message:
        block: dict[str, Any] = {
            "id": REPLY_BLOCK_ID,
            "type": "human_reply",
            "reply_to_message_id": request.message_id,
            "outcome": outcome,
        }
        if value is not None:
            block["value"] = value
        _check_block(block, "invalid reply")
        return await open_message(
            tx,
            NewMessage(
                conversation_id=request.conversation_id,
                kind="user",
                key=replier.key,
                purpose="human_reply",
                content={"version": "1.1", "biz": HUMAN_BIZ, "meta": {}, "blocks": [block]},
                task_id=request.task_id,
                reply_to_message_id=request.message_id,
                status="completed",
            ),
            bus=self._bus,
        )

    # -- deadlines -----------------------------------------------------------------------------------------

    async def sweep_deadlines(self, *, limit: int = 100) -> int:
        """Time out up to ``limit`` questions past their deadline (oldest first); how many changed."""
        async with self._db.transaction(read_only=True) as tx:
            due = await tx.human_requests.list_due(limit=min(limit, MAX_PAGE))
        changed = 0
        for request in due:
            try:
                changed += await self._expire(request.message_id)
            except StorageError as exc:
                _log.warning("question %s not timed out yet: %s", request.message_id, exc)
        return changed

    async def _expire(self, message_id: str) -> bool:
        async with self._db.transaction() as tx:
            request = await tx.human_requests.get(message_id)
            if request.is_terminal or tx.now() < request.due_at:
                return False
            return await self._time_out(tx, request)

    async def _time_out(self, tx: Transaction, request: HumanRequest) -> bool:
        _, changed = await resolve_question(tx, request, "timeout", bus=self._bus)
        if changed:
            await self._wake(request.task_id)
        return changed

    async def _wake(self, task_id: str) -> None:
        """Bump the Task's revision inside the caller's transaction: a failure rolls the outcome back."""
        try:
            await self._chat.tasks.bump_revision(task_id)
        except TaskUnavailable:
            raise
        except Exception as exc:
            raise TaskUnavailable(f"cannot wake Task {task_id}: {type(exc).__name__}: {exc}") from exc


def _check_value(request: HumanRequest, value: str) -> None:
    if request.type == "confirm":
        if value not in CONFIRM_VALUES:
            raise InvalidRecord("a confirm is answered with 'accepted' or 'declined'")
        return
    declared = {str(choice.get("value")) for choice in request.choices}
    if value not in declared and not request.allow_other:
        raise InvalidRecord(f"{value!r} is not one of the choices ({', '.join(sorted(declared))})")


async def _request_in(tx: Transaction, message_id: str, conversation_id: str, task_id: str) -> HumanRequest:
    try:
        request = await tx.human_requests.get(message_id)
    except NotFound:
        raise NotFound(f"message {message_id} is not a question") from None
    if request.task_id != task_id or request.conversation_id != conversation_id:
        raise NotFound(f"question {message_id} is not a question of this conversation and task")
    return request


async def _asker(tx: Transaction, task_id: str) -> Identity:
    input_, _ = await tx.messages.task_pair(task_id)
    return Identity(input_.kind, input_.key)


async def _check_reader(tx: Transaction, reader: Identity, request: HumanRequest) -> None:
    if reader.admin or (reader.trusted and (reader.kind, reader.key) == (request.asker_kind, request.asker_key)):
        return
    asker = await _asker(tx, request.task_id)
    if reader.kind == "user" and reader.key == asker.key:
        return
    raise NotFound(f"human request {request.message_id} not found")
