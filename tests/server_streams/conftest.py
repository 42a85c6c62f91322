"""Fixtures for message streams: a SQLite server database per test."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from loopd.server.storage import Database, open_database


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[Database]:
    async with open_database(tmp_path / "loopd.db") as database:
        yield database
