"""The labels a Task carries for its target, and the selector that picks every Task not addressed to a kind."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from loopd.resources import LabelSelector
from loopd.resources.client import (
    TASK_TARGET_KEY_LABEL,
    TASK_TARGET_KIND_LABEL,
    task_target_labels,
    tasks_not_for,
)

# Kubernetes' label value rule (apimachinery IsValidLabelValue): at most 63 characters, alphanumeric at both ends.
_K8S_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")


def test_a_tasks_target_becomes_two_labels() -> None:
    assert task_target_labels("operator", "router") == {
        TASK_TARGET_KIND_LABEL: "operator",
        TASK_TARGET_KEY_LABEL: "router",
    }
    assert task_target_labels("harness", "a" * 63)[TASK_TARGET_KEY_LABEL] == "a" * 63


def test_a_key_that_is_no_label_value_is_left_out() -> None:
    for key in ("a" * 64, "my key", "team/agent", "-edge", "edge.", "é"):
        assert task_target_labels("harness", key) == {TASK_TARGET_KIND_LABEL: "harness"}, key


@given(st.text(max_size=80), st.text(max_size=80))
def test_every_label_written_is_a_valid_kubernetes_label_value(kind: str, key: str) -> None:
    for value in task_target_labels(kind, key).values():
        assert len(value) <= 63 and _K8S_VALUE.fullmatch(value), value


def test_the_selector_keeps_other_kinds_and_unlabelled_tasks() -> None:
    selector = LabelSelector.parse(tasks_not_for("harness"))
    assert selector.matches(task_target_labels("operator", "router"))
    assert selector.matches({})  # a Task from before the labels, or written by hand
    assert not selector.matches(task_target_labels("harness", "assistant"))
