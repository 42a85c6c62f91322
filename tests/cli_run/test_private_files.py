"""`loopd run` keeps its transcripts private: the data directory 0700, the journal (and its -wal/-shm) 0600."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from loopd.harness import SqliteJournal
from tests.cli_run.conftest import Dirs, run_captured


@pytest.fixture(autouse=True)
def usual_umask() -> Iterator[None]:
    """The common umask (022): without care, new directories would be 0755 and new files 0644."""
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def test_a_new_data_dir_and_journal_are_private(dirs: Dirs) -> None:
    data_dir = dirs.data_dir / "nested" / "harness"
    result = await run_captured(dirs, data_dir=data_dir, prompt="hello")
    assert result.code == 0, result.stderr
    assert _mode(data_dir) == 0o700
    assert _mode(data_dir.parent) == 0o700  # created on the way: private too
    journal = data_dir / "journal.db"
    assert _mode(journal) == 0o600
    for side in data_dir.iterdir():
        assert _mode(side) & 0o077 == 0, side  # nothing in it is readable by others (-wal, -shm, ...)


async def test_an_existing_world_readable_data_dir_and_journal_are_tightened(dirs: Dirs) -> None:
    dirs.data_dir.mkdir(mode=0o755)
    os.chmod(dirs.data_dir, 0o755)
    journal = dirs.data_dir / "journal.db"
    await (await SqliteJournal.open(journal)).aclose()
    os.chmod(journal, 0o644)
    result = await run_captured(dirs, prompt="hello")
    assert result.code == 0, result.stderr
    assert _mode(dirs.data_dir) == 0o700
    assert _mode(journal) == 0o600


async def test_the_journal_sidecar_files_are_private_while_it_is_open(tmp_path: Path) -> None:
    journal = await SqliteJournal.open(tmp_path / "j" / "journal.db")
    try:
        names = {p.name: _mode(p) for p in (tmp_path / "j").iterdir()}
    finally:
        await journal.aclose()
    assert names["journal.db"] == 0o600
    assert names.get("journal.db-wal", 0o600) == 0o600 and names.get("journal.db-shm", 0o600) == 0o600
    assert "journal.db-wal" in names  # WAL mode: the sidecar exists while open, and it took the file's mode
