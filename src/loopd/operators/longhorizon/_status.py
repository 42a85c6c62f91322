"""The Run's status on the wire (`RunStatus`) and as the phase machine sees it (`RunState`), both ways.

``to_status`` also writes the conditions (``Succeeded``, ``WaitingForHuman``), keeping a condition's transition
time while its status does not change. ``from_status`` of an empty status is None (the Run has not started).

Must not do: I/O.
"""

from __future__ import annotations

from typing import Literal, get_args

from loopd.operators.longhorizon._phases import (
    AuditRecord,
    Choice,
    Decision,
    HumanReason,
    Phase,
    Ref,
    RoundRecord,
    RunState,
    Verdict,
)
from loopd.operators.longhorizon._resources import (
    Choice as WireChoice,
)
from loopd.operators.longhorizon._resources import (
    Condition,
    LastAudit,
    ObjectRef,
    RunStatus,
)
from loopd.operators.longhorizon._resources import (
    Decision as WireDecision,
)
from loopd.operators.longhorizon._resources import (
    RoundRecord as WireRound,
)
from loopd.operators.longhorizon._resources import (
    Verdict as WireVerdict,
)

__all__ = ["from_status", "to_status"]

_PHASES = frozenset(get_args(Phase))


def _ref(ref: ObjectRef | None) -> Ref | None:
    return Ref(ref.name, ref.uid) if ref is not None else None


def _wire_ref(ref: Ref | None) -> ObjectRef | None:
    return ObjectRef(name=ref.name, uid=ref.uid) if ref is not None and ref.name else None


def _verdict(verdict: WireVerdict) -> Verdict:
    return Verdict(
        complete=verdict.complete,
        integrity=verdict.integrity,
        task_state=verdict.task_state,
        evidence=verdict.evidence,
        feedback=verdict.feedback,
    )


def wire_verdict(verdict: Verdict) -> WireVerdict:
    """The wire form of a verdict (an Audit's status holds it too)."""
    return WireVerdict(
        complete=verdict.complete,
        integrity=verdict.integrity,
        task_state=verdict.task_state,
        evidence=verdict.evidence,
        feedback=verdict.feedback,
    )


def from_status(status: RunStatus | None) -> RunState | None:
    """The machine's state of a stored status; None when the Run has no phase yet."""
    if status is None or status.phase is None or status.phase not in _PHASES:
        return None
    decision = None
    if status.decision is not None:
        wire = status.decision
        decision = Decision(
            next=wire.next,
            summary=wire.summary,
            plan=wire.plan,
            contract=wire.contract,
            question=wire.question,
            choices=tuple(Choice(c.value, c.label or c.value) for c in wire.choices or ()),
            allow_other=wire.allow_other,
        )
    last = None
    if status.last_audit is not None:
        wire_last = status.last_audit
        last = AuditRecord(
            execution=Ref(wire_last.execution.name, wire_last.execution.uid),
            contract_version=wire_last.contract_version,
            message_id=wire_last.message_id,
            verdict=_verdict(wire_last.verdict),
        )
    reason: HumanReason | None = status.human_reason
    return RunState(
        phase=status.phase,
        round=status.round or 1,
        budget=status.budget or 1,
        failures=status.failures or 0,
        contract=status.contract or "",
        contract_version=status.contract_version or 1,
        task_state=status.task_state or "",
        guidance=status.guidance or "",
        decision=decision,
        execution=_ref(status.execution),
        audit=_ref(status.audit),
        last_audit=last,
        human_reason=reason,
        human_message_id=status.human_message_id,
        manager_message_id=status.manager_message_id,
        final_message_id=status.final_message_id,
        summary=status.summary or "",
        input_message_ids=tuple(status.input_message_ids or ()),
        consumed_through=status.input_through,
        finished_at=status.finished_at,
        rounds=tuple(
            RoundRecord(
                index=r.index,
                decision=r.decision,
                summary=r.summary,
                messages=tuple(r.messages or ()),
                execution=_ref(r.execution),
                audit=_ref(r.audit),
            )
            for r in status.rounds or ()
        ),
    )


def _condition(previous: RunStatus | None, kind: str, on: bool, reason: str, message: str, now: str) -> Condition:
    value: Literal["True", "False"] = "True" if on else "False"
    for old in (previous.conditions or ()) if previous is not None else ():
        if old.type == kind and old.status == value:
            return Condition(
                type=kind, status=value, reason=reason, message=message, last_transition_time=old.last_transition_time
            )
    return Condition(type=kind, status=value, reason=reason, message=message, last_transition_time=now)


def to_status(state: RunState, *, previous: RunStatus | None, now: str) -> RunStatus:
    """The wire status of ``state`` (conditions derived from its phase; ``previous`` keeps transition times)."""
    decision = None
    if state.decision is not None:
        d = state.decision
        decision = WireDecision(
            next=d.next,
            summary=d.summary,
            plan=d.plan,
            contract=d.contract,
            question=d.question,
            choices=[WireChoice(value=c.value, label=c.label) for c in d.choices] or None,
            allow_other=d.allow_other,
        )
    last = None
    if state.last_audit is not None:
        a = state.last_audit
        last = LastAudit(
            execution=ObjectRef(name=a.execution.name, uid=a.execution.uid),
            contract_version=a.contract_version,
            messageID=a.message_id,
            verdict=wire_verdict(a.verdict),
        )
    succeeded_reason = {"Succeeded": "Done", "Stopped": "Stopped", "Failed": "DeadlineExceeded"}.get(
        state.phase, "InProgress"
    )
    conditions = [
        _condition(previous, "Succeeded", state.phase == "Succeeded", succeeded_reason, state.summary[:1000], now),
        _condition(
            previous,
            "WaitingForHuman",
            state.phase == "WaitingForHuman",
            state.human_reason or "None",
            "waiting for an answer" if state.phase == "WaitingForHuman" else "",
            now,
        ),
    ]
    return RunStatus(
        input_through=state.consumed_through,
        inputMessageIDs=list(state.input_message_ids) or None,
        finished_at=state.finished_at,
        phase=state.phase,
        round=state.round,
        budget=state.budget,
        failures=state.failures,
        contract=state.contract,
        contract_version=state.contract_version,
        task_state=state.task_state or None,
        guidance=state.guidance or None,
        decision=decision,
        execution=_wire_ref(state.execution),
        audit=_wire_ref(state.audit),
        last_audit=last,
        humanMessageID=state.human_message_id,
        human_reason=state.human_reason,
        managerMessageID=state.manager_message_id,
        finalMessageID=state.final_message_id,
        summary=state.summary or None,
        consumed_through=state.consumed_through,
        rounds=[
            WireRound(
                index=r.index,
                decision=r.decision,
                summary=r.summary,
                messages=list(r.messages) or None,
                execution=_wire_ref(r.execution),
                audit=_wire_ref(r.audit),
            )
            for r in state.rounds
        ]
        or None,
        conditions=conditions,
    )
