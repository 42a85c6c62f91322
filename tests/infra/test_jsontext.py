"""`jsontext.loads` decodes what the standard library's ``json.loads`` decodes, to an equal value, and fails alike;
`jsontext.compact` writes what ``json.dumps`` with its options writes, byte for byte, and fails alike."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loopd._infra.jsontext import compact, compact_lenient, loads

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


_KEYS = st.text(max_size=5) | st.integers() | st.floats() | st.booleans() | st.none()  # what json.dumps keys take
_ANY = st.recursive(
    _SCALARS | st.tuples(_SCALARS) | st.complex_numbers(max_magnitude=1),  # complex: not JSON
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_KEYS, inner, max_size=4),
    max_leaves=30,
)


def _outcome(write: Any, value: Any) -> tuple[str, str]:
    try:
        return "text", write(value)
    except (TypeError, ValueError) as exc:
        return type(exc).__name__, str(exc)


@settings(max_examples=500)
@given(_ANY, st.booleans())
def test_compact_writes_what_json_dumps_writes_and_refuses_what_it_refuses(value: Any, sort_keys: bool) -> None:
    # Mixed key types cannot be sorted: json.dumps raises TypeError for them, and so does compact.
    expected = _outcome(
        lambda v: json.dumps(v, sort_keys=sort_keys, separators=(",", ":"), ensure_ascii=False, allow_nan=False),
        value,
    )
    assert _outcome(lambda v: compact(v, sort_keys=sort_keys), value) == expected


@settings(max_examples=300)
@given(_ANY)
def test_compact_lenient_writes_what_json_dumps_writes_by_default(value: Any) -> None:
    expected = _outcome(lambda v: json.dumps(v, separators=(",", ":"), ensure_ascii=False), value)
    assert _outcome(compact_lenient, value) == expected


def test_compact_keeps_the_standard_library_spelling_of_floats_and_refuses_what_json_cannot_hold() -> None:
    assert compact({"b": 1e-07, "a": [1.0, 1e22, -0.0]}, sort_keys=True) == '{"a":[1.0,1e+22,-0.0],"b":1e-07}'
    assert compact({"é": "\u2028\x00"}) == '{"é":"\u2028\\u0000"}'
    with pytest.raises(ValueError, match="not JSON compliant"):
        compact([math.inf])
    with pytest.raises(TypeError, match="not JSON serializable"):
        compact({"a": object()})
    looped: list[Any] = []
    looped.append(looped)
    with pytest.raises(ValueError, match="too deeply"):
        compact(looped)


def test_what_loopd_stores_digests_streams_and_sends_is_written_by_compact(monkeypatch: pytest.MonkeyPatch) -> None:
    # The writers share the reused encoders (not a json.dumps each, with its per-call set-up).
    from loopd._infra import jsontext
    from loopd.agentue._json import dumps as agentue_dumps
    from loopd.agentue._model import compact_json
    from loopd.harness.models._anthropic import _json as anthropic_body
    from loopd.harness.models._openai import _json as openai_body
    from loopd.server.ledger._artifacts import canonical_bytes as artifact_text
    from loopd.server.storage import canonical_json
    from loopd.server.storage._values import dumps as stored_text

    written: list[bool] = []  # sort_keys of each value written

    def counting(encoder: Callable[[Any], str], sort_keys: bool) -> Callable[[Any], str]:
        def encode(value: Any) -> str:
            written.append(sort_keys)
            return encoder(value)

        return encode

    monkeypatch.setattr(jsontext, "_COMPACT", counting(jsontext._COMPACT, False))
    monkeypatch.setattr(jsontext, "_SORTED", counting(jsontext._SORTED, True))
    value = {"b": 1.0, "a": ["x"]}
    assert stored_text(value) == '{"b":1.0,"a":["x"]}'
    assert canonical_json(value) == b'{"a":["x"],"b":1}'
    assert artifact_text(value) == b'{"a":["x"],"b":1.0}'
    assert agentue_dumps(value) == compact_json(value) == '{"b":1.0,"a":["x"]}'
    assert openai_body(value) == anthropic_body(value) == b'{"b":1.0,"a":["x"]}'
    assert written == [False, True, True, False, False, False, False]

    # Frames and resource bodies were written with json.dumps' defaults (NaN allowed): the lenient encoder.
    from loopd.resources._sql import _dumps as resource_text
    from loopd.server.http import sse_frame

    lenient: list[Any] = []
    encoder = jsontext._LENIENT

    def counted(value: Any) -> str:
        lenient.append(value)
        return encoder(value)

    monkeypatch.setattr(jsontext, "_LENIENT", counted)
    assert sse_frame({"a": math.nan}, id=3) == b'id: 3\ndata: {"a":NaN}\n\n'
    assert resource_text({"b": 1.0}) == '{"b":1.0}'
    assert len(lenient) == 2
