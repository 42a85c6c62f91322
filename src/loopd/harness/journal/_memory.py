"""In-memory journal: the same contract as SQLite, for tests and throwaway sessions, with fault injection."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field, replace

from loopd._infra.clock import Clock, SystemClock, wait_event
from loopd.harness._errors import (
    ForkPointError,
    JournalError,
    JournalFencedError,
    SessionBusyError,
    SessionNotFoundError,
    SnapshotSeqError,
)
from loopd.harness.journal._protocol import JournalWriter, NewRecord, Record, SessionInfo, Snapshot, SyncedOnReturn


@dataclass(slots=True)
class _Session:
    session_id: str
    created_at: float
    meta: str
    epoch: int = 1
    records: list[Record] = field(default_factory=list)
    signal: asyncio.Event = field(default_factory=asyncio.Event)
    parent: _Session | None = None
    parent_seq: int = 0
    snapshot: Snapshot | None = None

    @property
    def last_seq(self) -> int:
        return self.parent_seq + len(self.records)

    def stored(self, upto: int | None = None) -> list[Record]:
        """Its records in seq order (a fork's start with its parent's, shared), up to seq ``upto``."""
        own = self.records if upto is None else self.records[: max(0, upto - self.parent_seq)]
        if self.parent is None:
            return list(own)
        limit = self.parent_seq if upto is None else min(upto, self.parent_seq)
        return self.parent.stored(limit) + list(own)

    def info(self) -> SessionInfo:
        parent_id = None if self.parent is None else self.parent.session_id
        return SessionInfo(self.session_id, self.created_at, self.last_seq, self.meta, parent_id, self.parent_seq)


class MemoryJournal:
    """A `Journal` kept in memory. ``fail_append`` (if set) is called before each append and may raise.

    ``clock`` measures the followers' poll interval (a test's ``VirtualClock`` drives it).
    """

    def __init__(
        self,
        *,
        fail_append: Callable[[str, Sequence[NewRecord]], None] | None = None,
        clock: Clock | None = None,
    ) -> None:
        self._sessions: dict[str, _Session] = {}
        self.fail_append = fail_append
        self._clock: Clock = clock or SystemClock()

    async def create_session(self, session_id: str, *, meta: str = "", at: float) -> JournalWriter:
        if session_id in self._sessions:
            raise SessionBusyError(session_id)
        s = self._sessions[session_id] = _Session(session_id, at, meta)
        return _MemoryWriter(self._append, s, 1)

    async def fork_session(
        self, parent_id: str, at_seq: int, session_id: str, *, meta: str = "", at: float
    ) -> JournalWriter:
        parent = self._sessions.get(parent_id)
        if parent is None:
            raise SessionNotFoundError(parent_id)
        if not 1 <= at_seq <= parent.last_seq:
            raise ForkPointError(f"session {parent_id!r} has seqs 1..{parent.last_seq}; cannot fork at {at_seq}")
        if session_id in self._sessions:
            raise SessionBusyError(session_id)
        s = self._sessions[session_id] = _Session(session_id, at, meta, parent=parent, parent_seq=at_seq)
        return _MemoryWriter(self._append, s, 1)

    async def open_writer(self, session_id: str) -> JournalWriter:
        s = self._sessions.get(session_id)
        if s is None:
            raise SessionNotFoundError(session_id)
        s.epoch += 1
        return _MemoryWriter(self._append, s, s.epoch)

    def _append(self, session_id: str, epoch: int, records: Sequence[NewRecord]) -> list[int]:
        s = self._sessions[session_id]
        if s.epoch != epoch:
            raise JournalFencedError(f"session writer (epoch {epoch}) was fenced")
        if self.fail_append is not None:
            try:
                self.fail_append(session_id, records)
            except JournalError:
                raise
            except Exception as exc:
                raise JournalError(f"append failed: {exc}") from exc
        first = s.last_seq + 1
        seqs = list(range(first, first + len(records)))
        s.records.extend(
            Record(session_id, seq, r.kind, r.version, r.data, r.at) for seq, r in zip(seqs, records, strict=True)
        )
        s.signal.set()
        return seqs

    async def read(self, session_id: str, from_seq: int = 1, limit: int | None = None) -> list[Record]:
        s = self._sessions.get(session_id)
        if s is None:
            raise SessionNotFoundError(session_id)
        start = max(from_seq, 1) - 1
        end = None if limit is None else start + limit
        if s.parent is None:
            return s.records[start:end]
        return [replace(r, session_id=session_id) for r in s.stored()[start:end]]

    async def follow(self, session_id: str, from_seq: int = 1, *, poll_interval: float = 0.5) -> AsyncIterator[Record]:
        s = self._sessions.get(session_id)
        if s is None:
            raise SessionNotFoundError(session_id)
        next_seq = from_seq
        while True:
            s.signal.clear()
            page = await self.read(session_id, next_seq)
            for record in page:
                yield record
                next_seq = record.seq + 1
            if not page:
                await wait_event(self._clock, s.signal, poll_interval)

    async def session(self, session_id: str) -> SessionInfo | None:
        s = self._sessions.get(session_id)
        if s is None:
            return None
        return s.info()

    async def sessions(self, *, limit: int = 100) -> list[SessionInfo]:
        infos = [s.info() for s in self._sessions.values()]
        return sorted(infos, key=lambda i: i.created_at, reverse=True)[:limit]

    async def save_snapshot(self, session_id: str, seq: int, schema: str, data: bytes, *, at: float) -> None:
        s = self._sessions.get(session_id)
        if s is None:
            raise SessionNotFoundError(session_id)
        if not 1 <= seq <= s.last_seq:
            raise SnapshotSeqError(f"session {session_id!r} has seqs 1..{s.last_seq}; no snapshot at {seq}")
        kept = s.snapshot
        if kept is None or kept.schema != schema or kept.seq <= seq:
            s.snapshot = Snapshot(seq, schema, bytes(data), at)

    async def load_snapshot(self, session_id: str, schema: str, *, upto: int | None = None) -> Snapshot | None:
        s: _Session | None = self._sessions.get(session_id)
        if s is None:
            raise SessionNotFoundError(session_id)
        limit = upto if upto is not None else s.last_seq
        best: Snapshot | None = None
        while s is not None:  # the session, then each ancestor up to the (narrowing) fork point
            kept = s.snapshot
            if (
                kept is not None
                and kept.schema == schema
                and kept.seq <= limit
                and (best is None or kept.seq > best.seq)
            ):
                best = kept
            limit = min(limit, s.parent_seq)
            s = s.parent
        return best

    async def aclose(self) -> None:
        return None


class _MemoryWriter(SyncedOnReturn):
    """A session's writer: appends through the journal's ``append`` (handed over by the journal) at its epoch."""

    def __init__(
        self, append: Callable[[str, int, Sequence[NewRecord]], list[int]], session: _Session, epoch: int
    ) -> None:
        self._append = append
        self._session = session
        self._epoch = epoch
        self._closed = False

    @property
    def session_id(self) -> str:
        return self._session.session_id

    @property
    def last_seq(self) -> int:
        return self._session.last_seq

    async def append(self, records: Sequence[NewRecord], *, sync: bool = True) -> list[int]:
        if self._closed:
            raise JournalError("writer is closed")
        await asyncio.sleep(0)  # an append is a suspension point, as with a real store
        return self._append(self._session.session_id, self._epoch, records)

    async def aclose(self) -> None:
        self._closed = True
