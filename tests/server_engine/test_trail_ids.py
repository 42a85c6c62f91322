"""`trail_id` is ``uuid.uuid5`` over the call id and parts, computed without `uuid.UUID`: the same text always."""

from __future__ import annotations

import uuid

from hypothesis import given
from hypothesis import strategies as st

from loopd.server.engine._trail import _NAMESPACE, trail_id


@given(st.text(min_size=1), st.lists(st.text(), max_size=4))
def test_a_trail_id_is_the_uuid5_of_its_path(call_id: str, parts: list[str]) -> None:
    expected = uuid.uuid5(_NAMESPACE, "/".join((call_id, *parts)))
    assert trail_id(call_id, *parts) == str(expected)
    assert uuid.UUID(trail_id(call_id, *parts)).version == 5
