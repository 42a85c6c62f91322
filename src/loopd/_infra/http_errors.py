"""The JSON error envelope of loopd's HTTP APIs (loop-server and ``loopd harness serve``), and its handlers.

Every error such an API sends is ``{"error": {"type": ..., "message": ...}}``; the type decides the status:

    type                    status  when
    invalid_request         400     malformed JSON, wrong types, bad query/header values, validation errors (never
                                    422); a wrong method is 405 with this type
    cursor_ahead            400     a stream's resume cursor (``Last-Event-ID``, ``from_seq``, ``?after=``) is past
                                    the last stored event: the cursor belongs to another stream or server
    unauthorized            401     no valid credentials (with ``WWW-Authenticate`` when bearer tokens are taken)
    forbidden               403     the caller is known but may not do this (or may not reach this server at all)
    not_found               404     unknown route, or a row or session the caller may not see
    conflict                409     the thing exists in another state (an Idempotency-Key reused with another body, …)
    payload_too_large       413     the body is larger than the cap
    unsupported_media_type  415     a write whose body is not JSON
    too_many_requests       429     back-pressure (with ``Retry-After``)
    service_unavailable     503     a dependency cannot answer now (a database, a faulted session); retry
    internal_error          500     a bug; the message never carries a traceback

This is the one list of types: each app says in its OpenAPI document which of them it answers (`error_responses`),
and maps its own exceptions to them (``translators`` of `install_error_handlers`). The Kubernetes-compatible
resource API answers with Kubernetes ``Status`` objects instead and does not use this module.

Must not do: decide *whether* something is an error (routes and services do), or know any app's exceptions.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any, Final, Literal

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse

from loopd._infra.errors import LoopdError

__all__ = [
    "STATUS_OF",
    "TYPE_OF_STATUS",
    "ApiError",
    "ErrorDetail",
    "ErrorEnvelope",
    "ErrorType",
    "drop_validation_responses",
    "error_body",
    "error_response",
    "error_responses",
    "install_error_handlers",
]

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

_MAX_MESSAGE: Final = 2000


class ApiError(LoopdError):
    """An error the API answers with; raise it anywhere under a route (or in a middleware, with `error_response`)."""

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


# --- OpenAPI ---------------------------------------------------------------------------------------------------


class ErrorDetail(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: ErrorType
    message: str


class ErrorEnvelope(BaseModel):
    """The body of every error response."""

    model_config = ConfigDict(extra="forbid")
    error: ErrorDetail


def error_responses(*, exclude: Collection[int] = (422,)) -> dict[int | str, dict[str, Any]]:
    """``responses=`` for an app's routers: the envelope under each framework status of `TYPE_OF_STATUS` but
    ``exclude`` (422 never goes out: invalid requests are 400), so the OpenAPI document shows it."""
    return {
        status: {"model": ErrorEnvelope, "description": kind}
        for status, kind in TYPE_OF_STATUS.items()
        if status not in exclude
    }


def drop_validation_responses(schema: dict[str, Any]) -> None:
    """Remove FastAPI's 422 responses and their schemas from an OpenAPI document (invalid requests are 400)."""
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            operation.get("responses", {}).pop("422", None)
    schemas = schema.get("components", {}).get("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)


# --- handlers --------------------------------------------------------------------------------------------------


def install_error_handlers(
    app: Starlette,
    *,
    translators: Mapping[type[Exception], Callable[[Any], ApiError]] | None = None,
    route_messages: Mapping[int, str] | None = None,
    logger: logging.Logger | None = None,
) -> None:
    """Answer every exception a route raises with the error envelope; a bad request is never a 500.

    `ApiError` goes out as it is; an exception of a class in ``translators`` through its function (Starlette picks
    the most specific class along the exception's MRO); a validation error as 400 ``invalid_request`` (never 422);
    an ``HTTPException`` with the type of its status and its detail, or ``route_messages[status]`` when given (e.g.
    for 404 and 405); anything else as a bare 500 ``internal_error`` that names only the exception's class. With
    ``logger``, unhandled exceptions and translations to ``internal_error`` are logged with their traceback.
    """
    messages = dict(route_messages or {})

    def log(request: Request, exc: Exception, what: str) -> None:
        if logger is not None:
            logger.error("%s on %s %s", what, request.method, request.url.path, exc_info=exc)

    async def on_api_error(_request: Request, exc: Exception) -> JSONResponse:
        if not isinstance(exc, ApiError):  # pragma: no cover - Starlette routes only ApiError here
            raise exc
        return error_response(exc)

    def translating(translate: Callable[[Any], ApiError]) -> Callable[[Request, Exception], Awaitable[JSONResponse]]:
        async def on_error(request: Request, exc: Exception) -> JSONResponse:
            error = translate(exc)
            if error.type == "internal_error":
                log(request, exc, f"{type(exc).__name__} (answered as internal_error)")
            return error_response(error)

        return on_error

    async def on_validation_error(_request: Request, exc: Exception) -> JSONResponse:
        if not isinstance(exc, RequestValidationError):  # pragma: no cover
            raise exc
        return error_response(ApiError("invalid_request", _describe(exc)))

    async def on_http_error(_request: Request, exc: Exception) -> JSONResponse:
        if not isinstance(exc, HTTPException):  # pragma: no cover
            raise exc
        kind = TYPE_OF_STATUS.get(exc.status_code, "internal_error" if exc.status_code >= 500 else "invalid_request")
        status = 400 if exc.status_code == 422 else exc.status_code
        message = messages.get(exc.status_code, str(exc.detail))
        return error_response(ApiError(kind, message, status=status, headers=exc.headers))

    async def on_bug(request: Request, exc: Exception) -> JSONResponse:
        log(request, exc, "unhandled error")
        return error_response(ApiError("internal_error", f"internal error ({type(exc).__name__}); see the server log"))

    app.add_exception_handler(ApiError, on_api_error)
    for cls, translate in (translators or {}).items():
        app.add_exception_handler(cls, translating(translate))
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(HTTPException, on_http_error)
    app.add_exception_handler(Exception, on_bug)


def _describe(exc: RequestValidationError) -> str:
    problems = []
    for error in list(exc.errors())[:5]:
        where = ".".join(str(part) for part in error.get("loc", ()))
        problems.append(f"{where}: {error.get('msg', 'invalid')}" if where else str(error.get("msg", "invalid")))
    return "; ".join(problems) or "invalid request"
