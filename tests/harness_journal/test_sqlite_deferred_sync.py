"""SQLite journal at ``synchronous=FULL``: appends made with ``sync=False`` commit without their fdatasync, and
`SqliteJournal.sync` (or any synced commit after them) puts them on the disk.

What reaches the disk is checked where it can be without pulling a plug: the connection stays at FULL outside such
rounds (`PRAGMA synchronous`), `sync` calls ``fdatasync`` on the WAL file itself (its inode), a read never returns
a record not yet synced, and a failing fdatasync fails the sync with `JournalError`.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from loopd.harness import JournalError, SqliteJournal
from loopd.harness.journal import JournalWriter, MemoryJournal

from .conftest import records

_FULL = 2  # what `PRAGMA synchronous` reads for FULL


class _Fdatasyncs:
    """Stands in for ``os.fdatasync``: records the inode of every file synced, then syncs it for real."""

    def __init__(self) -> None:
        self.inodes: list[int] = []
        self.fail: OSError | None = None
        self._real = os.fdatasync

    def __call__(self, fd: int) -> None:
        if self.fail is not None:
            raise self.fail
        self.inodes.append(os.fstat(fd).st_ino)
        self._real(fd)


@pytest.fixture
def fdatasyncs(monkeypatch: pytest.MonkeyPatch) -> _Fdatasyncs:
    recorder = _Fdatasyncs()
    monkeypatch.setattr(os, "fdatasync", recorder)
    return recorder


def unsynced(journal: SqliteJournal) -> bool:
    """Whether the journal holds commits not known to be on the disk (read afresh each time)."""
    return journal.unsynced


def wal_inode(path: Path) -> int:
    return os.stat(f"{path}-wal").st_ino


@pytest.fixture
async def full(tmp_path: Path) -> AsyncIterator[tuple[SqliteJournal, JournalWriter, Path]]:
    """A journal at FULL on ``full.db``, a session's writer on it, and the file's path."""
    path = tmp_path / "full.db"
    journal = await SqliteJournal.open(path, synchronous="FULL")
    try:
        yield journal, await journal.create_session("s", at=0.0), path
    finally:
        await journal.aclose()


async def test_unsynced_appends_commit_without_the_fdatasync_and_sync_puts_them_on_the_disk(
    full: tuple[SqliteJournal, JournalWriter, Path], fdatasyncs: _Fdatasyncs
) -> None:
    journal, writer, path = full
    assert writer.defers_sync and journal.defers_sync
    for i in range(3):
        assert await writer.append(records(1, tag=str(i)), sync=False) == [i + 1]
    assert journal.commits_unsynced == 3 and unsynced(journal)
    assert journal._wc.execute("PRAGMA synchronous").fetchone()[0] == _FULL  # every other write stays FULL
    assert fdatasyncs.inodes == []
    await writer.sync()
    assert not unsynced(journal) and journal.syncs == 1
    assert fdatasyncs.inodes == [wal_inode(path)]  # the WAL itself, whichever descriptor
    await writer.sync()  # nothing new: no second fdatasync
    assert journal.syncs == 1


async def test_a_state_snapshot_commits_without_the_fdatasync_and_a_read_syncs_it(
    full: tuple[SqliteJournal, JournalWriter, Path], fdatasyncs: _Fdatasyncs
) -> None:
    """A snapshot is a cache beside records already stored: at FULL it commits like a lazy round (no fdatasync of
    its own; the records it covers were synced before it). `load_snapshot`, a read, syncs it first; the next synced
    commit covers it too."""
    journal, writer, path = full
    await writer.append(records(3))  # synced: the records the snapshot covers are on the disk
    statements: list[str] = []
    connection = journal._wconn
    assert connection is not None
    connection.set_trace_callback(statements.append)
    try:
        await journal.save_snapshot("s", 3, "schema-1", b"state at 3", at=1.0)
    finally:
        connection.set_trace_callback(None)
    assert _levels(statements) == ["PRAGMA synchronous=NORMAL"]  # committed at NORMAL
    assert journal.commits_unsynced == 1 and unsynced(journal) and fdatasyncs.inodes == []
    loaded = await journal.load_snapshot("s", "schema-1")
    assert loaded is not None and loaded.seq == 3 and loaded.data == b"state at 3"
    assert not unsynced(journal) and fdatasyncs.inodes == [wal_inode(path)]  # the read synced it first
    await journal.save_snapshot("s", 3, "schema-1", b"again", at=2.0)
    await writer.append(records(1))  # a FULL commit's fdatasync covers the snapshot's frames before it
    assert not unsynced(journal)
    assert journal._wc.execute("PRAGMA synchronous").fetchone()[0] == _FULL


async def test_a_synced_append_covers_the_unsynced_ones_before_it(
    full: tuple[SqliteJournal, JournalWriter, Path], fdatasyncs: _Fdatasyncs
) -> None:
    journal, writer, _ = full
    await writer.append(records(2), sync=False)
    assert unsynced(journal)
    await writer.append(records(1))  # a FULL commit: its fdatasync takes the WAL's earlier frames too
    assert not unsynced(journal)
    await writer.sync()
    assert journal.syncs == 0 and fdatasyncs.inodes == []


async def test_a_read_syncs_first_so_no_reader_sees_a_record_a_power_loss_could_take_back(
    full: tuple[SqliteJournal, JournalWriter, Path], fdatasyncs: _Fdatasyncs
) -> None:
    journal, writer, path = full
    await writer.append(records(2), sync=False)
    assert [r.seq for r in await journal.read("s")] == [1, 2]
    assert not unsynced(journal) and fdatasyncs.inodes == [wal_inode(path)]
    await writer.append(records(1), sync=False)
    info = await journal.session("s")
    assert info is not None and info.last_seq == 3 and not unsynced(journal)
    await writer.append(records(1), sync=False)
    assert [s.last_seq for s in await journal.sessions()] == [4] and not unsynced(journal)


async def test_slow_fsyncs_run_on_the_sync_thread_once_for_every_waiter(
    tmp_path: Path, fdatasyncs: _Fdatasyncs
) -> None:
    """Without quick FULL commits measured (here: none inline at all), the fdatasync runs beside the writer, and
    callers waiting meanwhile share it."""
    path = tmp_path / "full.db"
    journal = await SqliteJournal.open(path, synchronous="FULL", inline_commits=False)
    try:
        a = await journal.create_session("a", at=0.0)
        b = await journal.create_session("b", at=0.0)
        await asyncio.gather(a.append(records(1), sync=False), b.append(records(1), sync=False))
        assert unsynced(journal)
        await asyncio.gather(a.sync(), b.sync(), journal.sync())
        assert journal.syncs == 1 and not unsynced(journal)
        assert fdatasyncs.inodes == [wal_inode(path)]
    finally:
        await journal.aclose()


@pytest.mark.parametrize("inline", [True, False])
async def test_a_failing_fdatasync_fails_the_sync_with_a_journal_error(
    tmp_path: Path, fdatasyncs: _Fdatasyncs, inline: bool
) -> None:
    journal = await SqliteJournal.open(tmp_path / "full.db", synchronous="FULL", inline_commits=inline)
    try:
        writer = await journal.create_session("s", at=0.0)
        await writer.append(records(1), sync=False)
        fdatasyncs.fail = OSError(5, "Input/output error")
        with pytest.raises(JournalError, match="fdatasync failed"):
            await writer.sync()
        assert unsynced(journal)  # still not known to be on the disk
        fdatasyncs.fail = None
        await writer.sync()
        assert not unsynced(journal)
    finally:
        await journal.aclose()


async def test_at_normal_and_in_memory_nothing_is_deferred(tmp_path: Path, fdatasyncs: _Fdatasyncs) -> None:
    """NORMAL never syncs a commit (it survives a process crash, not a power loss): ``sync=False`` changes nothing
    and `sync` returns at once; journals that do not defer say so."""
    normal = await SqliteJournal.open(tmp_path / "normal.db")
    memory = MemoryJournal()
    try:
        for journal in (normal, memory):
            writer = await journal.create_session("s", at=0.0)
            assert not writer.defers_sync
            assert await writer.append(records(2), sync=False) == [1, 2]
            await writer.sync()
            assert [r.seq for r in await journal.read("s")] == [1, 2]
        assert normal.commits_unsynced == 0 and normal.syncs == 0 and not unsynced(normal)
        assert fdatasyncs.inodes == []
    finally:
        await normal.aclose()


async def test_the_sync_descriptor_follows_a_new_wal_file(tmp_path: Path, fdatasyncs: _Fdatasyncs) -> None:
    """The WAL is opened once; if SQLite made a new file meanwhile (another inode), the next sync opens that one."""
    path = tmp_path / "full.db"
    journal = await SqliteJournal.open(path, synchronous="FULL")
    try:
        writer = await journal.create_session("s", at=0.0)
        await writer.append(records(1), sync=False)
        await writer.sync()
        old = journal._wal_fd
        assert old is not None
        stale = os.open(tmp_path, os.O_RDONLY)  # another inode behind the descriptor the journal keeps
        os.dup2(stale, old)
        os.close(stale)
        await writer.append(records(1), sync=False)
        await writer.sync()
        assert fdatasyncs.inodes == [wal_inode(path), wal_inode(path)]
    finally:
        await journal.aclose()


async def test_closing_the_journal_syncs_what_is_still_unsynced(tmp_path: Path, fdatasyncs: _Fdatasyncs) -> None:
    path = tmp_path / "full.db"
    journal = await SqliteJournal.open(path, synchronous="FULL")
    writer = await journal.create_session("s", at=0.0)
    await writer.append(records(1), sync=False)
    inode = wal_inode(path)
    await journal.aclose()
    assert fdatasyncs.inodes[:1] == [inode] and not unsynced(journal)


def _levels(statements: list[str]) -> list[str]:
    return [s for s in statements if s.startswith("PRAGMA synchronous")]


async def test_the_level_switches_only_when_a_round_needs_another_and_every_other_write_runs_at_full(
    full: tuple[SqliteJournal, JournalWriter, Path], fdatasyncs: _Fdatasyncs
) -> None:
    journal, writer, _ = full
    statements: list[str] = []
    connection = journal._wconn
    assert connection is not None
    connection.set_trace_callback(statements.append)
    try:
        for i in range(3):  # a fast loop's deferred steps: one switch to NORMAL, then none
            await writer.append(records(1, tag=str(i)), sync=False)
        assert _levels(statements) == ["PRAGMA synchronous=NORMAL"]
        assert statements.index("PRAGMA synchronous=NORMAL") < statements.index("BEGIN IMMEDIATE")
        statements.clear()
        await writer.append(records(1, tag="synced"))  # a synced round commits at FULL again
        assert _levels(statements) == ["PRAGMA synchronous=FULL"]
        assert statements.index("PRAGMA synchronous=FULL") < statements.index("BEGIN IMMEDIATE")
        assert not unsynced(journal)  # its commit's fdatasync covers the deferred ones before it
        await writer.append(records(1, tag="again"), sync=False)
        statements.clear()
        await journal.create_session("other", at=0.0)  # not a round: it writes at FULL too
        assert _levels(statements) == ["PRAGMA synchronous=FULL"]
        insert = next(i for i, s in enumerate(statements) if s.startswith("INSERT INTO journal_sessions"))
        assert statements.index("PRAGMA synchronous=FULL") < insert
    finally:
        connection.set_trace_callback(None)
    assert journal._wc.execute("PRAGMA synchronous").fetchone()[0] == _FULL
