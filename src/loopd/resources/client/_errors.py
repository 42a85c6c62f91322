"""Errors a client adds to the resource layer's one exception tree.

Owns: the failures only a remote client can see, and the mapping of an HTTP answer to the tree.
Must not do: I/O.

The tree is ``loopd.resources.ResourceError`` (see ``loopd.resources``); a client raises its members for the
answers a server gives (``NotFound``, ``Conflict``, ``Gone``, ``Invalid`` ...) and adds::

    ResourceError
    ├── StoreUnavailable              503, retryable
    │   └── TransportError            no answer: connection refused or reset, TLS failure, timeout; retryable
    ├── TooManyRequests               429, retryable after ``retry_after`` seconds when the server said so
    └── ServerError                   5xx other than 503 (500 InternalError, 504 Timeout ...), retryable
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from loopd.resources import ErrorDetails, ResourceError, StoreUnavailable, error_from_status


class TransportError(StoreUnavailable):
    """The request got no answer: connection refused or reset, TLS failure, or an I/O timeout."""

    reason = "ServiceUnavailable"


class TooManyRequests(ResourceError):
    """The server asked the client to slow down."""

    code = 429
    reason = "TooManyRequests"
    retryable = True

    def __init__(self, message: str, *, details: ErrorDetails | None = None, retry_after: float | None = None) -> None:
        super().__init__(message, details=details)
        self.retry_after = retry_after


class ServerError(ResourceError):
    """The server failed (500 InternalError, 502, 504 Timeout ...); the request may be retried."""

    code = 500
    reason = "InternalError"
    retryable = True


def error_from_response(code: int, body: Any, *, retry_after: float | None = None) -> ResourceError:
    """Map an HTTP error answer (status code + decoded body, ideally a Kubernetes ``Status``) to the tree."""
    status: Mapping[str, Any]
    if isinstance(body, Mapping) and body.get("kind") == "Status":
        status = body
    else:
        status = {"code": code, "message": _short(body) or f"HTTP {code}"}
    if "code" not in status:
        status = {**status, "code": code}
    error = error_from_status(status)
    if type(error) is not ResourceError:
        return error
    details = error.details
    if code == 429:
        return TooManyRequests(error.message, details=details, retry_after=retry_after)
    if code == 503:
        return StoreUnavailable(error.message, details=details)
    if code >= 500:
        return ServerError(error.message, details=details)
    return error


def _short(body: Any) -> str:
    if body is None:
        return ""
    text = body if isinstance(body, str) else repr(body)
    return text.strip()[:200]
