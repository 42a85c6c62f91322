"""The AgentUE conformance cases (compforge/agentue protocol 1.1), every one of them, from tests/data/agentue."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from loopd.agentue import AgentUERejectedError, AgentUEValidationError, Model, fold, reduce, validate_model

from .helpers import initial_state, load_fixture

TRANSITIONS = load_fixture("state-transitions.json")
REFERENCES = load_fixture("block-references.json")


def _cases(cases: list[dict[str, Any]]) -> list[Any]:
    return [pytest.param(case, id=case["name"]) for case in cases]


def test_the_fixture_files_hold_every_named_case() -> None:
    # Guards against a truncated copy: the counts the specification lists.
    assert len(TRANSITIONS["cases"]) == 4
    assert len(REFERENCES["invalid_models"]) == 14
    assert len(REFERENCES["rejected_updates"]) == 23


@pytest.mark.parametrize("case", _cases(TRANSITIONS["cases"]))
def test_state_transitions_reach_the_exact_expected_state(case: dict[str, Any]) -> None:
    events = copy.deepcopy(case["events"])
    state = fold(events, initial_state(case["initial"]))
    assert state.model is not None
    assert state.model.to_json() == case["expected"]
    assert events == case["events"], "the reducer must not mutate its input events"


@pytest.mark.parametrize("case", _cases(TRANSITIONS["cases"]))
def test_state_transitions_are_the_same_event_by_event(case: dict[str, Any]) -> None:
    state = initial_state(case["initial"])
    for event in case["events"]:
        state = reduce(state, event)
    assert state.model is not None and state.model.to_json() == case["expected"]


@pytest.mark.parametrize("case", _cases(REFERENCES["invalid_models"]))
def test_invalid_models_fail_validation(case: dict[str, Any]) -> None:
    with pytest.raises(AgentUEValidationError) as info:
        Model.from_json(case["model"])
    assert isinstance(info.value, ValueError)
    assert info.value.path.startswith("model"), info.value.path
    with pytest.raises(AgentUEValidationError):
        validate_model(case["model"], typed_blocks=True)


@pytest.mark.parametrize("case", _cases(REFERENCES["rejected_updates"]))
def test_rejected_updates_leave_the_initial_state_unchanged(case: dict[str, Any]) -> None:
    state = initial_state(case["initial"])
    event = copy.deepcopy(case["event"])
    with pytest.raises(AgentUERejectedError) as info:
        reduce(state, event)
    assert isinstance(info.value, ValueError)
    assert state.model is not None
    assert state.model.to_json() == case["initial"]
    assert state == initial_state(case["initial"])
    assert event == case["event"]


@pytest.mark.parametrize("case", _cases(REFERENCES["rejected_updates"]))
def test_the_initial_models_of_rejected_updates_are_themselves_valid(case: dict[str, Any]) -> None:
    assert Model.from_json(case["initial"]).to_json() == case["initial"]
