"""`trail_id`: for a call id that is a UUIDv7, a UUIDv8 that starts with the call's millisecond (a trail's rows sort
by their call's time); otherwise, and for trails opened before that, ``uuid.uuid5`` over the call id and parts —
computed without `uuid.UUID`, the same text always."""

from __future__ import annotations

import uuid

from hypothesis import given
from hypothesis import strategies as st

from loopd._infra.ids import uuid7
from loopd.server.engine._trail import _NAMESPACE, trail_id

PARTS = st.lists(st.text(), max_size=4)


@given(st.text(min_size=1), PARTS)
def test_a_trail_id_of_a_call_id_that_is_no_uuid7_is_the_uuid5_of_its_path(call_id: str, parts: list[str]) -> None:
    expected = str(uuid.uuid5(_NAMESPACE, "/".join((call_id, *parts))))
    if not (len(call_id) == 36 and call_id[14] == "7"):
        assert trail_id(call_id, *parts) == expected
    assert trail_id(call_id, *parts, ordered=False) == expected
    assert uuid.UUID(trail_id(call_id, *parts, ordered=False)).version == 5


@given(st.integers(min_value=0, max_value=2**48 - 1), PARTS, PARTS)
def test_a_trail_id_of_a_uuid7_call_sorts_by_the_calls_time(millis: int, parts: list[str], others: list[str]) -> None:
    call = str(uuid.UUID(int=(uuid7().int & ~(((1 << 48) - 1) << 80)) | (millis << 80)))
    made = trail_id(call, *parts)
    parsed = uuid.UUID(made)
    assert (parsed.version, parsed.variant) == (8, uuid.RFC_4122)
    assert str(parsed) == made
    assert parsed.int >> 80 == millis  # the call's millisecond first: later calls' rows sort after
    assert trail_id(call, *parts) == made  # stable
    if "/".join(others) != "/".join(parts):
        assert trail_id(call, *others) != made
    legacy = uuid.uuid5(_NAMESPACE, "/".join((call, *parts)))
    assert trail_id(call, *parts, ordered=False) == str(legacy)
