"""The routes that hand out credentials: one-time sign-in links for browsers, actor tokens for operators/harnesses.

    POST   /v1/signin-links        admin → a one-time ``/signin?code=…`` path (``loopd signin-link`` prints it)
    GET    /signin?code=…          public → redeems the code once: sets the browser cookie and redirects to /
    POST   /v1/tokens              admin → a new token bound to one operator:<key> / harness:<key>
    DELETE /v1/tokens/{actor}      admin → forget every token of that actor

Must not do: store anything itself (`AccessStore` does) or authenticate (the middleware does).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Final

from fastapi import APIRouter, Depends, Query
from fastapi import Path as PathParam
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import Response

from loopd._infra.http_errors import ApiError
from loopd.server.http._access import AccessStore
from loopd.server.http._errors import ERROR_RESPONSES
from loopd.server.http._identity import Identity, admin_identity
from loopd.server.http._security import SIGNIN_PATH, ServerSecurity, new_cookie_value, set_cookie_header

MAX_ACTOR: Final = 300

Admin = Annotated[Identity, Depends(admin_identity)]


class SigninLink(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str = Field(description="Open this path on the server's address; it works once.")
    expires_at: datetime


class TokenRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    actor: str = Field(min_length=3, max_length=MAX_ACTOR, description="operator:<key> or harness:<key>")


class IssuedToken(BaseModel):
    model_config = ConfigDict(extra="forbid")
    actor: str
    token: str = Field(description="Shown once; the server keeps only its SHA-256.")


class RevokedTokens(BaseModel):
    model_config = ConfigDict(extra="forbid")
    actor: str
    revoked: int


def _actor(text: str) -> Identity:
    try:
        actor = Identity.parse(text)
    except ValueError as exc:
        raise ApiError("invalid_request", str(exc)) from exc
    if actor.kind == "user":
        raise ApiError("invalid_request", "tokens are for operator:<key> or harness:<key>; users sign in with a link")
    return actor


def access_router(access: AccessStore, security: ServerSecurity) -> APIRouter:
    router = APIRouter(responses=ERROR_RESPONSES, tags=["access"])

    @router.post("/v1/signin-links", status_code=201)
    async def create_signin_link(caller: Admin) -> SigninLink:
        """A one-time sign-in link for a browser (on any machine); it expires after a few minutes."""
        del caller
        created = await access.create_signin_code()
        return SigninLink(path=f"{SIGNIN_PATH}?code={created.code}", expires_at=created.expires_at)

    @router.get(SIGNIN_PATH, include_in_schema=True, status_code=303, response_class=Response)
    async def signin(code: Annotated[str, Query(min_length=16, max_length=128)]) -> Response:
        """Redeem a sign-in link: sets the browser cookie and redirects to ``/``. Works once."""
        cookie = new_cookie_value()
        if not await access.redeem_signin_code(code, cookie):
            raise ApiError("forbidden", "this sign-in link is not valid (used, expired or unknown): ask for a new one")
        return Response(
            status_code=303,
            headers={
                "Location": "/",
                "Set-Cookie": set_cookie_header(cookie, secure=security.secure_cookie).decode("latin-1"),
                "Cache-Control": "no-store",
                "Referrer-Policy": "no-referrer",
            },
        )

    @router.post("/v1/tokens", status_code=201)
    async def create_token(caller: Admin, body: TokenRequest) -> IssuedToken:
        """A token that authenticates as exactly one operator or harness (it cannot act as anyone else)."""
        del caller
        actor = _actor(body.actor)
        return IssuedToken(actor=actor.text, token=await access.create_token(actor))

    @router.delete("/v1/tokens/{actor}")
    async def revoke_tokens(
        caller: Admin, actor: Annotated[str, PathParam(min_length=3, max_length=MAX_ACTOR)]
    ) -> RevokedTokens:
        """Forget every token of an operator or harness (they stop working at once)."""
        del caller
        named = _actor(actor)
        return RevokedTokens(actor=named.text, revoked=await access.revoke_tokens(named))

    return router
