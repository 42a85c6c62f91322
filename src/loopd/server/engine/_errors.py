"""The Harness Engine's errors: the engine's branch of loop-server's tree, and the adapter errors.

Both are ``loopd.server._errors.LoopServerError``s, so the API layer answers them by their ``type`` like a storage
error; storage's own ``Conflict`` / ``NotFound`` / ``InvalidRecord`` are raised as they are (a changed replay is a
storage ``Conflict``). Engine errors are not storage errors: ``except StorageError`` does not catch them::

    LoopServerError                     .type, .retryable
    ├── HarnessEngineError
    │   ├── CapacityExceeded            too_many_requests (retryable)  every slot of this engine is taken
    │   ├── UnknownTarget               invalid_request                no adapter is configured for the target
    │   ├── GateForbidden               forbidden                      only the asking user answers a gate
    │   └── EngineClosed                service_unavailable (retryable) the engine is shutting down
    └── AdapterError                    raised by adapters; the engine maps them to phases
        ├── ResumeUnsupported           → phase ``unknown`` (the adapter cannot reattach: outcome unproven)
        ├── ObservationLost             → retried later through ``resume`` (the execution may still run)
        └── RemoteError                 a remote harness refused or failed (``_remote``)

Any other exception from an adapter fails the call (phase ``failed``). Must not do: I/O.
"""

from __future__ import annotations

from loopd._infra.errors import UnavailableError
from loopd.server._errors import LoopServerError


class HarnessEngineError(LoopServerError):
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


class EngineClosed(HarnessEngineError, UnavailableError):
    """The engine is closed or closing; another replica (or a restart) will carry on."""

    type = "service_unavailable"
    retryable = True


class AdapterError(LoopServerError):
    """Base of the errors adapters raise on purpose."""


class ResumeUnsupported(AdapterError):
    """The adapter cannot reattach to this execution; its outcome cannot be proven (phase ``unknown``)."""


class ObservationLost(AdapterError):
    """The adapter lost sight of the execution (network, peer restart); the engine resumes it later."""
