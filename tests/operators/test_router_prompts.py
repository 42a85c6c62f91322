"""The Router's prompts, its text extraction and its progress records (pure parts)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loopd.agentue import Model
from loopd.operators.router import (
    Evidence,
    ProgressMark,
    history_text,
    model_text,
    plan_prompt,
    progress_content,
    recover_rounds,
    replan_prompt,
    result_text,
    summarize_prompt,
    work_prompt,
)


@dataclass(frozen=True)
class Said:
    kind: str
    key: str
    text: str
    content: dict[str, Any] = field(default_factory=dict)


HISTORY = (Said("user", "alice", "Who founded Shu Han?"), Said("operator", "router", "Liu Bei did.\nIn 221."))
EVIDENCE = (Evidence("Introduce Liu Bei", "Liu Bei founded Shu Han."), Evidence("Introduce Guan Yu", "A general."))


def test_history_lines_are_kind_key_text_with_continuations_indented() -> None:
    text = history_text(HISTORY)

    assert text == "user/alice: Who founded Shu Han?\noperator/router: Liu Bei did.\n  In 221."


def test_an_empty_history_says_so_and_blank_messages_are_left_out() -> None:
    assert history_text([]) == "(no earlier messages)"
    assert history_text([Said("harness", "assistant", "  ")]) == "(no earlier messages)"
    assert history_text(HISTORY[:1], has_earlier=True).startswith("(earlier messages omitted)\nuser/alice:")


def test_the_plan_prompt_asks_for_a_classification_as_json_only() -> None:
    prompt = plan_prompt("Introduce Liu Bei", history_text(HISTORY), max_subtasks=3)

    assert '{"kind": "simple" | "complex", "tasks": ["...", ...]}' in prompt
    assert "2 to 3 tasks" in prompt
    assert "JSON object only" in prompt
    assert "Conversation so far:\nuser/alice: Who founded Shu Han?" in prompt
    assert "Request:\nIntroduce Liu Bei" in prompt


def test_the_replan_prompt_carries_the_work_done_and_the_followups() -> None:
    prompt = replan_prompt(
        "Introduce Liu Bei", "(no earlier messages)", max_subtasks=4, evidence=EVIDENCE, followups=["Also Cao Cao"]
    )

    assert "[1] Task: Introduce Liu Bei\nResult: Liu Bei founded Shu Han." in prompt
    assert "Follow-ups from the user:\n- Also Cao Cao" in prompt
    assert '{"kind": "summary", "tasks": []}' in prompt


def test_the_work_prompt_holds_history_request_and_the_one_task_last() -> None:
    prompt = work_prompt("Introduce three generals", history_text(HISTORY), "Introduce Guan Yu")

    history_at, request_at, task_at = (
        prompt.index("Conversation so far:\nuser/alice"),
        prompt.index("Original request:\nIntroduce three generals"),
        prompt.index("Task:\nIntroduce Guan Yu"),
    )
    assert history_at < request_at < task_at
    assert prompt.endswith("Task:\nIntroduce Guan Yu")
    assert "Follow-ups" not in prompt
    assert "Follow-ups from the user:\n- more on Zhang Fei" in work_prompt(
        "r", "h", "t", followups=["more on Zhang Fei"]
    )


def test_the_summarize_prompt_numbers_the_evidence_and_never_mentions_routing() -> None:
    prompt = summarize_prompt("Introduce Liu Bei and Guan Yu", "(no earlier messages)", EVIDENCE)

    assert prompt.endswith(
        "Evidence:\n[1] Task: Introduce Liu Bei\nResult: Liu Bei founded Shu Han.\n\n"
        "[2] Task: Introduce Guan Yu\nResult: A general."
    )
    for word in ("rout", "plan", "subtask", "split"):
        assert word not in prompt.lower()


@given(request=st.text(max_size=60), task=st.text(max_size=60), texts=st.lists(st.text(max_size=40), max_size=4))
def test_prompts_are_a_function_of_their_inputs(request: str, task: str, texts: list[str]) -> None:
    history = history_text([Said("user", "u", t) for t in texts])

    assert work_prompt(request, history, task) == work_prompt(request, history, task)
    assert "\nCurrent request:\n" not in history  # no line of the history can pass for loop-server's marker


# --- text extraction ---------------------------------------------------------------------------------------------


def test_a_model_text_prefers_the_answer_block() -> None:
    model = {"blocks": [{"id": "t", "type": "text", "content": "thinking"}, {"id": "answer", "content": "42"}]}

    assert model_text(model) == "42"


def test_without_an_answer_block_the_text_blocks_are_joined() -> None:
    model = Model(
        biz="x",
        blocks=[
            {"id": "a", "type": "text", "content": "one"},
            {"id": "tool", "type": "tool", "name": "ls"},
            {"id": "r", "type": "result", "format": "text", "content": "two"},
        ],
    ).to_json()

    assert model_text(model) == "one\n\ntwo"
    assert model_text(None) == ""


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ({"format": "text", "content": "hello"}, "hello"),
        ({"format": "json", "content": {"blocks": [{"id": "answer", "content": "hi"}]}}, "hi"),
        ({"format": "json", "content": [1, 2]}, ""),
        ("plain", "plain"),
        (None, ""),
    ],
)
def test_a_call_result_as_text(value: object, text: str) -> None:
    assert result_text(value) == text


# --- progress records --------------------------------------------------------------------------------------------


def test_a_progress_message_is_valid_agentue_carrying_its_round_and_followups() -> None:
    content = progress_content(2, ["m1", "m2"])

    Model.from_json(content)
    assert content["meta"] == {"phase": "progress", "round": 2, "followup_ids": ["m1", "m2"], "through_id": "m2"}
    block = content["blocks"][0]
    assert (block["id"], block["type"], block["through_id"]) == ("progress", "progress", "m2")
    assert "2 follow-ups" in block["content"]
    with pytest.raises(ValueError, match="at least one follow-up"):
        progress_content(1, [])


def test_rounds_are_recovered_from_the_routers_own_progress_messages_in_order() -> None:
    messages = [
        Said("operator", "router", "", progress_content(2, ["m3"])),
        Said("user", "alice", "also Cao Cao"),
        Said("operator", "other", "", progress_content(1, ["mX"])),
        Said("operator", "router", "", progress_content(1, ["m1", "m2"])),
        Said("operator", "router", "", {"meta": {"phase": "progress", "round": 4, "followup_ids": ["m9"]}}),
        Said("operator", "router", "", {"meta": {"phase": "progress", "round": 3, "followup_ids": []}}),
    ]

    assert recover_rounds(messages, kind="operator", key="router") == (
        ProgressMark(1, ("m1", "m2")),
        ProgressMark(2, ("m3",)),
    )
    assert recover_rounds([], kind="operator", key="router") == ()
