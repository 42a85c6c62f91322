"""The ledger trail of one harness call, written inside the engine's own transactions.

Shape: Session = the call's conversation id, Run = the call id, one Lane ``main`` (tagged with the task,
conversation and call ids, so roll-ups by any of them work), one Turn, and an *execution* action (type
``tool_call``, named ``harness:<target>``, classified by the adapter's ``effect``) whose attempts are the
adapter starts and resumes. Each attempt's ``attempt.requested`` commits together with the phase change that
precedes the adapter call; its terminal event commits with the call's terminal phase. An attempt whose drive
died (a crash, a lost lease) has no terminal event while that is all anyone knows: it is unresolved, in doubt.
The next drive of the call settles it — once its resumed run has caught up with what was applied — with
``attempt.failed`` (``reason: "interrupted"``) and what the lost work spent beyond what the harness reported:
an estimate (``usage_estimated: true``) or unknown (``usage: null``, ``usage_estimated: true``), see
`interrupted_usage`; a call that ends first closes such attempts the same way (usage unknown).

What the harness reports becomes child actions of the execution: `ModelCalled` → ``model_call`` (or
``compact``) with requested + completed and the usage in the completed payload; `ToolStarted` / `ToolFinished`
→ ``tool_call`` with the tool's effect kind and idempotency. Gates become ``turn.loopd.gate_opened`` /
``turn.loopd.gate_resolved`` events. A `ModelCalled` that carries its recorded prompts (``recorded``, see
``_prompts``) gets one attempt per try — retries and fallbacks failed with their errors, the last one completed
with the usage — whose ``attempt.requested`` names the request artifact and whose terminal event the reply, the
finish reason, the provider's request id and the duration; the artifacts are written in the same transaction. A
`Failed` that carries model calls whose every try failed writes them the same way (all attempts failed). Tool inputs
and failure messages are redacted before they are stored.

Ids are derived from the call id (UUIDv5), so every engine replica names the same entity the same way, and
append ids from the update index, so a retried transaction is idempotent. Must not do: decide phases.
"""

from __future__ import annotations

import hashlib
import math
import uuid
from collections.abc import Sequence
from typing import Any, Final

from loopd._infra.clock import Clock
from loopd._infra.ids import is_uuid7_text
from loopd.server.ledger import (
    Action,
    ActionType,
    Actor,
    Attempt,
    EffectKind,
    EventType,
    Idempotency,
    Lane,
    LedgerFacts,
    NewEvent,
    Redactor,
    Scope,
    SqlLedgerStore,
    Turn,
    Usage,
    ref_payload,
)
from loopd.server.storage import Conflict, HarnessCall, NotFound, Transaction

from ._adapter import Failed, GateOpened, GateResolved, ModelCalled, ToolFinished, ToolStarted, Update
from ._prompts import RecordedCall

_NAMESPACE: Final = uuid.UUID("6f1d7c52-9a0e-4b7e-8f43-2c5b8e1a9d30")
ENGINE_ACTOR_KEY: Final = "loopd:harness-engine"


_NAMESPACE_BYTES: Final = _NAMESPACE.bytes


def trail_id(call_id: str, *parts: str, ordered: bool = True) -> str:
    """A stable id for an entity of this call's trail, from SHA-1 over a namespace and ``"call_id/part/…"``.

    Ordered (a call id that is a UUIDv7): a UUIDv8 that starts with the call id's first 48 bits — the millisecond it
    was made — so a trail's rows sort by their call's time and the ledger's indexes on these ids (lane, subject) grow
    at their right edge; random ids put every event on random pages of those B-trees, and a server's commits grew
    more costly as its ledger did. Otherwise (``ordered=False``: the ids of trails opened before ordered ids, see
    `trail_ordering`; or a call id that is not a UUIDv7): ``uuid.uuid5`` of the same path. Computed without
    building a `uuid.UUID` (a drive names ~18 trail entities per step)."""
    raw = bytearray(
        hashlib.sha1(_NAMESPACE_BYTES + "/".join((call_id, *parts)).encode(), usedforsecurity=False).digest()
    )
    raw[8] = (raw[8] & 0x3F) | 0x80  # the RFC 4122 variant
    if ordered and is_uuid7_text(call_id):
        raw[6] = (raw[6] & 0x0F) | 0x80  # version 8
        text = call_id[:8] + call_id[9:13] + raw[6:16].hex()
    else:
        raw[6] = (raw[6] & 0x0F) | 0x50  # version 5
        text = raw[:16].hex()
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


async def trail_ordering(tx: Transaction, call: HarnessCall) -> bool:
    """Whether ``call``'s trail takes ordered ids (`trail_id`): yes unless its lane was opened under the uuid5 ids
    (by a server from before them: a call begun then and resumed now stays on its lane). A pending call has never
    been begun, so it has no lane yet and needs no read."""
    if call.phase == "pending" or not is_uuid7_text(call.id):
        return True
    try:
        await SqlLedgerStore.within(tx).get_lane(trail_id(call.id, "lane", ordered=False))
    except NotFound:
        return True
    return False


CHARS_PER_TOKEN: Final = 4
INTERRUPTED: Final = "interrupted"


def interrupted_usage(
    shown: str | None, durable: str | None, *, reported_last: bool, previous: ModelCalled | None, prompt_chars: int
) -> Usage | None:
    """An estimate of what a cut-short attempt spent that the harness never reported (None: unknown).

    Evidence: live text the lost run showed beyond the durable answer (``shown`` past ``durable``) comes from a
    model call in flight, whose reply was never reported — unless the last applied update reported a model call
    (``reported_last``: that text is its own). Output ≈ that text at ~4 characters per token; input ≈ the
    context of the previous model call (its input + output), or the prompt for a first call; cost at the
    previous call's average price (0 without one).
    """
    base = durable or ""
    if reported_last or shown is None or not shown.startswith(base) or len(shown) <= len(base):
        return None
    output = math.ceil((len(shown) - len(base)) / CHARS_PER_TOKEN)
    if previous is None:
        return Usage(math.ceil(prompt_chars / CHARS_PER_TOKEN), output, 0.0)
    tokens = previous.input_tokens + previous.output_tokens
    price = previous.cost_usd / tokens if tokens else 0.0
    return Usage(tokens, output, round(price * (tokens + output), 10))


_RUN_END: Final[dict[str, str]] = {
    "succeeded": EventType.RUN_COMPLETED,
    "cancelled": EventType.RUN_CANCELLED,
}


class Trail:
    """The trail facts of one call; every method writes through the transaction given at construction."""

    def __init__(
        self,
        tx: Transaction,
        call: HarnessCall,
        *,
        task_id: str | None,
        effect: tuple[EffectKind, Idempotency],
        clock: Clock,
        redactor: Redactor | None = None,
        actors: dict[str, str] | None = None,
        facts: LedgerFacts | None = None,
        ordered: bool = True,
    ) -> None:
        self._tx = tx
        self._ordered = ordered
        self._known_actors = actors
        self._store = SqlLedgerStore.within(tx, facts=facts)
        self._redactor = redactor
        self._call = call
        self._task_id = task_id
        self._effect = effect
        self._clock = clock
        self.lane_id = trail_id(call.id, "lane", ordered=ordered)
        self.turn_id = trail_id(call.id, "turn", ordered=ordered)
        self.execution_id = trail_id(call.id, "execution", ordered=ordered)
        self._engine_actor: str | None = None
        self._harness_actor: str | None = None
        self._held: list[tuple[str, list[NewEvent]]] | None = None

    # --- plumbing --------------------------------------------------------------------------------------------

    async def _actors(self) -> tuple[str, str]:
        if self._engine_actor is None or self._harness_actor is None:
            known = self._known_actors
            harness_key = f"harness:{self._call.target}"
            if known is not None and ENGINE_ACTOR_KEY in known and harness_key in known:
                self._engine_actor, self._harness_actor = known[ENGINE_ACTOR_KEY], known[harness_key]
                return self._engine_actor, self._harness_actor
            engine = await self._store.ensure_actor(Actor(type="orchestrator", key=ENGINE_ACTOR_KEY, framework="loopd"))
            harness = await self._store.ensure_actor(Actor(type="harness", key=harness_key, framework="loopd"))
            self._engine_actor, self._harness_actor = engine.id, harness.id
            if known is not None:
                ids = {ENGINE_ACTOR_KEY: engine.id, harness_key: harness.id}
                # Only once surely stored: an actor a rolled-back write made does not exist.
                self._tx.after_sure_commit(lambda: known.update(ids))
        return self._engine_actor, self._harness_actor

    def _id(self, *parts: str) -> str:
        return trail_id(self._call.id, *parts, ordered=self._ordered)

    def _event(self, event_type: str, subject: str, actor: str, payload: dict[str, Any] | None = None) -> NewEvent:
        return NewEvent(event_type, subject, actor, payload=payload or {}, occurred_at=self._clock.now())

    async def _append(self, append_key: str, events: Sequence[NewEvent]) -> None:
        if self._held is not None:
            self._held.append((append_key, list(events)))
            return
        await self._store.append_next(self.lane_id, self._id("append", append_key), events)

    def hold(self) -> None:
        """Keep this trail's appends until `release`, which writes them as one: the facts of one transaction (a
        model call and the call's end, say) as one batch — one check, one insert, one ``ledger_appends`` row — with
        the same events in the same order as one append each (an append's id names the appends it holds)."""
        if self._held is None:
            self._held = []

    async def release(self) -> None:
        """Write what `hold` kept (as one append) and stop holding; call it before the transaction commits."""
        await self._flush()
        self._held = None

    async def _flush(self) -> None:
        held = self._held
        if not held:
            return
        self._held = []
        if len(held) == 1:
            key, events = held[0]
        else:
            key, events = "+".join(key for key, _ in held), [event for _, batch in held for event in batch]
        await self._store.append_next(self.lane_id, self._id("append", key), events)

    def _redacted(self, value: Any) -> Any:
        return self._redactor.value(value) if self._redactor is not None else value

    # --- lifecycle -------------------------------------------------------------------------------------------

    async def open(self) -> None:
        """Create lane, turn and execution action (idempotent) and their opening events once."""
        if (await self._entities()).last_seq == 0:
            await self._append("opened", await self._opening())

    async def open_with_attempt(self, key: str, *, mode: str, replica: str) -> str:
        """`open`, then `request_attempt`: on a new lane the opening events and ``attempt.requested`` go in one
        append (one batch checked and written instead of two); returns the attempt id."""
        lane = await self._entities()
        attempt_id, requested = await self._attempt_request(key, mode=mode, replica=replica)
        if lane.last_seq == 0:
            await self._append("opened", [*await self._opening(), requested])
        else:
            await self._append(f"attempt/{key}", [requested])
        return attempt_id

    async def _entities(self) -> Lane:
        call = self._call
        lane = await self._store.create_lane(
            Lane(
                session_id=call.conversation_id or call.owner_uid,
                run_id=call.id,
                name="main",
                task_id=self._task_id,
                conversation_id=call.conversation_id,
                harness_call_id=call.id,
                attributes={"owner_uid": call.owner_uid, "effect_key": call.effect_key, "target": call.target},
                id=self.lane_id,
            )
        )
        await self._store.create_turn(Turn(lane_id=self.lane_id, id=self.turn_id))
        kind, idempotency = self._effect
        await self._store.create_action(
            Action(
                turn_id=self.turn_id,
                type=ActionType.TOOL_CALL,
                effect_kind=kind,
                idempotency=idempotency,
                name=f"harness:{call.target}",
                attributes={"call_id": call.id},
                id=self.execution_id,
            )
        )
        return lane

    async def _opening(self) -> list[NewEvent]:
        engine, _ = await self._actors()
        call = self._call
        return [
            self._event(EventType.RUN_STARTED, call.id, engine, {"effect_key": call.effect_key}),
            self._event(EventType.TURN_STARTED, self.turn_id, engine),
            self._event(EventType.ACTION_STARTED, self.execution_id, engine, {"target": call.target}),
        ]

    async def request_attempt(self, key: str, *, mode: str, replica: str) -> str:
        """Record ``attempt.requested`` for one adapter start / resume; returns the attempt id."""
        attempt_id, requested = await self._attempt_request(key, mode=mode, replica=replica)
        await self._append(f"attempt/{key}", [requested])
        return attempt_id

    async def _attempt_request(self, key: str, *, mode: str, replica: str) -> tuple[str, NewEvent]:
        engine, _ = await self._actors()
        attempt = await self._store.create_attempt(Attempt(action_id=self.execution_id, id=self._id("attempt", key)))
        return attempt.id, self._event(
            EventType.ATTEMPT_REQUESTED, attempt.id, engine, {"mode": mode, "replica": replica}
        )

    async def unresolved_attempts(self) -> list[str]:
        """The execution attempts of this call with no outcome (drives that died), oldest first."""
        await self._flush()  # what this trail holds is part of what the ledger says
        found = await self._store.unresolved_attempts(Scope(harness_call_id=self._call.id))
        return [item.attempt.id for item in found if item.action.id == self.execution_id]

    async def interrupt_attempts(self, attempt_ids: Sequence[str], usage: Usage | None, why: str) -> None:
        """Settle attempts whose drive died: ``attempt.failed`` (reason interrupted), their usage marked as
        estimated (``usage`` for the last of them, the one that was cut short last) or unknown."""
        engine, _ = await self._actors()
        for position, attempt_id in enumerate(attempt_ids):
            spent = usage if position == len(attempt_ids) - 1 else None
            note = (
                "estimated from the live text of a model call that was cut short; the harness never reported it"
                if spent is not None
                else "unknown: the work cut short reported no usage"
            )
            body: dict[str, Any] = {
                "reason": INTERRUPTED,
                "error": {"code": INTERRUPTED, "message": why},
                "usage": spent.to_payload() if spent is not None else None,
                "usage_estimated": True,
                "usage_note": note,
            }
            await self._append(
                f"attempt-interrupted/{attempt_id}", [self._event(EventType.ATTEMPT_FAILED, attempt_id, engine, body)]
            )

    async def fail_attempt(self, attempt_id: str, error: dict[str, Any]) -> None:
        """The attempt ended without ending the call (the execution may go on; a later resume is a new attempt)."""
        engine, _ = await self._actors()
        await self._append(
            f"attempt-failed/{attempt_id}",
            [self._event(EventType.ATTEMPT_FAILED, attempt_id, engine, {"error": error})],
        )

    async def close(
        self, phase: str, error: dict[str, Any] | None, attempt_id: str | None, *, earlier_attempts: bool = True
    ) -> None:
        """The terminal facts: the attempt's outcome (if this drive requested one), action, turn and run. Attempts
        of earlier drives still unresolved are closed as interrupted (usage unknown); ``earlier_attempts=False``: the
        caller knows there are none (its drive took the call from ``pending``), so they are not looked for."""
        engine, _ = await self._actors()
        found = await self.unresolved_attempts() if earlier_attempts else []
        earlier = [attempt for attempt in found if attempt != attempt_id]
        if earlier:
            await self.interrupt_attempts(earlier, None, f"the call ended ({phase}) after this attempt was cut short")
        ok = phase == "succeeded"
        events: list[NewEvent] = []
        payload: dict[str, Any] = {"phase": phase}
        if error is not None:
            payload["error"] = error
        if attempt_id is not None:
            kind = EventType.ATTEMPT_COMPLETED if ok else EventType.ATTEMPT_FAILED
            body = dict(payload) if ok else {**payload, "error": error or {"code": phase, "message": phase}}
            events.append(self._event(kind, attempt_id, engine, body))
        events.append(
            self._event(
                EventType.ACTION_COMPLETED if ok else EventType.ACTION_FAILED, self.execution_id, engine, payload
            )
        )
        events.append(
            self._event(EventType.TURN_COMPLETED if ok else EventType.TURN_FAILED, self.turn_id, engine, payload)
        )
        events.append(self._event(_RUN_END.get(phase, EventType.RUN_FAILED), self._call.id, engine, payload))
        await self._append("closed", events)

    # --- what the harness reports ----------------------------------------------------------------------------

    async def record(self, index: int, update: Update) -> None:
        """The ledger facts of durable update number ``index`` (nothing for updates without any)."""
        match update:
            case ModelCalled():
                await self._model_call(index, update)
            case ToolStarted():
                await self._tool_started(index, update)
            case ToolFinished():
                await self._tool_finished(index, update)
            case Failed(recorded=recorded) if recorded:
                await self._failed_model_calls(index, recorded)
            case GateOpened(gate_id=gate_id):
                _, harness = await self._actors()
                await self._append(
                    f"update/{index}",
                    [self._event("turn.loopd.gate_opened", self.turn_id, harness, {"gate_id": gate_id})],
                )
            case GateResolved(gate_id=gate_id, answer=answer, granted=granted, timed_out=timed_out):
                _, harness = await self._actors()
                body = {"gate_id": gate_id, "answer": answer, "granted": granted, "timed_out": timed_out}
                await self._append(
                    f"update/{index}", [self._event("turn.loopd.gate_resolved", self.turn_id, harness, body)]
                )
            case _:
                return

    async def _model_call(self, index: int, update: ModelCalled) -> None:
        _, harness = await self._actors()
        action = await self._store.create_action(
            Action(
                turn_id=self.turn_id,
                type=ActionType.COMPACT if update.action == "compact" else ActionType.MODEL_CALL,
                effect_kind=EffectKind.READ,
                idempotency=Idempotency.INHERENT,
                name=update.model,
                parent_action_id=self.execution_id,
                id=self._id("update", str(index)),
            )
        )
        usage = Usage(update.input_tokens, update.output_tokens, update.cost_usd)
        if update.recorded is not None and update.recorded.attempts:
            await self._recorded_model_call(index, action.id, harness, usage, update.recorded)
            return
        attempt = await self._store.create_attempt(
            Attempt(action_id=action.id, attempt_no=1, id=self._id("update", str(index), "attempt"))
        )
        await self._append(
            f"update/{index}",
            [
                self._event(EventType.ATTEMPT_REQUESTED, attempt.id, harness, {"reported": True}),
                self._event(EventType.ATTEMPT_COMPLETED, attempt.id, harness, {"usage": usage.to_payload()}),
            ],
        )

    async def _recorded_model_call(
        self, index: int, action_id: str, harness: str, usage: Usage, recorded: RecordedCall
    ) -> None:
        """A model call with its full prompts: one attempt per try (attempt_no 1…n; the last one produced the
        reply and carries the reported usage), the artifacts written in the same transaction."""
        events = await self._attempt_events((str(index),), action_id, harness, usage, recorded)
        await self._append(f"update/{index}", events)

    async def _failed_model_calls(self, index: int, calls: Sequence[RecordedCall]) -> None:
        """Model calls whose every attempt failed (the call then failed): each a ``model_call`` action of failed
        attempts, written with the call's failure."""
        _, harness = await self._actors()
        events: list[NewEvent] = []
        for number, recorded in enumerate(calls):
            if not recorded.attempts:
                continue
            parts = (str(index), "failed", str(number))
            action = await self._store.create_action(
                Action(
                    turn_id=self.turn_id,
                    type=ActionType.MODEL_CALL,
                    effect_kind=EffectKind.READ,
                    idempotency=Idempotency.INHERENT,
                    name=recorded.attempts[0].model,
                    parent_action_id=self.execution_id,
                    id=self._id("update", *parts),
                )
            )
            events.extend(await self._attempt_events(parts, action.id, harness, Usage(), recorded))
        if events:
            await self._append(f"update/{index}", events)

    async def _attempt_events(
        self, parts: tuple[str, ...], action_id: str, harness: str, usage: Usage, recorded: RecordedCall
    ) -> list[NewEvent]:
        await self._store.put_artifacts(self.lane_id, recorded.blobs)
        events: list[NewEvent] = []
        last = len(recorded.attempts) - 1
        for number, facts in enumerate(recorded.attempts):
            key = ("attempt",) if number == last else ("attempt", str(number + 1))
            attempt = await self._store.create_attempt(
                Attempt(action_id=action_id, attempt_no=number + 1, id=self._id("update", *parts, *key))
            )
            requested: dict[str, Any] = {
                "reported": True,
                "request": ref_payload(facts.request),
                "model": facts.model,
            }
            if facts.provider is not None:
                requested["provider"] = facts.provider
            events.append(
                NewEvent(
                    EventType.ATTEMPT_REQUESTED, attempt.id, harness, payload=requested, occurred_at=facts.started_at
                )
            )
            duration_ms = round((facts.ended_at - facts.started_at).total_seconds() * 1000, 3)
            if number == last and facts.error is None:
                body: dict[str, Any] = {"usage": usage.to_payload(), "duration_ms": duration_ms}
                if facts.reply is not None:
                    body["reply"] = ref_payload(facts.reply)
                if facts.finish_reason is not None:
                    body["finish_reason"] = facts.finish_reason
                if facts.provider_request_id is not None:
                    body["provider_request_id"] = facts.provider_request_id
                kind = EventType.ATTEMPT_COMPLETED
            else:
                body = {"error": facts.error or {"code": "error", "message": ""}, "duration_ms": duration_ms}
                kind = EventType.ATTEMPT_FAILED
            events.append(NewEvent(kind, attempt.id, harness, payload=body, occurred_at=facts.ended_at))
        return events

    async def _tool_action(self, update: ToolStarted | ToolFinished) -> tuple[str, bool]:
        """The tool call's attempt id, creating action and attempt when new; whether it was requested already."""
        kind, idempotency = (
            (update.effect_kind, update.idempotency)
            if isinstance(update, ToolStarted)
            else (EffectKind.UNKNOWN, Idempotency.UNKNOWN)
        )
        action_id = self._id("tool", update.call_id)
        attempt_id = self._id("tool", update.call_id, "attempt")
        existing = await self._attempt(attempt_id)
        if existing:
            return attempt_id, True
        await self._store.create_action(
            Action(
                turn_id=self.turn_id,
                type=ActionType.TOOL_CALL,
                effect_kind=kind,
                idempotency=idempotency,
                name=update.name,
                parent_action_id=self.execution_id,
                attributes={"tool_call_id": update.call_id},
                id=action_id,
            )
        )
        await self._store.create_attempt(Attempt(action_id=action_id, attempt_no=1, id=attempt_id))
        return attempt_id, False

    async def _attempt(self, attempt_id: str) -> bool:
        try:
            await self._store.get_attempt(attempt_id)
        except NotFound:
            return False
        return True

    async def _tool_started(self, index: int, update: ToolStarted) -> None:
        _, harness = await self._actors()
        attempt_id, known = await self._tool_action(update)
        if known:
            return  # the same tool call reported again (a resumed harness re-ran it): one attempt per call id
        await self._append(
            f"update/{index}",
            [self._event(EventType.ATTEMPT_REQUESTED, attempt_id, harness, {"input": self._redacted(update.input)})],
        )

    async def _tool_finished(self, index: int, update: ToolFinished) -> None:
        _, harness = await self._actors()
        attempt_id, known = await self._tool_action(update)
        events: list[NewEvent] = []
        if not known:
            events.append(self._event(EventType.ATTEMPT_REQUESTED, attempt_id, harness, {"input": None}))
        if update.status == "completed":
            events.append(self._event(EventType.ATTEMPT_COMPLETED, attempt_id, harness, {"status": update.status}))
        else:
            error = {"code": "tool_failed", "message": self._redacted(update.output[:500])}
            events.append(self._event(EventType.ATTEMPT_FAILED, attempt_id, harness, {"error": error}))
        try:
            await self._append(f"update/{index}", events)
        except Conflict:
            # The ledger refuses a second outcome before writing anything: a tool reported twice keeps its first.
            if not known:
                raise
