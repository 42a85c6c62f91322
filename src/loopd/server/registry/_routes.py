"""Registry routes: ``PUT /v1/operators/{key}``, ``PUT /v1/harnesses/{key}`` (token callers) and ``GET /v1/actors``."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Final, Literal

from fastapi import APIRouter, Body, Depends
from fastapi import Path as PathParam
from pydantic import BaseModel, ConfigDict, Field

from loopd._infra.http_errors import ApiError
from loopd.server.http import ERROR_RESPONSES, Identity, current_identity, trusted_identity
from loopd.server.registry._service import ActorKind, RegistryService
from loopd.server.storage import DEFAULT_LEASE_SECONDS, MAX_LEASE_SECONDS, RegisteredActor

KEY_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
Key = Annotated[str, PathParam(min_length=1, max_length=128, pattern=KEY_PATTERN)]


class RegisterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    display_name: str = Field(default="", max_length=200)
    description: str = Field(default="", max_length=2000)
    lease_seconds: float = Field(default=DEFAULT_LEASE_SECONDS, gt=0, le=MAX_LEASE_SECONDS, allow_inf_nan=False)


class Registration(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Literal["operator", "harness"]
    key: str
    display_name: str
    description: str
    expires_at: datetime
    lease_seconds: float


class ActorBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Literal["operator", "harness"]
    key: str
    display_name: str
    description: str
    modes: list[str] = []
    """The modes a conversation can set for it (``PUT /v1/conversations/{id}/mode``; a built-in harness: build,
    plan); empty: it has none."""
    mode: str | None = None
    """The mode its calls start in when the conversation sets none (null: it has no modes)."""


class ActorStatusBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Literal["operator", "harness"]
    key: str
    connected: bool
    last_seen: datetime | None = Field(description="Its last registration or lease renewal (null: built in or never).")


class ActorList(BaseModel):
    model_config = ConfigDict(extra="forbid")
    data: list[ActorBody]


def _registration(actor: RegisteredActor, lease_seconds: float) -> Registration:
    return Registration(
        kind=actor.kind,
        key=actor.key,
        display_name=actor.display_name,
        description=actor.description,
        expires_at=actor.expires_at,
        lease_seconds=lease_seconds,
    )


def registry_router(registry: RegistryService) -> APIRouter:
    router = APIRouter(responses=ERROR_RESPONSES, tags=["registry"])

    async def register(kind: ActorKind, key: str, caller: Identity, body: RegisterRequest | None) -> Registration:
        if not caller.admin and (caller.kind, caller.key) != (kind, key):
            raise ApiError("forbidden", f"{caller.text} may not register {kind}:{key}")
        body = body or RegisterRequest()
        actor = await registry.register(
            kind, key, display_name=body.display_name, description=body.description, lease_seconds=body.lease_seconds
        )
        return _registration(actor, body.lease_seconds)

    @router.put("/v1/operators/{key}")
    async def register_operator(
        key: Key,
        caller: Annotated[Identity, Depends(trusted_identity)],
        body: Annotated[RegisterRequest | None, Body()] = None,
    ) -> Registration:
        """Register or renew an operator's lease (default 30 s, at most 300 s); renew every third of it."""
        return await register("operator", key, caller, body)

    @router.put("/v1/harnesses/{key}")
    async def register_harness(
        key: Key,
        caller: Annotated[Identity, Depends(trusted_identity)],
        body: Annotated[RegisterRequest | None, Body()] = None,
    ) -> Registration:
        """Register or renew a harness's lease (default 30 s, at most 300 s); renew every third of it."""
        return await register("harness", key, caller, body)

    @router.get("/v1/actors")
    async def actors(caller: Annotated[Identity, Depends(current_identity)]) -> ActorList:
        """Live responders for the picker: operators first, then harnesses (built-in ones always listed)."""
        del caller  # any signed-in caller may list
        live = await registry.list_live()
        return ActorList(
            data=[
                ActorBody(
                    kind=a.kind,
                    key=a.key,
                    display_name=a.display_name,
                    description=a.description,
                    modes=list(a.modes),
                    mode=a.mode,
                )
                for a in live
            ]
        )

    @router.get("/v1/actors/{kind}/{key}")
    async def actor_status(
        kind: Literal["operator", "harness"], key: Key, caller: Annotated[Identity, Depends(current_identity)]
    ) -> ActorStatusBody:
        """Whether one responder is connected now, and when it was last seen (`loopd chat` says so before waiting)."""
        del caller  # any signed-in caller may ask
        status = await registry.status(kind, key)
        return ActorStatusBody(kind=status.kind, key=status.key, connected=status.connected, last_seen=status.last_seen)

    return router
