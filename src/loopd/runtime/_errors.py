"""The runtime's one error tree: loop-server's JSON envelope (and a lost connection) as typed exceptions.

Owns: the classes and the mapping of an HTTP answer to them. Must not do: I/O, or retry (the client decides).

::

    RuntimeApiError             .status (HTTP, 0 without an answer), .type (the envelope's), .message; a LoopdError
    ├── InvalidRequest          400  the request is malformed (also ``cursor_ahead``, 413, 415)
    │   └── Invalid                  422 from the Kubernetes API: the object breaks its schema (``causes``)
    ├── Unauthorized            401  no valid token
    ├── Forbidden               403  the caller may not do this (another responder's Task, a user-only route)
    ├── NotFound                404  (a NotFoundError) gone or never visible to the caller
    │   └── TaskNotReady             ``task.get`` before the question committed: the runtime requeues shortly
    ├── Conflict                409  (a ConflictError) same key, other parameters; completion has begun
    │   └── AlreadyExists            ``rt.resources(M).create`` of a name that exists
    ├── CapacityFull            429  retryable, after ``retry_after`` seconds when the server said so
    ├── Unavailable             503 or no answer (connection refused, timeout); retryable (an UnavailableError)
    ├── ServerFailure           500 and other 5xx: a bug on the server; not retried
    └── InvalidResponse         an answer lacks a field this runtime needs (a server of another version; a ValueError)

Calls on domain resources (``rt.resources(M)``, the Kubernetes API) raise the same tree: ``error_from_resource``
maps ``loopd.resources.ResourceError`` onto it (a lost connection or a 5xx → ``Unavailable``; 429 → ``CapacityFull``).

Inside ``task.watch`` a reconciler's ``RuntimeApiError`` becomes a requeue with the key's backoff (``CapacityFull``
after its ``retry_after``), logged with the task id; ``TaskNotReady`` a short requeue without a log line.
"""

from __future__ import annotations

from typing import Any, ClassVar

import httpx

import loopd.resources as kube
from loopd._infra.errors import ConflictError, LoopdError, NotFoundError, UnavailableError
from loopd.resources import ResourceError
from loopd.resources.client import TooManyRequests, TransportError

__all__ = [
    "AlreadyExists",
    "CapacityFull",
    "Conflict",
    "Forbidden",
    "Invalid",
    "InvalidRequest",
    "NotFound",
    "RuntimeApiError",
    "ServerFailure",
    "TaskNotReady",
    "Unauthorized",
    "Unavailable",
    "error_from_resource",
    "error_from_response",
]


class RuntimeApiError(LoopdError):
    """loop-server refused a request, or could not be reached."""

    status: ClassVar[int] = 0

    def __init__(self, message: str, *, type: str = "", status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.type = type
        if status is not None:
            self.status = status  # type: ignore[misc]  # the instance's real code (e.g. 502 for a ServerFailure)


class InvalidRequest(RuntimeApiError):
    """400: the request is malformed (fix the call; retrying the same one fails the same way)."""

    status = 400


class Invalid(InvalidRequest):
    """422 from the Kubernetes API: the object breaks its kind's schema or a validation rule (an immutable spec);
    ``causes`` lists ``(reason, field, message)`` as the API said."""

    status = 422

    def __init__(
        self, message: str, *, type: str = "", status: int | None = None, causes: tuple[tuple[str, str, str], ...] = ()
    ) -> None:
        super().__init__(message, type=type, status=status)
        self.causes = causes


class Unauthorized(RuntimeApiError):
    """401: the token is missing or not valid for this server."""

    status = 401


class Forbidden(RuntimeApiError):
    """403: the caller is known but may not do this."""

    status = 403


class NotFound(RuntimeApiError, NotFoundError):
    """404: the thing does not exist, or the caller may not see it."""

    status = 404


class TaskNotReady(NotFound):
    """``task.get`` found no context yet: the Task is visible before its question committed (the commit window).
    Inside a reconcile the runtime requeues the Task shortly; outside one, retry a moment later."""


class Conflict(RuntimeApiError, ConflictError):
    """409: the thing exists in another state (same key with other parameters, completion begun, output ended)."""

    status = 409


class AlreadyExists(Conflict):
    """409 from the Kubernetes API: an object of that name exists already."""


class CapacityFull(RuntimeApiError):
    """429: the server is full (harness call slots); retry after ``retry_after`` seconds (None: back off)."""

    status = 429
    retryable = True

    def __init__(self, message: str, *, type: str = "", status: int | None = None, retry_after: float | None = None):
        super().__init__(message, type=type, status=status)
        self.retry_after = retry_after


class Unavailable(RuntimeApiError, UnavailableError):
    """503, or no answer at all (connection refused or reset, timeout): nothing is known to have happened."""

    status = 503
    retryable = True


class ServerFailure(RuntimeApiError):
    """500 or another 5xx: the server failed on this request (a bug); not retried."""

    status = 500


_BY_STATUS: dict[int, type[RuntimeApiError]] = {
    400: InvalidRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: InvalidRequest,
    415: InvalidRequest,
    422: InvalidRequest,
    429: CapacityFull,
    503: Unavailable,
}


def error_from_response(response: httpx.Response, *, what: str = "") -> RuntimeApiError:
    """The error for an answer with status >= 400 (the envelope ``{"error": {"type", "message"}}`` when present)."""
    kind, message = _envelope(response)
    if what:
        message = f"{what}: {message}"
    status = response.status_code
    cls = _BY_STATUS.get(status) or (ServerFailure if status >= 500 else InvalidRequest)
    if cls is CapacityFull:
        return CapacityFull(message, type=kind, status=status, retry_after=_retry_after(response))
    return cls(message, type=kind, status=status)


def _envelope(response: httpx.Response) -> tuple[str, str]:
    try:
        body: Any = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        error = body["error"]
        return str(error.get("type") or ""), str(error.get("message") or f"HTTP {response.status_code}")
    text = response.text.strip()[:200] if response.content else ""
    return "", text or f"HTTP {response.status_code}"


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after", "").strip()
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if 0 <= seconds < 86_400 else None


def error_from_resource(error: ResourceError) -> RuntimeApiError:
    """The runtime error for an error of the Kubernetes API (``loopd.resources.ResourceError``); the message is the
    API's, the status its HTTP code (0 when no answer came)."""
    message, kind = error.message, error.reason
    if isinstance(error, TooManyRequests):
        return CapacityFull(message, type=kind, status=429, retry_after=error.retry_after)
    if isinstance(error, kube.Invalid):
        causes = tuple((c.reason, c.field, c.message) for c in error.causes)
        return Invalid(message, type=kind, status=422, causes=causes)
    if isinstance(error, kube.AlreadyExists):
        return AlreadyExists(message, type=kind, status=409)
    if isinstance(error, TransportError):
        return Unavailable(message, type=kind, status=0)
    if isinstance(error, kube.StoreUnavailable | kube.Gone) or error.code >= 500:
        # A 5xx of the Kubernetes API (or a 410 on a unary call) says nothing about the object: retry later.
        return Unavailable(message, type=kind, status=error.code)
    cls = _BY_STATUS.get(error.code, InvalidRequest)
    return cls(message, type=kind, status=error.code)
