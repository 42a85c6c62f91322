"""Identifier helpers shared by every layer: time-ordered UUIDv7 strings."""

from __future__ import annotations

import os
import time
import uuid


def uuid7_int() -> int:
    """The 128 bits of a new `uuid7`, as an integer."""
    now = time.time_ns()
    ms, sub_ns = divmod(now, 1_000_000)
    rand = int.from_bytes(os.urandom(8), "big")
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76  # version
    value |= ((sub_ns * 4096) // 1_000_000) << 64
    value |= 0b10 << 62  # variant
    value |= rand & ((1 << 62) - 1)
    return value


def uuid7() -> uuid.UUID:
    """A UUIDv7 (RFC 9562): 48-bit millisecond timestamp, 12 bits of sub-millisecond time, then random bits.

    The sub-millisecond field (RFC 9562 §6.2, method 3) keeps ids made in the same millisecond in creation order
    (to ~250 ns) without any process-wide counter.
    """
    return uuid.UUID(int=uuid7_int())


def new_id() -> str:
    """A new time-ordered identifier as a canonical UUID string (``str(uuid7())``, formatted without building a
    `uuid.UUID`: servers make dozens per request)."""
    return uuid_text(uuid7_int())


def uuid_text(value: int) -> str:
    """The canonical string of the UUID whose 128 bits are ``value`` (``str(uuid.UUID(int=value))``)."""
    text = f"{value:032x}"
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


def is_uuid7_text(text: str) -> bool:
    """Whether ``text`` has the canonical form of a UUIDv7 (as `new_id` makes): its first 48 bits are a time."""
    return len(text) == 36 and text[8] == text[13] == text[18] == text[23] == "-" and text[14] == "7"
