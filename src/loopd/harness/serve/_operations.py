"""Commands whose HTTP answer depends on what the session decided: cancelling a queued input, answering a gate.

Both follow one pattern: note the journal seq, look at what is already decided up to it, send the command, then
read the session's events *from the next seq* (gap-free, so nothing decided in between is missed) until the
outcome for this id shows up.

Must not do: restore sessions or parse HTTP (the app does both).
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from dataclasses import dataclass
from typing import Final, Literal

from loopd._infra.http_errors import ApiError
from loopd.harness.actors import Session
from loopd.harness.core import codec
from loopd.harness.core.events import (
    EphemeralEvent,
    GateOpened,
    GateResolved,
    InputCancelled,
    InputQueued,
    InputRejected,
    InputsFolded,
    LoopEvent,
    SessionEvent,
    TurnStarted,
)
from loopd.harness.serve._sessions import ServedSessions

InputFate = Literal["queued", "started", "cancelled", "rejected"]

_INPUT_KINDS: Final = frozenset({"input_queued", "turn_started", "inputs_folded", "input_cancelled", "input_rejected"})
_GATE_KINDS: Final = frozenset({"gate_opened", "gate_resolved"})
_SCAN_PAGE: Final = 1000


@dataclass(frozen=True, slots=True)
class GateOutcome:
    gate_id: str
    resolved: GateResolved | None


def _input_fate(event: SessionEvent | LoopEvent | EphemeralEvent, command_id: str) -> tuple[InputFate, str] | None:
    match event:
        case InputQueued(command_id=cid, loop=loop) if cid == command_id:
            return "queued", loop
        case TurnStarted(inputs=inputs, loop=loop) | InputsFolded(inputs=inputs, loop=loop) if any(
            q.command_id == command_id for q in inputs
        ):
            return "started", loop
        case InputCancelled(command_id=cid, loop=loop) if cid == command_id:
            return "cancelled", loop
        case InputRejected(command_id=cid, loop=loop) if cid == command_id:
            return "rejected", loop
    return None


async def _scan(
    registry: ServedSessions, session_id: str, upto: int, kinds: Collection[str]
) -> list[SessionEvent | LoopEvent]:
    """Decoded events of ``kinds`` with seq <= ``upto`` (only those kinds are decoded)."""
    found: list[SessionEvent | LoopEvent] = []
    next_seq = 1
    while next_seq <= upto:
        page = await registry.read(session_id, next_seq, min(_SCAN_PAGE, upto - next_seq + 1))
        if not page:
            break
        found.extend(codec.decode(r.kind, r.version, r.data) for r in page if r.kind in kinds and r.seq <= upto)
        next_seq = page[-1].seq + 1
    return found


async def cancel_queued_input(
    registry: ServedSessions, session: Session, command_id: str, *, timeout: float = 10.0
) -> None:
    """Cancel a queued input: returns once it is cancelled (also if it already was); `ApiError` otherwise."""
    seq0 = session.last_seq
    fate: tuple[InputFate, str] | None = None
    for event in await _scan(registry, session.id, seq0, _INPUT_KINDS):
        fate = _input_fate(event, command_id) or fate
    loop = fate[1] if fate is not None else registry.submitted_loop(session.id, command_id)
    if loop is None:
        raise ApiError("not_found", f"no input {command_id!r} in session {session.id}")
    if fate is not None and fate[0] != "queued":
        _settle_input(fate[0], command_id)
        return
    sub = session.subscribe(from_seq=seq0 + 1, kinds=_INPUT_KINDS)
    try:
        await session.cancel_queued(command_id, loop=loop)
        async with asyncio.timeout(timeout):
            async for env in sub:
                seen = _input_fate(env.event, command_id)
                if seen is not None and seen[0] != "queued":
                    _settle_input(seen[0], command_id)
                    return
    except TimeoutError as exc:
        raise ApiError("service_unavailable", f"the session did not settle input {command_id} in time") from exc
    finally:
        await sub.aclose()
    raise ApiError("service_unavailable", f"session {session.id} stopped before it settled input {command_id}")


def _settle_input(fate: InputFate, command_id: str) -> None:
    if fate == "started":
        raise ApiError("conflict", f"input {command_id} already started; interrupt the turn instead")
    if fate == "rejected":
        raise ApiError("conflict", f"input {command_id} was rejected and never queued")


async def answer_gate(
    registry: ServedSessions,
    session: Session,
    gate_id: str,
    answer: Literal["approve", "approve_always", "deny"],
    *,
    timeout: float = 10.0,
) -> GateOutcome:
    """Answer an open gate and wait (up to ``timeout``) for its resolution; ``resolved=None`` if still pending."""
    seq0 = session.last_seq  # taken before looking at the state, so a resolution after the look has seq > seq0
    owner = next(
        (
            name
            for name, loop in session.state.loops.items()
            if loop.turn is not None and loop.turn.gate is not None and loop.turn.gate.gate_id == gate_id
        ),
        None,
    )
    if owner is None:
        await _explain_closed_gate(registry, session, gate_id, seq0)
    sub = session.subscribe(from_seq=seq0 + 1, kinds={"gate_resolved"})
    try:
        await session.answer_gate(gate_id, answer, loop=owner)
        async with asyncio.timeout(timeout):
            async for env in sub:
                if isinstance(env.event, GateResolved) and env.event.gate_id == gate_id:
                    return GateOutcome(gate_id, env.event)
    except TimeoutError:
        return GateOutcome(gate_id, None)
    finally:
        await sub.aclose()
    raise ApiError("service_unavailable", f"session {session.id} stopped before gate {gate_id} was resolved")


async def _explain_closed_gate(registry: ServedSessions, session: Session, gate_id: str, upto: int) -> None:
    opened = False
    for event in await _scan(registry, session.id, max(upto, session.last_seq), _GATE_KINDS):
        if isinstance(event, GateResolved) and event.gate_id == gate_id:
            raise ApiError("conflict", f"gate {gate_id} was already resolved ({event.answer}: {event.reason})")
        if isinstance(event, GateOpened) and event.gate_id == gate_id:
            opened = True
    if opened:
        raise ApiError("conflict", f"gate {gate_id} is no longer open")
    raise ApiError("not_found", f"no open gate {gate_id!r} in session {session.id}")
