"""The Run's status on the wire and back: every field the machine keeps survives a write and a read (a restarted
operator must find exactly the state it wrote), and the conditions follow the phase."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from loopd.operators.longhorizon._phases import (
    AuditRecord,
    Choice,
    Decision,
    Ref,
    RoundRecord,
    RunState,
    Verdict,
)
from loopd.operators.longhorizon._resources import RunStatus
from loopd.operators.longhorizon._status import from_status, to_status

NOW = "2026-12-01T20:00:00Z"
ids = st.text("abcdef0123456789-", min_size=1, max_size=12)
texts = st.text(max_size=20)
refs = st.builds(Ref, name=ids, uid=ids)
verdicts = st.builds(
    Verdict,
    complete=st.booleans(),
    integrity=st.sampled_from(["clean", "violated", "unknown"]),
    task_state=texts,
    evidence=texts,
    feedback=texts,
)
decisions = st.builds(
    Decision,
    next=st.sampled_from(["cli", "ask", "blocked", "done"]),
    summary=texts,
    plan=texts,
    contract=texts,
    question=texts,
    choices=st.lists(st.builds(Choice, value=ids, label=ids), max_size=3, unique_by=lambda c: c.value).map(tuple),
    allow_other=st.booleans(),
)
rounds = st.builds(
    RoundRecord,
    index=st.integers(1, 1000),
    decision=st.sampled_from(["cli", "ask", "done", "failed"]),
    summary=texts,
    messages=st.lists(ids, max_size=3).map(tuple),
    execution=st.none() | refs,
    audit=st.none() | refs,
)
states = st.builds(
    RunState,
    phase=st.sampled_from(
        ["Receiving", "Planning", "Executing", "Auditing", "WaitingForHuman", "Succeeded", "Stopped", "Failed"]
    ),
    round=st.integers(1, 1001),
    budget=st.integers(1, 1000),
    failures=st.integers(0, 3),
    contract=texts,
    contract_version=st.integers(1, 50),
    task_state=texts,
    guidance=texts,
    decision=st.none() | decisions,
    execution=st.none() | refs,
    audit=st.none() | refs,
    last_audit=st.none()
    | st.builds(AuditRecord, execution=refs, contract_version=st.integers(1, 50), message_id=ids, verdict=verdicts),
    human_reason=st.none() | st.sampled_from(["ask", "budget", "failure"]),
    human_message_id=st.none() | ids,
    manager_message_id=st.none() | ids,
    final_message_id=st.none() | ids,
    summary=texts,
    input_message_ids=st.lists(ids, max_size=5).map(tuple),
    consumed_through=st.none() | ids,
    finished_at=st.none() | st.just(NOW),
    rounds=st.lists(rounds, max_size=4).map(tuple),
)


@settings(max_examples=150, deadline=None)
@given(states)
def test_a_state_survives_the_wire(state: RunState) -> None:
    wire = to_status(state, previous=None, now=NOW).model_dump(mode="json", by_alias=True, exclude_none=True)

    assert from_status(RunStatus.model_validate(wire)) == state


def test_conditions_follow_the_phase_and_keep_their_transition_time() -> None:
    waiting = to_status(RunState(phase="WaitingForHuman", human_reason="budget"), previous=None, now=NOW)
    later = to_status(
        RunState(phase="WaitingForHuman", human_reason="budget"), previous=waiting, now="2027-01-01T00:00:00Z"
    )
    done = to_status(RunState(phase="Succeeded", summary="ok"), previous=later, now="2027-01-02T00:00:00Z")

    assert {c.type: (c.status, c.reason) for c in waiting.conditions or ()} == {
        "Succeeded": ("False", "InProgress"),
        "WaitingForHuman": ("True", "budget"),
    }
    assert [c.last_transition_time for c in later.conditions or ()] == [NOW, NOW]
    assert {c.type: (c.status, c.last_transition_time) for c in done.conditions or ()} == {
        "Succeeded": ("True", "2027-01-02T00:00:00Z"),
        "WaitingForHuman": ("False", "2027-01-02T00:00:00Z"),
    }
    assert from_status(None) is None and from_status(RunStatus()) is None
