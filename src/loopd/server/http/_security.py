"""The server's front door, one ASGI middleware: who is calling, CSRF rules, body cap, JSON-only writes.

Identity (left in the scope for `current_identity`):

* ``Authorization: Bearer <token>``:
  - the admin token (``tokens``, the data directory's token file; compared in constant time) → the *admin*
    ``user:<default_user>`` (the CLI user). As an admin power it may speak as any operator or harness by naming
    it in ``X-Loopd-Actor: operator:<key>`` / ``harness:<key>`` (embedded operators, tests); it is then exactly
    that actor, without admin powers.
  - an actor token (``loopd token create``, kept hashed by `AccessStore`) → the one operator or harness it was
    made for; an ``X-Loopd-Actor`` naming anyone else is 403.
  A wrong token is 401; ``X-Loopd-Actor`` without a token is 401.
* Otherwise the browser cookie ``loopd-human`` (32 random bytes, hex; HttpOnly, SameSite=Strict, Path=/, one
  year) → ``user:human-<first 32 hex of sha256(cookie)>``. Trust comes from the connection, never from ``Host``
  alone: a cookie counts when the *peer address* (ASGI ``client``) is loopback, the request was not relayed by a
  reverse proxy (no ``Forwarded`` / ``X-Forwarded-For`` / ``X-Real-IP``), and the ``Host`` is a loopback
  name or one of ``browser_hosts`` (a page on another name that resolves here — DNS rebinding — gets 403), or
  when the server recorded it as issued through a one-time sign-in link (``GET /signin?code=…``; the only way
  a browser on another machine signs in: 401 otherwise). ``GET /`` and ``GET /v1/me`` mint a new cookie, when
  none was sent, only for a loopback peer with such a Host. A cookie-authenticated write must carry ``Origin``
  equal to the request's own ``scheme://host`` (or one of ``trusted_origins``), else 403.
* Neither → 401, except on the public paths (``/healthz``, ``/readyz``, ``/``, ``/signin``, ``/openapi.json``,
  ``/docs``, …), where a cookie that does not count is ignored.

Bodies: a write's body (POST / PUT / PATCH / DELETE) is read here with the floor's `buffer_json_body`:
at most ``max_body_bytes`` (413) within ``body_timeout`` (400); a non-empty body must be ``application/json`` (415)
holding one JSON object (400).
Must not do: know routes beyond the public paths, or decide what an identity may do.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from loopd._infra.http import (
    WRITE_METHODS,
    buffer_json_body,
    host_name,
    is_loopback,
    peer_is_loopback,
    request_headers,
)
from loopd._infra.http_errors import ApiError, error_response
from loopd.server.http._access import AccessStore
from loopd.server.http._errors import api_error_of
from loopd.server.http._identity import SCOPE_KEY, Identity
from loopd.server.storage import StorageError

COOKIE_NAME: Final = "loopd-human"
COOKIE_MAX_AGE: Final = 365 * 24 * 3600
SIGNIN_PATH: Final = "/signin"
DEFAULT_PUBLIC_PATHS: Final = frozenset(
    {"/", "/favicon.ico", "/healthz", "/readyz", SIGNIN_PATH, "/openapi.json", "/docs", "/docs/oauth2-redirect"}
)
COOKIE_ISSUING_PATHS: Final = frozenset({"/", "/v1/me"})
_COOKIE_VALUE = re.compile(r"[0-9a-f]{64}")


def human_key(cookie: str) -> str:
    """The user key of a browser cookie: ``human-`` and the first 32 hex digits of its SHA-256."""
    return "human-" + hashlib.sha256(cookie.encode()).hexdigest()[:32]


def new_cookie_value() -> str:
    return secrets.token_hex(32)


@dataclass(frozen=True)
class ServerSecurity:
    """How the server authenticates callers and bounds requests."""

    tokens: tuple[str, ...] = ()
    """Bearer tokens that make a caller trusted (the token file in the data directory)."""
    default_user: str = "local"
    """The user a token caller is when it names no ``X-Loopd-Actor``."""
    max_body_bytes: int = 1_048_576
    body_timeout: float = 30.0
    secure_cookie: bool = False
    """Mark the cookie ``Secure`` (set when the server is reached over https)."""
    browser_hosts: frozenset[str] = frozenset()
    """Host names besides loopback on which browser (cookie) identities are accepted; ``"*"`` accepts any."""
    trusted_origins: frozenset[str] = frozenset()
    """Origins besides the request's own that may send cookie-authenticated writes (e.g. a dev server)."""
    public_paths: frozenset[str] = field(default=DEFAULT_PUBLIC_PATHS)
    public_prefixes: tuple[str, ...] = ("/static/", "/assets/")
    """Paths reachable without credentials: the web page, health, the API document, static assets (the docs' and
    the web UI's bundle)."""
    signin_ttl: float = 600.0
    """Seconds a one-time sign-in link stays valid."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "tokens", tuple(self.tokens))
        if any(not isinstance(token, str) or not token.strip() for token in self.tokens):
            raise ValueError("server tokens must be non-empty strings")
        if not self.default_user:
            raise ValueError("default_user must not be empty")
        if self.max_body_bytes < 1 or not (self.body_timeout > 0):
            raise ValueError("max_body_bytes and body_timeout must be positive")
        if not (0 < self.signin_ttl <= 24 * 3600):
            raise ValueError("signin_ttl must be positive and at most a day")

    def is_public(self, path: str) -> bool:
        return path in self.public_paths or any(path.startswith(prefix) for prefix in self.public_prefixes)

    def accepts_browser_host(self, host: str) -> bool:
        name = host_name(host).lower()
        return is_loopback(name) or "*" in self.browser_hosts or name in self.browser_hosts


def _cookie(header: str) -> str | None:
    for part in header.split(";"):
        name, eq, value = part.strip().partition("=")
        if eq and name == COOKIE_NAME:
            value = value.strip().strip('"')
            return value if _COOKIE_VALUE.fullmatch(value) else None
    return None


def set_cookie_header(value: str, *, secure: bool) -> bytes:
    """The ``Set-Cookie`` value for a browser identity cookie."""
    text = f"{COOKIE_NAME}={value}; Path=/; Max-Age={COOKIE_MAX_AGE}; HttpOnly; SameSite=Strict"
    return (text + "; Secure" if secure else text).encode("latin-1")


_SIGN_IN: Final = (
    "sign in: send 'Authorization: Bearer <token>'; a browser on this machine opens / for a cookie identity, a "
    "browser elsewhere opens a one-time sign-in link (run 'loopd signin-link' on the server)"
)


class SecurityMiddleware:
    """``access``: the server's issued credentials (actor tokens, sign-in cookies); without it only the admin
    tokens and loopback browsers are recognised."""

    def __init__(self, app: ASGIApp, *, security: ServerSecurity, access: AccessStore | None = None) -> None:
        self.app = app
        self._security = security
        self._access = access
        self._tokens = [token.encode() for token in security.tokens]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = request_headers(scope)
        try:
            try:
                identity, minted = await self._authenticate(scope, headers)
            except StorageError as exc:
                raise api_error_of(exc) from exc
            if scope["method"] in WRITE_METHODS:
                receive = await buffer_json_body(
                    headers, receive, max_bytes=self._security.max_body_bytes, timeout=self._security.body_timeout
                )
        except ApiError as exc:
            await error_response(exc)(scope, receive, send)
            return
        if identity is not None:
            scope[SCOPE_KEY] = identity
        if minted is not None:
            send = _with_cookie(send, minted, secure=self._security.secure_cookie)
        await self.app(scope, receive, send)

    # -- identity ------------------------------------------------------------------------------------------

    async def _authenticate(self, scope: Scope, headers: dict[str, str]) -> tuple[Identity | None, str | None]:
        path = str(scope.get("path", ""))
        public = self._security.is_public(path)
        if "authorization" in headers:
            identity = await self._token_identity(headers)
            if identity is not None:
                return identity, None
            if public:
                return None, None
            raise ApiError(
                "unauthorized",
                "the bearer token is not valid for this server",
                headers={"WWW-Authenticate": 'Bearer realm="loopd"'},
            )
        if "x-loopd-actor" in headers:
            raise ApiError("unauthorized", "X-Loopd-Actor is only honoured with a valid bearer token")
        host = headers.get("host", "")
        # A loopback peer that addressed us by a loopback (or configured) name: this machine's own browser.
        local_browser = bool(host) and peer_is_loopback(scope) and self._security.accepts_browser_host(host)
        cookie = _cookie(headers.get("cookie", ""))
        if cookie is not None:
            if local_browser or (self._access is not None and await self._access.cookie_issued(cookie)):
                if scope["method"] in WRITE_METHODS:
                    self._check_origin(scope, headers)
                return Identity("user", human_key(cookie)), None
            if public:
                return None, None
            if peer_is_loopback(scope):
                raise ApiError("forbidden", f"browser sessions are not served on host {host_name(host)!r}")
            raise ApiError("unauthorized", _SIGN_IN, headers={"WWW-Authenticate": 'Bearer realm="loopd"'})
        if local_browser and scope["method"] == "GET" and path in COOKIE_ISSUING_PATHS:
            value = new_cookie_value()
            return Identity("user", human_key(value)), value
        if public:
            return None, None
        raise ApiError("unauthorized", _SIGN_IN, headers={"WWW-Authenticate": 'Bearer realm="loopd"'})

    async def _token_identity(self, headers: dict[str, str]) -> Identity | None:
        scheme, _, credentials = headers.get("authorization", "").partition(" ")
        given = credentials.strip()
        if scheme.lower() != "bearer" or not given:
            return None
        matched = False
        for token in self._tokens:
            matched |= hmac.compare_digest(given.encode(), token)
        named = _named_actor(headers)
        if matched:
            if named is None:
                return Identity("user", self._security.default_user, trusted=True, admin=True)
            return named  # an admin power: speak as any operator or harness
        bound = await self._access.token_actor(given) if self._access is not None else None
        if bound is None:
            return None
        if named is not None and named != bound:
            raise ApiError("forbidden", f"this token is {bound.text}'s; it cannot act as {named.text}")
        return bound

    def _check_origin(self, scope: Scope, headers: dict[str, str]) -> None:
        origin = headers.get("origin")
        if origin is None:
            raise ApiError("forbidden", "a browser write must carry an Origin header")
        own = f"{scope.get('scheme', 'http')}://{headers.get('host', '')}".lower()
        given = origin.strip().lower().rstrip("/")
        if given != own and given not in {o.lower().rstrip("/") for o in self._security.trusted_origins}:
            raise ApiError("forbidden", f"cross-origin write refused (Origin {origin!r})")


def _named_actor(headers: dict[str, str]) -> Identity | None:
    actor = headers.get("x-loopd-actor")
    if actor is None:
        return None
    try:
        identity = Identity.parse(actor, trusted=True)
    except ValueError as exc:
        raise ApiError("invalid_request", f"X-Loopd-Actor: {exc}") from exc
    if identity.kind == "user":
        raise ApiError("invalid_request", "X-Loopd-Actor names an operator:<key> or harness:<key>")
    return identity


def _with_cookie(send: Send, value: str, *, secure: bool) -> Send:
    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            cookie = (b"set-cookie", set_cookie_header(value, secure=secure))
            message = {**message, "headers": [*message.get("headers", []), cookie]}
        await send(message)

    return sending


def tokens_of(values: Iterable[str]) -> tuple[str, ...]:
    """Non-empty, stripped tokens (e.g. lines of a token file)."""
    return tuple(value.strip() for value in values if value.strip())
