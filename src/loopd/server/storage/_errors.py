"""The exception tree of loop-server storage (and of the ledger, which extends it); a branch of `LoopServerError`.

Owns: error types, each carrying the API error ``type`` it maps to and whether retrying can help.
Must not do: I/O, or know about HTTP frameworks (the API layer maps ``type`` to a status code).

::

    StorageError                    .type (API error type), .retryable; a LoopServerError (loopd.server._errors)
    ├── InvalidRecord               invalid_request      a value breaks a rule of the schema (bad enum, bad limit…)
    ├── NotFound                    not_found            the row does not exist (a NotFoundError)
    ├── Conflict                    conflict             the row exists in another state (a ConflictError)
    │   └── Fenced                  conflict             a lease token is stale: this writer lost its lease
    ├── SchemaTooNew                internal_error       the database was migrated by newer code; refuse to run
    ├── CommitOutcomeUnknown        service_unavailable  a COMMIT did not answer in time (or its connection broke):
    │                                                    the writes may or may not have committed. Not retryable
    │                                                    as is: read back what the transaction wrote to learn which,
    │                                                    and never undo side effects blindly
    └── StorageUnavailable          service_unavailable  the database is unreachable, busy, closed or timed out
                                                         (an UnavailableError: retryable; nothing was written)

Driver exceptions (``sqlite3``, ``psycopg``) never escape the backends: they become ``StorageUnavailable`` (or
``Conflict`` for a constraint violation) with the original chained as ``__cause__``.
"""

from __future__ import annotations

from loopd._infra.errors import ConflictError, NotFoundError, UnavailableError
from loopd.server._errors import LoopServerError


class StorageError(LoopServerError):
    """Base of every error the storage layer raises on purpose."""


class InvalidRecord(StorageError):
    """A value breaks a rule of the schema; the caller must change its input."""

    type = "invalid_request"


class NotFound(StorageError, NotFoundError):
    """The addressed row does not exist (yet: a reader may see a Task before its messages commit)."""

    type = "not_found"


class Conflict(StorageError, ConflictError):
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


class StorageUnavailable(StorageError, UnavailableError):
    """The database cannot be reached, is closed, busy or timed out; retry later."""

    type = "service_unavailable"
    retryable = True
