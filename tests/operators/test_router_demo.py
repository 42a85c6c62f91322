"""The demo model's rules for the Router's prompts, held against the real prompt builders."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loopd.operators.router import (
    Evidence,
    demo_rules,
    parse_plan,
    plan_prompt,
    replan_prompt,
    summarize_prompt,
    work_prompt,
)

LIU_BEI = "Introduce Liu Bei, Guan Yu, and Zhang Fei"
NAMES = ("Liu Bei", "Guan Yu", "Zhang Fei")


def answer(prompt: str) -> str:
    """What the demo model says: the first rule that applies (as the harness seam tries them)."""
    for rule in demo_rules():
        if (said := rule(prompt)) is not None:
            return said
    raise AssertionError("no demo rule recognised the prompt")


def test_the_liu_bei_question_plans_one_task_per_person() -> None:
    said = answer(plan_prompt(LIU_BEI, "(no earlier messages)", max_subtasks=4))

    plan = parse_plan(said, request=LIU_BEI, max_subtasks=4)
    assert plan.kind == "complex"
    assert plan.tasks == ("Introduce Liu Bei", "Introduce Guan Yu", "Introduce Zhang Fei")


@pytest.mark.parametrize(
    ("request_", "tasks"),
    [
        ("Who were Cao Cao and Sun Quan?", ("Who is Cao Cao?", "Who is Sun Quan?")),
        ("describe Paris, Rome & Berlin.", ("Describe Paris", "Describe Rome", "Describe Berlin")),
        ("Compare cats and dogs", ("Describe cats", "Describe dogs")),
    ],
)
def test_other_lists_split_too(request_: str, tasks: tuple[str, ...]) -> None:
    plan = parse_plan(
        answer(plan_prompt(request_, "(no earlier messages)", max_subtasks=4)), request=request_, max_subtasks=4
    )

    assert (plan.kind, plan.tasks) == ("complex", tasks)


@pytest.mark.parametrize(
    "request_",
    ["What is the capital of France?", "hello", "Introduce Liu Bei", "Introduce A, B, C, D, and E"],
)
def test_anything_else_is_a_simple_plan_for_the_request(request_: str) -> None:
    said = answer(plan_prompt(request_, "user/alice: Introduce X, Y and Z", max_subtasks=4))

    assert json.loads(said) == {"kind": "simple", "tasks": [request_]}


def test_a_replan_plans_the_followups() -> None:
    evidence = [Evidence("Introduce Liu Bei", "Liu Bei: …")]
    one = answer(replan_prompt(LIU_BEI, "(none)", max_subtasks=4, evidence=evidence, followups=["Also Cao Cao"]))
    two = answer(replan_prompt(LIU_BEI, "(none)", max_subtasks=4, evidence=evidence, followups=["Cao Cao", "Sun Quan"]))

    assert parse_plan(one, request=LIU_BEI, max_subtasks=4, replan=True).tasks == ("Also Cao Cao",)
    assert parse_plan(two, request=LIU_BEI, max_subtasks=4, replan=True).tasks == ("Cao Cao", "Sun Quan")


@pytest.mark.parametrize("name", NAMES)
def test_a_work_answer_names_its_subject_and_says_it_is_a_stand_in(name: str) -> None:
    said = answer(work_prompt(LIU_BEI, "(no earlier messages)", f"Introduce {name}"))

    assert said.startswith(f"{name}: ")
    assert "demo model" in said
    assert said.count(name) >= 2


def test_the_synthesis_names_everyone_in_the_evidence() -> None:
    evidence = [Evidence(f"Introduce {n}", answer(work_prompt(LIU_BEI, "h", f"Introduce {n}"))) for n in NAMES]

    said = answer(summarize_prompt(LIU_BEI, "(no earlier messages)", evidence))

    assert said.startswith("Here is what I have on Liu Bei, Guan Yu, and Zhang Fei:")
    for name in NAMES:
        assert f"- **{name}**: {name}: " in said
    assert "[1]" not in said


def test_the_synthesis_of_one_result_is_that_result() -> None:
    said = answer(summarize_prompt("What is 2+2?", "h", [Evidence("What is 2+2?", "Four.\nIndeed.")]))

    assert said == "Four. Indeed."


def test_the_rules_leave_other_requests_to_the_built_in_demo() -> None:
    for rule in demo_rules():
        assert rule("list files") is None
        assert rule("Introduce Liu Bei, Guan Yu, and Zhang Fei") is None


@given(request=st.text(min_size=1, max_size=80).filter(lambda s: s.strip() != ""), limit=st.integers(2, 6))
def test_the_demo_always_answers_a_plan_prompt_with_a_valid_plan(request: str, limit: int) -> None:
    said = answer(plan_prompt(request, "(no earlier messages)", max_subtasks=limit))

    parse_plan(said, request=request, max_subtasks=limit)  # raises PlanError if not
