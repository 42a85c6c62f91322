"""A private SQLite file of `loopd harness serve` (its idempotency keys, its model-call records): opened and migrated
by its first use, through the floor's SQLite database (one connection on its own thread, WAL), created 0600 in a 0700
directory when it makes the directory. Every error it raises is the owner's own type (``error``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from loopd._infra.database import DatabaseErrors
from loopd._infra.files import ensure_private_dir
from loopd._infra.migrations import Schema, migrate
from loopd._infra.sqlite import SqliteDatabase, SqliteOptions

__all__ = ["PrivateSqliteFile"]


class PrivateSqliteFile:
    """``path`` holding ``schema``; ``error(message)`` is the owner's error for whatever goes wrong with it."""

    def __init__(
        self,
        path: Path,
        schema: Schema,
        *,
        error: Callable[[str], Exception],
        thread_name: str,
        label: str,
        timeout: float,
    ) -> None:
        self.path = path
        self._schema = schema
        self._error = error
        self._options = SqliteOptions(
            timeout=timeout, reader=False, thread_name=thread_name, label=label, errors=DatabaseErrors.all_as(error)
        )
        self._database: SqliteDatabase | None = None
        self._opening = asyncio.Lock()
        self._closed = False

    async def database(self) -> SqliteDatabase:
        """The open database (opened and migrated now if this is the first use); the owner's error once closed."""
        if self._database is not None:
            return self._database
        async with self._opening:
            if self._database is None:
                if self._closed:
                    raise self._error("the store is closed")
                try:
                    ensure_private_dir(self.path.parent, tighten=False)
                except OSError as exc:
                    raise self._error(str(exc)) from exc
                database = await SqliteDatabase.open(self.path, self._options)
                try:
                    await migrate(database, self._schema)
                except BaseException:
                    await database.aclose()
                    raise
                self._database = database
            return self._database

    async def aclose(self) -> None:
        """Close the file (idempotent); later uses raise the owner's error."""
        async with self._opening:
            self._closed = True
            database, self._database = self._database, None
        if database is not None:
            await database.aclose()
