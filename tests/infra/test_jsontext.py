"""`jsontext.loads` decodes what the standard library's ``json.loads`` decodes, to an equal value, and fails alike."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loopd._infra.jsontext import loads

_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()  # unbounded: beyond 64 bits too
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text()  # every code point, lone surrogates included
)
_JSON = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=30,
)


def _same(a: Any, b: Any) -> bool:
    """Equal, with NaN equal to itself (what the standard library reads ``NaN`` as)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


@settings(max_examples=500)
@given(_JSON, st.booleans(), st.booleans())
def test_any_json_text_decodes_to_what_the_standard_library_reads(value: Any, ascii_only: bool, as_bytes: bool) -> None:
    text = json.dumps(value, ensure_ascii=ascii_only, separators=(",", ":"))
    document: str | bytes = text.encode("utf-8", "surrogatepass") if as_bytes and ascii_only else text
    assert _same(loads(document), json.loads(document))


@pytest.mark.parametrize(
    "text",
    ["", "{", '{"a":1,}', "[1 2]", "nul", '"\\x"', "1e", '{"a":1}x'],
)
def test_what_is_not_json_fails_as_it_does_in_the_standard_library(text: str) -> None:
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)
    with pytest.raises(json.JSONDecodeError):
        loads(text)


def test_big_integers_stay_exact_and_what_only_the_standard_library_reads_is_read_as_before() -> None:
    assert loads("123456789012345678901234567890") == 123456789012345678901234567890  # not a float
    assert loads("-9223372036854775809") == -9223372036854775809
    assert math.isinf(loads("Infinity")) and math.isnan(loads("NaN")) and math.isinf(loads("1e400"))
    assert loads('"\\ud800"') == "\ud800"
    nested = "[" * 500 + "]" * 500
    assert loads(nested) == json.loads(nested)
    too_deep = "[" * 100_000 + "]" * 100_000
    with pytest.raises(RecursionError):
        json.loads(too_deep)
    with pytest.raises(RecursionError):
        loads(too_deep)
