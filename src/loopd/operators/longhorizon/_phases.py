"""The Run's phase machine, pure: a Run's state plus one observed fact → its next state.

    "" ─▶ Receiving ─▶ Planning ─┬─ cli ──▶ Executing ─▶ Auditing ─▶ Receiving (next round)
              ▲                  ├─ ask / blocked ──▶ WaitingForHuman (ask)
              │                  ├─ done (clean, complete audit of this contract version) ──▶ Succeeded
              │                  └─ failure (call failed, invalid decision, "Completion rejected") ─▶ Receiving
              └──── WaitingForHuman: answered / Continue ── dismissed, timeout, declined ──▶ Stopped
    any phase past the deadline ──▶ Failed

Rules (the reference's, field names as the Run's status):

- A new Run starts at round 1 with ``budget = maxRounds``, ``contract = goal``, ``contractVersion = 1``.
- Every failure counts (``failures += 1``) and ends its round (``round += 1``: every call of a round has the round in
  its effect key, so the next try is a new call). A valid audit ends its round and resets ``failures``.
- At Receiving: follow-ups are taken (≤ 32 per pull, ≤ 100 per Run, guidance ≤ 16,000 bytes; the rest waits) and
  become guidance (they invalidate the last audit: it did not see them); then three consecutive failures ask the
  human (``failure``), a round past the budget asks (``budget``) — or stops the Run once the budget is 1,000 —
  else Planning.
- A decision whose contract differs from the current one bumps ``contractVersion``.
- ``done`` is accepted only when the last audit is of the current contract version, names an execution (uid) and
  the audit's message, and says ``complete`` with ``integrity: clean`` and evidence; otherwise the round fails with
  "Completion rejected: …".
- A human answer to an ask becomes guidance ("Question: … / Answer: …") and invalidates the last audit; "Continue"
  on the budget adds 25 rounds (at most to 1,000; the deadline stays); "Continue" after failures resets them. Any
  other outcome (dismissed, timeout, declined, failure) stops the Run with a summary.

Must not do: I/O, clocks (``now`` is given), or import anything beyond the standard library and this package's
pure modules. Every function returns a new state; none mutates its input.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Final, Literal

from loopd.operators.longhorizon._settings import HARD_MAX_ROUNDS

__all__ = [
    "BUDGET_STEP",
    "FAILURE_LIMIT",
    "GUIDANCE_BYTES",
    "MAX_INPUTS",
    "MAX_ROUNDS_KEPT",
    "PER_PULL",
    "TERMINAL",
    "AuditRecord",
    "Choice",
    "Decision",
    "Followup",
    "HumanOutcome",
    "HumanReason",
    "Integrity",
    "Next",
    "Phase",
    "Ref",
    "RoundRecord",
    "RunState",
    "Verdict",
    "answered",
    "audited",
    "completion_problem",
    "decided",
    "executed",
    "expire",
    "receive",
    "start",
]

Phase = Literal["Receiving", "Planning", "Executing", "Auditing", "WaitingForHuman", "Succeeded", "Stopped", "Failed"]
Next = Literal["cli", "ask", "blocked", "done"]
Integrity = Literal["clean", "violated", "unknown"]
HumanReason = Literal["ask", "budget", "failure"]

TERMINAL: Final[frozenset[str]] = frozenset({"Succeeded", "Stopped", "Failed"})
FAILURE_LIMIT: Final = 3
"""Consecutive failures after which the human is asked whether to go on."""
BUDGET_STEP: Final = 25
"""Rounds "Continue" adds to a spent budget."""
PER_PULL: Final = 32
"""Follow-ups taken at one Receiving."""
MAX_INPUTS: Final = 100
"""Input messages one Run takes in all (its own question included)."""
GUIDANCE_BYTES: Final = 16_000
"""The guidance (follow-ups and human answers) is kept under this many UTF-8 bytes; what does not fit waits."""
MAX_ROUNDS_KEPT: Final = 50
"""Round records kept in the status (the newest)."""
SUMMARY_CHARS: Final = 4_000


@dataclass(frozen=True, slots=True)
class Ref:
    """A child resource by name and uid (an Execution or an Audit)."""

    name: str
    uid: str


@dataclass(frozen=True, slots=True)
class Choice:
    """One choice the Manager offers the human."""

    value: str
    label: str


@dataclass(frozen=True, slots=True)
class Decision:
    """The Manager's decision for one round (already validated by `parse_decision`)."""

    next: Next
    summary: str = ""
    plan: str = ""
    contract: str = ""
    question: str = ""
    choices: tuple[Choice, ...] = ()
    allow_other: bool = False


@dataclass(frozen=True, slots=True)
class Verdict:
    """The Auditor's verdict on one execution (already validated by `parse_verdict`)."""

    complete: bool
    integrity: Integrity
    task_state: str = ""
    evidence: str = ""
    feedback: str = ""


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """The last valid audit: which execution, which contract version, its report message and its verdict."""

    execution: Ref
    contract_version: int
    message_id: str
    verdict: Verdict


@dataclass(frozen=True, slots=True)
class RoundRecord:
    """One finished round, as the status keeps it (the newest `MAX_ROUNDS_KEPT`)."""

    index: int
    decision: str
    """The decision's ``next`` (``cli``, ``ask``, ``blocked``, ``done``), or ``failed`` / ``human``."""
    summary: str
    messages: tuple[str, ...] = ()
    execution: Ref | None = None
    audit: Ref | None = None


@dataclass(frozen=True, slots=True)
class Followup:
    """A user input added to the conversation after the Run's question."""

    id: str
    text: str


@dataclass(frozen=True, slots=True)
class HumanOutcome:
    """How a question to the human ended: ``success`` (``value`` and/or ``text``), ``dismissed``, ``timeout`` or
    ``failure``. For a Confirm, ``value`` is ``accepted`` or ``declined``."""

    outcome: Literal["success", "dismissed", "timeout", "failure"]
    value: str = ""
    text: str = ""

    @property
    def accepted(self) -> bool:
        """A Confirm answered "Continue"."""
        return self.outcome == "success" and self.value == "accepted"


@dataclass(frozen=True, slots=True)
class RunState:
    """The Run's status as the machine sees it (snake_case of the wire fields)."""

    phase: Phase = "Receiving"
    round: int = 1
    budget: int = 25
    failures: int = 0
    contract: str = ""
    contract_version: int = 1
    task_state: str = ""
    guidance: str = ""
    decision: Decision | None = None
    execution: Ref | None = None
    audit: Ref | None = None
    last_audit: AuditRecord | None = None
    human_reason: HumanReason | None = None
    human_message_id: str | None = None
    manager_message_id: str | None = None
    final_message_id: str | None = None
    summary: str = ""
    input_message_ids: tuple[str, ...] = ()
    consumed_through: str | None = None
    """The newest follow-up id taken (later ones are read after it)."""
    finished_at: str | None = None
    rounds: tuple[RoundRecord, ...] = field(default_factory=tuple)

    @property
    def terminal(self) -> bool:
        """Succeeded, Stopped or Failed."""
        return self.phase in TERMINAL


# -- helpers ------------------------------------------------------------------------------------------------------


def _clip(text: str, limit: int = SUMMARY_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _record(state: RunState, record: RoundRecord) -> tuple[RoundRecord, ...]:
    kept = (*(r for r in state.rounds if r.index != record.index), record)
    return kept[-MAX_ROUNDS_KEPT:]


def _failed(state: RunState, reason: str, *, decision: str = "failed", messages: tuple[str, ...] = ()) -> RunState:
    """The round fails: recorded, ``failures`` + 1, next round at Receiving."""
    record = RoundRecord(
        index=state.round,
        decision=decision,
        summary=_clip(reason),
        messages=messages,
        execution=state.execution,
        audit=state.audit,
    )
    return replace(
        state,
        phase="Receiving",
        round=state.round + 1,
        failures=state.failures + 1,
        execution=None,
        audit=None,
        rounds=_record(state, record),
    )


def _finish(state: RunState, phase: Phase, summary: str, now: str) -> RunState:
    return replace(state, phase=phase, summary=_clip(summary), finished_at=now, human_reason=None)


# -- transitions --------------------------------------------------------------------------------------------------


def start(goal: str, max_rounds: int, input_message_id: str) -> RunState:
    """A new Run's first state: Receiving round 1, ``budget = max_rounds``, the goal as contract version 1."""
    return RunState(
        phase="Receiving",
        round=1,
        budget=max(1, min(max_rounds, HARD_MAX_ROUNDS)),
        contract=goal,
        contract_version=1,
        input_message_ids=(input_message_id,) if input_message_id else (),
    )


def expire(state: RunState, *, now: str, past_deadline: bool) -> RunState:
    """Failed (deadline exceeded) when ``past_deadline`` and the Run is not terminal yet; else unchanged."""
    if state.terminal or not past_deadline:
        return state
    return _finish(state, "Failed", f"Deadline exceeded in round {state.round} ({state.phase}).", now)


def receive(state: RunState, followups: Sequence[Followup], *, now: str) -> RunState:
    """At Receiving: take follow-ups (bounded; see the module docstring) into the guidance, then gate the round:
    ask the human after `FAILURE_LIMIT` failures or past the budget (stop at `HARD_MAX_ROUNDS`), else Planning.
    ``followups`` are those after ``consumed_through``, oldest first. Other phases are returned unchanged."""
    if state.phase != "Receiving":
        return state
    guidance = state.guidance
    taken: list[str] = []
    known = set(state.input_message_ids)
    room = min(PER_PULL, MAX_INPUTS - len(state.input_message_ids))
    for followup in followups:
        if len(taken) >= room:
            break
        if followup.id in known:
            continue
        text = followup.text.strip()
        piece = f"Follow-up from the user: {text}" if text else ""
        joined = f"{guidance}\n\n{piece}" if guidance and piece else (guidance or piece)
        if len(joined.encode("utf-8")) > GUIDANCE_BYTES:
            break  # this one and later ones wait (for the next Run)
        guidance = joined
        taken.append(followup.id)
        known.add(followup.id)
    if taken:
        state = replace(
            state,
            guidance=guidance,
            input_message_ids=state.input_message_ids + tuple(taken),
            consumed_through=taken[-1],
            last_audit=None,  # it did not see this guidance
        )
    if state.failures >= FAILURE_LIMIT:
        return replace(state, phase="WaitingForHuman", human_reason="failure", human_message_id=None)
    if state.round > state.budget:
        if state.budget >= HARD_MAX_ROUNDS:
            return _finish(state, "Stopped", f"Stopped after {state.budget} rounds: the most a Run may take.", now)
        return replace(state, phase="WaitingForHuman", human_reason="budget", human_message_id=None)
    return replace(state, phase="Planning", decision=None, execution=None, audit=None)


def completion_problem(state: RunState) -> str | None:
    """Why ``done`` cannot be accepted now (None: it can): the last audit must be of the current contract version,
    name an execution uid and its message, and say complete, clean and evidenced."""
    last = state.last_audit
    if last is None:
        return "no audit of the current contract and guidance exists"
    if last.contract_version != state.contract_version:
        return f"the last audit checked contract version {last.contract_version}, not {state.contract_version}"
    if not last.execution.uid or not last.execution.name:
        return "the last audit names no execution"
    if not last.message_id:
        return "the last audit has no report message"
    verdict = last.verdict
    if not verdict.complete:
        return "the last audit found the work incomplete"
    if verdict.integrity != "clean":
        return f"the last audit's integrity is {verdict.integrity}"
    if not verdict.evidence.strip():
        return "the last audit gave no evidence"
    return None


def decided(
    state: RunState, decision: Decision | str, *, now: str, message_id: str | None = None, execution: str = ""
) -> RunState:
    """At Planning: apply the Manager's ``decision`` (or a failure message). ``execution`` names the Execution a
    ``cli`` decision will create (``<run>-r<round>``); ``message_id`` is the Manager's report."""
    if state.phase != "Planning":
        return state
    messages = (message_id,) if message_id else ()
    if isinstance(decision, str):
        return _failed(replace(state, manager_message_id=message_id), decision, messages=messages)
    state = replace(state, decision=decision, manager_message_id=message_id)
    if decision.contract.strip() and decision.contract.strip() != state.contract.strip():
        state = replace(state, contract=decision.contract.strip(), contract_version=state.contract_version + 1)
    if decision.next == "cli":
        if not decision.plan.strip():
            return _failed(state, "The decision 'cli' has no plan.", decision="cli", messages=messages)
        return replace(state, phase="Executing", execution=Ref(execution, "") if execution else None, audit=None)
    if decision.next in ("ask", "blocked"):
        record = RoundRecord(
            index=state.round, decision=decision.next, summary=_clip(decision.summary), messages=messages
        )
        return replace(
            state, phase="WaitingForHuman", human_reason="ask", human_message_id=None, rounds=_record(state, record)
        )
    problem = completion_problem(state)
    if problem is not None:
        return _failed(state, f"Completion rejected: {problem}.", decision="done", messages=messages)
    record = RoundRecord(index=state.round, decision="done", summary=_clip(decision.summary), messages=messages)
    summary = decision.summary.strip() or (state.last_audit.verdict.task_state if state.last_audit else "")
    return replace(
        _finish(state, "Succeeded", summary or "Done.", now),
        task_state=state.last_audit.verdict.task_state if state.last_audit else state.task_state,
        rounds=_record(state, record),
    )


def executed(state: RunState, outcome: Ref | str, *, message_id: str | None = None) -> RunState:
    """At Executing: the Execution ended — ``outcome`` is the Execution (name, uid) that completed, or a failure
    message. Success goes on to Auditing."""
    if state.phase != "Executing":
        return state
    if isinstance(outcome, str):
        return _failed(state, f"Execution failed: {outcome}", decision="cli", messages=_ids(message_id))
    return replace(state, phase="Auditing", execution=outcome, audit=None)


def audited(
    state: RunState,
    outcome: Verdict | str,
    *,
    audit: Ref,
    execution: Ref,
    message_id: str | None,
    contract_version: int,
) -> RunState:
    """At Auditing: the Audit ``audit`` of ``execution`` at ``contract_version`` ended with ``outcome`` (a verdict,
    or a failure message). A verdict for another execution or contract version is stale: a failure. A valid verdict
    becomes the last audit, resets ``failures`` and ends the round."""
    if state.phase != "Auditing":
        return state
    messages = tuple(m for m in (state.manager_message_id, message_id) if m)
    state = replace(state, audit=audit)
    if isinstance(outcome, str):
        return _failed(state, f"Audit failed: {outcome}", decision="cli", messages=messages)
    current = state.execution
    if current is None or (current.name, current.uid) != (execution.name, execution.uid) or not execution.uid:
        return _failed(state, "Audit failed: it audited another execution (stale).", decision="cli", messages=messages)
    if contract_version != state.contract_version:
        return _failed(
            state,
            f"Audit failed: it checked contract version {contract_version}, not {state.contract_version} (stale).",
            decision="cli",
            messages=messages,
        )
    if not message_id:
        return _failed(state, "Audit failed: its report has no message.", decision="cli", messages=messages)
    verdict = outcome
    record = RoundRecord(
        index=state.round,
        decision="cli",
        summary=_clip(
            f"Audit: {'complete' if verdict.complete else 'incomplete'}, integrity {verdict.integrity}. "
            + (verdict.feedback or verdict.task_state)
        ),
        messages=messages,
        execution=execution,
        audit=audit,
    )
    return replace(
        state,
        phase="Receiving",
        round=state.round + 1,
        failures=0,
        task_state=verdict.task_state or state.task_state,
        last_audit=AuditRecord(execution, contract_version, message_id, verdict),
        execution=None,
        audit=None,
        rounds=_record(state, record),
    )


def answered(state: RunState, outcome: HumanOutcome, *, now: str, question: str = "") -> RunState:
    """At WaitingForHuman: the question ended with ``outcome``; see the module docstring for what each does.
    ``question`` is the question's text (for the guidance of an ask)."""
    if state.phase != "WaitingForHuman":
        return state
    reason = state.human_reason or "ask"
    cleared = replace(state, human_reason=None, human_message_id=None)
    if outcome.outcome != "success":
        why = {"dismissed": "was dismissed", "timeout": "timed out", "failure": "failed"}[outcome.outcome]
        return _finish(cleared, "Stopped", f"Stopped in round {state.round}: the question to you {why}.", now)
    if reason == "ask":
        answer = (outcome.text or outcome.value).strip()
        entry = f"Question: {question.strip() or '(the Manager asked)'}\nAnswer: {answer or '(empty)'}"
        guidance = f"{state.guidance}\n\n{entry}" if state.guidance else entry
        while len(guidance.encode("utf-8")) > GUIDANCE_BYTES and "\n\n" in guidance:
            guidance = guidance.split("\n\n", 1)[1]  # the oldest guidance gives way to the answer
        return replace(
            cleared,
            phase="Receiving",
            round=state.round + 1,
            guidance=guidance[-GUIDANCE_BYTES:],
            last_audit=None,  # audits before the answer did not know it
            decision=None,
        )
    if not outcome.accepted:
        what = "the round budget is spent" if reason == "budget" else f"{state.failures} failures in a row"
        return _finish(cleared, "Stopped", f"Stopped in round {state.round}: {what} and you chose to finish.", now)
    if reason == "budget":
        return replace(cleared, phase="Receiving", budget=min(state.budget + BUDGET_STEP, HARD_MAX_ROUNDS))
    return replace(cleared, phase="Receiving", failures=0)


def _ids(message_id: str | None) -> tuple[str, ...]:
    return (message_id,) if message_id else ()
