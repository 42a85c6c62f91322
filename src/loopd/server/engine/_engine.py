"""`HarnessEngine`: durable harness calls — identity, admission into capacity, reads, commands, notices.

Admission (`start`): inside one transaction, a call with the same identity is returned as it is (same
fingerprint) or refused (``Conflict``); otherwise a capacity slot is reserved *before* anything is written,
so a full engine answers `CapacityExceeded` with no call row and no message event, and an idempotent replay
never keeps a slot. The slot is kept by the call while this engine holds it. A call into a given message (a Task's
answer: new nearly always) is not looked up first: its insert finds a replay, and so does a lookup after a refusal
(the message has ended, the target is not here, no slot is free).

Driving is the engine's `CallDriver` (``_driver``): it claims runnable calls with fenced leases while one of the
engine's `CallSlots` is free and runs a `Drive` for each. The engine admits and reads; the driver claims and
drives; they share only the slots.

Lifecycle: ``await engine.open()`` (or ``async with engine``) starts the driver; ``aclose()`` stops every drive
and releases their leases so another replica carries on at once; ``abort()`` stops like a crash would (leases
expire on their own). Executions stay resumable either way.

Notices: `add_listener` registers a callback (at most `MAX_LISTENERS`) that the engine calls, on the event loop,
with an `EngineNotice` after a drive of this engine ends (the call is terminal when ``ended``; that is committed
before the notice) and whenever a capacity slot frees. A notice is a hint to re-read, never the truth: calls that
end on another replica reach it through the notifier (below) and may be lost, so a listener keeps a bounded poll
as well.

Across replicas: the engine publishes on its bus's notifier (channel `CALLS_CHANNEL`, payload a small JSON object
of ids): ``poke`` when a call is cancelled or a gate answered (the replica driving it re-reads at once), ``wake``
when it releases its leases at close (the others claim the calls at once) and ``end`` when a drive here ended a
call (the other replicas' listeners get the `EngineNotice`). Every engine sharing the notifier (all replicas on
one PostgreSQL) acts on them; a crashed replica's calls are found by the drivers' bounded scans once its leases
expire.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncGenerator, Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final, Literal, Self

from loopd._infra.clock import Clock
from loopd._infra.errors import LoopdError
from loopd._infra.metrics import Metrics
from loopd._infra.telemetry import inject_headers, tracing_enabled
from loopd.server import streams
from loopd.server.ledger import LedgerView, Redactor, SqlLedgerStore, UsageTotals
from loopd.server.ledger import Scope as LedgerScope
from loopd.server.storage import (
    HARNESS_CALL_TRACE_PARAM,
    Conflict,
    Database,
    HarnessCall,
    InvalidRecord,
    Message,
    MessageEvent,
    MessageHead,
    NewHarnessCall,
    NewMessage,
    NotFound,
    StorageError,
    Transaction,
    harness_call_fingerprint,
)
from loopd.server.streams import ConversationBus

from ._adapter import (
    GATE_ANSWERS,
    AdapterRequest,
    EndPoints,
    ForkPoints,
    HarnessAdapter,
    supports_forks,
    supports_workspaces,
)
from ._driver import CallDriver, CallSlots
from ._driving import Drive, DriveSettings, LiveText, call_channel, lease_resource
from ._errors import CapacityExceeded, EngineClosed, GateForbidden, UnknownTarget
from ._projection import answered_ask, gate_block_id, question_block_id
from ._requests import MAX_TIMEOUT, CallRequest, fork_of, history_of, workspace_of

InputOutcome = Literal["delivered", "elsewhere", "refused"]
"""What became of a follow-up handed to a running call (`HarnessEngine.add_input`)."""

_log = logging.getLogger(__name__)

STREAM_PAGE: Final = 500
MAX_LISTENERS: Final = 16
CALLS_CHANNEL: Final = "harness-calls"
"""The notifier channel engines tell each other about calls on (see the module docstring)."""


@dataclass(frozen=True, slots=True)
class EngineNotice:
    """Something a listener may want to re-read (see the module docstring)."""

    call_id: str
    owner_uid: str | None
    """The call's owner (None when only a slot freed and the call is not known here)."""
    effect_key: str | None
    ended: bool
    """The call is terminal now (committed before this notice)."""
    free_slots: int
    """Capacity slots of this engine free right after the change."""
    call: HarnessCall | None = None
    """The call as the transaction that ended it left it, when a drive of this process ended it (terminal: it never
    changes again); None otherwise (read it)."""


EngineListener = Callable[[EngineNotice], None]


@dataclass(frozen=True, slots=True)
class EngineStatistics:
    replica_id: str
    capacity: int
    slots_used: int
    """Calls holding a slot here: admitted and not yet claimed, or being driven."""
    driving: int
    claims: int
    """Leases taken to drive or close a call (a call that turns out finished is released at once)."""
    drives_lost: int
    """Drives that ended because another holder took the lease."""
    drives_retried: int
    """Drives that ended because the adapter lost sight of the execution (resumed later)."""


class _Replayed(LoopdError):
    """Another writer created the same call concurrently: roll our writes back and return theirs."""

    def __init__(self, call: HarnessCall) -> None:
        super().__init__(call.id)
        self.call = call


class HarnessEngine:
    """Admits, observes and cancels harness calls; its `CallDriver` drives them (see the module docstring)."""

    def __init__(
        self,
        db: Database,
        *,
        ledger: SqlLedgerStore,
        adapters: Mapping[str, HarnessAdapter],
        bus: ConversationBus,
        replica_id: str,
        clock: Clock | None = None,
        capacity: int = 200,
        lease_ttl: float = 30.0,
        poll_interval: float = 1.0,
        adapter_timeout: float = 30.0,
        retry_delay: float = 5.0,
        max_timeout: float = MAX_TIMEOUT,
        scan_limit: int = 1000,
        redactor: Redactor | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        if not isinstance(ledger, SqlLedgerStore):
            raise TypeError("the engine writes its trail in its own transactions: ledger must be an SqlLedgerStore")
        if not lease_ttl > 0 or not poll_interval > 0 or not adapter_timeout > 0 or retry_delay < 0:
            raise ValueError("lease_ttl, poll_interval and adapter_timeout must be positive")
        if not replica_id:
            raise ValueError("replica_id must be a non-empty string")
        self._db = db
        self._ledger = ledger
        self._adapters = dict(adapters)
        self._bus = bus
        self._replica_id = replica_id
        # One clock for timers and wall time (deadlines); by default the database's, which stamps the leases.
        self._clock: Clock = clock or db.clock
        self._poll_interval = poll_interval
        self._max_timeout = max_timeout
        self._slots = CallSlots(capacity)
        settings = DriveSettings(
            db=db,
            bus=bus,
            clock=self._clock,
            replica_id=replica_id,
            lease_ttl=lease_ttl,
            tick=min(poll_interval, lease_ttl / 3),
            adapter_timeout=adapter_timeout,
            metrics=metrics,
            redactor=redactor,
            slots_full=lambda: self._slots.full,
            live_text=LiveText(self._clock.monotonic),
        )
        self._driver = CallDriver(
            settings,
            adapters=self._adapters,
            slots=self._slots,
            announce=self._announce,
            poll_interval=poll_interval,
            retry_delay=retry_delay,
            scan_limit=scan_limit,
        )
        self._closed = False
        self._listeners: list[EngineListener] = []
        self._notifier = bus.notifier
        self._unsubscribe: Callable[[], None] | None = None

    # --- lifecycle -----------------------------------------------------------------------------------------------

    @property
    def replica_id(self) -> str:
        return self._replica_id

    @property
    def targets(self) -> tuple[str, ...]:
        return tuple(self._adapters)

    async def open(self) -> None:
        """Start the driver task (once)."""
        if self._closed:
            raise EngineClosed("this harness engine is closed")
        if self._unsubscribe is None:
            self._unsubscribe = self._notifier.subscribe(CALLS_CHANNEL, self._on_notice)
        self._driver.start()

    async def aclose(self) -> None:
        """Stop driving and release the leases held, so another replica resumes the calls at once."""
        held = await self._stop()
        for call_id, token in held:
            with contextlib.suppress(StorageError, TimeoutError):
                async with asyncio.timeout(self._db.options.operation_timeout):
                    await self._driver.release(call_id, token)
        if held:
            self._publish({"k": "wake"})  # the other replicas claim the released calls now, not at their next scan

    async def abort(self) -> None:
        """Stop as a crash would: drives are dropped mid-way and their leases left to expire."""
        await self._stop()

    async def _stop(self) -> list[tuple[str, int]]:
        self._closed = True
        if self._unsubscribe is not None:
            self._unsubscribe()
        return await self._driver.stop()

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def statistics(self) -> EngineStatistics:
        return EngineStatistics(
            replica_id=self._replica_id,
            capacity=self._slots.capacity,
            slots_used=self._slots.used,
            driving=self._driver.driving,
            claims=self._driver.claims,
            drives_lost=self._driver.lost,
            drives_retried=self._driver.retried,
        )

    # --- notices -------------------------------------------------------------------------------------------------

    def add_listener(self, listener: EngineListener) -> Callable[[], None]:
        """Call ``listener`` with every `EngineNotice` from now on; returns the function that removes it.

        Listeners run on the event loop, inline: they must be quick and must not raise (an error is logged).
        """
        if len(self._listeners) >= MAX_LISTENERS:
            raise ValueError(f"a harness engine takes at most {MAX_LISTENERS} listeners")
        self._listeners.append(listener)

        def remove() -> None:
            with contextlib.suppress(ValueError):
                self._listeners.remove(listener)

        return remove

    def _announce(
        self, call_id: str, owner_uid: str | None, effect_key: str | None, ended: bool, call: HarnessCall | None
    ) -> None:
        if ended and not self._closed:  # the other replicas' listeners (a responder following the Task) too
            self._publish({"k": "end", "r": self._replica_id, "c": call_id, "o": owner_uid, "e": effect_key})
        self._tell(EngineNotice(call_id, owner_uid, effect_key, ended, self._slots.free, call if ended else None))

    def _tell(self, notice: EngineNotice) -> None:
        if not self._listeners or self._closed:
            return
        for listener in tuple(self._listeners):
            try:
                listener(notice)
            except Exception:  # one faulty listener must not stop the driver or the others
                _log.exception("harness engine %s: a listener failed", self._replica_id)

    def _publish(self, notice: dict[str, str | None]) -> None:
        try:
            self._notifier.publish(CALLS_CHANNEL, json.dumps(notice, separators=(",", ":")))
        except ValueError:  # a payload over the notice limit (a huge effect key): the other replicas' polls cover it
            _log.warning("harness engine %s: notice too large to publish", self._replica_id)

    def _on_notice(self, payload: str | None) -> None:
        """A notice from any replica (this one included): poke a drive, scan now, or tell the listeners."""
        if self._closed:
            return
        if payload is None:  # notices may have been lost: look at everything again
            self._driver.poke_all()
            self._driver.wake()
            return
        try:
            notice = json.loads(payload)
        except ValueError:
            return
        if not isinstance(notice, dict):
            return
        kind, call_id = notice.get("k"), notice.get("c")
        if kind == "wake":
            self._driver.wake()
        elif kind == "poke" and isinstance(call_id, str):
            self._driver.poke(call_id)
            self._driver.wake()
        elif kind == "end" and isinstance(call_id, str) and notice.get("r") != self._replica_id:
            owner, effect = notice.get("o"), notice.get("e")
            self._tell(
                EngineNotice(
                    call_id,
                    owner if isinstance(owner, str) else None,
                    effect if isinstance(effect, str) else None,
                    True,
                    self._slots.free,
                )
            )

    # --- admission -----------------------------------------------------------------------------------------------

    async def start(self, request: CallRequest) -> HarnessCall:
        """The call for (``owner_uid``, ``effect_key``): created now, or the stored one (see the module docstring).

        Raises ``InvalidRecord`` (bad request), `UnknownTarget`, storage ``Conflict`` (same identity, different
        parameters; or a finished message), ``NotFound`` (message / conversation), `CapacityExceeded`.
        """
        if self._closed:
            raise EngineClosed("this harness engine is closed")
        request.validate(max_timeout=self._max_timeout)
        params = request.stored_params()
        fingerprint = harness_call_fingerprint(request.target, params)
        if tracing_enabled():  # stored with the call: its drive continues this trace on whichever replica runs it
            carrier: dict[str, str] = {}
            inject_headers(carrier)
            if carrier:
                params[HARNESS_CALL_TRACE_PARAM] = carrier
        if self._slots.full:
            # Refused unless it is a replay: found with a read, without waiting for the write lock (under a burst,
            # responders that saw a free slot a moment ago queue here behind every drive's writes).
            existing = await self.find(request.owner_uid, request.effect_key)
            if existing is not None:
                return self._replayed(request, existing, fingerprint)
            self._check_target(request)
            self._slots.refuse_if_full()  # else a slot freed during the read: admit it as usual
        reservation: str | None = None
        created = False
        drive: Drive | None = None
        admitted: HarnessCall | None = None  # as created, handed to the driver to begin (`begin_admitted`)
        try:
            async with self._db.transaction() as tx:
                if request.message_id is None:  # its message is made below: a replay is looked for first
                    existing = await tx.harness_calls.find(request.owner_uid, request.effect_key)
                    if existing is not None:
                        return self._replayed(request, existing, fingerprint)
                try:
                    self._check_target(request)
                    reservation = self._slots.reserve()
                    message = await self._destination(tx, request)
                except (UnknownTarget, InvalidRecord, Conflict, NotFound, CapacityExceeded):
                    # Refused as a new call; a replay of a stored one is answered all the same. Not looked up
                    # before: a call into a given message is new nearly always, and the insert below finds a
                    # replay too (`get_or_create`).
                    existing = await tx.harness_calls.find(request.owner_uid, request.effect_key)
                    if existing is not None:
                        return self._replayed(request, existing, fingerprint)
                    raise
                call, created = await tx.harness_calls.get_or_create(
                    NewHarnessCall(
                        owner_uid=request.owner_uid,
                        effect_key=request.effect_key,
                        target=request.target,
                        params=params,
                        deadline_at=self._clock.now() + timedelta(seconds=request.timeout),
                        conversation_id=message.conversation_id,
                        message_id=message.id,
                    )
                )
                if not created:
                    raise _Replayed(call)
                if self._driver.running:  # driven the moment this commits (see `CallDriver.begin_admitted`)
                    admitted = call
                    begun = await self._driver.begin_admitted(tx, call)
                    if begun is not None:
                        drive, call = begun
        except _Replayed as replayed:
            call = replayed.call
        except BaseException:
            if admitted is not None:  # not committed (or not surely): a scan takes it over if it exists
                self._driver.abandon(admitted.id)
            raise
        finally:
            if reservation is not None:
                self._slots.release(reservation)
                if not created:  # the slot was held for a moment only: someone refused meanwhile may retry now
                    self._announce(reservation, None, None, False, None)
        if created:
            self._slots.hold(call.id)
            if drive is not None and admitted is not None:
                self._driver.adopt(drive, admitted)
            else:
                if admitted is not None:
                    self._driver.abandon(admitted.id)
                if tracing_enabled():
                    self._driver.remember_trace(call.id)
                self._driver.wake()
        return call

    def _replayed(self, request: CallRequest, existing: HarnessCall, fingerprint: str) -> HarnessCall:
        if existing.fingerprint != fingerprint:
            raise Conflict(
                f"harness call {request.effect_key!r} of {request.owner_uid} already exists with different parameters"
            )
        return existing

    def _check_target(self, request: CallRequest) -> None:
        """`UnknownTarget` / ``InvalidRecord`` when no adapter here can run ``request`` as asked."""
        if request.target not in self._adapters:
            known = ", ".join(sorted(self._adapters)) or "none"
            raise UnknownTarget(f"no harness adapter is configured for {request.target!r} (known: {known})")
        if request.fork is not None and not supports_forks(self._adapters[request.target]):
            raise InvalidRecord(f"the harness {request.target!r} cannot start a call as a fork of a session")
        if request.profile is not None and not supports_workspaces(self._adapters[request.target]):
            raise InvalidRecord(f"the harness {request.target!r} takes no workspace or tools profile; leave them out")

    async def _destination(self, tx: Transaction, request: CallRequest) -> Message | MessageHead:
        if request.message_id is not None:
            message = await tx.messages.head(request.message_id)  # where it lives and whether it streams: no content
            if request.conversation_id is not None and message.conversation_id != request.conversation_id:
                raise InvalidRecord(f"message {message.id} is not in conversation {request.conversation_id}")
            if message.status in streams.TERMINAL_STATUSES:
                raise Conflict(f"message {message.id} is {message.status}; a call needs a streaming message")
            return message
        assert request.conversation_id is not None  # validate() requires one of the two
        conversation = await tx.conversations.get(request.conversation_id)
        content = streams.empty_model()
        # Which call this output is (a work conversation holds several, side by side): its effect key.
        content["meta"] = {"title": request.effect_key, "effect_key": request.effect_key}
        return await streams.open_message(
            tx,
            NewMessage(
                conversation_id=conversation.id,
                kind="harness",
                key=request.target,
                purpose="output",
                content=content,
                task_id=request.task_id or conversation.task_id,
                status="streaming",
            ),
            bus=self._bus,
        )

    # --- reads ---------------------------------------------------------------------------------------------------

    async def get(self, call_id: str) -> HarnessCall:
        async with self._db.transaction(read_only=True) as tx:
            return await tx.harness_calls.get(call_id)

    async def find(self, owner_uid: str, effect_key: str) -> HarnessCall | None:
        async with self._db.transaction(read_only=True) as tx:
            return await tx.harness_calls.find(owner_uid, effect_key)

    async def list_by_owner(self, owner_uid: str, *, limit: int = 100) -> list[HarnessCall]:
        async with self._db.transaction(read_only=True) as tx:
            return await tx.harness_calls.list_by_owner(owner_uid, limit=limit)

    async def call_for_message(self, message_id: str) -> HarnessCall | None:
        """The call that streamed (or streams) into the message ``message_id``, if a harness call did."""
        async with self._db.transaction(read_only=True) as tx:
            return await tx.harness_calls.find_by_message(message_id)

    async def fork_point(self, call: HarnessCall) -> tuple[str, int] | None:
        """Where a new call can start so that it answers ``call``'s input again from the same harness state: its
        session id and the settled seq just before its own first turn. None when its harness cannot fork (a
        remote one, say) or it never opened a session. A journal that cannot be read raises its error."""
        adapter = self._forking_adapter(call)
        if adapter is None or call.execution_ref is None or not isinstance(adapter, ForkPoints):
            return None
        return call.execution_ref, await adapter.fork_point(_request_of(call), call.execution_ref)

    async def continuation_point(self, call: HarnessCall) -> tuple[str, int] | None:
        """Where a new call can start so that it goes on from ``call``'s session as that call left it (the
        conversation's next question to the same harness): its session id and its last seq, when the session is
        settled there. None when its harness cannot fork, it never opened a session, or the session is not
        settled. A journal that cannot be read raises its error."""
        adapter = self._forking_adapter(call)
        if adapter is None or call.execution_ref is None or not isinstance(adapter, EndPoints):
            return None
        end = await adapter.end_point(_request_of(call), call.execution_ref)
        return None if end is None else (call.execution_ref, end)

    def _forking_adapter(self, call: HarnessCall) -> HarnessAdapter | None:
        adapter = self._adapters.get(call.target)
        return adapter if adapter is not None and supports_forks(adapter) else None

    async def wait(self, call_id: str, timeout: float, *, stop: asyncio.Event | None = None) -> HarnessCall:
        """The call once it is terminal, or as it is when ``timeout`` passes or ``stop`` is set (a server's
        shutdown). Wakes when the call ends (`call_channel`; every poll interval for a call another replica
        drives); ending a wait never cancels the call."""
        deadline = self._clock.monotonic() + max(timeout, 0.0)
        # Its end wakes this at once, also when it comes while the call is read; other changes do not.
        with self._bus.listen(call_channel(call_id)) as ends:
            while True:
                call = await self.get(call_id)
                remaining = deadline - self._clock.monotonic()
                if call.is_terminal or remaining <= 0 or (stop is not None and stop.is_set()):
                    return call
                await ends.wait(min(remaining, self._poll_interval), stop=stop)

    async def stream(self, call_id: str, *, after_seq: int = 0) -> AsyncGenerator[MessageEvent, None]:
        """The call's visible events (its message's stored AgentUE events) after ``after_seq``.

        Ends once the call is terminal and everything stored by then was delivered (or the message ended).
        Served from the database: a reader may stop and come back with the last seq it saw, losing nothing.
        """
        call = await self.get(call_id)
        if call.message_id is None:  # pragma: no cover - every call has a message
            return
        seq = max(after_seq, 0)
        # Listening from before each read: a commit that lands while it reads wakes the next wait.
        listening = contextlib.nullcontext() if call.conversation_id is None else self._bus.listen(call.conversation_id)
        with listening as commits:
            while True:
                async with self._db.transaction(read_only=True) as tx:
                    events = await tx.message_events.read(call.message_id, after_seq=seq, limit=STREAM_PAGE)
                    call = await tx.harness_calls.get(call_id)
                for event in events:
                    seq = event.seq
                    yield event
                    if event.event.get("op") == "end":
                        return
                if len(events) == STREAM_PAGE:
                    continue
                if call.is_terminal and not events:
                    return
                if not events and commits is not None:
                    await commits.wait(self._poll_interval)

    async def read_events(self, call_id: str, *, after_seq: int = 0, limit: int = STREAM_PAGE) -> list[MessageEvent]:
        """One page of the call's visible events after ``after_seq`` (no waiting)."""
        async with self._db.transaction(read_only=True) as tx:
            call = await tx.harness_calls.get(call_id)
            if call.message_id is None:  # pragma: no cover - every call has a message
                return []
            return await tx.message_events.read(call.message_id, after_seq=after_seq, limit=limit)

    async def trail(self, call_id: str) -> LedgerView:
        """The call's ledger facts (its lane and events)."""
        call = await self.get(call_id)
        return await self._ledger.load_run(call.conversation_id or call.owner_uid, call.id)

    async def usage(self, call_id: str) -> UsageTotals:
        return await self._ledger.usage(LedgerScope(harness_call_id=call_id))

    # --- commands ------------------------------------------------------------------------------------------------

    async def cancel(self, call_id: str) -> HarnessCall:
        """Ask for the call to stop (idempotent); the driving replica cancels the execution and records it."""
        async with self._db.transaction() as tx:
            call = await tx.harness_calls.request_cancel(call_id)
        if not call.is_terminal:
            self._publish({"k": "poke", "c": call_id})  # the replica driving it (this one or another) re-reads
        return call

    async def answer_gate(self, call_id: str, gate_id: str, answer: str, identity: str) -> HarnessCall:
        """Record ``answer`` (approve / always / deny) to the call's open gate; only the asker (``user:<key>``)
        may answer, once. The answer is stored in the gate's ask block and forwarded to the harness."""
        if answer not in GATE_ANSWERS:
            raise InvalidRecord(f"a gate answer is approve, always or deny, not {answer!r}")
        async with self._db.transaction() as tx:
            call = await tx.harness_calls.lock(call_id)
            asker = call.params.get("asker")
            if not asker or identity != asker:
                raise GateForbidden("only the user who asked may answer this call's permission requests")
            if call.is_terminal:
                raise Conflict(f"harness call {call_id} is already {call.phase}")
            if call.message_id is None:  # pragma: no cover - every call has a message
                raise NotFound(f"harness call {call_id} has no message")
            message = await tx.messages.lock(call.message_id)
            block = _find_block(message.content, gate_block_id(gate_id))
            if block is None or block.get("type") != "ask":
                raise NotFound(f"harness call {call_id} has no gate {gate_id!r}")
            status = block.get("status")
            if status != "pending":
                if status == "success" and block.get("value") == answer:
                    return call  # the same answer again
                raise Conflict(f"gate {gate_id!r} is already closed ({status})")
            if message.status in streams.TERMINAL_STATUSES:
                raise Conflict(f"message {message.id} is {message.status}")
            await streams.emit(
                tx,
                message.id,
                [{"op": "set", "block": answered_ask(block, answer)}],
                bus=self._bus,
                allow_human_blocks=True,
            )
        self._publish({"k": "poke", "c": call_id})
        return call

    async def answer_question(self, call_id: str, request_id: str, text: str, identity: str) -> HarnessCall:
        """Record ``text`` as the answer to the call's open ask_user question; only the asker (``user:<key>``) may
        answer, once. The answer is stored in the question's ask block and forwarded to the harness."""
        if not text.strip():
            raise InvalidRecord("an answer needs some text")
        async with self._db.transaction() as tx:
            call = await tx.harness_calls.lock(call_id)
            asker = call.params.get("asker")
            if not asker or identity != asker:
                raise GateForbidden("only the user who asked may answer this call's questions")
            if call.is_terminal:
                raise Conflict(f"harness call {call_id} is already {call.phase}")
            if call.message_id is None:  # pragma: no cover - every call has a message
                raise NotFound(f"harness call {call_id} has no message")
            message = await tx.messages.lock(call.message_id)
            block = _find_block(message.content, question_block_id(request_id))
            if block is None or block.get("type") != "ask":
                raise NotFound(f"harness call {call_id} has no question {request_id!r}")
            status = block.get("status")
            if status != "pending":
                if status == "success" and block.get("value") == text:
                    return call  # the same answer again
                raise Conflict(f"question {request_id!r} is already closed ({status})")
            if message.status in streams.TERMINAL_STATUSES:
                raise Conflict(f"message {message.id} is {message.status}")
            await streams.emit(
                tx,
                message.id,
                [{"op": "set", "block": answered_ask(block, text)}],
                bus=self._bus,
                allow_human_blocks=True,
            )
        self._publish({"k": "poke", "c": call_id})
        return call

    def takes_inputs(self, target: str) -> bool:
        """Whether calls of ``target`` take users' follow-ups while they run (its adapter's ``supports_inputs``)."""
        return bool(getattr(self._adapters.get(target), "supports_inputs", False))

    async def add_input(self, call_id: str, text: str, *, key: str) -> InputOutcome:
        """Hand a user's follow-up ``text`` (``key``: its input message id) to the running call ``call_id``:
        ``delivered`` (queued into its turn), ``elsewhere`` (another replica drives it: ask there), or ``refused``
        (the call ended, its turn ended, or its harness takes no follow-ups)."""
        drive = self._driver.drive_of(call_id)
        if drive is not None:
            return "delivered" if await drive.add_input(text, key=key) else "refused"
        async with self._db.transaction(read_only=True) as tx:
            call = await tx.harness_calls.get(call_id)
            lease = await tx.leases.get(lease_resource(call_id))
        if call.is_terminal or not self.takes_inputs(call.target):
            return "refused"
        driven = lease is not None and lease.holder != self._replica_id and lease.expires_at > self._clock.now()
        return "elsewhere" if driven else "refused"  # nobody drives it now: the follow-up is answered alone


def _find_block(content: dict[str, Any], block_id: str) -> dict[str, Any] | None:
    for block in content.get("blocks") or ():
        if isinstance(block, dict) and block.get("id") == block_id:
            return block
    return None


def _request_of(call: HarnessCall) -> AdapterRequest:
    """``call``'s parameters as an adapter request (for questions about its session, not to run it)."""
    workspace, tools = workspace_of(call.params)
    return AdapterRequest(
        call_id=call.id,
        target=call.target,
        text=str(call.params.get("text", "")),
        history=history_of(call.params),
        options={},
        deadline=call.deadline_at,
        timeout=1.0,
        workspace=workspace,
        tools=tools,
        fork=fork_of(call.params),
    )
