"""`CallSlots`: the engine's capacity, shared by admission (reservations) and the driver (held calls)."""

from __future__ import annotations

import pytest

from loopd.server.engine import CapacityExceeded
from loopd.server.engine._driver import CallSlots


def test_a_reservation_takes_a_slot_until_released_and_a_full_engine_refuses() -> None:
    slots = CallSlots(2)
    first = slots.reserve()
    slots.hold("call-1")
    assert (slots.used, slots.free, slots.full) == (2, 0, True)
    with pytest.raises(CapacityExceeded):
        slots.reserve()
    slots.release(first)
    assert first not in slots and "call-1" in slots and slots.free == 1


def test_holding_the_same_call_twice_takes_one_slot_and_release_is_idempotent() -> None:
    slots = CallSlots(1)
    slots.hold("call-1")
    slots.hold("call-1")
    assert slots.used == 1
    slots.release("call-1")
    slots.release("call-1")
    assert (slots.used, slots.free) == (0, 1)


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError, match="capacity"):
        CallSlots(0)
