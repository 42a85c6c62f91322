"""The ledger store contract: ``LedgerStore``, implemented on SQL (``_sql``; SQLite and PostgreSQL).

Rules every implementation keeps (the shared checks live in ``_rules``):

- Ids are globally unique. Creating an entity again with the same id and identical fields returns the stored
  one; any difference is a ``Conflict`` (ownership and attributes are immutable). An actor key names one actor.
- ``append(lane_id, expected_last_seq, append_id, events)`` is one atomic batch. The same ``append_id`` with the
  same canonical content returns the original receipt (even when the lane moved on); with different content,
  or on another lane, it raises ``IdempotencyViolation``. Otherwise a lane not at ``expected_last_seq`` raises
  ``LaneConflict``; else the events get seqs ``last_seq + 1 …`` and the lane head moves, all at once.
- Each event's name starts with its subject kind, and its subject belongs to the lane (turn, action, attempt),
  is the lane's run or session, or a lane of the same session. Actors must exist, causation must point to an
  earlier event of the same session, and an attempt's terminal event needs its ``attempt.requested`` first and
  comes at most once. Callers never choose seqs or commit times.
- An empty lane has ``last_seq`` 0; the first event gets seq 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Protocol

from ._artifacts import ArtifactBlob
from ._records import (
    Action,
    Actor,
    AppendReceipt,
    Attempt,
    Checkpoint,
    CostRow,
    Event,
    Lane,
    LedgerStructure,
    LedgerView,
    NewEvent,
    Scope,
    Turn,
    UnresolvedAttempt,
    UsageTotals,
)


class LedgerStore(Protocol):
    async def create_actor(self, actor: Actor) -> Actor: ...

    async def get_actor(self, actor_id: str) -> Actor: ...

    async def get_actor_by_key(self, key: str) -> Actor | None: ...

    async def ensure_actor(self, actor: Actor) -> Actor:
        """The actor stored under ``actor.key`` (created now if new); different attributes → ``Conflict``."""
        ...

    async def create_lane(self, lane: Lane) -> Lane: ...

    async def get_lane(self, lane_id: str) -> Lane: ...

    async def find_lane(self, session_id: str, run_id: str, name: str) -> Lane | None: ...

    async def find_lanes(self, scope: Scope) -> list[Lane]: ...

    async def create_turn(self, turn: Turn) -> Turn: ...

    async def create_action(self, action: Action) -> Action: ...

    async def create_attempt(self, attempt: Attempt) -> Attempt: ...

    async def get_attempt(self, attempt_id: str) -> Attempt: ...

    async def append(
        self, lane_id: str, expected_last_seq: int, append_id: str, events: Sequence[NewEvent]
    ) -> AppendReceipt: ...

    async def load_lane(self, lane_id: str, after_seq: int = 0) -> list[Event]: ...

    async def load_run(self, session_id: str, run_id: str) -> LedgerView: ...

    async def load_session(self, session_id: str) -> LedgerView: ...

    async def structure(self, scope: Scope) -> LedgerStructure:
        """The turns, actions and attempts of the scope's lanes (what ties an attempt to its action)."""
        ...

    async def unresolved_attempts(self, scope: Scope) -> list[UnresolvedAttempt]: ...

    async def usage(self, scope: Scope) -> UsageTotals: ...

    async def save_checkpoint(self, expected_revision: int, checkpoint: Checkpoint) -> Checkpoint:
        """Store the next revision of ``checkpoint.key``: the first save expects 0 and gets 1.

        The same id with the same content returns the stored checkpoint; different content →
        ``IdempotencyViolation``; another current revision → ``RevisionConflict``.
        """
        ...

    async def get_checkpoint(self, checkpoint_id: str) -> Checkpoint: ...

    async def put_artifacts(self, lane_id: str, blobs: Sequence[ArtifactBlob]) -> None:
        """Store content-addressed artifacts (identical content once) and note that ``lane_id`` uses them."""
        ...

    async def get_artifact(self, sha256: str) -> ArtifactBlob:
        """The stored artifact; ``NotFound`` if never stored or removed by retention."""
        ...

    async def prune_artifacts(self, before: datetime) -> int:
        """Retention: delete the artifacts only lanes idle since before ``before`` use; how many went."""
        ...

    async def cost_rows(self, since: datetime) -> list[CostRow]:
        """What the attempts that ended since ``since`` spent, per lane and action name."""
        ...

    async def load_latest_checkpoint(self, key: str) -> Checkpoint | None: ...
