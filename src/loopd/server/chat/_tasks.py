"""`TaskApi`: what a Task's responder calls — Task context, messages and follow-ups, events into the Task's response,
outputs in its work conversation, access checks, and completion.

Completion is idempotent and resumable: ``closing`` (the intent is stored on the response row, which closes the
question and reply entry points) → finalize the Task's outputs, then the response, through ``streams.finish`` →
delete the Task → ``closed``. A crash anywhere in between leaves the row ``closing``; `sweep_closing` (run by a
`Sweeper`) resumes it with the stored intent. A normal completion with pending Human questions is refused; a
failure completion ends them with ``failure(task_ended)``.

Cleaning up later (``complete(..., later=True)``, the built-in responder's): once the answer has ended — its end stored
and sent, the row ``closing`` — deleting the Task and the ``closed`` mark are bookkeeping nobody waits for. While the
server is busy (`busy`: answers still open here, or engine calls), `run_cleanup` does them once it has been idle for
`CLEANUP_QUIET` seconds (`idle`, on a call's end: the last answers' own completions go first) or `CLEANUP_DELAY` seconds
later, the ``closed`` marks of a batch in one transaction; an idle server, a full queue (`CLEANUP_KEPT`) or no running
`run_cleanup` clean up at once as before. A stop leaves the queued rows ``closing`` for `sweep_closing`, which skips the
ones queued here.

Must not do: HTTP (the routes do), a user's reads or chat requests (``ConversationReader`` and ``ChatRequests`` do),
or write message content except through ``loopd.server.streams``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final, Literal

from loopd._infra.clock import wait_event
from loopd._infra.errors import LoopdError
from loopd._infra.http_errors import ApiError
from loopd._infra.metrics import Metrics
from loopd.agentue import AgentUEError, validate_model
from loopd.server.chat._answers import OpenAnswers
from loopd.server.chat._gateway import TaskGateway, TaskUnavailable
from loopd.server.chat._questions import resolve_question
from loopd.server.chat._records import Emitted, TaskContext
from loopd.server.http import Identity
from loopd.server.storage import (
    MAX_PAGE,
    Conflict,
    Conversation,
    Database,
    InvalidRecord,
    Message,
    NewMessage,
    NotFound,
    StorageError,
    TaskOutput,
    Transaction,
    digest,
)
from loopd.server.streams import (
    HUMAN_BLOCK_TYPES,
    TERMINAL_STATUSES,
    ConversationBus,
    TerminalStatus,
    emit,
    empty_model,
    finish,
    open_message,
)

_log = logging.getLogger(__name__)

DEFAULT_HISTORY_LIMIT: Final = 100
ORPHAN_GRACE: Final = 30.0
"""Seconds an answer must be old before a missing Task counts as deleted (its Task is created after the answer)."""
TASK_DELETED: Final = {"code": "task_deleted", "message": "the Task was deleted before it was answered"}
AUTHOR_KINDS: Final = frozenset({"operator", "harness"})
CLEANUP_DELAY: Final = 2.0
"""Seconds a completion's deferred cleanup (Task delete, ``closed``) waits at most for the server to be idle."""
CLEANUP_QUIET: Final = 0.2
"""Seconds the server must stay idle before deferred cleanups go ahead (the completions of its last answers first)."""
CLEANUP_KEPT: Final = 1024
"""Deferred cleanups queued at most; past it a completion cleans up at once."""
CLEANUP_BATCH: Final = 200
"""Deferred cleanups done in one go (their ``closed`` marks in one transaction)."""


def _never() -> bool:
    return False


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
        self,
        db: Database,
        bus: ConversationBus,
        tasks: TaskGateway,
        *,
        history_limit: int = DEFAULT_HISTORY_LIMIT,
        metrics: Metrics | None = None,
    ) -> None:
        if not 1 <= history_limit < MAX_PAGE:
            raise ValueError(f"history_limit must be from 1 to {MAX_PAGE - 1}")
        self._metrics = metrics
        self._db = db
        self._bus = bus
        self._tasks = tasks
        self._history_limit = history_limit
        self._stopping = asyncio.Event()
        self._orphan_cursor: str | None = None  # where `sweep_orphans` goes on from
        self.answered: Callable[[str], None] | None = None
        """Told the conversation id of each answer this server completes (conversation titles wait for it)."""
        self.busy: Callable[[], bool] = _never
        """Whether the server answers anything now (the composition gives: answers open here, or the engine's
        calls): a deferred cleanup waits while it does (see the module docstring)."""
        self.answers: OpenAnswers | None = None
        """The answers this process's questions wait for (told when one ended here; see `OpenAnswers`)."""
        self._later: dict[str, tuple[Message, float]] = {}  # task id -> (its response as closing left it, when)
        self._later_changed = asyncio.Event()
        self._cleaning = False  # `run_cleanup` runs

    async def task_context(self, task_id: str, *, messages: int = 0, history: int | None = None) -> TaskContext:
        """Input, response, conversation (and where it was forked from) and bounded history — at most ``history``
        messages when given (capped at the configured limit) — and, with ``messages`` > 0, the first ``messages`` of
        the Task's own messages, read in the same snapshot; ``NotFound`` in the commit window (requeue)."""
        limit = self._history_limit if history is None else max(1, min(history, self._history_limit))
        own: list[Message] | None = None
        async with self._db.transaction(read_only=True) as tx:
            input_, response = await tx.messages.task_pair(task_id)
            conversation, fork = await tx.conversations.get_with_fork(input_.conversation_id)
            rows = await tx.messages.list_through(conversation.id, input_.id, limit=limit + 1)
            if messages > 0:
                own = await tx.messages.list_task(task_id, after=None, limit=messages + 1)
        has_earlier = len(rows) > limit
        more = own is not None and len(own) > messages
        return TaskContext(
            task_id,
            conversation,
            input_,
            response,
            rows[-limit:],
            has_earlier,
            messages=None if own is None else own[:messages],
            more_messages=more,
            fork=fork,
        )

    async def task_messages(self, task_id: str, *, after: str | None = None, limit: int = 100) -> list[Message]:
        """Every message of the Task in both of its conversations, in id order."""
        async with self._db.transaction(read_only=True) as tx:
            await tx.messages.task_pair_ids(task_id)  # NotFound / Conflict as for the pair
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
    ) -> Identity:
        """403 unless ``actor`` is the Task's responder (`check_responder`) and the named conversation / message
        belong to that Task (its user conversation, its work conversation, its messages). For the Harness Engine's
        and the ledger's routes: a responder reaches only what its own Tasks touch. Returns the Task's asker (as
        `asker_of` does), read in the same transaction."""
        async with self._db.transaction(read_only=True) as tx:
            input_, response = await tx.messages.task_pair(task_id)
            check_responder(actor, response)
            if message_id is not None and (await tx.messages.get(message_id)).task_id != task_id:
                raise ApiError("forbidden", f"message {message_id} is not part of task {task_id}")
            if (
                conversation_id is not None
                and conversation_id != response.conversation_id
                and (await tx.conversations.get(conversation_id)).task_id != task_id
            ):
                raise ApiError("forbidden", f"conversation {conversation_id} is not part of task {task_id}")
        return Identity(input_.kind, input_.key)

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
            _, response_id = await tx.messages.task_pair_ids(task_id)
            response = await tx.messages.lock(response_id)
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
        self,
        task_id: str,
        *,
        error: Mapping[str, str] | None = None,
        events: Sequence[Mapping[str, Any]] | None = None,
        actor: Identity | None = None,
        response_id: str | None = None,
        later: bool = False,
    ) -> Message:
        """Finish the Task's answer (idempotent, resumable); returns the final response message. ``later``: the
        Task's delete and the ``closed`` mark may wait while the server is busy (see the module docstring; the
        response returned is then ``closing``, its answer ended).

        ``events`` (``set`` / ``append``, e.g. the answer) are appended to the response in the transaction that
        stores the completion, so the answer and the end land together; a repeat of a stored completion does not
        apply them again. ``Conflict`` when questions are pending and ``error`` is None, or when a different
        completion was stored. ``TaskUnavailable`` (retryable) when the Task cannot be deleted: the completion stays
        ``closing`` and is finished by a retry or by `sweep_closing`.
        """
        intent = _intent(error)
        if events and any(event.get("op") == "error" for event in events):
            raise InvalidRecord("a completion's events are set or append; give a failure as its error instead")
        response, finished = await self._begin_completion(task_id, intent, actor, events or (), response_id)
        if finished and self.answers is not None:
            self.answers.answered(task_id)
        if finished and self._metrics is not None:
            self._metrics.chats_in_flight.dec()
            seconds = (self._db.clock.now() - response.created_at).total_seconds()
            self._metrics.chat_seconds.labels("failed" if error else "completed").observe(max(seconds, 0.0))
        try:
            if response.delivery_state == "closed":
                return response
            if finished and later and self._defer(task_id, response):
                return response
            if finished:
                self.idle()  # the last answer to end: what waited for that goes ahead
            return await self._finish_delivery(task_id, intent, ended=response if finished else None)
        finally:
            if finished and self.answered is not None:  # once the answer's end has gone out to its readers
                self.answered(response.conversation_id)

    async def _begin_completion(
        self,
        task_id: str,
        intent: dict[str, Any],
        actor: Identity | None,
        events: Sequence[Mapping[str, Any]],
        response_id: str | None = None,
    ) -> tuple[Message, bool]:
        """Append ``events`` to the response, store the completion intent (``closing``) and, in the same
        transaction, end the Task's open outputs and its response; whether this call did all of it (False: a
        completion stored before is resumed or refused). ``response_id``: the response as the caller knows it (no
        lookup by the Task; checked against it once locked, and looked up after all when it is not the Task's)."""
        async with self._db.transaction() as tx:
            response = None
            if response_id is not None:
                with contextlib.suppress(NotFound):
                    response = await tx.messages.lock(response_id)
                if response is not None and (response.task_id != task_id or response.purpose != "response"):
                    response = None
            if response is None:
                _, found = await tx.messages.task_pair_ids(task_id)
                response = await tx.messages.lock(found)
            if actor is not None:
                check_responder(actor, response)
            if response.delivery_state:
                if (response.completion or {"error": None}) != intent:
                    raise Conflict(f"task {task_id} is already completing with another outcome")
                return response, False
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
            if events:
                response, _ = await emit(tx, response.id, events, bus=self._bus)
            return await self._end_messages(tx, task_id, response, intent, closing=True), True

    async def _end_messages(
        self, tx: Transaction, task_id: str, response: Message, intent: Mapping[str, Any], *, closing: bool = False
    ) -> Message:
        """End the Task's outputs still open, then its response (``failed`` with the intent's error); ``response`` is
        the row as this transaction locked it. ``closing``: also store the completion intent on the response
        (``delivery_state`` ``closing``), in the same write that ends it. Returns the response as its end left it
        (the revision the closing compare-and-set of `_finish_delivery` expects)."""
        error = intent.get("error")
        status = "failed" if error else "completed"
        for output in await tx.messages.find_by_purpose(task_id, "output", limit=MAX_PAGE):
            if output.status not in TERMINAL_STATUSES:
                await finish(tx, output.id, status, error=error, bus=self._bus)  # type: ignore[arg-type]
        if closing and response.status in TERMINAL_STATUSES:  # ended before (no write of its end to share)
            return await tx.messages.update(
                response.id, expected_revision=response.revision, delivery_state="closing", completion=dict(intent)
            )
        return await finish(
            tx,
            response.id,
            status,  # type: ignore[arg-type]
            error=error,
            bus=self._bus,
            locked=response,
            completion=intent if closing else None,
        )

    async def _finish_delivery(
        self, task_id: str, intent: Mapping[str, Any], *, ended: Message | None = None
    ) -> Message:
        """End the Task's messages (unless ``ended``, its response that `_begin_completion` ended already), delete
        the Task, then mark the delivery ``closed``."""
        response = ended
        if response is None:
            async with self._db.transaction() as tx:
                _, response_id = await tx.messages.task_pair_ids(task_id)
                response = await self._end_messages(tx, task_id, await tx.messages.lock(response_id), intent)
        await self._delete_task(task_id)
        async with self._db.transaction() as tx:
            return await self._close(tx, response)

    def _defer(self, task_id: str, response: Message) -> bool:
        """Queue the cleanup of a completion that just ended ``response`` (closing), when it may wait."""
        if not self._cleaning or len(self._later) >= CLEANUP_KEPT or not self.busy():
            return False
        self._later[task_id] = (response, self._db.clock.monotonic())
        self._later_changed.set()
        return True

    def idle(self) -> None:
        """The server may answer nothing now (a call ended): deferred cleanups go ahead unless it is `busy`."""
        if self._later and not self.busy():
            self._later_changed.set()

    async def run_cleanup(self) -> None:
        """Do the deferred cleanups (see the module docstring) until cancelled."""
        clock = self._db.clock
        self._cleaning = True
        try:
            while True:
                self._later_changed.clear()
                if not self._later:
                    await self._later_changed.wait()
                    continue
                due = next(iter(self._later.values()))[1] + CLEANUP_DELAY - clock.monotonic()
                if due > 0 and self.busy():
                    await wait_event(clock, self._later_changed, due)
                    continue
                if due > 0:  # idle: a quiet moment first, then only if it stayed idle
                    await clock.sleep(min(CLEANUP_QUIET, due))
                    if self.busy():
                        continue
                await self._clean_up()
        finally:
            self._cleaning = False

    async def _clean_up(self) -> None:
        """Delete the Tasks of up to `CLEANUP_BATCH` deferred cleanups, then mark their responses ``closed`` in one
        transaction. A Task that cannot be deleted now stays ``closing`` (`sweep_closing` retries it)."""
        batch = list(itertools.islice(self._later.items(), CLEANUP_BATCH))
        deleted: list[Message] = []
        for task_id, (response, _) in batch:
            try:
                await self._delete_task(task_id)
            except TaskUnavailable as exc:
                _log.warning("completion of task %s not finished yet: %s", task_id, exc)
            else:
                deleted.append(response)
            finally:
                self._later.pop(task_id, None)
        if deleted:
            async with self._db.transaction() as tx:
                for response in deleted:
                    await self._close(tx, response)

    async def _close(self, tx: Transaction, response: Message) -> Message:
        """Mark ``response`` (as its completion left it, ``closing``) ``closed`` — by one compare-and-set, or, when
        it changed since (another completion of it ran too), as the row is now."""
        if response.delivery_state == "closing":
            with contextlib.suppress(Conflict):
                return await tx.messages.update(
                    response.id, expected_revision=response.revision, delivery_state="closed"
                )
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
            if response.task_id is None or response.task_id in self._later:  # queued here: `run_cleanup` does it
                continue
            try:
                await self._finish_delivery(response.task_id, response.completion or {"error": None})
                done += 1
            except StorageError as exc:
                _log.warning("completion of task %s not finished yet: %s", response.task_id, exc)
        return done

    async def sweep_orphans(self, *, limit: int = 50, grace: float = ORPHAN_GRACE) -> int:
        """Fail the answers whose Task was deleted before they were completed (``kubectl delete task``, a namespace
        removed): nobody will answer them, and a reader would wait forever. Looks at up to ``limit`` open answers
        older than ``grace`` seconds per call, in turn (a cursor goes round all of them); how many it failed."""
        cutoff = self._db.clock.now() - timedelta(seconds=grace)
        async with self._db.transaction(read_only=True) as tx:
            page = await tx.messages.list_open_responses(created_before=cutoff, after=self._orphan_cursor, limit=limit)
        self._orphan_cursor = page[-1].id if len(page) == limit else None
        failed = 0
        for response in page:
            if response.task_id is None or await self._tasks.get(response.task_id) is not None:
                continue
            try:
                await self.complete(response.task_id, error=TASK_DELETED)
            except Conflict:
                continue  # completed in between by its responder: nothing to do
            _log.info("task %s was deleted before it was answered: its answer failed", response.task_id)
            failed += 1
        return failed

    # -- the operator surface: Tasks per responder, keyed outputs, the work conversation ----------------------

    @property
    def stopping(self) -> asyncio.Event:
        """Set by `begin_shutdown`: long waits (the wait routes) return their current state at once."""
        return self._stopping

    def begin_shutdown(self) -> None:
        """End every bounded wait that watches `stopping`; nothing else changes."""
        self._stopping.set()

    async def list_tasks(
        self, actor: Identity, kind: str, key: str, *, after: str | None = None, limit: int = 100
    ) -> list[Message]:
        """The response messages of the Tasks addressed to ``kind:key`` whose delivery is not ``closed``, in task
        id order after ``after``. Only that responder itself (a token caller) or the admin may list (403)."""
        if not (actor.admin or (actor.trusted and (actor.kind, actor.key) == (kind, key))):
            raise ApiError("forbidden", f"only {kind}:{key} itself (or the admin) may list its Tasks")
        if kind not in AUTHOR_KINDS:
            raise InvalidRecord(f"a Task's responder is an operator or a harness, not {kind!r}")
        async with self._db.transaction(read_only=True) as tx:
            return await tx.messages.list_open_tasks(kind, key, after=after, limit=limit)  # type: ignore[arg-type]

    async def put_output(self, task_id: str, output: OutputSpec, *, actor: Identity) -> tuple[Message, bool]:
        """Speak (``stream=False``: a completed message) or Tell (a ``streaming`` one) as ``actor`` in the Task's
        main or work conversation; returns the message and whether it was created now.

        Keyed by (task, ``output.key``): the key is stored in the message's transaction, so a retry with the same
        parameters gets the same message (even across a crash, even when two arrive at once), other parameters a
        ``Conflict``. A new key once completion has begun is a ``Conflict``.
        """
        content = output.model()
        params = output.params_hash()
        for _ in range(3):
            try:
                return await self._put_output(task_id, output, content, params, actor)
            except _OutputRaced:
                continue  # another request stored this key meanwhile: read its row
        raise Conflict(f"task {task_id}: output {output.key!r} keeps changing; retry")

    async def _put_output(
        self, task_id: str, output: OutputSpec, content: dict[str, Any], params: str, actor: Identity
    ) -> tuple[Message, bool]:
        async with self._db.transaction() as tx:
            input_, response = await tx.messages.task_pair(task_id)
            response = await tx.messages.lock(response.id)  # serializes the Task's outputs and its completion
            check_responder(actor, response)
            existing = await tx.task_outputs.find(task_id, output.key)
            if existing is not None:
                if existing.params_hash != params:
                    raise Conflict(f"task {task_id} already has output {output.key!r} with other parameters")
                return await tx.messages.get(existing.message_id), False
            if response.delivery_state:
                raise Conflict(f"task {task_id} is completing; it takes no new outputs")
            if output.conversation == "main":
                conversation_id, reply_to = response.conversation_id, input_.id
            else:
                conversation_id, reply_to = (await self._work_conversation(tx, task_id, response, "")).id, None
            message = await open_message(
                tx,
                NewMessage(
                    conversation_id=conversation_id,
                    kind=actor.kind,  # the responder (check_responder): an operator or a harness
                    key=actor.key,
                    purpose="output",
                    content=content,
                    task_id=task_id,
                    reply_to_message_id=reply_to,
                    status="streaming" if output.stream else "completed",
                ),
                bus=self._bus,
            )
            try:
                await tx.task_outputs.insert(task_id, output.key, params, message.id)
            except Conflict as exc:
                raise _OutputRaced(output.key) from exc  # rolls this message back
            return message, True

    async def emit_output(
        self, task_id: str, message_id: str, events: Sequence[Mapping[str, Any]], *, actor: Identity
    ) -> Emitted:
        """Append ``set`` / ``append`` / ``error`` events to a keyed output of the Task (no Human blocks);
        ``Conflict`` once it has ended or the Task's completion has begun, ``NotFound`` for any other message."""
        async with self._db.transaction() as tx:
            _, response = await tx.messages.task_pair(task_id)
            response = await tx.messages.lock(response.id)
            check_responder(actor, response)
            await _keyed_output(tx, task_id, message_id)
            if response.delivery_state:
                raise Conflict(f"task {task_id} is completing; its outputs take no more events")
            message, stored = await emit(tx, message_id, events, bus=self._bus)
        return Emitted(message, stored)

    async def end_output(
        self, task_id: str, message_id: str, *, error: Mapping[str, str] | None = None, actor: Identity
    ) -> Message:
        """End a keyed output once: ``completed``, or ``failed`` with ``error``. The same end again returns the
        message unchanged; a different one is a ``Conflict``. An output the Task's completion already ended takes
        the end that matches its status (else ``Conflict``)."""
        intent = _intent(error)
        async with self._db.transaction() as tx:
            _, response = await tx.messages.task_pair(task_id)
            response = await tx.messages.lock(response.id)
            check_responder(actor, response)
            output = await _keyed_output(tx, task_id, message_id)
            message = await tx.messages.lock(message_id)
            if output.end_intent is not None:
                if output.end_intent != intent:
                    raise Conflict(f"output {message_id} has already ended otherwise")
                return message
            status: TerminalStatus = "failed" if intent["error"] else "completed"
            if message.status in TERMINAL_STATUSES:
                if message.status != status:
                    raise Conflict(f"output {message_id} was already ended ({message.status})")
            else:
                message = await finish(tx, message_id, status, error=intent["error"], bus=self._bus)
            await tx.task_outputs.set_end(message_id, intent)
            return message

    async def work_conversation_state(self, task_id: str) -> tuple[str | None, bool]:
        """The Task's work conversation id (None before its first use) and whether its completion has begun, in one
        read: a call start that finds both settled needs no other read before the engine's own transaction."""
        async with self._db.transaction(read_only=True) as tx:
            _, response = await tx.messages.task_pair(task_id)
            work = await tx.conversations.find_work(task_id)
        return (None if work is None else work.id), bool(response.delivery_state)

    async def checked_work_state(self, actor: Identity, task_id: str) -> tuple[Identity, str | None, bool]:
        """`check_task_access` (no conversation or message named) and `work_conversation_state` in one read: the
        Task's asker, its work conversation id (None before its first use) and whether its completion has begun."""
        async with self._db.transaction(read_only=True) as tx:
            input_, response = await tx.messages.task_pair(task_id)
            check_responder(actor, response)
            work = await tx.conversations.find_work(task_id)
        return Identity(input_.kind, input_.key), (None if work is None else work.id), bool(response.delivery_state)

    async def work_conversation_id(self, task_id: str, *, create: bool = True) -> str | None:
        """The id of the Task's work conversation, created on first use (``Conflict`` once completion has begun);
        with ``create=False`` None when there is none. For harness calls whose output goes there."""
        # A read first: only the Task's first call creates the conversation, and a write transaction would wait
        # for the writer behind the Task's running calls. Completion may begin right after either answer, as it
        # may after the write below commits: the engine's start is another transaction in both cases.
        async with self._db.transaction(read_only=True) as tx:
            _, response = await tx.messages.task_pair(task_id)
            work = await tx.conversations.find_work(task_id)
            if not create:
                return None if work is None else work.id
            if work is not None:
                if response.delivery_state:
                    raise Conflict(f"task {task_id} is completing; it takes no new outputs")
                return work.id
        async with self._db.transaction() as tx:
            _, response = await tx.messages.task_pair(task_id)
            response = await tx.messages.lock(response.id)
            if response.delivery_state:
                raise Conflict(f"task {task_id} is completing; it takes no new outputs")
            return (await self._work_conversation(tx, task_id, response, "")).id

    async def _work_conversation(self, tx: Transaction, task_id: str, response: Message, name: str) -> Conversation:
        work = await tx.conversations.find_work(task_id)
        if work is None:  # one per Task: the unique task_id refuses a second (its transaction rolls back)
            work = await tx.conversations.create(
                actor_kind=response.kind, actor_key=response.key, task_id=task_id, name=name
            )
        return work


class _OutputRaced(LoopdError):
    """Another request stored the same output key first: roll back and read its row."""


async def _keyed_output(tx: Transaction, task_id: str, message_id: str) -> TaskOutput:
    try:
        output = await tx.task_outputs.by_message(message_id)
    except NotFound:
        raise NotFound(f"message {message_id} is not an output of task {task_id} opened by key") from None
    if output.task_id != task_id:
        raise NotFound(f"message {message_id} is not an output of task {task_id}")
    return output


@dataclass(frozen=True, slots=True)
class OutputSpec:
    """What a Speak / Tell asks for: the client's key, where (``main`` or ``work``), streaming or complete, and
    the opening content (``text`` → one text block ``text``, or an AgentUE ``content`` model) and ``title``."""

    key: str
    conversation: Literal["work", "main"] = "work"
    stream: bool = False
    text: str | None = None
    content: Mapping[str, Any] | None = None
    title: str | None = None

    def params_hash(self) -> str:
        """The digest of everything but the key: the same key with another digest is a different request."""
        return digest(
            {
                "conversation": self.conversation,
                "stream": self.stream,
                "text": self.text,
                "content": None if self.content is None else dict(self.content),
                "title": self.title,
            }
        )

    def model(self) -> dict[str, Any]:
        """The opening (or whole) content model; ``InvalidRecord`` for a bad model, Human blocks or a complete
        message without exactly one of text / content."""
        if not isinstance(self.key, str) or not self.key or len(self.key) > 200:
            raise InvalidRecord("an output key is 1 to 200 characters")
        if self.text is not None and self.content is not None:
            raise InvalidRecord("send text or content, not both")
        if not self.stream and self.text is None and self.content is None:
            raise InvalidRecord("a complete output (stream=false) needs text or content")
        if self.content is not None:
            try:
                model = validate_model(dict(self.content), typed_blocks=True).to_json()
            except AgentUEError as exc:
                raise InvalidRecord(f"content is not a valid AgentUE model: {exc}") from exc
            if any(block.get("type") in HUMAN_BLOCK_TYPES for block in model["blocks"]):
                raise InvalidRecord("ask / confirm / human_reply blocks are created through the Human API only")
            if "human" in model["meta"]:
                raise InvalidRecord("meta.human is reserved for the Human API")
        else:
            model = empty_model()
            if self.text is not None:
                model["blocks"] = [{"id": "text", "type": "text", "content": self.text}]
        if self.title:
            model["meta"] = {**model["meta"], "title": self.title}
        return model
