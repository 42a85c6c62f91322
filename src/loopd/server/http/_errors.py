"""The one error envelope of the loop-server API, and the mapping of every error to it.

Every error response is ``{"error": {"type": ..., "message": ...}}``:

    type                    status  when
    invalid_request         400     malformed JSON, wrong types, bad query values, validation errors (never 422);
                                    a wrong method is 405 with this type
    cursor_ahead            400     a stream's resume cursor (``Last-Event-ID``, ``?after=``) is past the last stored
                                    event: the client's cursor belongs elsewhere; reload the snapshot
    unauthorized            401     no valid bearer token and no browser cookie
    forbidden               403     a cookie write without our Origin, a browser on a route for operators, …
    not_found               404     unknown route, or a row the caller may not see
    conflict                409     the row exists in another state (different parameters, delivery closing, …)
    payload_too_large       413     the body is larger than the cap
    unsupported_media_type  415     a write whose body is not JSON
    too_many_requests       429     back-pressure
    service_unavailable     503     the database or the Task API is unreachable (retry)
    internal_error          500     a bug; the message never carries a traceback

``ApiError``, the envelope (`error_body`, `error_response`, `ErrorEnvelope`) and the handlers' mechanism are the
floor's (``loopd._infra.http_errors``: one class for the whole process, so any router can raise it); this module adds
the statuses the server's OpenAPI document lists (`ERROR_RESPONSES`) and the server's own mapping: its
errors (``LoopServerError``: storage, ledger, engine) by their ``type``, friendlier 404/405 messages, and logging
of 500s. Must not do: decide *whether* something is an error.
"""

from __future__ import annotations

import logging
from typing import Any, Final, cast

from fastapi import FastAPI

from loopd._infra.http_errors import (
    STATUS_OF,
    ApiError,
    ErrorDetail,
    ErrorEnvelope,
    ErrorType,
    error_response,
    error_responses,
)
from loopd._infra.http_errors import error_body as _error_body
from loopd._infra.http_errors import install_error_handlers as _install_envelope_handlers
from loopd.server._errors import LoopServerError
from loopd.server.storage import StorageError

__all__ = [
    "ERROR_RESPONSES",
    "ErrorDetail",
    "ErrorEnvelope",
    "api_error_of",
    "error_body",
    "error_response",
    "install_error_handlers",
]

_log = logging.getLogger(__name__)

_ROUTE_MESSAGES: Final = {404: "no such route", 405: "this route does not take that method"}


ERROR_RESPONSES: Final[dict[int | str, dict[str, Any]]] = error_responses(exclude=(405, 422))
"""``responses=`` for routers, so the OpenAPI document shows the envelope."""


def error_body(type: str, message: str) -> dict[str, dict[str, str]]:
    """The floor's `error_body` for a type known only at run time (e.g. a storage error's)."""
    return _error_body(cast(ErrorType, type), message)


def api_error_of(exc: LoopServerError) -> ApiError:
    """A loop-server error (storage, ledger, engine) as the API answers it (``type`` decides the status)."""
    kind: ErrorType = exc.type if exc.type in STATUS_OF else "internal_error"  # type: ignore[assignment]
    if kind == "internal_error":
        where = "storage" if isinstance(exc, StorageError) else type(exc).__name__
        return ApiError("internal_error", f"internal error ({where}); see the server log")
    headers = {"Retry-After": "1"} if exc.retryable else None
    return ApiError(kind, exc.message, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    """Map every exception a route can raise to the envelope (a bug becomes a bare 500 ``internal_error``, logged)."""
    _install_envelope_handlers(
        app, translators={LoopServerError: api_error_of}, route_messages=_ROUTE_MESSAGES, logger=_log
    )
