"""Identifier helpers shared by every layer: time-ordered UUIDv7 strings."""

from __future__ import annotations

import os
import time
import uuid


def uuid7() -> uuid.UUID:
    """A UUIDv7 (RFC 9562): 48-bit millisecond timestamp, then random bits; sorts by creation time."""
    ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76  # version
    value |= ((rand >> 68) & 0xFFF) << 64
    value |= 0b10 << 62  # variant
    value |= rand & ((1 << 62) - 1)
    return uuid.UUID(int=value)


def new_id() -> str:
    """A new time-ordered identifier as a canonical UUID string."""
    return str(uuid7())
