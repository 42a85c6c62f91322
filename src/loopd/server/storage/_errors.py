"""The one exception tree of loop-server storage (and of the ledger, which extends it).

Owns: error types, each carrying the API error ``type`` it maps to and whether retrying can help.
Must not do: I/O, or know about HTTP frameworks (the API layer maps ``type`` to a status code).

::

    StorageError                    .type (API error type), .retryable
    ├── InvalidRecord               invalid_request      a value breaks a rule of the schema (bad enum, bad limit…)
    ├── NotFound                    not_found            the row does not exist
    ├── Conflict                    conflict             the row exists in a different state; re-read, then decide
    │   └── Fenced                  conflict             a lease token is stale: this writer lost its lease
    ├── SchemaTooNew                internal_error       the database was migrated by newer code; refuse to run
    ├── CommitOutcomeUnknown        service_unavailable  a COMMIT did not answer in time (or its connection broke):
    │                                                    the writes may or may not have committed. Not retryable
    │                                                    as is: read back what the transaction wrote to learn which,
    │                                                    and never undo side effects blindly
    └── StorageUnavailable          service_unavailable  the database is unreachable, busy, closed or timed out
                                                         (retryable; nothing was written)

Driver exceptions (``sqlite3``, ``psycopg``) never escape the backends: they become ``StorageUnavailable`` (or
``Conflict`` for a constraint violation) with the original chained as ``__cause__``.
"""

from __future__ import annotations

from typing import ClassVar


class StorageError(Exception):
    """Base of every error the storage layer raises on purpose."""

    type: ClassVar[str] = "internal_error"
    retryable: ClassVar[bool] = False

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidRecord(StorageError):
    """A value breaks a rule of the schema; the caller must change its input."""

    type = "invalid_request"


class NotFound(StorageError):
    """The addressed row does not exist (yet: a reader may see a Task before its messages commit)."""

    type = "not_found"


class Conflict(StorageError):
    """The row exists in a state that contradicts the request (different parameters, stale revision, …)."""

    type = "conflict"


class Fenced(Conflict):
    """A write under a lease whose token is no longer current: another holder owns the resource now."""


class SchemaTooNew(StorageError):
    """The database schema is newer than this code understands; upgrade the code, never downgrade the data."""


class CommitOutcomeUnknown(StorageError):
    """A write transaction's COMMIT timed out or lost its connection, and whether it committed could not be
    settled: its writes may be stored. Resolve by reading back a row the transaction wrote (by its id); until then,
    neither retry the writes nor compensate for them."""

    type = "service_unavailable"


class StorageUnavailable(StorageError):
    """The database cannot be reached, is closed, busy or timed out; retry later."""

    type = "service_unavailable"
    retryable = True
