"""Ledger errors, placed in the storage error tree so the API layer maps them like any other conflict.

::

    storage.Conflict
    ├── LaneConflict          the lane's last seq is not ``expected_last_seq``: reload the head, decide again
    ├── IdempotencyViolation  an append (or checkpoint) id was reused for different content: a caller bug
    └── RevisionConflict      a checkpoint save expected another revision

Bad input raises ``storage.InvalidRecord``; unknown ids raise ``storage.NotFound``.
"""

from __future__ import annotations

from loopd.server.storage import Conflict


class LaneConflict(Conflict):
    def __init__(self, lane_id: str, expected: int, actual: int) -> None:
        super().__init__(f"lane {lane_id} is at seq {actual}, not {expected}: reload it and decide again")
        self.lane_id = lane_id
        self.expected = expected
        self.actual = actual


class IdempotencyViolation(Conflict):
    """The same idempotency id was sent with different content; retrying will not help."""


class RevisionConflict(Conflict):
    def __init__(self, key: str, expected: int, actual: int) -> None:
        super().__init__(f"checkpoint {key!r} is at revision {actual}, not {expected}")
        self.key = key
        self.expected = expected
        self.actual = actual
