"""The Manager's decision and the Auditor's verdict parsers: valid answers, bounds, and junk that never crashes."""

from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loopd.operators.longhorizon._auditor import auditor_prompt, parse_verdict
from loopd.operators.longhorizon._errors import ParseError
from loopd.operators.longhorizon._executor import executor_prompt
from loopd.operators.longhorizon._manager import manager_prompt, parse_decision
from loopd.operators.longhorizon._phases import Choice, Decision, start


def test_a_cli_decision_in_a_fence_with_prose_around_it() -> None:
    said = 'Here it is:\n{"next": "cli", "plan": "write a.txt", "summary": "s", "reasoning": "ignored"}\nThanks.'

    assert parse_decision(said) == Decision("cli", summary="s", plan="write a.txt")
    assert parse_decision('```json\n{"next": "done"}\n```') == Decision("done")


def test_an_ask_with_choices() -> None:
    said = json.dumps(
        {"next": "ask", "question": "Which?", "choices": ["a", {"value": "b", "label": "B"}], "allow_other": True}
    )

    assert parse_decision(said) == Decision(
        "ask", question="Which?", choices=(Choice("a", "a"), Choice("b", "B")), allow_other=True
    )


@pytest.mark.parametrize(
    ("said", "message"),
    [
        ("no json here", "not JSON"),
        ("[1, 2]", "no object found"),
        ('{"next": "maybe"}', "'next' must be one of"),
        ('{"next": "cli"}', "needs a plan"),
        ('{"next": "ask"}', "needs a question"),
        ('{"next": "cli", "plan": 5}', "'plan' must be a string"),
        (json.dumps({"next": "cli", "plan": "x" * 16_001}), "at most 16000"),
        (json.dumps({"next": "ask", "question": "q" * 4_001}), "at most 4000"),
        (json.dumps({"next": "ask", "question": "q", "choices": [str(i) for i in range(21)]}), "at most 20"),
        (json.dumps({"next": "ask", "question": "q", "choices": ["a", "a"]}), "offered twice"),
        ('{"next": "done", "allow_other": "yes"}', "true or false"),
    ],
)
def test_invalid_decisions_are_parse_errors(said: str, message: str) -> None:
    with pytest.raises(ParseError, match=message):
        parse_decision(said)


def test_verdicts_need_clean_integrity_and_evidence_to_be_complete() -> None:
    good = parse_verdict('{"complete": true, "integrity": "clean", "evidence": ["a", "b"], "task_state": "t"}')
    assert good.complete and good.evidence == "a\nb" and good.task_state == "t"
    assert not parse_verdict('{"complete": false, "integrity": "unknown"}').complete

    with pytest.raises(ParseError, match="integrity 'clean'"):
        parse_verdict('{"complete": true, "integrity": "violated", "evidence": "x"}')
    with pytest.raises(ParseError, match="needs evidence"):
        parse_verdict('{"complete": true, "integrity": "clean"}')
    with pytest.raises(ParseError, match="'integrity' must be one of"):
        parse_verdict('{"complete": false, "integrity": "fine"}')
    with pytest.raises(ParseError, match="'complete' must be true or false"):
        parse_verdict('{"complete": "yes", "integrity": "clean"}')
    with pytest.raises(ParseError, match="at most 20"):
        parse_verdict(json.dumps({"complete": False, "integrity": "clean", "evidence": ["e"] * 21}))


@settings(max_examples=100, deadline=None)
@given(
    st.one_of(
        st.text(max_size=200),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.text(max_size=10),
            lambda inner: (
                st.lists(inner, max_size=3)
                | st.dictionaries(
                    st.sampled_from(["next", "plan", "question", "choices", "complete", "integrity", "evidence", "x"]),
                    inner,
                    max_size=5,
                )
            ),
            max_leaves=10,
        ).map(json.dumps),
    )
)
def test_any_answer_is_a_decision_or_a_parse_error_never_a_crash(said: str) -> None:
    for parse in (parse_decision, parse_verdict):
        with contextlib.suppress(ParseError):
            parse(said)


def test_prompts_are_functions_of_the_stored_state() -> None:
    state = start("Create hello.txt containing hello world", 25, "in")

    assert manager_prompt(state, goal="g") == manager_prompt(state, goal="g")
    assert "Last audit: none valid" in manager_prompt(state, goal="g")
    assert "Plan:\nwrite it" in executor_prompt(state, plan="write it")
    assert "Executor's report:\ndid it" in auditor_prompt(state, plan="p", report="did it")
