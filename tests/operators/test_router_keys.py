"""The Router's effect keys and how it reads a finished call (pure helpers of the reconciler)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loopd.operators.router import SUMMARIZE_KEY, TaskFailed, plan_key, work_key
from loopd.operators.router._router import _first_failure, _text_of
from loopd.runtime import CallState, Unavailable


def test_round_zero_keeps_the_reference_keys_and_later_rounds_are_numbered() -> None:
    assert [plan_key(0), work_key(0, 0), work_key(0, 2), SUMMARIZE_KEY] == ["plan", "work/0", "work/2", "summarize"]
    assert [plan_key(1), work_key(1, 0), work_key(3, 1)] == ["plan/1", "work/1/0", "work/3/1"]


@given(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 20)), max_size=30))
def test_no_two_steps_share_an_effect_key(steps: list[tuple[int, int]]) -> None:
    keys = {work_key(r, i) for r, i in set(steps)}
    assert len(keys) == len(set(steps))
    assert not keys & ({plan_key(r) for r in range(21)} | {SUMMARIZE_KEY})


def state(phase: str, result: object = None, error: dict[str, str] | None = None) -> CallState:
    return CallState(id="c", phase=phase, result=result, error=error, terminal=True, text="")


def test_a_succeeded_call_gives_its_text() -> None:
    assert _text_of("work/0", state("succeeded", {"format": "text", "content": "Liu Bei"})) == "Liu Bei"


@pytest.mark.parametrize(
    ("phase", "error", "message"),
    [
        ("failed", {"code": "model_error", "message": "provider said no"}, "work/1: the harness call failed: provider"),
        ("timed_out", None, "work/1: the harness call timed out: no reason given"),
        ("cancelled", {"code": "cancelled"}, "work/1: the harness call cancelled: cancelled"),
    ],
)
def test_a_call_that_did_not_succeed_fails_the_task(phase: str, error: dict[str, str] | None, message: str) -> None:
    with pytest.raises(TaskFailed, match=message):
        _text_of("work/1", state(phase, error=error))


def test_a_batch_fails_with_its_first_task_failure_before_other_errors() -> None:
    failed = TaskFailed("work/1: empty")
    group = BaseExceptionGroup("batch", [Unavailable("down"), ExceptionGroup("inner", [failed])])

    assert _first_failure(group) is failed
    other = Unavailable("down")
    assert _first_failure(BaseExceptionGroup("batch", [other])) is other
