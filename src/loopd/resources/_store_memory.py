"""The in-memory store: the store engine over the floor's inline in-memory SQLite (``loopd._infra.sqlite_memory``).

Owns: ``MemoryResourceStore`` — the real ``SemanticStore`` through the SQLite backend on a private ``:memory:``
database whose transactions run on the event loop's thread, with no watch-pump task: each write is dispatched to
the open watches (and the log compacted beyond the event window) before it returns — and the hooks a test twin
needs on top of it: kinds served without a CRD (``serve``), and rare server behaviour on demand (bookmarks,
compaction, ending every watch).
Must not do: Kubernetes semantics of its own (all of them are the engine's), or anything that outlives the process.
"""

from __future__ import annotations

from loopd._infra.database import DatabaseErrors
from loopd._infra.migrations import migrate
from loopd._infra.sqlite_memory import MemorySqliteDatabase, run_inline

from . import _sql as sql
from ._kinds import KindSpec
from ._semantics import SemanticStore
from ._store import StoreOptions
from ._store_sqlite import SqliteBackend


class MemoryResourceStore(SemanticStore):
    """The store engine in memory: the twin's semantics are the store's, by construction."""

    pumps_in_background = False

    @classmethod
    async def open(
        cls, *, options: StoreOptions | None = None, errors: DatabaseErrors | None = None
    ) -> MemoryResourceStore:
        """Open an empty store. Nothing here suspends, so ``loopd._infra.sqlite_memory.run_inline`` can open one
        without an event loop. ``errors`` replaces the database's errors (default: all ``StoreUnavailable``)."""
        database = MemorySqliteDatabase(errors or sql.ERRORS)
        await migrate(database, sql.SCHEMA)
        return await cls._open_on(SqliteBackend(database), options or StoreOptions())

    async def _start(self) -> None:
        await super()._start()
        await self._hub.pump_once()  # the built-in CRDs and the default namespace seeded by the start

    async def _committed(self, start_rv: int, changes: list[sql.Change]) -> None:
        # No pump task: dispatch to the open watches before the write returns, and compact beyond the window.
        await self._hub.pump_once()

    def serve(self, spec: KindSpec) -> None:
        """Serve ``spec`` as if a CRD defined it (no CRD object is stored; a built-in kind is left as it is)."""
        self._registry.register(f"{spec.plural}.{spec.group}", [spec])

    def resource_version(self) -> int:
        """The last committed resourceVersion (read at once: the database is in memory)."""
        return int(run_inline(self.current_resource_version()))

    def compact(self, through_rv: int) -> None:
        """Forget the change history up to ``through_rv``; watches from older versions then get ``Gone``."""
        run_inline(self._compact(through_rv))
        self._hub.compacted(through_rv)

    def send_bookmarks(self) -> None:
        """Make a BOOKMARK due now on every open watch that asked for bookmarks."""
        self._hub.request_bookmarks()

    def end_watches(self) -> None:
        """End every open watch, as a server restart or a dropped connection would."""
        self._hub.end_watches()
