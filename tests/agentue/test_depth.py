"""Deeply nested JSON is refused with a typed error before anything walks it recursively (never a RecursionError)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from loopd.agentue import (
    MAX_DEPTH,
    AgentUEError,
    AgentUERejectedError,
    AgentUETooDeepError,
    InlineBlock,
    Model,
    RejectCode,
    StreamState,
    decode_event,
    fold,
    reduce,
    validate_model,
)


def _nested(levels: int) -> Any:
    """A value with `levels` objects/arrays around a string (alternating, so both kinds are walked)."""
    value: Any = "leaf"
    for level in range(levels):
        value = {"a": value} if level % 2 else [value]
    return value


def _model(extra: Any) -> dict[str, Any]:
    return {"version": "1.1", "biz": "app", "meta": {}, "blocks": [{"id": "b", "type": "text", "x": extra}]}


_STARTED = fold([{"op": "start", "seq": 1, "model": _model("ok")}])

_ENTRY_POINTS: dict[str, Callable[[Any], object]] = {
    "validate_model": lambda v: validate_model(_model(v)),
    "Model.from_json meta": lambda v: Model.from_json({**_model("ok"), "meta": {"deep": v}}),
    "InlineBlock": lambda v: InlineBlock({"id": "b", "type": "text", "x": v}),
    "reduce start": lambda v: reduce(StreamState(), {"op": "start", "seq": 1, "model": _model(v)}),
    "reduce set": lambda v: reduce(_STARTED, {"op": "set", "seq": 2, "block": {"id": "b", "type": "text", "x": v}}),
    "reduce meta": lambda v: reduce(_STARTED, {"op": "set", "seq": 2, "mask": "meta.x", "meta": {"x": v}}),
    "decode_event text": lambda v: decode_event(_event_text(v)),
}


def _event_text(value: Any) -> str:
    """A start event as JSON text, written without recursion (json.dumps cannot encode the deepest values)."""
    levels = 0
    while isinstance(value, dict | list):
        value = value["a"] if isinstance(value, dict) else value[0]
        levels += 1
    deep = "[" * levels + json.dumps(value) + "]" * levels
    return json.dumps({"op": "start", "seq": 1, "model": _model("DEEP")}).replace('"DEEP"', deep)


@pytest.mark.parametrize("entry", sorted(_ENTRY_POINTS))
@pytest.mark.parametrize("levels", [MAX_DEPTH + 1, 500, 990, 5000])
def test_too_deep_values_raise_the_typed_error(entry: str, levels: int) -> None:
    with pytest.raises(AgentUEError) as caught:
        _ENTRY_POINTS[entry](_nested(levels))
    error = caught.value
    if isinstance(error, AgentUERejectedError):  # the reducer wraps an invalid event, naming why
        assert error.code is RejectCode.INVALID_EVENT
        error = error.__cause__  # type: ignore[assignment]
    assert isinstance(error, AgentUETooDeepError)
    assert error.limit == MAX_DEPTH
    assert f"more than {MAX_DEPTH} levels deep" in str(error)


@pytest.mark.parametrize("entry", sorted(_ENTRY_POINTS))
def test_values_up_to_the_limit_are_accepted(entry: str) -> None:
    _ENTRY_POINTS[entry](_nested(MAX_DEPTH - 1))  # inside a block, meta or event, all within the cap
