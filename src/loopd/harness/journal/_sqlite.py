"""SQLite journal with group commit across sessions.

Appends from every session on the event loop are gathered into one transaction (group commit): the first append
of a round yields once to the event loop, so that the appends of every task that is ready in the same loop
iteration join it, and then the round is written. Each append still commits before its caller sees a seq. When
the previous round held a single append (one session writing alone), the next append is written at once, without
that yield, except every `SOLO_STREAK`-th one, so that a writer appending in a tight loop never holds the event
loop for long.

Where a transaction runs:

* **On the event-loop thread ("inline")**, when the writer thread is idle, the round is at most
  `INLINE_MAX_RECORDS` records and `INLINE_MAX_BYTES` bytes, and either ``synchronous="NORMAL"`` or the ``FULL``
  commits are quick (below). In WAL mode a
  ``NORMAL`` commit appends pages to the WAL file without an fsync: ~20 µs for one record, ~4 µs a record in a
  round of 100 over 100 sessions, against ~60–70 µs (and two context switches) for a round trip to a worker
  thread. The trade-off: the event loop runs that SQL itself instead of waiting for the thread, i.e. it is
  blocked ~20 µs per small round and at most ~0.5 ms for a full one (0.36 ms median, 0.6 ms max for 100
  records on the 2-vCPU development VM) — about what the loop already spends resolving and resuming those
  appends. What keeps it bounded: it never waits for a lock (the busy timeout is 0 while inline; if another
  connection, e.g. another process on the same file, holds the write lock, the round goes to the writer
  thread), and it never fsyncs (automatic WAL checkpoints are off on the write connection; a passive checkpoint
  runs every 1,000 WAL frames, as SQLite's own default would, on the *reader's* thread and connection, so that
  rounds keep committing inline meanwhile — a passive checkpoint never blocks a writer. The frames are counted
  from the ``mxFrame`` field of the wal-index header in the ``-shm`` file — the count SQLite's own automatic
  checkpoint uses —, read with one ``pread`` per commit; only without that file are they estimated). A checkpoint
  that runs beside commits cannot let the WAL start over (frames keep arriving after the ones it copied), so
  once the WAL holds `WAL_RESTART_FRAMES` frames, the checkpoint runs on the writer thread instead, rounds
  waiting behind it as before, and the next round starts the WAL file from its beginning again. At ``FULL`` every
  checkpoint is such a restart, every `FULL_WAL_FRAMES` (512) frames: a WAL that grows makes each commit's
  fdatasync also commit the file system's journal (the file's size changed), about twice the cost of one that
  overwrites blocks the file already has (a lone session's FULL appends on a fresh file on the development VM:
  287 → 180 µs each).
  A new session's row (`create_session`) is inserted the same way when the writer thread is idle.
* **On the writer thread** otherwise (larger rounds, ``FULL`` commits not known to be quick, ``inline_commits=False``,
  a busy file, or while the thread is still working), with SQLite's busy timeout; the event loop gathers the next
  round meanwhile.

A ``FULL`` commit waits for its fsync wherever it runs; the question is only who waits. Each one is timed and a
running estimate kept (`next_commit_estimate`, an exponentially weighted mean): while it is at most
`FULL_INLINE_MAX` (0.5 ms), FULL transactions run inline like NORMAL ones, because a round trip to the writer
thread costs two thread wake-ups — ≈ 140 µs on the 2-vCPU development VM, more than the fsync of a small commit
there (≈ 100–230 µs) — and the event loop had nothing to do but wait for that commit's caller anyway (measured there:
a session appending alone 3,500 → 4,700 appends/s, 100 sessions 101k → 117k). The first FULL commit runs on the
writer thread; one that takes long (a slow or busy disk) moves the estimate past the bound at once (weight 1/4),
sending the next rounds back to the writer thread, where the loop works on meanwhile, until commits are quick
again. So an inline fsync holds the event loop about as long as an inline round of 100 records does, and a slow
one holds it once.

Bounded waits: a round on the writer thread is awaited with one timeout (``append_timeout``) for the whole
round, not one timer per append; an append waits at most for the round in flight and its own round (plus, when
more than ``max_pending`` records are queued, for room, also bounded). A round that fails or times out fails
every append in it with `JournalError`, and the session stops (fail-closed).

Fencing: the write connection keeps each session's head ``(epoch, last_seq)`` as it last committed or read it,
and the file's ``PRAGMA data_version`` at its last transaction. Under ``BEGIN IMMEDIATE`` (the write lock), an
unchanged data_version proves that no other connection has committed since, so the cached heads are current and
a round is just the INSERT of its records; if it changed (another replica wrote), the cache is dropped and the
heads of the round's sessions are read again. An append whose epoch is not the session's current one fails with
`JournalFencedError`. The unique index on ``(sid, seq)`` refuses a duplicate seq in any case.

Durability: WAL with ``synchronous=NORMAL`` (default) survives a process crash (kill -9); ``synchronous="FULL"``
also survives power loss at the price of an fsync per group commit (inline only while those are quick, above).

Threads and layout: the connections, their threads and the layout's migration are the floor's
(``loopd._infra.sqlite`` lanes, ``loopd._infra.migrations``); the group-commit algorithm above is this module's.
Layout (steps recorded in ``journal_migrations``; ``PRAGMA user_version`` set to the layout for older builds,
and read to adopt a file made before the migrator): version 2 keeps records in append order (a rowid table) with a
unique index on ``(sid, seq)``: a round over many sessions adds its rows at the end of the table, and only the
small index entries land in one place per session (with rows clustered by session, each session's row page was
rewritten). A session's last seq is the largest seq in that index, so no per-append UPDATE of the session row is
needed. Reading one session walks the index and fetches its rows by rowid (as fast as the clustered read for a
session written alone; more pages when many sessions interleaved). A file of version 0 (rows clustered by
``(sid, seq)`` ``WITHOUT ROWID``, and a ``last_seq`` column in the session row: step 1) is migrated in one
transaction (step 2) when it is first opened; a build from before that migration then fails on the file (the
``last_seq`` column it expects is gone) rather than numbering records wrongly. Step 3 adds ``parent_sid`` and
``parent_seq`` to the session row: a fork (``fork_session``) stores only its own records, numbered from
``parent_seq + 1``; reading it reads its ancestors' ranges first (`_segments`), and its head before its first
record is ``parent_seq``. Step 4 adds ``journal_snapshots``: one state snapshot per session (the newest), saved by
a transaction of its own, never inside a round: inline under an inline round's rule (``NORMAL``, or at ``FULL`` a
lazy round's — a snapshot is a cache beside records already synced, so it commits without the fdatasync —, at most
`INLINE_MAX_BYTES`, the writer thread idle), else on the writer thread. A session's snapshots
are written while it runs (`loopd.harness.journal.StateSnapshots`); handing a small one to the writer thread would
send the session's next rounds there too, each waiting for the thread and the interpreter lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal, TypeVar

from loopd._infra.clock import Clock, SystemClock, wait_event
from loopd._infra.database import Connection, DatabaseErrors
from loopd._infra.errors import LoopdError
from loopd._infra.files import ensure_private_dir
from loopd._infra.migrations import Migration, Schema, migrate
from loopd._infra.sqlite import SqliteDatabase, SqliteLane, SqliteOptions
from loopd.harness._errors import (
    ForkPointError,
    JournalError,
    JournalFencedError,
    SessionBusyError,
    SessionNotFoundError,
    SnapshotSeqError,
)
from loopd.harness.journal._protocol import JournalWriter, NewRecord, Record, SessionInfo, Snapshot

_T = TypeVar("_T")

SCHEMA_VERSION = 4
LAYOUT_2 = 2  # the last layout a build from before the floor's migrator made
_LAYOUT_3 = 3
INLINE_MAX_RECORDS = 128
INLINE_MAX_BYTES = 256 * 1024
SOLO_STREAK = 8
FULL_INLINE_MAX = 0.0005
WAL_COUNT_EVERY = 4
"""Rounds between two reads of the WAL's frame count (`_count_wal`, a ``pread`` of the -shm file): a checkpoint then
starts at most that many rounds late, a few frames past its mark."""
SYNC_TIMEOUT = 30.0
"""Seconds a `SqliteJournal.sync` waits for the WAL's fdatasync before it fails (fail-closed)."""
"""Seconds a ``synchronous="FULL"`` commit (its fsync) may take, as the journal's running estimate has it, for FULL
transactions to run inline (see the module docstring)."""
FULL_COMMIT_WEIGHT = 0.25
"""The newest FULL commit's weight in that running estimate (an exponentially weighted mean)."""
_stopwatch = time.perf_counter
"""What times a FULL commit: the fsync's real duration (not a timer, so no `Clock`; tests replace it)."""
CHECKPOINT_PAGES = 1000  # SQLite's default wal_autocheckpoint
_MX_FRAME = 16  # offset of mxFrame (u32, native byte order) in the wal-index header of the -shm file
WAL_RESTART_FRAMES = 4 * CHECKPOINT_PAGES  # a WAL this long is checkpointed with writes held (it then restarts)
FULL_WAL_FRAMES = 512
"""At ``synchronous="FULL"``, every this many WAL frames (2 MB) the WAL is checkpointed with writes held and starts
over, so its fsyncs overwrite blocks the file already has (see the module docstring)."""

_LAYOUT_0 = (
    """CREATE TABLE journal_sessions (
    sid INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    created_at REAL NOT NULL,
    last_seq INTEGER NOT NULL DEFAULT 0,
    epoch INTEGER NOT NULL DEFAULT 0,
    meta TEXT NOT NULL DEFAULT ''
)""",
    """CREATE TABLE journal_records (
    sid INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    kind TEXT NOT NULL,
    v INTEGER NOT NULL,
    at REAL NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (sid, seq)
) WITHOUT ROWID""",
)
_SCHEMA_V2 = (
    """CREATE TABLE journal_sessions (
    sid INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    created_at REAL NOT NULL,
    epoch INTEGER NOT NULL DEFAULT 0,
    meta TEXT NOT NULL DEFAULT ''
)""",
    """CREATE TABLE journal_records (
    id INTEGER PRIMARY KEY,
    sid INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    kind TEXT NOT NULL,
    v INTEGER NOT NULL,
    at REAL NOT NULL,
    data BLOB NOT NULL
)""",
    "CREATE UNIQUE INDEX journal_records_sid_seq ON journal_records (sid, seq)",
)
# Layout 3: a fork's row names its parent and the parent's last seq it shares (0 and NULL for other sessions).
_FORKS = (
    "ALTER TABLE journal_sessions ADD COLUMN parent_sid INTEGER",
    "ALTER TABLE journal_sessions ADD COLUMN parent_seq INTEGER NOT NULL DEFAULT 0",
    f"PRAGMA user_version = {_LAYOUT_3}",  # a build from before the migrator refuses it (it would misread forks)
)
# Layout 4: each session's newest state snapshot (a cache beside the records; `loopd.harness.core.snapshot`).
_SNAPSHOTS = (
    """CREATE TABLE journal_snapshots (
    sid INTEGER PRIMARY KEY,
    seq INTEGER NOT NULL,
    state_schema TEXT NOT NULL,
    at REAL NOT NULL,
    data BLOB NOT NULL
)""",
    "PRAGMA user_version = 4",  # the layout, for older builds (and this one's `_adopt`)
)
# Replaces the session's snapshot unless the kept one is of the same schema and newer.
_SAVE_SNAPSHOT = (
    "INSERT INTO journal_snapshots (sid, seq, state_schema, at, data) VALUES (?, ?, ?, ?, ?) ON CONFLICT (sid) "
    "DO UPDATE SET seq = excluded.seq, state_schema = excluded.state_schema, at = excluded.at, data = excluded.data "
    "WHERE journal_snapshots.state_schema <> excluded.state_schema OR journal_snapshots.seq <= excluded.seq"
)
_LOAD_SNAPSHOT = "SELECT seq, at, data FROM journal_snapshots WHERE sid = ? AND state_schema = ? AND seq <= ?"
# A session's head: its epoch and its largest seq (a fork's parent_seq before its first record, else 0).
_HEAD = (
    "SELECT epoch, coalesce((SELECT max(seq) FROM journal_records WHERE sid = ?1), parent_seq) "
    "FROM journal_sessions WHERE sid = ?1"
)
_INFO = (
    "SELECT s.id, s.created_at, coalesce((SELECT max(r.seq) FROM journal_records r WHERE r.sid = s.sid), "
    "s.parent_seq), s.meta, (SELECT p.id FROM journal_sessions p WHERE p.sid = s.parent_sid), s.parent_seq "
    "FROM journal_sessions s"
)
_READ = (
    "SELECT seq, kind, v, at, data FROM journal_records WHERE sid = ? AND seq >= ? AND seq <= ? ORDER BY seq LIMIT ?"
)
_LAST = 2**62  # "no upper bound" for a seq range

_Append = tuple[int, int, Sequence[NewRecord], "asyncio.Future[list[int]]", "_SqliteWriter", bool]
"""A queued append: its session's sid and epoch, its records, the future its caller awaits, its writer and whether
its commit must reach the disk before it returns (``sync``; only ``FULL`` tells the two apart). A plain
tuple (a round's plan is its appends themselves): building one costs a fraction of a class instance's ``__init__``,
which is measurable at 100k appends a second."""
_Plan = list[_Append]
_Results = list[list[int] | BaseException]


class _WriterBusy(LoopdError):
    """Another connection holds the write lock; an inline round goes to the writer thread instead."""


def next_commit_estimate(estimate: float | None, took: float) -> float:
    """The running estimate of a FULL commit's time once one more took ``took`` seconds (the first sets it)."""
    return took if estimate is None else estimate + FULL_COMMIT_WEIGHT * (took - estimate)


def _is_busy(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
    return code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


async def _layout_0_to_2(conn: Connection) -> None:
    """Layout 0 → 2, inside the migration's transaction: records in append order, no ``last_seq`` column."""
    await conn.execute("ALTER TABLE journal_records RENAME TO journal_records_0")
    await conn.execute("ALTER TABLE journal_sessions RENAME TO journal_sessions_0")
    for statement in _SCHEMA_V2:
        await conn.execute(statement)
    await conn.execute(
        "INSERT INTO journal_sessions (sid, id, created_at, epoch, meta) "
        "SELECT sid, id, created_at, epoch, meta FROM journal_sessions_0 ORDER BY sid"
    )
    await conn.execute(
        "INSERT INTO journal_records (sid, seq, kind, v, at, data) "
        "SELECT sid, seq, kind, v, at, data FROM journal_records_0 ORDER BY sid, seq"
    )
    await conn.execute("DROP TABLE journal_records_0")
    await conn.execute("DROP TABLE journal_sessions_0")
    # A build from before the floor's migrator reads the layout here (and refuses a newer one).
    await conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


async def _adopt(conn: Connection) -> int:
    """A file from before the migrator: its ``PRAGMA user_version`` is the layout (2: both steps made), and a file
    of layout 0 has the tables of step 1."""
    ((version,),) = await conn.fetch("PRAGMA user_version")
    if int(version) >= LAYOUT_2:
        return int(version)
    exists = await conn.fetch("SELECT 1 FROM sqlite_master WHERE name = 'journal_records'")
    return 1 if exists else 0


SCHEMA = Schema(
    "journal",
    (
        Migration(1, "layout 0: records clustered by session", _LAYOUT_0),
        Migration(2, "layout 2: records in append order, no last_seq column", (_layout_0_to_2,)),
        Migration(3, "forks: parent_sid and parent_seq of a session", _FORKS),
        Migration(4, "state snapshots: each session's newest", _SNAPSHOTS),
    ),
    adopt=_adopt,
)
"""The file's layout, as numbered steps of the floor's migrator (recorded in ``journal_migrations``)."""


_ERRORS = DatabaseErrors.all_as(JournalError)


class SqliteJournal:
    """A `Journal` on one SQLite file. Open with ``await SqliteJournal.open(path)``; close with `aclose`.

    ``inline_commits=False`` keeps every transaction on the writer thread (see the module docstring).
    ``clock`` measures the followers' poll interval (a test's ``VirtualClock`` drives it).
    """

    def __init__(
        self,
        path: Path,
        *,
        synchronous: Literal["NORMAL", "FULL"] = "NORMAL",
        max_pending: int = 65_536,
        append_timeout: float = 30.0,
        busy_timeout: float = 10.0,
        inline_commits: bool = True,
        clock: Clock | None = None,
    ) -> None:
        self.path = Path(path)
        self._clock: Clock = clock or SystemClock()
        self._synchronous = synchronous
        self._max_pending = max_pending
        self._append_timeout = append_timeout
        self._busy_ms = max(0, int(busy_timeout * 1000))
        self._inline_commits = inline_commits
        self._full = synchronous == "FULL"
        # Whether transactions may run inline now: NORMAL ones always; FULL ones once their commits are measured to
        # be quick (`_commit`; the first runs on the writer thread).
        self._inline = inline_commits and not self._full
        self.full_commit_seconds: float | None = None
        """The running estimate of a FULL commit's time (None: none measured yet, or not FULL)."""
        # When to checkpoint, and when to let the WAL start over: at FULL, early, so that it does not grow.
        self._checkpoint_frames = FULL_WAL_FRAMES if self._full else CHECKPOINT_PAGES
        self._restart_frames = FULL_WAL_FRAMES if self._full else WAL_RESTART_FRAMES
        # The floor's lanes: a connection each, on its own thread. The writer's connection is also used on the
        # event-loop thread by inline rounds (while the writer thread is idle); checkpoints run on the reader's
        # thread and connection (`_resolve`), never inside a commit.
        lane = SqliteOptions(
            timeout=append_timeout,
            busy_timeout=self._busy_ms / 1000,
            synchronous=synchronous,
            pragmas=("foreign_keys=OFF",),
            label=f"the journal {self.path}",
            errors=_ERRORS,
        )
        self._writer = SqliteLane(
            self.path,
            replace(lane, pragmas=(*lane.pragmas, "wal_autocheckpoint=0")),
            query_only=False,
            name="loopd-journal-w",
        )
        self._reader = SqliteLane(self.path, lane, query_only=True, name="loopd-journal-r")
        # The lanes' connections, once open (read on every append: one attribute, not two).
        self._wconn: sqlite3.Connection | None = None
        self._rconn: sqlite3.Connection | None = None
        # Used only by whoever holds the write connection: a writer-thread job, or an inline round while no
        # job is queued or running (`_writer_idle`).
        self._heads: dict[int, tuple[int, int]] = {}
        self._busy_wait = True
        self._lazy_level = False  # FULL only: the write connection is at NORMAL, as its last (lazy) round left it
        self._data_version = -1
        self._wal_pages = 0  # WAL frames appended since the last checkpoint was started
        self._uncounted = 0  # rounds committed since the WAL's frames were last counted
        self._wal_frames = 0  # the WAL's frames (mxFrame) when last counted
        self._shm: int | None = None  # the -shm file, read for mxFrame (None: estimate the frames instead)
        self.checkpoints = 0
        self._checkpointing: Future[None] | None = None
        self._wjobs: deque[Future[Any]] = deque()  # jobs given to the writer thread and not known to be done
        # Appends not yet in a transaction, and who writes them next: a leader (an append that yielded once to
        # gather the round) or the flusher task (rounds on the writer thread).
        self._pending: list[_Append] = []
        self._pending_size = 0
        self._pending_bytes = 0  # the queued records' data, summed as they are queued (an inline round's bound)
        self._leader = False
        self._solo = False  # the last round had a single append
        self._unyielded = 0  # appends written since one last yielded to the event loop
        self._flusher: asyncio.Task[None] | None = None
        self._room = asyncio.Event()
        self._room.set()
        self._sids: dict[str, int] = {}
        self._parents: dict[int, tuple[int, int] | None] = {}  # sid → (parent sid, parent seq) of a fork, or None
        self._signals: dict[int, asyncio.Event] = {}
        self._closed = False
        self.migrated_from: int | None = None
        self.commits = 0
        self.commits_inline = 0
        self.records_written = 0
        self.snapshots_inline = 0  # state snapshots saved on the event-loop thread
        self.sessions_inline = 0  # sessions created on the event-loop thread
        # Deferred syncs at FULL (`sync`): rounds of ``sync=False`` appends only commit without the fdatasync
        # (``commits_unsynced`` counts them: ``_lazy_commits``); `sync` then fdatasyncs the WAL (inline, or on the
        # sync thread while FULL commits are slow), and ``_synced_gen`` is the count of those known to be on the disk.
        self._pending_syncs = 0  # queued appends that want their commit synced
        self._lazy_commits = 0
        self._synced_gen = 0
        self._sync_job: asyncio.Future[None] | None = None
        self._syncer: ThreadPoolExecutor | None = None
        self._wal_fd: int | None = None
        self.commits_unsynced = 0
        self.syncs = 0

    @classmethod
    async def open(cls, path: Path | str, **options: object) -> SqliteJournal:
        journal = cls(Path(path), **options)  # type: ignore[arg-type]  # options are this class's keywords
        try:
            await journal._start()
        except BaseException:
            await journal.aclose()
            raise
        return journal

    async def _start(self) -> None:
        # Transcripts hold file contents: the owner alone reads them (the writer lane creates the file 0600; the
        # -wal/-shm files take the file's mode).
        ensure_private_dir(self.path.parent, tighten=False)
        await self._writer.open()
        # The layout through the floor's migrator, on the writer lane before anything else uses it.
        applied = await migrate(SqliteDatabase(self._writer, None, self._writer.options), SCHEMA)
        self.migrated_from = 0 if 2 in applied and 1 not in applied else None
        self._wconn = self._writer.connection
        with contextlib.suppress(OSError):  # no -shm file (e.g. a heap wal-index): the frames are estimated
            self._shm = os.open(f"{self.path}-shm", os.O_RDONLY | os.O_CLOEXEC)
        await self._reader.open()
        self._rconn = self._reader.connection

    # --- the two threads -----------------------------------------------------------------------------------

    def _submit(self, fn: Callable[..., _T], *args: Any) -> Future[_T]:
        """Give ``fn`` to the writer thread; until it is done (or cancelled before it ran), nothing commits inline."""

        def job() -> _T:
            self._set_busy_wait(True)
            return fn(*args)

        future = self._writer.submit(job)
        self._wjobs.append(future)
        return future

    def _writer_idle(self) -> bool:
        # Jobs finish in order, except one cancelled while queued: it is done while an earlier one still runs.
        jobs = self._wjobs
        while jobs and jobs[0].done():
            jobs.popleft()
        return not jobs or all(job.done() for job in jobs)

    async def _in_writer(self, fn: Callable[..., _T], *args: Any) -> _T:
        async with asyncio.timeout(self._append_timeout):
            return await asyncio.wrap_future(self._submit(fn, *args))

    async def _in_reader(self, fn: Callable[[], _T]) -> _T:
        return await self._reader.call(fn)

    def _set_busy_wait(self, wait: bool) -> None:
        """SQLite's busy timeout: the configured one on the writer thread, 0 for inline rounds."""
        if self._busy_wait != wait and self._wconn is not None:
            self._wconn.execute(f"PRAGMA busy_timeout = {self._busy_ms if wait else 0}")
            self._busy_wait = wait

    # --- sessions ------------------------------------------------------------------------------------------

    async def create_session(self, session_id: str, *, meta: str = "", at: float) -> JournalWriter:
        def create(inline: bool) -> int:
            self._set_busy_wait(not inline)
            try:
                started = _stopwatch()
                cur = self._wc.execute(
                    "INSERT INTO journal_sessions (id, created_at, epoch, meta) VALUES (?, ?, 1, ?) RETURNING sid",
                    (session_id, at, meta),
                )
                (sid,) = cur.fetchone()  # committed with the statement (no transaction): at FULL, synced too
                if self._full:
                    self._timed_full_commit(_stopwatch() - started)
            except sqlite3.IntegrityError:
                return -1
            except sqlite3.OperationalError as exc:
                if inline and _is_busy(exc):
                    raise _WriterBusy from exc
                raise
            self._heads[int(sid)] = (1, 0)
            return int(sid)

        self._check_open()
        # One small row: committed here like a small round when it may be, not handed to the writer thread (which
        # would also send the rounds gathered meanwhile there).
        sid, inline = await self._write_inline_or_on_thread(create)
        self.sessions_inline += inline and sid >= 0
        if sid < 0:
            raise SessionBusyError(session_id)
        self._sids[session_id] = sid
        self._parents[sid] = None
        return _SqliteWriter(self, session_id, sid, 1, 0)

    async def fork_session(
        self, parent_id: str, at_seq: int, session_id: str, *, meta: str = "", at: float
    ) -> JournalWriter:
        def fork() -> tuple[int, int] | BaseException:
            conn = self._wc
            conn.execute("BEGIN IMMEDIATE")
            try:
                row = conn.execute("SELECT sid FROM journal_sessions WHERE id = ?", (parent_id,)).fetchone()
                if row is None:
                    conn.execute("ROLLBACK")
                    return SessionNotFoundError(parent_id)
                parent_sid = int(row[0])
                _, parent_last = conn.execute(_HEAD, (parent_sid,)).fetchone()
                if not 1 <= at_seq <= int(parent_last):
                    conn.execute("ROLLBACK")
                    return ForkPointError(f"session {parent_id!r} has seqs 1..{parent_last}; cannot fork at {at_seq}")
                try:
                    (sid,) = conn.execute(
                        "INSERT INTO journal_sessions (id, created_at, epoch, meta, parent_sid, parent_seq) "
                        "VALUES (?, ?, 1, ?, ?, ?) RETURNING sid",
                        (session_id, at, meta, parent_sid, at_seq),
                    ).fetchone()
                except sqlite3.IntegrityError:
                    conn.execute("ROLLBACK")
                    return SessionBusyError(session_id)
                self._commit(conn)
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                raise
            self._heads[int(sid)] = (1, at_seq)
            return int(sid), parent_sid

        self._check_open()
        found = await self._in_writer(fork)
        if isinstance(found, BaseException):
            raise found
        sid, parent_sid = found
        self._sids[session_id] = sid
        self._parents[sid] = (parent_sid, at_seq)
        return _SqliteWriter(self, session_id, sid, 1, at_seq)

    def _begin_taking_over(self, conn: sqlite3.Connection) -> None:
        """``BEGIN IMMEDIATE`` for a takeover, on the writer thread, trying again every ~millisecond until the busy
        timeout: a writer of another process (or journal) that commits round after round leaves the lock free only
        for moments, and SQLite's own busy wait sleeps up to 100 ms between tries, so it could starve the takeover
        for the whole timeout."""
        deadline = time.monotonic() + self._busy_ms / 1000
        conn.execute("PRAGMA busy_timeout = 1")
        try:
            while True:
                try:
                    conn.execute("BEGIN IMMEDIATE")
                    return
                except sqlite3.OperationalError as exc:
                    code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
                    if code not in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED) or time.monotonic() >= deadline:
                        raise
                time.sleep(0.0005)
        finally:
            conn.execute(f"PRAGMA busy_timeout = {self._busy_ms}")  # as `_set_busy_wait(True)` left it
            self._busy_wait = True

    async def open_writer(self, session_id: str) -> JournalWriter:
        def take() -> tuple[int, int, int] | None:
            conn = self._wc
            self._begin_taking_over(conn)
            try:
                row = conn.execute(
                    "UPDATE journal_sessions SET epoch = epoch + 1 WHERE id = ? RETURNING sid, epoch", (session_id,)
                ).fetchone()
                if row is None:
                    conn.execute("ROLLBACK")
                    return None
                sid = int(row[0])
                epoch, last_seq = conn.execute(_HEAD, (sid,)).fetchone()
                self._commit(conn)
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                raise
            self._heads[sid] = (int(epoch), int(last_seq))
            return sid, int(epoch), int(last_seq)

        self._check_open()
        found = await self._in_writer(take)
        if found is None:
            raise SessionNotFoundError(session_id)
        sid, epoch, last_seq = found
        self._sids[session_id] = sid
        return _SqliteWriter(self, session_id, sid, epoch, last_seq)

    @property
    def _wc(self) -> sqlite3.Connection:
        """The write connection at the journal's own level: at ``FULL``, switched back from the ``NORMAL`` a lazy
        round left it at (see `_write_batch`) before anything else writes through it."""
        conn = self._wconn
        if conn is None:
            raise JournalError("journal is closed")
        if self._lazy_level:
            self._at_level(conn, lazy=False)
        return conn

    def _at_level(self, conn: sqlite3.Connection, *, lazy: bool) -> None:
        """At ``FULL``: the write connection's ``synchronous`` for the next transaction — ``NORMAL`` for a lazy round,
        ``FULL`` for everything else — switched only when it differs from the last one's (a switch is a statement;
        consecutive lazy rounds, a fast loop's every step, need none)."""
        if self._full and self._lazy_level != lazy:
            conn.execute("PRAGMA synchronous=NORMAL" if lazy else "PRAGMA synchronous=FULL")
            self._lazy_level = lazy

    @property
    def _rc(self) -> sqlite3.Connection:
        if self._rconn is None:
            raise JournalError("journal is closed")
        return self._rconn

    def _check_open(self) -> None:
        if self._closed:
            raise JournalError("journal is closed")

    # --- group commit --------------------------------------------------------------------------------------

    async def _append(self, writer: _SqliteWriter, records: Sequence[NewRecord], sync: bool = True) -> list[int]:
        if writer.closed:
            raise JournalError("writer is closed")
        if self._closed:
            raise JournalError("journal is closed")
        if not records:
            return []
        if self._pending_size >= self._max_pending:
            await self._wait_for_room()
        future: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
        self._pending.append((writer.sid, writer.epoch, records, future, writer, sync))
        self._pending_syncs += sync
        self._pending_size += len(records)
        self._pending_bytes += len(records[0].data) if len(records) == 1 else sum(len(r.data) for r in records)
        if not self._leader and self._flusher is None:
            if self._solo and self._unyielded < SOLO_STREAK:
                # The last round had one append: most likely nobody else is writing, so gathering a round
                # would only cost a loop iteration. Still yield every SOLO_STREAK appends (fairness).
                self._unyielded += 1
                self._write_round()
                return await future
            # Lead this round: yield once so that every append ready in this loop iteration joins it.
            self._unyielded = 0
            self._leader = True
            try:
                await asyncio.sleep(0)
            except asyncio.CancelledError:
                self._leader = False
                future.cancel()  # never written: a round skips appends whose caller is gone
                self._start_flusher()
                raise
            self._leader = False
            self._write_round()
        # Not shielded: a caller that gives up cancels only its own future, which the round skips if it has not
        # started, and ignores if it has (the records may then be stored; the session's state decides).
        return await future

    async def _wait_for_room(self) -> None:
        """Back-pressure: wait (bounded) until a round takes the queued appends."""
        try:
            async with asyncio.timeout(self._append_timeout):
                while self._pending_size >= self._max_pending:
                    self._room.clear()
                    await self._room.wait()
        except TimeoutError as exc:
            raise JournalError(f"{self._pending_size} records queued for {self._append_timeout:g} s") from exc
        self._check_open()

    def _take_round(self) -> list[_Append]:
        batch, self._pending, self._pending_size, self._pending_bytes = self._pending, [], 0, 0
        self._pending_syncs = 0
        self._room.set()
        self._solo = len(batch) == 1
        return [item for item in batch if not item[3].done()]

    def _write_round(self) -> None:
        """Write the pending appends now on the event-loop thread if that is cheap, else on the writer thread."""
        if not self._pending or self._flusher is not None:
            return
        lazy = self._full and not self._pending_syncs  # a round that commits without the fdatasync: like NORMAL
        if not (self._pending_size <= INLINE_MAX_RECORDS and self._may_write_inline(self._pending_bytes, lazy)):
            self._start_flusher()
            return
        batch = self._take_round()
        if not batch:
            return
        try:
            results = self._write_batch(batch, inline=True)
        except _WriterBusy:
            # Another connection is writing: wait for it on the writer thread, not on the event loop.
            self._pending[:0] = batch
            self._pending_syncs += sum(a[5] for a in batch)
            self._pending_size += sum(len(a[2]) for a in batch)
            self._pending_bytes += sum(len(r.data) for a in batch for r in a[2])
            self._start_flusher()
            return
        except Exception as exc:  # any storage failure fails every append of the round (fail-closed)
            self._fail(batch, exc)
            return
        self._resolve(batch, results)

    def _start_flusher(self) -> None:
        if self._pending and self._flusher is None:
            self._flusher = asyncio.create_task(self._flush(), name="loopd-journal-flush")

    async def _flush(self) -> None:
        """Write rounds on the writer thread until nothing is pending; one bounded wait per round."""
        try:
            while self._pending:
                batch = self._take_round()
                if not batch:
                    continue
                job = asyncio.wrap_future(self._submit(self._write_batch, batch, False))
                try:
                    async with asyncio.timeout(self._append_timeout):
                        results = await job
                except TimeoutError:
                    self._fail(batch, TimeoutError(f"no commit within {self._append_timeout:g} s"))
                    continue
                except asyncio.CancelledError:
                    if job.done() and not job.cancelled() and job.exception() is None:
                        self._resolve(batch, job.result())  # committed as the cancellation came: say so
                    else:
                        self._fail(batch, JournalError("journal closed during append"))
                    raise
                except Exception as exc:
                    self._fail(batch, exc)
                    continue
                self._resolve(batch, results)
        except BaseException:
            self._fail(self._take_round(), JournalError("journal closed during append"))
            raise
        finally:
            self._flusher = None

    def _fail(self, batch: list[_Append], exc: BaseException) -> None:
        if isinstance(exc, JournalError):
            error: JournalError = exc
        else:
            error = JournalError(f"append failed: {exc}")
            error.__cause__ = exc
        for item in batch:
            if not item[3].done():
                item[3].set_exception(error)

    def _resolve(self, batch: list[_Append], results: _Results) -> None:
        signals = self._signals
        for (sid, _, _, future, writer, _), result in zip(batch, results, strict=True):
            if future.done():
                continue
            if isinstance(result, BaseException):
                future.set_exception(result)
            else:
                writer.last_seq = result[-1]
                future.set_result(result)
                if signals:
                    signal = signals.get(sid)
                    if signal is not None:
                        signal.set()
        if self._wal_pages < self._checkpoint_frames:
            return
        running = self._checkpointing
        if self._wal_frames >= self._restart_frames:
            if not self._writer_idle():  # (a restart already queued keeps it busy)
                return
            self._checkpointing = self._submit(self._restart_wal, running)
        elif running is None or running.done():
            with contextlib.suppress(RuntimeError):  # the reader lane is closed: the journal is closing
                self._checkpointing = self._reader.submit(lambda: self._checkpoint(writer=False))
        else:
            return
        self._wal_pages = 0
        self.checkpoints += 1

    def _restart_wal(self, running: Future[None] | None) -> None:
        """Writer thread, rounds queued behind: wait (bounded) for a checkpoint still running on the reader's
        connection, then copy every frame back here, so that the next round starts the WAL over."""
        if running is not None:
            with contextlib.suppress(Exception):  # it failed or hangs: checkpoint anyway
                running.result(timeout=self._append_timeout)
        self._checkpoint(writer=True)

    def _count_wal(self, estimate: Callable[[], int]) -> None:
        """Add the WAL frames the transaction just committed appended to ``_wal_pages`` (by whoever holds the write
        connection): the growth of the wal-index header's ``mxFrame`` (it starts again from 0 once a checkpoint
        has copied every frame and a writer restarts the WAL), or what ``estimate`` says when it cannot be read."""
        fd = self._shm
        if fd is not None:
            try:
                raw = os.pread(fd, 4, _MX_FRAME)
            except OSError:
                raw = b""
            if len(raw) == 4:
                frames = int.from_bytes(raw, sys.byteorder)
                self._wal_pages += frames - self._wal_frames if frames >= self._wal_frames else frames
                self._wal_frames = frames
                return
        self._wal_pages += estimate()

    def _checkpoint(self, writer: bool) -> None:
        """Copy the WAL back into the database file (on the reader's thread, or the writer's once the WAL must
        restart: see the module docstring); a failure only delays the next one."""
        conn = self._wconn if writer else self._rconn
        if conn is not None:
            with contextlib.suppress(sqlite3.Error):
                if writer:
                    self._at_level(conn, lazy=False)
                conn.execute("PRAGMA wal_checkpoint(PASSIVE)")

    def _commit(self, conn: sqlite3.Connection) -> None:
        """``COMMIT`` on the write connection, by whoever holds it; a FULL commit is timed, and the running estimate
        decides whether the next transactions may run inline (see the module docstring)."""
        if not self._full:
            conn.execute("COMMIT")
            return
        started = _stopwatch()
        conn.execute("COMMIT")
        self._timed_full_commit(_stopwatch() - started)

    def _commit_at(self, conn: sqlite3.Connection, *, lazy: bool) -> None:
        """``COMMIT`` a transaction begun at the level ``lazy`` chose (`_begin_immediate`), and note what the disk
        holds: a lazy commit (no fdatasync) is counted for `sync`; a FULL one's fdatasync covers every frame before
        it, the lazy commits' too."""
        if lazy:
            conn.execute("COMMIT")
            self._lazy_commits += 1  # after the COMMIT: a sync that reads the count after this covers the frames
            self.commits_unsynced += 1
            return
        self._commit(conn)
        if self._full:
            self._synced_gen = self._lazy_commits

    def _timed_full_commit(self, took: float) -> None:
        """A FULL commit took ``took`` seconds: the running estimate, and whether transactions may run inline."""
        estimate = next_commit_estimate(self.full_commit_seconds, took)
        self.full_commit_seconds = estimate
        self._inline = self._inline_commits and estimate <= FULL_INLINE_MAX

    def _begin_immediate(self, inline: bool, *, lazy: bool = False) -> sqlite3.Connection:
        """``BEGIN IMMEDIATE`` on the write connection, by whoever holds it: the writer thread (SQLite's busy timeout)
        or an inline write (no wait: `_WriterBusy` when another connection holds the write lock); at ``FULL`` the
        connection at the level the transaction commits at (``lazy``: ``NORMAL``; see `_write_batch`)."""
        conn = self._wconn
        if conn is None:
            raise JournalError("journal is closed")
        self._at_level(conn, lazy=lazy)
        self._set_busy_wait(not inline)
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            if inline and _is_busy(exc):
                raise _WriterBusy from exc
            raise
        return conn

    def _write_batch(self, plan: _Plan, inline: bool) -> _Results:
        """One transaction for the whole round, on whichever thread holds the write connection. At ``FULL``, a round
        whose appends all said ``sync=False`` commits at ``NORMAL`` (no fdatasync; `sync` makes it durable later):
        the connection is switched to ``NORMAL`` for it and stays there for the next such round, and goes back to
        ``FULL`` before any other transaction or write (`_begin_immediate`, `_wc`), so every other write is ``FULL``
        (a switch per round in each direction was four statements a step of a fast loop: ≈ 9 % of a FULL step)."""
        lazy = self._full and not any(item[5] for item in plan)
        conn = self._begin_immediate(inline, lazy=lazy)
        try:
            results, heads, rows = self._stage(conn, plan)
            self._commit_at(conn, lazy=lazy)
        except BaseException as exc:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            for sid, *_ in plan:  # read them again next time
                self._heads.pop(sid, None)
            if inline and isinstance(exc, sqlite3.OperationalError) and _is_busy(exc):
                raise _WriterBusy from exc
            raise
        self._heads.update(heads)
        self.commits += 1
        self.commits_inline += inline
        self.records_written += len(rows)
        self._uncounted += 1
        if self._uncounted >= WAL_COUNT_EVERY or self._shm is None:  # (estimates, without the -shm file, add up)
            self._uncounted = 0
            self._count_wal(lambda: 2 + len(heads) + sum(len(row[5]) for row in rows) // 3000)
        return results

    def _stage(
        self, conn: sqlite3.Connection, plan: _Plan
    ) -> tuple[_Results, dict[int, tuple[int, int]], list[tuple[int, int, str, int, float, bytearray]]]:
        """Inside the transaction: fence, number and insert the round's records; returns the new heads.

        A record's data is bound as a ``bytearray`` copy: CPython's ``sqlite3`` binds an exact ``bytearray`` (like
        ``int``, ``float`` and ``str``) directly, but sends ``bytes`` through its adapter lookup, which asks its
        protocol type for ``__adapt__`` and formats and discards an ``AttributeError`` every time — about 3,300
        instructions a parameter, 7.7 % of a 100-session append under callgrind, against a copy of a few hundred
        bytes (the stored BLOB and what reads return, ``bytes``, are the same)."""
        (version,) = conn.execute("PRAGMA data_version").fetchone()
        cached = self._heads
        if version != self._data_version:  # another connection committed: no cached head can be trusted
            cached.clear()
            self._data_version = version
        heads: dict[int, tuple[int, int]] = {}
        results: _Results = []
        rows: list[tuple[int, int, str, int, float, bytearray]] = []
        for sid, epoch, records, _, _, _ in plan:
            head = heads.get(sid) or cached.get(sid)
            if head is None:
                row = conn.execute(_HEAD, (sid,)).fetchone()
                head = None if row is None else (int(row[0]), int(row[1]))
            if head is None or head[0] != epoch:
                if head is not None:
                    heads[sid] = head
                results.append(JournalFencedError(f"session writer (epoch {epoch}) was fenced"))
                continue
            first = head[1] + 1
            if len(records) == 1:  # the common append: no generator, no range
                r = records[0]
                heads[sid] = (epoch, first)
                rows.append((sid, first, r.kind, r.version, r.at, bytearray(r.data)))
                results.append([first])
                continue
            heads[sid] = (epoch, first + len(records) - 1)
            rows.extend((sid, first + i, r.kind, r.version, r.at, bytearray(r.data)) for i, r in enumerate(records))
            results.append(list(range(first, first + len(records))))
        if rows:
            conn.executemany(
                "INSERT INTO journal_records (sid, seq, kind, v, at, data) VALUES (?, ?, ?, ?, ?, ?)", rows
            )
        return results, heads, rows

    # --- deferred syncs (FULL) ------------------------------------------------------------------------------

    @property
    def defers_sync(self) -> bool:
        """Whether ``append(sync=False)`` may return before its records are on the disk (``FULL``; see `sync`)."""
        return self._full

    @property
    def unsynced(self) -> bool:
        """Whether a commit made without its fdatasync (``sync=False`` at ``FULL``) is not known to be on the disk."""
        return self._lazy_commits > self._synced_gen

    async def sync(self) -> None:
        """Return once every commit made so far is on the disk: at ``FULL``, those made with ``sync=False`` wait for
        one fdatasync of the WAL — on the event-loop thread while FULL commits are measured to be quick (the same
        estimate and bound as inline FULL commits), else on a thread of its own beside the writer (shared by every
        caller waiting meanwhile), so rounds go on committing while it runs; at ``NORMAL`` at once (a commit there
        survives a process crash, never a power loss). Raises `JournalError` when the fdatasync fails or takes longer
        than `SYNC_TIMEOUT` (fail-closed: the caller's session stops). Every read calls it first, so what a read
        returns is on the disk: no reader sees a record a power loss could take back."""
        target = self._lazy_commits
        if self._synced_gen >= target:
            return
        self._check_open()
        if self._inline and self._sync_job is None:
            # Quick fsyncs (the FULL commits' estimate, which this one feeds too): here, like an inline FULL commit;
            # a round trip to a thread costs more on a small machine than the fdatasync it waits for.
            started = _stopwatch()
            try:
                self._sync_wal()
            except OSError as exc:
                raise JournalError(f"the journal's fdatasync failed: {exc}") from exc
            self._timed_full_commit(_stopwatch() - started)
            return
        while self._synced_gen < target:
            self._check_open()
            job = self._sync_job
            if job is None:
                if self._syncer is None:
                    self._syncer = ThreadPoolExecutor(1, thread_name_prefix="loopd-journal-sync")
                job = self._sync_job = asyncio.wrap_future(self._syncer.submit(self._sync_wal))
                job.add_done_callback(self._sync_done)
            try:
                async with asyncio.timeout(SYNC_TIMEOUT):
                    await asyncio.shield(job)  # a waiter that gives up leaves the fdatasync to the others
            except TimeoutError as exc:
                raise JournalError(f"the journal's fdatasync took longer than {SYNC_TIMEOUT:g} s") from exc
            except OSError as exc:
                raise JournalError(f"the journal's fdatasync failed: {exc}") from exc

    def _sync_done(self, job: asyncio.Future[None]) -> None:
        if self._sync_job is job:
            self._sync_job = None
        if not job.cancelled():
            job.exception()  # retrieved here: every waiter may have given up

    def _sync_wal(self) -> None:
        """On the sync thread: fdatasync the WAL (opened once; again if SQLite made a new file). Every commit counted
        before it started is on the disk when it returns; fdatasync works on the file, whichever descriptor."""
        covered = self._lazy_commits
        wal = f"{self.path}-wal"
        fd = self._wal_fd
        if fd is not None and os.fstat(fd).st_ino != os.stat(wal).st_ino:
            os.close(fd)
            fd = self._wal_fd = None
        if fd is None:
            fd = self._wal_fd = os.open(wal, os.O_RDONLY | os.O_CLOEXEC)
        os.fdatasync(fd)
        self.syncs += 1
        if covered > self._synced_gen:
            self._synced_gen = covered

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

    def _segments(self, conn: sqlite3.Connection, sid: int) -> list[tuple[int, int, int]]:
        """Where a session's records are (reader thread): ``(sid, first seq, last seq)`` ranges in seq order —
        a fork's ancestors' shared prefixes, then its own records (one range for any other session)."""
        segments: list[tuple[int, int, int]] = []
        upto = _LAST
        current: int | None = sid
        while current is not None:
            if current not in self._parents:
                row = conn.execute("SELECT parent_sid, parent_seq FROM journal_sessions WHERE sid = ?", (current,))
                found = row.fetchone()
                self._parents[current] = None if found is None or found[0] is None else (int(found[0]), int(found[1]))
            parent = self._parents[current]
            first = 1 if parent is None else parent[1] + 1
            if first <= upto:
                segments.append((current, first, upto))
            if parent is None:
                break
            current, upto = parent[0], min(upto, parent[1])
        segments.reverse()
        return segments

    async def read(self, session_id: str, from_seq: int = 1, limit: int | None = None) -> list[Record]:
        self._check_open()
        await self.sync()  # (every read: see `sync`)
        sid = await self._sid(session_id)
        if sid is None:
            raise SessionNotFoundError(session_id)

        def fetch() -> list[Record]:
            conn = self._rc
            if self._parents.get(sid, 0) is None:  # not a fork (the common case): one range
                segments = [(sid, 1, _LAST)]
            else:
                segments = self._segments(conn, sid)
            out: list[Record] = []
            for part, first, last in segments:
                left = -1 if limit is None else limit - len(out)
                if left == 0:
                    break
                if last < from_seq:
                    continue
                rows = conn.execute(_READ, (part, max(first, from_seq), last, left)).fetchall()
                # The columns come back as stored: int, str, int, float, bytes.
                out.extend(Record(session_id, s, k, v, d, a) for s, k, v, a, d in rows)
            return out

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
                await wait_event(self._clock, signal, poll_interval)

    async def session(self, session_id: str) -> SessionInfo | None:
        await self.sync()  # (every read: see `sync`)

        def fetch() -> SessionInfo | None:
            row = self._rc.execute(f"{_INFO} WHERE s.id = ?", (session_id,)).fetchone()
            return None if row is None else SessionInfo(row[0], float(row[1]), int(row[2]), row[3], row[4], int(row[5]))

        result: SessionInfo | None = await self._in_reader(fetch)
        return result

    async def sessions(self, *, limit: int = 100) -> list[SessionInfo]:
        await self.sync()  # (every read: see `sync`)

        def fetch() -> list[SessionInfo]:
            rows = self._rc.execute(f"{_INFO} ORDER BY s.created_at DESC LIMIT ?", (limit,)).fetchall()
            return [SessionInfo(r[0], float(r[1]), int(r[2]), r[3], r[4], int(r[5])) for r in rows]

        result: list[SessionInfo] = await self._in_reader(fetch)
        return result

    async def save_snapshot(self, session_id: str, seq: int, schema: str, data: bytes, *, at: float) -> None:
        self._check_open()
        sid = await self._sid(session_id)
        if sid is None:
            raise SessionNotFoundError(session_id)

        # A snapshot is a cache beside records already stored: at FULL it commits without the fdatasync, like a
        # lazy round (the next synced commit, or `sync`, which every read runs first, puts it on the disk; a power
        # loss before that only leaves the previous snapshot, and a restore folds a few more records).
        lazy = self._full

        def save(inline: bool) -> int | None:
            conn = self._begin_immediate(inline, lazy=lazy)
            try:
                row = conn.execute(_HEAD, (sid,)).fetchone()
                last = int(row[1])
                if not 1 <= seq <= last:
                    conn.execute("ROLLBACK")
                    return last
                conn.execute(_SAVE_SNAPSHOT, (sid, seq, schema, at, data))
                self._commit_at(conn, lazy=lazy)
            except BaseException as exc:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                if inline and isinstance(exc, sqlite3.OperationalError) and _is_busy(exc):
                    raise _WriterBusy from exc
                raise
            self._count_wal(lambda: 2 + len(data) // 3000)
            return None

        last, inline = await self._write_inline_or_on_thread(save, len(data), lazy=lazy)
        self.snapshots_inline += inline
        if last is not None:
            raise SnapshotSeqError(f"session {session_id!r} has seqs 1..{last}; no snapshot at {seq}")

    def _may_write_inline(self, size: int = 0, lazy: bool = False) -> bool:
        """Whether a write of ``size`` bytes may run on the event-loop thread now: ``NORMAL`` (or a ``lazy`` round,
        one committed without the fdatasync), no larger than an inline round, the writer thread idle and no flusher
        between its rounds (see the module docstring)."""
        inline = self._inline or (lazy and self._inline_commits)
        return inline and size <= INLINE_MAX_BYTES and self._flusher is None and self._writer_idle()

    async def _write_inline_or_on_thread(
        self, fn: Callable[[bool], _T], size: int = 0, *, lazy: bool = False
    ) -> tuple[_T, bool]:
        """``fn(inline)`` on the event-loop thread when `_may_write_inline` (``lazy``: a commit without the
        fdatasync), else — or when another connection holds the write lock (`_WriterBusy`) — on the writer thread;
        its result and whether it ran inline."""
        if self._may_write_inline(size, lazy):
            try:
                return fn(True), True
            except _WriterBusy:
                pass  # another connection is writing: the writer thread waits for it
        return await self._in_writer(fn, False), False

    async def load_snapshot(self, session_id: str, schema: str, *, upto: int | None = None) -> Snapshot | None:
        self._check_open()
        await self.sync()  # (every read: see `sync`)
        sid = await self._sid(session_id)
        if sid is None:
            raise SessionNotFoundError(session_id)
        limit = _LAST if upto is None else upto

        def fetch() -> Snapshot | None:
            conn = self._rc
            best: Snapshot | None = None
            # The session's own snapshot, and each ancestor's at or before the fork point that bounds its share.
            for part, _first, last in self._segments(conn, sid):
                row = conn.execute(_LOAD_SNAPSHOT, (part, schema, min(last, limit))).fetchone()
                if row is not None and (best is None or int(row[0]) > best.seq):
                    best = Snapshot(int(row[0]), schema, bytes(row[2]), float(row[1]))
            return best

        result: Snapshot | None = await self._in_reader(fetch)
        return result

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True  # no new appends; the accepted ones are written first
        self._start_flusher()
        if self._flusher is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(2 * self._append_timeout):
                    await asyncio.shield(self._flusher)
        job = self._sync_job
        if job is not None:  # a sync on its thread: let it end (bounded) before its descriptor closes
            with contextlib.suppress(Exception):
                async with asyncio.timeout(SYNC_TIMEOUT):
                    await asyncio.shield(job)
        if self.unsynced and self._wconn is not None:
            with contextlib.suppress(OSError):  # (closing the connections checkpoints with a sync anyway)
                self._sync_wal()
        self._wconn = self._rconn = None
        try:
            await self._writer.close()  # each bounded by append_timeout
        finally:
            try:
                await self._reader.close()
            finally:
                if self._shm is not None:
                    os.close(self._shm)
                    self._shm = None
                if self._syncer is not None:
                    self._syncer.shutdown(wait=False)
                    self._syncer = None
                if self._wal_fd is not None and (job is None or job.done()):  # (a hung one keeps it: a leak, no crash)
                    os.close(self._wal_fd)
                    self._wal_fd = None


class _SqliteWriter:
    """A session's writer. Its fields are the journal's to read (``sid``, ``epoch``, ``closed``) and to advance
    (``last_seq``, when a round commits); it appends through the journal's ``append``, handed over at creation."""

    def __init__(
        self,
        journal: SqliteJournal,
        session_id: str,
        sid: int,
        epoch: int,
        last_seq: int,
    ) -> None:
        self._journal = journal
        self._append = journal._append
        self._session_id = session_id
        self.sid = sid
        self.epoch = epoch
        self.last_seq = last_seq
        self.closed = False

    @property
    def session_id(self) -> str:
        return self._session_id

    @property
    def defers_sync(self) -> bool:
        return self._journal.defers_sync

    def append(self, records: Sequence[NewRecord], *, sync: bool = True) -> Coroutine[Any, Any, list[int]]:
        # The journal's coroutine itself (one coroutine per append, not two); it checks `closed` when awaited.
        return self._append(self, records, sync)

    def sync(self) -> Coroutine[Any, Any, None]:
        return self._journal.sync()

    async def aclose(self) -> None:
        self.closed = True
