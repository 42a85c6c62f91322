"""`json_copy` equals ``copy.deepcopy`` on JSON values and shares nothing mutable with its source."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from loopd._infra.jsoncopy import json_copy

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=30,
)


def _containers(value: Any) -> list[int]:
    if isinstance(value, dict):
        return [id(value), *(i for item in value.values() for i in _containers(item))]
    if isinstance(value, list | tuple):
        return [id(value), *(i for item in value for i in _containers(item))]
    return []


@given(_JSON)
def test_a_copy_equals_its_source_and_shares_no_container(value: Any) -> None:
    copied = json_copy(value)
    assert copied == value == copy.deepcopy(value)
    assert not set(_containers(copied)) & set(_containers(value))


def test_other_values_are_deep_copied_too() -> None:
    inner = [1, 2]
    source = {"tuple": (inner, "x"), "set": {1, 2}}
    copied = json_copy(source)
    assert copied == source
    copied["tuple"][0].append(3)  # the list inside the tuple is a copy as well
    assert inner == [1, 2]
