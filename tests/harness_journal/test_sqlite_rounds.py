"""SQLite journal specifics: where a round commits, what keeps the event loop free, layouts and migration.

The contract itself (seqs, atomicity, fencing, replicas) is in test_contract.py; these tests pin down the
mechanics behind its speed: inline commits that never wait for a lock on the event loop, one bounded wait per
round on the writer thread, cached session heads that another replica's commit invalidates, checkpoints that
keep the WAL bounded without holding rounds, and files written by the previous layout.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import TypeVar

import pytest

from loopd.harness import JournalError, JournalFencedError, SessionBusyError, SqliteJournal
from loopd.harness.journal import JournalWriter, NewRecord, _sqlite
from loopd.harness.journal._sqlite import SCHEMA_VERSION, SOLO_STREAK

from .conftest import records

_T = TypeVar("_T")


async def seqs_of(journal: SqliteJournal, session_id: str) -> list[int]:
    return [r.seq for r in await journal.read(session_id)]


def tags_of(rows: list[bytes]) -> list[str]:
    return [json.loads(d)["tag"] for d in rows]


async def while_another_connection_writes(path: Path, write: Awaitable[_T]) -> _T:
    """Run ``write`` while another connection (another process) holds ``path``'s write lock: the event loop keeps
    turning while it waits (a wait on the loop itself would end it before these sleeps do), and it completes once
    that connection commits. Its result."""
    other = sqlite3.connect(path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        other.execute("CREATE TABLE IF NOT EXISTS elsewhere (x)")
        task = asyncio.ensure_future(write)
        for _ in range(20):
            await asyncio.sleep(0.005)
        assert not task.done()
        other.execute("COMMIT")  # the other connection's commit also invalidates the cached session heads
        return await asyncio.wait_for(task, 10)
    finally:
        other.close()


# --- where rounds commit -------------------------------------------------------------------------------------


class _Stopwatch:
    """Stands in for the journal's ``_stopwatch``: each reading is ``step`` seconds after the last,
    so every FULL commit the journal times seems to take ``step`` seconds."""

    def __init__(self, step: float) -> None:
        self.step = step
        self._now = 0.0

    def __call__(self) -> float:
        self._now += self.step
        return self._now


async def test_small_rounds_commit_on_the_event_loop_and_full_sync_once_its_commits_are_quick(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NORMAL rounds commit inline at once; FULL ones once a commit was timed (the first, on the writer thread) and
    the estimate stays within FULL_INLINE_MAX — the fsync is then cheaper than the two thread wake-ups of a hop."""
    monkeypatch.setattr(_sqlite, "_stopwatch", _Stopwatch(_sqlite.FULL_INLINE_MAX / 10))
    normal = await SqliteJournal.open(tmp_path / "normal.db")
    full = await SqliteJournal.open(tmp_path / "full.db", synchronous="FULL")
    off = await SqliteJournal.open(tmp_path / "off.db", synchronous="FULL", inline_commits=False)
    try:
        assert full.full_commit_seconds is None and normal.full_commit_seconds is None
        for journal in (normal, full, off):
            writer = await journal.create_session("s", at=0.0)
            for i in range(20):
                assert await writer.append(records(1, tag=str(i))) == [i + 1]
            assert await seqs_of(journal, "s") == list(range(1, 21))
        assert normal.commits_inline >= 15  # a checkpoint may send a round or two to the writer thread
        assert normal.full_commit_seconds is None
        # The session's row was the first FULL commit timed (on the writer thread): the rounds after it ran inline.
        assert full.commits_inline >= 15 and full.commits == 20 and full.sessions_inline == 0
        assert full.full_commit_seconds == pytest.approx(_sqlite.FULL_INLINE_MAX / 10)
        assert off.commits_inline == 0 and off.commits == 20
    finally:
        for journal in (normal, full, off):
            await journal.aclose()


async def test_full_commits_go_back_to_the_writer_thread_once_they_are_slow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An inline FULL commit blocks the event loop for its fsync: once the running estimate says commits take
    longer than FULL_INLINE_MAX, rounds commit on the writer thread again (and come back when commits are quick)."""
    stopwatch = _Stopwatch(_sqlite.FULL_INLINE_MAX / 10)
    monkeypatch.setattr(_sqlite, "_stopwatch", stopwatch)
    journal = await SqliteJournal.open(tmp_path / "full.db", synchronous="FULL")
    try:
        writer = await journal.create_session("s", at=0.0)
        for _ in range(5):
            await writer.append(records(1))
        inline = journal.commits_inline
        assert inline == 5  # the session's row was the first FULL commit timed (on the writer thread)
        assert journal.sessions_inline == 0
        stopwatch.step = _sqlite.FULL_INLINE_MAX * 100  # the disk got slow: one slow commit is enough
        await writer.append(records(1))
        assert journal.commits_inline == inline + 1  # (timed as it ran inline)
        for _ in range(5):
            await writer.append(records(1))
        assert journal.commits_inline == inline + 1 and journal.commits == 11
        stopwatch.step = _sqlite.FULL_INLINE_MAX / 100  # quick again: the estimate comes down, rounds come back
        for _ in range(40):
            await writer.append(records(1))
        assert journal.commits_inline > inline + 1
        assert await seqs_of(journal, "s") == list(range(1, 52))
        await journal.create_session("t", at=0.0)  # a new session's row is a FULL commit too: timed, and inline now
        assert journal.sessions_inline == 1
    finally:
        await journal.aclose()


def test_the_full_commit_estimate_starts_at_the_first_commit_and_follows_the_newest() -> None:
    assert _sqlite.next_commit_estimate(None, 0.002) == 0.002
    estimate = 0.002
    for _ in range(40):
        estimate = _sqlite.next_commit_estimate(estimate, 0.0001)
    assert estimate == pytest.approx(0.0001, rel=0.01)
    one = _sqlite.next_commit_estimate(0.0001, 0.0101)
    assert one == pytest.approx(0.0001 + _sqlite.FULL_COMMIT_WEIGHT * 0.01)


@pytest.mark.parametrize("shape", ["one large record", "many records of one append", "many appends"])
async def test_a_round_over_the_inline_bounds_commits_on_the_writer_thread(tmp_path: Path, shape: str) -> None:
    """An inline round blocks the event loop for its commit, so rounds past INLINE_MAX_BYTES (or _RECORDS) go to the
    writer thread — whether the bytes come in one record, one append of many or many appends."""
    journal = await SqliteJournal.open(tmp_path / "j.db")
    try:
        writers = [await journal.create_session(f"s{i}", at=0.0) for i in range(3)]
        await asyncio.gather(*(w.append(records(1)) for w in writers))  # no solo streak: the next append leads
        big = b"x" * (_sqlite.INLINE_MAX_BYTES // 2 + 1)
        inline, commits = journal.commits_inline, journal.commits
        if shape == "one large record":
            await writers[0].append([NewRecord("blob", 1, big * 2, 0.0)])
        elif shape == "many records of one append":
            await writers[0].append([NewRecord("blob", 1, big, 0.0), NewRecord("blob", 1, big, 0.0)])
        else:
            await asyncio.gather(*(w.append([NewRecord("blob", 1, big, 0.0)]) for w in writers[:2]))
        assert journal.commits == commits + 1 and journal.commits_inline == inline
        await writers[2].append(records(1))  # the bound counts only what is queued now
        assert journal.commits_inline == inline + 1
    finally:
        await journal.aclose()


async def test_appends_ready_together_share_one_round(tmp_path: Path) -> None:
    journal = await SqliteJournal.open(tmp_path / "j.db")
    try:
        writers = [await journal.create_session(f"s{i}", at=0.0) for i in range(40)]
        before = journal.commits
        results = await asyncio.gather(*(w.append(records(2, tag=w.session_id)) for w in writers))
        assert results == [[1, 2]] * 40
        assert journal.commits - before == 1
        for w in writers:
            assert w.last_seq == 2
            assert await seqs_of(journal, w.session_id) == [1, 2]
    finally:
        await journal.aclose()


async def test_a_writer_appending_in_a_tight_loop_still_lets_other_tasks_run(tmp_path: Path) -> None:
    journal = await SqliteJournal.open(tmp_path / "j.db")
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    try:
        writer = await journal.create_session("s", at=0.0)
        task = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        ticks = 0
        appends = 20 * (SOLO_STREAK + 1)
        for _ in range(appends):
            await writer.append(records(1))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # The appender yielded at least once every SOLO_STREAK + 1 appends.
        assert ticks >= appends // (SOLO_STREAK + 1)
    finally:
        await journal.aclose()


async def test_a_lock_held_by_another_connection_never_blocks_the_event_loop(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    journal = await SqliteJournal.open(path, busy_timeout=10.0)
    try:
        writer = await journal.create_session("s", at=0.0)
        assert await writer.append(records(1, tag="first")) == [1]
        assert await while_another_connection_writes(path, writer.append(records(2, tag="waited"))) == [2, 3]
        assert await writer.append(records(1, tag="after")) == [4]
        stored = await journal.read("s")
        assert [r.seq for r in stored] == [1, 2, 3, 4]
        assert tags_of([r.data for r in stored]) == ["first", "waited", "waited", "after"]
    finally:
        await journal.aclose()


# --- bounded waits and cancellation --------------------------------------------------------------------------


async def test_a_stuck_writer_thread_fails_the_round_within_the_timeout(tmp_path: Path) -> None:
    await (await SqliteJournal.open(tmp_path / "j.db")).aclose()  # created with the usual timeout: the short
    # one below bounds only opening a ready file, then the rounds under test
    journal = await SqliteJournal.open(tmp_path / "j.db", append_timeout=0.3)
    try:
        writer = await journal.create_session("s", at=0.0)
        assert await writer.append(records(1, tag="ok")) == [1]
        release = threading.Event()
        blocker = asyncio.wrap_future(journal._submit(release.wait, 30.0))  # the writer thread hangs until released
        try:
            with pytest.raises(JournalError, match=r"no commit within 0\.3 s"):
                await writer.append(records(1, tag="lost"))
            assert not blocker.done()  # the round failed on its own timeout, while the writer thread was still stuck
        finally:
            release.set()
        await blocker
        # The round that timed out never ran; the journal goes on without a gap.
        assert await writer.append(records(1, tag="later")) == [2]
        assert tags_of([r.data for r in await journal.read("s")]) == ["ok", "later"]
    finally:
        await journal.aclose()


async def test_waiting_for_room_in_a_full_queue_is_bounded_too(tmp_path: Path) -> None:
    await (await SqliteJournal.open(tmp_path / "j.db")).aclose()  # created with the usual timeout: the short
    # one below bounds only opening a ready file, then the rounds under test
    journal = await SqliteJournal.open(tmp_path / "j.db", append_timeout=0.3, max_pending=4)
    try:
        writers = [await journal.create_session(f"s{i}", at=0.0) for i in range(12)]
        release = threading.Event()
        blocker = asyncio.wrap_future(journal._submit(release.wait, 30.0))  # the writer thread hangs until released
        try:
            outcomes = await asyncio.gather(*(w.append(records(1)) for w in writers), return_exceptions=True)
            assert all(isinstance(o, JournalError) for o in outcomes), outcomes
            assert not blocker.done()  # every wait (for room, then for its commit) ended on its own timeout
        finally:
            release.set()
        await blocker
        assert await writers[0].append(records(1)) == [1]
        for w in writers[1:]:
            assert await seqs_of(journal, w.session_id) == []
    finally:
        await journal.aclose()


async def test_an_append_cancelled_before_its_round_is_not_stored(tmp_path: Path) -> None:
    journal = await SqliteJournal.open(tmp_path / "j.db")
    try:
        a = await journal.create_session("a", at=0.0)
        b = await journal.create_session("b", at=0.0)
        lead = asyncio.create_task(a.append(records(1, tag="cancelled")))
        await asyncio.sleep(0)  # `lead` opened a round and yielded to gather it
        follow = asyncio.create_task(b.append(records(1, tag="kept")))
        lead.cancel()
        with pytest.raises(asyncio.CancelledError):
            await lead
        assert await asyncio.wait_for(follow, 10) == [1]
        assert await seqs_of(journal, "a") == []
        assert await a.append(records(1, tag="next")) == [1]
        assert a.last_seq == 1 and b.last_seq == 1
    finally:
        await journal.aclose()


async def test_appends_after_close_are_refused_and_accepted_ones_are_written(tmp_path: Path) -> None:
    journal = await SqliteJournal.open(tmp_path / "j.db")
    writers = [await journal.create_session(f"s{i}", at=0.0) for i in range(30)]
    appends = [asyncio.create_task(w.append(records(1))) for w in writers]
    await asyncio.sleep(0)  # every append is queued in the round
    await journal.aclose()
    assert [await t for t in appends] == [[1]] * 30
    with pytest.raises(JournalError, match="closed"):
        await writers[0].append(records(1))
    reopened = await SqliteJournal.open(tmp_path / "j.db")
    try:
        for w in writers:
            assert await seqs_of(reopened, w.session_id) == [1]
    finally:
        await reopened.aclose()


# --- cached heads and replicas -------------------------------------------------------------------------------


async def test_cached_heads_follow_takeovers_back_and_forth(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    a = await SqliteJournal.open(path)
    b = await SqliteJournal.open(path)
    try:
        on_a = await a.create_session("s", at=0.0)
        assert await on_a.append(records(3, tag="a")) == [1, 2, 3]
        on_b = await b.open_writer("s")
        assert await on_b.append(records(2, tag="b")) == [4, 5]
        with pytest.raises(JournalFencedError):
            await on_a.append(records(1, tag="fenced"))
        # A takes the session back: its cached head (seq 3) must not be used.
        again = await a.open_writer("s")
        assert again.last_seq == 5
        assert await again.append(records(1, tag="a2")) == [6]
        with pytest.raises(JournalFencedError):
            await on_b.append(records(1, tag="fenced"))
        stored = await b.read("s")
        assert [r.seq for r in stored] == [1, 2, 3, 4, 5, 6]
        assert tags_of([r.data for r in stored]) == ["a", "a", "a", "b", "b", "a2"]
        # Sessions on each replica interleave freely, each gap-free.
        others = [await (a if i % 2 else b).create_session(f"o{i}", at=0.0) for i in range(6)]
        for round_ in range(3):
            got = await asyncio.gather(*(w.append(records(1)) for w in others))
            assert got == [[round_ + 1]] * 6
        info = await a.session("s")
        assert info is not None and info.last_seq == 6
    finally:
        await a.aclose()
        await b.aclose()


async def test_the_wal_is_checkpointed_while_rounds_commit_inline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checkpoints beside commits cannot restart the WAL under steady writes; a long WAL is checkpointed with the
    writes held, so the file stays bounded."""
    monkeypatch.setattr(_sqlite, "CHECKPOINT_PAGES", 100)
    monkeypatch.setattr(_sqlite, "WAL_RESTART_FRAMES", 400)
    path = tmp_path / "j.db"
    journal = await SqliteJournal.open(path)
    try:
        writer = await journal.create_session("s", at=0.0)
        big = NewRecord("k", 1, b"x" * 2000, 0.0)
        for _ in range(1500):
            await writer.append([big])
        assert journal.commits_inline > 1000
        # ~2 WAL frames per round: 1,500 rounds without the WAL starting over would leave ~12 MB of it.
        wal = path.with_name(path.name + "-wal")
        assert wal.stat().st_size < 1200 * (4096 + 24)
        assert await seqs_of(journal, "s") == list(range(1, 1501))
    finally:
        await journal.aclose()


async def test_at_full_the_wal_starts_over_every_few_frames_so_its_fsyncs_overwrite(tmp_path: Path) -> None:
    """At FULL every checkpoint restarts the WAL, every FULL_WAL_FRAMES frames: the file stops growing (a growing
    WAL makes each fdatasync commit the file system's journal too), where at NORMAL it grows to WAL_RESTART_FRAMES."""
    sizes = {}
    for level in ("FULL", "NORMAL"):
        path = tmp_path / f"{level}.db"
        journal = await SqliteJournal.open(path, synchronous=level)
        try:
            writer = await journal.create_session("s", at=0.0)
            for _ in range(3 * _sqlite.FULL_WAL_FRAMES):  # a round of one small record writes ~2 frames
                await writer.append(records(1))
            sizes[level] = path.with_name(path.name + "-wal").stat().st_size // (4096 + 24)
            assert await seqs_of(journal, "s") == list(range(1, 3 * _sqlite.FULL_WAL_FRAMES + 1))
            if level == "FULL":
                assert journal.checkpoints >= 4
        finally:
            await journal.aclose()
    assert sizes["FULL"] <= _sqlite.FULL_WAL_FRAMES + 64
    assert sizes["NORMAL"] > 2 * _sqlite.FULL_WAL_FRAMES


async def many_sessions_appending(path: Path, sessions: int, rounds: int) -> tuple[SqliteJournal, int]:
    """``sessions`` writers each appending ``rounds`` records one at a time, all at once; the journal (closed)
    and the WAL's size in frames before it closed."""
    journal = await SqliteJournal.open(path)
    try:
        writers = [await journal.create_session(f"s{i}", at=0.0) for i in range(sessions)]

        async def drive(writer: JournalWriter) -> None:
            for i in range(rounds):
                await writer.append(records(1, tag=str(i)))

        await asyncio.gather(*(drive(w) for w in writers))
        frames = path.with_name(path.name + "-wal").stat().st_size // (4096 + 24)
    finally:
        await journal.aclose()
    return journal, frames


async def test_checkpoints_follow_the_wals_frames_and_never_hold_a_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint every 1,000 frames the WAL really grew by (read from the wal-index: a round over 100
    sessions of small records writes ~17, far fewer than one page per session), and rounds keep committing inline
    meanwhile (the checkpoint runs on the reader's connection)."""
    journal, _ = await many_sessions_appending(tmp_path / "j.db", 100, 120)
    assert journal.commits_inline == journal.commits
    monkeypatch.setattr(_sqlite, "CHECKPOINT_PAGES", 10**9)  # the same workload without checkpoints: its WAL
    _, frames = await many_sessions_appending(tmp_path / "all.db", 100, 120)
    assert frames > 1500
    assert 1 <= journal.checkpoints <= frames // 1000 + 1


# --- layouts -------------------------------------------------------------------------------------------------

_LAYOUT_0 = """
CREATE TABLE journal_sessions (
    sid INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    created_at REAL NOT NULL,
    last_seq INTEGER NOT NULL DEFAULT 0,
    epoch INTEGER NOT NULL DEFAULT 0,
    meta TEXT NOT NULL DEFAULT ''
);
CREATE TABLE journal_records (
    sid INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    kind TEXT NOT NULL,
    v INTEGER NOT NULL,
    at REAL NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (sid, seq)
) WITHOUT ROWID;
"""


def write_layout_0(path: Path) -> None:
    """A journal as the previous build wrote it: two sessions, the second taken over once (epoch 2)."""
    db = sqlite3.connect(path)
    db.executescript(_LAYOUT_0)
    db.execute("INSERT INTO journal_sessions VALUES (1, 'one', 1.0, 3, 1, 'm1')")
    db.execute("INSERT INTO journal_sessions VALUES (2, 'two', 2.0, 2, 2, 'm2')")
    rows = [(1, s, "k", 1, float(s), json.dumps({"tag": f"one/{s}"}).encode()) for s in (1, 2, 3)]
    rows += [(2, s, "k", 1, float(s), json.dumps({"tag": f"two/{s}"}).encode()) for s in (1, 2)]
    db.executemany("INSERT INTO journal_records VALUES (?, ?, ?, ?, ?, ?)", rows)
    db.commit()
    db.close()


async def test_a_new_file_gets_the_append_order_layout(tmp_path: Path) -> None:
    journal = await SqliteJournal.open(tmp_path / "j.db")
    try:
        assert journal.migrated_from is None
        writer = await journal.create_session("s", at=0.0)
        await writer.append(records(2))
    finally:
        await journal.aclose()
    db = sqlite3.connect(tmp_path / "j.db")
    try:
        assert db.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
        assert db.execute("SELECT count(*) FROM journal_records WHERE rowid > 0").fetchone() == (2,)
        indexes = {r[1]: r[2] for r in db.execute("PRAGMA index_list(journal_records)")}
        assert indexes == {"journal_records_sid_seq": 1}  # unique
    finally:
        db.close()


async def test_a_file_of_the_previous_layout_is_migrated_and_goes_on(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    write_layout_0(path)
    journal = await SqliteJournal.open(path)
    try:
        assert journal.migrated_from == 0
        assert [(s.session_id, s.created_at, s.last_seq, s.meta) for s in await journal.sessions()] == [
            ("two", 2.0, 2, "m2"),
            ("one", 1.0, 3, "m1"),
        ]
        stored = await journal.read("one")
        assert [(r.seq, r.kind, r.version, r.at) for r in stored] == [(s, "k", 1, float(s)) for s in (1, 2, 3)]
        assert tags_of([r.data for r in stored]) == ["one/1", "one/2", "one/3"]
        writer = await journal.open_writer("two")
        assert writer.last_seq == 2
        assert await writer.append(records(1, tag="two/new")) == [3]
        with pytest.raises(SessionBusyError):
            await journal.create_session("one", at=9.0)
    finally:
        await journal.aclose()
    db = sqlite3.connect(path)
    try:
        assert db.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
        (epoch,) = db.execute("SELECT epoch FROM journal_sessions WHERE id = 'two'").fetchone()
        assert epoch == 3  # epochs carried over, so a writer of the old build would be fenced
    finally:
        db.close()
    again = await SqliteJournal.open(path)  # a migrated file opens as it is
    try:
        assert again.migrated_from is None
        assert await seqs_of(again, "two") == [1, 2, 3]
    finally:
        await again.aclose()


async def test_a_file_of_a_newer_layout_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(JournalError, match="newer than this build"):
        await SqliteJournal.open(path)


_LAYOUT_2 = """
CREATE TABLE journal_sessions (
    sid INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    created_at REAL NOT NULL,
    epoch INTEGER NOT NULL DEFAULT 0,
    meta TEXT NOT NULL DEFAULT ''
);
CREATE TABLE journal_records (
    id INTEGER PRIMARY KEY,
    sid INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    kind TEXT NOT NULL,
    v INTEGER NOT NULL,
    at REAL NOT NULL,
    data BLOB NOT NULL
);
CREATE UNIQUE INDEX journal_records_sid_seq ON journal_records (sid, seq);
PRAGMA user_version = 2;
"""


async def test_a_file_versioned_by_user_version_alone_keeps_opening(tmp_path: Path) -> None:
    """A layout-2 file made before the floor's migrator (its version in ``PRAGMA user_version``, no
    ``journal_migrations`` table) opens as it is: both steps are recorded as made, and only steps 3 (forks) and 4
    (state snapshots) run."""
    path = tmp_path / "v2.db"
    db = sqlite3.connect(path)
    db.executescript(_LAYOUT_2)
    db.execute("INSERT INTO journal_sessions VALUES (1, 'one', 1.0, 1, 'm1')")
    db.executemany(
        "INSERT INTO journal_records (sid, seq, kind, v, at, data) VALUES (1, ?, 'k', 1, ?, ?)",
        [(s, float(s), json.dumps({"tag": f"one/{s}"}).encode()) for s in (1, 2)],
    )
    db.commit()
    db.close()
    journal = await SqliteJournal.open(path)
    try:
        assert journal.migrated_from is None
        assert tags_of([r.data for r in await journal.read("one")]) == ["one/1", "one/2"]
        writer = await journal.open_writer("one")
        assert await writer.append(records(1, tag="one/3")) == [3]
    finally:
        await journal.aclose()
    db = sqlite3.connect(path)
    try:
        assert db.execute("SELECT version FROM journal_migrations ORDER BY version").fetchall() == [
            (1,),
            (2,),
            (3,),
            (4,),
        ]
        assert db.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
    finally:
        db.close()


async def test_a_file_of_layout_3_gets_state_snapshots_and_keeps_its_records(tmp_path: Path) -> None:
    """A file the previous build made (layout 3: forks, no snapshots table) is migrated by step 4 alone."""
    path = tmp_path / "v3.db"
    journal = await SqliteJournal.open(path)
    try:
        writer = await journal.create_session("one", at=1.0)
        await writer.append(records(3, tag="one"))
        fork = await journal.fork_session("one", 2, "two", at=2.0)
        await fork.append(records(1, tag="two"))
    finally:
        await journal.aclose()
    db = sqlite3.connect(path)  # back to what layout 3 was
    db.execute("DROP TABLE journal_snapshots")
    db.execute("DELETE FROM journal_migrations WHERE version = 4")
    db.execute("PRAGMA user_version = 3")
    db.commit()
    db.close()
    journal = await SqliteJournal.open(path)
    try:
        assert tags_of([r.data for r in await journal.read("two")]) == ["one", "one", "two"]
        assert await journal.load_snapshot("two", "v1") is None
        await journal.save_snapshot("one", 2, "v1", b"one@2", at=3.0)
        got = await journal.load_snapshot("two", "v1")
        assert got is not None and (got.seq, got.data) == (2, b"one@2")
        writer = await journal.open_writer("two")
        assert await writer.append(records(1, tag="two")) == [4]
    finally:
        await journal.aclose()
    db = sqlite3.connect(path)
    try:
        assert db.execute("SELECT max(version) FROM journal_migrations").fetchone() == (4,)
        assert db.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,) == (4,)
    finally:
        db.close()


# --- state snapshots -----------------------------------------------------------------------------------------


async def test_a_small_snapshot_is_saved_on_the_event_loop_and_a_large_one_on_the_writer_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A snapshot handed to the writer thread sends the session's next rounds there too (they commit inline only
    while it is idle), so a small one is saved like a small round; past INLINE_MAX_BYTES it is not. At FULL a snapshot
    commits without the fdatasync (a cache: see test_sqlite_deferred_sync), so it is saved inline even while FULL
    commits are slow, as a deferred round is."""
    stopwatch = _Stopwatch(_sqlite.FULL_INLINE_MAX / 10)
    monkeypatch.setattr(_sqlite, "_stopwatch", stopwatch)
    normal = await SqliteJournal.open(tmp_path / "normal.db")
    full = await SqliteJournal.open(tmp_path / "full.db", synchronous="FULL")
    try:
        writers: dict[SqliteJournal, JournalWriter] = {}
        for journal in (normal, full):
            writers[journal] = await journal.create_session("s", at=0.0)
            await writers[journal].append(records(3))
            await journal.save_snapshot("s", 1, "v1", b"small", at=1.0)
        assert normal.snapshots_inline == 1 and full.snapshots_inline == 1
        big = b"x" * (_sqlite.INLINE_MAX_BYTES + 1)
        await normal.save_snapshot("s", 2, "v1", big, at=2.0)
        assert normal.snapshots_inline == 1
        stopwatch.step = _sqlite.FULL_INLINE_MAX * 100
        await writers[full].append(records(1))  # a FULL commit timed slow: synced rounds go to the writer thread
        assert not full._inline
        await full.save_snapshot("s", 3, "v1", b"small", at=3.0)
        assert full.snapshots_inline == 2  # no fdatasync to wait for: still inline
        await full.save_snapshot("s", 4, "v1", big, at=4.0)
        assert full.snapshots_inline == 2
        for journal, data in ((normal, big), (full, big)):
            got = await journal.load_snapshot("s", "v1")
            assert got is not None and got.data == data
    finally:
        for journal in (normal, full):
            await journal.aclose()


async def test_a_snapshot_waits_for_a_lock_another_connection_holds_on_the_writer_thread(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    journal = await SqliteJournal.open(path, busy_timeout=10.0)
    try:
        writer = await journal.create_session("s", at=0.0)
        await writer.append(records(2))
        await while_another_connection_writes(path, journal.save_snapshot("s", 2, "v1", b"state@2", at=1.0))
        assert journal.snapshots_inline == 0
        got = await journal.load_snapshot("s", "v1")
        assert got is not None and (got.seq, got.data) == (2, b"state@2")
        assert await writer.append(records(1)) == [3]  # and rounds go on
    finally:
        await journal.aclose()


async def test_a_session_is_created_on_the_event_loop_unless_full_or_another_connection_writes(
    tmp_path: Path,
) -> None:
    """A new session is one small row: inserted like a small round when the writer thread is idle (handing it to the
    thread would also send the rounds gathered meanwhile there); at FULL before a commit was timed quick, or when
    another connection holds the write lock, the writer thread does it — the event loop never waits for that lock."""
    path = tmp_path / "j.db"
    normal = await SqliteJournal.open(path, busy_timeout=10.0)
    full = await SqliteJournal.open(tmp_path / "full.db", synchronous="FULL")
    try:
        await normal.create_session("a", at=0.0)
        await full.create_session("a", at=0.0)
        assert (normal.sessions_inline, full.sessions_inline) == (1, 0)
        with pytest.raises(SessionBusyError):
            await normal.create_session("a", at=0.0)  # refused inline as on the thread
        writer = await while_another_connection_writes(path, normal.create_session("b", at=0.0))
        assert normal.sessions_inline == 1
        assert await writer.append(records(2)) == [1, 2]
        assert await normal.session("b") is not None
    finally:
        await normal.aclose()
        await full.aclose()


# --- cancellation -----------------------------------------------------------------------------------------------


async def test_a_wait_on_the_writer_thread_cancelled_as_its_job_finishes_ends_cancelled(tmp_path: Path) -> None:
    """A caller cancelled in the same loop turn as its writer-thread job's result arrives ends cancelled (3.11's
    `asyncio.wait_for` returned the result then and dropped the cancellation: a shutdown waited forever)."""
    journal = await SqliteJournal.open(tmp_path / "j.db")
    release, finished = threading.Event(), threading.Event()

    def job() -> str:
        release.wait(10)
        finished.set()
        return "written"

    try:
        task = asyncio.ensure_future(journal._in_writer(job))
        await asyncio.sleep(0.01)  # the job runs on the writer thread, the task waits for it
        release.set()
        assert finished.wait(10)  # the loop is blocked from here to the cancel: the result and the cancellation
        time.sleep(0.05)  # (the thread hands the result over meanwhile) arrive in the same loop turn
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert task.cancelled()
    finally:
        await journal.aclose()


async def test_a_round_binds_its_records_without_sqlites_adapter_lookup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sqlite3 sends a ``bytes`` parameter through its adapter lookup (which formats and drops an AttributeError each
    time); the journal binds record data as ``bytearray``, which it binds directly. An adapter registered for bytes
    would see every record otherwise."""
    adapted: list[bytes] = []

    def counting(value: bytes) -> bytes:
        adapted.append(value)
        return value

    monkeypatch.setitem(sqlite3.adapters, (bytes, sqlite3.PrepareProtocol), counting)
    journal = await SqliteJournal.open(tmp_path / "j.db")
    try:
        writers = [await journal.create_session(f"s{i}", at=0.0) for i in range(3)]
        await asyncio.gather(*(w.append(records(2, tag=w.session_id)) for w in writers))
        await writers[0].append(records(1, tag="alone"))
        assert adapted == []
        stored = await journal.read("s0")
        assert [type(r.data) for r in stored] == [bytes, bytes, bytes]
        assert tags_of([r.data for r in stored]) == ["s0", "s0", "alone"]
    finally:
        await journal.aclose()


async def test_the_wals_frames_are_counted_once_every_few_rounds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading the WAL's frame count is a ``pread`` of the -shm file: once every `WAL_COUNT_EVERY` rounds, not per
    round (a checkpoint starts at most that many rounds late)."""
    journal = await SqliteJournal.open(tmp_path / "journal.db")
    reads: list[int] = []
    real = _sqlite.os.pread

    def counting(fd: int, size: int, offset: int) -> bytes:
        reads.append(offset)
        return real(fd, size, offset)

    monkeypatch.setattr(_sqlite.os, "pread", counting)
    try:
        writer = await journal.create_session("s", at=0.0)
        rounds = 3 * _sqlite.WAL_COUNT_EVERY
        for _ in range(rounds):
            await writer.append(records(1))
        assert journal.commits >= rounds
        assert len(reads) == journal.commits // _sqlite.WAL_COUNT_EVERY
    finally:
        await journal.aclose()
