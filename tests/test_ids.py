"""Ids are UUIDv7 strings that sort in creation order within a process."""

from __future__ import annotations

import uuid

from loopd._infra.ids import new_id, uuid7, uuid_text


def test_ids_are_uuid7_and_sort_in_creation_order() -> None:
    ids = [new_id() for _ in range(20_000)]
    assert all(uuid.UUID(i).version == 7 for i in ids[:100])
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)


def test_a_new_id_is_the_canonical_text_of_a_uuid7() -> None:
    for text in (new_id() for _ in range(1_000)):
        parsed = uuid.UUID(text)
        assert str(parsed) == text  # lowercase, dashed, 36 characters
        assert parsed.version == 7 and parsed.variant == uuid.RFC_4122


def test_uuid7_and_new_id_agree_on_the_layout() -> None:
    before = uuid7()
    text = new_id()
    after = uuid7()
    assert str(before) < text < str(after)
    assert before.int >> 80 <= uuid.UUID(text).int >> 80 <= after.int >> 80  # the millisecond field


def test_uuid_text_is_the_canonical_text_of_any_uuid() -> None:
    for value in (0, 1, (1 << 128) - 1, uuid7().int, uuid.uuid4().int):
        assert uuid_text(value) == str(uuid.UUID(int=value))
