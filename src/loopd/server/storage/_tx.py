"""The handle repositories work through: one open transaction, its dialect and the database clock.

Owns: ``TransactionCore`` (fetch / fetch_one / execute, ``now()``, ``new_id()``, row-lock clauses per dialect).
Must not do: SQL of any table, or commit/rollback (the ``Database`` that opened the transaction does).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, TypeVar

from loopd._infra.clock import Clock
from loopd._infra.database import Connection, Dialect
from loopd._infra.ids import new_id

_M = TypeVar("_M")

MAX_PARAMETERS = 4096
"""Bound values per statement `TransactionCore.insert_rows` writes (SQLite allows 32,766, PostgreSQL 32,767)."""


class SeenRows:
    """Ids of rows this transaction found or wrote that nothing ever deletes (conversations, messages): a later
    existence check of one of them in the same transaction needs no statement (kept with `TransactionCore.memo`);
    and the Task of each message it read or wrote (fixed when the message is stored), which a later look needs no
    statement for either. Gone with the transaction, whatever its outcome."""

    __slots__ = ("conversations", "message_tasks", "messages")

    def __init__(self) -> None:
        self.conversations: set[str] = set()
        self.messages: set[str] = set()
        self.message_tasks: dict[str, str | None] = {}


class TransactionCore:
    def __init__(
        self,
        conn: Connection,
        dialect: Dialect,
        clock: Clock,
        *,
        read_only: bool,
        ids: Callable[[], str] = new_id,
    ) -> None:
        self._conn = conn
        self.dialect: Dialect = dialect
        self._clock = clock
        self._ids = ids
        self.read_only = read_only
        self._after_commit: list[Callable[[], None]] = []
        self._memos: dict[object, Any] = {}
        self._now: datetime | None = None

    def memo(self, key: type[_M], make: Callable[[], _M]) -> _M:
        """The value kept under ``key`` for this transaction's life (``make()`` the first time): what a layer
        remembers of what it did in this transaction, shared by everything that joins it."""
        found = self._memos.get(key)
        if found is None:
            found = self._memos[key] = make()
        return found

    def new_id(self) -> str:
        """A new UUIDv7, larger than every id this database handle made before (ids are paging cursors)."""
        return self._ids()

    def now(self) -> datetime:
        """The transaction's time: wall time on the database's clock (injectable, so tests control expiry and
        deadlines) when the transaction first asked, the same instant for everything it writes after — as
        PostgreSQL's ``now()`` is the transaction's start. One instant also writes as text once (`time_text`
        remembers it) where a transaction's rows asked the clock a dozen times."""
        now = self._now
        if now is None:
            now = self._now = self._clock.now()
        return now

    @property
    def for_update(self) -> str:
        """Suffix that locks the selected rows until commit (PostgreSQL); SQLite writers are serialized anyway."""
        return " FOR UPDATE" if self.dialect == "postgres" and not self.read_only else ""

    @property
    def for_share(self) -> str:
        """Suffix that keeps the selected rows from changing until commit (PostgreSQL)."""
        return " FOR SHARE" if self.dialect == "postgres" and not self.read_only else ""

    async def fetch(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return await self._conn.fetch(sql, params)

    async def fetch_one(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        rows = await self._conn.fetch(sql, params)
        return rows[0] if rows else None

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run a statement; returns how many rows it changed."""
        return await self._conn.execute(sql, params)

    async def insert_rows(self, table: str, columns: str, rows: Sequence[Sequence[Any]]) -> None:
        """INSERT ``rows`` (each the values of ``columns``, in order) with multi-row statements: one per
        `MAX_PARAMETERS` values, well under every driver's limit, instead of one statement per row."""
        if not rows:
            return
        width = len(rows[0])
        per_statement = max(1, MAX_PARAMETERS // width)
        row = "(" + ", ".join(["?"] * width) + ")"
        for start in range(0, len(rows), per_statement):
            chunk = rows[start : start + per_statement]
            await self._conn.execute(
                f"INSERT INTO {table} ({columns}) VALUES " + ", ".join([row] * len(chunk)),
                [value for values in chunk for value in values],
            )
