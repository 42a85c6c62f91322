"""The Router's plan parsing: fences, unknown fields, trimming, simple/complex/summary rules, readable errors."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loopd.operators.router import Plan, PlanError, TaskFailed, parse_plan, strip_fences

QUERY = "Introduce Liu Bei, Guan Yu, and Zhang Fei"


def parse(answer: str, *, max_subtasks: int = 4, replan: bool = False) -> Plan:
    return parse_plan(answer, request=QUERY, max_subtasks=max_subtasks, replan=replan)


def test_a_complex_plan_keeps_its_tasks_trimmed() -> None:
    plan = parse('{"kind": "complex", "tasks": ["  Introduce Liu Bei ", "Introduce Guan Yu\\n"]}')

    assert plan == Plan("complex", ("Introduce Liu Bei", "Introduce Guan Yu"))


@pytest.mark.parametrize(
    "answer",
    [
        '```json\n{"kind": "simple", "tasks": ["x"]}\n```',
        '```\n{"kind": "simple", "tasks": ["x"]}\n```',
        '  \n```JSON  \n{"kind": "simple", "tasks": ["x"]}```\n',
    ],
)
def test_a_code_fence_around_the_plan_is_stripped(answer: str) -> None:
    assert parse(answer) == Plan("simple", ("x",))


@pytest.mark.parametrize("tasks", ["[]", None])
def test_a_simple_plan_without_tasks_is_the_request(tasks: str | None) -> None:
    body = '{"kind": "simple"' + (f', "tasks": {tasks}' if tasks else "") + "}"

    assert parse(body) == Plan("simple", (QUERY,))


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        ("Sure! Here is the plan: simple.", "it is not JSON (Expecting value at line 1 column 1)"),
        ('["a", "b"]', "it must be a JSON object, not a list"),
        ('{"kind": "simple", "tasks": ["a"], "why": "x"}', "unknown field 'why' (a plan has only kind and tasks)"),
        ('{"kind": "simple", "tasks": [], "a": 1, "b": 2}', "unknown fields 'a', 'b'"),
        ('{"tasks": ["a"]}', 'kind must be "simple" or "complex", not missing'),
        ('{"kind": "hard", "tasks": ["a"]}', 'kind must be "simple" or "complex", not "hard"'),
        ('{"kind": "summary", "tasks": []}', 'kind "summary" is valid only when replanning after follow-ups'),
        ('{"kind": "simple", "tasks": "a"}', "tasks must be a list of strings, not a string"),
        ('{"kind": "complex", "tasks": ["a", 3]}', "task 2 must be a string, not a number"),
        ('{"kind": "complex", "tasks": ["a", "   "]}', "task 2 is empty"),
        ('{"kind": "simple", "tasks": ["a", "b"]}', "a simple plan has exactly one task, not 2"),
        ('{"kind": "complex", "tasks": ["a"]}', "a complex plan needs at least 2 tasks, not 1"),
        ('{"kind": "complex", "tasks": ["1","2","3","4","5","6","7","8","9"]}', "the plan has 9 tasks; at most 4"),
    ],
)
def test_an_invalid_plan_says_why_in_one_line(answer: str, reason: str) -> None:
    with pytest.raises(PlanError) as caught:
        parse(answer)

    message = str(caught.value)
    assert message.startswith("invalid plan: ")
    assert reason in message
    assert "\n" not in message
    assert caught.value.answer == answer
    assert isinstance(caught.value, TaskFailed)


def test_the_error_quotes_a_short_excerpt_of_the_answer() -> None:
    with pytest.raises(PlanError, match=r"the planner answered: 'x{120}…'"):
        parse("x" * 5000)


def test_a_summary_plan_is_valid_only_on_replan_and_has_no_tasks() -> None:
    assert parse('{"kind": "summary", "tasks": []}', replan=True) == Plan("summary", ())
    assert parse('{"kind": "summary"}', replan=True) == Plan("summary", ())
    with pytest.raises(PlanError, match="a summary plan has no tasks, not 1"):
        parse('{"kind": "summary", "tasks": ["a"]}', replan=True)


def test_a_simple_plan_may_not_stand_for_an_empty_request() -> None:
    with pytest.raises(PlanError, match="needs a non-empty request"):
        parse_plan('{"kind": "simple", "tasks": []}', request="  ", max_subtasks=4)


# --- properties --------------------------------------------------------------------------------------------------

task_text = st.text(min_size=1, max_size=40).filter(lambda s: s.strip() != "")
padding = st.sampled_from(["", " ", "\n", "\t ", "  \n"])


@given(
    tasks=st.lists(st.tuples(padding, task_text, padding), min_size=2, max_size=6),
    max_subtasks=st.integers(min_value=2, max_value=6),
    fenced=st.booleans(),
)
def test_a_complex_plan_within_the_limit_parses_to_its_trimmed_tasks(
    tasks: list[tuple[str, str, str]], max_subtasks: int, fenced: bool
) -> None:
    body = json.dumps({"kind": "complex", "tasks": [a + t + b for a, t, b in tasks]})
    answer = f"```json\n{body}\n```" if fenced else body
    expected = tuple(t.strip() for _, t, _ in tasks)

    if len(tasks) <= max_subtasks:
        assert parse(answer, max_subtasks=max_subtasks) == Plan("complex", expected)
    else:
        with pytest.raises(PlanError, match=f"the plan has {len(tasks)} tasks; at most {max_subtasks}"):
            parse(answer, max_subtasks=max_subtasks)


@given(
    extra=st.dictionaries(st.text(min_size=1).filter(lambda k: k not in ("kind", "tasks")), st.integers(), min_size=1)
)
def test_any_unknown_field_is_rejected(extra: dict[str, int]) -> None:
    with pytest.raises(PlanError, match="unknown field"):
        parse(json.dumps({"kind": "simple", "tasks": ["a"], **extra}))


@given(answer=st.text(max_size=300), replan=st.booleans())
def test_any_answer_parses_to_a_valid_plan_or_raises_plan_error(answer: str, replan: bool) -> None:
    try:
        plan = parse(answer, replan=replan)
    except PlanError as exc:
        message = str(exc)
        plan = None
    if plan is None:
        assert message.startswith("invalid plan: ")
        return
    assert all(t and t == t.strip() for t in plan.tasks)
    assert {"simple": 1, "complex": len(plan.tasks), "summary": 0}[plan.kind] == len(plan.tasks)
    assert plan.kind != "complex" or 2 <= len(plan.tasks) <= 4


@given(body=st.text(max_size=80), language=st.sampled_from(["", "json", "JSON"]))
def test_stripping_a_fence_gives_back_the_trimmed_body(body: str, language: str) -> None:
    if "```" in body:
        return
    assert strip_fences(f"```{language}\n{body}\n```") == body.strip()
