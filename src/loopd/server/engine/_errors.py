"""The Harness Engine's errors: the engine's additions to the storage error tree, and the adapter errors.

Engine errors extend ``loopd.server.storage.StorageError`` (as the ledger's do), so every layer that maps a
storage error by its ``type`` answers them correctly; storage's own ``Conflict`` / ``NotFound`` /
``InvalidRecord`` are raised as they are (a changed replay is a storage ``Conflict``)::

    StorageError                        .type, .retryable
    └── HarnessEngineError
        ├── CapacityExceeded            too_many_requests (retryable)  every slot of this engine is taken
        ├── UnknownTarget               invalid_request                no adapter is configured for the target
        ├── GateForbidden               forbidden                      only the asking user answers a gate
        └── EngineClosed                service_unavailable (retryable) the engine is shutting down

    AdapterError                        raised by adapters; the engine maps them to phases
    ├── ResumeUnsupported               → phase ``unknown`` (the adapter cannot reattach: outcome unproven)
    └── ObservationLost                 → retried later through ``resume`` (the execution may still run)

Any other exception from an adapter fails the call (phase ``failed``). Must not do: I/O.
"""

from __future__ import annotations

from loopd.server.storage import StorageError


class HarnessEngineError(StorageError):
    """Base of the errors the Harness Engine raises on purpose."""


class CapacityExceeded(HarnessEngineError):
    """Every capacity slot of this engine is taken; nothing was created. Retry later (never auto-retried)."""

    type = "too_many_requests"
    retryable = True


class UnknownTarget(HarnessEngineError):
    """The call names a target no adapter is configured for."""

    type = "invalid_request"


class GateForbidden(HarnessEngineError):
    """A gate answer from someone other than the user who asked."""

    type = "forbidden"


class EngineClosed(HarnessEngineError):
    """The engine is closed or closing; another replica (or a restart) will carry on."""

    type = "service_unavailable"
    retryable = True


class AdapterError(Exception):
    """Base of the errors adapters raise on purpose."""


class ResumeUnsupported(AdapterError):
    """The adapter cannot reattach to this execution; its outcome cannot be proven (phase ``unknown``)."""


class ObservationLost(AdapterError):
    """The adapter lost sight of the execution (network, peer restart); the engine resumes it later."""
