"""The Run's phase machine (pure): examples of each rule, and properties over random runs of facts."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from loopd.operators.longhorizon._phases import (
    BUDGET_STEP,
    FAILURE_LIMIT,
    GUIDANCE_BYTES,
    MAX_INPUTS,
    MAX_ROUNDS_KEPT,
    PER_PULL,
    AuditRecord,
    Decision,
    Followup,
    HumanOutcome,
    Ref,
    RunState,
    Verdict,
    answered,
    audited,
    completion_problem,
    decided,
    executed,
    expire,
    receive,
    start,
)

NOW = "2026-12-01T20:00:00Z"
CLEAN = Verdict(complete=True, integrity="clean", task_state="done", evidence="read hello.txt: hello world")
INCOMPLETE = Verdict(complete=False, integrity="clean", task_state="missing", feedback="write the file")


def planning(state: RunState) -> RunState:
    state = receive(state, [], now=NOW)
    assert state.phase == "Planning"
    return state


def one_round(state: RunState, verdict: Verdict, *, contract: str = "") -> RunState:
    """Planning → cli → Executing → Auditing → Receiving with ``verdict``."""
    state = decided(
        planning(state),
        Decision("cli", plan="do it", contract=contract),
        now=NOW,
        message_id="m1",
        execution=f"run-r{state.round}",
    )
    assert state.phase == "Executing"
    execution = Ref(f"run-r{state.round}", f"uid-{state.round}")
    state = executed(state, execution, message_id="m2")
    assert state.phase == "Auditing"
    return audited(
        state,
        verdict,
        audit=Ref(execution.name, "a" + execution.uid),
        execution=execution,
        message_id="m3",
        contract_version=state.contract_version,
    )


def test_a_new_run_starts_at_receiving_round_one_with_the_goal_as_contract() -> None:
    state = start("make hello.txt", 25, "in-1")

    assert (state.phase, state.round, state.budget, state.contract, state.contract_version) == (
        "Receiving",
        1,
        25,
        "make hello.txt",
        1,
    )
    assert state.input_message_ids == ("in-1",)


def test_done_after_a_clean_complete_audit_succeeds() -> None:
    state = one_round(start("goal", 25, "in"), CLEAN)
    assert state.phase == "Receiving" and state.round == 2 and state.failures == 0

    done = decided(planning(state), Decision("done", summary="all good"), now=NOW, message_id="m4")

    assert done.phase == "Succeeded"
    assert done.summary == "all good" and done.finished_at == NOW


def test_done_without_an_audit_is_rejected_and_counts_as_a_failure() -> None:
    state = decided(planning(start("goal", 25, "in")), Decision("done"), now=NOW)

    assert state.phase == "Receiving" and state.failures == 1 and state.round == 2
    assert state.rounds[-1].summary.startswith("Completion rejected: no audit")


def test_an_incomplete_audit_sends_the_manager_back_and_done_is_rejected() -> None:
    state = one_round(start("goal", 25, "in"), INCOMPLETE)
    assert state.last_audit is not None and not state.last_audit.verdict.complete

    rejected = decided(planning(state), Decision("done"), now=NOW)

    assert rejected.phase == "Receiving"
    assert rejected.rounds[-1].summary == "Completion rejected: the last audit found the work incomplete."


def test_a_changed_contract_bumps_the_version_and_makes_the_clean_audit_stale() -> None:
    state = one_round(start("goal", 25, "in"), CLEAN)

    rejected = decided(planning(state), Decision("done", contract="a bigger goal"), now=NOW)

    assert rejected.contract_version == 2 and rejected.contract == "a bigger goal"
    assert rejected.phase == "Receiving"
    assert "contract version 1, not 2" in rejected.rounds[-1].summary


def test_an_audit_of_another_execution_or_contract_version_is_a_failure() -> None:
    state = decided(planning(start("goal", 25, "in")), Decision("cli", plan="p"), now=NOW, execution="run-r1")
    state = executed(state, Ref("run-r1", "u1"))

    other = audited(
        state, CLEAN, audit=Ref("a", "b"), execution=Ref("run-r0", "u0"), message_id="m", contract_version=1
    )
    old_version = audited(
        state, CLEAN, audit=Ref("a", "b"), execution=Ref("run-r1", "u1"), message_id="m", contract_version=0
    )

    for failed in (other, old_version):
        assert failed.phase == "Receiving" and failed.failures == 1 and failed.last_audit is None
        assert "stale" in failed.rounds[-1].summary


def test_three_failures_in_a_row_ask_the_human_and_continue_resets_them() -> None:
    state = start("goal", 25, "in")
    for _ in range(FAILURE_LIMIT):
        state = decided(planning(state), "the manager's call failed", now=NOW)
    asked = receive(state, [], now=NOW)
    assert asked.phase == "WaitingForHuman" and asked.human_reason == "failure"

    going_on = answered(asked, HumanOutcome("success", "accepted"), now=NOW)
    assert going_on.phase == "Receiving" and going_on.failures == 0 and going_on.round == asked.round

    finished = answered(asked, HumanOutcome("success", "declined"), now=NOW)
    assert finished.phase == "Stopped" and "3 failures in a row" in finished.summary


def test_past_the_budget_asks_and_continue_adds_25_rounds() -> None:
    state = start("goal", 1, "in")
    state = one_round(state, INCOMPLETE)
    asked = receive(state, [], now=NOW)
    assert asked.phase == "WaitingForHuman" and asked.human_reason == "budget"

    more = answered(asked, HumanOutcome("success", "accepted"), now=NOW)
    assert more.budget == 1 + BUDGET_STEP and more.phase == "Receiving"
    assert receive(more, [], now=NOW).phase == "Planning"


def test_past_a_budget_of_1000_the_run_stops() -> None:
    state = replace(start("goal", 1000, "in"), round=1001)

    stopped = receive(state, [], now=NOW)

    assert stopped.phase == "Stopped" and "1000 rounds" in stopped.summary


def test_a_budget_never_grows_past_1000() -> None:
    state = replace(start("goal", 990, "in"), round=991, phase="WaitingForHuman", human_reason="budget")

    assert answered(state, HumanOutcome("success", "accepted"), now=NOW).budget == 1000


def test_human_fallbacks_stop_the_run_with_a_summary() -> None:
    asked = replace(start("goal", 25, "in"), phase="WaitingForHuman", human_reason="ask")

    for outcome, words in (("dismissed", "was dismissed"), ("timeout", "timed out"), ("failure", "failed")):
        stopped = answered(asked, HumanOutcome(outcome), now=NOW)  # type: ignore[arg-type]
        assert stopped.phase == "Stopped" and words in stopped.summary and stopped.finished_at == NOW


def test_an_answer_becomes_guidance_and_invalidates_the_last_audit() -> None:
    state = one_round(start("goal", 25, "in"), CLEAN)
    asked = decided(planning(state), Decision("ask", question="Which colour?"), now=NOW)
    assert asked.phase == "WaitingForHuman" and asked.human_reason == "ask"

    after = answered(asked, HumanOutcome("success", text="blue"), now=NOW, question="Which colour?")

    assert after.guidance == "Question: Which colour?\nAnswer: blue"
    assert after.last_audit is None and after.phase == "Receiving" and after.round == asked.round + 1
    assert decided(planning(after), Decision("done"), now=NOW).phase == "Receiving"  # rejected: no fresh audit


def test_followups_are_taken_only_at_receiving_with_bounds() -> None:
    state = start("goal", 25, "in")
    many = [Followup(f"f{i:03d}", f"also {i}") for i in range(40)]

    taken = receive(state, many, now=NOW)

    assert len(taken.input_message_ids) == 1 + PER_PULL and taken.consumed_through == "f031"
    assert "Follow-up from the user: also 31" in taken.guidance and "also 32" not in taken.guidance
    assert receive(replace(taken, phase="Executing"), many[32:], now=NOW).input_message_ids == taken.input_message_ids


def test_followups_never_exceed_100_per_run_or_the_guidance_bound() -> None:
    state = replace(start("goal", 25, "in"), input_message_ids=tuple(f"x{i}" for i in range(MAX_INPUTS - 1)))
    assert len(receive(state, [Followup("y1", "a"), Followup("y2", "b")], now=NOW).input_message_ids) == MAX_INPUTS

    big = [Followup(f"z{i}", "w" * 6000) for i in range(5)]
    taken = receive(start("goal", 25, "in"), big, now=NOW)
    assert len(taken.guidance.encode()) <= GUIDANCE_BYTES and taken.consumed_through == "z1"


def test_the_deadline_fails_the_run_from_any_live_phase() -> None:
    for phase in ("Receiving", "Planning", "Executing", "Auditing", "WaitingForHuman"):
        state = replace(start("goal", 25, "in"), phase=phase)
        failed = expire(state, now=NOW, past_deadline=True)
        assert failed.phase == "Failed" and "Deadline exceeded" in failed.summary
    done = replace(start("goal", 25, "in"), phase="Succeeded")
    assert expire(done, now=NOW, past_deadline=True) is done


# -- properties ----------------------------------------------------------------------------------------------------

verdicts = st.builds(
    Verdict,
    complete=st.booleans(),
    integrity=st.sampled_from(["clean", "violated", "unknown"]),
    task_state=st.text(max_size=5),
    evidence=st.sampled_from(["", "saw it"]),
    feedback=st.text(max_size=5),
)
decisions = st.one_of(
    st.builds(
        Decision, next=st.just("cli"), plan=st.sampled_from(["", "p"]), contract=st.sampled_from(["", "c1", "c2"])
    ),
    st.builds(Decision, next=st.sampled_from(["ask", "blocked"]), question=st.just("q?")),
    st.builds(Decision, next=st.just("done"), contract=st.sampled_from(["", "c1", "c2"])),
    st.just("the call failed"),
)
outcomes = st.builds(
    HumanOutcome,
    outcome=st.sampled_from(["success", "success", "success", "dismissed", "timeout", "failure"]),
    value=st.sampled_from(["accepted", "declined", "x"]),
    text=st.text(max_size=3),
)


def step(state: RunState, data: st.DataObject, counter: list[int]) -> RunState:
    """One random fact for the state's phase (sometimes a stale one)."""
    counter[0] += 1
    if data.draw(st.integers(0, 40)) == 0:
        return expire(state, now=NOW, past_deadline=True)
    if state.phase == "Receiving":
        n = data.draw(st.integers(0, 3))
        return receive(state, [Followup(f"f{counter[0]:06d}{i}", "more") for i in range(n)], now=NOW)
    if state.phase == "Planning":
        return decided(state, data.draw(decisions), now=NOW, message_id="m", execution=f"r-r{state.round}")
    if state.phase == "Executing":
        if data.draw(st.booleans()):
            return executed(state, "failed")
        return executed(state, Ref(f"r-r{state.round}", f"u{counter[0]}"))
    if state.phase == "Auditing":
        assert state.execution is not None
        stale = data.draw(st.integers(0, 4))
        execution = state.execution if stale != 1 else Ref("old", "old-uid")
        version = state.contract_version - (1 if stale == 2 else 0)
        outcome: Verdict | str = data.draw(verdicts) if stale != 3 else "invalid JSON"
        return audited(
            state, outcome, audit=Ref("a", "b"), execution=execution, message_id="m", contract_version=version
        )
    if state.phase == "WaitingForHuman":
        return answered(state, data.draw(outcomes), now=NOW, question="q?")
    return state


@settings(max_examples=100, deadline=None)
@given(data=st.data(), max_rounds=st.integers(1, 6))
def test_random_runs_keep_every_invariant(data: st.DataObject, max_rounds: int) -> None:
    state = start("goal", max_rounds, "in")
    counter = [0]
    for _ in range(80):
        before = state
        state = step(state, data, counter)
        assert state.round >= 1 and 1 <= state.budget <= 1000
        assert state.contract_version >= before.contract_version
        assert len(state.rounds) <= MAX_ROUNDS_KEPT
        assert len(state.input_message_ids) <= MAX_INPUTS
        assert len(state.guidance.encode()) <= GUIDANCE_BYTES
        if state.phase == "Planning":
            assert state.failures < FAILURE_LIMIT and state.round <= state.budget
        if before.terminal:
            assert state is before  # terminal phases are absorbing
        if state.phase == "Succeeded" and not before.terminal:
            # Never from a stale or unclean audit: the last audit is of this very contract version, complete, clean.
            assert before.phase == "Planning"
            assert completion_problem(state) is None
            last = state.last_audit
            assert isinstance(last, AuditRecord) and last.contract_version == state.contract_version
            assert last.verdict.complete and last.verdict.integrity == "clean" and last.execution.uid
        if state.terminal:
            assert state.finished_at == NOW and state.summary
        if state.phase == "Stopped" and state is not before:
            assert before.phase in ("WaitingForHuman", "Receiving")
        if state.terminal:
            assert step(state, data, counter) is state  # terminal phases are absorbing
            break
