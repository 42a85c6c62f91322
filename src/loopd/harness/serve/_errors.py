"""The HTTP error envelope and the mapping from harness errors to it.

Every error the transport sends is ``{"error": {"type": ..., "message": ...}}``:

    type                    status  when
    invalid_request         400     malformed JSON, wrong types, bad query/header values (also 405)
    cursor_ahead            400     a resume cursor (``Last-Event-ID``, ``from_seq``) past the last stored event:
                                    the client holds a cursor of another session or server; start again
    unauthorized            401     missing or wrong bearer token (with ``WWW-Authenticate: Bearer``)
    forbidden               403     a tokenless server asked for by a non-loopback ``Host``
    not_found               404     unknown route, session, open gate or queued input
    conflict                409     an Idempotency-Key reused with another body; an input that already ran
    payload_too_large       413     the body is larger than the configured cap
    unsupported_media_type  415     a write whose body is not JSON
    too_many_requests       429     back-pressure: a full mailbox, a busy writer, the live-session cap
    service_unavailable     503     a faulted or closed session, a journal that cannot be read
    internal_error          500     a bug (never for bad input)

Must not do: decide *whether* something is an error (routes and the registry do that).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Literal

from starlette.responses import JSONResponse

from loopd.harness._errors import (
    HarnessError,
    JournalError,
    MailboxFullError,
    ModelError,
    SessionBusyError,
    SessionClosedError,
    SessionFaultError,
    SessionNotFoundError,
    SubscriptionLostError,
)

ErrorType = Literal[
    "invalid_request",
    "cursor_ahead",
    "unauthorized",
    "forbidden",
    "not_found",
    "conflict",
    "payload_too_large",
    "unsupported_media_type",
    "too_many_requests",
    "service_unavailable",
    "internal_error",
]

STATUS_OF: Final[Mapping[ErrorType, int]] = {
    "invalid_request": 400,
    "cursor_ahead": 400,
    "unauthorized": 401,
    "forbidden": 403,
    "not_found": 404,
    "conflict": 409,
    "payload_too_large": 413,
    "unsupported_media_type": 415,
    "too_many_requests": 429,
    "service_unavailable": 503,
    "internal_error": 500,
}

TYPE_OF_STATUS: Final[Mapping[int, ErrorType]] = {
    400: "invalid_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "invalid_request",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "invalid_request",  # FastAPI's validation status; answered as 400
    429: "too_many_requests",
    503: "service_unavailable",
}
"""The envelope type of an HTTP status raised by the framework (a wrong method is ``invalid_request``)."""

_MAX_MESSAGE = 2000


class ApiError(Exception):
    """An error the API answers with; raise it anywhere under a route."""

    def __init__(
        self,
        type: ErrorType,
        message: str,
        *,
        status: int | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.type: ErrorType = type
        self.message = message
        self.status = status if status is not None else STATUS_OF[type]
        self.headers = dict(headers or {})


def error_body(type: ErrorType, message: str) -> dict[str, dict[str, str]]:
    """The envelope ``{"error": {"type", "message"}}``, the message cut to 2,000 characters."""
    if len(message) > _MAX_MESSAGE:
        message = message[:_MAX_MESSAGE] + "…"
    return {"error": {"type": type, "message": message}}


def error_response(error: ApiError) -> JSONResponse:
    """``error`` as a JSON response with its status and headers."""
    return JSONResponse(error_body(error.type, error.message), status_code=error.status, headers=error.headers)


def from_harness(exc: HarnessError) -> ApiError:
    """Translate a harness error raised under a route (the most specific class first)."""
    message = str(exc)
    match exc:
        case SessionNotFoundError():
            return ApiError("not_found", message)
        case MailboxFullError():
            return ApiError("too_many_requests", f"{message}; retry shortly", headers={"Retry-After": "1"})
        case SessionBusyError():
            return ApiError("too_many_requests", message, headers={"Retry-After": "1"})
        case SessionFaultError():
            return ApiError("service_unavailable", f"{message}; POST .../restore to bring the session back")
        case SessionClosedError():
            return ApiError("service_unavailable", message)
        case SubscriptionLostError() | JournalError() | ModelError():
            return ApiError("service_unavailable", message)
        case _:
            # The session refused the command for a reason of its own (e.g. a rig that lacks a loop).
            return ApiError("conflict", message)
