"""What every SQL database of loopd offers its users, whichever the engine: transactions of ``?``-placeholder SQL.

Owns: the ``Connection`` protocol (one open transaction), the ``Database`` protocol (``loopd._infra.sqlite`` and
``loopd._infra.postgres`` implement it; ``loopd._infra.migrations`` runs on it), ``DatabaseErrors`` (the hooks
through which a user of the floor gets its own exception types) and the floor's default exception types.
Must not do: SQL of any table, or driver details.

Errors: a driver exception never escapes the floor. It becomes ``errors.unavailable(message)`` (unreachable,
busy, closed, timed out; nothing was written), ``errors.conflict(message)`` (a constraint was violated) or, for a
``COMMIT`` whose outcome could not be settled, ``errors.outcome_unknown(message)``, with the original chained as
``__cause__``. The migrator raises ``errors.too_new`` and ``errors.invalid_schema``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from loopd._infra.errors import ConflictError, LoopdError, UnavailableError

Dialect = Literal["sqlite", "postgres"]


class DatabaseError(LoopdError):
    """Base of the floor's default database errors (used when a caller passes no ``DatabaseErrors`` of its own)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class DatabaseUnavailable(DatabaseError, UnavailableError):
    """The database cannot be reached, is closed, busy or timed out; nothing was written; retry later."""


class ConstraintViolation(DatabaseError, ConflictError):
    """A statement broke a constraint (unique key, not null, …)."""


class CommitOutcomeUnknown(DatabaseError):
    """A ``COMMIT`` did not answer in time or lost its connection: its writes may or may not be stored."""


class SchemaTooNew(DatabaseError):
    """The database was migrated by newer code; this code refuses to use it (databases are never downgraded)."""


class InvalidSchema(DatabaseError):
    """A list of migrations is not numbered 1, 2, 3…"""


@dataclass(frozen=True, slots=True)
class DatabaseErrors:
    """The exception types a database raises, as factories taking the message (each layer passes its own)."""

    unavailable: Callable[[str], Exception] = DatabaseUnavailable
    conflict: Callable[[str], Exception] = ConstraintViolation
    outcome_unknown: Callable[[str], Exception] = CommitOutcomeUnknown
    too_new: Callable[[str], Exception] = SchemaTooNew
    invalid_schema: Callable[[str], Exception] = InvalidSchema

    @classmethod
    def all_as(cls, error: Callable[[str], Exception]) -> DatabaseErrors:
        """Every failure as ``error`` (for a layer with one storage error type)."""
        return cls(unavailable=error, conflict=error, outcome_unknown=error, too_new=error, invalid_schema=error)


class Connection(Protocol):
    """One open transaction. SQL uses ``?`` placeholders (translated per engine); every call is bounded by the
    database's timeout."""

    async def fetch(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]: ...

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run a statement; returns the number of rows it changed."""
        ...


class Database(Protocol):
    @property
    def dialect(self) -> Dialect: ...

    @property
    def errors(self) -> DatabaseErrors: ...

    def transaction(self, *, read_only: bool) -> AbstractAsyncContextManager[Connection]:
        """A transaction that commits when the block ends normally and rolls back when it raises."""
        ...

    async def aclose(self) -> None: ...
