"""`HarnessResponder`: the reconciler that answers Tasks whose target is a harness, through the Harness Engine.

Per reconcile of Task ``default/<task id>`` (it always re-reads; it may run any number of times):

0. its question is being stored by this process right now (``questions``, the chat's `QuestionWindow`: the Task
   is created inside the question's transaction, and its watch event usually arrives before the commit) → set it
   aside, read nothing; the window's close queues it again;
1. the Task (as the controller's informer caches it; from the API when it is not cached) is gone, being deleted, or
   not for a harness → nothing to do;
2. the call (owner = the Task's UID, effect key ``respond``) exists → go to 4 (not looked for by the first
   reconcile after this process stored the Task's question: the Task has no call unless a responder started one
   since, which the start then finds);
3. read the Task's context (a storage ``NotFound`` is the commit window of a question another process stores, or
   one whose window this process did not see: requeue shortly), and start the call
   with the input text, the visible history before it, the response message as its destination and the
   asker as the only one who may answer its gates (`CapacityExceeded` → requeue later; an unknown target →
   complete the Task with that error) — or, when the same harness answered earlier in the conversation and that
   call succeeded, going on from that call's session (a fork at its settled end) with only the messages after
   that answer as history (`continue_sessions`; see `_continuation`);
4. while the call runs → ``Result(requeue_after=poll)``; once it is terminal → ``chat.complete(task_id,
   error=...)`` (idempotent; ``Conflict`` while Human questions are pending → requeue).

Status: the Task's status says who holds it — ``phase`` (``Pending`` while refused for capacity, ``Running``,
``WaitingInput`` while the harness waits for a person), ``responder`` (``harness:<key>``) and ``startedAt`` (when
its call started) — written through the status subresource only when one of them changes (one write per phase
change; the reconcile compares with the status it just read). Never any content. A failed status write is logged
and answering goes on. The first one waits until this process has held the Task ``report_after`` (1 s, on its
monotonic clock): a call that ends sooner completes its Task — which deletes it — before anyone could have seen
the status, so it gets none (a resource write and its watch events saved per quick answer); a longer one is
reported by the reconcile that runs when that time is up. A Task refused for capacity says ``Pending`` from the
first wake or retry after it has waited as long.

Wake-ups: a harness finishing does not change the Task, so the Task watch does not wake it. The responder listens
to the engine's notices instead (`HarnessEngine.add_listener`) and, through its controller
(``bind_controller``, called by the reconcile runtime), queues the Task at once when its call ends, and queues
the oldest Tasks refused for capacity when slots free. The maps behind that hold one entry per Task
being answered and are emptied as Tasks complete or go away. ``poll`` (5 s) and ``capacity_retry`` (2 s) stay as
the safety net: a call driven by another replica sends no notice here. A Task refused for capacity that only a slot
can move on — said ``Pending`` already, and no earlier answer streams in its conversation that could take its input
— is not read again by its retries while every slot stays taken (``idle_retries``): under a burst, hundreds of Tasks
wait, and re-reading each every 2 s was most of the responder's work. What needs no reconcile gets none: the
controller's event filter (`HarnessResponder.event_filter`) drops the Task's status-only changes and its deletion
(what the responder holds for a deleted Task is dropped right there), and a timer or wake-up of a Task this
responder completed — completing deletes it — returns at once (the last `COMPLETED_KEPT` are remembered; a Task
created again under such a name is reconciled as usual).

Follow-ups: a Task for a harness whose conversation holds an earlier answer of the same harness still streaming is
a user adding context while that harness works. Before starting a call of its own, the responder hands the new
input to the running call (`HarnessEngine.add_input`, the harness's queued-input rule: the model sees it at its next
step, or the call's next turn answers it), answers the follow-up's own response with `FOLLOWUP_ANSWER` and
completes it. When the call is driven on another replica, it waits for that replica's responder to do it
(``followup_retry``, at most ``followup_wait`` seconds after the Task was created); when the call cannot take it
(its turn ended, or the harness takes no follow-ups), the follow-up is answered as its own Task.

The chat side is the small `ChatPort` protocol (``loopd.server.chat.TaskApi`` satisfies it), so tests can use any
implementation built on storage and streams.
"""

from __future__ import annotations

import contextlib
import enum
import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Protocol

from loopd._infra.clock import Clock, SystemClock
from loopd._infra.telemetry import task_span
from loopd.resources import NotFound as ResourceNotFound
from loopd.resources import ResourceError
from loopd.resources.client import TASKS, ResourceClient, name_of, namespace_of
from loopd.resources.reconcile import Controller, InformerEvent, Request, Result, ignore_status_updates
from loopd.server.engine import (
    DEFAULT_TIMEOUT,
    MODE_OPTION,
    AdapterError,
    CallRequest,
    CapacityExceeded,
    EngineNotice,
    HarnessEngine,
    HistoryEntry,
    UnknownTarget,
    history_of,
    workspace_of,
)
from loopd.server.storage import Conflict, ConversationFork, HarnessCall, Message
from loopd.server.storage import NotFound as StorageNotFound

_log = logging.getLogger(__name__)

EFFECT_KEY: Final = "respond"
_TASK_PHASES: Final[Mapping[str, str]] = {"waiting_input": "WaitingInput"}
"""Task phase by harness call phase (any other running phase is ``Running``)."""
DEFAULT_POLL: Final = 5.0
DEFAULT_REPORT_AFTER: Final = 1.0
"""A Task's status is written once its call has run (or it has waited for a slot) this long: one that completes
sooner is deleted without ever having had one."""
COMPLETED_KEPT: Final = 4096
"""Tasks this responder completed (and so deleted) that it remembers, newest last: a timer or wake-up of one of them
needs no read (`HarnessResponder.reconcile`)."""
DEFAULT_CAPACITY_RETRY: Final = 2.0
FOLLOWUP_ANSWER: Final = "Added to the answer in progress."
"""The answer of a follow-up handed to a running harness call (the earlier answer carries its effect)."""
DEFAULT_FOLLOWUP_RETRY: Final = 0.5
DEFAULT_FOLLOWUP_WAIT: Final = 20.0
HISTORY_PROBE: Final = 16
"""Messages of a Task's history read first when answers go on from earlier sessions (`HarnessResponder._read_context`);
the whole visible history only when the harness did not answer among them."""


PENDING_MESSAGE: Final = "waiting for a free harness slot"


class _Wait(enum.Enum):
    """What the retry of a Task refused for capacity does while every slot stays taken."""

    READ = "read"
    """Reconcile it as usual (an earlier answer in its conversation may yet take its input)."""
    SAY_PENDING = "say pending"
    """Only a slot can move it on; once it has waited ``report_after``, say Pending from the Task alone."""
    IDLE = "idle"
    """Only a slot can move it on, and it was said Pending: read nothing."""


@dataclass(frozen=True, slots=True)
class ResponderStatistics:
    following: int
    """Tasks whose call ending wakes them (started or about to start, not yet completed)."""
    waiting_for_capacity: int
    """Tasks refused for capacity, to be woken when slots free."""
    woken: int
    """Tasks queued by an engine notice (call ended, or a slot freed)."""
    call_ended_wakes: int
    """Of those, woken because their call ended."""
    skipped: int = 0
    """Reconciles that read nothing: the Task was completed (and deleted) here already."""
    idle_retries: int = 0
    """Capacity retries that read nothing: the Task waits for a slot only, and every slot was still taken."""


class TaskContextView(Protocol):
    """What the responder reads of a Task's context (``loopd.server.chat.TaskContext`` has it)."""

    @property
    def input(self) -> Message: ...

    @property
    def response(self) -> Message: ...

    @property
    def history(self) -> Sequence[Message]: ...

    @property
    def has_earlier(self) -> bool:
        """Whether the conversation holds older messages than ``history``."""
        ...

    @property
    def fork(self) -> ConversationFork | None:
        """Where the conversation was forked from (None: no fork), read with the rest."""
        ...

    @property
    def conversation_mode(self) -> str | None:
        """The mode its built-in harness calls start in (``PUT …/mode``; None: the harness's own)."""
        ...


class ForkOrigins(Protocol):
    """Where forked conversations came from (``loopd.server.chat.ConversationForks`` has it)."""

    async def origin(self, conversation_id: str) -> ConversationFork | None: ...


class ConversationModes(Protocol):
    """The mode a conversation's built-in harness calls start in (``loopd.server.chat.ChatRequests`` has it)."""

    async def conversation_mode(self, conversation_id: str) -> str | None: ...


class QuestionWindowPort(Protocol):
    """Questions this process is storing right now (``loopd.server.chat.QuestionWindow``)."""

    def is_open(self, task_id: str) -> bool: ...

    def listen(self, callback: Callable[[str], None]) -> Callable[[], None]: ...

    def handed_over(self, task_id: str) -> TaskContextView | None:
        """The context a question's own transaction left for its Task (a conversation's first question), once."""
        ...


class ChatPort(Protocol):
    """The chat operations the responder needs (``loopd.server.chat.TaskApi`` has them)."""

    async def task_context(self, task_id: str, *, history: int | None = None) -> TaskContextView:
        """The Task's context; ``history``: at most that many of the newest messages (default: the whole visible
        history, as many as the chat keeps in view)."""
        ...

    async def complete(
        self,
        task_id: str,
        *,
        error: Mapping[str, str] | None = None,
        response_id: str | None = None,
        later: bool = False,
    ) -> object:
        """End the Task's answer and delete the Task (idempotent): once it returns, the answer has ended and the
        Task is gone — or, with ``later``, is deleted shortly (while the server is busy, the chat does it once it is
        idle). ``response_id``: its response message, when the caller knows it (the call's message)."""
        ...

    async def emit(self, task_id: str, events: Sequence[Mapping[str, Any]]) -> object: ...


def _history_of(context: TaskContextView) -> tuple[HistoryEntry, ...]:
    """The call's history: the context's messages before its own input, as text."""
    own = (context.input.id, context.response.id)
    return tuple(
        HistoryEntry(message.kind, message.key, text)
        for message in context.history
        if message.id not in own and (text := message_text(message.content))
    )


def _is_answer_of(message: Message, key: str) -> bool:
    """Whether ``message`` is harness ``key``'s answer to a question of its own (what `_continuation` goes on from:
    not a follow-up handed to a running call)."""
    return (
        message.purpose == "response"
        and message.kind == "harness"
        and message.key == key
        and message.task_id is not None
        and message_text(message.content) != FOLLOWUP_ANSWER
    )


def _answered_in(context: TaskContextView, key: str) -> bool:
    """Whether harness ``key`` answered a question of its own among the context's messages."""
    own = (context.input.id, context.response.id)
    return any(message.id not in own and _is_answer_of(message, key) for message in context.history)


def message_text(content: Mapping[str, Any]) -> str:
    """The plain text of a message: its text blocks' ``content`` (or ``text``), joined by blank lines."""
    parts: list[str] = []
    for block in content.get("blocks") or ():
        if not isinstance(block, Mapping) or block.get("type") != "text":
            continue
        text = block.get("content", block.get("text"))
        if isinstance(text, str) and text.strip():
            parts.append(text)
    return "\n\n".join(parts)


def call_error(call: HarnessCall) -> dict[str, str] | None:
    """What a terminal call means for the Task's completion: None for success, else ``{code, message}``."""
    if call.phase == "succeeded":
        return None
    error = call.error or {}
    code = str(error.get("code") or call.phase)
    message = str(error.get("message") or f"the harness call ended {call.phase}")
    return {"code": code, "message": message}


DEFAULT_ORPHAN_AFTER: Final = 120.0


def _rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _created_at(metadata: Mapping[str, Any]) -> datetime | None:
    text = metadata.get("creationTimestamp")
    if not isinstance(text, str):
        return None
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


class HarnessResponder:
    """Reconciles Tasks with ``spec.target.kind == "harness"`` (see the module docstring)."""

    def __init__(
        self,
        *,
        client: ResourceClient,
        engine: HarnessEngine,
        chat: ChatPort,
        timeout: float = DEFAULT_TIMEOUT,
        poll: float = DEFAULT_POLL,
        context_retry: float = 0.2,
        capacity_retry: float = DEFAULT_CAPACITY_RETRY,
        orphan_after: float = DEFAULT_ORPHAN_AFTER,
        followup_retry: float = DEFAULT_FOLLOWUP_RETRY,
        followup_wait: float = DEFAULT_FOLLOWUP_WAIT,
        report_after: float = DEFAULT_REPORT_AFTER,
        clock: Clock | None = None,
        forks: ForkOrigins | None = None,
        modes: ConversationModes | None = None,
        questions: QuestionWindowPort | None = None,
        continue_sessions: bool = True,
    ) -> None:
        self._client = client
        self._continue_sessions = continue_sessions
        self._engine = engine
        self._chat = chat
        self._timeout = timeout
        self._poll = poll
        self._context_retry = context_retry
        self._capacity_retry = capacity_retry
        self._orphan_after = orphan_after
        self._followup_retry = followup_retry
        self._followup_wait = followup_wait
        self._report_after = report_after
        self._clock = clock or SystemClock()  # wall time, to judge a Task's age against its creationTimestamp
        self._forks = forks
        self._modes = modes
        self._controller: Controller | None = None
        self._request_of: dict[str, Request] = {}  # owner uid → Task key
        self._uid_of: dict[Request, str] = {}
        # Refused for capacity, oldest first, with what a retry must do while every slot stays taken (`_Wait`).
        self._waiting: dict[Request, _Wait] = {}
        self._held_since: dict[Request, float] = {}  # monotonic time this process first held it (`_report_due`)
        self._completed: OrderedDict[Request, None] = OrderedDict()  # completed here, oldest first (`COMPLETED_KEPT`)
        self._skipped = 0
        self._idle_retries = 0
        self._woken = 0
        self._call_ended_wakes = 0
        self._remove_listener = engine.add_listener(self._on_notice)
        self._questions = questions
        self._set_aside: dict[str, Request] = {}  # Task name → key, while its question's commit window is open
        # Tasks whose question this process stored (its window closed), until their first reconcile after that:
        # asked here, so no call of theirs can exist unless a responder started one since, which a start finds
        # (replayed, or a Conflict that reads it).
        self._fresh: set[str] = set()
        # Calls a drive of this process ended, by owner uid, until the reconcile their end queues takes them: the
        # terminal call as its end committed it, so that reconcile completes the Task without reading the call.
        self._ended: dict[str, HarnessCall] = {}
        self._stop_window = questions.listen(self._on_window_closed) if questions is not None else None

    # --- wake-ups ------------------------------------------------------------------------------------------------

    def bind_controller(self, controller: Controller) -> None:
        """Queue Tasks through ``controller`` when the engine says so (the reconcile runtime calls this)."""
        self._controller = controller

    def close(self) -> None:
        """Stop listening to the engine (reconciles still work; they just poll)."""
        self._remove_listener()
        if self._stop_window is not None:
            self._stop_window()

    def statistics(self) -> ResponderStatistics:
        return ResponderStatistics(
            following=len(self._request_of),
            waiting_for_capacity=len(self._waiting),
            woken=self._woken,
            call_ended_wakes=self._call_ended_wakes,
            skipped=self._skipped,
            idle_retries=self._idle_retries,
        )

    def _on_notice(self, notice: EngineNotice) -> None:
        if notice.ended and notice.effect_key == EFFECT_KEY and notice.owner_uid is not None:
            request = self._request_of.get(notice.owner_uid)
            if request is not None and self._wake(request):
                self._call_ended_wakes += 1
                if notice.call is not None and notice.call.is_terminal:
                    if len(self._ended) >= COMPLETED_KEPT:
                        self._ended.clear()  # only a read saved per entry
                    self._ended[notice.owner_uid] = notice.call
        for _ in range(min(notice.free_slots, len(self._waiting))):
            request = next(iter(self._waiting))
            if not self._wake(request):
                break
            del self._waiting[request]

    def _on_window_closed(self, task_id: str) -> None:
        if len(self._fresh) >= COMPLETED_KEPT:
            self._fresh.clear()  # only a read saved per entry (Tasks of other responders are never reconciled here)
        self._fresh.add(task_id)
        request = self._set_aside.pop(task_id, None)
        if request is not None:
            self._wake(request)

    def _wake(self, request: Request) -> bool:
        controller = self._controller
        if controller is None or not controller.enqueue(request):
            return False
        self._woken += 1
        return True

    def _follow(self, request: Request, uid: str) -> None:
        previous = self._uid_of.get(request)
        if previous is not None and previous != uid:  # the Task was recreated under the same name
            self._request_of.pop(previous, None)
        self._uid_of[request] = uid
        self._request_of[uid] = request

    def _forget(self, request: Request) -> None:
        self._waiting.pop(request, None)
        self._held_since.pop(request, None)
        uid = self._uid_of.pop(request, None)
        if uid is not None:
            self._request_of.pop(uid, None)
            self._ended.pop(uid, None)

    # --- reconcile -----------------------------------------------------------------------------------------------

    def event_filter(self, event: InformerEvent) -> bool:
        """Which Task events queue a reconcile (the controller's ``event_filter``): not a status-only change (the
        responder's own writes, `ignore_status_updates`), and not a deletion — a reconcile of a deleted Task can only
        read that it is gone, so what the responder holds for it is dropped here instead. A Task created or changed
        under the name of one completed here is a new one: it is reconciled as usual."""
        request = Request(name_of(event.object), namespace_of(event.object))
        if event.type == "DELETED":
            self._forget(request)
            return False
        self._completed.pop(request, None)
        return ignore_status_updates(event)

    async def reconcile(self, request: Request) -> Result:
        if request in self._completed:
            # Completed and deleted here: what is left is a timer set while its call ran, or a late wake-up.
            self._skipped += 1
            return Result()
        result = await self._reconcile(request)
        if result == Result():
            self._forget(request)  # done with this Task (or it was never ours): hold nothing for it
        return result

    async def _reconcile(self, request: Request) -> Result:
        if self._questions is not None and self._questions.is_open(request.name):
            # Its question is being stored by this process: nothing to read yet. Set it aside; the window's close
            # (commit or rollback) queues it again — no polling, and no reads that can only find nothing.
            self._set_aside[request.name] = request
            return Result()
        fresh = request.name in self._fresh
        if fresh:
            self._fresh.discard(request.name)
        wait = self._waiting.get(request)
        if wait is not None and wait is not _Wait.READ:
            if self._full():
                # The safety-net retry of a Task that waits for a slot only: reading its context again could only
                # find it refused again (a slot's notice wakes the oldest waiting Tasks). Under a burst, hundreds
                # wait. One that has waited `report_after` is said Pending from its Task alone.
                if wait is _Wait.SAY_PENDING and self._report_due(request) == 0.0:
                    said = await self._say_pending(request)
                    if said is not None:
                        return said
                else:
                    self._idle_retries += 1
                    return Result(requeue_after=self._capacity_retry)
            self._set_wait(request, _Wait.READ)  # a slot is free (or the Task changed): read and start it as usual
        task = await self._read_task(request.name, request.namespace)
        if task is None:
            return Result()
        spec = task.get("spec") or {}
        target = spec.get("target") or {}
        metadata = task.get("metadata") or {}
        if target.get("kind") != "harness" or metadata.get("deletionTimestamp"):
            return Result()
        uid, key, task_id = str(metadata.get("uid") or ""), str(target.get("key") or ""), request.name
        if not uid or not key:
            _log.warning("task %s has no uid or no target key; ignoring it", task_id)
            return Result()
        # Before looking at the call: an end from here on queues this Task again, so none is missed.
        self._follow(request, uid)
        call = None if fresh else self._ended.pop(uid, None) or await self._engine.find(uid, EFFECT_KEY)
        if call is None:
            probed = False
            # A conversation's first question left its context with the window as it committed: nothing to read.
            context: TaskContextView | None = (
                self._questions.handed_over(task_id) if self._questions is not None else None
            )
            if context is None:
                try:  # read once, for the hand-over and the start
                    context, probed = await self._read_context(task_id, key)
                except StorageNotFound:
                    context = None  # the commit window (or an orphan): `_start` handles it
            earlier = self._earlier_answer(request, key, context)
            handed = await self._hand_over(request, key, _created_at(metadata), context, earlier)
            if handed is not None:
                return handed
            traced = {"loopd.task.id": task_id, "loopd.target": key}
            with task_span("loopd.server", "loopd.task", metadata.get("annotations"), traced):  # joins the question
                started = await self._start(request, uid, key, _created_at(metadata), context, probed)
            if isinstance(started, Result):
                # Refused for capacity (queued, nobody runs it yet): said once it has waited `report_after` — a
                # later wake or retry writes it; a Task that gets a slot sooner never shows it.
                if request in self._waiting:
                    # No earlier answer streams that could take its input once its call runs: from now on only a
                    # slot can change what a reconcile finds (an earlier answer can only end, never begin).
                    alone = earlier is None
                    if self._report_due(request) == 0.0:
                        await self._report(task, key, "Pending", None, PENDING_MESSAGE)
                        self._set_wait(request, _Wait.IDLE if alone else _Wait.READ)
                    elif alone:
                        self._set_wait(request, _Wait.SAY_PENDING)
                return started
            call = started
        if not call.is_terminal:
            due = self._report_due(request)
            if due > 0.0:  # the call's end, if it comes first, wakes this Task: completed, it gets no status
                return Result(requeue_after=min(due, self._poll))
            await self._report(task, key, _TASK_PHASES.get(call.phase, "Running"), call.created_at, None)
            return Result(requeue_after=self._poll)
        return await self._complete(request, call_error(call), call.message_id)

    async def _say_pending(self, request: Request) -> Result | None:
        """Say Pending for a Task that waits for a slot only, reading nothing but the Task; None when the Task is
        not the one that was refused (recreated under its name, being deleted): then it is read as usual."""
        task = await self._read_task(request.name, request.namespace)
        if task is None:
            return Result()
        metadata = task.get("metadata") or {}
        target = (task.get("spec") or {}).get("target") or {}
        if metadata.get("deletionTimestamp") or str(metadata.get("uid") or "") != self._uid_of.get(request):
            return None
        await self._report(task, str(target.get("key") or ""), "Pending", None, PENDING_MESSAGE)
        self._set_wait(request, _Wait.IDLE)
        return Result(requeue_after=self._capacity_retry)

    async def _read_task(self, name: str, namespace: str | None) -> dict[str, Any] | None:
        """The Task as the controller's informer holds it — kept current by the watch, and the event that queued
        this reconcile was applied to it before the reconcile was queued — or, when it is not cached (not seen yet,
        or gone), as the API has it now; None when it does not exist."""
        controller = self._controller
        if controller is not None:
            cached = controller.cache.get(name, namespace)
            if cached is not None:
                return cached
        try:
            return await self._client.get(TASKS, name, namespace=namespace)
        except ResourceNotFound:
            return None

    def _set_wait(self, request: Request, wait: _Wait) -> None:
        """Change what a waiting Task's retries do — unless a slot's notice woke it meanwhile (it left the queue)."""
        if request in self._waiting:
            self._waiting[request] = wait

    def _report_due(self, request: Request) -> float:
        """Seconds until the Task's status is to be written (0.0: now): ``report_after`` from the first reconcile
        that found it running or waiting for a slot here (this process's monotonic clock: no other clock's skew)."""
        if self._report_after <= 0.0:
            return 0.0
        now = self._clock.monotonic()
        return max(0.0, self._report_after - (now - self._held_since.setdefault(request, now)))

    async def _report(
        self, task: Mapping[str, Any], key: str, phase: str, started: datetime | None, message: str | None
    ) -> None:
        """Write the Task's status if who holds it, its phase or since when changed (see the module docstring)."""
        wanted: dict[str, Any] = {
            "phase": phase,
            "responder": f"harness:{key}",
            "startedAt": _rfc3339(started) if started is not None else None,
            "message": message,
        }
        current = task.get("status") or {}
        if all(current.get(name) == value for name, value in wanted.items()):
            return
        metadata = task.get("metadata") or {}
        name, namespace = str(metadata.get("name") or ""), metadata.get("namespace")
        try:
            # A merge patch: null removes a field (no startedAt while Pending, no message while Running).
            await self._client.patch(TASKS, name, {"status": wanted}, namespace=namespace, subresource="status")
        except ResourceNotFound:
            return  # completed and deleted meanwhile
        except ResourceError as exc:
            _log.warning("could not write the status of task %s: %s", name, exc)

    def _full(self) -> bool:
        """Whether this replica's harness call slots are all taken now (a start would be refused)."""
        stats = self._engine.statistics()
        return stats.slots_used >= stats.capacity

    def _refused(self, request: Request) -> Result:
        """No slot now: wait for a notice that one freed (``capacity_retry`` is the safety net)."""
        stats = self._engine.statistics()
        if stats.slots_used < stats.capacity:  # one freed while we were refused: its notice came too early
            self._waiting.pop(request, None)
            return Result(requeue_after=0.0)
        self._waiting.setdefault(request, _Wait.READ)
        return Result(requeue_after=self._capacity_retry)

    async def _read_context(self, task_id: str, key: str) -> tuple[TaskContextView, bool]:
        """The Task's context, and whether its history is only the newest `HISTORY_PROBE` messages of a longer one.

        When later questions go on from the harness's earlier answers (``continue_sessions``), the newest
        `HISTORY_PROBE` messages are read first: if the harness answered among them, that answer's session holds
        everything before it, and the older messages are never needed (in a long conversation, reading and decoding
        them was the larger part of starting each answer). Otherwise the whole visible history is read."""
        if self._continue_sessions:
            probed = await self._chat.task_context(task_id, history=HISTORY_PROBE)
            if not probed.has_earlier:
                return probed, False
            if _answered_in(probed, key):
                return probed, True
        return await self._chat.task_context(task_id), False

    async def _start(
        self,
        request: Request,
        uid: str,
        key: str,
        created: datetime | None,
        context: TaskContextView | None,
        probed: bool = False,
    ) -> HarnessCall | Result:
        """Start the Task's call from its ``context`` (None: its question is not stored, or not yet; ``probed``:
        its history is only the newest messages, see `_read_context`)."""
        task_id = request.name
        if context is None:
            age = (self._clock.now() - created).total_seconds() if created is not None else 0.0
            if age < self._orphan_after:
                # The commit window (milliseconds); back off a little if it lasts, in case the commit failed.
                return Result(requeue_after=self._context_retry if age < 2.0 else min(5.0, self._orphan_after / 10))
            # No question ever committed for this Task: the server crashed between creating the Task and
            # deleting it after a failed commit. Nothing can answer it; remove it.
            _log.warning("task %s has had no question for %.0f s: deleting the orphan Task", task_id, age)
            with contextlib.suppress(ResourceNotFound):  # already gone is fine
                await self._client.delete(TASKS, task_id, namespace=request.namespace)
            return Result()
        if context.response.status != "streaming":
            # Answered before and the completion was interrupted: finish it with the outcome it recorded.
            recorded = (context.response.completion or {}).get("error")
            return await self._complete(request, dict(recorded) if isinstance(recorded, Mapping) else None)
        history = _history_of(context)
        if self._full():
            # No slot: a start would be refused inside its write transaction. Wait for one without reading or
            # writing more (the context was read for the hand-over already; where to fork from is found once a
            # slot is free).
            return self._refused(request)
        fork: tuple[str, int] | None = None
        forked = await self._fork_start(context, key)
        continued = None if forked is not None else await self._continuation(context, key)
        if forked is not None:
            fork, history = forked
        elif continued is not None:
            fork, history = continued
        elif probed:  # it cannot go on from that answer's session after all: afresh, from the whole history
            context = await self._chat.task_context(task_id)
            history = _history_of(context)
        # The conversation's mode (``PUT …/mode``), read with the context as the call starts: it applies from this
        # question on.
        mode = context.conversation_mode if self._modes else None
        if continued is not None and mode is None:
            mode = ""  # the harness's own mode, not the one the session it goes on from ended in (`MODE_OPTION`)
        call_request = CallRequest(
            owner_uid=uid,
            effect_key=EFFECT_KEY,
            target=key,
            text=message_text(context.input.content) or "(empty message)",
            message_id=context.response.id,
            history=history,
            params={MODE_OPTION: mode} if mode is not None else {},
            asker=f"{context.input.kind}:{context.input.key}",
            timeout=self._timeout,
            fork=fork,
        )
        try:
            call = await self._engine.start(call_request)
        except CapacityExceeded:
            return self._refused(request)
        except UnknownTarget as exc:
            return await self._complete(request, {"code": "unknown_target", "message": exc.message})
        except Conflict:
            # Started meanwhile with other parameters (the history changed between two reconciles): use that one.
            existing = await self._engine.find(uid, EFFECT_KEY)
            if existing is None:
                raise
            call = existing
        self._waiting.pop(request, None)
        return call

    async def _fork_start(
        self, context: TaskContextView, key: str
    ) -> tuple[tuple[str, int], tuple[HistoryEntry, ...]] | None:
        """For the first question of a forked conversation ("retry from here", "edit and resend"): start the call
        as a fork of the harness session that produced the source answer, just before the turn that took its
        input, with that call's history. None (answer as usual, from the visible history) when the conversation
        is no fork, this is a later question, or the source answer's harness cannot fork (remote, another target)."""
        if self._forks is None:
            return None
        own = (context.input.id, context.response.id)
        if any(message.task_id is not None for message in context.history if message.id not in own):
            return None  # the fork's copied history has no Tasks: an earlier question of the fork has one
        origin = context.fork  # read with the context: no transaction of its own
        if origin is None:
            return None
        source = await self._engine.call_for_message(origin.source_message_id)
        if source is None or source.target != key:
            return None
        try:
            point = await self._engine.fork_point(source)
        except AdapterError as exc:
            _log.warning("cannot fork the session of call %s (answering from the history instead): %s", source.id, exc)
            return None
        return None if point is None else (point, history_of(source.params))

    async def _continuation(
        self, context: TaskContextView, key: str
    ) -> tuple[tuple[str, int], tuple[HistoryEntry, ...]] | None:
        """For a later question to the same harness: go on from the session of that harness's last answer in the
        conversation (a fork at its end), with only the messages after that answer as history — the session holds
        everything before, its own tool calls and results included. None (start afresh from the visible history)
        when ``continue_sessions`` is off, the harness has no answer in the visible history, that answer did not
        end well, another answer of it is still streaming, or its harness cannot go on from a session."""
        if not self._continue_sessions:
            return None
        own = (context.input.id, context.response.id)
        history = [message for message in context.history if message.id not in own]
        mine = [index for index, message in enumerate(history) if _is_answer_of(message, key)]
        if not mine:
            return None
        last = history[mine[-1]]
        later = history[mine[-1] + 1 :]
        if last.status != "completed" or any(
            message.purpose == "response" and message.status == "streaming" for message in later
        ):
            return None
        source = await self._engine.call_for_message(last.id)
        if source is None or source.target != key or source.phase != "succeeded":
            return None
        if workspace_of(source.params) != (None, None):  # a call in its own workspace: its session stays its own
            return None
        try:
            point = await self._engine.continuation_point(source)
        except AdapterError as exc:
            _log.warning(
                "cannot go on from the session of call %s (answering from the history instead): %s", source.id, exc
            )
            return None
        if point is None:
            return None
        # A follow-up handed to a running call went into that call's session (its response says so): not again.
        handed = {message.task_id for message in later if message_text(message.content) == FOLLOWUP_ANSWER}
        entries = tuple(
            HistoryEntry(message.kind, message.key, text)
            for message in later
            if message.task_id is None or message.task_id not in handed
            if (text := message_text(message.content))
        )
        return point, entries

    def _earlier_answer(self, request: Request, key: str, context: TaskContextView | None) -> Message | None:
        """The answer of the same harness still streaming in the Task's conversation, whose call may take the
        Task's input (see `_hand_over`); None when there is none, or the harness takes no inputs."""
        if not self._engine.takes_inputs(key) or context is None:  # None: the commit window, `_start` handles it
            return None
        if context.response.status != "streaming":
            return None
        return next(
            (
                message
                for message in reversed(context.history)
                if message.purpose == "response"
                and message.kind == "harness"
                and message.key == key
                and message.status == "streaming"
                and message.task_id not in (None, request.name)
            ),
            None,
        )

    async def _hand_over(
        self,
        request: Request,
        key: str,
        created: datetime | None,
        context: TaskContextView | None,
        earlier: Message | None,
    ) -> Result | None:
        """Hand the Task's input to ``earlier`` (`_earlier_answer`), whose call of the same harness still answers
        in its conversation (see the module docstring); None when there is none or it cannot take it: answer it as
        its own Task."""
        if context is None or earlier is None or earlier.task_id is None:
            return None
        task = await self._read_task(earlier.task_id, request.namespace)
        if task is None:
            return None
        running = await self._engine.find(str((task.get("metadata") or {}).get("uid") or ""), EFFECT_KEY)
        text = message_text(context.input.content)
        if running is None or running.is_terminal or not text:
            return None
        outcome = await self._engine.add_input(running.id, text, key=context.input.id)
        if outcome == "elsewhere":
            age = (self._clock.now() - created).total_seconds() if created is not None else 0.0
            # Another replica drives the call: its responder hands the input over; answer it alone if none does.
            return Result(requeue_after=self._followup_retry) if age < self._followup_wait else None
        if outcome == "refused":
            return None
        _log.info("task %s: the follow-up went to the running call %s", request.name, running.id)
        event = {"op": "set", "block": {"id": "answer", "type": "text", "content": FOLLOWUP_ANSWER}}
        with contextlib.suppress(Conflict):  # completing already (a second reconcile): completing is idempotent
            await self._chat.emit(request.name, [event])
        return await self._complete(request, None)

    async def _complete(self, request: Request, error: dict[str, str] | None, response_id: str | None = None) -> Result:
        task_id = request.name
        try:
            # The Task's delete may wait while other answers run: nobody waits for it once the answer has ended.
            await self._chat.complete(task_id, error=error, response_id=response_id, later=True)
        except Conflict as exc:
            _log.info("task %s cannot complete yet: %s", task_id, exc.message)
            return Result(requeue_after=self._poll)
        except StorageNotFound:
            return Result()  # its messages are gone: nothing left to finish
        # Completing deleted the Task (or will): remember that a while, so the timer its call set reads nothing.
        self._completed[request] = None
        self._completed.move_to_end(request)
        if len(self._completed) > COMPLETED_KEPT:
            self._completed.popitem(last=False)
        return Result()
