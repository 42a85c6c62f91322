"""The seam between repositories and a database driver.

Owns: the ``Connection`` protocol (SQL with ``?`` placeholders; backends translate) and the ``Backend`` protocol
(transactions, closing). Must not do: SQL of any table.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Literal, Protocol

Dialect = Literal["sqlite", "postgres"]


class Connection(Protocol):
    """One open transaction. Every call is bounded by the database's operation timeout."""

    async def fetch(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]: ...

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run a statement; returns the number of rows it changed."""
        ...


class Backend(Protocol):
    @property
    def dialect(self) -> Dialect: ...

    def transaction(self, *, read_only: bool) -> AbstractAsyncContextManager[Connection]:
        """A transaction that commits when the block ends normally and rolls back when it raises."""
        ...

    async def aclose(self) -> None: ...
