"""The one exception tree of the resource layer, and its Kubernetes ``Status`` form.

Owns: error types, their HTTP code and Kubernetes ``StatusReason``, and the conversion to and from ``Status``
bodies. Must not do: I/O, or know about HTTP frameworks.

::

    ResourceError                 .code (HTTP), .reason (k8s StatusReason), .retryable; a LoopdError
    ├── BadRequest            400
    ├── Unauthorized          401
    ├── Forbidden             403
    ├── NotFound              404  (a NotFoundError)
    ├── MethodNotAllowed      405
    ├── AlreadyExists         409  (a ConflictError)
    ├── Conflict              409  retryable: re-read and retry (a ConflictError)
    ├── Gone                  410  retryable: relist, then watch again
    ├── RequestTooLarge       413
    ├── UnsupportedMediaType  415
    ├── Invalid               422  .causes name the offending fields
    ├── StoreUnavailable      503  retryable: the database is unreachable or timed out (an UnavailableError)
    └── SchemaConversionError      a kind's JSON Schema has no structural OpenAPI form (``_schemas``; a ValueError)

The reconcile runtime adds ``ReconcileError`` (``reconcile._errors``) and the client its own (``client._errors``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from loopd._infra.errors import ConflictError, LoopdError, NotFoundError, UnavailableError


@dataclass(frozen=True)
class Cause:
    """One field-level reason of an ``Invalid`` error (Kubernetes ``StatusCause``)."""

    reason: str
    message: str
    field: str

    def to_dict(self) -> dict[str, str]:
        return {"reason": self.reason, "message": self.message, "field": self.field}


@dataclass(frozen=True)
class ErrorDetails:
    """Which object an error is about (Kubernetes ``StatusDetails`` without causes)."""

    name: str = ""
    group: str = ""
    kind: str = ""  # the resource plural, as Kubernetes puts it in Status.details.kind


class ResourceError(LoopdError):
    """Base of every error the resource layer raises on purpose."""

    code: ClassVar[int] = 500
    reason: ClassVar[str] = "InternalError"
    retryable: ClassVar[bool] = False

    def __init__(self, message: str, *, details: ErrorDetails | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details or ErrorDetails()

    def to_status(self) -> dict[str, Any]:
        """The Kubernetes ``Status`` body for this error."""
        details: dict[str, Any] = {}
        if self.details.name:
            details["name"] = self.details.name
        if self.details.group:
            details["group"] = self.details.group
        if self.details.kind:
            details["kind"] = self.details.kind
        causes = self._causes()
        if causes:
            details["causes"] = [cause.to_dict() for cause in causes]
        status: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if details:
            status["details"] = details
        return status

    def _causes(self) -> tuple[Cause, ...]:
        return ()


class BadRequest(ResourceError):
    code = 400
    reason = "BadRequest"


class Unauthorized(ResourceError):
    code = 401
    reason = "Unauthorized"


class Forbidden(ResourceError):
    code = 403
    reason = "Forbidden"


class NotFound(ResourceError, NotFoundError):
    code = 404
    reason = "NotFound"


class MethodNotAllowed(ResourceError):
    code = 405
    reason = "MethodNotAllowed"


class AlreadyExists(ResourceError, ConflictError):
    code = 409
    reason = "AlreadyExists"


class Conflict(ResourceError, ConflictError):
    code = 409
    reason = "Conflict"
    retryable = True


class Gone(ResourceError):
    code = 410
    reason = "Expired"
    retryable = True


class RequestTooLarge(ResourceError):
    code = 413
    reason = "RequestEntityTooLarge"


class UnsupportedMediaType(ResourceError):
    code = 415
    reason = "UnsupportedMediaType"


class Invalid(ResourceError):
    code = 422
    reason = "Invalid"

    def __init__(self, message: str, *, causes: tuple[Cause, ...] = (), details: ErrorDetails | None = None):
        super().__init__(message, details=details)
        self.causes = causes

    def _causes(self) -> tuple[Cause, ...]:
        return self.causes


class StoreUnavailable(ResourceError, UnavailableError):
    code = 503
    reason = "ServiceUnavailable"
    retryable = True


_BY_REASON: dict[str, type[ResourceError]] = {
    cls.reason: cls
    for cls in (
        BadRequest,
        Unauthorized,
        Forbidden,
        NotFound,
        MethodNotAllowed,
        AlreadyExists,
        Conflict,
        Gone,
        RequestTooLarge,
        UnsupportedMediaType,
        Invalid,
        StoreUnavailable,
    )
}
_BY_CODE: dict[int, type[ResourceError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    405: MethodNotAllowed,
    409: Conflict,
    410: Gone,
    413: RequestTooLarge,
    415: UnsupportedMediaType,
    422: Invalid,
    503: StoreUnavailable,
}


def error_from_status(status: Mapping[str, Any]) -> ResourceError:
    """Map a Kubernetes ``Status`` body back to the exception tree (``ResourceError`` when unknown)."""
    reason = str(status.get("reason") or "")
    code = status.get("code")
    cls = _BY_REASON.get(reason) or (_BY_CODE.get(code) if isinstance(code, int) else None) or ResourceError
    message = str(status.get("message") or reason or "unknown error")
    raw_details = status.get("details")
    details_map: Mapping[str, Any] = raw_details if isinstance(raw_details, Mapping) else {}
    details = ErrorDetails(
        name=str(details_map.get("name") or ""),
        group=str(details_map.get("group") or ""),
        kind=str(details_map.get("kind") or ""),
    )
    if cls is Invalid:
        raw_causes = details_map.get("causes")
        causes = tuple(
            Cause(str(c.get("reason", "")), str(c.get("message", "")), str(c.get("field", "")))
            for c in (raw_causes if isinstance(raw_causes, list) else [])
            if isinstance(c, Mapping)
        )
        return Invalid(message, causes=causes, details=details)
    return cls(message, details=details)
