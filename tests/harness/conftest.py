from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from loopd.harness import Journal, MemoryJournal, SqliteJournal


@pytest.fixture(params=["sqlite", "memory"])
async def journal(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Journal]:
    j: Journal
    if request.param == "sqlite":
        j = await SqliteJournal.open(tmp_path / "journal.db")
    else:
        j = MemoryJournal()
    yield j
    await j.aclose()


@pytest.fixture
async def sqlite_journal(tmp_path: Path) -> AsyncIterator[SqliteJournal]:
    j = await SqliteJournal.open(tmp_path / "journal.db")
    yield j
    await j.aclose()
