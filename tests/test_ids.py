"""Ids are UUIDv7 strings that sort in creation order within a process."""

from __future__ import annotations

import uuid

from loopd._infra.ids import new_id


def test_ids_are_uuid7_and_sort_in_creation_order() -> None:
    ids = [new_id() for _ in range(20_000)]
    assert all(uuid.UUID(i).version == 7 for i in ids[:100])
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
