"""The store's schema goes through the floor's migrator; a store file made before it (tables only, no
``resource_migrations``) keeps opening with its objects."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from loopd.resources import TASK_KIND, open_sqlite_store
from tests.resources.helpers import task


async def test_a_store_made_before_the_migrator_keeps_opening(tmp_path: Path) -> None:
    path = tmp_path / "resources.db"
    async with open_sqlite_store(path) as store:
        await store.create(TASK_KIND, task("kept"), namespace="default")
    old = sqlite3.connect(path, isolation_level=None)
    try:
        old.execute("DROP TABLE resource_migrations")  # what a store of the previous scheme looks like
    finally:
        old.close()
    async with open_sqlite_store(path) as store:
        assert (await store.get(TASK_KIND, "kept", namespace="default"))["metadata"]["name"] == "kept"
    check = sqlite3.connect(path)
    try:
        assert check.execute("SELECT version, name FROM resource_migrations").fetchall() == [
            (1, "objects, owner index, event log, counters")
        ]
    finally:
        check.close()
