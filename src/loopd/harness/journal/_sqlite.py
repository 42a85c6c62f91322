"""SQLite journal with group commit across sessions.

One write connection lives on one dedicated thread. Appends from every session on the event loop are gathered
while the previous transaction commits and written together in the next one (group commit): throughput grows
with concurrency while each append still commits before its caller sees a seq. Reads use a second connection on
their own thread (WAL lets them run beside the writer).

Durability: WAL with ``synchronous=NORMAL`` (default) survives a process crash (kill -9); ``synchronous="FULL"``
also survives power loss at the price of an fsync per group commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from loopd.harness._errors import (
    JournalError,
    JournalFencedError,
    SessionBusyError,
    SessionNotFoundError,
)
from loopd.harness.journal._protocol import JournalWriter, NewRecord, Record, SessionInfo

_T = TypeVar("_T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS journal_sessions (
    sid INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    created_at REAL NOT NULL,
    last_seq INTEGER NOT NULL DEFAULT 0,
    epoch INTEGER NOT NULL DEFAULT 0,
    meta TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS journal_records (
    sid INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    kind TEXT NOT NULL,
    v INTEGER NOT NULL,
    at REAL NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (sid, seq)
) WITHOUT ROWID;
"""


@dataclass(slots=True)
class _Append:
    sid: int
    epoch: int
    records: Sequence[NewRecord]
    future: asyncio.Future[list[int]]


@dataclass(slots=True)
class _Batch:
    items: list[_Append] = field(default_factory=list)
    size: int = 0


def _connect(path: Path, synchronous: str, timeout: float) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=timeout, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={synchronous}")
    conn.execute("PRAGMA foreign_keys=OFF")
    return conn


class SqliteJournal:
    """A `Journal` on one SQLite file. Open with ``await SqliteJournal.open(path)``; close with `aclose`."""

    def __init__(
        self,
        path: Path,
        *,
        synchronous: Literal["NORMAL", "FULL"] = "NORMAL",
        max_pending: int = 65_536,
        append_timeout: float = 30.0,
        busy_timeout: float = 10.0,
    ) -> None:
        self.path = Path(path)
        self._synchronous = synchronous
        self._max_pending = max_pending
        self._append_timeout = append_timeout
        self._busy_timeout = busy_timeout
        self._wexec = ThreadPoolExecutor(max_workers=1, thread_name_prefix="loopd-journal-w")
        self._rexec = ThreadPoolExecutor(max_workers=1, thread_name_prefix="loopd-journal-r")
        self._wconn: sqlite3.Connection | None = None
        self._rconn: sqlite3.Connection | None = None
        self._pending = _Batch()
        self._flusher: asyncio.Task[None] | None = None
        self._room = asyncio.Condition()
        self._sids: dict[str, int] = {}
        self._signals: dict[int, asyncio.Event] = {}
        self._closed = False
        self.commits = 0
        self.records_written = 0

    @classmethod
    async def open(cls, path: Path | str, **options: object) -> SqliteJournal:
        journal = cls(Path(path), **options)  # type: ignore[arg-type]  # options are this class's keywords
        await journal._start()
        return journal

    async def _start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)

        def setup() -> sqlite3.Connection:
            conn = _connect(self.path, self._synchronous, self._busy_timeout)
            conn.executescript(_SCHEMA)
            return conn

        self._wconn = await self._in_writer(setup)
        self._rconn = await asyncio.get_running_loop().run_in_executor(
            self._rexec, _connect, self.path, self._synchronous, self._busy_timeout
        )

    async def _in_writer(self, fn: Callable[..., _T], *args: Any) -> _T:
        loop = asyncio.get_running_loop()
        return await asyncio.wait_for(loop.run_in_executor(self._wexec, fn, *args), self._append_timeout)

    async def _in_reader(self, fn: Callable[..., _T], *args: Any) -> _T:
        loop = asyncio.get_running_loop()
        return await asyncio.wait_for(loop.run_in_executor(self._rexec, fn, *args), self._append_timeout)

    # --- sessions ------------------------------------------------------------------------------------------

    async def create_session(self, session_id: str, *, meta: str = "", at: float) -> JournalWriter:
        def create() -> tuple[int, int]:
            conn = self._wc
            try:
                cur = conn.execute(
                    "INSERT INTO journal_sessions (id, created_at, epoch, meta) VALUES (?, ?, 1, ?) RETURNING sid",
                    (session_id, at, meta),
                )
                (sid,) = cur.fetchone()
            except sqlite3.IntegrityError:
                return -1, 0
            return int(sid), 1

        self._check_open()
        sid, epoch = await self._in_writer(create)
        if sid < 0:
            raise SessionBusyError(session_id)
        self._sids[session_id] = sid
        return _SqliteWriter(self, session_id, sid, epoch, 0)

    async def open_writer(self, session_id: str) -> JournalWriter:
        def take() -> tuple[int, int, int] | None:
            row = self._wc.execute(
                "UPDATE journal_sessions SET epoch = epoch + 1 WHERE id = ? RETURNING sid, epoch, last_seq",
                (session_id,),
            ).fetchone()
            return None if row is None else (int(row[0]), int(row[1]), int(row[2]))

        self._check_open()
        found = await self._in_writer(take)
        if found is None:
            raise SessionNotFoundError(session_id)
        sid, epoch, last_seq = found
        self._sids[session_id] = sid
        return _SqliteWriter(self, session_id, sid, epoch, last_seq)

    @property
    def _wc(self) -> sqlite3.Connection:
        assert self._wconn is not None
        return self._wconn

    @property
    def _rc(self) -> sqlite3.Connection:
        assert self._rconn is not None
        return self._rconn

    def _check_open(self) -> None:
        if self._closed:
            raise JournalError("journal is closed")

    # --- group commit --------------------------------------------------------------------------------------

    async def _append(self, sid: int, epoch: int, records: Sequence[NewRecord]) -> list[int]:
        self._check_open()
        if not records:
            return []
        async with asyncio.timeout(self._append_timeout):
            if self._pending.size >= self._max_pending:  # back-pressure: wait for the next group commit
                async with self._room:
                    await self._room.wait_for(lambda: self._pending.size < self._max_pending)
            future: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
            self._pending.items.append(_Append(sid, epoch, records, future))
            self._pending.size += len(records)
            if self._flusher is None or self._flusher.done():
                self._flusher = asyncio.create_task(self._flush(), name="loopd-journal-flush")
            # Shielded: a caller giving up must not abort a commit that other sessions share.
            return await asyncio.shield(future)

    async def _flush(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending.items:
            batch, self._pending = self._pending, _Batch()
            if batch.size >= self._max_pending:
                async with self._room:
                    self._room.notify_all()
            plan = [(a.sid, a.epoch, a.records) for a in batch.items]
            try:
                results = await loop.run_in_executor(self._wexec, self._write_batch, plan)
            except asyncio.CancelledError:
                for item in batch.items:
                    if not item.future.done():
                        item.future.set_exception(JournalError("journal closed during append"))
                raise
            except Exception as exc:  # any storage failure fails every append of the batch (fail-closed)
                error = JournalError(f"append failed: {exc}")
                error.__cause__ = exc
                for item in batch.items:
                    if not item.future.done():
                        item.future.set_exception(error)
                continue
            for item, result in zip(batch.items, results, strict=True):
                if item.future.done():
                    continue
                if isinstance(result, BaseException):
                    item.future.set_exception(result)
                else:
                    item.future.set_result(result)
                    signal = self._signals.get(item.sid)
                    if signal is not None:
                        signal.set()

    def _write_batch(self, plan: list[tuple[int, int, Sequence[NewRecord]]]) -> list[list[int] | BaseException]:
        """One transaction for the whole batch. Runs on the writer thread.

        Fencing: under ``BEGIN IMMEDIATE`` nobody else can change a session's epoch, so one SELECT of the
        batch's sessions decides which appends still own their session; the others fail with
        `JournalFencedError` while the rest commit.
        """
        conn = self._wc
        results: list[list[int] | BaseException] = []
        rows: list[tuple[int, int, str, int, float, bytes]] = []
        sids = sorted({sid for sid, _, _ in plan})
        conn.execute("BEGIN IMMEDIATE")
        try:
            heads: dict[int, tuple[int, int]] = {}
            for i in range(0, len(sids), 500):
                chunk = sids[i : i + 500]
                marks = ",".join("?" * len(chunk))
                for sid, epoch, last in conn.execute(
                    f"SELECT sid, epoch, last_seq FROM journal_sessions WHERE sid IN ({marks})", chunk
                ):
                    heads[int(sid)] = (int(epoch), int(last))
            for sid, epoch, records in plan:
                head = heads.get(sid)
                if head is None or head[0] != epoch:
                    results.append(JournalFencedError(f"session writer (epoch {epoch}) was fenced"))
                    continue
                first = head[1] + 1
                seqs = list(range(first, first + len(records)))
                heads[sid] = (epoch, seqs[-1])
                rows.extend((sid, seq, r.kind, r.version, r.at, r.data) for seq, r in zip(seqs, records, strict=True))
                results.append(seqs)
            conn.executemany(
                "UPDATE journal_sessions SET last_seq = ? WHERE sid = ?",
                [(last, sid) for sid, (_, last) in heads.items()],
            )
            conn.executemany(
                "INSERT INTO journal_records (sid, seq, kind, v, at, data) VALUES (?, ?, ?, ?, ?, ?)", rows
            )
            conn.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise
        self.commits += 1
        self.records_written += len(rows)
        return results

    # --- reading -------------------------------------------------------------------------------------------

    async def _sid(self, session_id: str) -> int | None:
        sid = self._sids.get(session_id)
        if sid is not None:
            return sid

        def lookup() -> int | None:
            row = self._rc.execute("SELECT sid FROM journal_sessions WHERE id = ?", (session_id,)).fetchone()
            return None if row is None else int(row[0])

        found: int | None = await self._in_reader(lookup)
        if found is not None:
            self._sids[session_id] = found
        return found

    async def read(self, session_id: str, from_seq: int = 1, limit: int | None = None) -> list[Record]:
        self._check_open()
        sid = await self._sid(session_id)
        if sid is None:
            raise SessionNotFoundError(session_id)

        def fetch() -> list[Record]:
            rows = self._rc.execute(
                "SELECT seq, kind, v, at, data FROM journal_records WHERE sid = ? AND seq >= ? ORDER BY seq LIMIT ?",
                (sid, from_seq, -1 if limit is None else limit),
            ).fetchall()
            return [Record(session_id, int(s), k, int(v), bytes(d), float(a)) for s, k, v, a, d in rows]

        result: list[Record] = await self._in_reader(fetch)
        return result

    async def follow(self, session_id: str, from_seq: int = 1, *, poll_interval: float = 0.5) -> AsyncIterator[Record]:
        sid = await self._sid(session_id)
        if sid is None:
            raise SessionNotFoundError(session_id)
        signal = self._signals.setdefault(sid, asyncio.Event())
        next_seq = from_seq
        while True:
            signal.clear()
            page = await self.read(session_id, next_seq, 512)
            for record in page:
                yield record
                next_seq = record.seq + 1
            if len(page) < 512:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(signal.wait(), poll_interval)

    async def session(self, session_id: str) -> SessionInfo | None:
        def fetch() -> SessionInfo | None:
            row = self._rc.execute(
                "SELECT id, created_at, last_seq, meta FROM journal_sessions WHERE id = ?", (session_id,)
            ).fetchone()
            return None if row is None else SessionInfo(row[0], float(row[1]), int(row[2]), row[3])

        result: SessionInfo | None = await self._in_reader(fetch)
        return result

    async def sessions(self, *, limit: int = 100) -> list[SessionInfo]:
        def fetch() -> list[SessionInfo]:
            rows = self._rc.execute(
                "SELECT id, created_at, last_seq, meta FROM journal_sessions ORDER BY created_at DESC LIMIT ?",
                (limit,),
            ).fetchall()
            return [SessionInfo(r[0], float(r[1]), int(r[2]), r[3]) for r in rows]

        result: list[SessionInfo] = await self._in_reader(fetch)
        return result

    async def aclose(self) -> None:
        if self._closed:
            return
        if self._flusher is not None and not self._flusher.done():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self._flusher), self._append_timeout)
        self._closed = True
        loop = asyncio.get_running_loop()
        if self._wconn is not None:
            await loop.run_in_executor(self._wexec, self._wconn.close)
        if self._rconn is not None:
            await loop.run_in_executor(self._rexec, self._rconn.close)
        self._wexec.shutdown(wait=True)
        self._rexec.shutdown(wait=True)


class _SqliteWriter:
    def __init__(self, journal: SqliteJournal, session_id: str, sid: int, epoch: int, last_seq: int) -> None:
        self._journal = journal
        self._session_id = session_id
        self._sid = sid
        self._epoch = epoch
        self._last_seq = last_seq
        self._closed = False

    @property
    def session_id(self) -> str:
        return self._session_id

    @property
    def last_seq(self) -> int:
        return self._last_seq

    async def append(self, records: Sequence[NewRecord]) -> list[int]:
        if self._closed:
            raise JournalError("writer is closed")
        seqs = await self._journal._append(self._sid, self._epoch, records)
        if seqs:
            self._last_seq = seqs[-1]
        return seqs

    async def aclose(self) -> None:
        self._closed = True
