"""Driving one claimed call: begin (phase + attempt), start or resume the adapter, project its updates, watch.

A `Drive` runs while its engine holds the call's lease (fencing token ``token``). Every write is a *fenced*
transaction: ``leases.check_token`` first, then the call row, then the message (lock order lease → call →
message), so a stale holder's write is refused (``Fenced``) and the drive ends without touching anything.

Two tasks work side by side:

- the consumer reads the adapter's updates (through a bounded queue, which coalesces previews) and applies
  each durable one — with the durable ones already queued behind it, up to ``MAX_DURABLE_BATCH``, in the same
  transaction — with its visible events, its ledger facts, the checkpoint + hash, and the phase (a batch is
  committed whole or not at all, as if each had its own transaction, and moves the checkpoint once, to its last
  update); live text waits a moment for what follows it (`gather_wait`: ``PREVIEW_GATHER``, longer while many calls
  stream at once); live-text previews already queued in front
  of a durable update go in that update's transaction (shown first), else in their own; an update at or below the
  stored checkpoint
  is a replay and is skipped (at the checkpoint the hash must match, or the call fails with ``replay_differs``);
- the watcher renews the lease every ttl/3 and, every tick (or when poked), re-reads the call and its message:
  a cancel request, a passed deadline or a closed message stops the drive; gate answers recorded in the
  message are forwarded to the adapter.

A drive ends in one of four ways (`Outcome`): ``done`` (the call is terminal), ``lost`` (the lease is gone:
someone else drives the call now), ``retry`` (the adapter lost sight of the execution: resume later) or it is
cancelled (the engine stops or crashes: nothing more is written; the execution stays resumable). The transaction
that makes the call terminal also gives the lease up (`Drive.released`); otherwise the driver releases it after the
drive (not after ``lost``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from loopd._infra.clock import Clock, wait_event
from loopd._infra.errors import LoopdError
from loopd._infra.metrics import Metrics
from loopd._infra.tasks import background, race
from loopd._infra.telemetry import Context, SpanKind, tracer, tracing_enabled
from loopd.agentue import Model
from loopd.harness.models import Pacer, pace_whole_replies
from loopd.server import streams
from loopd.server.ledger import EffectKind, Idempotency, LedgerFacts, Redactor
from loopd.server.storage import (
    Conflict,
    Database,
    Fenced,
    HarnessCall,
    HarnessPhase,
    InvalidRecord,
    Message,
    NotFound,
    StorageError,
    Transaction,
)
from loopd.server.streams import ConversationBus

from ._adapter import (
    GATE_ANSWERS,
    AdapterRequest,
    AdapterRun,
    AnswersQuestions,
    Failed,
    Finished,
    GateAnswer,
    GateOpened,
    GateResolved,
    HarnessAdapter,
    InputCapable,
    ModelCalled,
    QuestionAsked,
    QuestionClosed,
    TextPreview,
    TextSet,
    Update,
)
from ._errors import HarnessEngineError, ObservationLost, ResumeUnsupported
from ._projection import closed_gates, merge_previews, next_hash, project, shown_answer
from ._requests import fork_of, history_of, workspace_of
from ._trail import Trail, interrupted_usage, trail_ordering

_log = logging.getLogger(__name__)
_MESSAGE_STATUS: Final[Mapping[str, streams.TerminalStatus]] = {"succeeded": "completed", "cancelled": "cancelled"}
"""How an output the engine opened for a call ends, by the call's terminal phase (any other: ``failed``)."""

Outcome = Literal["done", "lost", "retry"]
QUEUE_SIZE: Final = 256
MAX_PREVIEW_BATCH: Final = 64
MAX_DURABLE_BATCH: Final = 32
"""Durable updates already queued that one transaction applies together (the checkpoint moves once, to the last)."""
PREVIEW_GATHER: Final = 0.016
"""Seconds live text waits for what the harness says next before it is written (see `Drive._gather_previews`): a
call's first text always, later text while few calls stream at once (`gather_wait`)."""
PREVIEW_WRITES_PER_SECOND: Final = 1000
"""Live-text writes per second an engine's drives aim at together once many calls stream at once: each call's later
text then waits ``calls streaming / PREVIEW_WRITES_PER_SECOND`` seconds (`gather_wait`)."""
STREAMING_HORIZON: Final = 1.0
"""A call counts as streaming while it wrote live text within this many seconds (`LiveText`)."""
PREVIEW_GATHER_MAX: Final = 0.1
"""The longest later text waits for more, however many calls stream: what a reader sees arrives in pieces at least
ten times a second."""


class LiveText:
    """Which calls of an engine stream text now: those whose drive wrote live text within `STREAMING_HORIZON` seconds
    (a call waiting for a tool or a person does not count). Amortized O(1): calls are kept in the order they last
    wrote, and the stale ones are dropped from the front."""

    def __init__(self, monotonic: Callable[[], float], horizon: float = STREAMING_HORIZON) -> None:
        self._monotonic = monotonic
        self._horizon = horizon
        self._last: OrderedDict[str, float] = OrderedDict()

    def wrote(self, call_id: str) -> None:
        """``call_id``'s drive is writing live text now."""
        self._last[call_id] = self._monotonic()
        self._last.move_to_end(call_id)

    def streaming(self) -> int:
        """How many calls wrote live text within the horizon."""
        stale = self._monotonic() - self._horizon
        last = self._last
        while last:
            oldest = next(iter(last))
            if last[oldest] > stale:
                break
            del last[oldest]
        return len(last)


def gather_wait(first_text: bool, calls_streaming: int) -> float:
    """Seconds a drive's live text waits for what the harness says next before it is written.

    Every write of live text is a transaction (the events, stored before anyone sees them), and a model streaming at
    a reader's pace hands over a piece every 10-50 ms: written one by one, 100 such answers at once cost the server
    more CPU than their answers take to stream (measured: 16 ms per chat against 8 for the same answers arriving
    whole), so every answer falls behind. A call's first text waits only `PREVIEW_GATHER` (the time to its first
    word); later text waits long enough that all calls streaming text (`LiveText`) together write about
    `PREVIEW_WRITES_PER_SECOND` times a second — ``PREVIEW_GATHER`` for up to 16 calls, 100 ms (`PREVIEW_GATHER_MAX`)
    from 100 — and what arrives meanwhile goes in the same write."""
    if first_text:
        return PREVIEW_GATHER
    return min(PREVIEW_GATHER_MAX, max(PREVIEW_GATHER, calls_streaming / PREVIEW_WRITES_PER_SECOND))


def call_channel(call_id: str) -> str:
    """The bus channel a call's end is announced on (after its commit): `HarnessEngine.wait` sleeps on it instead of
    on the call's conversation, whose every streamed event (of all the calls side by side there) would wake it."""
    return f"harness-call/{call_id}"


def lease_resource(call_id: str) -> str:
    return f"harness-call/{call_id}"


@dataclass(frozen=True, slots=True)
class DriveSettings:
    """What every drive of one engine shares."""

    db: Database
    bus: ConversationBus
    clock: Clock
    """Timers (lease renewal, the watch tick) and wall time (deadlines, the trail's timestamps)."""
    replica_id: str
    lease_ttl: float
    tick: float
    adapter_timeout: float
    metrics: Metrics | None = None
    """Where drives record time to first text, completion, tokens and cost (None: nowhere)."""
    redactor: Redactor | None = None
    """Applied to what the trail stores of tool inputs and outputs (prompts are redacted by their recorder)."""
    ledger_actors: dict[str, str] = field(default_factory=dict)
    """Ledger actor key → id, as a committed transaction of any of this engine's drives ensured it (the engine's own
    and one per harness target). Ledger actors are never removed: ensured once per engine, not per call."""
    ledger_facts: LedgerFacts = field(default_factory=LedgerFacts)
    """The ledger's immutable facts (an entity's lane, a lane's session, existing actors) this engine's drives saw
    committed: the trail's checks read each once per engine, not once per append."""
    slots_full: Callable[[], bool] = lambda: False
    """Whether every call slot of the engine is taken: then a drive does not hold its own back for others (see
    `FirstOutputs`): the answers still blank may be waiting for the very slot it holds."""
    live_text: LiveText | None = None
    """Which of the engine's calls stream text now: how long later live text waits (`gather_wait`; None: as if only
    this one did)."""


class _End:
    """The adapter's update stream ended."""


@dataclass(frozen=True, slots=True)
class _Raised:
    error: BaseException


class _Stop(LoopdError):
    """Leave the drive: the call became terminal under us, or the message closed."""

    def __init__(self, outcome: Outcome, *, phase: HarnessPhase | None = None, error: dict[str, str] | None = None):
        super().__init__(outcome)
        self.outcome: Outcome = outcome
        self.phase = phase
        self.error = error


class _ProjectionFailed(LoopdError):
    def __init__(self, error: dict[str, str], phase: HarnessPhase = "failed") -> None:
        super().__init__(error["message"])
        self.error = error
        self.phase: HarnessPhase = phase


@dataclass(slots=True)
class _Replayed:
    """What the durable updates up to the checkpoint said: the answer text, the last model call, the last one."""

    text: str | None = None
    model: ModelCalled | None = None
    last: Update | None = None

    def note(self, update: Update) -> None:
        self.last = update
        if isinstance(update, TextSet):
            self.text = update.text
        elif isinstance(update, ModelCalled):
            self.model = update


def _error(code: str, message: str) -> dict[str, str]:
    return {"code": code, "message": message[:2000]}


class Drive:
    """One claimed call, driven until it is terminal, the lease is lost, or the drive is cancelled."""

    def __init__(
        self,
        settings: DriveSettings,
        call: HarnessCall,
        token: int,
        adapter: HarnessAdapter | None,
        *,
        trace_parent: Context | None = None,
    ) -> None:
        self._s = settings
        self.call_id = call.id
        self._target = call.target
        self._trace_parent = trace_parent
        self._started = 0.0
        self._texted = False
        self.token = token
        self.released = False
        self.ended_call: HarnessCall | None = None
        """The call as this drive's transaction that ended it left it (once surely committed)."""
        self._begun: tuple[HarnessCall, Literal["start", "resume"]] | None = None
        """A transaction of this drive ended the call and gave its lease up with it (committed): the driver has
        nothing left to release, and however the drive's tasks end, its outcome is ``done``."""
        self._resource = lease_resource(call.id)
        self._adapter = adapter
        self._effect: tuple[EffectKind, Idempotency] = (
            adapter.effect if adapter is not None else (EffectKind.UNKNOWN, Idempotency.UNKNOWN)
        )
        self._attempt_id: str | None = None
        self._interrupted: list[str] = []
        self._prompt_chars = 0
        self._forwarded: set[str] = set()
        # The watcher reads the message's content only while a person may have answered something there: at the
        # start (a resumed call may hold open asks), after a gate or question was opened (`_asked`), and until a
        # look finds none pending — and then only when the message changed since its last full look.
        self._awaiting_humans = True
        self._asked_count = 0
        self._looked_revision: int | None = None
        self._task_id: str | None = None
        self._stopping = False
        self.poke = asyncio.Event()
        self._followed: AdapterRun | None = None  # while updates are followed: where follow-ups go
        self._actor_ids = settings.ledger_actors  # ledger actor key → id, ensured by a committed transaction
        self._trail_opened = False  # this drive's trail lane, turn and action exist (a committed transaction made them)
        self._ordered_trail: bool | None = None  # which ids the call's trail takes (`trail_ordering`), once known
        self._held_trail: tuple[Transaction, Trail] | None = None  # `_apply`'s trail, its appends held (`Trail.hold`)
        self._began_fresh = False  # this drive's begin found the call pending: no earlier drive requested an attempt
        # The call message's stream state this drive holds (see emit_held); before its first write, the state an
        # answer this process opened was stored with (`FirstOutputs.opened_state`: no read of the row for it).
        self._states = streams.StreamStates(seed=settings.bus.first_outputs.opened_state, shared=settings.bus.states)
        self._handed: set[str] = set()  # conversations the current fenced transaction handed events to
        # The run's execution ref, while the call still says ``starting``: the drive's next write moves it to
        # ``running`` with that ref (see `_follow_run`); a tuple so that a None ref is distinct from "nothing due".
        self._running_due: tuple[str | None] | None = None

    def stop(self) -> None:
        """The engine is stopping: the watcher ends the drive at its next look (cancellation does the rest)."""
        self._stopping = True
        self.poke.set()

    # --- fenced writes -------------------------------------------------------------------------------------------

    @asynccontextmanager
    async def _fenced(self) -> AsyncIterator[tuple[Transaction, HarnessCall]]:
        self._handed = set()
        async with self._s.db.transaction() as tx:
            await tx.leases.check_token(self._resource, self.token)
            call = await tx.harness_calls.lock(self.call_id)
            due = self._running_due
            if due is not None and call.phase == "starting":
                call = await tx.harness_calls.update(call.id, phase="running", execution_ref=due[0])
            yield tx, call
        self._running_due = None  # committed (a drive whose write failed ends; the next one begins again)

    async def _trail(self, tx: Transaction, call: HarnessCall) -> Trail:
        held = self._held_trail
        if held is not None and held[0] is tx:
            return held[1]  # the trail's identity (lane, turn, execution ids) is the call's: the same all along
        ordered = self._ordered_trail
        if ordered is None:  # the drive's first: a call begun by an older server keeps its trail's ids
            ordered = self._ordered_trail = await trail_ordering(tx, call)
        return Trail(
            tx,
            call,
            task_id=self._task_id,
            effect=self._effect,
            clock=self._s.clock,
            redactor=self._s.redactor,
            actors=self._actor_ids,  # ledger actors are never removed: ensured once per engine, not per transaction
            facts=self._s.ledger_facts,
            ordered=ordered,
        )

    def _notify(self, tx: Transaction, call: HarnessCall) -> None:
        """After the commit: wake the call's own waiters (`call_channel`) and its conversation's readers — unless
        this transaction handed events to that conversation (`streams.emit` / `finish` with the bus): their notice
        wakes the same readers, and another would only make its live feed read back what it was handed."""
        bus, channel, conversation_id = self._s.bus, call_channel(call.id), call.conversation_id
        handed = conversation_id in self._handed

        def wake() -> None:
            bus.notify(channel)
            if conversation_id is not None and not handed:
                bus.notify(conversation_id)

        tx.after_commit(wake)

    async def _end_in(
        self, tx: Transaction, call: HarnessCall, phase: HarnessPhase, error: dict[str, Any] | None, result: Any = None
    ) -> HarnessCall:
        """Make ``call`` terminal in ``tx`` (with its ledger facts); gates still open in its message close, and a
        message the engine opened for the call (an output in a conversation, not a caller's message) ends with it."""
        open_message = await self._close_gates(tx, call, phase)
        if call.message_id is not None and call.params.get("message_id") is None:
            status = _MESSAGE_STATUS.get(phase, "failed")
            shown = {"code": str(error.get("code", phase)), "message": str(error.get("message", ""))} if error else None
            finished = await streams.finish(tx, call.message_id, status, error=shown, bus=self._s.bus)
            if open_message:  # its end (and error) were stored and handed over now
                self._handed.add(finished.conversation_id)
        trail = await self._trail(tx, call)
        if not self._trail_opened:  # ended before (or without) this drive's begin: the trail may not exist yet
            await trail.open()
        await trail.close(phase, error, self._attempt_id, earlier_attempts=not self._began_fresh)
        if phase == "succeeded":
            ended = await tx.harness_calls.update(call.id, phase=phase, result=result, error=None)
        else:
            ended = await tx.harness_calls.update(call.id, phase=phase, error=error)
        # Nothing is left to drive: the lease goes with the end (the lease row was checked first in this
        # transaction, so the lock order lease → call → message holds), not in a transaction of its own after it.
        if await tx.leases.release(self._resource, self.token):
            tx.after_sure_commit(self._released)

        def ended_here() -> None:
            self.ended_call = ended

        tx.after_sure_commit(ended_here)
        self._notify(tx, ended)
        return ended

    def _released(self) -> None:
        self.released = True

    async def _close_gates(self, tx: Transaction, call: HarnessCall, phase: HarnessPhase) -> bool:
        """Close the gates still open in the call's message; whether that message is still open (not terminal)."""
        if call.message_id is None:
            return False
        head, state = await streams.locked_state(tx, call.message_id, self._states)
        if head.status in streams.TERMINAL_STATUSES:
            return False
        events = closed_gates(state.model, f"the harness call ended ({phase})") if state.model is not None else []
        if events:
            await streams.emit_held(tx, head.id, events, bus=self._s.bus, allow_human_blocks=True, states=self._states)
            self._handed.add(head.conversation_id)
        return True

    async def _end(self, phase: HarnessPhase, error: dict[str, Any] | None) -> None:
        async with self._fenced() as (tx, call):
            if not call.is_terminal:
                await self._end_in(tx, call, phase, error)

    # --- the drive -----------------------------------------------------------------------------------------------

    async def run(self) -> Outcome:
        """Drive the call; see the module docstring for the outcomes. Cancellation propagates (writes nothing).

        While tracing is on, the drive is the ``loopd.harness_call`` span (a child of the span that started the
        call on this replica, when there was one), and the harness's spans are its children."""
        self._started = self._s.clock.monotonic()
        if not tracing_enabled():
            outcome = await self._outcome()
        else:
            with tracer("loopd.server").start_as_current_span(
                "loopd.harness_call",
                context=self._trace_parent,
                kind=SpanKind.CLIENT,
                attributes={"loopd.harness_call.id": self.call_id, "loopd.target": self._target},
            ) as span:
                outcome = await self._outcome()
                span.set_attribute("loopd.harness_call.outcome", outcome)
        if self._s.metrics is not None:
            seconds = self._s.clock.monotonic() - self._started
            self._s.metrics.completion_seconds.labels(self._target, outcome).observe(seconds)
        return outcome

    async def _outcome(self) -> Outcome:
        try:
            outcome = await self._run()
        except Fenced:
            outcome = "lost"
        except _Stop as stop:
            outcome = stop.outcome
        # The call ended here: the watcher may have seen it terminal (or its lease given up) before the consumer
        # returned — that is this drive's own end, not another holder's.
        return "done" if self.released else outcome

    def _first_text(self) -> None:
        """The answer shows text for the first time in this drive."""
        self._texted = True
        if self._s.metrics is not None:
            seconds = self._s.clock.monotonic() - self._started
            self._s.metrics.time_to_first_token_seconds.labels(self._target).observe(seconds)

    async def _run(self) -> Outcome:
        begun = await self._begin()
        if begun is None:
            return "done"
        call, mode = begun
        adapter = self._adapter
        assert adapter is not None  # _begin ends calls without an adapter
        now = self._s.clock.now()
        workspace, tools = workspace_of(call.params)
        request = AdapterRequest(
            call_id=call.id,
            target=call.target,
            text=str(call.params.get("text", "")),
            history=history_of(call.params),
            options=dict(call.params.get("params") or {}),
            deadline=call.deadline_at,
            timeout=max((call.deadline_at - now).total_seconds(), 0.001),
            workspace=workspace,
            tools=tools,
            fork=fork_of(call.params),
        )
        self._prompt_chars = len(request.prompt())
        try:
            # The run's model calls (tasks it creates inherit this) pace a reply whose text came whole: see `_pacer`.
            with pace_whole_replies(self._pacer(call)):
                async with asyncio.timeout(self._s.adapter_timeout):
                    if mode == "start":
                        run = await adapter.start(request)
                    else:
                        run = await adapter.resume(request, call.execution_ref)
        except ResumeUnsupported as exc:
            await self._end("unknown", _error("resume_unsupported", str(exc) or "the adapter cannot resume"))
            return "done"
        except (ObservationLost, TimeoutError) as exc:
            await self._attempt_failed(_error("observation_lost", str(exc) or "the adapter did not answer in time"))
            return "retry"
        except Exception as exc:  # an adapter that breaks fails its call; the engine goes on
            _log.warning("harness call %s: adapter %s failed to %s", call.id, call.target, mode, exc_info=True)
            await self._end("failed", _error("adapter_error", f"{type(exc).__name__}: {exc}"))
            return "done"
        try:
            return await self._follow(run, mode, call)
        finally:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(self._s.adapter_timeout):
                    await run.aclose()

    async def _begin(self) -> tuple[HarnessCall, Literal["start", "resume"]] | None:
        """Check the call, record the attempt and move pending → starting; None when the call ended here. A drive
        begun by the transaction that admitted its call (`begin_in`) has nothing left to do here."""
        if self._begun is not None:
            begun, self._begun = self._begun, None
            return begun
        async with self._fenced() as (tx, call):
            return await self._begin_with(tx, call)

    async def begin_in(self, tx: Transaction, call: HarnessCall) -> HarnessCall | None:
        """Begin a call in the transaction that created it and took its lease for this drive (``token``): once
        that commits, the drive starts with the adapter, without a transaction of its own to begin. The call as
        begun (None: it ended in ``tx``; the drive then finds it ended)."""
        self._begun = await self._begin_with(tx, call)
        return None if self._begun is None else self._begun[0]

    async def _begin_with(
        self, tx: Transaction, call: HarnessCall
    ) -> tuple[HarnessCall, Literal["start", "resume"]] | None:
        if call.is_terminal:
            return None
        message_task = None
        if call.message_id is not None:
            with contextlib.suppress(NotFound):
                message_task = await tx.messages.task_id_of(call.message_id)  # known when the start read it
        self._task_id = message_task
        if call.cancel_requested:
            await self._end_in(tx, call, "cancelled", _error("cancelled", "the call was cancelled"))
            return None
        if self._s.clock.now() >= call.deadline_at:
            await self._end_in(tx, call, "timed_out", _error("timed_out", "the call passed its deadline"))
            return None
        if self._adapter is None:
            message = f"no adapter is configured for target {call.target!r} on this server"
            await self._end_in(tx, call, "unknown", _error("unknown_target", message))
            return None
        mode: Literal["start", "resume"] = "start" if call.phase == "pending" else "resume"
        if mode == "resume" and not self._adapter.supports_resume:
            message = f"the {call.target!r} adapter cannot resume; the outcome of the earlier attempt is unknown"
            await self._end_in(tx, call, "unknown", _error("resume_unsupported", message))
            return None
        trail = await self._trail(tx, call)
        replica = self._s.replica_id
        if mode == "start":  # a new lane: its opening events and the attempt's request in one append
            self._attempt_id = await trail.open_with_attempt(str(self.token), mode=mode, replica=replica)
        else:
            await trail.open()
            # Drives that died before: settled once this one has caught up (_settle).
            self._interrupted = await trail.unresolved_attempts()
            self._attempt_id = await trail.request_attempt(str(self.token), mode=mode, replica=replica)
        self._opened_in(tx, fresh=mode == "start")
        if call.phase == "pending":
            call = await tx.harness_calls.update(call.id, phase="starting")
        return call, mode

    def _opened_in(self, tx: Transaction, *, fresh: bool) -> None:
        """Once ``tx`` surely committed, the trail's lane, turn and action exist (the ledger never removes them):
        the call's end need not create them again. ``fresh``: ``tx`` moved the call out of ``pending`` (attempts
        are requested only in that move or by a resume), so no earlier drive left an attempt for the end to settle."""

        def opened() -> None:
            self._trail_opened = True
            self._began_fresh = fresh

        tx.after_sure_commit(opened)

    async def _attempt_failed(self, error: dict[str, str]) -> None:
        if self._attempt_id is None:
            return
        async with self._fenced() as (tx, call):
            if not call.is_terminal:
                await (await self._trail(tx, call)).fail_attempt(self._attempt_id, error)

    async def add_input(self, text: str, *, key: str) -> bool:
        """Queue a user's follow-up into the run being followed (`InputCapable`); False when there is none, it
        takes no follow-ups, or its turn ended."""
        run = self._followed
        if run is None or not isinstance(run, InputCapable):
            return False
        return await run.add_input(text, key=key)

    async def _follow(self, run: AdapterRun, mode: str, call: HarnessCall) -> Outcome:
        self._followed = run
        try:
            return await self._follow_run(run, mode, call)
        finally:
            self._followed = None

    async def _follow_run(self, run: AdapterRun, mode: str, call: HarnessCall) -> Outcome:
        """Follow ``run``'s updates; ``call`` is the call as this drive's begin left it (the lease keeps anyone else
        from moving its checkpoint; a cancellation or an end meanwhile is found by the watcher and every write).

        The run's execution ref is stored at once when a resume needs it to find the execution; one that tells a
        resume nothing the call does not (none, or the call's own id: the built-in harness names its session so)
        moves the call to ``running`` with the drive's next write instead — its first live text or durable update —
        which saves a transaction on the way to the first token."""
        ref = run.execution_ref
        if call.phase == "starting" and ref in (None, call.id):
            self._running_due = (ref,)
        elif call.phase == "starting" or (ref is not None and call.execution_ref != ref):
            async with self._fenced() as (tx, call):
                if call.is_terminal:
                    return "done"
                if call.phase == "starting":
                    call = await tx.harness_calls.update(call.id, phase="running", execution_ref=ref)
                elif ref is not None and call.execution_ref != ref:
                    call = await tx.harness_calls.update(call.id, execution_ref=ref)
        replaying = mode == "resume" and run.replays
        # The first of the two to end decides; the other is cancelled (one TaskGroup, see `race`).
        consumed, watched = await race(
            self._consume(run, call, replaying),
            self._watch(run),
            names=(f"loopd-drive-consume-{call.id}", f"loopd-drive-watch-{call.id}"),
        )
        if consumed.ok:
            return consumed.result()
        if consumed.error is not None:
            return await self._consumer_failed(consumed.error)
        reason = watched.result()  # the watcher stopped the drive (it never raises but cancellation)
        return await self._stopped(run, reason)

    async def _consumer_failed(self, exc: BaseException | None) -> Outcome:
        match exc:
            case Fenced():
                return "lost"
            case _Stop():
                if exc.phase is not None:
                    await self._end(exc.phase, exc.error)
                return exc.outcome
            case _ProjectionFailed():
                await self._end(exc.phase, exc.error)
                return "done"
            case ObservationLost():
                await self._attempt_failed(_error("observation_lost", str(exc)))
                return "retry"
            case StorageError() | HarnessEngineError() if exc.retryable:
                await self._attempt_failed(_error("storage_unavailable", str(exc)))
                return "retry"
            case _:
                _log.warning("harness call %s: the adapter's updates failed", self.call_id, exc_info=exc)
                await self._end("failed", _error("adapter_error", f"{type(exc).__name__}: {exc}"))
                return "done"

    async def _stopped(self, run: AdapterRun, reason: str) -> Outcome:
        if reason == "lost":
            return "lost"
        with contextlib.suppress(Exception):
            async with asyncio.timeout(self._s.adapter_timeout):
                await run.cancel()
        if reason == "timed_out":
            await self._end("timed_out", _error("timed_out", "the call passed its deadline"))
        elif reason == "message_closed":
            await self._end("cancelled", _error("message_closed", "the call's message was finished by its owner"))
        else:
            await self._end("cancelled", _error("cancelled", "the call was cancelled"))
        return "done"

    # --- consuming updates ---------------------------------------------------------------------------------------

    async def _consume(self, run: AdapterRun, call: HarnessCall, replaying: bool) -> Outcome:
        queue: asyncio.Queue[Update | _End | _Raised] = asyncio.Queue(QUEUE_SIZE)

        async def pump() -> None:
            try:
                async for update in run.updates():
                    await queue.put(update)
                await queue.put(_End())
            except asyncio.CancelledError:
                raise
            except BaseException as exc:
                await queue.put(_Raised(exc))

        async with background(pump(), name=f"loopd-drive-pump-{call.id}"):  # cancelled and awaited at the end
            return await self._apply_all(queue, call, replaying)

    async def _apply_all(
        self, queue: asyncio.Queue[Update | _End | _Raised], call: HarnessCall, replaying: bool
    ) -> Outcome:
        checkpoint, stored_hash = call.checkpoint, call.replay_hash
        index, chain = (0, "") if replaying else (checkpoint, stored_hash)
        held: Update | _End | _Raised | None = None
        waiting: list[TextPreview] = []  # previews queued right in front of a durable update: shown in its transaction
        replayed = _Replayed()
        while True:
            if self._interrupted and index >= checkpoint:
                await self._settle(replayed if replaying else _Replayed(), checkpoint)
            item = held if held is not None else await queue.get()
            held = None
            if isinstance(item, _End):
                await self._end("failed", _error("no_result", "the harness stopped without a final answer"))
                return "done"
            if isinstance(item, _Raised):
                raise item.error
            if not item.durable:
                if index < checkpoint:
                    continue  # still replaying what was applied before
                previews = [item] if isinstance(item, TextPreview) else []
                live = self._s.live_text
                wait = gather_wait(not self._texted, 1 if live is None else live.streaming())
                held = await self._gather_previews(queue, previews, wait)
                if isinstance(held, Update) and held.durable and self._first_of_many(call, previews):
                    # The answer's first text, with the rest of the turn right behind it, while other answers
                    # show nothing yet: the text now, the rest once they do (bounded; see `FirstOutputs`).
                    await self._apply_previews(previews)
                    await self._s.bus.first_outputs.yield_to_blank()
                    continue  # ``held`` is applied next
                if isinstance(held, Update) and held.durable:
                    # Already queued behind them: the durable update's transaction shows them too (one write, not
                    # two; the same content as two, committed together). It is past the checkpoint (these
                    # previews are), so it is applied, not replayed.
                    waiting = previews
                    continue
                await self._apply_previews(previews)
                continue
            index += 1
            chain = next_hash(chain, item)
            if index <= checkpoint:
                replayed.note(item)
            if index < checkpoint:
                continue
            if index == checkpoint:
                if chain != stored_hash:
                    message = f"the resumed harness replayed a different update at {index}: {item.kind}"
                    raise _ProjectionFailed(_error("replay_differs", message))
                continue
            # The durable updates queued right behind this one go in the same transaction (a fast harness emits
            # several at once): one write per batch instead of one per update; a crash keeps all or none of them.
            batch = [(index, chain, item)]
            while len(batch) < MAX_DURABLE_BATCH and not queue.empty():
                following = queue.get_nowait()
                if not isinstance(following, (_End, _Raised)) and following.durable:
                    index += 1
                    chain = next_hash(chain, following)
                    batch.append((index, chain, following))
                else:
                    held = following
                    break
            shown, waiting = waiting, []
            if await self._apply(batch, shown):
                return "done"

    @staticmethod
    async def _gather_previews(
        queue: asyncio.Queue[Update | _End | _Raised], previews: list[TextPreview], wait: float = PREVIEW_GATHER
    ) -> Update | _End | _Raised | None:
        """Add the live text queued behind ``previews`` to them, and what arrives within ``wait`` seconds (see
        `gather_wait`); the first item that is not live text (held: the caller applies it next), or None.

        What a harness says right after its text — more text, or the durable update a fast one sends straight after
        it — then goes into the same write instead of one each; text that trickles in is shown that much later."""
        deadline: float | None = None
        while len(previews) < MAX_PREVIEW_BATCH:
            if queue.empty():
                if deadline is None:
                    deadline = asyncio.get_running_loop().time() + wait
                try:
                    # `asyncio.timeout_at`, not `wait_for`: when the drive is cancelled just as an update arrives,
                    # `wait_for` (3.11) returns the update and swallows the cancellation, and the consumer then
                    # waits forever for a run that was stopped.
                    async with asyncio.timeout_at(deadline):
                        following = await queue.get()
                except TimeoutError:
                    return None
            else:
                following = queue.get_nowait()
            if not isinstance(following, TextPreview):
                return following
            previews.append(following)
        return None

    async def _settle(self, replayed: _Replayed, checkpoint: int) -> None:
        """Close the attempts of drives that died (see ``_trail``): the resumed run has caught up with what they
        applied, so the live text they showed past it tells what the lost model call spent."""
        attempts, self._interrupted = self._interrupted, []
        async with self._fenced() as (tx, call):
            if call.is_terminal:
                return
            shown = None
            if call.message_id is not None:
                shown = shown_answer((await tx.messages.get(call.message_id)).content)
            durable = replayed.text if checkpoint > 0 else None
            usage = interrupted_usage(
                shown,
                durable,
                reported_last=checkpoint > 0 and (replayed.last is None or isinstance(replayed.last, ModelCalled)),
                previous=replayed.model,
                prompt_chars=self._prompt_chars,
            )
            why = "the drive of this attempt ended without an outcome (a crash or a lost lease); a later one resumed"
            await (await self._trail(tx, call)).interrupt_attempts(attempts, usage, why)

    async def _locked_message(self, tx: Transaction, call: HarnessCall) -> Model | None:
        """Lock the call's message; the content it shows, as the model this drive holds (see `StreamStates`)."""
        if call.message_id is None:
            return None
        head, state = await streams.locked_state(tx, call.message_id, self._states)
        if head.status in streams.TERMINAL_STATUSES:
            raise _Stop("done", phase="cancelled", error=_error("message_closed", "the call's message was finished"))
        return state.model

    async def _emit(self, tx: Transaction, call: HarnessCall, events: list[dict[str, Any]]) -> Model | None:
        """Store ``events`` in the call's message; its content afterwards (None: nothing was stored)."""
        if not events or call.message_id is None:
            return None
        try:
            # The content is stored once per transaction (`_store`), however many updates it shows.
            head, state, stored = await streams.emit_held(
                tx, call.message_id, events, bus=self._s.bus, allow_human_blocks=True, states=self._states, store=False
            )
            if not stored:
                return None
            self._handed.add(head.conversation_id)
            return state.model
        except Conflict as exc:  # ended between our lock and the emit: cannot happen under the row lock
            raise _Stop("done", phase="cancelled", error=_error("message_closed", str(exc))) from exc
        except InvalidRecord as exc:
            raise _ProjectionFailed(_error("projection_failed", str(exc))) from exc

    async def _store(self, tx: Transaction, call: HarnessCall) -> None:
        """Store the message content this transaction's emits left (they store only events; see `_emit`)."""
        if call.message_id is not None:
            await streams.store_held(tx, call.message_id, self._states)

    def _pacer(self, call: HarnessCall) -> Pacer | None:
        """What the first model call of this drive's run awaits when its reply's text came whole (a fast model: the
        text and the reply's end in one read): while other answers this process started show nothing yet — and no
        slot is short, or they may be waiting for this one — the rest of the turn (the harness's writes of the
        reply, the turn's end, this drive's durable updates) waits until they do, at most `FIRST_OUTPUT_YIELD`. The
        text itself is out already: this answer shows it as usual."""
        message_id = call.message_id
        if message_id is None:
            return None
        first_outputs, slots_full = self._s.bus.first_outputs, self._s.slots_full

        async def pace() -> None:
            if first_outputs.others_blank(message_id) and not slots_full():
                await first_outputs.yield_to_blank()

        return pace

    def _first_of_many(self, call: HarnessCall, previews: Sequence[TextPreview]) -> bool:
        """Whether ``previews`` would be this drive's first text while other answers show nothing yet."""
        if self._texted or call.message_id is None or not any(preview.text for preview in previews):
            return False
        return self._s.bus.first_outputs.others_blank(call.message_id) and not self._s.slots_full()

    async def _apply_previews(self, previews: list[TextPreview]) -> None:
        """Show live text: each preview is compared with what the message shows now (see ``_projection``)."""
        merged = self._merged(previews)
        if not merged:
            return
        async with self._fenced() as (tx, call):
            if call.is_terminal:
                raise _Stop("done")
            await self._show_previews(tx, call, await self._locked_message(tx, call), merged)
            await self._store(tx, call)

    def _merged(self, previews: Sequence[TextPreview]) -> list[TextPreview]:
        merged = merge_previews([preview for preview in previews if preview.text])
        if merged:
            if not self._texted:
                self._first_text()
            if self._s.live_text is not None:
                self._s.live_text.wrote(self.call_id)
        return merged

    async def _show_previews(
        self, tx: Transaction, call: HarnessCall, content: Model | None, merged: Sequence[TextPreview]
    ) -> Model | None:
        for preview in merged:
            if content is None:
                break
            content = await self._emit(tx, call, project(preview, content)) or content
        return content

    async def _apply(self, batch: Sequence[tuple[int, str, Update]], previews: Sequence[TextPreview] = ()) -> bool:
        """Apply durable updates (``(index, replay hash, update)``, consecutive) in one transaction, in order, after
        showing ``previews`` (live text queued in front of them); whether the call is now terminal (an update after
        the one that ended it is not applied)."""
        merged = self._merged(previews)
        async with self._fenced() as (tx, call):
            if call.is_terminal:
                raise _Stop("done")
            content = await self._locked_message(tx, call)
            if merged:
                content = await self._show_previews(tx, call, content, merged)
            # The ledger facts of the whole batch (a model call and the end, say) go as one append.
            trail = await self._trail(tx, call)
            trail.hold()
            self._held_trail = (tx, trail)
            try:
                ended = await self._apply_batch(tx, call, content, batch)
            finally:
                self._held_trail = None
            await trail.release()
            return ended

    async def _apply_batch(
        self, tx: Transaction, call: HarnessCall, content: Model | None, batch: Sequence[tuple[int, str, Update]]
    ) -> bool:
        stored = batch[0][0] - 1  # the checkpoint the call holds: the batch's one compare-and-set expects it
        for index, chain, update in batch:
            call, content, ended = await self._apply_one(tx, call, content, index, chain, update, stored)
            if ended:
                return True
        last, chain, _ = batch[-1]
        call = await tx.harness_calls.advance_checkpoint(
            call.id, expected_checkpoint=stored, checkpoint=last, replay_hash=chain
        )
        await self._store(tx, call)
        return False

    async def _apply_one(
        self,
        tx: Transaction,
        call: HarnessCall,
        content: Model | None,
        index: int,
        chain: str,
        update: Update,
        stored: int,
    ) -> tuple[HarnessCall, Model | None, bool]:
        """One durable update of `_apply`'s transaction: the call, the message's content and whether it ended.
        The checkpoint moves once per transaction, from ``stored`` (the one the call holds) to the last update
        applied: here for an update that ends the call (before the end: a terminal call takes no more writes),
        else by `_apply` after the batch — the steps in between are seen by nobody outside the transaction."""
        if content is not None:
            content = await self._emit(tx, call, project(update, content, call_id=call.id)) or content
        trail = await self._trail(tx, call)
        await trail.record(index, update)
        if isinstance(update, Finished | Failed):
            call = await tx.harness_calls.advance_checkpoint(
                call.id, expected_checkpoint=stored, checkpoint=index, replay_hash=chain
            )
        match update:
            case GateOpened() | QuestionAsked():
                tx.after_commit(self._asked)
                if call.phase in ("running", "starting"):
                    call = await tx.harness_calls.update(call.id, phase="waiting_input")
            case GateResolved() | QuestionClosed():
                if call.phase == "waiting_input":
                    call = await tx.harness_calls.update(call.id, phase="running")
            case Finished(content=result, format=form):
                await self._store(tx, call)  # before the end reads and finishes the message
                await self._end_in(tx, call, "succeeded", None, {"format": form, "content": result})
                return call, content, True
            case Failed(code=code, message=message, phase=phase):
                await self._store(tx, call)
                await self._end_in(tx, call, phase, _error(code, message))
                return call, content, True
            case TextSet() if not self._texted:
                self._first_text()
            case ModelCalled() if self._s.metrics is not None:
                self._s.metrics.model_tokens.labels(update.model, "input").inc(update.input_tokens)
                self._s.metrics.model_tokens.labels(update.model, "output").inc(update.output_tokens)
                self._s.metrics.model_cost_usd.labels(update.model).inc(update.cost_usd)
            case _:
                pass
        return call, content, False

    # --- watching ------------------------------------------------------------------------------------------------

    async def _watch(self, run: AdapterRun) -> str:
        """Renew the lease and look for stop conditions and gate answers; returns why the drive must stop."""
        clock = self._s.clock
        renew_every = self._s.lease_ttl / 3
        last_renewal = clock.monotonic()
        while not self._stopping:
            await wait_event(clock, self.poke, self._s.tick)
            self.poke.clear()
            if clock.monotonic() - last_renewal >= renew_every:
                try:
                    async with self._s.db.transaction() as tx:
                        await tx.leases.renew(self._resource, self.token, self._s.lease_ttl)
                    last_renewal = clock.monotonic()
                except Fenced:
                    return "lost"
                except StorageError as exc:  # keep trying; a fenced write ends the drive if the lease expires
                    _log.warning("harness call %s: lease renewal failed: %s", self.call_id, exc)
            try:
                reason = await self._look(run)
            except StorageError as exc:
                _log.warning("harness call %s: watch read failed: %s", self.call_id, exc)
                continue
            if reason is not None:
                return reason
        return "lost"

    def _asked(self) -> None:
        """A gate or question was opened (its ask block committed): the watcher reads the content again."""
        self._asked_count += 1
        self._awaiting_humans = True

    async def _look(self, run: AdapterRun) -> str | None:
        asked = self._asked_count  # an ask committed after this cannot be in what this look reads
        message: Message | None = None
        async with self._s.db.transaction(read_only=True) as tx:
            call = await tx.harness_calls.get(self.call_id)
            lease = await tx.leases.get(self._resource)
            head = await tx.messages.head(call.message_id) if call.message_id is not None else None
            if head is not None and self._awaiting_humans and head.revision != self._looked_revision:
                # the content (its tail folded) only when it may hold an answer not forwarded yet
                message = await tx.messages.get(head.id)
        if lease is None or lease.token != self.token:
            return "lost"
        if call.is_terminal:
            return "lost"
        if call.cancel_requested:
            return "cancelled"
        if self._s.clock.now() >= call.deadline_at:
            return "timed_out"
        if head is None:
            return None
        if head.status in streams.TERMINAL_STATUSES:
            return "message_closed"
        if message is None:
            return None
        self._looked_revision = message.revision
        if asked == self._asked_count and not pending_asks(message.content):
            self._awaiting_humans = False  # nothing a person could answer until the harness asks again
        for gate_id, answer in answered_gates(message.content):
            if gate_id in self._forwarded:
                continue
            self._forwarded.add(gate_id)
            try:
                async with asyncio.timeout(self._s.adapter_timeout):
                    await run.answer_gate(gate_id, answer)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the first answer binds; a late one is the harness's to refuse
                _log.info("harness call %s: gate %s answer not taken: %s", self.call_id, gate_id, exc)
        if isinstance(run, AnswersQuestions):
            for request_id, text in answered_questions(message.content):
                if f"question/{request_id}" in self._forwarded:
                    continue
                self._forwarded.add(f"question/{request_id}")
                try:
                    async with asyncio.timeout(self._s.adapter_timeout):
                        await run.provide_user_input(request_id, text)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # answered already, or past its deadline: the harness's to refuse
                    _log.info("harness call %s: answer to %s not taken: %s", self.call_id, request_id, exc)
        return None


def pending_asks(content: dict[str, Any]) -> bool:
    """Whether a gate's or question's ask block is still waiting for its answer."""
    for block in content.get("blocks") or ():
        if isinstance(block, dict) and block.get("type") == "ask" and block.get("status") == "pending":
            block_id = block.get("id")
            if isinstance(block_id, str) and block_id.startswith(("gate/", "question/")):
                return True
    return False


def answered_questions(content: dict[str, Any]) -> list[tuple[str, str]]:
    """ask_user questions whose ask block carries the asker's answer (``status`` success with a text ``value``)."""
    found: list[tuple[str, str]] = []
    for block in content.get("blocks") or ():
        if not isinstance(block, dict) or block.get("type") != "ask":
            continue
        block_id, value = block.get("id"), block.get("value")
        answered = block.get("status") == "success" and isinstance(value, str)
        if answered and isinstance(block_id, str) and block_id.startswith("question/"):
            found.append((block_id.removeprefix("question/"), str(value)))
    return found


def answered_gates(content: dict[str, Any]) -> list[tuple[str, GateAnswer]]:
    """Gates whose ask block carries an answer (``status`` success with approve / always / deny)."""
    found: list[tuple[str, GateAnswer]] = []
    for block in content.get("blocks") or ():
        if not isinstance(block, dict) or block.get("type") != "ask":
            continue
        block_id = block.get("id")
        value = block.get("value")
        answered = block.get("status") == "success" and isinstance(value, str)
        if answered and isinstance(block_id, str) and block_id.startswith("gate/"):
            for answer in GATE_ANSWERS:
                if value == answer:
                    found.append((block_id.removeprefix("gate/"), answer))
    return found
