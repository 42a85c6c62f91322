"""Who is calling: `Identity` and the FastAPI dependencies that read it from the request.

The security middleware (``_security``) authenticates every request and leaves the caller's `Identity` in the ASGI
scope; routes ask for it with ``Depends(current_identity)`` (any caller), ``Depends(trusted_identity)`` (bearer
token callers only: operators, harnesses, the CLI) or ``Depends(admin_identity)`` (the admin token only).
Must not do: authenticate (the middleware does) or decide what an identity may read (the services do).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final, Literal

from fastapi import Request

from loopd._infra.http_errors import ApiError

IdentityKind = Literal["user", "operator", "harness"]
IDENTITY_KINDS: Final = frozenset({"user", "operator", "harness"})
SCOPE_KEY: Final = "loopd.identity"
"""Where the middleware puts the caller's `Identity` in the ASGI scope."""


@dataclass(frozen=True, slots=True)
class Identity:
    """A caller: ``user:<key>``, ``operator:<key>`` or ``harness:<key>``.

    ``trusted`` says the caller presented a server token (it is not part of equality: a token-authenticated
    ``user:local`` and a cookie ``user:local`` would be the same person). ``admin`` says that token is the admin
    token and the caller speaks as the admin user itself (not as an operator or harness it names with
    ``X-Loopd-Actor``): admin powers — token and sign-in link creation, reading every harness call and trail —
    go with it.
    """

    kind: IdentityKind
    key: str
    trusted: bool = field(default=False, compare=False)
    admin: bool = field(default=False, compare=False)

    def __post_init__(self) -> None:
        if self.kind not in IDENTITY_KINDS:
            raise ValueError(f"identity kind must be user, operator or harness, not {self.kind!r}")
        if not isinstance(self.key, str) or not self.key:
            raise ValueError("identity key must be a non-empty string")
        if self.admin and not (self.trusted and self.kind == "user"):
            raise ValueError("only a token-authenticated user identity can be the admin")

    @property
    def text(self) -> str:
        """``kind:key``."""
        return f"{self.kind}:{self.key}"

    def __str__(self) -> str:
        return self.text

    @classmethod
    def parse(cls, text: str, *, trusted: bool = False) -> Identity:
        """``kind:key`` → `Identity`; ``ValueError`` when malformed."""
        kind, colon, key = text.strip().partition(":")
        if not colon or kind not in IDENTITY_KINDS or not key:
            raise ValueError(f"expected user:<key>, operator:<key> or harness:<key>, not {text!r}")
        return cls(kind, key, trusted=trusted)  # type: ignore[arg-type]


def identity_of(request: Request) -> Identity | None:
    """The caller the middleware authenticated, or None (a public path reached without credentials)."""
    found = request.scope.get(SCOPE_KEY)
    return found if isinstance(found, Identity) else None


async def current_identity(request: Request) -> Identity:
    """FastAPI dependency: the authenticated caller (401 ``unauthorized`` when there is none)."""
    identity = identity_of(request)
    if identity is None:
        raise ApiError(
            "unauthorized",
            "sign in: send 'Authorization: Bearer <token>', or open / in a browser for a cookie identity",
            headers={"WWW-Authenticate": 'Bearer realm="loopd"'},
        )
    return identity


async def trusted_identity(request: Request) -> Identity:
    """FastAPI dependency: a caller that presented a server token (403 ``forbidden`` for browser identities)."""
    identity = await current_identity(request)
    if not identity.trusted:
        raise ApiError("forbidden", "this route is for operators and harnesses: it needs a bearer token")
    return identity


async def admin_identity(request: Request) -> Identity:
    """FastAPI dependency: the admin (the data directory's token, without ``X-Loopd-Actor``); 403 otherwise."""
    identity = await current_identity(request)
    if not identity.admin:
        raise ApiError("forbidden", "this route needs the admin token (the token file in the data directory)")
    return identity
