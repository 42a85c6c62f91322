"""The transport's front door, as one ASGI middleware: bearer token, Host check, body cap, JSON-only writes.

* **Token.** With a token, every path except `PUBLIC_PATHS` needs ``Authorization: Bearer <token>`` (compared in
  constant time); otherwise 401 ``unauthorized`` with ``WWW-Authenticate: Bearer``.
* **Peer and Host.** Without a token the server is only meant for this machine: a request is answered only when
  its connection comes from a loopback *peer address* (the ASGI ``client``; a header proves nothing) and its
  ``Host`` is a loopback name (so a web page cannot reach it through DNS rebinding); otherwise 403 ``forbidden``.
* **Body.** A write's body is read here, up to ``max_body_bytes`` (by ``Content-Length`` *and* by counting the
  bytes that arrive; 413 ``payload_too_large``) and within ``body_timeout`` (400), then handed on.
* **JSON only.** A write with a non-empty body must say ``Content-Type: application/json`` (or ``+json``), else
  415 ``unsupported_media_type``, and must be one JSON object, else 400; a cross-site form post therefore never
  reaches a route.

The body and JSON mechanics and the peer check are the floor's (``loopd._infra.http``); the token and Host rules
are this transport's own. Must not do: know the routes beyond `PUBLIC_PATHS`.
"""

from __future__ import annotations

import hmac
from typing import Final

from starlette.types import ASGIApp, Receive, Scope, Send

from loopd._infra.http import (
    WRITE_METHODS,
    buffer_json_body,
    host_name,
    is_loopback,
    peer_is_loopback,
    request_headers,
)
from loopd._infra.http_errors import ApiError, error_response

PUBLIC_PATHS: Final = frozenset({"/healthz", "/openapi.json", "/docs"})
PUBLIC_PREFIXES: Final = ("/static/docs/",)
"""The API explorer's page and assets: like the API document, they hold nothing of any session."""


class Guard:
    def __init__(
        self,
        app: ASGIApp,
        *,
        token: str | None,
        max_body_bytes: int,
        body_timeout: float = 30.0,
    ) -> None:
        if token is not None and not token:
            raise ValueError("the token must not be empty (pass None for no token)")
        if max_body_bytes < 1:
            raise ValueError("max_body_bytes must be positive")
        self.app = app
        self._token = token.encode() if token is not None else None
        self._max = max_body_bytes
        self._body_timeout = body_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = request_headers(scope)
        try:
            self._check_access(scope, headers)
            if scope["method"] in WRITE_METHODS:
                receive = await buffer_json_body(headers, receive, max_bytes=self._max, timeout=self._body_timeout)
        except ApiError as exc:
            await error_response(exc)(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _check_access(self, scope: Scope, headers: dict[str, str]) -> None:
        if self._token is None:
            host = headers.get("host", "")
            if not peer_is_loopback(scope):
                raise ApiError("forbidden", "this server has no token and answers only connections from this machine")
            if host and not is_loopback(host_name(host)):
                raise ApiError("forbidden", "this server has no token and answers only requests addressed to loopback")
            return
        path = str(scope.get("path", ""))
        if path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES):
            return
        scheme, _, credentials = headers.get("authorization", "").partition(" ")
        given = credentials.strip().encode()
        if scheme.lower() != "bearer" or not hmac.compare_digest(given, self._token):
            raise ApiError(
                "unauthorized",
                "a valid 'Authorization: Bearer <token>' header is required",
                headers={"WWW-Authenticate": 'Bearer realm="loopd"'},
            )
