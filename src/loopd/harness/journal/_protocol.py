"""The Journal seam: an append-only, per-session, gap-free record of enduring events.

Contract (shared by every implementation and checked by tests/harness_journal/test_contract.py):
  * per-session ``seq`` starts at 1 and increases by exactly 1 per stored record, with no gaps;
  * one writer per session: opening a writer fences any earlier writer (its appends fail with
    `JournalFencedError`);
  * an append either stores every record it was given or none of them;
  * ``read`` returns records in seq order; ``follow`` keeps yielding new records as they are committed;
  * a fork (``fork_session``) shares its parent's records up to ``parent_seq`` without copying them: reading it
    yields those (under the fork's own session id) and then its own records, which number from ``parent_seq + 1``;
  * state snapshots (``save_snapshot`` / ``load_snapshot``) are a cache beside the records, never part of them: a
    session keeps its newest snapshot only; ``load_snapshot`` returns the newest one of the schema asked for, at or
    before ``upto``, and for a fork also its ancestors' ones taken at or before the fork point (records past it
    are not the fork's). The journal stores the bytes as given; what they mean is `loopd.harness.core.snapshot`'s.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class NewRecord:
    kind: str
    version: int
    data: bytes
    at: float


@dataclass(frozen=True, slots=True)
class Record:
    session_id: str
    seq: int
    kind: str
    version: int
    data: bytes
    at: float


@dataclass(frozen=True, slots=True)
class SessionInfo:
    session_id: str
    created_at: float
    last_seq: int
    meta: str
    parent_id: str | None = None
    """For a fork: the session whose records up to ``parent_seq`` it shares (None for any other session)."""
    parent_seq: int = 0


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A saved state of a session: the fold of its records ``1..seq``, stored as ``data`` in the form ``schema``
    names (`loopd.harness.core.snapshot`); ``at`` is when it was saved."""

    seq: int
    schema: str
    data: bytes
    at: float


class JournalWriter(Protocol):
    """The single writer of one session."""

    @property
    def session_id(self) -> str: ...

    @property
    def last_seq(self) -> int: ...

    @property
    def defers_sync(self) -> bool:
        """Whether ``append(sync=False)`` may return before its records are on stable storage (then `sync` puts
        them there). False: every append is as durable as the journal ever makes it when it returns."""
        ...

    async def append(self, records: Sequence[NewRecord], *, sync: bool = True) -> list[int]:
        """Store ``records`` atomically; returns their seqs. Raises `JournalError` (fail-closed). ``sync=False``: the
        caller does not need them on stable storage yet (a journal that `defers_sync` may then skip the disk
        flush, and a process crash still keeps them; a later synced append or `sync` makes them survive power
        loss too)."""
        ...

    async def sync(self) -> None:
        """Return once every record this writer appended is on stable storage (at once unless `defers_sync`)."""
        ...

    async def aclose(self) -> None: ...


class SyncedOnReturn:
    """The sync side of a `JournalWriter` whose every append is as durable as its journal makes it when it returns
    (memory, PostgreSQL): nothing is ever deferred, so there is nothing to sync."""

    __slots__ = ()

    @property
    def defers_sync(self) -> bool:
        return False

    async def sync(self) -> None:
        return None


class Journal(Protocol):
    async def create_session(self, session_id: str, *, meta: str = "", at: float) -> JournalWriter:
        """Create a new session and return its writer (`SessionBusyError` if the id exists)."""
        ...

    async def fork_session(
        self, parent_id: str, at_seq: int, session_id: str, *, meta: str = "", at: float
    ) -> JournalWriter:
        """Create ``session_id`` as a fork of ``parent_id`` at ``at_seq`` and return its writer (first seq
        ``at_seq + 1``). `SessionNotFoundError` for an unknown parent, `SessionBusyError` if the id exists,
        `ForkPointError` when ``at_seq`` is below 1 or past the parent's last record."""
        ...

    async def open_writer(self, session_id: str) -> JournalWriter:
        """Take over writing an existing session, fencing any previous writer (`SessionNotFoundError`)."""
        ...

    async def read(self, session_id: str, from_seq: int = 1, limit: int | None = None) -> list[Record]: ...

    def follow(self, session_id: str, from_seq: int = 1, *, poll_interval: float = 0.5) -> AsyncIterator[Record]:
        """Yield records from ``from_seq`` on, waiting for new ones; never ends on its own."""
        ...

    async def session(self, session_id: str) -> SessionInfo | None: ...

    async def save_snapshot(self, session_id: str, seq: int, schema: str, data: bytes, *, at: float) -> None:
        """Keep ``data`` as the state of ``session_id`` after its record ``seq``, in place of its previous snapshot
        unless that one is of the same ``schema`` and newer (a late save never replaces a newer one).
        `SessionNotFoundError` for an unknown session; `SnapshotSeqError` when ``seq`` is below 1 or past the
        session's last record (a snapshot of records that are not stored)."""
        ...

    async def load_snapshot(self, session_id: str, schema: str, *, upto: int | None = None) -> Snapshot | None:
        """The newest snapshot of ``schema`` at or before seq ``upto`` (default: any) that holds this session's
        records: its own, or, for a fork, an ancestor's taken at or before the fork point. None when there is none.
        `SessionNotFoundError` for an unknown session."""
        ...

    async def sessions(self, *, limit: int = 100) -> list[SessionInfo]: ...

    async def aclose(self) -> None: ...
