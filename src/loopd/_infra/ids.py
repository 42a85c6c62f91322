"""Identifier helpers shared by every layer: time-ordered UUIDv7 strings."""

from __future__ import annotations

import os
import time
import uuid


def uuid7() -> uuid.UUID:
    """A UUIDv7 (RFC 9562): 48-bit millisecond timestamp, 12 bits of sub-millisecond time, then random bits.

    The sub-millisecond field (RFC 9562 §6.2, method 3) keeps ids made in the same millisecond in creation order
    (to ~250 ns) without any process-wide counter.
    """
    now = time.time_ns()
    ms, sub_ns = divmod(now, 1_000_000)
    rand = int.from_bytes(os.urandom(8), "big")
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76  # version
    value |= ((sub_ns * 4096) // 1_000_000) << 64
    value |= 0b10 << 62  # variant
    value |= rand & ((1 << 62) - 1)
    return uuid.UUID(int=value)


def new_id() -> str:
    """A new time-ordered identifier as a canonical UUID string."""
    return str(uuid7())
