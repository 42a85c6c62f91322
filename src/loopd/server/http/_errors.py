"""The one error envelope of the loop-server API, and the mapping of every error to it.

Every error response is ``{"error": {"type": ..., "message": ...}}``:

    type                    status  when
    invalid_request         400     malformed JSON, wrong types, bad query values, validation errors (never 422);
                                    a wrong method is 405 with this type
    unauthorized            401     no valid bearer token and no browser cookie
    forbidden               403     a cookie write without our Origin, a browser on a route for operators, …
    not_found               404     unknown route, or a row the caller may not see
    conflict                409     the row exists in another state (different parameters, delivery closing, …)
    payload_too_large       413     the body is larger than the cap
    unsupported_media_type  415     a write whose body is not JSON
    too_many_requests       429     back-pressure
    service_unavailable     503     the database or the Task API is unreachable (retry)
    internal_error          500     a bug; the message never carries a traceback

``ApiError`` is the harness transport's class (one class for the whole process, so any router can raise it);
storage errors map by their ``type``. Must not do: decide *whether* something is an error.
"""

from __future__ import annotations

import logging
from typing import Any, Final

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse

from loopd.harness.serve import ApiError, ErrorType
from loopd.server.storage import StorageError

_log = logging.getLogger("loopd.server.http")

STATUS_OF: Final[dict[str, int]] = {
    "invalid_request": 400,
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
_TYPE_OF_STATUS: Final[dict[int, ErrorType]] = {
    400: "invalid_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "invalid_request",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "invalid_request",
    429: "too_many_requests",
    503: "service_unavailable",
}
_MAX_MESSAGE: Final = 2000


class ErrorDetail(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: ErrorType
    message: str


class ErrorEnvelope(BaseModel):
    """The body of every error response."""

    model_config = ConfigDict(extra="forbid")
    error: ErrorDetail


ERROR_RESPONSES: Final[dict[int | str, dict[str, Any]]] = {
    status: {"model": ErrorEnvelope, "description": kind}
    for status, kind in _TYPE_OF_STATUS.items()
    if status not in (405, 422)
}
"""``responses=`` for routers, so the OpenAPI document shows the envelope."""


def error_body(type: str, message: str) -> dict[str, dict[str, str]]:
    if len(message) > _MAX_MESSAGE:
        message = message[:_MAX_MESSAGE] + "…"
    return {"error": {"type": type, "message": message}}


def error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(error_body(error.type, error.message), status_code=error.status, headers=error.headers)


def api_error_of(exc: StorageError) -> ApiError:
    """A storage error as the API answers it (``type`` decides the status)."""
    kind: ErrorType = exc.type if exc.type in STATUS_OF else "internal_error"  # type: ignore[assignment]
    if kind == "internal_error":
        return ApiError("internal_error", "internal error (storage); see the server log")
    headers = {"Retry-After": "1"} if exc.retryable else None
    return ApiError(kind, exc.message, headers=headers)


def _describe(exc: RequestValidationError) -> str:
    problems = []
    for error in list(exc.errors())[:5]:
        where = ".".join(str(part) for part in error.get("loc", ()))
        problems.append(f"{where}: {error.get('msg', 'invalid')}" if where else str(error.get("msg", "invalid")))
    return "; ".join(problems) or "invalid request"


def install_error_handlers(app: FastAPI) -> None:
    """Map every exception a route can raise to the envelope (a bug becomes a bare 500 ``internal_error``)."""

    async def on_api_error(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return error_response(exc)

    async def on_storage_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StorageError)
        error = api_error_of(exc)
        if error.type == "internal_error":
            _log.error("storage error on %s %s", request.method, request.url.path, exc_info=exc)
        return error_response(error)

    async def on_validation_error(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return error_response(ApiError("invalid_request", _describe(exc)))

    async def on_http_error(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HTTPException)
        kind = _TYPE_OF_STATUS.get(exc.status_code, "internal_error" if exc.status_code >= 500 else "invalid_request")
        status = 400 if exc.status_code == 422 else exc.status_code
        message = str(exc.detail)
        if exc.status_code == 404:
            message = "no such route"
        elif exc.status_code == 405:
            message = "this route does not take that method"
        return error_response(ApiError(kind, message, status=status, headers=exc.headers))

    async def on_bug(request: Request, exc: Exception) -> JSONResponse:
        _log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
        return error_response(ApiError("internal_error", f"internal error ({type(exc).__name__}); see the server log"))

    app.add_exception_handler(ApiError, on_api_error)
    app.add_exception_handler(StorageError, on_storage_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(HTTPException, on_http_error)
    app.add_exception_handler(Exception, on_bug)
