"""The transport's front door, as one ASGI middleware: bearer token, Host check, body cap, JSON-only writes.

* **Token.** With a token, every path except `PUBLIC_PATHS` needs ``Authorization: Bearer <token>`` (compared in
  constant time); otherwise 401 ``unauthorized`` with ``WWW-Authenticate: Bearer``.
* **Host.** Without a token the server is only meant for this machine, so a request whose ``Host`` is not a
  loopback name is refused (403 ``forbidden``): a web page cannot reach it through DNS rebinding.
* **Body.** A write's body is read here, up to ``max_body_bytes`` (by ``Content-Length`` *and* by counting the
  bytes that arrive; 413 ``payload_too_large``) and within ``body_timeout`` (400), then handed on.
* **JSON only.** A write with a non-empty body must say ``Content-Type: application/json`` (or ``+json``), else
  415 ``unsupported_media_type``, and must be one JSON object, else 400; a cross-site form post therefore never
  reaches a route.

Must not do: know the routes beyond `PUBLIC_PATHS`.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
from typing import Final

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from loopd.harness.serve._errors import ApiError, error_response

PUBLIC_PATHS: Final = frozenset({"/healthz", "/openapi.json"})
_WRITE_METHODS: Final = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address, IPv6 with or without brackets) is this machine's loopback."""
    name = host.strip().strip("[]").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _host_name(value: str) -> str:
    value = value.strip()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def _check_json_object(body: bytes) -> None:
    try:
        value = json.loads(body)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise ApiError("invalid_request", f"the body is not valid JSON: {str(exc)[:200]}") from exc
    if not isinstance(value, dict):
        raise ApiError("invalid_request", f"the body must be a JSON object, not {type(value).__name__}")


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
        try:
            self._check_access(scope)
            if scope["method"] in _WRITE_METHODS:
                receive = await self._buffered(scope, receive)
        except ApiError as exc:
            await error_response(exc)(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _headers(self, scope: Scope) -> dict[str, str]:
        return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}

    def _check_access(self, scope: Scope) -> None:
        headers = self._headers(scope)
        if self._token is None:
            host = headers.get("host", "")
            if host and not is_loopback(_host_name(host)):
                raise ApiError("forbidden", "this server has no token and answers only requests addressed to loopback")
            return
        if scope.get("path", "") in PUBLIC_PATHS:
            return
        scheme, _, credentials = headers.get("authorization", "").partition(" ")
        given = credentials.strip().encode()
        if scheme.lower() != "bearer" or not hmac.compare_digest(given, self._token):
            raise ApiError(
                "unauthorized",
                "a valid 'Authorization: Bearer <token>' header is required",
                headers={"WWW-Authenticate": 'Bearer realm="loopd"'},
            )

    async def _buffered(self, scope: Scope, receive: Receive) -> Receive:
        headers = self._headers(scope)
        length = headers.get("content-length")
        if length is not None:
            if not length.isdigit():
                raise ApiError("invalid_request", "Content-Length is not a number")
            if int(length) > self._max:
                raise ApiError("payload_too_large", f"the body is larger than {self._max} bytes")
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self._body_timeout):
                more = True
                while more:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        raise ApiError("invalid_request", "the client went away while sending the body")
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > self._max:
                        raise ApiError("payload_too_large", f"the body is larger than {self._max} bytes")
                    chunks.append(chunk)
                    more = bool(message.get("more_body", False))
        except TimeoutError as exc:
            raise ApiError("invalid_request", f"the body did not arrive within {self._body_timeout:g}s") from exc
        body = b"".join(chunks)
        if body.strip():
            if not _is_json(headers.get("content-type", "")):
                raise ApiError("unsupported_media_type", "writes take JSON: send 'Content-Type: application/json'")
            _check_json_object(body)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return replay
