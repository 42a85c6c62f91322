"""Errors a reconciler raises to tell the runtime what to do next (Kopf's idea).

Owns: ``ReconcileError`` and its two retry policies. Must not do: I/O.

::

    ReconcileError               base; not raised by the runtime itself (a LoopdError)
    ├── TemporaryError           retry: after ``delay`` seconds, or with the key's exponential backoff
    └── PermanentError           do not retry; the key waits for its next event

Any other exception from ``reconcile`` is treated like ``TemporaryError()`` (per-key exponential backoff);
``asyncio.CancelledError`` is never caught.
"""

from __future__ import annotations

from loopd._infra.errors import LoopdError


class ReconcileError(LoopdError):
    """Base of the errors that carry a retry policy."""


class TemporaryError(ReconcileError):
    """The reconcile failed for now; retry after ``delay`` seconds (``None``: the key's backoff)."""

    retryable = True

    def __init__(self, message: str = "", *, delay: float | None = None) -> None:
        super().__init__(message)
        if delay is not None and delay < 0:
            raise ValueError("delay must not be negative")
        self.delay = delay


class PermanentError(ReconcileError):
    """The reconcile cannot succeed by retrying; wait for the object to change."""
